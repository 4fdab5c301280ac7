//! A replay job: a dataset's snapshot and changelog through a backfill into Parquet files.
//!
//! ```text
//!   snapshot/*.parquet ──bulk load (rayon)──▶ upstream table @ epoch 1 (committed)
//!                                                     │ replicated scans
//!   changes/*.parquet ──▶ source task ──bounded──▶ backfill executor ──▶ sink (2PC) ──▶ out/changes/
//!                          (materialize: write       (k-way merge,        epoch-<e>.parquet
//!                           upstream, seal, inject    filter, progress)
//!                           barriers, pace)
//! ```
//!
//! The source task applies each change chunk to the upstream table and sends it on; every
//! distinct dataset `_epoch` ends with a barrier (and, with a barrier interval, a long epoch
//! is split by extra barriers). When the changelog is exhausted, barriers keep coming at the
//! interval until the backfill reports it has finished; then one last checkpoint barrier
//! carries `Stop`. The consumer commits every checkpoint: prepare the file, commit the store,
//! publish the file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use tokio::sync::watch;

use crate::backfill::core::BackfillStats;
use crate::backfill::executor::{BackfillConfig, BackfillExecutor, SnapshotOrder};
use crate::chunk::{Message, Mutation, StreamChunk};
use crate::error::{Error, Result};
use crate::job::barrier::BarrierInjector;
use crate::job::sink::ParquetSink;
use crate::replay::Dataset;
use crate::store::{MemoryStore, StateStore, StateTable};
use crate::vnode::{VnodeBitmap, VnodeCount};

/// The epoch the snapshot is committed at.
const SNAPSHOT_EPOCH: u64 = 1;
/// Rows per Parquet read and store write while bulk loading the snapshot.
const LOAD_BATCH_ROWS: usize = 64 * 1024;
/// Upstream messages in flight between the source task and the backfill.
const CHANNEL_CAPACITY: usize = 64;
/// The barrier interval once the changelog is exhausted, when none is configured.
const DEFAULT_IDLE_BARRIER_INTERVAL: Duration = Duration::from_millis(100);

/// Settings of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The output directory (`changes/` goes inside).
    pub out: PathBuf,
    /// Vnodes of the upstream table.
    pub vnodes: VnodeCount,
    /// Rows per snapshot output batch and per change chunk.
    pub batch_size: usize,
    /// Merged or per-vnode snapshot order.
    pub order: SnapshotOrder,
    /// Every k-th barrier is a checkpoint.
    pub checkpoint_every: u64,
    /// Extra barriers at this interval (and the pace of barriers once the changelog ends).
    pub barrier_interval: Option<Duration>,
    /// Snapshot rows per second (`None`: unlimited).
    pub rate_limit: Option<u64>,
    /// Changelog rows per second (`None`: as fast as the backfill takes them).
    pub upstream_rate: Option<u64>,
}

impl ReplayOptions {
    /// Defaults for `out`: 256 vnodes, batches of 1024, merged order, a checkpoint at every
    /// barrier, no limits.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Self {
            out: out.into(),
            vnodes: VnodeCount::DEFAULT,
            batch_size: 1024,
            order: SnapshotOrder::Merged,
            checkpoint_every: 1,
            barrier_interval: None,
            rate_limit: None,
            upstream_rate: None,
        }
    }
}

