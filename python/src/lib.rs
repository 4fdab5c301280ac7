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

// The command-line tool's modules (`src/bin/backfill/`), compiled in: `replay`, `verify` and
// `gen` are the tool's own code, on the library's public API as in the binary.
#[allow(unused_imports)]
use arrangement_backfill::{backfill, chunk, dictionary, key, merge, store, table, vnode};
#[path = "../../src/bin/backfill/error.rs"]
#[allow(dead_code, unused_imports)]
mod error;
#[path = "../../src/bin/backfill/job/mod.rs"]
#[allow(dead_code, unused_imports)]
mod job;
#[path = "../../src/bin/backfill/replay/mod.rs"]
#[allow(dead_code, unused_imports)]
mod replay;

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

/// `"merged"` or `"vnode"`, the tool's `--order`.
fn snapshot_order(order: &str) -> PyResult<SnapshotOrder> {
    match order {
        "merged" => Ok(SnapshotOrder::Merged),
        "vnode" => Ok(SnapshotOrder::PerVnode),
        other => Err(BadInput::new_err(format!(
            "order must be \"merged\" or \"vnode\", not {other:?}"
        ))),
    }
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
#[pyfunction(name = "backfill")]
#[pyo3(signature = (
    snapshot, changes, key, *, job = "view", table = "upstream", distribution_key = None,
    descending = None, vnodes = 256, parallelism = 1, order = "merged", state = None,
    checkpoint_every = 1, rate_limit = None, batch_size = 1024, check_changes = true
))]
#[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn backfill_job<'py>(
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
    let order = snapshot_order(order)?;
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

/// The tool's error as a Python exception: [`BadInput`] for what exits 2 in the tool,
/// `KeyboardInterrupt` for a signal, [`BackfillError`] otherwise (a certificate mismatch
/// included).
fn tool_err(error: error::Error) -> PyErr {
    match &error {
        error::Error::Interrupted { .. } => {
            pyo3::exceptions::PyKeyboardInterrupt::new_err(error.to_string())
        }
        e if e.is_bad_input() => BadInput::new_err(error.to_string()),
        _ => BackfillError::new_err(error.to_string()),
    }
}

/// `backfill replay` as a function: the summary the tool prints, as a dict. Options as the
/// tool's (`--memory` is `memory=True`, `--rescale E:N` a list of `"E:N"`).
#[pyfunction(name = "replay")]
#[pyo3(signature = (
    dataset, out = None, *, state = None, memory = false, fresh = false, vnodes = 256,
    batch_size = 8192, order = "merged", checkpoint_every = 1, barrier_interval_ms = None,
    rate_limit = None, upstream_rate = None, parallelism = None, rescale = None, tmp = None,
    verify = false
))]
#[expect(
    clippy::too_many_arguments,
    reason = "the tool's options as keyword arguments"
)]
fn replay_fn<'py>(
    py: Python<'py>,
    dataset: PathBuf,
    out: Option<PathBuf>,
    state: Option<PathBuf>,
    memory: bool,
    fresh: bool,
    vnodes: usize,
    batch_size: usize,
    order: &str,
    checkpoint_every: u64,
    barrier_interval_ms: Option<u64>,
    rate_limit: Option<u64>,
    upstream_rate: Option<u64>,
    parallelism: Option<usize>,
    rescale: Option<Vec<String>>,
    tmp: Option<PathBuf>,
    verify: bool,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    use job::replay::{ReplayOptions, StateChoice, default_out_dir, run_replay_until};
    let runtime = runtime()?;
    let ds = replay::Dataset::open(&dataset).map_err(tool_err)?;
    let out = out.unwrap_or_else(|| default_out_dir(&ds));
    let mut options = ReplayOptions::new(&out);
    if memory && state.is_some() {
        return Err(BadInput::new_err(
            "state and memory=True exclude each other",
        ));
    }
    if memory {
        options.state = StateChoice::Memory;
    } else if let Some(dir) = state {
        options.state = StateChoice::Durable(dir);
    }
    options.fresh = fresh;
    options.vnodes = VnodeCount::new(vnodes).map_err(to_py)?;
    options.batch_size = batch_size;
    options.order = snapshot_order(order)?;
    options.checkpoint_every = checkpoint_every;
    options.barrier_interval = barrier_interval_ms.map(std::time::Duration::from_millis);
    options.rate_limit = rate_limit;
    options.upstream_rate = upstream_rate;
    if let Some(n) = parallelism {
        options.parallelism = n;
    } else {
        options.parallelism = options.parallelism.min(vnodes);
    }
    for point in rescale.unwrap_or_default() {
        options.rescales.push(point.parse().map_err(tool_err)?);
    }
    if let Some(dir) = &tmp {
        options.scratch = dir.clone();
    }
    let summary = py
        .detach(|| {
            runtime.block_on(run_replay_until(
                &ds,
                &options,
                |_| {},
                std::future::pending(),
            ))
        })
        .map_err(tool_err)?;
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("dataset", ds.name())?;
    dict.set_item("out", summary.out.clone())?;
    dict.set_item("snapshot_rows", summary.snapshot_rows)?;
    dict.set_item("upstream_changes", summary.upstream_changes)?;
    dict.set_item("output_rows", summary.output_rows)?;
    dict.set_item("output_files", summary.output_files)?;
    dict.set_item("epochs", summary.epochs)?;
    dict.set_item("checkpoints", summary.checkpoints)?;
    dict.set_item("elapsed_s", summary.elapsed.as_secs_f64())?;
    dict.set_item("load_s", summary.load_time.as_secs_f64())?;
    dict.set_item("resumed_from", summary.resumed_from)?;
    dict.set_item("changes_already_applied", summary.changes_already_applied)?;
    dict.set_item("already_finished", summary.already_finished)?;
    dict.set_item("dataset_epoch", summary.last_epoch)?;
    dict.set_item("final_checkpoint", summary.final_checkpoint)?;
    let certificate = match (&summary.certificate, &summary.finish_record) {
        (Some(c), _) => Some((c.describe(), c.matches())),
        (None, Some(f)) => Some((f.certificate.clone(), f.certificate_matches)),
        _ => None,
    };
    dict.set_item("certificate", certificate.as_ref().map(|c| c.0.clone()))?;
    dict.set_item("certificate_matches", certificate.map(|c| c.1))?;
    if verify {
        let report = verify_output(py, &ds, &out, tmp)?;
        dict.set_item("verified", report)?;
    }
    Ok(dict)
}

