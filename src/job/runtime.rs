//! The parallel job runtime: a hash dispatcher, N backfill actors, a barrier-aligned merge,
//! and online rescale.
//!
//! ```text
//!                                        ┌─▶ actor 0 (BackfillExecutor over vnodes A) ─┐
//!   upstream ──▶ dispatcher task ────────┼─▶ actor 1 (BackfillExecutor over vnodes B) ─┼──▶ aligned merge ──▶ consumer
//!   Messages     (route rows by vnode,   └─▶ actor 2 ...                               ┘    (ParallelBackfill   (sink: prepare,
//!                 broadcast barriers,        each its own tokio task                          is a Stream)         commit, then
//!                 attach control requests)                                                                        ParallelBackfill::committed)
//! ```
//!
//! Every channel is bounded: a slow consumer stops the merge, which stops the actors, whose
//! full inputs stop the dispatcher, which stops reading the upstream.
//!
//! # Rescale
//! A checkpoint barrier `R` carrying [`Mutation::Rescale`] (from the upstream, or attached by
//! the dispatcher for a [`JobControl::rescale`] request) goes to every actor. Each persists and
//! seals its progress at `R.prev` (as every barrier does), forwards `R` and ends. The merge
//! emits `R` once all did and then waits. The consumer commits `R.prev` and reports it with
//! [`ParallelBackfill::committed`]; then the dispatcher (which has held every message after
//! `R`, so the upstream is back-pressured, not buffered) switches to the new vnode map,
//! starts the new actors, hands their outputs to the merge and goes on. Each new actor
//! restores its vnodes' progress as committed at `R.prev`: Completed vnodes are never read
//! again, in-progress ones continue after their position. A pause or rate limit in force
//! carries over. The source and the consumer keep running throughout.
//!
//! # Rate limits
//! A snapshot rate limit (initial, or `Throttle`) is the job's: each actor gets an even
//! share, at least one row per second (so with more actors than rows per second, the job
//! reads one row per second per actor). The barrier that leaves the job carries the limit
//! as it was sent.
//!
//! # Cancel safety
//! [`ParallelBackfill`] is a `Stream`; `StreamExt::next` is cancel safe. Dropping it aborts
//! the dispatcher and the actors; [`ParallelBackfill::shutdown`] also waits for them (and so
//! for their store handles to be released).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arrow_schema::SchemaRef;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backfill::{BackfillConfig, BackfillStats};
use crate::chunk::{Barrier, BarrierKind, Message, Mutation};
use crate::error::{Error, Result, internal};
use crate::job::actors::{Actor, ActorRecipe};
use crate::job::aligned_merge::{AlignedMerge, MergeControl, Originals};
use crate::job::control::JobControl;
use crate::job::dispatcher::VnodeMap;
use crate::job::progress::{JobProgress, StatsBoard};
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VnodeBitmap;

/// The running tasks of a job, so they can be stopped and awaited.
type Tasks = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// A backfill of one upstream table by several actors (see the module docs).
///
/// ```
/// # use std::sync::Arc;
/// # use arrangement_backfill::*;
/// # use arrow_array::{Int64Array, RecordBatch};
/// # use arrow_schema::{DataType, Field, Schema};
/// # use futures::StreamExt;
/// # fn main() -> Result<()> {
/// # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
/// let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
/// let store = MemoryStore::new();
/// let desc = store.create_table(TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")])?)?;
/// let mut table = store.table("t", VnodeBitmap::full(desc.vnode_count()))?;
/// let ids = Int64Array::from_iter_values(0..100);
/// table.write(&StreamChunk::inserts(RecordBatch::try_new(schema, vec![Arc::new(ids)])?))?;
/// table.seal(1)?;
/// store.commit(1)?;
///
/// // The upstream: no changes here, just barriers (the first closes the committed epoch,
/// // then checkpoints); the last one stops the job.
/// let barrier = |curr, kind| Barrier::new(EpochPair::new(curr, curr - 1), kind);
/// let mut barriers = vec![barrier(2, BarrierKind::Normal)];
/// barriers.extend((3..12).map(|e| barrier(e, BarrierKind::Checkpoint)));
/// barriers.push(barrier(12, BarrierKind::Checkpoint).with_mutation(Mutation::Stop));
/// let upstream = futures::stream::iter(barriers.into_iter().map(|b| Ok(Message::Barrier(b))));
/// let actors = VnodeMap::even(desc.vnode_count(), 2)?;
/// let mut job = ParallelBackfill::start(&store, "t", actors, BackfillConfig::default(), 100, upstream)?;
/// let mut rows = 0;
/// while let Some(message) = job.next().await {
///     match message? {
///         Message::Chunk(chunk) => rows += chunk.num_rows(),
///         Message::Barrier(b) if b.is_checkpoint() => {
///             store.commit(b.epoch.prev)?; // (a sink would prepare its output first)
///             job.committed(b.epoch.prev);
///         }
///         _ => {}
///     }
/// }
/// assert_eq!(rows, 100);
/// assert!(job.stats().borrow().finished);
/// job.shutdown().await;
/// # Ok(())
/// # })
/// # }
/// ```
pub struct ParallelBackfill {
    output: AlignedMerge,
    schema: SchemaRef,
    stats: watch::Receiver<BackfillStats>,
    progress: watch::Receiver<JobProgress>,
    committed: watch::Sender<u64>,
    control: JobControl,
    dispatcher: Option<JoinHandle<()>>,
    tasks: Tasks,
}

