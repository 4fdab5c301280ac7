//! `backfill()`: a job of the library's API over Python's Arrow streams.
//!
//! ```text
//!   snapshot (__arrow_c_stream__) ──load_table──▶ store ◀── BackfillJob ──▶ Changelog ──▶ pyarrow.RecordBatchReader
//!   changes  (__arrow_c_stream__) ──reader thread──▶ Changes ─┘             (each batch a pyarrow RecordBatch,
//!                                                                            no copy; reading drives the job)
//! ```
//!
//! The load runs on a thread of its own while the calling thread waits for it without the
//! GIL, looking at signals ([`crate::wait`]). Every read of the returned reader waits the
//! same way: Ctrl-C raises `KeyboardInterrupt` from the read, and the job stops with its
//! last checkpoint committed (a checkpoint commits once the reader has been asked for the
//! batch after it, so what it committed is what the reader had handed out).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrangement_backfill::{
    BackfillJob, Change, Error, JobOptions, KeyColumn, MemoryStore, Message, SnapshotOrder,
    StateStore, TableDesc, VnodeCount, load_table,
};
use arrow_array::ffi_stream::ArrowArrayStreamReader;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use futures::{SinkExt, StreamExt};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::wait::{POLL, interruptible};
use crate::{BackfillError, BadInput, durable_store, runtime, to_py};

