//! The async backfill executor: polls the upstream and the snapshot, performs the core's
//! actions.
//!
//! ```text
//!   upstream Message stream ──▶ ┌──────────────────────────────┐ ──▶ downstream Message stream
//!                               │ driver loop (one tokio task) │
//!   replicated table scans ───▶ │   BackfillCore (no I/O)      │ ──▶ replicated / progress
//!   (k-way merge or per vnode)  └──────────────────────────────┘     table writes and seals
//! ```
//!
//! Scheduling: when both sides are ready the driver alternates, one upstream message then
//! one snapshot batch, so neither starves the other. Before it handles a barrier, an epoch
//! that has read no snapshot batch reads one ([`BackfillCore::owes_snapshot_read`], I6). A
//! token bucket limits snapshot rows per second (changed online by `Throttle`; 0 pauses the
//! snapshot side only). Under a limit the owed read is taken only when the bucket has
//! tokens, so the limit holds however often barriers come (an epoch whose budget is spent
//! reads nothing: the rate limit is the user's choice, I6 guards against a busy upstream);
//! a read may overdraw the bucket by one batch, so snapshot batches shrink to a tenth of a
//! second's worth of rows (at least one). Progress is published on a `tokio::sync::watch`
//! channel.
//!
//! Snapshot scans live across epochs. The first barrier opens one scan per vnode still to
//! read and a merger over them ([`KWayMerge`] or [`RoundRobin`]); at a later barrier only the
//! vnodes whose buffered changes the filter dropped (rows beyond their position changed:
//! [`Action::RestartScans`]) are touched: each keeps its scan and the rows it read ahead and
//! merges those changes into them ([`RestartInputs::patch`]), or, once the patches held pass
//! a budget, gets a fresh scan at the new epoch. Every other vnode goes on with its scan and
//! the rows it read ahead, which are still the snapshot at the new epoch. A barrier's cost
//! follows the epoch's changes, not the vnode count; within the budget no row is read from
//! the store twice. Scans are opened afresh after a pause or a new rate limit.
//!
//! The store commits nothing by itself: whoever collects the checkpoint barrier from the
//! output (the job, or a test) calls [`StateStore::commit`] with its `prev` epoch.
//!
//! # Cancel safety
//! The driver waits in `tokio::select!` on `StreamExt::next` of the upstream (cancel safe:
//! dropping the future loses no message) and on a rate-limit `sleep` (stateless). The output
//! stream itself may be dropped at any point; nothing is committed that was not collected.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{Stream, StreamExt};
use hashbrown::HashMap;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backfill::core::{Action, BackfillCore, BackfillStats};
use crate::backfill::progress::ProgressCodec;
use crate::backfill::stream::BackfillStream;
use crate::backfill::tracker::{ArrangementTracker, Tracker};
use crate::chunk::{Message, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::merge::{KWayMerge, Patch, PatchLedger, RestartInputs, RoundRobin};
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VirtualNode;
use crate::vnode::VnodeBitmap;

/// The order in which snapshot rows leave the backfill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotOrder {
    /// One key-ordered stream over all vnodes (k-way merge).
    #[default]
    Merged,
    /// Per-vnode batches, one vnode after the other, each vnode's scan opened only when
    /// the read reaches it (the batches of small vnodes gathered into one of up to
    /// `batch_size` rows); cheaper, no global order (the command line's `--order vnode`). A
    /// barrier brings only the vnode being read to the new epoch: the others are read later,
    /// at the epoch current then ([`crate::merge::RoundRobin::deferred`]).
    PerVnode,
}

/// The largest snapshot batch, in rows (2^24, about 16.8 million): a batch is allocated
/// whole, so a larger one only risks running out of memory (or overflowing a capacity).
pub const MAX_BATCH_SIZE: usize = 1 << 24;

/// Settings of a backfill executor.
#[derive(Debug, Clone)]
pub struct BackfillConfig {
    /// Rows per snapshot output batch, `1..=`[`MAX_BATCH_SIZE`].
    pub batch_size: usize,
    /// Merged or per-vnode snapshot order.
    pub order: SnapshotOrder,
    /// Initial snapshot rate limit in rows per second (`None`: unlimited; `Some(0)`: paused).
    pub rate_limit: Option<u64>,
    /// The progress table's name; defaults to `<upstream>.backfill_progress`.
    pub progress_table: Option<String>,
    /// Bytes of upstream changes the open scans may hold to merge into the rows they hand
    /// out ([`RestartInputs::patch`]); the scans a barrier's changes would take past it are
    /// opened afresh from the store instead (0: always). Default [`PATCH_BUDGET`].
    pub patch_budget: usize,
}

