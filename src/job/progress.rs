//! Job-level progress: the actors' counters summed into one view, on `watch` channels.
//!
//! Every actor publishes its executor's [`BackfillStats`] to the [`StatsBoard`] after each
//! message it sends; the board sums them into the job's [`BackfillStats`] (what a job's
//! upstream task waits on to end the job) and a [`JobProgress`] (rows read of the estimated total,
//! rate, ETA, vnodes per state, per-actor rows, the slowest vnodes) for progress bars.
//!
//! The slowest vnodes are those in progress the longest (since the earliest epoch, over all
//! actors, counted from the last resume or rescale, which restore every open vnode): in
//! per-vnode order (one vnode after the other), the vnode being read and, after a resume or
//! rescale, those restored in progress; in merged order every vnode starts at once, so they
//! are the lowest-numbered vnodes still open, with their rows read.
//!
//! Counting: `rows_read` is the snapshot rows emitted in all (restored progress included),
//! the sum of the actors' per-vnode row counts. The snapshot of a vnode is read at the
//! latest epoch, so it also carries rows inserted upstream after the job started; a total
//! taken from the initial table can therefore be passed. `rows_total` is never below
//! `rows_read`, and equals it once finished, so the fraction never passes 100%.
//!
//! A rescale starts a new *generation* of actors: the counters of this run that the old
//! actors accumulated (`snapshot_rows_this_run`, upstream rows) are kept in `retired`, and
//! the job reports "finished" only when every actor of the current generation has.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backfill::{BackfillStats, SLOWEST_VNODES, SlowVnode, VnodeStateCounts};
use crate::error::{Result, internal};

/// One actor's share of the job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorProgress {
    /// Vnodes it owns.
    pub vnodes: usize,
    /// Snapshot rows it emitted (restored progress of its vnodes included).
    pub rows: u64,
    /// Its vnodes per state.
    pub states: VnodeStateCounts,
    /// It has finished its vnodes.
    pub finished: bool,
}

/// The job's progress, as published on its `watch` channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobProgress {
    /// The epoch every actor has reached.
    pub epoch: u64,
    /// Snapshot rows emitted in all (including before a restart).
    pub rows_read: u64,
    /// The estimated snapshot rows in all; never below `rows_read` (see the module docs).
    pub rows_total: u64,
    /// Snapshot rows emitted by this run.
    pub rows_read_this_run: u64,
    /// Snapshot rows per second over this run.
    pub rate: f64,
    /// The estimated time left, when there is a rate to estimate from.
    pub eta: Option<Duration>,
    /// Vnodes per state, over all actors.
    pub vnodes: VnodeStateCounts,
    /// Per actor of the current generation.
    pub actors: Vec<ActorProgress>,
    /// Up to [`SLOWEST_VNODES`] vnodes in progress the longest, over all actors, slowest
    /// first.
    pub slowest_vnodes: Vec<SlowVnode>,
    /// Rescales completed so far.
    pub rescales: u64,
    /// The longest a rescale held the job: from the rescale barrier reaching the dispatcher
    /// to the new actors running (the old actors' last epoch, the merge, the consumer's
    /// commit and the restart).
    pub rescale_pause_max: Duration,
    /// The longest restart part of a rescale: from the store's commit of the rescale barrier
    /// to the new actors running (the rest of the pause is the checkpoint's own latency).
    pub rescale_restart_max: Duration,
    /// Every actor has finished.
    pub finished: bool,
}

struct Board {
    generation: u64,
    actors: Vec<Option<(usize, BackfillStats)>>,
    retired: BackfillStats,
    rescales: u64,
    rescale_pause_max: Duration,
    rescale_restart_max: Duration,
}

/// Where actors report and the job's views are computed.
pub(crate) struct StatsBoard {
    board: Mutex<Board>,
    started: Instant,
    estimate: u64,
    stats: watch::Sender<BackfillStats>,
    progress: watch::Sender<JobProgress>,
}

