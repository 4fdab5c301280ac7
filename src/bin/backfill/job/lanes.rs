//! Column writers that each run through their own queue of leaves, so that a row group's
//! columns are encoded as a pipeline instead of in lockstep.
//!
//! Encoding a group of batches column by column and waiting for every column before the
//! next group left a core idle at the end of every group: the columns cost very different
//! amounts (a free-text column under zstd costs more than the flags and dates together), and
//! the last one ran alone while the next group waited. Here each column is a *lane*: a
//! writer and the leaves queued for it, drained in order by one rayon task at a time. A
//! column that is done with a group goes on with the next while a slow one catches up; the
//! only waits are at a row group's end ([`Lanes::finish`]) and when a lane has its most rows
//! queued ([`MAX_QUEUED_ROWS`] in the sink; [`Lanes::submit`] then waits for it, which bounds
//! the rows the lanes hold).
//!
//! ```text
//!   submit(leaves of batch b) ──▶ lane 0: [b-1][b] ──▶ writer 0   (one rayon task while
//!                                 lane 1: [b]      ──▶ writer 1    the lane has leaves)
//!                                 ...
//!   finish() waits for every lane to drain and hands the writers back, to be closed.
//! ```
//!
//! A writer gets its leaves in the order they were submitted, so the pages are the same as a
//! writer fed on one thread.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowLeafColumn};

use crate::error::{Error, Result, internal};

/// The most rows queued on a lane before [`Lanes::submit`] waits for it, by default: four of
/// the sink's groups of batches.
pub(crate) const MAX_QUEUED_ROWS: usize = 64 * 1024;

/// How long a wait on one of rayon's threads sleeps before it looks for rayon tasks again.
const POOL_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// One writer per leaf column of a row group, each draining its own queue.
pub(crate) struct Lanes {
    lanes: Vec<Arc<Lane>>,
    /// The most rows queued on a lane before [`Lanes::submit`] waits for it.
    max_queued_rows: usize,
}

struct Lane {
    state: Mutex<LaneState>,
    /// Signalled when the lane's queue shrinks or its task stops.
    drained: Condvar,
    /// Held by the draining task while it writes (never contended: one task at a time).
    writer: Mutex<Option<ArrowColumnWriter>>,
}

#[derive(Default)]
struct LaneState {
    /// Leaves to write, with their rows.
    queue: VecDeque<(ArrowLeafColumn, usize)>,
    queued_rows: usize,
    /// A task is draining the queue.
    running: bool,
    /// A write failed: the lane takes no more leaves.
    failed: bool,
    /// The failure, until it is reported.
    error: Option<Error>,
}

impl LaneState {
    /// The lane's failure, reported once as itself and then as having happened.
    fn failure(&mut self) -> Error {
        (self.error.take()).unwrap_or_else(|| internal!("a column writer failed before"))
    }
}

impl Lanes {
    /// Lanes for `writers`, one per leaf column, each holding at most `max_queued_rows`
    /// rows (and at least one batch) before [`Lanes::submit`] waits for it.
    pub(crate) fn new(writers: Vec<ArrowColumnWriter>, max_queued_rows: usize) -> Self {
        let lanes = (writers.into_iter())
            .map(|writer| {
                Arc::new(Lane {
                    state: Mutex::new(LaneState::default()),
                    drained: Condvar::new(),
                    writer: Mutex::new(Some(writer)),
                })
            })
            .collect();
        Self {
            lanes,
            max_queued_rows,
        }
    }

    /// Leaf columns a batch must have.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Queues the leaves of a batch of `rows` rows, one per lane, each lane started on rayon
    /// if idle; waits first for any lane with its most rows queued. A lane that failed fails
    /// the call.
    pub(crate) fn submit(&self, leaves: Vec<ArrowLeafColumn>, rows: usize) -> Result<()> {
        if leaves.len() != self.lanes.len() {
            return Err(internal!(
                "a batch has leaves for {} Parquet columns, the file {}",
                leaves.len(),
                self.lanes.len()
            ));
        }
        for (lane, leaf) in self.lanes.iter().zip(leaves) {
            let mut state = lane.lock()?;
            while !state.failed && state.queued_rows >= self.max_queued_rows {
                state = lane.wait(state)?;
            }
            if state.failed {
                return Err(state.failure());
            }
            state.queued_rows += rows;
            state.queue.push_back((leaf, rows));
            if !state.running {
                state.running = true;
                let lane = Arc::clone(lane);
                rayon::spawn(move || lane.drain());
            }
        }
        Ok(())
    }

