//! A job's upstream task: takes the source's [`Change`]s, checks them, writes them into the
//! upstream table, and sends them with the job's barriers to the backfill actors.
//!
//! Barriers close epochs where the source says ([`Change::Barrier`], a new `_epoch` value), at
//! the barrier interval, and on request ([`JobControl`](crate::JobControl)). Each barrier
//! seals the table at the epoch it closes and records how many changes the table holds as of
//! it (the resume point of its checkpoint). Once the source ends, barriers keep turning until
//! the backfill has finished; then a `Stop` checkpoint ends the job.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::Array;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backfill::BackfillStats;
use crate::chunk::{Message, Mutation, StreamChunk};
use crate::error::{Result, internal};
use crate::job::barrier::{BarrierInjector, InFlight};
use crate::job::upstream::{Change, Checker, UpdatePairs, changelog_chunk};
use crate::store::{StateTable, WriterClaim};

/// How far the upstream table is, as of a sealed epoch: what a checkpoint commits as the
/// job's resume point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Change rows applied to the table in all.
    pub changes: u64,
    /// The `_epoch` of the last change applied, when the source's batches carry one.
    pub upstream_epoch: Option<u64>,
    /// The job ran to its end by this epoch: its source had ended and its backfill finished.
    pub ended: bool,
}

/// A request to the upstream task from outside (the job's control handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Close the open epoch now.
    Barrier,
    /// Close the open epoch now, with a checkpoint.
    Checkpoint,
    /// End the job at the next checkpoint, finished or not.
    Stop,
}

/// How long, once the source ended, the task waits for the backfill between barriers.
const IDLE_BARRIER_INTERVAL: Duration = Duration::from_millis(100);

/// The upstream task (see the module docs).
pub(crate) struct Feeder<T: StateTable, C> {
    pub changes: C,
    pub table: T,
    pub checker: Option<Checker>,
    /// Updates cut between changelog batches, joined.
    pub pairs: UpdatePairs,
    pub injector: BarrierInjector,
    pub in_flight: InFlight,
    pub tx: mpsc::Sender<Result<Message>>,
    pub stats: watch::Receiver<BackfillStats>,
    pub interval: Option<Duration>,
    pub requests: mpsc::UnboundedReceiver<Request>,
    pub applied: Applied,
    /// Per sealed epoch, how far the table was (taken by the commits).
    pub applied_at: Arc<Mutex<BTreeMap<u64, Applied>>>,
    /// The table's writer claim, held while the task runs.
    pub _claim: WriterClaim,
}

impl<T: StateTable, C: Stream<Item = Result<Change>> + Unpin> Feeder<T, C> {
    /// Runs to the final `Stop` barrier; an error is also sent downstream, so the job ends
    /// with it.
    pub async fn run(mut self) -> Result<()> {
        match self.feed().await {
            Ok(()) => Ok(()),
            Err(e) => {
                let message = e.to_string();
                let _ = self.tx.send(Err(e)).await;
                Err(internal!("upstream: {message}"))
            }
        }
    }

