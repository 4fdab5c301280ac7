//! [`BackfillJob`]: the one job type for embedders (and the command-line tool).
//!
//! ```text
//!   source of Changes ──▶ upstream task ──────▶ N backfill actors ──▶ aligned merge ──▶ BackfillJob
//!   (chunks, changelog    (check each change,   (tokio tasks, one     (barriers align)   (a Stream of Messages,
//!    batches, barriers)    write it into the     per vnode range)                         committing each checkpoint
//!                          table, barriers:                                               as the consumer moves past
//!                          interval, on request)                                          it; or `run(sink)`: two-phase)
//! ```
//!
//! # The contract
//! - **Identity.** A job is named by its caller (the view's name). Its progress, its resume
//!   point and its sink's records live in the store under that name. The same name resumes;
//!   another name on the same table backfills it from the start; the same name with another
//!   definition of the table (columns, key, distribution, vnode count) is refused
//!   ([`Error::JobDefinition`]).
//! - **Epochs.** The job numbers epochs after the store's committed epoch. A source says
//!   where epochs end ([`Change::Barrier`], [`Change::Checkpoint`], a new `_epoch` value);
//!   the job also closes one every [`JobOptions::barrier_interval`] and on request
//!   ([`JobControl::barrier`]). Every [`JobOptions::checkpoint_every`]-th barrier is a
//!   checkpoint.
//! - **The first barrier** a job emits closes the epoch it starts at (the store's committed
//!   one): it carries nothing new, and is never committed again.
//! - **Checkpoints.** A checkpoint commits, atomically in the store, the upstream table's
//!   changes, the job's progress and its resume point. Read as a stream, the job commits a
//!   checkpoint barrier when the consumer asks for the next message after it (so the
//!   consumer must have made everything before the barrier durable by then); with
//!   [`BackfillJob::run`] and an [`ExactlyOnceSink`], the sink's output is made durable
//!   before the commit and published after it.
//! - **Resume.** [`BackfillJob::resume_point`] says where the upstream must be replayed from:
//!   the changes after the first [`ResumePoint::changes`] the store holds. Output of epochs
//!   after [`ResumePoint::checkpoint`] was never committed: a stream consumer drops what it
//!   kept of them (a sink's [`ExactlyOnceSink::recover`] is told).
//! - **Checks.** Every change is checked against the table before it is written
//!   ([`JobOptions::check_changes`], on by default): a duplicate insert, a delete or update of
//!   a key the table does not hold, old values that differ from the stored row are
//!   [`Error::BadChange`] naming the epoch and key. A delete whose non-key columns are all
//!   NULL is a delete by key.
//! - **One writer.** One job at a time writes a table of a store (in this process); a job
//!   resumes only when no other job changed the table since its last checkpoint (its view
//!   would miss those changes).
//! - **The end.** The job ends when the source has ended and the backfill has finished, or at
//!   the checkpoint after [`JobControl::stop`], with a final `Stop` checkpoint barrier.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use arrow_schema::SchemaRef;
use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backfill::{
    BackfillConfig, BackfillStats, BackfillStream, ChangelogStream, MAX_BATCH_SIZE, PATCH_BUDGET,
    SnapshotOrder,
};
use crate::chunk::{Message, Mutation};
use crate::error::{Error, Result, internal};
use crate::job::barrier::{BarrierInjector, InFlight};
use crate::job::control::JobControl;
use crate::job::dispatcher::VnodeMap;
use crate::job::exactly_once::{ExactlyOnceSink, PreparedCheckpoint, Recovery};
use crate::job::feeder::{Applied, Feeder};
use crate::job::progress::JobProgress;
use crate::job::runtime::ParallelBackfill;
use crate::job::upstream::{Change, Checker};
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VnodeBitmap;

