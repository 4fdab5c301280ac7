//! Compaction: a vnode's base and committed delta runs merged into a new base run.
//!
//! Runs on a background thread woken after each commit (so a barrier never waits on it), or
//! on the caller's thread through [`super::DurableStore::compact`]. A job reads its inputs
//! without holding the store's lock (the files stay alive while it holds them), writes one
//! new file for a group of vnodes, then installs the result under the manifest lock with a
//! new manifest: each vnode's base is replaced and exactly the deltas the job merged are
//! removed (commits may have appended newer ones meanwhile). Replaced files are removed once
//! no reader holds them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use arrow_array::BooleanArray;

use super::file::DiskRun;
use super::{Shared, State, VnodeRuns, files_of};
use crate::error::{Error, Result};
use crate::store::run::MergeReader;
use crate::store::run::SEGMENT_ROWS;
use crate::vnode::VirtualNode;

/// Input rows per compaction job (one output file).
const JOB_ROWS: u64 = 1 << 20;

/// The background compaction thread.
#[derive(Debug)]
pub(super) struct Compactor {
    tx: Option<mpsc::Sender<()>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Compactor {
    /// Starts the thread; it holds the store only while a job runs.
    pub fn start(shared: Weak<Shared>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<()>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("backfill-compactor".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    while rx.try_recv().is_ok() {}
                    if stop_flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Some(shared) = shared.upgrade() else {
                        break;
                    };
                    if let Err(e) = compact_all(&shared, shared.options.max_deltas, &stop_flag)
                        && let Ok(mut state) = shared.write()
                        && state.failed.is_none()
                    {
                        // The store's state is unknown after a failed install: stop using it.
                        state.failed = Some(format!("background compaction failed: {e}"));
                    }
                }
            })
            .map_err(Error::Io)?;
        Ok(Self {
            tx: Some(tx),
            stop,
            thread: Some(thread),
        })
    }

    /// Asks for a compaction pass.
    pub fn wake(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(());
        }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        // Stop between jobs and wait, so the store (and its directory lock) is released
        // when its last handle goes.
        self.stop.store(true, Ordering::SeqCst);
        self.tx.take();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// One vnode's inputs.
struct Input {
    table: String,
    vnode: VirtualNode,
    runs: VnodeRuns,
}

/// Whether a vnode is due for compaction: it has `max_deltas` delta runs (the bound on
/// read amplification), or its deltas hold a quarter of its base's rows (so the rewrite of
/// the base is paid for by the change it absorbs: each row is rewritten O(log) times, not
/// once per few commits). `max_deltas` of 1 compacts whatever has a delta.
fn due(runs: &VnodeRuns, max_deltas: usize) -> bool {
    let deltas = runs.deltas.len();
    if deltas == 0 {
        return false;
    }
    if deltas >= max_deltas {
        return true;
    }
    let base: u64 = runs.base.as_ref().map_or(0, |b| b.span.rows);
    let delta: u64 = runs.deltas.iter().map(|(_, d)| d.span.rows).sum();
    deltas >= 2 && delta * 4 >= base
}

/// Compacts every vnode [`due`] for it (with `min_deltas` as the delta bound).
pub(super) fn compact_all(
    shared: &Arc<Shared>,
    min_deltas: usize,
    stop: &AtomicBool,
) -> Result<()> {
    let min = min_deltas.max(1);
    let _pass = shared
        .compaction_lock
        .lock()
        .map_err(|_| Error::Internal("compaction lock poisoned".into()))?;
    let inputs: Vec<Input> = {
        let state = shared.read()?;
        state.check_ok()?;
        state
            .tables
            .iter()
            .flat_map(|(name, t)| {
                t.vnodes
                    .iter()
                    .enumerate()
                    .filter(move |(_, runs)| due(runs, min))
                    .map(move |(v, runs)| Input {
                        table: name.clone(),
                        vnode: VirtualNode::new(v as u16),
                        runs: runs.clone(),
                    })
            })
            .collect()
    };
    // Group consecutive vnodes of one table into jobs of bounded size.
    let mut job: Vec<Input> = Vec::new();
    let mut job_rows = 0u64;
    for input in inputs {
        let rows: u64 = input.runs.base.iter().map(|b| b.span.rows).sum::<u64>()
            + input
                .runs
                .deltas
                .iter()
                .map(|(_, d)| d.span.rows)
                .sum::<u64>();
        if !job.is_empty() && (job[0].table != input.table || job_rows + rows > JOB_ROWS) {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            run_job(shared, std::mem::take(&mut job))?;
            job_rows = 0;
        }
        job_rows += rows;
        job.push(input);
    }
    if !job.is_empty() && !stop.load(Ordering::SeqCst) {
        run_job(shared, job)?;
    }
    Ok(())
}

