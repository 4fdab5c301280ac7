//! Compaction: a vnode's base and committed delta runs merged into a new base run.
//!
//! Runs on a background thread woken after each commit (so a barrier never waits on it), or
//! on the caller's thread through [`super::DurableStore::compact`]. A job reads its inputs
//! without holding the store's lock (the files stay alive while it holds them), writes one
//! new file for a group of vnodes, then installs the result under the manifest lock with a
//! log record replacing those vnodes' runs (see [`super::log`]): each vnode's base is
//! replaced and exactly the deltas the job merged are removed (commits may have appended
//! newer ones meanwhile). Replaced files are removed once no reader holds them.
//!
//! A pass looks only at the vnodes given deltas since it last looked (each table's `dirty`
//! set, filled by commits): a vnode's plan changes only when it gains a delta, so a pass
//! costs what changed, not the vnode count. [`Policy::EVERYTHING`] looks at every vnode.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use arrow_array::BooleanArray;

use super::Shared;
use super::file::{DiskRun, MIN_BLOCK_ROWS, RunFileWriter};
use super::record::{EditKind, FileEntry, LogRecord, TableEdit, VnodeEdit};
use super::version::VnodeRuns;
use crate::error::{Error, Result};
use crate::runs::SEGMENT_ROWS;
use crate::runs::{MergeReader, Run, newest_tier};
use crate::store::KeyedBatch;
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
                lower_priority();
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
                        match e {
                            // Rows the table's types cannot hold (a dictionary's distinct values
                            // beyond its key type): nothing was installed, the committed state
                            // stands, and every later call reports the column.
                            Error::InvalidValue { column, message } => {
                                state.refused.get_or_insert((column, message));
                            }
                            // The store's state is unknown after a failed install: stop using it.
                            e => state.failed = Some(format!("background compaction failed: {e}")),
                        }
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
        // Stop before the next vnode (the job under way is given up) and wait, so the store
        // (and its directory lock) is released when its last handle goes. What was left is
        // due again when the store next opens: every vnode is looked at then.
        self.stop.store(true, Ordering::SeqCst);
        self.tx.take();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// The compactor thread's nice value: no barrier waits for compaction, so it runs on what
/// the backfill leaves idle (as RocksDB lowers its compaction threads' CPU priority) and
/// still makes progress when the cores are busy (a nice-10 thread gets about a tenth of a
/// core against one at 0). The one compaction a job waits for, the load's, runs on the
/// job's own thread.
#[cfg(target_os = "linux")]
const COMPACTOR_NICE: libc::c_int = 10;

/// Lowers the calling thread's CPU priority to [`COMPACTOR_NICE`]. Best effort: a failure
/// leaves it as it was. (On Linux the nice value set for a thread id is that thread's own.)
#[cfg(target_os = "linux")]
#[expect(unsafe_code, reason = "two libc calls; see SAFETY")]
fn lower_priority() {
    // SAFETY: `gettid` takes nothing; `setpriority` takes integers and touches no memory of
    // ours. Neither can fail in a way that affects anything but this thread's priority.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, COMPACTOR_NICE);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

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
        let deltas = |from: usize| -> u64 {
            self.runs.deltas[from..]
                .iter()
                .map(|(_, d)| d.span.rows)
                .sum()
        };
        match self.plan {
            Plan::Full => deltas(0) + self.runs.base_rows(),
            Plan::Deltas { from } => deltas(from),
        }
    }
}

/// What a job does with a vnode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Base and deltas merged into a new base; the deltas are gone.
    Full,
    /// The deltas from this one on merged into one delta run (tombstones kept); the base
    /// and the older deltas stay.
    Deltas {
        /// The oldest delta merged.
        from: usize,
    },
}

/// When a vnode is compacted, and how.
#[derive(Debug, Clone, Copy)]
pub(super) struct Policy {
    /// A full compaction at this many deltas (1: whatever has a delta).
    pub max_deltas: usize,
    /// A merge of the deltas at this many.
    pub merge_deltas: usize,
    /// Look at every vnode, not only those given deltas since the last pass.
    pub all_vnodes: bool,
}

impl Policy {
    /// Everything into the base, now ([`super::DurableStore::compact`]).
    pub const EVERYTHING: Self = Self {
        max_deltas: 1,
        merge_deltas: usize::MAX,
        all_vnodes: true,
    };

