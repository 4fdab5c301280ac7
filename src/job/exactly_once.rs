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
///
/// A sink of "files" in memory: each checkpoint's rows are made durable as a pending file,
/// then published; `recover` drops what was never committed and publishes what was.
///
/// ```
/// # use std::collections::BTreeMap;
/// # use std::sync::{Arc, Mutex};
/// use arrangement_backfill::{
///     BackfillJob, ExactlyOnceSink, JobOptions, KeyColumn, MemoryStore, PreparedCheckpoint,
///     Recovery, Result, StreamChunk, TableDesc, load_table,
/// };
/// # use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
/// # use arrow_schema::{DataType, Field, Schema};
///
/// #[derive(Default, Clone)]
/// struct Files(Arc<Mutex<(BTreeMap<u64, usize>, BTreeMap<u64, usize>)>>); // (pending, published)
///
/// struct RowCounter { files: Files, rows: usize }
/// struct Pending { files: Files, epoch: u64, rows: usize }
///
/// impl ExactlyOnceSink for RowCounter {
///     type Prepared = Pending;
///     fn recover(&mut self, recovery: &Recovery) -> Result<()> {
///         let mut files = self.files.0.lock().unwrap();
///         let committed = recovery.committed.unwrap_or(0);
///         let pending = std::mem::take(&mut files.0);
///         files.1.extend(pending.into_iter().filter(|(e, _)| *e <= committed));
///         files.1.retain(|e, _| *e <= committed);
///         Ok(())
///     }
///     fn write(&mut self, _epoch: u64, chunk: StreamChunk) -> Result<()> {
///         self.rows += chunk.num_rows();
///         Ok(())
///     }
///     fn prepare(&mut self, epoch: u64) -> Result<Pending> {
///         let rows = std::mem::take(&mut self.rows);
///         Ok(Pending { files: self.files.clone(), epoch, rows })
///     }
/// }
///
/// impl PreparedCheckpoint for Pending {
///     fn make_durable(&mut self) -> Result<Option<String>> {
///         self.files.0.lock().unwrap().0.insert(self.epoch, self.rows);
///         Ok(Some(format!("{} rows", self.rows))) // committed with the checkpoint
///     }
///     fn publish(&mut self) -> Result<()> {
///         let mut files = self.files.0.lock().unwrap();
///         if let Some(rows) = files.0.remove(&self.epoch) {
///             files.1.insert(self.epoch, rows);
///         }
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<()> {
/// # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
/// # let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
/// # let rows = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..100))])?;
/// let store = MemoryStore::new();
/// load_table(&store, TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")])?,
///     RecordBatchIterator::new([Ok(rows)], schema))?;
/// let job = BackfillJob::start(&store, "view", "t", JobOptions::default(),
///     futures::stream::empty())?;
/// let files = Files::default();
/// let summary = job.run(&mut RowCounter { files: files.clone(), rows: 0 }).await?;
/// assert!(summary.ended);
/// let published: usize = files.0.lock().unwrap().1.values().sum();
/// assert_eq!(published, 100, "every row of the table, published once");
/// # Ok::<(), arrangement_backfill::Error>(())
/// # })
/// # }
/// ```
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
