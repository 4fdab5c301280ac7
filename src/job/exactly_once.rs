//! The exactly-once sink interface: how a job hands its output to a sink so that, across
//! any crash, the sink publishes every epoch's rows exactly once.
//!
//! The store's commit of a checkpoint is the decision point (two-phase commit, with the
//! store as coordinator):
//!
//! ```text
//!   write(e, rows)...   prepare(c)          make_durable()        store.commit(c)       publish()        committed(c)
//!   rows of the epochs  (job's loop, quick:  (blocking thread,      with the record       (blocking        (job's loop:
//!   up to checkpoint c  hand the rows off)    beside epoch c+1's    make_durable          thread: make     bookkeeping)
//!                                              writes: durable,     returned)             it visible)
//!                                              invisible)
//! ```
//!
//! After a crash, [`ExactlyOnceSink::recover`] gets the committed checkpoint and the records
//! committed with every checkpoint: output of a later checkpoint was never committed (remove
//! it), output of a committed one may not have been published yet (publish it again). One
//! checkpoint commits at a time, in epoch order.

use crate::chunk::StreamChunk;
use crate::error::Result;

/// What a sink learns when a job starts: where its committed output ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The job's last committed checkpoint (`None`: a job that never committed one). The
    /// job's output starts right after it: rows of later epochs that the sink holds from an
    /// earlier run were never committed.
    pub committed: Option<u64>,
    /// The records the sink's checkpoints returned from
    /// [`PreparedCheckpoint::make_durable`], committed with them, oldest first, as
    /// `(checkpoint epoch, record)`.
    pub records: Vec<(u64, String)>,
}

/// A sink that publishes a job's output exactly once (see the module docs and
/// [`BackfillJob::run`](crate::BackfillJob::run)).
pub trait ExactlyOnceSink: Send + 'static {
    /// A checkpoint's output on its way to being durable and published.
    type Prepared: PreparedCheckpoint;

    /// Called once, before anything else: removes output that was never committed and
    /// publishes committed output that a crash left unpublished.
    fn recover(&mut self, recovery: &Recovery) -> Result<()>;

    /// Rows of epoch `epoch` (the job's epochs grow; rows of one epoch come together).
    fn write(&mut self, epoch: u64, chunk: StreamChunk) -> Result<()>;

    /// Checkpoint `epoch` closes: everything written with epochs at or below it belongs to
    /// it. Hands that output to the returned value, whose [`PreparedCheckpoint::make_durable`]
    /// runs on another thread while the job goes on with the next epoch: keep this quick.
    fn prepare(&mut self, epoch: u64) -> Result<Self::Prepared>;

    /// Checkpoint `epoch` is committed and published (bookkeeping, on the job's loop).
    fn committed(&mut self, epoch: u64, prepared: Self::Prepared) -> Result<()> {
        let _ = (epoch, prepared);
        Ok(())
    }
}

/// A checkpoint's output between [`ExactlyOnceSink::prepare`] and its publication.
pub trait PreparedCheckpoint: Send + 'static {
    /// Makes the checkpoint's output durable but not yet visible to readers; returns the
    /// record to commit with the checkpoint (given back in [`Recovery::records`]), if any.
    /// Runs on a blocking thread.
    fn make_durable(&mut self) -> Result<Option<String>>;

    /// After the store committed the checkpoint: makes its output visible. Must be
    /// idempotent in effect: after a crash, [`ExactlyOnceSink::recover`] may publish it
    /// again. Runs on a blocking thread.
    fn publish(&mut self) -> Result<()>;
}