/// `backfill verify`'s report as a dict.
fn verify_output<'py>(
    py: Python<'py>,
    ds: &replay::Dataset,
    out: &std::path::Path,
    tmp: Option<PathBuf>,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let scratch = tmp.unwrap_or_else(std::env::temp_dir);
    let options = replay::ExternalSortOptions::new(scratch);
    let report = py
        .detach(|| replay::verify_with(ds, out, &options))
        .map_err(tool_err)?;
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("output_files", report.output_files)?;
    dict.set_item("output_rows", report.output_rows)?;
    dict.set_item("final_rows", report.final_rows)?;
    Ok(dict)
}

/// `backfill verify` as a function: the output is exactly once, or an exception says why.
#[pyfunction(name = "verify")]
#[pyo3(signature = (dataset, out, *, tmp = None))]
fn verify_fn<'py>(
    py: Python<'py>,
    dataset: PathBuf,
    out: PathBuf,
    tmp: Option<PathBuf>,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let ds = replay::Dataset::open(&dataset).map_err(tool_err)?;
    verify_output(py, &ds, &out, tmp)
}

/// `backfill gen` as a function: the dataset's counts as a dict.
#[pyfunction(name = "gen")]
#[pyo3(signature = (
    kind, out, *, scale = 0.01, changes = None, epochs = 50, seed = 42, shape = "int64",
    skew = false
))]
#[expect(
    clippy::too_many_arguments,
    reason = "the tool's options as keyword arguments"
)]
fn gen_fn<'py>(
    py: Python<'py>,
    kind: &str,
    out: PathBuf,
    scale: f64,
    changes: Option<u64>,
    epochs: u64,
    seed: u64,
    shape: &str,
    skew: bool,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    use replay::{GenKind, GenOptions, SyntheticShape, generate};
    let kind = match kind {
        "tpch-lineitem" => GenKind::TpchLineitem,
        "tpch-orders" => GenKind::TpchOrders,
        "synthetic" => GenKind::Synthetic {
            shape: match shape {
                "int64" => SyntheticShape::Int64,
                "composite" => SyntheticShape::Composite,
                other => {
                    return Err(BadInput::new_err(format!(
                        "shape must be \"int64\" or \"composite\", not {other:?}"
                    )));
                }
            },
            skew,
        },
        other => {
            return Err(BadInput::new_err(format!(
                "kind must be \"tpch-lineitem\", \"tpch-orders\" or \"synthetic\", not {other:?}"
            )));
        }
    };
    let mut options = GenOptions::new(&kind, scale);
    if let Some(changes) = changes {
        options.changes = changes;
    }
    options.epochs = epochs;
    options.seed = seed;
    let summary = py
        .detach(|| generate(&kind, &out, &options))
        .map_err(tool_err)?;
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("snapshot_rows", summary.snapshot_rows)?;
    dict.set_item("change_rows", summary.change_rows)?;
    dict.set_item("epochs", summary.epochs)?;
    Ok(dict)
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(backfill_job, m)?)?;
    m.add_function(wrap_pyfunction!(replay_fn, m)?)?;
    m.add_function(wrap_pyfunction!(verify_fn, m)?)?;
    m.add_function(wrap_pyfunction!(gen_fn, m)?)?;
    m.add("BackfillError", m.py().get_type::<BackfillError>())?;
    m.add("BadInput", m.py().get_type::<BadInput>())?;
    Ok(())
}