/// How a [`BackfillJob`] runs. `JobOptions::default()` is one actor, merged order, a
/// checkpoint at every barrier, a barrier every second, changes checked.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// Backfill actors (tokio tasks), `1..=` the table's vnode count.
    pub parallelism: usize,
    /// Snapshot rows in key order across vnodes ([`SnapshotOrder::Merged`]) or vnode by vnode.
    pub order: SnapshotOrder,
    /// Rows per snapshot output batch, `1..=`[`MAX_BATCH_SIZE`].
    pub batch_size: usize,
    /// Snapshot rows per second for the whole job (`None`: unlimited; `Some(0)`: paused).
    pub rate_limit: Option<u64>,
    /// Every `checkpoint_every`-th barrier is a checkpoint (at least 1).
    pub checkpoint_every: u64,
    /// Closes an epoch at this interval, whatever the source sends (`None`: only where the
    /// source or a request says).
    pub barrier_interval: Option<Duration>,
    /// Checks every change against the table before writing it (see the module docs). Off
    /// only for a source known to be consistent: the checks look up every changed key.
    pub check_changes: bool,
    /// The snapshot's rows, for progress and ETA (`None`: counted from the store).
    pub estimate: Option<u64>,
    /// Upstream change bytes the open scans may hold to patch their rows (see
    /// [`BackfillConfig::patch_budget`]).
    pub patch_budget: usize,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            parallelism: 1,
            order: SnapshotOrder::Merged,
            batch_size: 1024,
            rate_limit: None,
            checkpoint_every: 1,
            barrier_interval: Some(Duration::from_secs(1)),
            check_changes: true,
            estimate: None,
            patch_budget: PATCH_BUDGET,
        }
    }
}

/// Where a job stands when it starts: what the upstream must send it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumePoint {
    /// The store's committed epoch: the job's epochs follow it.
    pub epoch: u64,
    /// Change rows the upstream table holds (applied by jobs since it was loaded): the source
    /// sends the changes after these.
    pub changes: u64,
    /// The `_epoch` of the last change the table holds, when the changes carried one.
    pub upstream_epoch: Option<u64>,
    /// This job's last committed checkpoint (`None`: a new job). Its output of later epochs
    /// was never committed.
    pub checkpoint: Option<u64>,
    /// The job had finished its backfill by that checkpoint (it now passes changes through).
    pub finished: bool,
    /// The job had run to its end by that checkpoint: its source had ended and its backfill
    /// finished (as opposed to a stop on request, or a crash).
    pub ended: bool,
}

/// What a job did, when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSummary {
    /// Where the job started.
    pub resumed: ResumePoint,
    /// Its last committed checkpoint.
    pub checkpoint: Option<u64>,
    /// Whether the backfill had finished by it.
    pub finished: bool,
    /// Whether the job ran to its end: its source ended and its backfill finished (not
    /// stopped on request).
    pub ended: bool,
    /// Change rows applied by this run.
    pub changes: u64,
    /// Rows the job sent downstream in this run (snapshot and changes).
    pub rows: u64,
    /// Barriers that passed.
    pub epochs: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
}

/// The definition of the table a job backfills, as its state records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Definition {
    table: String,
    columns: Vec<String>,
    key: Vec<String>,
    distribution: String,
    vnodes: usize,
}

impl Definition {
    fn of(desc: &TableDesc) -> Self {
        Self {
            table: desc.name().to_string(),
            columns: (desc.schema().fields().iter())
                .map(|f| {
                    format!(
                        "{} {}{}",
                        f.name(),
                        f.data_type(),
                        if f.is_nullable() { "" } else { " not null" }
                    )
                })
                .collect(),
            key: (desc.pk().columns().iter())
                .map(|c| format!("{c:?}"))
                .collect(),
            distribution: format!("{:?}", desc.distribution()),
            vnodes: desc.vnode_count().get(),
        }
    }

    fn differences(&self, given: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |what: &str, stored: String, now: String| {
            if stored != now {
                out.push(format!("{what} was {stored}, is {now}"));
            }
        };
        differ("the table", self.table.clone(), given.table.clone());
        differ(
            "the columns",
            self.columns.join(", "),
            given.columns.join(", "),
        );
        differ("the key", self.key.join(", "), given.key.join(", "));
        differ(
            "the distribution",
            self.distribution.clone(),
            given.distribution.clone(),
        );
        differ(
            "the vnode count",
            self.vnodes.to_string(),
            given.vnodes.to_string(),
        );
        out
    }
}

/// The store keys of a job and of its upstream table.
#[derive(Debug, Clone)]
struct Keys {
    job: String,
    table: String,
}

impl Keys {
    fn job(&self, what: &str) -> String {
        format!("job.{}.{what}", self.job)
    }

    fn sink_prefix(&self) -> String {
        self.job("sink.")
    }

    fn table_changes(&self) -> String {
        format!("upstream.{}.changes", self.table)
    }

