//! The Python package's native module: `backfill()` over the library's job API.
//!
//! ```text
//!   snapshot (__arrow_c_stream__) ──load_table──▶ store ◀── BackfillJob ──▶ changelog reader
//!   changes  (__arrow_c_stream__) ──reader thread──▶ Changes ─┘              (pyarrow.RecordBatchReader,
//!                                                                              a C stream: reading it
//!                                                                              drives the job)
//! ```
//!
//! Long work runs without the GIL (the load, and every read of the returned reader, which
//! pyarrow makes without it). The job runs on one tokio runtime shared by the module.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use arrangement_backfill::{
    BackfillJob, Change, DurableStore, Error, JobOptions, KeyColumn, MemoryStore, SnapshotOrder,
    StateStore, TableDesc, VnodeCount, load_table,
};
use arrow_array::ffi_stream::ArrowArrayStreamReader;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_pyarrow::{FromPyArrow, IntoPyArrow};
use futures::SinkExt;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    BackfillError,
    PyException,
    "An error of the engine or of the system (I/O, a store that failed)."
);
pyo3::create_exception!(
    _native,
    BadInput,
    PyValueError,
    "Bad input: a schema without the key, a bad change, a bad option, a state of another job."
);

/// The engine's error as a Python exception: [`BadInput`] for what the caller can fix.
fn to_py(error: Error) -> PyErr {
    if error.is_bad_input() {
        BadInput::new_err(error.to_string())
    } else {
        BackfillError::new_err(error.to_string())
    }
}

/// The module's tokio runtime (two worker threads, timers on).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::io::Result<tokio::runtime::Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("arrangement-backfill")
                .enable_all()
                .build()
        })
        .as_ref()
        .map_err(|e| BackfillError::new_err(format!("cannot start the runtime: {e}")))
}

/// The durable stores this process opened, by directory: a store is opened once and shared by
/// every call on it (a directory is locked by the process that opens it, so a second open
/// while a reader of the first call lives would be refused).
fn durable_store(dir: &std::path::Path) -> Result<DurableStore, Error> {
    static STORES: OnceLock<std::sync::Mutex<HashMap<PathBuf, DurableStore>>> = OnceLock::new();
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    let path = std::fs::canonicalize(dir).map_err(|e| Error::file(dir, e))?;
    let mut stores = (STORES.get_or_init(Default::default).lock())
        .map_err(|_| Error::Internal("the store registry is poisoned".into()))?;
    if let Some(store) = stores.get(&path) {
        return Ok(store.clone());
    }
    let store = DurableStore::open(&path)?;
    stores.insert(path, store.clone());
    Ok(store)
}

/// What `backfill()` was asked, checked.
struct Request {
    job: String,
    desc: TableDesc,
    options: JobOptions,
}

/// The job over `store`: the snapshot loaded unless the store holds the table already, the
/// changes after the rows the table holds, the changelog as a blocking reader.
fn start<S: StateStore>(
    store: S,
    request: Request,
    snapshot: ArrowArrayStreamReader,
    changes: ArrowArrayStreamReader,
    runtime: &'static tokio::runtime::Runtime,
) -> Result<Box<dyn RecordBatchReader + Send>, Error> {
    let table = request.desc.name().to_string();
    if store.table_desc(&table).is_err() {
        load_table(&store, request.desc, snapshot)?;
    }
    let resume = BackfillJob::resume_point_in(&store, &request.job, &table)?;
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
    let job = BackfillJob::start(&store, &request.job, &table, request.options, rx)?;
    Ok(Box::new(
        job.into_changelog().into_reader(runtime.handle().clone()),
    ))
}

/// See the Python docstring (`arrangement_backfill/_native.pyi`).
#[pyfunction]
#[pyo3(signature = (
    snapshot, changes, key, *, job = "view", table = "upstream", distribution_key = None,
    descending = None, vnodes = 256, parallelism = 1, order = "merged", state = None,
    checkpoint_every = 1, rate_limit = None, batch_size = 1024, check_changes = true
))]
#[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn backfill<'py>(
    py: Python<'py>,
    snapshot: &Bound<'py, PyAny>,
    changes: &Bound<'py, PyAny>,
    key: Vec<String>,
    job: &str,
    table: &str,
    distribution_key: Option<Vec<String>>,
    descending: Option<Vec<String>>,
    vnodes: usize,
    parallelism: usize,
    order: &str,
    state: Option<PathBuf>,
    checkpoint_every: u64,
    rate_limit: Option<u64>,
    batch_size: usize,
    check_changes: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let runtime = runtime()?;
    let snapshot = ArrowArrayStreamReader::from_pyarrow_bound(snapshot)
        .map_err(|e| BadInput::new_err(format!("snapshot: not an Arrow stream: {e}")))?;
    let changes = ArrowArrayStreamReader::from_pyarrow_bound(changes)
        .map_err(|e| BadInput::new_err(format!("changes: not an Arrow stream: {e}")))?;
    let descending = descending.unwrap_or_default();
    if let Some(column) = descending.iter().find(|c| !key.contains(c)) {
        return Err(BadInput::new_err(format!(
            "descending: `{column}` is not a key column"
        )));
    }
    let columns = (key.iter())
        .map(|c| match descending.contains(c) {
            true => KeyColumn::desc(c.as_str()),
            false => KeyColumn::asc(c.as_str()),
        })
        .collect();
    let order = match order {
        "merged" => SnapshotOrder::Merged,
        "vnode" => SnapshotOrder::PerVnode,
        other => {
            return Err(BadInput::new_err(format!(
                "order must be \"merged\" or \"vnode\", not {other:?}"
            )));
        }
    };
    let count = VnodeCount::new(vnodes).map_err(to_py)?;
    let mut desc = TableDesc::new(table, snapshot.schema(), columns)
        .map_err(to_py)?
        .with_vnode_count(count);
    if let Some(columns) = distribution_key {
        desc = desc.with_distribution_key(&columns).map_err(to_py)?;
    }
    let request = Request {
        job: job.to_string(),
        desc,
        options: JobOptions {
            parallelism,
            order,
            batch_size,
            rate_limit,
            checkpoint_every,
            check_changes,
            ..JobOptions::default()
        },
    };
    let reader = py
        .detach(move || match state {
            None => start(MemoryStore::new(), request, snapshot, changes, runtime),
            Some(dir) => start(durable_store(&dir)?, request, snapshot, changes, runtime),
        })
        .map_err(to_py)?;
    reader.into_pyarrow(py)
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(backfill, m)?)?;
    m.add("BackfillError", m.py().get_type::<BackfillError>())?;
    m.add("BadInput", m.py().get_type::<BadInput>())?;
    Ok(())
}
