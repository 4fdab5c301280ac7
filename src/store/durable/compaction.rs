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
                    if let Err(e) = compact_all(&shared, Policy::of(&shared.options), &stop_flag)
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
    plan: Plan,
}

impl Input {
    /// The rows the job reads.
    fn rows(&self) -> u64 {
        let deltas: u64 = self.runs.deltas.iter().map(|(_, d)| d.span.rows).sum();
        match self.plan {
            Plan::Full => deltas + self.runs.base.as_ref().map_or(0, |b| b.span.rows),
            Plan::Deltas => deltas,
        }
    }
}

/// What a job does with a vnode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Base and deltas merged into a new base; the deltas are gone.
    Full,
    /// The deltas merged into one delta run (tombstones kept); the base stays.
    Deltas,
}

/// When a vnode is compacted, and how.
#[derive(Debug, Clone, Copy)]
pub(super) struct Policy {
    /// A full compaction at this many deltas (1: whatever has a delta).
    pub max_deltas: usize,
    /// A merge of the deltas at this many.
    pub merge_deltas: usize,
}

impl Policy {
    /// Everything into the base, now ([`super::DurableStore::compact`]).
    pub const EVERYTHING: Self = Self {
        max_deltas: 1,
        merge_deltas: usize::MAX,
    };

    /// The store's settings.
    pub fn of(options: &super::DurableOptions) -> Self {
        Self {
            max_deltas: options.max_deltas.max(1),
            merge_deltas: options.merge_deltas.max(2),
        }
    }
}

/// What a vnode is due for, if anything. A full compaction when it has `max_deltas` delta
/// runs, or its deltas hold a quarter of its base's rows (so the rewrite of the base is paid
/// for by the change it absorbs: each row is rewritten O(log) times, not once per few
/// commits). Otherwise a merge of its deltas into one once it has `merge_deltas` of them: a
/// read holds one loaded block per run, so this bounds what a scan of the vnode holds (the
/// base's block, the merged delta's, a few small ones) without rewriting the base.
fn plan(runs: &VnodeRuns, policy: Policy) -> Option<Plan> {
    let deltas = runs.deltas.len();
    if deltas == 0 {
        return None;
    }
    let base: u64 = runs.base.as_ref().map_or(0, |b| b.span.rows);
    let delta: u64 = runs.deltas.iter().map(|(_, d)| d.span.rows).sum();
    if deltas >= policy.max_deltas || (deltas >= 2 && delta * 4 >= base) {
        Some(Plan::Full)
    } else if deltas >= policy.merge_deltas {
        Some(Plan::Deltas)
    } else {
        None
    }
}

/// Compacts every vnode due for it by [`plan`].
pub(super) fn compact_all(shared: &Arc<Shared>, policy: Policy, stop: &AtomicBool) -> Result<()> {
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
                t.vnodes.iter().enumerate().filter_map(move |(v, runs)| {
                    plan(runs, policy).map(|plan| Input {
                        table: name.clone(),
                        vnode: VirtualNode::new(v as u16),
                        runs: runs.clone(),
                        plan,
                    })
                })
            })
            .collect()
    };
    // Group consecutive vnodes of one table into jobs of bounded size.
    let mut job: Vec<Input> = Vec::new();
    let mut job_rows = 0u64;
    for input in inputs {
        let rows = input.rows();
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
        writer.begin_run(input.vnode)?;
        match input.plan {
            Plan::Full => {
                let mut reader = MergeReader::new(input.runs.sources(), None, SEGMENT_ROWS)?;
                while let Some(batch) = reader.next_batch()? {
                    writer.write(&batch.batch, None::<&BooleanArray>)?;
                }
            }
            Plan::Deltas => {
                let deltas = input.runs.delta_sources();
                let mut reader = MergeReader::new(deltas, None, SEGMENT_ROWS)?.keeping_tombstones();
                while let Some((batch, deleted)) = reader.next_with_tombstones()? {
                    writer.write(&batch.batch, deleted.as_ref())?;
                }
            }
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
            let output = spans
                .iter()
                .find(|s| s.vnode == input.vnode)
                .map(|span| DiskRun {
                    file: file.clone(),
                    span: *span,
                });
            match input.plan {
                Plan::Full => {
                    current.base = output;
                    current.deltas.drain(..merged);
                }
                Plan::Deltas => {
                    // The merged run stands at the newest merged delta's epoch.
                    let epoch = input.runs.deltas.last().map_or(0, |(e, _)| *e);
                    current
                        .deltas
                        .splice(..merged, output.map(|run| (epoch, run)));
                }
            }
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
