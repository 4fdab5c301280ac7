//! The command-line tool's jobs as functions: `replay`, `verify` and `gen`, the tool's own
//! code (its modules are compiled into this one by path, see `lib.rs`), with its option
//! names and defaults, returning what it prints as a dict.
//!
//! `replay` runs on a thread of its own while the caller waits without the GIL
//! ([`crate::wait`]): Ctrl-C stops it as SIGINT stops the tool (the job ends at its next
//! checkpoint, nothing half-written is left in the output) and raises `KeyboardInterrupt`;
//! `progress=True` shows its progress (tqdm when installed).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrangement_backfill::VnodeCount;
use pyo3::prelude::*;

use crate::embed::snapshot_order;
use crate::wait::{Progress, Reading, interruptible};
use crate::{BackfillError, BadInput, error, job, replay, runtime, to_py};

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
    verify = false, progress = false, cache = None, shard = None, checkpoint_url = None,
    state_compression = "none"
))]
#[expect(
    clippy::too_many_arguments,
    reason = "the tool's options as keyword arguments"
)]
pub fn replay_fn<'py>(
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
    progress: bool,
    cache: Option<PathBuf>,
    shard: Option<&str>,
    checkpoint_url: Option<PathBuf>,
    state_compression: &str,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    use job::replay::{Interrupt, ReplayOptions, StateChoice, default_out_dir, run_replay_until};
    let runtime = runtime()?;
    let ds = replay::Dataset::open(&dataset).map_err(tool_err)?;
    let out = (out.map(|out| replay::storage::local_or_url(&out.to_string_lossy())))
        .unwrap_or_else(|| default_out_dir(&ds));
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
    options.durable.compression = match state_compression {
        "none" => arrangement_backfill::store::StateCompression::None,
        "lz4" => arrangement_backfill::store::StateCompression::Lz4,
        "zstd" => arrangement_backfill::store::StateCompression::Zstd,
        other => {
            return Err(BadInput::new_err(format!(
                "state_compression={other:?}: choose \"none\", \"lz4\" or \"zstd\""
            )));
        }
    };
    options.cache = cache;
    options.checkpoint_url =
        checkpoint_url.map(|url| replay::storage::local_or_url(&url.to_string_lossy()));
    // `shard="I/N"` as `--shard I/N` (I from 0; "auto" from the scheduler's environment,
    // N from BACKFILL_SHARDS where the scheduler does not give it).
    let shard = match shard {
        None => None,
        Some("auto") => Some(job::shard::Shard::from_env(None).map_err(tool_err)?),
        Some(text) => Some(text.parse::<job::shard::Shard>().map_err(tool_err)?),
    };
    let options = options.with_shard(shard);
    // The latest progress, written by the job, shown by the waiting thread.
    let latest: Arc<Mutex<Option<Reading>>> = Arc::default();
    let mut display = progress.then(|| Progress::new(py, ds.name()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let vnode_count = options.vnodes.get() as u64;
    let report = latest.clone();
    let waited = interruptible(
        py,
        || {
            runtime.block_on(run_replay_until(
                &ds,
                &options,
                move |p| {
                    if let Ok(mut reading) = report.lock() {
                        *reading = Some(Reading {
                            rows_read: p.job.rows_read,
                            rows_total: p.job.rows_total,
                            rate: p.job.rate,
                            changes: p.upstream_changes,
                            output_rows: p.output_rows,
                            vnodes_done: p.job.vnodes.completed as u64,
                            vnodes: vnode_count,
                        });
                    }
                },
                async move {
                    match stopped.await {
                        Ok(()) => Interrupt::Interrupt,
                        // Never asked: the call ended first.
                        Err(_) => std::future::pending().await,
                    }
                },
            ))
        },
        move || {
            let _ = stop.send(());
        },
        |py| {
            let reading = latest.lock().ok().and_then(|r| r.clone());
            if let (Some(display), Some(reading)) = (display.as_mut(), reading) {
                display.show(py, &reading);
            }
        },
    )?;
    if let Some(display) = display {
        let last = latest
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_default();
        display.finish(py, &last);
    }
    if let Some(interrupted) = waited.interrupted {
        return Err(interrupted);
    }
    let summary = waited.value.map_err(tool_err)?;
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
    dict.set_item("load_resumed_at", summary.load_resumed_at)?;
    dict.set_item(
        "validation_resumed_at",
        match summary.validation_start {
            Some(job::replay::ValidationStart::Resumed(row)) => Some(row),
            _ => None,
        },
    )?;
    dict.set_item("resumed_from", summary.resumed_from)?;
    dict.set_item("changes_already_applied", summary.changes_already_applied)?;
    dict.set_item("already_finished", summary.already_finished)?;
    dict.set_item("dataset_epoch", summary.last_epoch)?;
    dict.set_item("final_checkpoint", summary.final_checkpoint)?;
    dict.set_item("uploaded_files", summary.uploaded_files)?;
    dict.set_item(
        "checkpoints_uploaded",
        summary.uploads.as_ref().map(|u| u.checkpoints),
    )?;
    dict.set_item(
        "restored_checkpoint",
        summary.restored.as_ref().map(|r| r.seq),
    )?;
    dict.set_item(
        "shard",
        summary.shard.as_ref().map(|(shard, _)| shard.to_string()),
    )?;
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
    dict.set_item(
        "shards",
        (report.shards.as_ref()).map(|s| s.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
    )?;
    Ok(dict)
}

/// `backfill verify` as a function: the output is exactly once, or an exception says why.
#[pyfunction(name = "verify")]
#[pyo3(signature = (dataset, out, *, tmp = None))]
pub fn verify_fn<'py>(
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
pub fn gen_fn<'py>(
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