    /// The store's settings.
    pub fn of(options: &super::DurableOptions) -> Self {
        Self {
            max_deltas: options.max_deltas.max(1),
            merge_deltas: options.merge_deltas.max(2),
            all_vnodes: false,
        }
    }
}

/// What a vnode is due for, if anything. A full compaction when it has `max_deltas` delta
/// runs, or two or more that together hold at least a quarter of its base's rows and at
/// least [`MIN_BLOCK_ROWS`] rows, the fewest a block holds (so the rewrite of the base is
/// paid for by the change it absorbs: each row is rewritten O(log) times, not once per few
/// commits). Otherwise a merge
/// of its newest deltas into one once it has `merge_deltas` of them ([`newest_tier`]: each
/// delta row is rewritten about `log2(deltas)` times): a read holds one loaded block per
/// run, so this bounds what a scan of the vnode holds (the base's block, a few merged
/// deltas', a few small ones) without rewriting the base.
fn plan(runs: &VnodeRuns, policy: Policy) -> Option<Plan> {
    let deltas = runs.deltas.len();
    if deltas == 0 {
        return None;
    }
    let base = runs.base_rows();
    let delta: u64 = runs.deltas.iter().map(|(_, d)| d.span.rows).sum();
    // The deltas pay for the base's rewrite once they hold a quarter of its rows, and
    // `MIN_BLOCK_ROWS` at least: a vnode of a few rows given a row an epoch (a progress table
    // at 32768 vnodes) was rewritten every other commit, a compaction per vnode each time.
    let absorbs = delta * 4 >= base && delta >= MIN_BLOCK_ROWS as u64;
    if deltas >= policy.max_deltas || (deltas >= 2 && absorbs) {
        Some(Plan::Full)
    } else if deltas >= policy.merge_deltas {
        let rows: Vec<u64> = runs.deltas.iter().map(|(_, d)| d.span.rows).collect();
        Some(Plan::Deltas {
            from: newest_tier(&rows),
        })
    } else {
        None
    }
}

/// The vnodes due for compaction by [`plan`] (all of them, or those given deltas since the
/// last pass, which this forgets).
fn due(shared: &Arc<Shared>, policy: Policy) -> Result<Vec<Input>> {
    let mut state = shared.write()?;
    state.check_ok()?;
    let mut inputs = Vec::new();
    for (name, t) in state.tables.iter_mut() {
        // A vnode not due now becomes due only by gaining a delta, which marks it again.
        let vnodes: Vec<u16> = if policy.all_vnodes {
            (0..t.vnodes.len() as u16).collect()
        } else {
            std::mem::take(&mut t.dirty).into_iter().collect()
        };
        for v in vnodes {
            let Some(runs) = t.vnodes.get(usize::from(v)) else {
                return Err(Error::Internal(format!("dirty vnode {v} out of range")));
            };
            if let Some(plan) = plan(runs, policy) {
                inputs.push(Input {
                    table: name.clone(),
                    vnode: VirtualNode::new(v),
                    runs: runs.clone(),
                    plan,
                });
            }
        }
    }
    Ok(inputs)
}

/// Compacts every vnode due for it by [`plan`].
pub(super) fn compact_all(shared: &Arc<Shared>, policy: Policy, stop: &AtomicBool) -> Result<()> {
    let _pass = shared
        .compaction_lock
        .lock()
        .map_err(|_| Error::Internal("compaction lock poisoned".into()))?;
    let inputs = due(shared, policy)?;
    // Group consecutive vnodes of one table into jobs of bounded size.
    let mut job: Vec<Input> = Vec::new();
    let mut job_rows = 0u64;
    for input in inputs {
        let rows = input.rows();
        if !job.is_empty() && (job[0].table != input.table || job_rows + rows > JOB_ROWS) {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            run_job(shared, std::mem::take(&mut job), stop)?;
            job_rows = 0;
        }
        job_rows += rows;
        job.push(input);
    }
    if stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    run_job(shared, job, stop)
}

