//! The backfill as a state machine without I/O: events in, actions out.
//!
//! [`BackfillCore`] knows the algorithm of docs/DESIGN.md section 7 and nothing of tokio, stores or
//! channels. The async executor polls its inputs, feeds each event to the core and performs
//! the [`Action`]s it returns, in order. Tests drive the core directly.
//!
//! ```text
//!                 first barrier                     all vnodes Completed (at a barrier)
//!  AwaitingFirst ──────────────▶ Backfilling ──────────────────────────────────▶ Done
//!       │  (restored state                 │  ▲                                      │
//!       │   already finished)              │  │ barrier: filter buffered chunks,     │ pass-through:
//!       └──────────────────────────────────┼──┘ replicate, persist, seal, forward    │ chunks and
//!                                          │                                          │ watermarks
//!                    Stop mutation ────────┴──────────────▶ Stopped ◀─────────────────┘ flow as is
//! ```
//!
//! Events: [`BackfillCore::on_barrier`], [`BackfillCore::on_upstream_chunk`],
//! [`BackfillCore::on_watermark`], [`BackfillCore::on_snapshot_output`] (a merged batch of
//! snapshot rows, with per-vnode positions and exhaustion), [`BackfillCore::on_snapshot_end`]
//! (every scanned vnode is exhausted).
//!
//! Policies, each a named method with its own tests:
//! - [`BackfillCore::snapshot_active`]: read the snapshot unless paused, throttled to zero,
//!   finished, or this epoch's snapshot is exhausted.
//! - [`BackfillCore::owes_snapshot_read`]: before a barrier is handled, an epoch that read
//!   no snapshot batch reads one, so a busy upstream cannot starve the snapshot (I6).
//! - Completion: a vnode found exhausted is Completed at once, so the barrier that closes the
//!   epoch emits that epoch's buffered changes of the vnode unfiltered (the filter's
//!   Completed rule), and the vnode is never read again.
//!
//! How progress is tracked is a [`Tracker`] (`tracker.rs`): per vnode for the arrangement
//! backfill ([`ArrangementTracker`]), one global position for the no-shuffle baseline.

use crate::backfill::progress::{SlowVnode, VnodeStateCounts};
use crate::backfill::tracker::Tracker;
use crate::chunk::{Barrier, EpochPair, Mutation, StreamChunk, Watermark};
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::merge::MergeOutput;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// What the executor must do, in the order given.
#[derive(Debug, Clone)]
pub enum Action {
    /// Send a chunk downstream.
    Emit(StreamChunk),
    /// Send a watermark downstream (only after finishing).
    EmitWatermark(Watermark),
    /// Write an (unfiltered) upstream chunk to the replicated table.
    Replicate(StreamChunk),
    /// Write progress rows to the progress table.
    Persist(StreamChunk),
    /// Seal the replicated and progress tables at this epoch.
    Seal(u64),
    /// Open snapshot scans at `epoch` per the plan, replacing any current ones.
    StartSnapshot {
        /// The epoch to read at (the last barrier's `prev`).
        epoch: u64,
        /// Vnodes and the position to scan each after.
        plan: Vec<(VirtualNode, Option<Position>)>,
    },
    /// Bring the scans of these vnodes of the open snapshot to `epoch`: patch each with its
    /// `changes`, or give it a fresh scan at `epoch` (dropping the rows it read ahead);
    /// every other vnode keeps its scan ([`crate::merge::RestartInputs`]).
    RestartScans {
        /// The epoch to read at (the last barrier's `prev`).
        epoch: u64,
        /// Vnodes and the position to scan each after.
        plan: Vec<(VirtualNode, Option<Position>)>,
        /// The buffered changes the filter dropped at this barrier, in order: exactly the
        /// changes to the plan's vnodes after their positions, so a scan may instead be
        /// kept and patched with them ([`crate::merge::RestartInputs::patch`]).
        changes: Vec<StreamChunk>,
    },
    /// Drop the snapshot scans (paused, throttled to zero, or finished).
    StopSnapshot,
    /// Change the snapshot rate limit (rows per second; `None` unlimited).
    SetRateLimit(Option<u64>),
    /// Send the barrier downstream.
    Forward(Barrier),
    /// The backfill has finished (reported once per run).
    Finished,
    /// End the output stream.
    Stop,
}

