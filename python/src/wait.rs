//! Long work off the Python thread: it waits without the GIL, wakes every [`POLL`] to run
//! Python's signal handlers (Ctrl-C is `KeyboardInterrupt`) and to draw progress, and asks
//! the work to stop when a handler raises.
//!
//! ```text
//!   Python thread:  detach ─ wait ≤ POLL ─ attach: check_signals, tick ─ detach ─ ...
//!                      │                               │ raised: on_interrupt() (once), keep waiting
//!   work thread:    work() ────────────────────────────────────────────▶ result
//! ```

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::BackfillError;

/// How often the waiting thread looks at Python's signals.
pub const POLL: Duration = Duration::from_millis(100);

/// What [`interruptible`] ended with: the work's value, and the exception a signal handler
/// raised while it ran (the caller raises it after tidying up).
pub struct Waited<T> {
    pub value: T,
    pub interrupted: Option<PyErr>,
}

/// Runs `work` on a thread of its own while this thread waits without the GIL. Every
/// [`POLL`] the waiting thread takes the GIL, calls `tick` and runs the signal handlers; the
/// first exception they raise calls `on_interrupt` (which should make `work` end soon, at a
/// checkpoint) and is returned, beside the value, once `work` has ended.
pub fn interruptible<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> T + Send,
    on_interrupt: impl FnOnce(),
    mut tick: impl FnMut(Python<'_>),
) -> PyResult<Waited<T>> {
    let slot: (Mutex<Option<T>>, Condvar) = (Mutex::new(None), Condvar::new());
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("arrangement-backfill-call".into())
            .spawn_scoped(scope, || {
                let value = work();
                if let Ok(mut done) = slot.0.lock() {
                    *done = Some(value);
                }
                slot.1.notify_all();
            })
            .map_err(|e| BackfillError::new_err(format!("cannot start a thread: {e}")))?;
        let mut on_interrupt = Some(on_interrupt);
        let mut interrupted = None;
        loop {
            let done = py.detach(|| {
                let guard = slot.0.lock().ok()?;
                let (mut guard, _) = slot
                    .1
                    .wait_timeout_while(guard, POLL, |done| done.is_none())
                    .ok()?;
                guard.take()
            });
            if let Some(value) = done {
                return Ok(Waited { value, interrupted });
            }
            if worker.is_finished() {
                // It ended without a value: it panicked (the scope raises the panic).
                return Err(BackfillError::new_err("the work ended without a result"));
            }
            tick(py);
            if interrupted.is_none()
                && let Err(e) = py.check_signals()
            {
                if let Some(stop) = on_interrupt.take() {
                    stop();
                }
                interrupted = Some(e);
            }
        }
    })
}

/// A progress display for a long call: `tqdm` (`tqdm.auto`, a bar in a terminal and in a
/// notebook) when it is installed, else a line a second on `sys.stderr`.
pub enum Progress {
    Tqdm(Py<PyAny>),
    Lines { last: Option<Instant> },
}

/// One reading of a job's progress.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub rows_read: u64,
    pub rows_total: u64,
    pub rate: f64,
    pub changes: u64,
    pub output_rows: u64,
    pub vnodes_done: u64,
    pub vnodes: u64,
}

impl Progress {
    /// A display titled `what`.
    pub fn new(py: Python<'_>, what: &str) -> Self {
        let bar = (|| {
            let tqdm = py.import("tqdm.auto")?.getattr("tqdm")?;
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("desc", what)?;
            kwargs.set_item("unit", " rows")?;
            kwargs.set_item("unit_scale", true)?;
            kwargs.set_item("total", 0)?;
            tqdm.call((), Some(&kwargs)).map(Bound::unbind)
        })();
        match bar {
            Ok(bar) => Progress::Tqdm(bar),
            Err(_) => Progress::Lines { last: None },
        }
    }

    /// Shows `reading`. A display that fails (a closed stream) is not worth failing the
    /// job for: its error is dropped.
    pub fn show(&mut self, py: Python<'_>, reading: &Reading) {
        let _ = self.try_show(py, reading);
    }

    fn try_show(&mut self, py: Python<'_>, r: &Reading) -> PyResult<()> {
        let status = format!(
            "vnodes done {}/{}, upstream changes {}, output rows {}",
            r.vnodes_done, r.vnodes, r.changes, r.output_rows
        );
        match self {
            Progress::Tqdm(bar) => {
                let bar = bar.bind(py);
                bar.setattr("total", r.rows_total)?;
                bar.setattr("n", r.rows_read)?;
                bar.call_method1("set_postfix_str", (status,))?;
                Ok(())
            }
            Progress::Lines { last } => {
                if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                    return Ok(());
                }
                *last = Some(Instant::now());
                let line = format!(
                    "snapshot {}/{} rows ({:.0} rows/s), {status}\n",
                    r.rows_read, r.rows_total, r.rate
                );
                py.import("sys")?
                    .getattr("stderr")?
                    .call_method1("write", (line,))?;
                Ok(())
            }
        }
    }

    /// Shows `last` and closes the display.
    pub fn finish(mut self, py: Python<'_>, last: &Reading) {
        if let Progress::Lines { last } = &mut self {
            *last = None;
        }
        self.show(py, last);
        if let Progress::Tqdm(bar) = self {
            let _ = bar.bind(py).call_method0("close");
        }
    }
}