/// Actor `i`'s share of a job's snapshot rate limit among `n` actors.
fn rate_share(rate: Option<u64>, n: usize, i: usize) -> Option<u64> {
    rate.map(|r| {
        if r == 0 {
            return 0;
        }
        let n = n as u64;
        let share = r / n + u64::from((i as u64) < r % n);
        share.max(1)
    })
}

impl ParallelBackfill {
    /// Starts the actors of `map` over `table` (a table of `store` with the upstream's
    /// committed rows), fed by `upstream`: the upstream's changes and barriers, starting with
    /// a barrier whose `prev` is the store's committed epoch, the table already written and
    /// sealed by whoever produces it (as a [`BackfillJob`](crate::BackfillJob)'s upstream task
    /// does). `config.rate_limit` is
    /// the job's; `estimate` is the snapshot's expected rows (for progress only).
    ///
    /// Must be called inside a tokio runtime (it spawns the dispatcher and the actors). The
    /// consumer must report every checkpoint it commits with
    /// [`ParallelBackfill::committed`]: a rescale waits for it.
    pub fn start<S, U>(
        store: &S,
        table: &str,
        map: VnodeMap,
        config: BackfillConfig,
        estimate: u64,
        upstream: U,
    ) -> Result<Self>
    where
        S: StateStore,
        U: Stream<Item = Result<Message>> + Send + Unpin + 'static,
    {
        let count = map.sets()[0].count();
        let desc = store
            .replicated_table(table, VnodeBitmap::empty(count))?
            .desc()
            .clone();
        if desc.vnode_count() != count {
            return Err(Error::InvalidConfig(format!(
                "the actors' vnode map has {count} vnodes, table `{table}` has {}",
                desc.vnode_count()
            )));
        }
        let n = map.actors();
        let board = Arc::new(StatsBoard::new(n, estimate));
        let recipe = ActorRecipe {
            store: store.clone(),
            table: table.to_string(),
            config: config.clone(),
            board: board.clone(),
        };
        let mut actors = Vec::with_capacity(n);
        for (i, set) in map.sets().iter().enumerate() {
            actors.push(recipe.spawn(
                0,
                i,
                set.clone(),
                rate_share(config.rate_limit, n, i),
                false,
            )?);
        }
        let tasks: Tasks = Arc::default();
        let mut inputs = Vec::with_capacity(n);
        let mut outputs = Vec::with_capacity(n);
        {
            let mut registry = tasks
                .lock()
                .map_err(|_| internal!("task registry poisoned"))?;
            for Actor {
                input,
                output,
                task,
            } in actors
            {
                inputs.push(input);
                outputs.push(output);
                registry.push(task);
            }
        }
        let (merge_tx, merge_rx) = mpsc::channel(1);
        let originals = Originals::default();
        let (control, control_rx) = JobControl::new(count);
        let (committed, committed_rx) = watch::channel(store.committed_epoch()?.unwrap_or(0));
        let dispatcher = Dispatcher {
            upstream,
            desc: desc.clone(),
            map,
            inputs,
            recipe,
            generation: 0,
            control: control_rx,
            pending: VecDeque::new(),
            paused: false,
            rate: config.rate_limit,
            originals: originals.clone(),
            merge: merge_tx,
            committed: committed_rx,
            tasks: tasks.clone(),
        };
        let dispatcher = tokio::spawn(dispatcher.run());
        Ok(Self {
            output: AlignedMerge::new(outputs, merge_rx, originals),
            schema: desc.schema().clone(),
            stats: board.stats(),
            progress: board.progress(),
            committed,
            control,
            dispatcher: Some(dispatcher),
            tasks,
        })
    }