/// Where the backfill is (see the module diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing but a barrier may come first.
    AwaitingFirstBarrier,
    /// Reading the snapshot and buffering upstream changes.
    Backfilling,
    /// Finished and reported: a pass-through.
    Done,
    /// A `Stop` mutation passed; nothing more is accepted.
    Stopped,
}

/// Counters for progress reporting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillStats {
    /// The current epoch.
    pub epoch: u64,
    /// Snapshot rows emitted (in all, including before a restart).
    pub snapshot_rows: u64,
    /// Snapshot rows emitted by this run.
    pub snapshot_rows_this_run: u64,
    /// Upstream rows emitted downstream.
    pub upstream_rows_emitted: u64,
    /// Upstream rows dropped by the filter (the snapshot will carry them).
    pub upstream_rows_dropped: u64,
    /// Owned vnodes per state.
    pub vnodes: VnodeStateCounts,
    /// Up to [`SLOWEST_VNODES`] vnodes in progress the longest, slowest first.
    pub slowest: Vec<SlowVnode>,
    /// The backfill has finished.
    pub finished: bool,
}

/// How many of the slowest vnodes [`BackfillStats`] lists.
pub const SLOWEST_VNODES: usize = 3;

/// The I/O-free backfill state machine.
#[derive(Debug)]
pub struct BackfillCore<T: Tracker> {
    tracker: T,
    phase: Phase,
    epoch: Option<EpochPair>,
    buffer: Vec<StreamChunk>,
    paused: bool,
    rate_limit: Option<u64>,
    snapshot_reads_this_epoch: usize,
    snapshot_exhausted: bool,
    /// Snapshot scans are open (a `StartSnapshot` went out and no `StopSnapshot` since).
    scans_open: bool,
    /// Vnodes whose buffered changes the filter dropped at this barrier: their rows beyond
    /// their position changed, so their open scans are stale.
    touched: VnodeBitmap,
    /// The changes the filter dropped at this barrier, in order.
    dropped: Vec<StreamChunk>,
    stats: BackfillStats,
}