/// Column names: one name or a sequence of names.
fn names(what: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(name) = value.cast::<PyString>() {
        return Ok(vec![name.to_string()]);
    }
    value.extract::<Vec<String>>().map_err(|_| {
        BadInput::new_err(format!(
            "{what}: a column name or a list of column names, not {}",
            value
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// `order`: `"merged"` or `"vnode"` (the snapshot's order), or a dict of key columns to
/// `"asc"`/`"desc"` (the key's order; the snapshot then merged).
enum OrderArg {
    Snapshot(SnapshotOrder),
    Key(Vec<(String, bool)>),
}

/// `"merged"` or `"vnode"`, the tool's `--order`.
pub fn snapshot_order(order: &str) -> PyResult<SnapshotOrder> {
    match order {
        "merged" => Ok(SnapshotOrder::Merged),
        "vnode" => Ok(SnapshotOrder::PerVnode),
        other => Err(BadInput::new_err(format!(
            "order must be \"merged\" or \"vnode\", not {other:?}"
        ))),
    }
}

fn order_arg(order: &Bound<'_, PyAny>) -> PyResult<OrderArg> {
    if let Ok(order) = order.extract::<String>() {
        return snapshot_order(&order).map(OrderArg::Snapshot);
    }
    let Ok(dict) = order.cast::<PyDict>() else {
        return Err(BadInput::new_err(
            "order must be \"merged\", \"vnode\" or a dict of key columns to \"asc\"/\"desc\"",
        ));
    };
    let mut directions = Vec::new();
    for (column, direction) in dict.iter() {
        let (Ok(column), Ok(direction)) =
            (column.extract::<String>(), direction.extract::<String>())
        else {
            return Err(BadInput::new_err(
                "order: a dict of column names to \"asc\" or \"desc\"",
            ));
        };
        let descending = match direction.to_ascii_lowercase().as_str() {
            "asc" | "ascending" => false,
            "desc" | "descending" => true,
            _ => {
                return Err(BadInput::new_err(format!(
                    "order: `{column}` must be \"asc\" or \"desc\", not {direction:?}"
                )));
            }
        };
        directions.push((column, descending));
    }
    Ok(OrderArg::Key(directions))
}

/// The key's columns with their directions: `descending` and a dict `order` name key columns.
fn key_columns(
    key: &[String],
    descending: &[String],
    order: &OrderArg,
) -> PyResult<Vec<KeyColumn>> {
    let dict: &[(String, bool)] = match order {
        OrderArg::Key(directions) => directions,
        OrderArg::Snapshot(_) => &[],
    };
    let named = descending.iter().map(|c| ("descending", c));
    let named = named.chain(dict.iter().map(|(c, _)| ("order", c)));
    for (what, column) in named {
        if !key.contains(column) {
            return Err(BadInput::new_err(format!(
                "{what}: `{column}` is not a key column (the key is {})",
                key.join(", ")
            )));
        }
    }
    Ok(key
        .iter()
        .map(|c| {
            let desc = descending.contains(c) || dict.iter().any(|(d, desc)| d == c && *desc);
            if desc {
                KeyColumn::desc(c.as_str())
            } else {
                KeyColumn::asc(c.as_str())
            }
        })
        .collect())
}

/// What `backfill()` was asked, checked.
struct Request {
    job: String,
    desc: TableDesc,
    options: JobOptions,
}

/// A snapshot reader that ends with an error once `stop` is set (Ctrl-C during the load:
/// the load commits nothing).
struct Stoppable {
    reader: ArrowArrayStreamReader,
    stop: Arc<AtomicBool>,
}

impl Iterator for Stoppable {
    type Item = Result<RecordBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.stop.load(Ordering::Relaxed) {
            return Some(Err(Error::Protocol("the load was interrupted".into())));
        }
        self.reader.next().map(|batch| batch.map_err(Error::from))
    }
}

/// The store of a `backfill()` call.
enum Store {
    Memory(MemoryStore),
    Durable(arrangement_backfill::DurableStore),
}

impl Store {
    /// The store `state` names (`None`: a new in-memory one), holding the table: loaded from
    /// `snapshot` unless it holds it already. The snapshot is released at the end (a
    /// producer such as a DuckDB connection may then open the changes' stream).
    fn with_table(
        state: Option<PathBuf>,
        desc: TableDesc,
        snapshot: Stoppable,
    ) -> Result<Self, Error> {
        let store = match state {
            None => Store::Memory(MemoryStore::new()),
            Some(dir) => Store::Durable(durable_store(&dir)?),
        };
        fn load<S: StateStore>(
            store: &S,
            desc: TableDesc,
            snapshot: Stoppable,
        ) -> Result<(), Error> {
            if store.table_desc(desc.name()).is_err() {
                load_table(store, desc, snapshot)?;
            }
            Ok(())
        }
        match &store {
            Store::Memory(s) => load(s, desc, snapshot)?,
            Store::Durable(s) => load(s, desc, snapshot)?,
        }
        Ok(store)
    }

    fn start(
        self,
        job: &str,
        table: &str,
        options: JobOptions,
        changes: ArrowArrayStreamReader,
        runtime: &'static tokio::runtime::Runtime,
    ) -> Result<BackfillJob, Error> {
        match self {
            Store::Memory(s) => start(&s, job, table, options, changes, runtime),
            Store::Durable(s) => start(&s, job, table, options, changes, runtime),
        }
    }
}

/// The job `job` over the table `table` of `store`, fed the changes after the rows the table
/// holds.
fn start<S: StateStore>(
    store: &S,
    job: &str,
    table: &str,
    options: JobOptions,
    changes: ArrowArrayStreamReader,
    runtime: &'static tokio::runtime::Runtime,
) -> Result<BackfillJob, Error> {
    let resume = BackfillJob::resume_point_in(store, job, table)?;
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Change, Error>>(2);
    // The changes, read on a thread of their own (the producer may be Python code).
    let mut skip = resume.changes as usize;
    std::thread::Builder::new()
        .name("arrangement-backfill-changes".into())
        .spawn(move || {
            for batch in changes {
                let item = match batch {
                    Ok(batch) if skip >= batch.num_rows() => {
                        skip -= batch.num_rows();
                        continue;
                    }
                    Ok(batch) => {
                        let rest: RecordBatch = batch.slice(skip, batch.num_rows() - skip);
                        skip = 0;
                        Ok(Change::Changelog(rest))
                    }
                    Err(e) => Err(Error::from(e)),
                };
                let failed = item.is_err();
                if futures::executor::block_on(tx.send(item)).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(|e| Error::InvalidConfig(format!("cannot start the changes' reader: {e}")))?;
    let _entered = runtime.enter();
    BackfillJob::start(store, job, table, options, rx)
}

/// A running job read as changelog batches: the iterator behind the returned
/// `pyarrow.RecordBatchReader`.
#[pyclass(name = "Changelog", module = "arrangement_backfill._native")]
pub struct Changelog {
    running: std::sync::Mutex<Option<Running>>,
}

struct Running {
    job: BackfillJob,
    /// The epoch the batches belong to: the `curr` of the last barrier.
    epoch: u64,
    runtime: &'static tokio::runtime::Runtime,
}

impl Running {
    /// Stops the job (its last checkpoint stays) and waits until its tasks let go of the store.
    fn shutdown(self) {
        let Running { job, runtime, .. } = self;
        runtime.block_on(job.shutdown());
    }
}

#[pymethods]
impl Changelog {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next changelog batch; the end of the job ends the iteration.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut guard = self.running.try_lock().map_err(|_| {
            BackfillError::new_err("the backfill's reader is being read by another thread")
        })?;
        let Some(running) = guard.as_mut() else {
            return Ok(None);
        };
        loop {
            let next = py.detach(|| {
                let Running { job, runtime, .. } = &mut *running;
                runtime.block_on(async { tokio::time::timeout(POLL, job.next()).await })
            });
            let message = match next {
                Err(_) => None,
                Ok(None) => {
                    if let Some(running) = guard.take() {
                        py.detach(|| running.shutdown());
                    }
                    return Ok(None);
                }
                Ok(Some(Err(e))) => {
                    if let Some(running) = guard.take() {
                        py.detach(|| running.shutdown());
                    }
                    return Err(to_py(e));
                }
                Ok(Some(Ok(message))) => Some(message),
            };
            if let Err(interrupted) = py.check_signals() {
                if let Some(running) = guard.take() {
                    py.detach(|| running.shutdown());
                }
                return Err(interrupted);
            }
            match message {
                Some(Message::Chunk(chunk)) if !chunk.is_empty() => {
                    let batch = chunk.to_changelog(Some(running.epoch)).map_err(to_py)?;
                    return batch.to_pyarrow(py).map(Some);
                }
                Some(Message::Barrier(barrier)) => running.epoch = barrier.epoch.curr,
                _ => {}
            }
        }
    }

    /// Stops the job: its last checkpoint stays committed (a durable job resumes from it).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let running = (self.running.try_lock())
            .map_err(|_| {
                BackfillError::new_err("the backfill's reader is being read by another thread")
            })?
            .take();
        if let Some(running) = running {
            py.detach(|| running.shutdown());
        }
        Ok(())
    }
}

impl Drop for Changelog {
    fn drop(&mut self) {
        let mut running = self.running.get_mut().ok().and_then(Option::take);
        // Dropped by Python, with the GIL: wait without it (the job's changes reader may
        // need it to end).
        Python::try_attach(|py| {
            if let Some(running) = running.take() {
                py.detach(|| running.shutdown());
            }
        });
        if let Some(running) = running {
            running.shutdown();
        }
    }
}

/// See the Python docstring (`arrangement_backfill/_native.pyi`).
#[pyfunction(name = "backfill")]
#[pyo3(signature = (
    snapshot, changes, key, *, job = "view", table = "upstream", distribution_key = None,
    descending = None, vnodes = 256, parallelism = 1, order = None, state = None,
    checkpoint_every = 1, barrier_interval_ms = 1000, rate_limit = None, batch_size = 8192,
    check_changes = true
))]
#[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub fn backfill_job<'py>(
    py: Python<'py>,
    snapshot: &Bound<'py, PyAny>,
    changes: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    job: &str,
    table: &str,
    distribution_key: Option<&Bound<'py, PyAny>>,
    descending: Option<&Bound<'py, PyAny>>,
    vnodes: usize,
    parallelism: usize,
    order: Option<&Bound<'py, PyAny>>,
    state: Option<PathBuf>,
    checkpoint_every: u64,
    barrier_interval_ms: Option<u64>,
    rate_limit: Option<u64>,
    batch_size: usize,
    check_changes: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let runtime = runtime()?;
    if table.is_empty() {
        return Err(BadInput::new_err("table: a name, not \"\""));
    }
    if let Some(dir) = state.as_ref().filter(|d| d.exists() && !d.is_dir()) {
        return Err(BadInput::new_err(format!(
            "state: {} is not a directory",
            dir.display()
        )));
    }
    let snapshot = ArrowArrayStreamReader::from_pyarrow_bound(snapshot)
        .map_err(|e| BadInput::new_err(format!("snapshot: not an Arrow stream: {e}")))?;
    // The changes' stream is opened after the load (a DuckDB connection has one open result
    // at a time); what it is, is checked now.
    let is_stream = |o: &Bound<'py, PyAny>| {
        o.hasattr("__arrow_c_stream__").unwrap_or(false)
            || o.hasattr("_export_to_c").unwrap_or(false)
    };
    if !is_stream(changes) {
        return Err(BadInput::new_err(format!(
            "changes: not an Arrow stream (no __arrow_c_stream__): {}",
            changes
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        )));
    }
    let key = names("key", key)?;
    let descending = descending.map(|d| names("descending", d)).transpose()?;
    let order = match order {
        Some(order) => order_arg(order)?,
        None => OrderArg::Snapshot(SnapshotOrder::Merged),
    };
    let columns = key_columns(&key, &descending.unwrap_or_default(), &order)?;
    if rate_limit == Some(0) {
        return Err(BadInput::new_err(
            "rate_limit: 0 rows/s would never finish; leave it out (None) for no limit",
        ));
    }
    let count = VnodeCount::new(vnodes).map_err(to_py)?;
    let mut desc = TableDesc::new(table, snapshot.schema(), columns)
        .map_err(to_py)?
        .with_vnode_count(count);
    if let Some(columns) = distribution_key {
        desc = (desc.with_distribution_key(&names("distribution_key", columns)?)).map_err(to_py)?;
    }
    let request = Request {
        job: job.to_string(),
        desc,
        options: JobOptions {
            parallelism,
            order: match order {
                OrderArg::Snapshot(order) => order,
                OrderArg::Key(_) => SnapshotOrder::Merged,
            },
            batch_size,
            rate_limit,
            checkpoint_every,
            barrier_interval: match barrier_interval_ms {
                Some(0) => {
                    return Err(BadInput::new_err(
                        "barrier_interval_ms: at least 1 (None: barriers only at the changes' epochs)",
                    ));
                }
                ms => ms.map(std::time::Duration::from_millis),
            },
            check_changes,
            ..JobOptions::default()
        },
    };
    let stop = Arc::new(AtomicBool::new(false));
    let snapshot = Stoppable {
        reader: snapshot,
        stop: stop.clone(),
    };
    let Request { job, desc, options } = request;
    let table = desc.name().to_string();
    let waited = interruptible(
        py,
        move || Store::with_table(state, desc, snapshot),
        || stop.store(true, Ordering::Relaxed),
        |_| {},
    )?;
    if let Some(interrupted) = waited.interrupted {
        return Err(interrupted);
    }
    let store = waited.value.map_err(to_py)?;
    let changes = ArrowArrayStreamReader::from_pyarrow_bound(changes)
        .map_err(|e| BadInput::new_err(format!("changes: not an Arrow stream: {e}")))?;
    let job = py
        .detach(|| store.start(&job, &table, options, changes, runtime))
        .map_err(to_py)?;
    let schema = arrangement_backfill::chunk::changelog_schema(&job.schema(), true);
    let iterator = Changelog {
        running: std::sync::Mutex::new(Some(Running {
            job,
            epoch: 0,
            runtime,
        })),
    };
    let pyarrow = py.import("pyarrow")?;
    pyarrow.getattr("RecordBatchReader")?.call_method1(
        "from_batches",
        (schema.as_ref().to_pyarrow(py)?, Bound::new(py, iterator)?),
    )
}

/// See the Python docstring (`arrangement_backfill/_native.pyi`).
#[pyfunction(name = "resume_point")]
#[pyo3(signature = (state, *, job = "view", table = "upstream"))]
pub fn resume_point<'py>(
    py: Python<'py>,
    state: PathBuf,
    job: &str,
    table: &str,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    if !state.is_dir() {
        return Err(BadInput::new_err(format!(
            "state: {} is not a directory",
            state.display()
        )));
    }
    let point = py
        .detach(|| {
            let store = durable_store(&state)?;
            if store.table_desc(table).is_err() {
                return Ok(None);
            }
            BackfillJob::resume_point_in(&store, job, table).map(Some)
        })
        .map_err(to_py)?;
    let Some(point) = point else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    dict.set_item("epoch", point.epoch)?;
    dict.set_item("changes", point.changes)?;
    dict.set_item("upstream_epoch", point.upstream_epoch)?;
    dict.set_item("checkpoint", point.checkpoint)?;
    dict.set_item("finished", point.finished)?;
    dict.set_item("ended", point.ended)?;
    Ok(Some(dict))
}