impl StatsBoard {
    /// A board for `actors` actors, with an estimate of the snapshot's rows.
    pub(crate) fn new(actors: usize, estimate: u64) -> Self {
        let (stats, _) = watch::channel(BackfillStats::default());
        let (progress, _) = watch::channel(JobProgress {
            rows_total: estimate,
            ..JobProgress::default()
        });
        Self {
            board: Mutex::new(Board {
                generation: 0,
                actors: vec![None; actors],
                retired: BackfillStats::default(),
                rescales: 0,
                rescale_pause_max: Duration::ZERO,
                rescale_restart_max: Duration::ZERO,
            }),
            started: Instant::now(),
            estimate,
            stats,
            progress,
        }
    }

    pub(crate) fn stats(&self) -> watch::Receiver<BackfillStats> {
        self.stats.subscribe()
    }

    pub(crate) fn progress(&self) -> watch::Receiver<JobProgress> {
        self.progress.subscribe()
    }

    /// Starts a new generation of `actors` actors; returns its number.
    pub(crate) fn new_generation(&self, actors: usize) -> Result<u64> {
        let mut board = self
            .board
            .lock()
            .map_err(|_| internal!("the stats board is poisoned"))?;
        let old = std::mem::replace(&mut board.actors, vec![None; actors]);
        for (_, s) in old.into_iter().flatten() {
            board.retired.snapshot_rows_this_run += s.snapshot_rows_this_run;
            board.retired.upstream_rows_emitted += s.upstream_rows_emitted;
            board.retired.upstream_rows_dropped += s.upstream_rows_dropped;
        }
        board.generation += 1;
        board.rescales += 1;
        Ok(board.generation)
    }

    /// A rescale held the job for `pause`, `restart` of it after the commit.
    pub(crate) fn record_rescale(&self, pause: Duration, restart: Duration) -> Result<()> {
        let mut board = self
            .board
            .lock()
            .map_err(|_| internal!("the stats board is poisoned"))?;
        board.rescale_pause_max = board.rescale_pause_max.max(pause);
        board.rescale_restart_max = board.rescale_restart_max.max(restart);
        let (total, progress) = self.sum(&board);
        drop(board);
        self.stats.send_replace(total);
        self.progress.send_replace(progress);
        Ok(())
    }

    /// Actor `index` of `generation` (owning `vnodes` vnodes) reports its counters.
    pub(crate) fn update(
        &self,
        generation: u64,
        index: usize,
        vnodes: usize,
        stats: BackfillStats,
    ) -> Result<()> {
        let mut board = self
            .board
            .lock()
            .map_err(|_| internal!("the stats board is poisoned"))?;
        if board.generation != generation {
            return Ok(());
        }
        let slot = board
            .actors
            .get_mut(index)
            .ok_or_else(|| internal!("no actor {index} in generation {generation}"))?;
        *slot = Some((vnodes, stats));
        let (total, progress) = self.sum(&board);
        drop(board);
        self.stats.send_replace(total);
        self.progress.send_replace(progress);
        Ok(())
    }

