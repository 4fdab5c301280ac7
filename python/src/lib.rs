//! The Python package's native module: `backfill()` over the library's job API (`embed.rs`),
//! the command-line tool's jobs as functions (`tool.rs`), and long calls that wait without the
//! GIL and answer Ctrl-C (`wait.rs`).
//!
//! ```text
//!   snapshot, changes (__arrow_c_stream__) ──▶ embed::backfill ──▶ BackfillJob ──▶ pyarrow.RecordBatchReader
//!   dataset directory ──▶ tool::replay / verify / gen (the tool's modules) ──▶ dict
//! ```
//!
//! Jobs run on one tokio runtime shared by the module.

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

mod embed;
mod tool;
mod wait;

use arrangement_backfill::{DurableStore, Error};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator"): Rust's own
/// allocations in this module (Arrow buffers the engine makes are freed by it too, through
/// the Arrow C interface's release callbacks).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
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

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(embed::backfill_job, m)?)?;
    m.add_function(wrap_pyfunction!(embed::resume_point, m)?)?;
    m.add_class::<embed::Changelog>()?;
    m.add_function(wrap_pyfunction!(tool::replay_fn, m)?)?;
    m.add_function(wrap_pyfunction!(tool::verify_fn, m)?)?;
    m.add_function(wrap_pyfunction!(tool::gen_fn, m)?)?;
    m.add("BackfillError", m.py().get_type::<BackfillError>())?;
    m.add("BadInput", m.py().get_type::<BadInput>())?;
    Ok(())
}