impl Default for BackfillConfig {
    fn default() -> Self {
        Self {
            batch_size: 1024,
            order: SnapshotOrder::Merged,
            rate_limit: None,
            progress_table: None,
            patch_budget: PATCH_BUDGET,
        }
    }
}

/// Restores a tracker from the progress table at an epoch.
pub(crate) type Restore<S, T> =
    Box<dyn FnOnce(&<S as StateStore>::Table, VnodeBitmap, u64) -> Result<T> + Send>;

/// A backfill of one upstream table over some of its vnodes.
pub struct BackfillExecutor<S: StateStore, T: Tracker> {
    desc: Arc<TableDesc>,
    vnodes: VnodeBitmap,
    config: BackfillConfig,
    replicated: S::Table,
    progress_table: S::Table,
    restore: Restore<S, T>,
    stats_tx: watch::Sender<BackfillStats>,
    /// The store, for its committed epoch at the first barrier.
    store: S,
}

impl<S: StateStore> BackfillExecutor<S, ArrangementTracker> {
    /// The arrangement backfill of `upstream` (a table in `store`) over `vnodes`.
    pub fn arrangement(
        store: &S,
        upstream: &str,
        vnodes: VnodeBitmap,
        config: BackfillConfig,
    ) -> Result<Self> {
        Self::open(store, upstream, vnodes, config, |desc, codec| {
            Box::new(move |table, owned, epoch| {
                let progress = codec.restore(table, owned, epoch)?;
                Ok(ArrangementTracker::new(desc, progress, codec))
            })
        })
    }
}

impl<S: StateStore, T: Tracker> BackfillExecutor<S, T> {
    /// Opens the replicated upstream handle and the progress table (created on first use);
    /// `restore` makes the function that restores the tracker at the first barrier.
    pub(crate) fn open(
        store: &S,
        upstream: &str,
        vnodes: VnodeBitmap,
        config: BackfillConfig,
        restore: impl FnOnce(Arc<TableDesc>, ProgressCodec) -> Restore<S, T>,
    ) -> Result<Self> {
        if !(1..=MAX_BATCH_SIZE).contains(&config.batch_size) {
            return Err(Error::InvalidConfig(format!(
                "batch size {} is out of range 1..={MAX_BATCH_SIZE}",
                config.batch_size
            )));
        }
        let replicated = store.replicated_table(upstream, vnodes.clone())?;
        let desc = replicated.desc().clone();
        let name = config
            .progress_table
            .clone()
            .unwrap_or_else(|| format!("{upstream}.backfill_progress"));
        let codec = ProgressCodec::new(&name, desc.pk(), desc.vnode_count())?;
        match store.create_table(codec.desc().as_ref().clone()) {
            Ok(_) | Err(Error::TableExists(_)) => {}
            Err(e) => return Err(e),
        }
        let progress_table = store.table(&name, vnodes.clone())?;
        progress_table
            .desc()
            .check_schema(codec.desc().schema(), "the backfill progress")?;
        let (stats_tx, _) = watch::channel(BackfillStats::default());
        Ok(Self {
            restore: restore(desc.clone(), codec),
            desc,
            vnodes,
            config,
            replicated,
            progress_table,
            stats_tx,
            store: store.clone(),
        })
    }

    /// A live view of the backfill's counters.
    pub fn stats(&self) -> watch::Receiver<BackfillStats> {
        self.stats_tx.subscribe()
    }