fn run_job(shared: &Arc<Shared>, job: Vec<Input>) -> Result<()> {
    let Some(first) = job.first() else {
        return Ok(());
    };
    let table = first.table.clone();
    let desc = shared.read()?.table(&table)?.desc.clone();
    let mut writer = shared.new_file(&desc)?;
    for input in &job {
        let mut reader = MergeReader::new(input.runs.sources(), None, SEGMENT_ROWS)?;
        writer.begin_run(input.vnode)?;
        while let Some(batch) = reader.next_batch()? {
            writer.write(&batch.batch, None::<&BooleanArray>)?;
        }
        writer.end_run();
    }
    let (file, _, spans) = writer.finish()?;
    file.mark_obsolete();
    let _m = shared.lock_manifest()?;
    // The new committed state: replace what the job merged, keep what came after.
    let (manifest, named, next_tables) = {
        let state = shared.read()?;
        state.check_ok()?;
        let mut next = State {
            committed: state.committed,
            meta: state.meta.clone(),
            ..State::default()
        };
        let mut tables = std::collections::BTreeMap::new();
        for (name, t) in &state.tables {
            tables.insert(name.clone(), t.vnodes.clone());
        }
        let Some(vnodes) = tables.get_mut(&table) else {
            return Ok(());
        };
        for input in &job {
            let current = &mut vnodes[input.vnode.index()];
            let same_base = match (&current.base, &input.runs.base) {
                (None, None) => true,
                (Some(a), Some(b)) => same_run(a, b),
                _ => false,
            };
            let merged = input.runs.deltas.len();
            let same_deltas = current.deltas.len() >= merged
                && current.deltas[..merged]
                    .iter()
                    .zip(&input.runs.deltas)
                    .all(|((ea, a), (eb, b))| ea == eb && same_run(a, b));
            if !(same_base && same_deltas) {
                return Err(Error::Internal(format!(
                    "vnode {} of `{table}` changed under compaction",
                    input.vnode
                )));
            }
            current.base = spans
                .iter()
                .find(|s| s.vnode == input.vnode)
                .map(|span| DiskRun {
                    file: file.clone(),
                    span: *span,
                });
            current.deltas.drain(..merged);
        }
        for (name, t) in &state.tables {
            next.tables.insert(
                name.clone(),
                super::TableState {
                    desc: t.desc.clone(),
                    vnodes: tables[name].clone(),
                    sealed: Default::default(),
                },
            );
        }
        next.files = files_of(&next.tables);
        let manifest = next.manifest(shared.next_file_id.load(Ordering::SeqCst))?;
        (manifest, next.files, tables)
    };
    shared.store_manifest(&manifest, &named)?;
    let mut state = shared.write()?;
    for (name, vnodes) in next_tables {
        if let Some(t) = state.tables.get_mut(&name) {
            t.vnodes = vnodes;
        }
    }
    let live = files_of(&state.tables);
    Shared::swap_files(&mut state, live);
    Ok(())
}

fn same_run(a: &DiskRun, b: &DiskRun) -> bool {
    Arc::ptr_eq(&a.file, &b.file) && a.span == b.span
}