impl<T: Tracker> BackfillCore<T> {
    /// A core over restored (or fresh) progress, with an initial snapshot rate limit.
    pub fn new(tracker: T, rate_limit: Option<u64>) -> Self {
        let touched = VnodeBitmap::empty(tracker.table().vnode_count());
        Self {
            scans_open: false,
            touched,
            dropped: Vec::new(),
            tracker,
            phase: Phase::AwaitingFirstBarrier,
            epoch: None,
            buffer: Vec::new(),
            paused: false,
            rate_limit,
            snapshot_reads_this_epoch: 0,
            snapshot_exhausted: false,
            stats: BackfillStats::default(),
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The progress tracker.
    pub fn tracker(&self) -> &T {
        &self.tracker
    }

    /// Counters for progress reporting.
    pub fn stats(&self) -> BackfillStats {
        BackfillStats {
            snapshot_rows: self.tracker.snapshot_rows(),
            vnodes: self.tracker.counts(),
            slowest: self.tracker.slowest(SLOWEST_VNODES),
            finished: matches!(self.phase, Phase::Done)
                || (self.phase == Phase::Stopped && self.tracker.is_finished()),
            ..self.stats.clone()
        }
    }

    /// The snapshot rate limit now in force.
    pub fn rate_limit(&self) -> Option<u64> {
        self.rate_limit
    }

    /// Policy: should the snapshot be read now? Not when paused, throttled to zero, finished
    /// or already exhausted this epoch.
    pub fn snapshot_active(&self) -> bool {
        self.phase == Phase::Backfilling
            && !self.paused
            && self.rate_limit != Some(0)
            && !self.snapshot_exhausted
    }

    /// Policy (I6): an active epoch that has read no snapshot batch yet must read one before
    /// its barrier is handled, however busy the upstream is.
    pub fn owes_snapshot_read(&self) -> bool {
        self.snapshot_active() && self.snapshot_reads_this_epoch == 0
    }

    fn check_running(&self, what: &str) -> Result<()> {
        match self.phase {
            Phase::AwaitingFirstBarrier => {
                Err(Error::Protocol(format!("{what} before the first barrier")))
            }
            Phase::Stopped => Err(Error::Protocol(format!("{what} after Stop"))),
            Phase::Backfilling | Phase::Done => Ok(()),
        }
    }

    /// An upstream chunk: buffered while backfilling, passed through once done. A chunk
    /// whose columns are not the table's (names and types, in order) is an
    /// [`Error::SchemaMismatch`], before it is buffered.
    pub fn on_upstream_chunk(&mut self, chunk: StreamChunk) -> Result<Vec<Action>> {
        self.check_running("an upstream chunk")?;
        self.tracker
            .table()
            .check_schema(chunk.batch().schema_ref(), "an upstream chunk")?;
        if chunk.is_empty() {
            return Ok(Vec::new());
        }
        if self.phase == Phase::Done {
            self.stats.upstream_rows_emitted += chunk.num_rows() as u64;
            return Ok(vec![Action::Emit(chunk)]);
        }
        self.buffer.push(chunk);
        Ok(Vec::new())
    }

    /// A watermark: dropped while backfilling, forwarded once done.
    pub fn on_watermark(&mut self, watermark: Watermark) -> Result<Vec<Action>> {
        self.check_running("a watermark")?;
        Ok(match self.phase {
            Phase::Done => vec![Action::EmitWatermark(watermark)],
            _ => Vec::new(),
        })
    }

    /// A batch of snapshot rows in key order (merged or per vnode): emitted as inserts.
    pub fn on_snapshot_output(&mut self, out: MergeOutput) -> Result<Vec<Action>> {
        if self.phase != Phase::Backfilling || self.snapshot_exhausted {
            return Err(internal!(
                "snapshot output in phase {:?} (exhausted: {})",
                self.phase,
                self.snapshot_exhausted
            ));
        }
        self.snapshot_reads_this_epoch += 1;
        self.tracker.on_snapshot(&out)?;
        let rows = out.batch.num_rows() as u64;
        self.stats.snapshot_rows_this_run += rows;
        Ok(if rows == 0 {
            Vec::new()
        } else {
            vec![Action::Emit(StreamChunk::inserts(out.batch.batch))]
        })
    }

    /// The snapshot scans of this epoch are all exhausted.
    pub fn on_snapshot_end(&mut self) -> Result<Vec<Action>> {
        if self.phase != Phase::Backfilling {
            return Err(internal!("snapshot end in phase {:?}", self.phase));
        }
        self.snapshot_reads_this_epoch += 1;
        self.snapshot_exhausted = true;
        self.scans_open = false;
        self.tracker.on_snapshot_end()?;
        Ok(vec![Action::StopSnapshot])
    }

    /// A barrier. While backfilling, in this order: emit the buffered chunks filtered by the
    /// current positions, replicate them unfiltered, persist changed progress, seal, apply
    /// the mutation, forward the barrier, then report finishing or reopen the snapshot.
    pub fn on_barrier(&mut self, barrier: Barrier) -> Result<Vec<Action>> {
        match self.phase {
            Phase::AwaitingFirstBarrier => return self.on_first_barrier(barrier),
            Phase::Stopped => {
                return Err(Error::Protocol("a barrier after Stop".into()));
            }
            Phase::Backfilling | Phase::Done => {}
        }
        let current = self
            .epoch
            .ok_or_else(|| internal!("running without an epoch"))?;
        if barrier.epoch.prev != current.curr || barrier.epoch.curr <= barrier.epoch.prev {
            return Err(Error::EpochOrder {
                context: format!(
                    "barrier {}->{} (the open epoch is {})",
                    barrier.epoch.prev, barrier.epoch.curr, current.curr
                ),
                epoch: barrier.epoch.curr,
                previous: current.curr,
            });
        }
        self.epoch = Some(barrier.epoch);
        self.stats.epoch = barrier.epoch.curr;
        self.tracker.set_epoch(barrier.epoch.curr);
        let mut actions = Vec::new();
        if self.phase == Phase::Backfilling {
            self.flush_buffer(&mut actions)?;
            if let Some(progress) = self.tracker.take_changes()? {
                actions.push(Action::Persist(progress));
            }
            actions.push(Action::Seal(barrier.epoch.prev));
        }
        let stop = self.apply_mutation(barrier.mutation.as_ref(), &mut actions);
        actions.push(Action::Forward(barrier.clone()));
        if self.phase == Phase::Backfilling && !stop {
            self.snapshot_reads_this_epoch = 0;
            self.snapshot_exhausted = false;
            if self.tracker.is_finished() {
                self.phase = Phase::Done;
                self.scans_open = false;
                actions.push(Action::StopSnapshot);
                actions.push(Action::Finished);
            } else {
                let reopen = reopens_scans(barrier.mutation.as_ref());
                actions.extend(self.snapshot_action(barrier.epoch.prev, reopen));
            }
        }
        self.touched = VnodeBitmap::empty(self.touched.count());
        self.dropped.clear();
        if stop {
            self.phase = Phase::Stopped;
            actions.push(Action::StopSnapshot);
            actions.push(Action::Stop);
        }
        Ok(actions)
    }

    fn on_first_barrier(&mut self, barrier: Barrier) -> Result<Vec<Action>> {
        self.epoch = Some(barrier.epoch);
        self.stats.epoch = barrier.epoch.curr;
        self.tracker.set_epoch(barrier.epoch.curr);
        let mut actions = Vec::new();
        let stop = self.apply_mutation(barrier.mutation.as_ref(), &mut actions);
        actions.push(Action::Forward(barrier.clone()));
        if self.tracker.is_finished() {
            // Restored an already finished backfill: report it once for this run.
            self.phase = Phase::Done;
            actions.push(Action::Finished);
        } else {
            self.phase = Phase::Backfilling;
            if !stop {
                actions.extend(self.snapshot_action(barrier.epoch.prev, true));
            }
        }
        if stop {
            self.phase = Phase::Stopped;
            actions.push(Action::StopSnapshot);
            actions.push(Action::Stop);
        }
        Ok(actions)
    }

    /// Filters and emits the buffered chunks, and replicates them unfiltered.
    fn flush_buffer(&mut self, actions: &mut Vec<Action>) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let filter = self.tracker.upstream_filter()?;
        let buffered = std::mem::take(&mut self.buffer);
        for chunk in &buffered {
            let (kept, dropped) = filter.split_noting_drops(chunk, &mut self.touched)?;
            self.dropped.extend(dropped);
            self.stats.upstream_rows_emitted += kept.num_rows() as u64;
            self.stats.upstream_rows_dropped += (chunk.num_rows() - kept.num_rows()) as u64;
            if !kept.is_empty() {
                actions.push(Action::Emit(kept));
            }
        }
        if !self.tracker.is_finished() {
            actions.extend(buffered.into_iter().map(Action::Replicate));
        }
        Ok(())
    }

    /// Applies a mutation; returns true for `Stop`.
    fn apply_mutation(&mut self, mutation: Option<&Mutation>, actions: &mut Vec<Action>) -> bool {
        match mutation {
            Some(Mutation::Pause) => self.paused = true,
            Some(Mutation::Resume) => self.paused = false,
            Some(Mutation::Throttle { rows_per_second }) => {
                self.rate_limit = *rows_per_second;
                actions.push(Action::SetRateLimit(*rows_per_second));
            }
            Some(Mutation::Stop) => return true,
            // The job runtime moves vnodes between actors after this barrier; the core's part
            // (persisting every changed vnode at the barrier) is what every barrier does.
            Some(Mutation::Rescale { .. }) | None => {}
        }
        false
    }

    /// Policy: how the snapshot goes on after a barrier. Paused or throttled to zero: the
    /// scans close. Scans open and nothing asks for new ones: only the vnodes the epoch's
    /// changes touched beyond their position are brought to the new epoch, with the changes
    /// the filter dropped (nothing, if none was), so the work of a barrier follows the
    /// changes, not the vnode count. Otherwise every vnode
    /// still to scan gets a scan from its position.
    fn snapshot_action(&mut self, epoch: u64, reopen: bool) -> Option<Action> {
        if self.paused || self.rate_limit == Some(0) {
            self.scans_open = false;
            return Some(Action::StopSnapshot);
        }
        if self.scans_open && !reopen {
            let plan = self.tracker.scan_plan_for(&self.touched);
            let changes = std::mem::take(&mut self.dropped);
            return (!plan.is_empty()).then_some(Action::RestartScans {
                epoch,
                plan,
                changes,
            });
        }
        self.scans_open = true;
        Some(Action::StartSnapshot {
            epoch,
            plan: self.tracker.scan_plan(),
        })
    }
}

/// Policy: a mutation that changes how the snapshot is read (a new rate limit sets the
/// batch size; a resume follows a pause, whose scans are closed) opens every scan afresh.
fn reopens_scans(mutation: Option<&Mutation>) -> bool {
    matches!(mutation, Some(Mutation::Resume | Mutation::Throttle { .. }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backfill::progress::{ProgressCodec, ProgressMap};
    use crate::backfill::tracker::ArrangementTracker;
    use crate::chunk::BarrierKind;
    use crate::key::KeyColumn;
    use crate::merge::VnodeAdvance;
    use crate::store::KeyedBatch;
    use crate::table::TableDesc;
    use crate::vnode::{VnodeBitmap, VnodeCount};
    use arrow_array::Int64Array;
    use arrow_schema::{DataType, Field, Schema, SchemaRef};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    /// A table of one vnode, so every row's vnode is 0.
    fn desc() -> Arc<TableDesc> {
        Arc::new(
            TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(1).unwrap()),
        )
    }

    fn core_with(progress: ProgressMap) -> BackfillCore<ArrangementTracker> {
        let desc = desc();
        let codec = ProgressCodec::new("p", desc.pk(), desc.vnode_count()).unwrap();
        BackfillCore::new(ArrangementTracker::new(desc, progress, codec), None)
    }

    fn core() -> BackfillCore<ArrangementTracker> {
        core_with(ProgressMap::new(VnodeBitmap::full(
            VnodeCount::new(1).unwrap(),
        )))
    }

    fn chunk(text: &str) -> StreamChunk {
        StreamChunk::from_text(&schema(), text).unwrap()
    }

    fn barrier(prev: u64, kind: BarrierKind) -> Barrier {
        Barrier::new(EpochPair::new(prev + 1, prev), kind)
    }

    /// Snapshot rows with keys `keys` of vnode 0; `exhausted` when they are its last.
    fn snapshot(keys: &[i64], exhausted: bool) -> MergeOutput {
        let batch = arrow_array::RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(Int64Array::from(vec![0; keys.len()])),
            ],
        )
        .unwrap();
        let keyed = KeyedBatch {
            keys: desc().pk().encode(&batch).unwrap(),
            batch,
        };
        let progress = keyed
            .last_position()
            .map(|last| VnodeAdvance {
                vnode: VirtualNode::ZERO,
                last,
                rows: keys.len(),
            })
            .into_iter()
            .collect();
        MergeOutput {
            batch: keyed,
            progress,
            exhausted: if exhausted {
                vec![VirtualNode::ZERO]
            } else {
                vec![]
            },
        }
    }