    fn table_epoch(&self) -> String {
        format!("upstream.{}.epoch", self.table)
    }
}

/// Stages job values and commits the store: the store, boxed.
type Commit = Arc<dyn Fn(u64, Vec<(String, String)>) -> Result<()> + Send + Sync>;

/// A running backfill (see the module docs): a [`Stream`] of the backfill's output messages,
/// or driven into an [`ExactlyOnceSink`] by [`BackfillJob::run`].
///
/// ```
/// # use std::sync::Arc;
/// use arrangement_backfill::{BackfillJob, Change, JobOptions, KeyColumn, MemoryStore, Message, TableDesc, load_table};
/// # use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
/// # use arrow_schema::{DataType, Field, Schema};
/// use futures::StreamExt;
/// # fn main() -> arrangement_backfill::Result<()> {
/// # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("id", DataType::Int64, false),
///     Field::new("v", DataType::Int64, true),
/// ]));
/// let rows = RecordBatch::try_new(schema.clone(), vec![
///     Arc::new(Int64Array::from_iter_values(0..1000)),
///     Arc::new(Int64Array::from_iter_values(0..1000)),
/// ])?;
/// let store = MemoryStore::new();
/// let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")])?;
/// load_table(&store, desc, RecordBatchIterator::new([Ok(rows)], schema.clone()))?;
///
/// // The upstream: an update and an insert, then the source ends.
/// let changes = arrangement_backfill::StreamChunk::from_text(&schema, "U- 7 7\nU+ 7 70\n+ 5000 1")?;
/// let source = futures::stream::iter([Ok(Change::Chunk(changes))]);
/// let mut job = BackfillJob::start(&store, "view", "t", JobOptions::default(), source)?;
/// let mut net = 0i64;
/// while let Some(message) = job.next().await {
///     if let Message::Chunk(chunk) = message? {
///         net += chunk.ops().iter().map(|op| if op.is_insert() { 1 } else { -1 }).sum::<i64>();
///     }
/// }
/// assert_eq!(net, 1001, "every row of the table once, as it ends");
/// # Ok::<(), arrangement_backfill::Error>(())
/// # })
/// # }
/// ```
pub struct BackfillJob {
    name: String,
    schema: SchemaRef,
    runtime: ParallelBackfill,
    feeder: Option<JoinHandle<Result<()>>>,
    control: JobControl,
    resume: ResumePoint,
    keys: Keys,
    commit: Commit,
    /// The sink records committed before this run, for [`ExactlyOnceSink::recover`].
    records: Vec<(u64, String)>,
    /// Barriers the consumer has collected (bounds the barriers in flight).
    collected: watch::Sender<u64>,
    applied_at: Arc<Mutex<BTreeMap<u64, Applied>>>,
    /// The last epoch committed (the store's, at the start).
    committed: u64,
    summary: JobSummary,
    /// Stream mode: a checkpoint barrier handed out, committed at the next poll.
    to_commit: Option<(u64, bool)>,
    /// Stream mode: the commit under way.
    committing: Option<JoinHandle<Result<u64>>>,
    done: bool,
}

/// Barriers a source may send before the consumer collected them (committed, for a
/// checkpoint): a barrier interval shorter than a commit then spaces barriers by the
/// commit's cost instead of queueing them.
const MAX_BARRIERS_IN_FLIGHT: u64 = 2;

/// Messages between the upstream task and the actors' dispatcher.
const CHANNEL_CAPACITY: usize = 64;