/// Merges each vnode of `job` into `writer`; `false` if `stop` was set before its last
/// vnode.
fn merge_job(job: &[Input], writer: &mut RunFileWriter, stop: &AtomicBool) -> Result<bool> {
    for input in job {
        if stop.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let mut merge = match input.plan {
            Plan::Full => {
                Merge::Full(MergeReader::new(input.runs.sources(), None, SEGMENT_ROWS)?.filling())
            }
            Plan::Deltas { from } => Merge::Deltas(
                MergeReader::new(input.runs.delta_sources(from), None, SEGMENT_ROWS)?
                    .keeping_tombstones()
                    .filling(),
            ),
        };
        let Some(first) = merge.next()? else {
            continue;
        };
        // A short result is written whole, to share a packed batch with other short runs.
        let second = if first.0.num_rows() < MIN_BLOCK_ROWS {
            match merge.next()? {
                None => {
                    let (data, deleted) = first;
                    let run = Run::new(data, deleted.map(|d| d.values().clone()))?;
                    writer.write_run(input.vnode, &run)?;
                    continue;
                }
                second => second,
            }
        } else {
            None
        };
        writer.begin_run(input.vnode)?;
        for (batch, deleted) in std::iter::once(first).chain(second) {
            writer.write(&batch, deleted.as_ref())?;
        }
        while let Some((batch, deleted)) = merge.next()? {
            writer.write(&batch, deleted.as_ref())?;
        }
        writer.end_run();
    }
    Ok(true)
}

/// Merges one job's vnodes into one new file and installs it; abandoned (its file removed,
/// nothing installed) if `stop` is set before its last vnode is merged, so a store being
/// closed waits for one vnode's merge at most, not a whole job's, or if the merge fails.
fn run_job(shared: &Arc<Shared>, job: Vec<Input>, stop: &AtomicBool) -> Result<()> {
    let Some(first) = job.first() else {
        return Ok(());
    };
    let table = first.table.clone();
    let desc = shared.read()?.table(&table)?.desc.clone();
    let mut writer = shared.new_file(&desc)?;
    match merge_job(&job, &mut writer, stop) {
        Ok(true) => {}
        // Best effort: a file left behind is named by no manifest and is removed the next
        // time the store opens; a store being closed is not failed for it, and a merge that
        // failed (rows the table's types cannot hold) installed nothing.
        Ok(false) => {
            let _ = writer.abandon();
            return Ok(());
        }
        Err(e) => {
            let _ = writer.abandon();
            return Err(e);
        }
    }
    let (file, _, spans) = writer.finish()?;
    file.mark_obsolete();
    let _m = shared.lock_manifest()?;
    // The record replacing what the job merged (keeping what came after), checked against
    // the current state.
    let (record, installs) = {
        let state = shared.read()?;
        state.check_ok()?;
        let Some(current_table) = state.tables.get(&table) else {
            return Ok(());
        };
        let mut installs: Vec<(VirtualNode, VnodeRuns)> = Vec::with_capacity(job.len());
        let mut edits = Vec::with_capacity(job.len());
        let mut used_output = false;
        // The output runs follow the job's order (a vnode left empty has none).
        let mut outputs = spans.iter().peekable();
        for input in &job {
            let current = &current_table.vnodes[input.vnode.index()];
            let same_base = current.base.len() == input.runs.base.len()
                && current
                    .base
                    .iter()
                    .zip(&input.runs.base)
                    .all(|(a, b)| same_run(a, b));
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
            let output = outputs
                .next_if(|s| s.vnode == input.vnode)
                .map(|span| DiskRun {
                    file: file.clone(),
                    span: *span,
                });
            used_output |= output.is_some();
            let mut next = current.clone();
            match input.plan {
                Plan::Full => {
                    next.base = output.into_iter().collect();
                    next.deltas.drain(..merged);
                }
                Plan::Deltas { from } => {
                    // The merged run stands at the newest merged delta's epoch.
                    let epoch = input.runs.deltas.last().map_or(0, |(e, _)| *e);
                    next.deltas
                        .splice(from..merged, output.map(|run| (epoch, run)));
                }
            }
            edits.push(VnodeEdit {
                vnode: input.vnode.get(),
                kind: EditKind::Replace,
                runs: next.entries(),
            });
            installs.push((input.vnode, next));
        }
        let removed_runs: Vec<&DiskRun> = job
            .iter()
            .flat_map(|input| current_table.vnodes[input.vnode.index()].runs())
            .collect();
        let added_runs: Vec<&DiskRun> = installs.iter().flat_map(|(_, r)| r.runs()).collect();
        let record = LogRecord {
            committed_epoch: state.committed,
            next_file_id: shared.next_file_id.load(Ordering::SeqCst),
            meta: Vec::new(),
            added: if used_output {
                vec![FileEntry::new(file.id(), file.check())]
            } else {
                Vec::new()
            },
            removed: state.files.dropped_by(&removed_runs, &added_runs),
            tables: vec![TableEdit {
                table: table.clone(),
                vnodes: edits,
            }],
        };
        (record, installs)
    };
    shared.persist(&record, std::slice::from_ref(&file))?;
    let mut state = shared.write()?;
    let state = &mut *state;
    if let Some(t) = state.tables.get_mut(&table) {
        for (vnode, next) in installs {
            for run in next.runs() {
                state.files.add(run);
            }
            let old = std::mem::replace(&mut t.vnodes[vnode.index()], next);
            for run in old.runs() {
                state.files.remove(run)?;
            }
        }
    }
    Ok(())
}