    /// The schema of the output chunks: the upstream table's.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The job's counters, summed over its actors (finished once every actor has).
    pub fn stats(&self) -> watch::Receiver<BackfillStats> {
        self.stats.clone()
    }

    /// The job's progress: rows read of the estimated total, rate, ETA, vnodes per state,
    /// per-actor rows.
    pub fn progress(&self) -> watch::Receiver<JobProgress> {
        self.progress.clone()
    }

    /// A handle to pause, resume, throttle or rescale the running job.
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// Reports that the store committed `epoch` (the consumer calls this after committing a
    /// checkpoint barrier it received; a rescale waits for it).
    pub fn committed(&self, epoch: u64) {
        self.committed.send_if_modified(|c| {
            let newer = epoch > *c;
            if newer {
                *c = epoch;
            }
            newer
        });
    }

    /// Stops the dispatcher and the actors and waits until they are gone (with them, their
    /// store handles).
    pub async fn shutdown(&mut self) {
        if let Some(dispatcher) = self.dispatcher.take() {
            dispatcher.abort();
            let _ = dispatcher.await;
        }
        let tasks = match self.tasks.lock() {
            Ok(mut tasks) => std::mem::take(&mut *tasks),
            Err(_) => Vec::new(),
        };
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for ParallelBackfill {
    fn drop(&mut self) {
        if let Some(dispatcher) = &self.dispatcher {
            dispatcher.abort();
        }
        if let Ok(tasks) = self.tasks.lock() {
            for task in tasks.iter() {
                task.abort();
            }
        }
    }
}

impl std::fmt::Debug for ParallelBackfill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParallelBackfill")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Stream for ParallelBackfill {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.output).poll_next(cx)
    }
}

/// The dispatcher task's state.
struct Dispatcher<S: StateStore, U> {
    upstream: U,
    desc: Arc<TableDesc>,
    map: VnodeMap,
    inputs: Vec<mpsc::Sender<Result<Message>>>,
    recipe: ActorRecipe<S>,
    generation: u64,
    control: mpsc::Receiver<Mutation>,
    /// Control requests not yet attached to a barrier.
    pending: VecDeque<Mutation>,
    paused: bool,
    rate: Option<u64>,
    originals: Originals,
    merge: mpsc::Sender<MergeControl>,
    committed: watch::Receiver<u64>,
    tasks: Tasks,
}

/// Why dispatching stopped without an error of its own.
enum Stopped {
    /// The upstream ended.
    UpstreamEnded,
    /// An actor stopped reading (it failed; the merge reports its error).
    ActorGone,
}