impl BackfillJob {
    /// Starts job `name` backfilling `table` (a table of `store`, loaded and committed, see
    /// [`load_table`](crate::load_table)), fed by `changes`: the upstream's changes from the
    /// job's [`resume_point`](Self::resume_point) on. Must be called inside a tokio runtime
    /// (it spawns the upstream task and the actors); nothing is emitted until the job is
    /// polled or [run](Self::run).
    pub fn start<S, C>(
        store: &S,
        name: &str,
        table: &str,
        options: JobOptions,
        changes: C,
    ) -> Result<Self>
    where
        S: StateStore,
        C: Stream<Item = Result<Change>> + Send + Unpin + 'static,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidConfig(
                "BackfillJob::start must be called inside a tokio runtime (it spawns the job's \
                 tasks): call it from an async context or inside `Runtime::block_on`"
                    .into(),
            ));
        }
        let Plan {
            desc,
            keys,
            definition,
            resume,
            records,
        } = Plan::of(store, name, table)?;
        let committed = resume.epoch;
        let table_changes = resume.changes;
        let checkpoint = resume.checkpoint;
        let vnode_count = desc.vnode_count();
        if !(1..=vnode_count.get()).contains(&options.parallelism) {
            return Err(Error::InvalidConfig(format!(
                "parallelism {} is outside 1..={} (the table's vnodes)",
                options.parallelism,
                vnode_count.get()
            )));
        }
        if !(1..=MAX_BATCH_SIZE).contains(&options.batch_size) {
            return Err(Error::InvalidConfig(format!(
                "batch size {} is outside 1..={MAX_BATCH_SIZE}",
                options.batch_size
            )));
        }
        if options.barrier_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::InvalidConfig(
                "the barrier interval must be above zero".into(),
            ));
        }
        let claim = store.writer_claims().claim(table, name)?;
        // What an earlier job of this table left sealed and uncommitted in this process (it
        // was dropped mid-epoch) is not this job's to commit.
        let progress_table = format!("{table}.backfill.{name}");
        store.discard_uncommitted_of(table)?;
        if store.table_desc(&progress_table).is_ok() {
            store.discard_uncommitted_of(&progress_table)?;
        }
        if checkpoint.is_none() {
            store.stage_meta(
                &keys.job("definition"),
                &serde_json::to_string(&definition).map_err(|e| internal!("definition: {e}"))?,
            )?;
        }
        let all = VnodeBitmap::full(vnode_count);
        let upstream = store.table(table, all.clone())?;
        let estimate = match options.estimate {
            Some(rows) => rows,
            None => {
                let mut rows = 0u64;
                for vnode in all.iter() {
                    rows += upstream.committed_rows(vnode)? as u64;
                }
                rows
            }
        };
        let config = BackfillConfig {
            batch_size: options.batch_size,
            order: options.order,
            rate_limit: options.rate_limit,
            progress_table: Some(progress_table),
            patch_budget: options.patch_budget,
        };
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let map = VnodeMap::even(vnode_count, options.parallelism)?;
        let runtime = ParallelBackfill::start(store, table, map, config, estimate, rx)?;
        let (requests_tx, requests) = mpsc::unbounded();
        let control = runtime.control().with_requests(requests_tx);
        let (in_flight, collected) = InFlight::new(MAX_BARRIERS_IN_FLIGHT);
        let applied_at: Arc<Mutex<BTreeMap<u64, Applied>>> = Arc::default();
        let checker = match options.check_changes {
            true => Some(Checker::new(desc.clone(), committed)?),
            false => None,
        };
        let feeder = Feeder {
            changes,
            table: upstream,
            checker,
            pairs: Default::default(),
            injector: BarrierInjector::new(committed, options.checkpoint_every)?,
            in_flight,
            tx,
            stats: runtime.stats(),
            interval: options.barrier_interval,
            requests,
            applied: Applied {
                changes: table_changes,
                upstream_epoch: resume.upstream_epoch,
                ended: false,
            },
            applied_at: applied_at.clone(),
            _claim: claim,
        };
        let feeder = tokio::spawn(feeder.run());
        let committer = store.clone();
        let commit: Commit = Arc::new(move |epoch, values: Vec<(String, String)>| {
            for (key, value) in &values {
                committer.stage_meta(key, value)?;
            }
            committer.commit(epoch)
        });
        Ok(Self {
            name: name.to_string(),
            schema: desc.schema().clone(),
            runtime,
            feeder: Some(feeder),
            control,
            summary: JobSummary {
                resumed: resume.clone(),
                checkpoint,
                finished: resume.finished,
                ..JobSummary::default()
            },
            resume,
            keys,
            commit,
            records,
            collected,
            applied_at,
            committed,
            to_commit: None,
            committing: None,
            done: false,
        })
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema of the output chunks: the upstream table's.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Where job `name` of `table` would start in `store` now (what its source must send
    /// it), without starting it; refused as [`BackfillJob::start`] would refuse it.
    ///
    /// A job stopped part way, then resumed with the changes after its resume point:
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use arrangement_backfill::{
    ///     BackfillJob, Change, JobOptions, KeyColumn, MemoryStore, Message, StreamChunk,
    ///     TableDesc, load_table,
    /// };
    /// # use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
    /// # use arrow_schema::{DataType, Field, Schema};
    /// use futures::StreamExt;
    /// # fn main() -> arrangement_backfill::Result<()> {
    /// # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
    /// # let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    /// # let rows = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..1000))])?;
    /// let store = MemoryStore::new();
    /// load_table(&store, TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")])?,
    ///     RecordBatchIterator::new([Ok(rows)], schema.clone()))?;
    /// // Ten inserts, one epoch each.
    /// let changes: Vec<Change> = (0..10)
    ///     .flat_map(|i| [Change::Chunk(StreamChunk::from_text(&schema, &format!("+ {}", 5000 + i)).unwrap()),
    ///                    Change::Checkpoint])
    ///     .collect();
    /// let slow = JobOptions { rate_limit: Some(2_000), ..JobOptions::default() };
    ///
    /// // A first run, stopped after a few barriers: it ends at a checkpoint.
    /// let mut job = BackfillJob::start(&store, "view", "t", slow.clone(),
    ///     futures::stream::iter(changes.clone().into_iter().map(Ok)))?;
    /// let mut barriers = 0;
    /// while let Some(message) = job.next().await {
    ///     if let Message::Barrier(_) = message? {
    ///         barriers += 1;
    ///         if barriers == 3 { job.control().stop()?; }
    ///     }
    /// }
    /// job.shutdown().await;
    ///
    /// // Where to resume: the changes after the first `resume.changes`.
    /// let resume = BackfillJob::resume_point_in(&store, "view", "t")?;
    /// assert!(resume.checkpoint.is_some() && !resume.ended);
    /// let rest = changes.into_iter()
    ///     .filter(|c| !matches!(c, Change::Checkpoint))
    ///     .skip(resume.changes as usize)
    ///     .map(Ok);
    /// let job = BackfillJob::start(&store, "view", "t", slow, futures::stream::iter(rest))?;
    /// assert_eq!(job.resume_point(), &resume);
    /// let out: Vec<_> = job.collect().await;
    /// assert!(out.iter().all(|m| m.is_ok()));
    /// assert!(BackfillJob::resume_point_in(&store, "view", "t")?.ended);
    /// # Ok::<(), arrangement_backfill::Error>(())
    /// # })
    /// # }
    /// ```
    pub fn resume_point_in<S: StateStore>(
        store: &S,
        name: &str,
        table: &str,
    ) -> Result<ResumePoint> {
        Ok(Plan::of(store, name, table)?.resume)
    }

    /// The records job `name` of `table` committed with its checkpoints in `store`
    /// ([`Recovery::records`]), for a sink that checks its output before the job starts.
    pub fn committed_records<S: StateStore>(
        store: &S,
        name: &str,
        table: &str,
    ) -> Result<Vec<(u64, String)>> {
        Ok(Plan::of(store, name, table)?.records)
    }

    /// Where the job started: what the upstream must send it.
    pub fn resume_point(&self) -> &ResumePoint {
        &self.resume
    }

    /// A handle to pause, resume, throttle, rescale, close an epoch or stop the job.
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// The job's progress: rows read of the estimated total, rate, ETA, vnodes per state,
    /// the slowest vnodes, per-actor rows.
    pub fn progress(&self) -> watch::Receiver<JobProgress> {
        self.runtime.progress()
    }

    /// The backfill's counters, summed over its actors.
    pub fn stats(&self) -> watch::Receiver<BackfillStats> {
        self.runtime.stats()
    }

    /// What the job did so far (complete once it has ended).
    pub fn summary(&self) -> &JobSummary {
        &self.summary
    }

    /// The output as a named stream of messages (committing as [`BackfillJob`] does).
    pub fn into_stream(self) -> BackfillStream {
        let schema = self.schema.clone();
        BackfillStream::new(schema, Box::pin(self))
    }

    /// The output as changelog batches (`_epoch`, `_op`, then the table's columns), for
    /// Arrow pipelines; [`ChangelogStream::into_reader`] makes it a blocking
    /// `RecordBatchReader` and an Arrow C stream.
    pub fn into_changelog(self) -> ChangelogStream {
        self.into_stream().into_changelog()
    }

    /// The job values a checkpoint at `epoch` commits (the sink's record aside).
    fn checkpoint_values(&mut self, epoch: u64, stop: bool) -> Result<Vec<(String, String)>> {
        let applied = {
            let mut map =
                (self.applied_at.lock()).map_err(|_| internal!("applied map poisoned"))?;
            let applied = map
                .get(&epoch)
                .copied()
                .ok_or_else(|| internal!("no upstream position for epoch {epoch}"))?;
            *map = map.split_off(&(epoch + 1));
            applied
        };
        self.summary.changes = applied.changes.saturating_sub(self.resume.changes);
        let finished = stop && self.runtime.stats().borrow().finished || self.summary.finished;
        self.summary.ended |= applied.ended;
        let epoch_text = applied
            .upstream_epoch
            .map(|e| e.to_string())
            .unwrap_or_default();
        Ok(vec![
            (self.keys.table_changes(), applied.changes.to_string()),
            (self.keys.table_epoch(), epoch_text),
            (self.keys.job("changes"), applied.changes.to_string()),
            (self.keys.job("checkpoint"), epoch.to_string()),
            (self.keys.job("finished"), finished.to_string()),
            (self.keys.job("ended"), applied.ended.to_string()),
        ])
    }

    /// Accounts for checkpoint `epoch`, committed.
    fn committed(&mut self, epoch: u64, stop: bool, later_barriers: u64) {
        self.runtime.committed(epoch);
        self.committed = epoch;
        self.summary.checkpoint = Some(epoch);
        self.summary.checkpoints += 1;
        if stop {
            self.summary.finished = self.runtime.stats().borrow().finished || self.summary.finished;
        }
        self.collected.send_modify(|n| *n += 1 + later_barriers);
    }

    /// Runs the job to its end, its output into `sink`, exactly once (see
    /// [`ExactlyOnceSink`]): the sink recovers first, then every checkpoint's output is made
    /// durable before the store commits it and published after. While a checkpoint commits
    /// (on a blocking thread), the next epoch's output goes on into the sink.
    pub async fn run<K: ExactlyOnceSink>(mut self, sink: &mut K) -> Result<JobSummary> {
        sink.recover(&Recovery {
            committed: self.resume.checkpoint,
            records: std::mem::take(&mut self.records),
        })?;
        let result = self.drive(sink).await;
        self.end().await;
        result.map(|()| self.summary.clone())
    }

    async fn drive<K: ExactlyOnceSink>(&mut self, sink: &mut K) -> Result<()> {
        let mut open_epoch = self.committed;
        let mut committing: Option<SinkCommit<K::Prepared>> = None;
        let result = loop {
            let message = tokio::select! {
                biased;
                outcome = wait(&mut committing), if committing.is_some() => {
                    if let Err(e) = self.settle(sink, &mut committing, Some(outcome)).await {
                        break Err(e);
                    }
                    continue;
                }
                message = self.runtime.next() => message,
            };
            let Some(message) = message else {
                break self.settle(sink, &mut committing, None).await;
            };
            let message = match message {
                Ok(message) => message,
                Err(e) => break Err(e),
            };
            match message {
                Message::Chunk(chunk) => {
                    self.summary.rows += chunk.num_rows() as u64;
                    if let Err(e) = sink.write(open_epoch, chunk) {
                        break Err(e);
                    }
                }
                Message::Watermark(_) => {}
                Message::Barrier(barrier) => {
                    self.summary.epochs += 1;
                    open_epoch = barrier.epoch.curr;
                    let prev = barrier.epoch.prev;
                    if barrier.is_checkpoint() && prev > self.committed {
                        if let Err(e) = self.settle(sink, &mut committing, None).await {
                            break Err(e);
                        }
                        let stop = barrier.mutation == Some(Mutation::Stop);
                        let started = (|| {
                            let prepared = sink.prepare(prev)?;
                            let values = self.checkpoint_values(prev, stop)?;
                            Ok::<_, Error>((prepared, values))
                        })();
                        let (mut prepared, mut values) = match started {
                            Ok(started) => started,
                            Err(e) => break Err(e),
                        };
                        let record_key = format!("{}{prev:020}", self.keys.sink_prefix());
                        let commit = self.commit.clone();
                        let task = tokio::task::spawn_blocking(move || {
                            if let Some(record) = prepared.make_durable()? {
                                values.push((record_key, record));
                            }
                            commit(prev, values)?;
                            prepared.publish()?;
                            Ok(prepared)
                        });
                        committing = Some(SinkCommit {
                            epoch: prev,
                            stop,
                            later_barriers: 0,
                            task,
                        });
                        if stop && let Err(e) = self.settle(sink, &mut committing, None).await {
                            break Err(e);
                        }
                    } else if let Some(commit) = committing.as_mut() {
                        commit.later_barriers += 1;
                    } else {
                        self.collected.send_modify(|n| *n += 1);
                    }
                }
            }
        };
        if let Some(commit) = committing.take() {
            // Only an error leaves one: its outcome no longer matters, its end does.
            let _ = commit.task.await;
        }
        result
    }

    /// Waits for the sink's commit under way, if any, and accounts for it.
    async fn settle<K: ExactlyOnceSink>(
        &mut self,
        sink: &mut K,
        committing: &mut Option<SinkCommit<K::Prepared>>,
        outcome: Option<SinkOutcome<K::Prepared>>,
    ) -> Result<()> {
        let Some(commit) = committing.take() else {
            return Ok(());
        };
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => commit.task.await,
        };
        let prepared = outcome
            .map_err(|e| internal!("the commit of checkpoint {} failed: {e}", commit.epoch))??;
        self.committed(commit.epoch, commit.stop, commit.later_barriers);
        sink.committed(commit.epoch, prepared)
    }

    /// Stops the job where it is, committing nothing more (its last checkpoint stays), and
    /// waits until its tasks have released the store: a durable store can then be reopened
    /// and the table written by another job at once. (Dropping a job stops it too, but its
    /// tasks let go of the store a moment later.)
    pub async fn shutdown(mut self) {
        if let Some(commit) = self.committing.take() {
            let _ = commit.await;
        }
        self.end().await;
    }

    /// Stops the upstream task and the actors and waits for them (and so for their store
    /// handles and the table's writer claim).
    async fn end(&mut self) {
        if let Some(feeder) = self.feeder.take() {
            feeder.abort();
            let _ = feeder.await;
        }
        self.runtime.shutdown().await;
    }

    /// Stream mode: starts committing checkpoint `epoch` on a blocking thread.
    fn start_commit(&mut self, epoch: u64, stop: bool) -> Result<JoinHandle<Result<u64>>> {
        let values = self.checkpoint_values(epoch, stop)?;
        let commit = self.commit.clone();
        Ok(tokio::task::spawn_blocking(move || {
            commit(epoch, values)?;
            Ok(epoch)
        }))
    }
}