    fn emitted(actions: &[Action]) -> String {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Emit(c) => Some(c.to_text().unwrap()),
                _ => None,
            })
            .collect()
    }

    fn names(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .map(|a| match a {
                Action::Emit(_) => "emit",
                Action::EmitWatermark(_) => "watermark",
                Action::Replicate(_) => "replicate",
                Action::Persist(_) => "persist",
                Action::Seal(_) => "seal",
                Action::StartSnapshot { .. } => "start",
                Action::RestartScans { .. } => "restart",
                Action::StopSnapshot => "stop-snapshot",
                Action::SetRateLimit(_) => "rate",
                Action::Forward(_) => "forward",
                Action::Finished => "finished",
                Action::Stop => "stop",
            })
            .collect()
    }

    #[test]
    fn first_barrier_forwards_and_starts_the_snapshot_at_its_prev_epoch() {
        let mut core = core();
        assert!(
            core.on_upstream_chunk(chunk("+ 1 1")).is_err(),
            "nothing before the first barrier"
        );
        let actions = core
            .on_barrier(barrier(1, BarrierKind::Checkpoint))
            .unwrap();
        assert_eq!(names(&actions), ["forward", "start"]);
        assert!(matches!(&actions[1], Action::StartSnapshot { epoch: 1, plan } if plan.len() == 1));
        assert_eq!(core.phase(), Phase::Backfilling);
    }

    #[test]
    fn barrier_runs_its_steps_in_the_documented_order() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_upstream_chunk(chunk("+ 1 1\n+ 9 9")).unwrap();
        core.on_snapshot_output(snapshot(&[2, 5], false)).unwrap();
        let b = barrier(2, BarrierKind::Checkpoint).with_mutation(Mutation::Throttle {
            rows_per_second: Some(10),
        });
        let actions = core.on_barrier(b).unwrap();
        assert_eq!(
            names(&actions),
            [
                "emit",
                "replicate",
                "persist",
                "seal",
                "rate",
                "forward",
                "start"
            ]
        );
        assert_eq!(
            emitted(&actions),
            "+ 1 1\n",
            "key 9 is above the position 5"
        );
        assert!(matches!(actions[3], Action::Seal(2)));
        assert!(matches!(
            &actions[6],
            Action::StartSnapshot { epoch: 2, .. }
        ));
        assert_eq!(core.rate_limit(), Some(10));
    }

    #[test]
    fn not_started_vnodes_drop_and_positions_are_inclusive() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_upstream_chunk(chunk("+ 3 3")).unwrap();
        let actions = core.on_barrier(barrier(2, BarrierKind::Normal)).unwrap();
        assert_eq!(emitted(&actions), "", "NotStarted drops");
        core.on_snapshot_output(snapshot(&[4], false)).unwrap();
        core.on_upstream_chunk(chunk("U- 4 0\nU+ 4 7\n+ 5 5"))
            .unwrap();
        let actions = core.on_barrier(barrier(3, BarrierKind::Normal)).unwrap();
        assert_eq!(
            emitted(&actions),
            "U- 4 0\nU+ 4 7\n",
            "an update exactly at pos is emitted"
        );
    }

    #[test]
    fn policy_one_snapshot_read_per_active_epoch() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        assert!(core.owes_snapshot_read());
        core.on_snapshot_output(snapshot(&[1], false)).unwrap();
        assert!(!core.owes_snapshot_read());
        core.on_barrier(barrier(2, BarrierKind::Normal)).unwrap();
        assert!(core.owes_snapshot_read(), "every epoch owes a read again");
        core.on_barrier(barrier(3, BarrierKind::Normal).with_mutation(Mutation::Pause))
            .unwrap();
        assert!(!core.owes_snapshot_read(), "a paused epoch owes nothing");
        assert!(!core.snapshot_active());
        let actions = core
            .on_barrier(barrier(4, BarrierKind::Normal).with_mutation(Mutation::Resume))
            .unwrap();
        assert!(core.owes_snapshot_read());
        assert_eq!(names(&actions).last(), Some(&"start"));
    }

    #[test]
    fn policy_a_barrier_restarts_only_the_scans_its_changes_touched() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_snapshot_output(snapshot(&[2, 5], false)).unwrap();
        // Nothing changed: the open scans go on as they are.
        let actions = core.on_barrier(barrier(2, BarrierKind::Normal)).unwrap();
        assert_eq!(names(&actions), ["persist", "seal", "forward"]);
        // Changes at or below the position only: emitted, and the scan beyond is unchanged.
        core.on_snapshot_output(snapshot(&[6], false)).unwrap();
        core.on_upstream_chunk(chunk(
            "+ 1 1
- 6 0",
        ))
        .unwrap();
        let actions = core.on_barrier(barrier(3, BarrierKind::Normal)).unwrap();
        assert_eq!(emitted(&actions), "+ 1 1\n- 6 0\n");
        assert_eq!(names(&actions).last(), Some(&"forward"));
        // A change above the position: that vnode's scan restarts after its position.
        core.on_snapshot_output(snapshot(&[7], false)).unwrap();
        core.on_upstream_chunk(chunk("+ 9 9")).unwrap();
        let actions = core.on_barrier(barrier(4, BarrierKind::Normal)).unwrap();
        assert_eq!(emitted(&actions), "");
        match actions.last() {
            Some(Action::RestartScans {
                epoch: 4,
                plan,
                changes,
            }) => {
                assert_eq!(plan.len(), 1);
                assert_eq!(plan[0].0, VirtualNode::ZERO);
                assert!(plan[0].1.is_some());
                // The dropped change travels with the restart, to patch the scan with.
                let text: Vec<String> = changes.iter().map(|c| c.to_text().unwrap()).collect();
                assert_eq!(text.concat(), "+ 9 9\n");
            }
            other => panic!("{other:?}"),
        }
        // The touched set is per barrier.
        core.on_snapshot_output(snapshot(&[8], false)).unwrap();
        let actions = core.on_barrier(barrier(5, BarrierKind::Normal)).unwrap();
        assert_eq!(names(&actions).last(), Some(&"forward"));
    }

    #[test]
    fn throttle_to_zero_stops_only_the_snapshot() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_snapshot_output(snapshot(&[1, 2], false)).unwrap();
        let actions = core
            .on_barrier(
                barrier(2, BarrierKind::Normal).with_mutation(Mutation::Throttle {
                    rows_per_second: Some(0),
                }),
            )
            .unwrap();
        assert_eq!(
            names(&actions),
            ["persist", "seal", "rate", "forward", "stop-snapshot"]
        );
        assert!(!core.snapshot_active());
        core.on_upstream_chunk(chunk("+ 0 0\n+ 7 7")).unwrap();
        let actions = core.on_barrier(barrier(3, BarrierKind::Normal)).unwrap();
        assert_eq!(
            emitted(&actions),
            "+ 0 0\n",
            "upstream changes keep flowing"
        );
        let actions = core
            .on_barrier(
                barrier(4, BarrierKind::Normal).with_mutation(Mutation::Throttle {
                    rows_per_second: None,
                }),
            )
            .unwrap();
        assert_eq!(names(&actions).last(), Some(&"start"));
    }

    #[test]
    fn exhaustion_emits_that_epochs_buffered_changes_unfiltered() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_upstream_chunk(chunk("+ 100 1\n- 2 0")).unwrap();
        core.on_snapshot_output(snapshot(&[2, 3], true)).unwrap();
        let actions = core
            .on_barrier(barrier(2, BarrierKind::Checkpoint))
            .unwrap();
        assert_eq!(emitted(&actions), "+ 100 1\n- 2 0\n");
        assert_eq!(
            names(&actions),
            [
                "emit",
                "persist",
                "seal",
                "forward",
                "stop-snapshot",
                "finished"
            ],
            "no replication once finished"
        );
        assert_eq!(core.phase(), Phase::Done);
    }

    #[test]
    fn exhaustion_found_by_the_owed_read_at_the_barrier_keeps_the_epochs_rows() {
        // The driver's owed read finds the snapshot exhausted right before the barrier.
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_upstream_chunk(chunk("+ 50 5")).unwrap();
        assert!(core.owes_snapshot_read());
        core.on_snapshot_end().unwrap();
        let actions = core.on_barrier(barrier(2, BarrierKind::Normal)).unwrap();
        assert_eq!(emitted(&actions), "+ 50 5\n");
        assert!(names(&actions).contains(&"finished"));
    }

    #[test]
    fn finished_is_reported_exactly_once() {
        let mut core = core();
        let mut finished = 0;
        let mut count = |actions: &[Action]| {
            finished += actions
                .iter()
                .filter(|a| matches!(a, Action::Finished))
                .count()
        };
        count(&core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap());
        count(&core.on_snapshot_end().unwrap());
        for prev in 2..8 {
            count(
                &core
                    .on_barrier(barrier(prev, BarrierKind::Checkpoint))
                    .unwrap(),
            );
            count(&core.on_upstream_chunk(chunk("+ 1 1")).unwrap());
        }
        assert_eq!(finished, 1);
    }

    #[test]
    fn restored_finished_state_reports_once_and_passes_through() {
        let mut progress = ProgressMap::new(VnodeBitmap::full(VnodeCount::new(1).unwrap()));
        progress.complete(VirtualNode::ZERO).unwrap();
        progress.mark_persisted();
        let mut core = core_with(progress);
        let actions = core.on_barrier(barrier(9, BarrierKind::Normal)).unwrap();
        assert_eq!(names(&actions), ["forward", "finished"]);
        let actions = core.on_upstream_chunk(chunk("+ 1 1")).unwrap();
        assert_eq!(names(&actions), ["emit"], "chunks pass straight through");
        let w = Watermark {
            column: 0,
            value: Arc::new(Int64Array::from(vec![1])),
        };
        assert_eq!(names(&core.on_watermark(w).unwrap()), ["watermark"]);
        let actions = core
            .on_barrier(barrier(10, BarrierKind::Checkpoint))
            .unwrap();
        assert_eq!(names(&actions), ["forward"]);
        assert!(core.stats().finished);
    }

    #[test]
    fn watermarks_are_dropped_while_backfilling() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        let w = Watermark {
            column: 0,
            value: Arc::new(Int64Array::from(vec![1])),
        };
        assert!(core.on_watermark(w).unwrap().is_empty());
    }

    #[test]
    fn stop_forwards_then_ends() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        let actions = core
            .on_barrier(barrier(2, BarrierKind::Checkpoint).with_mutation(Mutation::Stop))
            .unwrap();
        assert_eq!(
            names(&actions),
            ["seal", "forward", "stop-snapshot", "stop"]
        );
        assert!(core.on_upstream_chunk(chunk("+ 1 1")).is_err());
        assert_eq!(core.phase(), Phase::Stopped);
    }

    #[test]
    fn barriers_must_continue_the_open_epoch() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        assert!(matches!(
            core.on_barrier(barrier(5, BarrierKind::Normal)),
            Err(Error::EpochOrder { .. })
        ));
    }

    #[test]
    fn snapshot_output_after_exhaustion_is_an_internal_error() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_snapshot_end().unwrap();
        assert!(matches!(
            core.on_snapshot_output(snapshot(&[1], false)),
            Err(Error::Internal(_))
        ));
    }

    #[test]
    fn stats_count_rows() {
        let mut core = core();
        core.on_barrier(barrier(1, BarrierKind::Normal)).unwrap();
        core.on_snapshot_output(snapshot(&[1, 2, 3], false))
            .unwrap();
        core.on_upstream_chunk(chunk("+ 0 0\n+ 9 9")).unwrap();
        core.on_barrier(barrier(2, BarrierKind::Normal)).unwrap();
        let stats = core.stats();
        assert_eq!(stats.snapshot_rows, 3);
        assert_eq!(stats.upstream_rows_emitted, 1);
        assert_eq!(stats.upstream_rows_dropped, 1);
        assert_eq!(stats.vnodes.in_progress, 1);
        assert_eq!(stats.epoch, 3);
        // Vnode 0 started in epoch 2 (the one barrier 1 -> 2 opened).
        assert_eq!(
            stats.slowest,
            vec![SlowVnode {
                since_epoch: 2,
                vnode: VirtualNode::ZERO,
                rows: 3
            }]
        );
    }
}