    async fn feed(&mut self) -> Result<()> {
        // The first barrier closes the committed epoch, which the store already holds.
        self.in_flight.acquire().await?;
        let first = self.injector.next(None);
        let mut open = first.epoch.curr;
        self.send(Message::Barrier(first)).await?;
        let mut last_barrier = Instant::now();
        let mut dirty = false;
        let mut requests_open = true;
        loop {
            let due = self.interval.map(|i| last_barrier + i);
            let item = tokio::select! {
                request = self.requests.next(), if requests_open => {
                    match request {
                        Some(Request::Stop) => return self.stop().await,
                        Some(request) => {
                            open = self.barrier(request == Request::Checkpoint, None).await?;
                            last_barrier = Instant::now();
                            dirty = false;
                        }
                        None => requests_open = false,
                    }
                    continue;
                }
                () = sleep_until(due) => {
                    open = self.barrier(false, None).await?;
                    last_barrier = Instant::now();
                    dirty = false;
                    continue;
                }
                item = self.changes.next() => item,
            };
            let Some(item) = item else {
                self.pairs.check_complete("the end of the changes")?;
                break;
            };
            match item? {
                Change::Barrier | Change::Checkpoint if !dirty => {}
                change @ (Change::Barrier | Change::Checkpoint) => {
                    self.pairs.check_complete("a barrier the source sent")?;
                    open = self
                        .barrier(matches!(change, Change::Checkpoint), None)
                        .await?;
                    last_barrier = Instant::now();
                    dirty = false;
                }
                Change::Chunk(chunk) => {
                    self.pairs.check_complete("a chunk")?;
                    dirty |= self.apply(chunk, open).await?;
                }
                Change::Changelog(batch) => {
                    let Some(batch) = self.pairs.join(batch)? else {
                        continue;
                    };
                    let (chunk, epochs) = changelog_chunk(self.table.desc(), &batch)?;
                    let Some(epochs) = epochs else {
                        dirty |= self.apply(chunk, open).await?;
                        continue;
                    };
                    if epochs.null_count() > 0 {
                        return Err(crate::Error::InvalidChunk(
                            "column `_epoch` has NULLs".into(),
                        ));
                    }
                    // One run of equal `_epoch` values at a time; a new value closes the
                    // open epoch first.
                    let values = epochs.values();
                    let mut start = 0;
                    while start < values.len() {
                        let epoch = values[start];
                        let end = (start..values.len())
                            .find(|&i| values[i] != epoch)
                            .unwrap_or(values.len());
                        if self.applied.upstream_epoch.is_some_and(|e| e != epoch) && dirty {
                            open = self.barrier(false, None).await?;
                            last_barrier = Instant::now();
                            dirty = false;
                        }
                        let (batch, ops) = (chunk.batch(), chunk.ops());
                        let run = StreamChunk::new(
                            batch.slice(start, end - start),
                            ops[start..end].to_vec(),
                        )?;
                        dirty |= self.apply(run, open).await?;
                        self.applied.upstream_epoch = Some(epoch);
                        start = end;
                    }
                }
            }
        }
        if dirty {
            self.barrier(false, None).await?;
        }
        // The source has ended: keep the epochs turning until the backfill finishes. A
        // barrier goes out at the interval, or as soon as every vnode is read to the end
        // (finishing is reported at the next barrier).
        let all_read = |s: &BackfillStats| s.vnodes.not_started == 0 && s.vnodes.in_progress == 0;
        while !self.stats.borrow().finished {
            let read = self
                .wait_for(IDLE_BARRIER_INTERVAL, |s| s.finished || all_read(s))
                .await;
            if self.stats.borrow().finished {
                break;
            }
            if let Ok(Request::Stop) = self.requests.try_recv() {
                return self.stop().await;
            }
            self.barrier(false, None).await?;
            if read {
                self.wait_for(IDLE_BARRIER_INTERVAL, |s| s.finished).await;
            }
        }
        self.applied.ended = true;
        self.stop().await
    }

    /// Checks and writes `chunk` into the table (epoch `open`) and sends it on; whether it
    /// had rows.
    async fn apply(&mut self, chunk: StreamChunk, open: u64) -> Result<bool> {
        if chunk.is_empty() {
            return Ok(false);
        }
        let chunk = match self.checker.as_mut() {
            Some(checker) => checker.check(&self.table, chunk, open)?,
            None => chunk,
        };
        self.table.write(&chunk)?;
        self.applied.changes += chunk.num_rows() as u64;
        self.send(Message::Chunk(chunk)).await?;
        Ok(true)
    }

    /// Sends the final `Stop` checkpoint.
    async fn stop(&mut self) -> Result<()> {
        self.barrier(true, Some(Mutation::Stop)).await?;
        Ok(())
    }

    /// Seals the open epoch and sends its closing barrier; returns the new open epoch.
    async fn barrier(&mut self, checkpoint: bool, mutation: Option<Mutation>) -> Result<u64> {
        self.in_flight.acquire().await?;
        let barrier = self.injector.next_with(mutation, checkpoint);
        let prev = barrier.epoch.prev;
        self.table.seal(prev)?;
        if let Some(checker) = self.checker.as_mut() {
            checker.sealed(prev);
        }
        self.applied_at
            .lock()
            .map_err(|_| internal!("applied map poisoned"))?
            .insert(prev, self.applied);
        let open = barrier.epoch.curr;
        self.send(Message::Barrier(barrier)).await?;
        Ok(open)
    }

    /// Waits up to `timeout` for the backfill's counters to satisfy `done`.
    async fn wait_for(&mut self, timeout: Duration, done: impl Fn(&BackfillStats) -> bool) -> bool {
        let stats = &mut self.stats;
        tokio::time::timeout(timeout, async {
            while !done(&stats.borrow_and_update()) {
                if stats.changed().await.is_err() {
                    return false;
                }
            }
            true
        })
        .await
        .unwrap_or(false)
    }

    async fn send(&mut self, message: Message) -> Result<()> {
        self.tx
            .send(Ok(message))
            .await
            .map_err(|_| internal!("the backfill stopped reading its upstream"))
    }
}

/// Sleeps until `due`; forever without one.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