    /// Waits for every lane to write what it was given and returns the writers, in column
    /// order; the first failure of any lane is the error.
    pub(crate) fn finish(self) -> Result<Vec<ArrowColumnWriter>> {
        let mut writers = Vec::with_capacity(self.lanes.len());
        for lane in &self.lanes {
            let mut state = lane.lock()?;
            while state.running {
                state = lane.wait(state)?;
            }
            if state.failed {
                return Err(state.failure());
            }
            drop(state);
            let writer = (lane.writer.lock())
                .map_err(|_| internal!("a column writer's lock is poisoned"))?
                .take()
                .ok_or_else(|| internal!("a column writer finished twice"))?;
            writers.push(writer);
        }
        Ok(writers)
    }
}

impl Lane {
    fn lock(&self) -> Result<MutexGuard<'_, LaneState>> {
        self.state
            .lock()
            .map_err(|_| internal!("a column lane's lock is poisoned"))
    }

    /// Waits for the lane to drain some (the caller re-checks what it waits for). On one of
    /// rayon's threads, which the lane's task may be queued behind, it runs pending rayon
    /// tasks meanwhile: a writer used inside the pool (even a pool of one thread) cannot
    /// wait for itself.
    fn wait<'a>(&'a self, state: MutexGuard<'a, LaneState>) -> Result<MutexGuard<'a, LaneState>> {
        if rayon::current_thread_index().is_none() {
            return (self.drained.wait(state))
                .map_err(|_| internal!("a column lane's lock is poisoned"));
        }
        drop(state);
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            return self.lock();
        }
        let state = self.lock()?;
        let (state, _) = (self.drained)
            .wait_timeout(state, POOL_WAIT)
            .map_err(|_| internal!("a column lane's lock is poisoned"))?;
        Ok(state)
    }

    /// Writes the queued leaves in order until the queue is empty (or a write fails), then
    /// marks the lane idle. Runs as one rayon task; a panic in the writer is recorded as the
    /// lane's failure, not lost with the task.
    fn drain(&self) {
        loop {
            let leaf = {
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                match state.queue.pop_front() {
                    Some((leaf, rows)) if !state.failed => {
                        state.queued_rows -= rows;
                        self.drained.notify_all();
                        leaf
                    }
                    _ => {
                        state.queue.clear();
                        state.queued_rows = 0;
                        state.running = false;
                        self.drained.notify_all();
                        return;
                    }
                }
            };
            let written = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
                let mut writer = (self.writer.lock())
                    .map_err(|_| internal!("a column writer's lock is poisoned"))?;
                let writer = writer
                    .as_mut()
                    .ok_or_else(|| internal!("a column lane without its writer"))?;
                Ok(writer.write(&leaf)?)
            }));
            let failure = match written {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(internal!("a column writer panicked")),
            };
            if let Some(failure) = failure
                && let Ok(mut state) = self.state.lock()
            {
                state.failed = true;
                state.error = Some(failure);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_writer::compute_leaves;

    use super::*;

    fn int_writers() -> Vec<ArrowColumnWriter> {
        let arrow = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let writer = ArrowWriter::try_new(Vec::new(), arrow, None).unwrap();
        let (_, factory) = writer.into_serialized_writer().unwrap();
        factory.create_column_writers(0).unwrap()
    }

    fn leaves(field: &Field, array: ArrayRef) -> Vec<ArrowLeafColumn> {
        compute_leaves(field, &array).unwrap()
    }

    #[test]
    fn a_lane_that_fails_fails_the_next_submit_and_the_finish_without_hanging() {
        let int = Field::new("k", DataType::Int64, false);
        let lanes = Lanes::new(int_writers(), 4);
        lanes
            .submit(leaves(&int, Arc::new(Int64Array::from(vec![1, 2]))), 2)
            .unwrap();
        // Strings given to an integer column's writer: its write fails (or panics) on the
        // lane's task.
        let text = Field::new("k", DataType::Utf8, false);
        lanes
            .submit(leaves(&text, Arc::new(StringArray::from(vec!["a"; 8]))), 8)
            .unwrap();
        let mut submitted_after = 0;
        let failed = loop {
            let more = leaves(&int, Arc::new(Int64Array::from(vec![3, 4])));
            match lanes.submit(more, 2) {
                Ok(()) => submitted_after += 1,
                Err(e) => break e,
            }
            assert!(
                submitted_after < 10_000,
                "the failure never stopped the lane"
            );
        };
        // The writer's own error, as it said it.
        assert!(failed.to_string().contains("Utf8"), "{failed}");
        let again = lanes.finish().unwrap_err();
        assert!(again.to_string().contains("failed before"), "{again}");
    }

    #[test]
    fn leaves_of_the_wrong_count_are_refused() {
        let lanes = Lanes::new(int_writers(), MAX_QUEUED_ROWS);
        let err = lanes.submit(Vec::new(), 0).unwrap_err();
        assert!(err.to_string().contains("leaves for 0"), "{err}");
        assert_eq!(lanes.finish().unwrap().len(), 1);
    }
}