impl<S, U> Dispatcher<S, U>
where
    S: StateStore,
    U: Stream<Item = Result<Message>> + Send + Unpin + 'static,
{
    async fn run(mut self) {
        if let Err(e) = self.dispatch().await {
            let _ = self.merge.send(MergeControl::Failed(e)).await;
        }
    }

    async fn dispatch(&mut self) -> Result<Stopped> {
        while let Some(message) = self.upstream.next().await {
            let sent = match message? {
                Message::Chunk(chunk) => {
                    let parts = self.map.dispatch(&self.desc, &chunk)?;
                    let mut sent = true;
                    for (i, part) in parts.into_iter().enumerate() {
                        if let Some(part) = part {
                            sent &= self.send(i, Message::Chunk(part)).await;
                        }
                    }
                    sent
                }
                Message::Watermark(w) => {
                    let mut sent = true;
                    for i in 0..self.inputs.len() {
                        sent &= self.send(i, Message::Watermark(w.clone())).await;
                    }
                    sent
                }
                Message::Barrier(barrier) => self.on_barrier(barrier).await?,
            };
            if !sent {
                return Ok(Stopped::ActorGone);
            }
        }
        Ok(Stopped::UpstreamEnded)
    }

    /// Sends to actor `i`; false if it is gone.
    async fn send(&mut self, i: usize, message: Message) -> bool {
        match self.inputs.get_mut(i) {
            Some(input) => input.send(Ok(message)).await.is_ok(),
            None => false,
        }
    }

    /// Attaches a control request if it fits, tracks pause and rate, broadcasts the barrier,
    /// and rescales after a `Rescale`.
    async fn on_barrier(&mut self, mut barrier: Barrier) -> Result<bool> {
        let arrived = std::time::Instant::now();
        while let Ok(request) = self.control.try_recv() {
            self.pending.push_back(request);
        }
        if barrier.mutation.is_none()
            && let Some(front) = self.pending.front()
            && (!matches!(front, Mutation::Rescale { .. }) || barrier.is_checkpoint())
        {
            barrier.mutation = self.pending.pop_front();
        }
        let mut next_map = None;
        match &barrier.mutation {
            Some(Mutation::Pause) => self.paused = true,
            Some(Mutation::Resume) => self.paused = false,
            Some(Mutation::Throttle { rows_per_second }) => self.rate = *rows_per_second,
            Some(Mutation::Rescale { actors }) => {
                if !barrier.is_checkpoint() {
                    return Err(Error::Protocol(format!(
                        "a Rescale mutation on barrier {:?}, which is not a checkpoint",
                        barrier.epoch
                    )));
                }
                next_map = Some(VnodeMap::new(self.desc.vnode_count(), actors.clone())?);
            }
            Some(Mutation::Stop) | None => {}
        }
        self.originals
            .lock()
            .map_err(|_| internal!("the barrier log is poisoned"))?
            .push_back(barrier.clone());
        let n = self.inputs.len();
        let mut sent = true;
        for i in 0..n {
            let mut copy = barrier.clone();
            if let Some(Mutation::Throttle { rows_per_second }) = &mut copy.mutation {
                *rows_per_second = rate_share(self.rate, n, i);
            }
            sent &= self.send(i, Message::Barrier(copy)).await;
        }
        if let (true, Some(map)) = (sent, next_map) {
            let restart = self.rescale(&barrier, map).await?;
            self.recipe
                .board
                .record_rescale(arrived.elapsed(), restart)?;
        }
        Ok(sent)
    }

    /// Waits for the rescale barrier's commit, then replaces the actors; returns how long
    /// the replacing took.
    async fn rescale(&mut self, barrier: &Barrier, map: VnodeMap) -> Result<std::time::Duration> {
        let epoch = barrier.epoch.prev;
        self.committed
            .wait_for(|c| *c >= epoch)
            .await
            .map_err(|_| {
                Error::Protocol(format!(
                    "the job's consumer went away before committing the rescale checkpoint {epoch}"
                ))
            })?;
        let committed = std::time::Instant::now();
        // The old actors ended after forwarding the barrier (the merge took it, or the
        // consumer could not have committed it): wait for them to let go of their handles.
        self.inputs.clear();
        let old = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .map_err(|_| internal!("task registry poisoned"))?,
        );
        for task in old {
            let _ = task.await;
        }
        let n = map.actors();
        self.generation = self.recipe.board.new_generation(n)?;
        let mut outputs = Vec::with_capacity(n);
        for (i, set) in map.sets().iter().enumerate() {
            let actor = self.recipe.spawn(
                self.generation,
                i,
                set.clone(),
                rate_share(self.rate, n, i),
                true,
            )?;
            self.tasks
                .lock()
                .map_err(|_| internal!("task registry poisoned"))?
                .push(actor.task);
            let mut first = Barrier::new(barrier.epoch, BarrierKind::Normal);
            if self.paused {
                first = first.with_mutation(Mutation::Pause);
            }
            let mut input = actor.input;
            input
                .send(Ok(Message::Barrier(first)))
                .await
                .map_err(|_| internal!("actor {i} stopped before its first barrier"))?;
            self.inputs.push(input);
            outputs.push(actor.output);
        }
        self.merge
            .send(MergeControl::Actors(outputs))
            .await
            .map_err(|_| internal!("the merge went away during a rescale"))?;
        self.map = map;
        Ok(committed.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_shares_sum_to_the_limit_and_never_pause_an_actor() {
        for (rate, n) in [(10, 3), (1000, 2), (7, 7), (100, 1)] {
            let sum: u64 = (0..n).map(|i| rate_share(Some(rate), n, i).unwrap()).sum();
            assert_eq!(sum, rate);
        }
        assert_eq!(rate_share(Some(1), 3, 2), Some(1));
        assert_eq!(rate_share(Some(0), 3, 2), Some(0));
        assert_eq!(rate_share(None, 3, 2), None);
    }
}