/// A progress report, sent after every downstream message.
#[derive(Debug, Clone, Default)]
pub struct ReplayProgress {
    /// Snapshot rows in the dataset.
    pub snapshot_total: u64,
    /// The backfill's counters.
    pub backfill: BackfillStats,
    /// Changelog rows applied upstream so far.
    pub upstream_changes: u64,
    /// Rows published to the output.
    pub output_rows: u64,
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct ReplaySummary {
    /// Snapshot rows loaded.
    pub snapshot_rows: u64,
    /// Changelog rows applied upstream.
    pub upstream_changes: u64,
    /// Downstream rows written.
    pub output_rows: u64,
    /// Output files written.
    pub output_files: u64,
    /// Barriers (epochs) the job went through.
    pub epochs: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Wall time from the start of the load to the last commit.
    pub elapsed: Duration,
    /// Time spent bulk loading the snapshot.
    pub load_time: Duration,
    /// The output directory.
    pub out: PathBuf,
}

/// Replays `dataset`: validates it (nothing is written on bad input), loads the snapshot,
/// backfills while the changelog is applied, writes the output. `on_progress` is called
/// with fresh counters as the job goes.
pub async fn run_replay(
    dataset: &Dataset,
    options: &ReplayOptions,
    mut on_progress: impl FnMut(&ReplayProgress),
) -> Result<ReplaySummary> {
    if options.batch_size == 0 {
        return Err(Error::InvalidConfig("batch size must be at least 1".into()));
    }
    let injector = BarrierInjector::new(SNAPSHOT_EPOCH, options.checkpoint_every)?;
    let summary = dataset.validate()?;
    let started = Instant::now();

    // The upstream table, bulk loaded and committed at the snapshot epoch.
    let store = MemoryStore::new();
    let desc = store.create_table(dataset.table_desc(options.vnodes)?)?;
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut upstream = store.table(desc.name(), all.clone())?;
    let load_started = Instant::now();
    for batch in dataset.read_snapshot(LOAD_BATCH_ROWS)? {
        upstream.write(&StreamChunk::inserts(batch?))?;
    }
    upstream.seal(SNAPSHOT_EPOCH)?;
    store.commit(SNAPSHOT_EPOCH)?;
    let load_time = load_started.elapsed();

    let mut sink = ParquetSink::create(&options.out, desc.schema())?;
    let config = BackfillConfig {
        batch_size: options.batch_size,
        order: options.order,
        rate_limit: options.rate_limit,
        progress_table: None,
    };
    let executor = BackfillExecutor::arrangement(&store, desc.name(), all, config)?;
    let stats = executor.progress();
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let source = Source {
        dataset: dataset.clone(),
        upstream,
        injector,
        tx,
        stats: stats.clone(),
        batch_size: options.batch_size,
        barrier_interval: options.barrier_interval,
        upstream_rate: options.upstream_rate,
    };
    let (changes_tx, changes_rx) = watch::channel(0u64);
    let source_task = tokio::spawn(source.run(changes_tx));

    let mut downstream = Box::pin(executor.execute(rx));
    let mut progress = ReplayProgress {
        snapshot_total: summary.snapshot_rows,
        ..ReplayProgress::default()
    };
    let (mut epochs, mut checkpoints) = (0u64, 0u64);
    let mut open_epoch = SNAPSHOT_EPOCH;
    while let Some(message) = downstream.next().await {
        match message? {
            Message::Chunk(chunk) => sink.push(open_epoch, chunk),
            Message::Watermark(_) => {}
            Message::Barrier(barrier) => {
                epochs += 1;
                open_epoch = barrier.epoch.curr;
                if barrier.is_checkpoint() && barrier.epoch.prev > SNAPSHOT_EPOCH {
                    let prepared = sink.prepare(barrier.epoch.prev)?;
                    store.commit(barrier.epoch.prev)?;
                    if let Some(prepared) = prepared {
                        sink.publish(prepared)?;
                    }
                    checkpoints += 1;
                }
            }
        }
        progress.backfill = stats.borrow().clone();
        progress.upstream_changes = *changes_rx.borrow();
        progress.output_rows = sink.rows_published();
        on_progress(&progress);
    }
    let upstream_changes = source_task
        .await
        .map_err(|e| Error::Internal(format!("the source task failed: {e}")))??;
    if !stats.borrow().finished {
        return Err(Error::Internal(
            "the job stopped before the backfill finished".into(),
        ));
    }
    Ok(ReplaySummary {
        snapshot_rows: summary.snapshot_rows,
        upstream_changes,
        output_rows: sink.rows_published(),
        output_files: sink.files_published(),
        epochs,
        checkpoints,
        elapsed: started.elapsed(),
        load_time,
        out: options.out.clone(),
    })
}

/// The upstream source and materialize: applies the changelog to the upstream table and
/// sends it, with barriers, to the backfill.
struct Source {
    dataset: Dataset,
    upstream: crate::store::MemoryTable,
    injector: BarrierInjector,
    tx: mpsc::Sender<Result<Message>>,
    stats: watch::Receiver<BackfillStats>,
    batch_size: usize,
    barrier_interval: Option<Duration>,
    upstream_rate: Option<u64>,
}

impl Source {
    /// Runs to the final `Stop` barrier; returns the changelog rows applied. Errors are also
    /// sent downstream, so the job fails with them.
    async fn run(mut self, applied: watch::Sender<u64>) -> Result<u64> {
        match self.replay(&applied).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                let message = e.to_string();
                // The executor ends its output with this error; the job reports it.
                let _ = self.tx.send(Err(e)).await;
                Err(Error::Internal(format!("upstream source: {message}")))
            }
        }
    }

    async fn replay(&mut self, applied: &watch::Sender<u64>) -> Result<u64> {
        let started = Instant::now();
        let mut last_barrier = Instant::now();
        let mut rows = 0u64;
        let mut dataset_epoch: Option<u64> = None;
        let mut dirty = false;
        // The first barrier closes the snapshot epoch, which the load already sealed.
        let first = self.injector.next(None);
        self.send(Message::Barrier(first)).await?;
        for item in self.dataset.read_changes(self.batch_size)? {
            let item = item?;
            // A new dataset epoch: close the previous one, unless an interval barrier did.
            if dataset_epoch.is_some_and(|e| e != item.epoch) && dirty {
                self.barrier(None).await?;
                last_barrier = Instant::now();
            }
            dataset_epoch = Some(item.epoch);
            if let Some(rate) = self.upstream_rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(rows as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            self.upstream.write(&item.chunk)?;
            rows += item.chunk.num_rows() as u64;
            dirty = true;
            self.send(Message::Chunk(item.chunk)).await?;
            applied.send_replace(rows);
            if self
                .barrier_interval
                .is_some_and(|interval| last_barrier.elapsed() >= interval)
            {
                self.barrier(None).await?;
                last_barrier = Instant::now();
                dirty = false;
            }
        }
        // Close the last dataset epoch.
        if dirty {
            self.barrier(None).await?;
        }
        // The changelog is exhausted: keep the epochs turning until the backfill finishes.
        // A barrier goes out at the interval, or as soon as every vnode is read to the end
        // (finishing is reported at the next barrier).
        let idle = self
            .barrier_interval
            .unwrap_or(DEFAULT_IDLE_BARRIER_INTERVAL);
        let all_read = |s: &BackfillStats| s.vnodes.not_started == 0 && s.vnodes.in_progress == 0;
        while !self.stats.borrow().finished {
            let read = self.wait_for(idle, |s| s.finished || all_read(s)).await;
            if self.stats.borrow().finished {
                break;
            }
            self.barrier(None).await?;
            if read {
                // Give that barrier the time to pass before sending another.
                self.wait_for(idle, |s| s.finished).await;
            }
        }
        self.barrier(Some(Mutation::Stop)).await?;
        Ok(rows)
    }

    /// Waits up to `timeout` for the backfill's counters to satisfy `done`; returns whether
    /// they do.
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

    /// Seals the open epoch upstream and sends its closing barrier.
    async fn barrier(&mut self, mutation: Option<Mutation>) -> Result<()> {
        let barrier = self.injector.next(mutation);
        self.upstream.seal(barrier.epoch.prev)?;
        self.send(Message::Barrier(barrier)).await
    }

    async fn send(&mut self, message: Message) -> Result<()> {
        self.tx
            .send(Ok(message))
            .await
            .map_err(|_| Error::Internal("the backfill stopped reading its upstream".into()))
    }
}

/// The default output directory of a dataset: `out/<dataset name>`.
pub fn default_out_dir(dataset: &Dataset) -> PathBuf {
    Path::new("out").join(dataset.name())
}