/// What a job finds in the store before it starts.
struct Plan {
    desc: Arc<TableDesc>,
    keys: Keys,
    definition: Definition,
    resume: ResumePoint,
    records: Vec<(u64, String)>,
}

impl Plan {
    fn of<S: StateStore>(store: &S, name: &str, table: &str) -> Result<Self> {
        check_name(name)?;
        let desc = match store.table_desc(table) {
            Ok(desc) => desc,
            Err(Error::UnknownTable(_)) => {
                return Err(Error::InvalidConfig(format!(
                    "table `{table}` is not in the store: load it first (`load_table`)"
                )));
            }
            Err(e) => return Err(e),
        };
        if let Some(load) = super::load::LoadProgress::of(store, table)?
            && !load.complete
        {
            return Err(Error::InvalidConfig(format!(
                "table `{table}` is half loaded ({} rows in {} committed steps): finish its \
                 load first (`TableLoader::resume`, then `seal` and commit)",
                load.rows, load.steps
            )));
        }
        let committed = store.committed_epoch()?.ok_or_else(|| {
            Error::InvalidConfig(format!(
                "the store has no committed epoch: load and commit table `{table}` first \
                 (`load_table`)"
            ))
        })?;
        let keys = Keys {
            job: name.to_string(),
            table: table.to_string(),
        };
        let number = |key: &str| -> Result<Option<u64>> {
            store
                .meta(key)?
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| internal!("job value `{key}` is not a number: {v}"))
                })
                .transpose()
        };
        let table_changes = number(&keys.table_changes())?.unwrap_or(0);
        let definition = Definition::of(&desc);
        let checkpoint = match store.meta(&keys.job("definition"))? {
            Some(stored) => {
                let stored: Definition = serde_json::from_str(&stored)
                    .map_err(|e| internal!("job `{name}`'s definition: {e}"))?;
                let differences = stored.differences(&definition);
                if !differences.is_empty() {
                    return Err(Error::JobDefinition {
                        job: name.to_string(),
                        differences: differences.join("; "),
                    });
                }
                let job_changes = number(&keys.job("changes"))?.unwrap_or(0);
                if job_changes != table_changes {
                    return Err(Error::InvalidConfig(format!(
                        "job `{name}` cannot resume: table `{table}` took {} changes from \
                         another job after this job's last checkpoint, which this job's view \
                         would miss; start the view again under a new job name",
                        table_changes.saturating_sub(job_changes)
                    )));
                }
                number(&keys.job("checkpoint"))?
            }
            None => None,
        };
        let resume = ResumePoint {
            epoch: committed,
            changes: table_changes,
            upstream_epoch: number(&keys.table_epoch())?,
            checkpoint,
            finished: checkpoint.is_some()
                && store.meta(&keys.job("finished"))?.as_deref() == Some("true"),
            ended: checkpoint.is_some()
                && store.meta(&keys.job("ended"))?.as_deref() == Some("true"),
        };
        let prefix = keys.sink_prefix();
        let records = (store.meta_with_prefix(&prefix)?.into_iter())
            .filter_map(|(key, record)| Some((key[prefix.len()..].parse::<u64>().ok()?, record)))
            .collect();
        Ok(Self {
            desc,
            keys,
            definition,
            resume,
            records,
        })
    }
}