/// A job's read of one vnode: everything into a base, or the deltas with their tombstones.
enum Merge {
    Full(MergeReader),
    Deltas(MergeReader),
}

impl Merge {
    fn next(&mut self) -> Result<Option<(KeyedBatch, Option<BooleanArray>)>> {
        match self {
            Merge::Full(reader) => Ok(reader.next_batch()?.map(|b| (b, None))),
            Merge::Deltas(reader) => reader.next_with_tombstones(),
        }
    }
}

fn same_run(a: &DiskRun, b: &DiskRun) -> bool {
    Arc::ptr_eq(&a.file, &b.file) && a.span == b.span
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use arrow_schema::{DataType, Field, Schema};

    use super::{Policy, compact_all, due, run_job};
    use crate::key::KeyColumn;
    use crate::store::durable::{DurableOptions, DurableStore};
    use crate::store::io::RealIo;
    use crate::store::{Compaction, StateStore, StateTable, StreamChunk, TableDesc};
    use crate::vnode::{VnodeBitmap, VnodeCount};

    fn delta_counts(store: &DurableStore) -> Vec<usize> {
        let state = store.shared.read().unwrap();
        let table = &state.tables["t"];
        table.vnodes.iter().map(|v| v.deltas.len()).collect()
    }

    #[test]
    fn a_stopped_pass_installs_nothing_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let options = DurableOptions {
            compaction: Compaction::Manual,
            ..DurableOptions::default()
        };
        let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(4).unwrap());
        let desc = store.create_table(desc).unwrap();
        let mut table = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        for epoch in 1..=2u64 {
            let text = (0..20)
                .map(|k| format!("+ {}", k * 2 + epoch as i64))
                .collect::<Vec<_>>();
            table
                .write(&StreamChunk::from_text(&schema, &text.join("\n")).unwrap())
                .unwrap();
            table.seal(epoch).unwrap();
            store.commit(epoch).unwrap();
        }
        let before = delta_counts(&store);
        assert!(before.iter().all(|&d| d >= 1), "{before:?}");
        let files = || std::fs::read_dir(dir.path()).unwrap().count();
        let files_before = files();

        // A pass stopped before it starts does nothing.
        compact_all(&store.shared, Policy::EVERYTHING, &AtomicBool::new(true)).unwrap();
        assert_eq!(delta_counts(&store), before);
        assert_eq!(files(), files_before);
        // A job stopped before its first vnode: its file is created, then given up.
        let inputs = due(&store.shared, Policy::EVERYTHING).unwrap();
        assert_eq!(inputs.len(), 4);
        run_job(&store.shared, inputs, &AtomicBool::new(true)).unwrap();
        assert_eq!(
            delta_counts(&store),
            before,
            "a stopped job installs nothing"
        );
        assert_eq!(files(), files_before, "the abandoned file is removed");

        compact_all(&store.shared, Policy::EVERYTHING, &AtomicBool::new(false)).unwrap();
        assert!(delta_counts(&store).iter().all(|&d| d == 0));
        let rows: usize = (0..4)
            .map(|v| {
                table
                    .committed_rows(crate::vnode::VirtualNode::new(v))
                    .unwrap()
            })
            .sum();
        assert_eq!(rows, 40);
    }
}