    /// Runs the backfill over an upstream message stream (which must start with a barrier).
    /// The output stream ends after a `Stop` barrier, when the upstream ends, or after the
    /// first error (which it yields).
    pub fn execute<U>(self, upstream: U) -> BackfillStream
    where
        U: Stream<Item = Result<Message>> + Send + Unpin + 'static,
    {
        let schema = self.desc.schema().clone();
        let driver = Driver {
            upstream,
            exec: self,
            core: None,
            merger: None,
            patch_ledger: PatchLedger::default(),
            read_size: 0,
            read_epoch: 0,
            limiter: RateLimiter::new(None),
            out: VecDeque::new(),
            prefer_snapshot: false,
            ended: false,
        };
        let stream = futures::stream::unfold(Some(driver), |driver| async move {
            let mut driver = driver?;
            match driver.next_message().await {
                Ok(Some(message)) => Some((Ok(message), Some(driver))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        BackfillStream::new(schema, Box::pin(stream))
    }
}

struct Driver<S: StateStore, T: Tracker, U> {
    upstream: U,
    exec: BackfillExecutor<S, T>,
    core: Option<BackfillCore<T>>,
    merger: Option<Box<dyn RestartInputs<<S::Table as StateTable>::Scan>>>,
    /// The memory of the patches the merger holds.
    patch_ledger: PatchLedger,
    /// Rows per scan read of the open merger.
    read_size: usize,
    /// The epoch a scan opened now reads at: the last one sealed (a barrier seals it
    /// before it restarts scans at it), or the snapshot's. The merger's deferred inputs open
    /// at it when it reaches them.
    read_epoch: u64,
    limiter: RateLimiter,
    out: VecDeque<Message>,
    prefer_snapshot: bool,
    ended: bool,
}

/// What the driver does next.
enum Step {
    Upstream(Option<Result<Message>>),
    Snapshot,
    Wait,
}

impl<S, T, U> Driver<S, T, U>
where
    S: StateStore,
    T: Tracker,
    U: Stream<Item = Result<Message>> + Send + Unpin + 'static,
{
    async fn next_message(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(message) = self.out.pop_front() {
                return Ok(Some(message));
            }
            if self.ended {
                return Ok(None);
            }
            self.step().await?;
        }
    }

    fn snapshot_ready(&self) -> bool {
        self.merger.is_some() && self.core.as_ref().is_some_and(|c| c.snapshot_active())
    }

    /// One scheduling decision and its event.
    async fn step(&mut self) -> Result<()> {
        let snapshot = self.snapshot_ready();
        let tokens = snapshot && self.limiter.has_tokens();
        let step = if tokens && self.prefer_snapshot {
            Step::Snapshot
        } else if tokens {
            // Take the upstream if it is ready now; otherwise read the snapshot.
            tokio::select! {
                biased;
                message = self.upstream.next() => Step::Upstream(message),
                _ = std::future::ready(()) => Step::Snapshot,
            }
        } else if snapshot {
            // Rate-limited: wait for the upstream or for tokens, whichever comes first.
            let wait = self.limiter.wait_time();
            tokio::select! {
                message = self.upstream.next() => Step::Upstream(message),
                _ = tokio::time::sleep(wait) => Step::Wait,
            }
        } else {
            Step::Upstream(self.upstream.next().await)
        };
        match step {
            Step::Snapshot => {
                self.prefer_snapshot = false;
                self.read_snapshot()
            }
            Step::Upstream(message) => {
                self.prefer_snapshot = true;
                match message {
                    Some(message) => self.on_upstream(message?),
                    None => {
                        self.ended = true;
                        Ok(())
                    }
                }
            }
            Step::Wait => Ok(()),
        }
    }

    fn on_upstream(&mut self, message: Message) -> Result<()> {
        let Some(core) = self.core.as_mut() else {
            return self.on_first_message(message);
        };
        let actions = match message {
            Message::Chunk(chunk) => core.on_upstream_chunk(chunk)?,
            Message::Watermark(w) => core.on_watermark(w)?,
            Message::Barrier(barrier) => {
                // The owed read (I6) waits for the rate limit: with a limit below one batch
                // per barrier, reading anyway would set the rate to the barrier frequency.
                if core.owes_snapshot_read() && self.merger.is_some() && self.limiter.has_tokens() {
                    self.read_snapshot()?;
                }
                let core = self
                    .core
                    .as_mut()
                    .ok_or_else(|| internal!("core vanished"))?;
                core.on_barrier(barrier)?
            }
        };
        self.perform(actions)
    }

    fn on_first_message(&mut self, message: Message) -> Result<()> {
        let Message::Barrier(barrier) = message else {
            return Err(Error::Protocol(
                "the upstream must start with a barrier".into(),
            ));
        };
        // Progress is restored as committed: the first barrier closes the committed epoch,
        // and the upstream is replayed from the epoch after it.
        let prev = barrier.epoch.prev;
        if let Some(committed) = self.exec.store.committed_epoch()?
            && committed != prev
        {
            return Err(Error::Protocol(format!(
                "the first barrier must close epoch {committed}, the store's committed epoch \
                 (this one closes epoch {prev}): the backfill restores its progress as \
                 committed, so the upstream must be replayed from epoch {} on",
                committed + 1
            )));
        }
        let restore = std::mem::replace(
            &mut self.exec.restore,
            Box::new(|_, _, _| Err(internal!("restored twice"))),
        );
        let tracker = restore(
            &self.exec.progress_table,
            self.exec.vnodes.clone(),
            barrier.epoch.prev,
        )?;
        let mut core = BackfillCore::new(tracker, self.exec.config.rate_limit);
        self.limiter.set_rate(core.rate_limit());
        let actions = core.on_barrier(barrier)?;
        self.core = Some(core);
        self.perform(actions)
    }

    fn read_snapshot(&mut self) -> Result<()> {
        let (Some(merger), Some(core)) = (self.merger.as_mut(), self.core.as_mut()) else {
            return Ok(());
        };
        let (replicated, epoch, read_size) =
            (&self.exec.replicated, self.read_epoch, self.read_size);
        let mut open = |vnode: VirtualNode, after: Option<&Position>| {
            replicated.scan(vnode, after, epoch, read_size)
        };
        let actions = match merger.next_output_opening(&mut open)? {
            Some(output) => {
                self.limiter.consume(output.batch.num_rows());
                core.on_snapshot_output(output)?
            }
            None => {
                self.merger = None;
                core.on_snapshot_end()?
            }
        };
        self.perform(actions)
    }

    fn perform(&mut self, actions: Vec<Action>) -> Result<()> {
        for action in actions {
            match action {
                Action::Emit(chunk) => self.out.push_back(Message::Chunk(chunk)),
                Action::EmitWatermark(w) => self.out.push_back(Message::Watermark(w)),
                Action::Forward(barrier) => self.out.push_back(Message::Barrier(barrier)),
                Action::Replicate(chunk) => self.exec.replicated.write(&chunk)?,
                Action::Persist(chunk) => self.exec.progress_table.write(&chunk)?,
                Action::Seal(epoch) => {
                    self.exec.replicated.seal(epoch)?;
                    self.exec.progress_table.seal(epoch)?;
                    self.read_epoch = epoch;
                }
                Action::StartSnapshot { epoch, plan } => self.start_snapshot(epoch, plan)?,
                Action::RestartScans {
                    epoch,
                    plan,
                    changes,
                } => self.restart_scans(epoch, plan, changes)?,
                Action::StopSnapshot => self.merger = None,
                Action::SetRateLimit(rate) => self.limiter.set_rate(rate),
                Action::Finished | Action::Stop => {
                    if matches!(action, Action::Stop) {
                        self.ended = true;
                    }
                }
            }
        }
        if let Some(core) = &self.core {
            self.exec.stats_tx.send_replace(core.stats());
        }
        Ok(())
    }

    fn start_snapshot(
        &mut self,
        epoch: u64,
        plan: Vec<(VirtualNode, Option<Position>)>,
    ) -> Result<()> {
        // Under a rate limit a batch is at most a tenth of a second's worth of rows, so the
        // one batch every epoch reads (I6) cannot override the limit by much.
        let batch_size = match self.limiter.rate {
            Some(rate) if rate > 0 => {
                let tenth = usize::try_from(rate / 10).unwrap_or(usize::MAX).max(1);
                self.exec.config.batch_size.min(tenth)
            }
            _ => self.exec.config.batch_size,
        };
        let merged = self.exec.config.order == SnapshotOrder::Merged
            || self
                .core
                .as_ref()
                .is_some_and(|c| c.tracker().needs_global_order());
        // A k-way merge holds one batch per input: the inputs share a read-ahead of
        // MERGE_READ_AHEAD rows (at most a batch, at least MIN_MERGE_READ rows each), so the
        // merge's memory does not grow with the vnode count, and rows read but not emitted
        // (read again when a barrier restarts their vnode) stay few.
        let read_size = if merged {
            (MERGE_READ_AHEAD.max(batch_size) / plan.len().max(1))
                .clamp(MIN_MERGE_READ.min(batch_size), batch_size)
        } else {
            batch_size
        };
        // The previous epoch's merge goes first: its inputs hold a loaded block per source
        // per vnode, and holding both sets at once doubled the replay's peak memory.
        self.merger = None;
        self.read_size = read_size;
        self.read_epoch = epoch;
        let name = self.exec.desc.name();
        if !merged {
            // One vnode after the other, each opened when reached (see `RoundRobin::deferred`).
            self.merger = Some(Box::new(
                RoundRobin::deferred(plan)
                    .with_table_name(name)
                    .with_output_rows(batch_size),
            ));
            return Ok(());
        }
        let mut inputs = Vec::with_capacity(plan.len());
        for (vnode, pos) in plan {
            let scan = self
                .exec
                .replicated
                .scan(vnode, pos.as_ref(), epoch, read_size)?;
            inputs.push((vnode, scan));
        }
        let pk = self.exec.desc.pk();
        self.merger = Some(Box::new(
            KWayMerge::new(pk, inputs, batch_size)?.with_table_name(name),
        ));
        Ok(())
    }

    /// Brings the scans of the vnodes of `plan` to `epoch` in the open merger: each keeps its
    /// scan and merges the changes the filter dropped for it (`changes`), or, past the patch
    /// budget, gets a fresh scan at `epoch`; the other vnodes keep theirs as they are (see
    /// [`RestartInputs`]).
    fn restart_scans(
        &mut self,
        epoch: u64,
        plan: Vec<(VirtualNode, Option<Position>)>,
        changes: Vec<StreamChunk>,
    ) -> Result<()> {
        let merger = self
            .merger
            .as_mut()
            .ok_or_else(|| internal!("scans restarted with no snapshot open"))?;
        // A deferred input opens at the epoch current when it is reached: it has these
        // changes then, and needs neither a patch nor a fresh scan now.
        let plan: Vec<(VirtualNode, Option<Position>)> = (plan.into_iter())
            .filter(|(vnode, _)| !merger.is_deferred(*vnode))
            .collect();
        if plan.is_empty() {
            return Ok(());
        }
        let budget = self.exec.config.patch_budget;
        let held = || self.patch_ledger.load(Ordering::Relaxed);
        let mut patches: HashMap<VirtualNode, Patch> = HashMap::new();
        if held() < budget {
            let wanted: hashbrown::HashSet<VirtualNode> = plan.iter().map(|(v, _)| *v).collect();
            patches.extend(Patch::by_vnode(
                &self.exec.desc,
                &changes,
                &self.patch_ledger,
                |vnode| wanted.contains(&vnode),
            )?);
            // The barrier's patches are slices of one batch: all of them fit, or none.
            if held() > budget {
                patches.clear();
            }
        }
        drop(changes);
        for (vnode, pos) in plan {
            match patches.remove(&vnode) {
                Some(patch) => merger.patch(vnode, patch, pos.as_ref())?,
                None => {
                    let scan =
                        self.exec
                            .replicated
                            .scan(vnode, pos.as_ref(), epoch, self.read_size)?;
                    merger.restart(vnode, scan, pos.as_ref())?;
                }
            }
        }
        Ok(())
    }
}

/// The default [`BackfillConfig::patch_budget`]: the most memory the open merger's patches
/// (changes not yet merged into the rows handed out; each barrier's batch of them counted
/// whole while any vnode holds a slice of it) may hold. A barrier whose patches would pass
/// it gives its vnodes fresh scans from the store instead, which keeps those changes in its
/// own bounded layers (and drops the patches they held).
pub const PATCH_BUDGET: usize = 64 << 20;

/// The smallest per-vnode read of the k-way merge.
const MIN_MERGE_READ: usize = 64;

/// The rows the k-way merge's inputs read ahead together (unless one batch is more). Each
/// read pays a fixed cost per column (the store's gather of a merged read, and the merge's
/// gather of every batch it takes rows from), so reads of a few rows each are slow: at 256
/// vnodes over a table with a delta layer, reads of 512 rows instead of 64 merge 1.6x as
/// many rows a second (`snapshot_parts` in `benches/backfill.rs`; docs/benchmarks-history.md, "Longer
/// merge reads").
const MERGE_READ_AHEAD: usize = 64 * 1024;

/// A token bucket of snapshot rows. Reads may overdraw it by one batch (so a limited epoch
/// still makes progress); the debt is paid by waiting.
#[derive(Debug)]
struct RateLimiter {
    rate: Option<u64>,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    fn new(rate: Option<u64>) -> Self {
        Self {
            rate,
            tokens: 0.0,
            last: Instant::now(),
        }
    }

    fn set_rate(&mut self, rate: Option<u64>) {
        self.refill();
        self.rate = rate;
        if let Some(rate) = rate {
            self.tokens = self.tokens.min(rate as f64);
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        if let Some(rate) = self.rate {
            let elapsed = now.duration_since(self.last).as_secs_f64();
            // At most one second of burst.
            self.tokens = (self.tokens + elapsed * rate as f64).min(rate.max(1) as f64);
        }
        self.last = now;
    }

    fn has_tokens(&mut self) -> bool {
        match self.rate {
            None => true,
            Some(0) => false,
            Some(_) => {
                self.refill();
                self.tokens > 0.0
            }
        }
    }

    fn consume(&mut self, rows: usize) {
        if self.rate.is_some() {
            self.tokens -= rows as f64;
        }
    }

    fn wait_time(&mut self) -> Duration {
        self.refill();
        match self.rate {
            Some(rate) if rate > 0 && self.tokens <= 0.0 => {
                Duration::from_secs_f64((-self.tokens + 1.0) / rate as f64)
            }
            Some(0) => Duration::from_secs(3600),
            _ => Duration::ZERO,
        }
    }
}