/// A sink's checkpoint committing on a blocking thread.
struct SinkCommit<P> {
    epoch: u64,
    stop: bool,
    /// Barriers that reached the consumer after this checkpoint's: collected with it.
    later_barriers: u64,
    task: JoinHandle<Result<P>>,
}

type SinkOutcome<P> = std::result::Result<Result<P>, tokio::task::JoinError>;

/// The outcome of the commit under way, once it has ended (never, without one).
async fn wait<P>(committing: &mut Option<SinkCommit<P>>) -> SinkOutcome<P> {
    match committing {
        Some(commit) => (&mut commit.task).await,
        None => std::future::pending().await,
    }
}

/// A job name is a store key part: letters, digits, `_`, `-`, `.`, 1 to 128 of them.
fn check_name(name: &str) -> Result<()> {
    let ok = (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "job name {name:?}: use 1 to 128 letters, digits, `_`, `-` or `.`"
        )))
    }
}

impl std::fmt::Debug for BackfillJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackfillJob")
            .field("name", &self.name)
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}

impl Drop for BackfillJob {
    fn drop(&mut self) {
        if let Some(feeder) = &self.feeder {
            feeder.abort();
        }
    }
}

/// Read as a stream, a job commits each checkpoint barrier when the consumer asks for the
/// message after it, and ends after the final `Stop` checkpoint (committed when the consumer
/// asks for the end). `StreamExt::next` is cancel safe.
impl Stream for BackfillJob {
    type Item = Result<Message>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(task) = this.committing.as_mut() {
                let outcome = ready!(Pin::new(task).poll(cx));
                this.committing = None;
                match outcome {
                    Ok(Ok(epoch)) => {
                        let stop = this.to_commit.take().is_some_and(|(_, stop)| stop);
                        this.committed(epoch, stop, 0);
                    }
                    Ok(Err(e)) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Err(e) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(internal!("a commit failed: {e}"))));
                    }
                }
            }
            if let Some((epoch, stop)) = this.to_commit {
                match this.start_commit(epoch, stop) {
                    Ok(task) => this.committing = Some(task),
                    Err(e) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                continue;
            }
            let message = ready!(this.runtime.poll_next_unpin(cx));
            match message {
                None => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(Message::Barrier(barrier))) => {
                    this.summary.epochs += 1;
                    let prev = barrier.epoch.prev;
                    if barrier.is_checkpoint() && prev > this.committed {
                        this.to_commit = Some((prev, barrier.mutation == Some(Mutation::Stop)));
                    } else {
                        this.collected.send_modify(|n| *n += 1);
                    }
                    return Poll::Ready(Some(Ok(Message::Barrier(barrier))));
                }
                Some(Ok(message)) => {
                    if let Message::Chunk(chunk) = &message {
                        this.summary.rows += chunk.num_rows() as u64;
                    }
                    return Poll::Ready(Some(Ok(message)));
                }
            }
        }
    }
}