    fn sum(&self, board: &Board) -> (BackfillStats, JobProgress) {
        let mut total = BackfillStats {
            snapshot_rows_this_run: board.retired.snapshot_rows_this_run,
            upstream_rows_emitted: board.retired.upstream_rows_emitted,
            upstream_rows_dropped: board.retired.upstream_rows_dropped,
            finished: true,
            epoch: u64::MAX,
            ..BackfillStats::default()
        };
        let mut actors = Vec::with_capacity(board.actors.len());
        for slot in &board.actors {
            let Some((vnodes, s)) = slot else {
                total.finished = false;
                actors.push(ActorProgress::default());
                continue;
            };
            total.epoch = total.epoch.min(s.epoch);
            total.snapshot_rows += s.snapshot_rows;
            total.snapshot_rows_this_run += s.snapshot_rows_this_run;
            total.upstream_rows_emitted += s.upstream_rows_emitted;
            total.upstream_rows_dropped += s.upstream_rows_dropped;
            total.vnodes.not_started += s.vnodes.not_started;
            total.vnodes.in_progress += s.vnodes.in_progress;
            total.vnodes.completed += s.vnodes.completed;
            total.finished &= s.finished;
            total.slowest.extend_from_slice(&s.slowest);
            actors.push(ActorProgress {
                vnodes: *vnodes,
                rows: s.snapshot_rows,
                states: s.vnodes,
                finished: s.finished,
            });
        }
        if total.epoch == u64::MAX {
            total.epoch = 0;
        }
        total.slowest.sort_unstable();
        total.slowest.truncate(SLOWEST_VNODES);
        let rows_total = if total.finished {
            total.snapshot_rows
        } else {
            self.estimate.max(total.snapshot_rows)
        };
        let secs = self.started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            total.snapshot_rows_this_run as f64 / secs
        } else {
            0.0
        };
        let eta = (rate > 0.0)
            .then(|| Duration::from_secs_f64((rows_total - total.snapshot_rows) as f64 / rate));
        let progress = JobProgress {
            epoch: total.epoch,
            rows_read: total.snapshot_rows,
            rows_total,
            rows_read_this_run: total.snapshot_rows_this_run,
            rate,
            eta,
            vnodes: total.vnodes,
            actors,
            slowest_vnodes: total.slowest.clone(),
            rescales: board.rescales,
            rescale_pause_max: board.rescale_pause_max,
            rescale_restart_max: board.rescale_restart_max,
            finished: total.finished,
        };
        (total, progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rows: u64, this_run: u64, finished: bool) -> BackfillStats {
        BackfillStats {
            epoch: 5,
            snapshot_rows: rows,
            snapshot_rows_this_run: this_run,
            finished,
            ..BackfillStats::default()
        }
    }

    #[test]
    fn the_total_never_falls_below_what_was_read() {
        let board = StatsBoard::new(2, 100);
        let progress = board.progress();
        board.update(0, 0, 3, stats(80, 80, false)).unwrap();
        assert!(!board.stats().borrow().finished, "actor 1 has not reported");
        board.update(0, 1, 3, stats(40, 40, false)).unwrap();
        let p = progress.borrow().clone();
        assert_eq!((p.rows_read, p.rows_total), (120, 120));
        board.update(0, 0, 3, stats(80, 80, true)).unwrap();
        board.update(0, 1, 3, stats(50, 50, true)).unwrap();
        let p = progress.borrow().clone();
        assert!(p.finished);
        assert_eq!((p.rows_read, p.rows_total), (130, 130));
        assert_eq!(p.actors.len(), 2);
    }

    #[test]
    fn a_rescale_keeps_this_runs_counts_and_ignores_the_old_generation() {
        let board = StatsBoard::new(2, 1000);
        board.update(0, 0, 2, stats(10, 10, false)).unwrap();
        board.update(0, 1, 2, stats(20, 20, false)).unwrap();
        let generation = board.new_generation(1).unwrap();
        board.update(0, 1, 2, stats(25, 25, false)).unwrap(); // late report: ignored
        board.update(generation, 0, 4, stats(30, 0, false)).unwrap();
        let s = board.stats().borrow().clone();
        assert_eq!((s.snapshot_rows, s.snapshot_rows_this_run), (30, 30));
        assert_eq!(board.progress().borrow().rescales, 1);
    }

    #[test]
    fn the_slowest_vnodes_of_all_actors_are_the_longest_in_progress() {
        let board = StatsBoard::new(2, 1000);
        let slow = |since_epoch, vnode, rows| SlowVnode {
            since_epoch,
            vnode: crate::vnode::VirtualNode::new(vnode),
            rows,
        };
        let with = |slowest: Vec<SlowVnode>| BackfillStats {
            slowest,
            ..stats(10, 10, false)
        };
        board
            .update(0, 0, 4, with(vec![slow(3, 1, 5), slow(7, 2, 9)]))
            .unwrap();
        board
            .update(
                0,
                1,
                4,
                with(vec![slow(2, 8, 1), slow(3, 0, 4), slow(9, 5, 0)]),
            )
            .unwrap();
        let p = board.progress().borrow().clone();
        assert_eq!(
            p.slowest_vnodes,
            vec![slow(2, 8, 1), slow(3, 0, 4), slow(3, 1, 5)]
        );
        assert_eq!(board.stats().borrow().slowest, p.slowest_vnodes);
    }
}
