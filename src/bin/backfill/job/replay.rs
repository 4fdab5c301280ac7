//! A replay job: a dataset's snapshot and changelog through a backfill into Parquet files,
//! resumable after any stop. It is built on the library's job API.
//!
//! ```text
//!   snapshot/*.parquet ──TableLoader──▶ upstream table @ epoch 1 (committed, with the replay's record)
//!                                                     │
//!   changes/*.parquet ──▶ ChangeSource ──Changes──▶ BackfillJob "replay" ──run(sink)──▶ ParquetSink ──▶ OUT/changes/
//!                          (skip what the table        (writes the changes,               (two phases:     epoch-<e>.parquet
//!                           holds, a barrier per        closes epochs, commits,            .tmp, commit,
//!                           dataset epoch, pace,        resumes)                           rename)
//!                           rescales at epoch ends)
//! ```
//!
//! The source sends each dataset epoch's changes, then a barrier; the job adds barriers at the
//! barrier interval and, once the changelog is exhausted, until the backfill has finished;
//! then a final `Stop` checkpoint. Each checkpoint's file is encoded and synced while the job
//! goes on with the next epoch, committed with the store (its rows, size and CRC as the
//! checkpoint's record), then renamed into place. The dataset is validated whole (beside the
//! load), so the job's own checks of each change are off.
//!
//! # Resuming
//! With the durable store (the default, in `OUT/state`) the load commits in steps (one per
//! [`LOAD_STEP_ROWS`] snapshot rows, [`TableLoader::commit_step`]), the first with the
//! replay's record in the store's meta:
//! - `replay.job`: the job's identity (dataset name, columns, keys, vnode count, input files
//!   and sizes); a state directory of another job is refused;
//! - `replay.format`: the state's layout version (`STATE_FORMAT`, 2);
//! - `replay.job_id` and `replay.out`: the tie to the output (`output.rs`);
//! - `replay.validated`: once the dataset's validation passed, its outcome (the dataset's
//!   counts and the digest of the table it ends with), with the next step or the load's
//!   final commit: a run that resumes on the same input (its identity unchanged) does not
//!   validate it again;
//! - `replay.validation_checkpoint`: until then, the last checkpoint of the validation
//!   beside the load (its files in `STATE/validation/`, `validation.rs`), with each step: a
//!   run that resumes the load resumes the validation there too;
//!
//! and the library's load record (`upstream.<table>.load`: the rows the committed steps
//! hold, complete once the load's final commit made the snapshot epoch). A run killed during
//! the load resumes it after the rows its last step committed (the snapshot files before
//! them are not read again, the rows before them in their file are skipped by the reader):
//! a kill costs the rows loaded since that step;
//! and the job commits its own at every checkpoint: how many changelog rows the table holds,
//! whether the backfill finished, each file's record ([`BackfillJob::resume_point_in`],
//! [`BackfillJob::committed_records`]).
//!
//! Running the same replay again resumes from the last committed checkpoint: the committed
//! files are checked against their records, the sink rolls committed `.tmp` files forward and
//! removes uncommitted ones, the changelog is re-applied from the first row the table does not
//! hold, the backfill restores each vnode's position (Completed vnodes are never read again),
//! and epochs continue after the committed one. A finished job says so and does nothing. The
//! output directory is locked (`OUT/.lock`) for the run.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::SinkExt;
use futures::channel::mpsc;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::backfill::BackfillStats;
use crate::backfill::SnapshotOrder;
use crate::chunk::StreamChunk;
use crate::error::{EngineError, Error, Result, internal};
use crate::job::output::{self, FileRecord, FinishRecord, JobRecord, META_JOB_ID, Place};
use crate::job::shard::{Shard, ShardFilter};
use crate::job::sink::ParquetSink;
use crate::job::validation::{CheckpointDir, NewDirs, Validation, checkpoint_dir};
use crate::job::{
    BackfillJob, Certificate, Change, JobControl, JobOptions, JobProgress, LoadProgress,
    SealedLoad, TableDigest, TableLoader,
};
use crate::job::{checkpoint, remote};
use crate::replay::Dataset;
use crate::replay::SnapshotFeed;
use crate::replay::prefetch::Prefetch;
use crate::replay::storage;
use crate::store::durable::{self, DirLock};
use crate::store::io::{RealIo, StorageIo};
use crate::store::{DurableOptions, DurableStore, MemoryStore, StateStore};
use crate::table::{TableDesc, describe};
use crate::vnode::VnodeCount;

/// The epoch the snapshot is committed at.
const SNAPSHOT_EPOCH: u64 = 1;
/// Rows per Parquet read and store write while bulk loading the snapshot.
const LOAD_BATCH_ROWS: usize = 64 * 1024;
/// Snapshot rows per load step (a durable commit of the rows loaded so far, which a run
/// killed during the load resumes after), unless set ([`ReplayOptions::load_step_rows`]);
/// at least 256 rows a vnode, so each step gives every vnode full blocks and its base stays
/// a short chain. At lineitem scale 1 (6M rows), 12 steps; a step costs one run file and one
/// log record (the load's spilled pieces are committed as they are).
pub const LOAD_STEP_ROWS: u64 = 1 << 19;

/// A replay's rows per snapshot output batch and per change chunk, unless set
/// ([`ReplayOptions::batch_size`], `--batch-size`): 8192, as DataFusion's batches.
///
/// A replay is a bulk job, and much of its cost is per batch rather than per row: a merged
/// output batch gathers from about one source batch per input it draws on (128 an actor at
/// 256 vnodes), the sink feeds each batch to every column writer, the keys of each are
/// encoded. At scale 1 (lineitem, 2 cores) 8192 rows took 0.82x the wall time of 1024 in
/// merged order and 0.91x in vnode order, for 5-25% more peak memory (docs/benchmarks-history.md,
/// "Bigger replay batches and a leaner interleave"). The library's own default
/// ([`crate::BackfillConfig`]) stays at 1024, a streaming operator's chunk.
pub const DEFAULT_BATCH_SIZE: usize = 8192;
/// Batches a reader thread decodes ahead of the load and of the upstream source.
const READ_AHEAD: usize = 4;
/// Change chunks between the changelog source and the job: a few (the job's own channel to
/// its actors holds more; a deep queue here only held more rows in memory, 77 MB at 64
/// lineitem chunks of 8192 rows).
const CHANNEL_CAPACITY: usize = 2;

/// The state directory inside the output directory, by default.
pub const STATE_DIR: &str = "state";

const META_JOB: &str = "replay.job";
/// The version of the replay's state layout: its backfill runs as the library's job
/// [`JOB_NAME`] (2). A state without it was written by an older version.
const META_FORMAT: &str = "replay.format";
const STATE_FORMAT: &str = "2";
/// The outcome of the dataset's validation, once it passed (see the module docs).
const META_VALIDATED: &str = "replay.validated";
/// The last checkpoint of a validation beside the load (see the module docs).
const META_VALIDATION_CHECKPOINT: &str = "replay.validation_checkpoint";
/// The name the replay's backfill runs under in its state ([`BackfillJob`]).
const JOB_NAME: &str = "replay";
/// How often the replay reports its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// The output directory a state's job writes (resolved when the job began), for messages.
const META_OUT: &str = "replay.out";

/// How the validation of a run that resumed a load began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationStart {
    /// It had passed before the stop: its outcome was in the state.
    Recorded,
    /// At this snapshot row, from the checkpoint the load's last step committed.
    Resumed(u64),
    /// From the start (no checkpoint of it was committed, or its files were not as
    /// recorded).
    FromStart,
}

/// Where a replay keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChoice {
    /// The durable store in this directory: resumable.
    Durable(PathBuf),
    /// The in-memory store: fast, gone when the process ends.
    Memory,
}

/// Settings of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The output directory (`changes/` goes inside).
    pub out: PathBuf,
    /// Where the state lives.
    pub state: StateChoice,
    /// Discard the state and output of an earlier run instead of resuming it.
    pub fresh: bool,
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
    /// Settings of the durable store.
    pub durable: DurableOptions,
    /// The file I/O of the durable store and the sink (tests inject faults here).
    pub io: Arc<dyn StorageIo>,
    /// Backfill actors, at least 1; more than the vnode count are reduced to it (the default,
    /// the number of cores, may exceed a small vnode count).
    pub parallelism: usize,
    /// Where the dataset's validation spills its sorted runs (`--tmp`; default `TMPDIR`).
    pub scratch: PathBuf,
    /// Online rescales: at the first checkpoint at or after the barrier that closes dataset
    /// epoch `after_epoch`, move to `actors` actors.
    pub rescales: Vec<RescalePoint>,
    /// For an output on object storage (`out` a URL): the local directory of its state and
    /// of the files on their way (`None`: [`remote::default_cache`]).
    pub cache: Option<PathBuf>,
    /// For an output on object storage: where its checkpoints go (`None`:
    /// `URL/_backfill-state`, see `checkpoint.rs`).
    pub checkpoint_url: Option<PathBuf>,
    /// Where the opened durable store's image source is left for the upload of checkpoints
    /// (set by `run_replay_until` for an output on object storage).
    pub image_slot: Option<remote::ImageSlot>,
    /// Snapshot rows per durable load step (`None`: [`LOAD_STEP_ROWS`], or 256 a vnode if
    /// more).
    pub load_step_rows: Option<u64>,
    /// The shard this replay owns (`--shard I/N`, see `shard.rs`); `None`: every vnode. Set
    /// with [`ReplayOptions::with_shard`], which also moves the default state.
    pub shard: Option<Shard>,
}

/// An online rescale of a replay (`--rescale EPOCH:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RescalePoint {
    /// The dataset epoch after which to rescale.
    pub after_epoch: u64,
    /// The actors after the rescale.
    pub actors: usize,
}

impl std::str::FromStr for RescalePoint {
    type Err = Error;

    /// `EPOCH:N`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::config(format!("a rescale is EPOCH:ACTORS, not `{s}`"));
        let (epoch, actors) = s.split_once(':').ok_or_else(bad)?;
        Ok(Self {
            after_epoch: epoch.trim().parse().map_err(|_| bad())?,
            actors: actors.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// The default parallelism: the number of cores (1 if unknown).
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ReplayOptions {
    /// Defaults for `out`: durable state in `out/state`, 256 vnodes, batches of
    /// [`DEFAULT_BATCH_SIZE`], merged order, a checkpoint at every barrier, no limits.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        let out = out.into();
        Self {
            state: StateChoice::Durable(out.join(STATE_DIR)),
            out,
            fresh: false,
            vnodes: VnodeCount::DEFAULT,
            batch_size: DEFAULT_BATCH_SIZE,
            order: SnapshotOrder::Merged,
            checkpoint_every: 1,
            barrier_interval: None,
            rate_limit: None,
            upstream_rate: None,
            durable: DurableOptions::default(),
            io: RealIo::shared(),
            parallelism: default_parallelism(),
            rescales: Vec::new(),
            cache: None,
            checkpoint_url: None,
            image_slot: None,
            scratch: std::env::temp_dir(),
            load_step_rows: None,
            shard: None,
        }
    }

    /// The replay of `shard` only: its state, when it is the default one (`OUT/state`),
    /// becomes the shard's default (`OUT/state.shard-I-of-N`), so the N shards of one output
    /// keep their states apart.
    pub fn with_shard(mut self, shard: Option<Shard>) -> Self {
        if self.state == StateChoice::Durable(self.out.join(STATE_DIR)) {
            self.state = StateChoice::Durable(default_state_dir(&self.out, shard));
        }
        self.shard = shard;
        self
    }
}

/// The default state directory of the part `shard` of the output `out`: `OUT/state`, or
/// `OUT/state.shard-I-of-N` for a shard.
pub fn default_state_dir(out: &Path, shard: Option<Shard>) -> PathBuf {
    match shard {
        None => out.join(STATE_DIR),
        Some(shard) => out.join(format!("{STATE_DIR}.{}", shard.tag())),
    }
}

/// The backfill actors of a replay asked for `parallelism` actors: for a shard, as many for
/// each shard's range (`parallelism` x N, at most the vnode count), since the job spreads
/// its actors over every vnode and the other shards' vnodes hold nothing (their actors finish
/// at once): so about `parallelism` actors share the shard's rows.
pub fn actors_for(parallelism: usize, shard: Option<Shard>, vnodes: usize) -> usize {
    let per_range = shard.map_or(1, |s| s.count() as usize);
    parallelism.saturating_mul(per_range).min(vnodes).max(1)
}

/// A progress report, sent after every downstream message (and, during the snapshot load,
/// every [`PROGRESS_INTERVAL`]).
#[derive(Debug, Clone, Default)]
pub struct ReplayProgress {
    /// During the snapshot load: how far it is (then the other counters are zero).
    pub load: Option<LoadReport>,
    /// The backfill's counters, summed over its actors.
    pub backfill: BackfillStats,
    /// The job's progress: rows read of the estimated total, rate, ETA, per-actor rows.
    pub job: JobProgress,
    /// Changelog rows applied upstream so far (including before a resume).
    pub upstream_changes: u64,
    /// Rows published to the output by this run.
    pub output_rows: u64,
}

/// How far a snapshot load is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Snapshot rows in the table so far (a shard: its own rows), those of the steps a
    /// stopped run committed included.
    pub rows_loaded: u64,
    /// Of those, the rows the committed load steps hold (what a kill now would keep).
    pub rows_committed: u64,
    /// The snapshot's rows (by the files' footers); `None` for a shard, which loads a part.
    pub snapshot_rows: Option<u64>,
}

/// The counters a load keeps for its [`LoadReport`].
#[derive(Debug, Default)]
struct LoadCounters {
    loaded: std::sync::atomic::AtomicU64,
    committed: std::sync::atomic::AtomicU64,
}

impl LoadCounters {
    fn report(&self, snapshot_rows: Option<u64>) -> LoadReport {
        LoadReport {
            rows_loaded: self.loaded.load(Ordering::Relaxed),
            rows_committed: self.committed.load(Ordering::Relaxed),
            snapshot_rows,
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct ReplaySummary {
    /// Snapshot rows in the dataset.
    pub snapshot_rows: u64,
    /// Changelog rows applied upstream by this run.
    pub upstream_changes: u64,
    /// Downstream rows written by this run.
    pub output_rows: u64,
    /// Output files written by this run.
    pub output_files: u64,
    /// Barriers (epochs) this run went through.
    pub epochs: u64,
    /// Checkpoints this run committed.
    pub checkpoints: u64,
    /// Wall time from the start of the load to the last commit.
    pub elapsed: Duration,
    /// Time spent bulk loading the snapshot (zero when resumed).
    pub load_time: Duration,
    /// When this run resumed a snapshot load a killed run had begun: the snapshot rows its
    /// committed steps held (not loaded again).
    pub load_resumed_at: Option<u64>,
    /// How this run's validation began (`None`: it did not run, or ran before anything).
    pub validation_start: Option<ValidationStart>,
    /// The output directory.
    pub out: PathBuf,
    /// The committed epoch this run resumed from, if it resumed.
    pub resumed_from: Option<u64>,
    /// Changelog rows that were already applied when this run started.
    pub changes_already_applied: u64,
    /// The job had finished before this run: nothing was done.
    pub already_finished: bool,
    /// Vnodes of each actor at the end.
    pub actors: Vec<usize>,
    /// Online rescales this run went through.
    pub rescales: u64,
    /// The longest a rescale held the job (see [`JobProgress::rescale_pause_max`]).
    pub rescale_pause_max: Duration,
    /// The longest restart part of a rescale (see [`JobProgress::rescale_restart_max`]).
    pub rescale_restart_max: Duration,
    /// Per vnode, the committed output against the upstream table at the final checkpoint
    /// (count and checksum); `None` when the run did not reach it.
    pub certificate: Option<Certificate>,
    /// The dataset's last epoch (0 without changes): the epoch the finished output is
    /// complete up to, in the dataset's numbering (the certificate's epoch).
    pub last_epoch: u64,
    /// The internal barrier epoch of the final checkpoint, when this run reached it.
    pub final_checkpoint: Option<u64>,
    /// For a job that had finished before this run: what its output's job record says of
    /// its end (the dataset epoch and the certificate).
    pub finish_record: Option<FinishRecord>,
    /// Per checkpoint this run committed, seconds from its barrier to its output file's
    /// publication in the (local) output: the commit's latency.
    pub commit_latencies: Vec<f64>,
    /// For an output on object storage: the output files this run published.
    pub uploaded_files: Option<u64>,
    /// For an output on object storage: what this run's checkpoint uploads did.
    pub uploads: Option<crate::job::checkpoint::Uploads>,
    /// For an output on object storage: the checkpoint this run restored its cache from
    /// (the cache held no state, or an older one than the bucket's).
    pub restored: Option<crate::job::checkpoint::Restored>,
    /// The shard this replay owned, with its vnodes (`None`: every vnode).
    pub shard: Option<(Shard, std::ops::Range<usize>)>,
}

/// Why a replay stopped early at the user's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[expect(
    clippy::enum_variant_names,
    reason = "named after the signals: SIGINT is an interrupt"
)]
pub enum Interrupt {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGHUP (the terminal went away).
    Hangup,
}

impl Interrupt {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Interrupt => "SIGINT",
            Interrupt::Terminate => "SIGTERM",
            Interrupt::Hangup => "SIGHUP",
        }
    }

    /// The conventional exit status: 128 + the signal number.
    pub fn exit_code(self) -> u8 {
        match self {
            Interrupt::Interrupt => 130,
            Interrupt::Terminate => 143,
            Interrupt::Hangup => 129,
        }
    }
}

/// Replays `dataset` (see the module docs): validates it (nothing is written on bad input;
/// into new directories the validation runs beside the snapshot load, whose commit waits
/// for it, see `validation.rs`), then loads the snapshot or resumes from the last
/// checkpoint, backfills while the changelog is applied, writes the output. `on_progress` is called with fresh counters as
/// the job goes.
#[cfg(test)]
pub async fn run_replay(
    dataset: &Dataset,
    options: &ReplayOptions,
    on_progress: impl FnMut(&ReplayProgress),
) -> Result<ReplaySummary> {
    run_replay_until(dataset, options, on_progress, std::future::pending()).await
}

/// [`run_replay`], stopped cleanly when `interrupted` completes: during the load, the load
/// stops between batches (its committed steps stay: the next run resumes after them); during the backfill, the job ends at its next
/// checkpoint (`JobControl::stop`; nothing half-written is left in the output); and the
/// result is an [`Error::Interrupted`] naming the epoch to resume from.
pub async fn run_replay_until(
    dataset: &Dataset,
    options: &ReplayOptions,
    on_progress: impl FnMut(&ReplayProgress),
    interrupted: impl Future<Output = Interrupt>,
) -> Result<ReplaySummary> {
    if !storage::is_url(&options.out) {
        if let Some(url) = &options.checkpoint_url {
            return Err(Error::config(format!(
                "--checkpoint-url {}: checkpoints go to object storage only with the output \
                 (--out s3://...): a local output cannot be restored elsewhere",
                url.display()
            )));
        }
        return run_replay_local(dataset, options, on_progress, interrupted).await;
    }
    // An output on object storage (`remote.rs`, `checkpoint.rs`): the replay runs into the
    // local cache while a thread uploads its checkpoints and publishes their output; once
    // more at the end, whatever the end.
    let url = options.out.clone();
    let cache =
        (options.cache.clone()).unwrap_or_else(|| remote::default_cache(&url, options.shard));
    let mut local = options.clone();
    local.out = cache.clone();
    let state = match &options.state {
        StateChoice::Durable(dir)
            if *dir == url.join(STATE_DIR) || *dir == default_state_dir(&url, options.shard) =>
        {
            cache.join(STATE_DIR)
        }
        StateChoice::Durable(dir) if storage::is_url(dir) => {
            return Err(Error::config(format!(
                "--state {}: the state is a local directory (its checkpoints go to object \
                 storage with the output)",
                dir.display()
            )));
        }
        StateChoice::Durable(dir) => dir.clone(),
        StateChoice::Memory => {
            return Err(Error::config(
                "--state memory: an output on object storage is published from its \
                 checkpoints, which need a durable state"
                    .into(),
            ));
        }
    };
    local.state = StateChoice::Durable(state.clone());
    if let Some(shard) = options.shard {
        shard.range(options.vnodes)?;
    }
    let root = match &options.checkpoint_url {
        // Each shard's checkpoints in a folder of their own.
        Some(root) if storage::is_url(root) => match options.shard {
            None => root.clone(),
            Some(shard) => root.join(shard.tag()),
        },
        Some(root) => {
            return Err(Error::config(format!(
                "--checkpoint-url {}: not an object storage URL (s3://, gs://, az://)",
                root.display()
            )));
        }
        None => checkpoint::default_root(&url, options.shard),
    };
    crate::job::output::check_layout(&url, options.shard)?;
    let (checkpoints, restored) = tokio::task::block_in_place(|| {
        checkpoint::Checkpoints::prepare(&url, &root, &cache, &state, options.shard, options.fresh)
    })?;
    let slot = remote::ImageSlot::default();
    local.image_slot = Some(slot.clone());
    let syncing = remote::RemoteOut::claim(&url, &cache, options.shard, checkpoints, slot)?.start();
    let failed = syncing.failed();
    let upload_failed = failed.clone();
    let stop = async move {
        let mut interrupted = std::pin::pin!(interrupted);
        loop {
            tokio::select! {
                signal = interrupted.as_mut() => return signal,
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if failed.load(std::sync::atomic::Ordering::Relaxed) {
                        // The upload failed (another worker took the output over, the
                        // bucket refused): stop at the next checkpoint; its error is told.
                        return Interrupt::Terminate;
                    }
                }
            }
        }
    };
    let result = run_replay_local(dataset, &local, on_progress, stop).await;
    let uploads = tokio::task::spawn_blocking(move || syncing.finish())
        .await
        .map_err(|e| internal!("the upload's last round failed: {e}"))?;
    // A round that failed during the run stopped it: its error first. Otherwise the run's
    // own error, then the last round's.
    let (mut summary, uploads) = match (result, uploads) {
        (_, Err(e)) if upload_failed.load(std::sync::atomic::Ordering::Relaxed) => return Err(e),
        (Err(e), _) | (Ok(_), Err(e)) => return Err(e),
        (Ok(summary), Ok(uploads)) => (summary, uploads),
    };
    summary.uploaded_files = Some(uploads.published);
    summary.uploads = Some(uploads);
    summary.restored = restored;
    summary.out = url;
    Ok(summary)
}

/// [`run_replay_until`] into a local output directory.
async fn run_replay_local(
    dataset: &Dataset,
    options: &ReplayOptions,
    on_progress: impl FnMut(&ReplayProgress),
    interrupted: impl Future<Output = Interrupt>,
) -> Result<ReplaySummary> {
    if !(1..=crate::backfill::MAX_BATCH_SIZE).contains(&options.batch_size) {
        return Err(Error::config(format!(
            "batch size must be between 1 and {}",
            crate::backfill::MAX_BATCH_SIZE
        )));
    }
    if options.upstream_rate == Some(0) || options.rate_limit == Some(0) {
        return Err(Error::config(
            "a rate of 0 rows/s would never finish; leave the option out for no limit".into(),
        ));
    }
    if options.checkpoint_every == 0 {
        return Err(Error::config("checkpoint-every must be at least 1".into()));
    }
    let vnodes = options.vnodes.get();
    if let Some(shard) = options.shard {
        shard.range(options.vnodes)?;
    }
    // The initial parallelism is capped at the vnode count (one actor per vnode at most); a
    // rescale names its actors exactly, so it must fit.
    let actors = std::iter::once((options.parallelism, true))
        .chain(options.rescales.iter().map(|r| (r.actors, false)));
    for (actors, initial) in actors {
        if actors == 0 || (actors > vnodes && !initial) {
            return Err(Error::config(format!(
                "{actors} backfill actors for {vnodes} vnodes: choose 1 to {vnodes}"
            )));
        }
    }
    let state_dir = match &options.state {
        StateChoice::Memory => None,
        StateChoice::Durable(dir) => Some(dir.as_path()),
    };
    output::check_places(dataset.dir(), &options.out, state_dir)?;
    // Before anything is read or written: one layout (unsharded, or N shards) per output.
    output::check_layout(&options.out, options.shard)?;
    // New directories have nothing to lose: validate beside the load (see `validation.rs`).
    let new_dirs = match &options.state {
        StateChoice::Memory => NewDirs::of(&[&options.out]),
        StateChoice::Durable(dir) => NewDirs::of(&[&options.out, dir]),
    };
    let desc = Arc::new(dataset.table_desc(options.vnodes)?);
    let mut interrupted = std::pin::pin!(interrupted);
    // (Before the validation, which may make `STATE/validation`.)
    let state_is_new = match &options.state {
        StateChoice::Durable(dir) => !options.io.exists(dir)?,
        StateChoice::Memory => false,
    };
    let found = match (&new_dirs, &options.state) {
        (None, StateChoice::Durable(dir)) if !options.fresh => {
            peek_state(dataset, &desc, options.shard, options.io.as_ref(), dir)
        }
        _ => Found::default(),
    };
    // A validation beside the load of a durable state keeps checkpoints, and resumes the
    // one a stopped load's last step committed (see `validation.rs`).
    let checkpoints = |resume: Option<String>| match &options.state {
        StateChoice::Durable(dir) => Some(CheckpointDir {
            dir: checkpoint_dir(dir),
            resume,
            every_rows: load_step_rows(options, &desc),
        }),
        StateChoice::Memory => None,
    };
    let mut validation = match (new_dirs.as_ref(), found) {
        (
            _,
            Found {
                validated: Some(recorded),
                ..
            },
        ) => recorded,
        (Some(_), _) => Validation::beside(
            dataset,
            desc.clone(),
            options.scratch.clone(),
            checkpoints(None),
            Some(0),
        )?,
        // A load of this job under way has nothing to lose either: the table is never
        // backfilled before the validation passed (the load's final commit waits for it).
        (
            None,
            Found {
                load_under_way: true,
                checkpoint,
                load_rows,
                ..
            },
        ) => Validation::beside(
            dataset,
            desc.clone(),
            options.scratch.clone(),
            checkpoints(checkpoint),
            // A shard's load counts its own rows: it reads the snapshot itself.
            load_rows.filter(|_| options.shard.is_none()),
        )?,
        (None, _) => {
            // Existing directories have something to lose: nothing is touched before the
            // dataset is known good. A signal meanwhile stops the run at once.
            let mut validation =
                Validation::first_in_background(dataset, desc, options.scratch.clone())?;
            if let Some(signal) = validation_done(&validation, interrupted.as_mut()).await {
                return Err(Error::Interrupted {
                    signal: signal.name(),
                    code: signal.exit_code(),
                    committed: None,
                });
            }
            validation.finish()?;
            validation
        }
    };
    let result = run_validated(
        dataset,
        options,
        state_is_new,
        &mut validation,
        on_progress,
        interrupted,
    )
    .await;
    if result.is_err()
        && validation.failed()
        && let Some(new_dirs) = new_dirs
    {
        new_dirs.remove();
    }
    result
}

/// What the state of this very job (its job identity, every input file's size, time and
/// footer checksum, the one this run computes) holds that decides how the dataset is
/// validated, read without opening the store. Nothing for no state, another job's, or an
/// unreadable one: then the dataset is validated first, and the open decides the rest.
#[derive(Default)]
struct Found {
    /// The validation it recorded as passed.
    validated: Option<Validation>,
    /// A snapshot load under way (steps committed, not complete).
    load_under_way: bool,
    /// The last checkpoint of the validation beside that load.
    checkpoint: Option<String>,
    /// The snapshot rows that load's steps hold.
    load_rows: Option<u64>,
}

fn peek_state(
    dataset: &Dataset,
    desc: &TableDesc,
    shard: Option<Shard>,
    io: &dyn StorageIo,
    dir: &Path,
) -> Found {
    let peek = || -> Option<Found> {
        let meta = durable::committed_meta(io, dir).ok()??;
        let recorded: JobIdentity = serde_json::from_str(meta.get(META_JOB)?).ok()?;
        if recorded != JobIdentity::of(dataset, desc, shard).ok()? {
            return None;
        }
        let load: Option<LoadProgress> = (meta
            .get(&arrangement_backfill::job::load_key(desc.name())))
        .and_then(|v| serde_json::from_str(v).ok());
        Some(Found {
            validated: meta
                .get(META_VALIDATED)
                .and_then(|v| Validation::recorded(v)),
            load_under_way: load.is_some_and(|l| !l.complete),
            checkpoint: meta.get(META_VALIDATION_CHECKPOINT).cloned(),
            load_rows: load.filter(|l| !l.complete).map(|l| l.rows),
        })
    };
    peek().unwrap_or_default()
}

/// [`run_replay_until`] once the options are checked and the validation started: the store
/// opened, the job run.
async fn run_validated(
    dataset: &Dataset,
    options: &ReplayOptions,
    state_is_new: bool,
    validation: &mut Validation,
    on_progress: impl FnMut(&ReplayProgress),
    interrupted: impl Future<Output = Interrupt>,
) -> Result<ReplaySummary> {
    let desc = dataset.table_desc(options.vnodes)?;
    let io = options.io.clone();
    io.create_dir_all(&options.out)?;
    let _out_lock = DirLock::acquire_file(&options.out.join(output::lock_file(options.shard)))?;
    match &options.state {
        StateChoice::Memory => {
            let job = Job::new(MemoryStore::new(), dataset, options, desc)?;
            job.run(validation, on_progress, interrupted).await
        }
        StateChoice::Durable(dir) => {
            if state_is_new {
                // A new state: refuse another job's output before creating it.
                check_claim(
                    options,
                    JobRecord::read(io.as_ref(), &options.out, options.shard)?.as_ref(),
                )?;
            }
            if options.fresh {
                durable::destroy(io.as_ref(), dir)?;
            }
            let mut store = DurableStore::open_with(dir, io.clone(), options.durable.clone())?;
            if store.committed_epoch()?.is_none()
                && LoadProgress::of(&store, desc.name())?.is_none()
            {
                // Nothing was ever committed (a run that died before its first load step):
                // start clean.
                drop(store);
                durable::destroy(io.as_ref(), dir)?;
                store = DurableStore::open_with(dir, io.clone(), options.durable.clone())?;
            }
            if store.meta(META_VALIDATED)?.is_some() {
                // Left by a run stopped right after the load's commit.
                remove_checkpoints(dir);
            }
            if let Some(slot) = &options.image_slot {
                let mut slot =
                    (slot.lock()).map_err(|_| internal!("the store's image slot is poisoned"))?;
                *slot = Some(store.image_source());
            }
            let job = Job::new(store, dataset, options, desc)?;
            job.run(validation, on_progress, interrupted).await
        }
    }
}

/// Waits until `validation` has ended, or returns the signal that came first.
async fn validation_done(
    validation: &Validation,
    mut interrupted: std::pin::Pin<&mut impl Future<Output = Interrupt>>,
) -> Option<Interrupt> {
    while validation.is_running() {
        tokio::select! {
            biased;
            signal = interrupted.as_mut() => return Some(signal),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    None
}

/// Whether a new job may take the output directory: not when it holds the output files
/// of another job that could still be resumed or is complete (unless `--fresh`). The
/// record naming this job is written once the earlier output is gone
/// (`Job::write_claim`): a stop in between leaves the earlier record, so the next run
/// decides as this one did.
fn check_claim(options: &ReplayOptions, existing: Option<&JobRecord>) -> Result<()> {
    let io = options.io.as_ref();
    let out = &options.out;
    let names = output::output_names(io, out, options.shard)?;
    if !options.fresh && !names.is_empty() {
        let message = match existing {
            // An in-memory job's output can never be resumed: the next run redoes it.
            Some(r) if r.state.is_none() => None,
            Some(r) => Some(format!(
                "holds the output of {}, which this run would delete: resume that job \
                 with its state (if the state still holds it), use --fresh to discard the \
                 output, or choose another --out",
                r.state_shown()
            )),
            None => Some(format!(
                "holds output files (changes/{}) of no job this version of backfill knows, \
                 which this run would delete: use --fresh to discard them, or choose another \
                 --out",
                output::part_file_name(0, options.shard).replace("00000000000000000000", "*")
            )),
        };
        if let Some(message) = message {
            return Err(Error::StateConflict {
                path: out.clone(),
                message,
            });
        }
    }
    Ok(())
}

/// The identity of a replay job, recorded in the state so that a state directory is never
/// used for another job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct JobIdentity {
    dataset: String,
    columns: String,
    primary_key: Vec<String>,
    distribution_key: Vec<String>,
    vnodes: usize,
    snapshot_files: Vec<InputFile>,
    change_files: Vec<InputFile>,
    /// The shard the state holds (`I/N`); `None` (and absent in a state of an older version):
    /// every vnode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<String>,
}

/// What identifies an input file's content, cheaply: its name, size and modification time,
/// and a checksum of its Parquet footer (the schema, the row groups' offsets, sizes, row
/// counts and statistics). A file rewritten in place, even to the same size, changes its
/// modification time; one whose time was set back still has to keep every footer byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct InputFile {
    name: String,
    size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    modified_ns: i128,
    /// CRC-32 of the footer (its metadata and the 8 bytes after it).
    footer_crc: u32,
}

impl InputFile {
    fn of(path: &Path) -> Result<Self> {
        use parquet::file::reader::{ChunkReader, Length};
        let file = storage::open(path)?;
        let size = file.len();
        let bad = |what: &str| Error::dataset(path, "", format!("not a Parquet file: {what}"));
        let read = |start: u64, len: usize| {
            file.get_bytes(start, len)
                .map_err(|e| Error::dataset(path, "", format!("cannot read: {e}")))
        };
        if size < 12 {
            return Err(bad("shorter than a footer"));
        }
        let tail = read(size - 8, 8)?;
        let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        if &tail[4..] != b"PAR1" || footer_len + 8 > size {
            return Err(bad("no footer"));
        }
        let footer = read(size - footer_len - 8, footer_len as usize + 8)?;
        Ok(Self {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size,
            modified_ns: file
                .modified_ns()
                .map_err(|e| crate::store::io::named(path, e))?,
            footer_crc: crc32fast::hash(&footer),
        })
    }

    /// How `self` (the state's) and `now` differ, for a message.
    fn difference(&self, now: &Self) -> Option<String> {
        let what = if self.name != now.name {
            format!("{} became {}", self.name, now.name)
        } else if self.size != now.size {
            format!("{}: {} bytes, now {}", self.name, self.size, now.size)
        } else if self.footer_crc != now.footer_crc {
            format!("{}: its Parquet footer changed", self.name)
        } else if self.modified_ns != now.modified_ns {
            format!("{}: modified since (same size and footer)", self.name)
        } else {
            return None;
        };
        Some(what)
    }
}

impl JobIdentity {
    fn of(dataset: &Dataset, desc: &TableDesc, shard: Option<Shard>) -> Result<Self> {
        let files = |paths: &[PathBuf]| -> Result<Vec<InputFile>> {
            paths.iter().map(|p| InputFile::of(p)).collect()
        };
        let m = dataset.manifest();
        Ok(Self {
            dataset: dataset.name().to_string(),
            columns: describe(desc.schema()),
            primary_key: desc
                .pk()
                .columns()
                .iter()
                .map(|c| {
                    let dir = if c.descending { " desc" } else { "" };
                    format!("{}{dir}", c.name)
                })
                .collect(),
            distribution_key: m.distribution_key().to_vec(),
            vnodes: desc.vnode_count().get(),
            snapshot_files: files(dataset.snapshot_files())?,
            change_files: files(dataset.change_files())?,
            shard: shard.map(|s| s.to_string()),
        })
    }

    /// What differs from `other`, for the error message.
    fn differences(&self, other: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |what: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{what}: the state has {a}, this run {b}"));
            }
        };
        check("dataset", self.dataset.clone(), other.dataset.clone());
        check("columns", self.columns.clone(), other.columns.clone());
        check(
            "primary key",
            format!("{:?}", self.primary_key),
            format!("{:?}", other.primary_key),
        );
        check(
            "distribution key",
            format!("{:?}", self.distribution_key),
            format!("{:?}", other.distribution_key),
        );
        check(
            "vnode count",
            self.vnodes.to_string(),
            other.vnodes.to_string(),
        );
        let shard = |s: &Option<String>| match s {
            Some(s) => format!("shard {s}"),
            None => "every vnode (no shard)".to_string(),
        };
        check("shard", shard(&self.shard), shard(&other.shard));
        for (what, mine, theirs) in [
            (
                "snapshot files",
                &self.snapshot_files,
                &other.snapshot_files,
            ),
            ("change files", &self.change_files, &other.change_files),
        ] {
            if mine.len() != theirs.len() {
                out.push(format!(
                    "{what}: the state has {}, this run {}",
                    mine.len(),
                    theirs.len()
                ));
                continue;
            }
            let changed: Vec<String> = (mine.iter().zip(theirs))
                .filter_map(|(a, b)| a.difference(b))
                .collect();
            if !changed.is_empty() {
                out.push(format!("{what} changed: {}", changed.join(", ")));
            }
        }
        out
    }
}

/// One replay on a store.
struct Job<'a, S: StateStore> {
    store: S,
    dataset: &'a Dataset,
    options: &'a ReplayOptions,
    desc: TableDesc,
    /// Snapshot rows in the dataset, known once its validation is done.
    snapshot_rows: u64,
    identity: JobIdentity,
    /// The digest of the table the dataset ends with, from its validation: the completion
    /// certificate's upstream side.
    expected: Option<TableDigest>,
    /// The dataset's last epoch (0 without changes), known once its validation is done: the
    /// epoch every report of the finished output names.
    last_epoch: u64,
    /// The job's id, in its state and in its output's job record.
    job_id: String,
}

impl<'a, S: StateStore> Job<'a, S> {
    fn new(
        store: S,
        dataset: &'a Dataset,
        options: &'a ReplayOptions,
        desc: TableDesc,
    ) -> Result<Self> {
        let identity = JobIdentity::of(dataset, &desc, options.shard)?;
        Ok(Self {
            store,
            dataset,
            options,
            desc,
            snapshot_rows: 0,
            identity,
            expected: None,
            last_epoch: 0,
            job_id: String::new(),
        })
    }

    /// Bulk loads the snapshot into the upstream table and seals it at the snapshot epoch
    /// (the caller commits it, once the validation passed). The batches come from `feed` (the
    /// ones a validation beside the load decodes) or are read here. Every `step.rows` rows
    /// the rows loaded so far are committed (a load step, with the validation's outcome once
    /// it is in `step.validated`); `step.resume` resumes the load a killed run left, after
    /// the rows its steps committed.
    ///
    /// Stops between batches once `stop` is set (with [`Error::Internal`]; the caller
    /// reports the interruption). Runs on a blocking thread of its own, so the job can
    /// watch for signals meanwhile.
    fn load(
        store: S,
        desc: TableDesc,
        dataset: Dataset,
        feed: Option<(SnapshotFeed, u64)>,
        filter: Option<ShardFilter>,
        stop: Arc<AtomicBool>,
        step: LoadSteps,
    ) -> Result<SealedLoad<S>> {
        let (mut loader, mut skip) = match step.resume {
            Some(_) => {
                let (loader, progress) = TableLoader::resume(&store, desc.name())?;
                (loader, progress.rows)
            }
            None => (TableLoader::create(&store, desc)?, 0),
        };
        // Decoding on a reader thread overlaps with the load's hashing, sorting and writing.
        let batches: Box<dyn Iterator<Item = Result<arrow_array::RecordBatch>>> = match feed {
            Some((feed, from)) => {
                // The feed begins at snapshot row `from`, at or before the rows to load.
                skip = skip.checked_sub(from).ok_or_else(|| {
                    internal!("a snapshot feed from row {from} for a load that holds {skip}")
                })?;
                Box::new(feed.map(|item| item.map(|(_, batch)| batch)))
            }
            None => {
                let rows = usize::try_from(step.rows).unwrap_or(usize::MAX);
                // The reader skips the dataset rows a resumed load holds; a shard's load
                // holds its own rows only, counted after its filter below.
                let from = if filter.is_some() { 0 } else { skip };
                let batches = dataset.read_snapshot_from(LOAD_BATCH_ROWS.min(rows), from);
                skip -= from;
                Box::new(Prefetch::new("backfill-load", READ_AHEAD, batches)?)
            }
        };
        let mut validated = false;
        // A shard loads only its vnodes' rows.
        let batches = batches.map(|batch| match &filter {
            Some(filter) => batch.and_then(|b| filter.batch(b)),
            None => batch,
        });
        for batch in batches {
            if stop.load(Ordering::Relaxed) {
                return Err(internal!("the snapshot load was stopped"));
            }
            let mut batch = batch?;
            // Rows a resumed load holds already (when they come from a feed, or for a shard).
            if skip > 0 {
                let n = (batch.num_rows() as u64).min(skip);
                batch = batch.slice(n as usize, batch.num_rows() - n as usize);
                skip -= n;
            }
            if batch.num_rows() == 0 {
                continue;
            }
            loader.write(batch)?;
            if loader.rows() - loader.committed().rows >= step.rows {
                if !validated && let Some(outcome) = step.validated.get() {
                    store.stage_meta(META_VALIDATED, outcome)?;
                    validated = true;
                }
                if !validated
                    && let Some(checkpoint) = Validation::take_checkpoint(&step.checkpoint)
                {
                    store.stage_meta(META_VALIDATION_CHECKPOINT, &checkpoint)?;
                }
                loader.commit_step()?;
                (step.counters.committed).store(loader.committed().rows, Ordering::Relaxed);
            }
            step.counters.loaded.store(loader.rows(), Ordering::Relaxed);
        }
        Ok(loader.seal()?)
    }

    fn state_dir(&self) -> PathBuf {
        match &self.options.state {
            StateChoice::Durable(dir) => dir.clone(),
            StateChoice::Memory => PathBuf::from("(memory)"),
        }
    }

    /// The committed job record: `(committed epoch, changes applied, finished)`, or `None`
    /// for a new job. A record of another job is an error.
    fn committed_record(&self) -> Result<Option<(u64, u64, bool)>> {
        let Some(epoch) = self.store.committed_epoch()? else {
            return Ok(None);
        };
        self.check_identity()?;
        let resume = BackfillJob::resume_point_in(&self.store, JOB_NAME, self.desc.name())?;
        Ok(Some((epoch, resume.changes, resume.ended)))
    }

    /// The snapshot load a killed run left half done, if any: what its committed steps hold
    /// (the state's record checked as a resumed job's is).
    fn load_to_resume(&self) -> Result<Option<LoadProgress>> {
        match LoadProgress::of(&self.store, self.desc.name())? {
            Some(progress) if !progress.complete => {
                self.check_identity()?;
                Ok(Some(progress))
            }
            _ => Ok(None),
        }
    }

    /// Checks that the state's record names this job (its identity and layout version).
    fn check_identity(&self) -> Result<()> {
        let conflict = |message: String| Error::StateConflict {
            path: self.state_dir(),
            message,
        };
        let recorded = self.store.meta(META_JOB)?.ok_or_else(|| {
            conflict("holds state that no replay recorded; use --fresh to discard it".into())
        })?;
        let recorded: JobIdentity = serde_json::from_str(&recorded).map_err(|e| {
            conflict(format!(
                "unreadable job record ({e}); use --fresh to discard it"
            ))
        })?;
        let differences = recorded.differences(&self.identity);
        if !differences.is_empty() {
            return Err(conflict(format!(
                "was made for another replay ({}); use --fresh to discard it or --state to \
                 choose another directory",
                differences.join("; ")
            )));
        }
        if self.store.meta(META_FORMAT)?.as_deref() != Some(STATE_FORMAT) {
            return Err(conflict(
                "was written by an older version of backfill, whose backfill state this one \
                 does not read; use --fresh to start over"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The state's job id, which must be the one `out_record` (the output's) names: a state
    /// resumes only into its own output.
    fn check_tie(&mut self, out_record: Option<&JobRecord>) -> Result<()> {
        let conflict = |message: String| Error::StateConflict {
            path: self.state_dir(),
            message,
        };
        let Some(id) = self.store.meta(META_JOB_ID)? else {
            return Err(conflict(
                "was written by an older version of backfill, which did not tie a state to its \
                 output; use --fresh to start over"
                    .into(),
            ));
        };
        let written_to = self
            .store
            .meta(META_OUT)?
            .unwrap_or_else(|| "another directory".into());
        let out = self.options.out.display();
        match out_record {
            Some(r) if r.job == id => {
                self.job_id = id;
                Ok(())
            }
            Some(r) => Err(conflict(format!(
                "belongs to job {id}, whose output was written to {written_to}, but {out} now \
                 holds the output of {} (an output is replaced only together with its state); \
                 use --fresh to discard both and start over, or give this output its own --state",
                r.state_shown()
            ))),
            None => Err(conflict(format!(
                "belongs to job {id}, whose output was written to {written_to}, and {out} holds \
                 no output of it: resuming would write only the rest of that job's output here; \
                 use another --state for this output, or --fresh to discard that state"
            ))),
        }
    }

    /// The output files the state recorded at their checkpoints' commits, by epoch.
    fn recorded_files(&self) -> Result<BTreeMap<u64, FileRecord>> {
        let mut files = BTreeMap::new();
        for (epoch, value) in
            BackfillJob::committed_records(&self.store, JOB_NAME, self.desc.name())?
        {
            let Some(record) = FileRecord::decode(&value) else {
                return Err(Error::Engine(EngineError::CorruptState {
                    context: self.state_dir().display().to_string(),
                    message: format!(
                        "unreadable output file record of checkpoint {epoch}: `{value}`"
                    ),
                }));
            };
            files.insert(epoch, record);
        }
        Ok(files)
    }

    /// Names this new job in the output's record, before it writes any output file (and
    /// after the earlier output was removed).
    fn write_claim(&self) -> Result<()> {
        self.write_record(None)
    }

    /// Writes the output's job record naming this job (and how it ended, once it has).
    fn write_record(&self, finished: Option<FinishRecord>) -> Result<()> {
        let record = JobRecord {
            job: self.job_id.clone(),
            state: match &self.options.state {
                StateChoice::Durable(dir) => Some(Place::of(dir)?.path),
                StateChoice::Memory => None,
            },
            finished,
        };
        record.write(
            self.options.io.as_ref(),
            &self.options.out,
            self.options.shard,
        )
    }

    /// The filter of the replay's shard (`None`: every vnode).
    fn shard_filter(&self) -> Result<Option<ShardFilter>> {
        (self.options.shard)
            .map(|shard| ShardFilter::new(shard, self.desc.clone()))
            .transpose()
    }

    /// The end of a job that finished before this run, from its output's job record (its
    /// committed files already checked): a recorded certificate mismatch is an error again;
    /// a record that lacks the end (a stop right after the final commit) gets it now, the
    /// certificate computed from the files.
    fn finished_record(&self, out_record: Option<JobRecord>) -> Result<FinishRecord> {
        let mut record =
            out_record.ok_or_else(|| internal!("a finished job without its record"))?;
        let finish = match record.finished.clone() {
            Some(finish) => finish,
            None => {
                let c = crate::job::certificate::certify_locked_part(
                    self.dataset,
                    &self.options.out,
                    self.options.shard,
                    self.options.vnodes,
                )?;
                let finish = FinishRecord::of(&c);
                record.finished = Some(finish.clone());
                record.write(
                    self.options.io.as_ref(),
                    &self.options.out,
                    self.options.shard,
                )?;
                finish
            }
        };
        if !finish.certificate_matches {
            return Err(Error::CertificateMismatch {
                out: self.options.out.clone(),
                message: finish.certificate,
            });
        }
        Ok(finish)
    }

    /// Waits for `task` (a blocking part of the job that stops once `stop` is set), or, on
    /// a signal first, sets `stop`, waits for the task to let go of the store, and returns
    /// the interruption.
    async fn until_interrupted<T: Send + 'static>(
        &self,
        interrupted: &mut std::pin::Pin<&mut impl Future<Output = Interrupt>>,
        stop: &AtomicBool,
        mut task: tokio::task::JoinHandle<T>,
    ) -> Result<T> {
        tokio::select! {
            biased;
            signal = interrupted.as_mut() => {
                stop.store(true, Ordering::Relaxed);
                let _ = (&mut task).await;
                Err(self.interruption(signal))
            }
            done = &mut task => done.map_err(|e| internal!("a blocking part of the job failed: {e}")),
        }
    }

    /// The error of a stop by `signal`, naming the committed epoch.
    fn interruption(&self, signal: Interrupt) -> Error {
        Error::Interrupted {
            signal: signal.name(),
            code: signal.exit_code(),
            committed: self.store.committed_epoch().ok().flatten(),
        }
    }

    async fn run(
        mut self,
        validation: &mut Validation,
        mut on_progress: impl FnMut(&ReplayProgress),
        interrupted: impl Future<Output = Interrupt>,
    ) -> Result<ReplaySummary> {
        let started = Instant::now();
        let mut interrupted = std::pin::pin!(interrupted);
        let io = self.options.io.clone();
        let record = self.committed_record()?;
        let resumed_load = match record {
            Some(_) => None,
            None => self.load_to_resume()?,
        };
        let out_record = JobRecord::read(io.as_ref(), &self.options.out, self.options.shard)?;
        match record {
            None if resumed_load.is_some() => {
                // A load a killed run began: its output holds this job's record and no
                // file. Its validation goes on beside the load (resumed from the checkpoint
                // the load's last step committed), which nothing is backfilled before.
                self.check_tie(out_record.as_ref())?;
            }
            Some((epoch, _, _)) => {
                // A job resumes only on a dataset validated first (the directories existed).
                let dataset = validation.finish()?;
                self.snapshot_rows = dataset.snapshot_rows;
                self.last_epoch = dataset.last_epoch.unwrap_or(0);
                self.expected = validation.expected_digest().cloned();
                self.check_tie(out_record.as_ref())?;
                let recorded = self.recorded_files()?;
                output::check_committed_files(
                    io.as_ref(),
                    &self.options.out,
                    self.options.shard,
                    &self.state_dir(),
                    epoch,
                    &recorded,
                )?;
            }
            None => {
                check_claim(self.options, out_record.as_ref())?;
                self.job_id = output::new_job_id();
            }
        }
        let store = &self.store;
        let name = self.desc.name().to_string();
        let key: Vec<&str> = (self.desc.pk().columns().iter())
            .map(|c| c.name.as_str())
            .collect();
        let mut summary = ReplaySummary {
            snapshot_rows: self.snapshot_rows,
            upstream_changes: 0,
            output_rows: 0,
            output_files: 0,
            epochs: 0,
            checkpoints: 0,
            elapsed: Duration::ZERO,
            load_time: Duration::ZERO,
            load_resumed_at: resumed_load.map(|p| p.rows),
            validation_start: None,
            out: self.options.out.clone(),
            resumed_from: record.map(|(epoch, _, _)| epoch),
            changes_already_applied: record.map_or(0, |(_, applied, _)| applied),
            already_finished: record.is_some_and(|(_, _, finished)| finished),
            last_epoch: self.last_epoch,
            finish_record: None,
            uploaded_files: None,
            commit_latencies: Vec::new(),
            uploads: None,
            restored: None,
            shard: match self.options.shard {
                Some(shard) => Some((shard, shard.range(self.options.vnodes)?)),
                None => None,
            },
            final_checkpoint: None,
            actors: Vec::new(),
            rescales: 0,
            rescale_pause_max: Duration::ZERO,
            rescale_restart_max: Duration::ZERO,
            certificate: None,
        };
        if summary.already_finished {
            summary.finish_record = Some(self.finished_record(out_record)?);
            summary.elapsed = started.elapsed();
            return Ok(summary);
        }
        let checkpoint = match record {
            Some(_) => BackfillJob::resume_point_in(store, JOB_NAME, &name)?.checkpoint,
            None => None,
        };
        let mut sink = ParquetSink::open_part(
            self.options.io.clone(),
            &self.options.out,
            self.desc.schema(),
            checkpoint,
            self.options.shard,
        )?
        .with_key_statistics(&key)?;
        if record.is_none() {
            // The earlier output is gone (the sink removed it): the output is this job's.
            self.write_claim()?;
            // A new job's sink writes the whole output: it digests it as it goes, so the
            // certificate need not read the output back.
            sink = sink.with_digest(Arc::new(self.desc.clone()))?;
        }
        let applied = match record {
            Some((_, applied, _)) => applied,
            None => {
                // The upstream table, bulk loaded and committed at the snapshot epoch.
                let load_started = Instant::now();
                // The replay's record goes with the load's first step (or its commit).
                let identity = serde_json::to_string(&self.identity)
                    .map_err(|e| internal!("job record: {e}"))?;
                store.stage_meta(META_JOB, &identity)?;
                store.stage_meta(META_FORMAT, STATE_FORMAT)?;
                store.stage_meta(META_JOB_ID, &self.job_id)?;
                store.stage_meta(
                    META_OUT,
                    &Place::of(&self.options.out)?.path.display().to_string(),
                )?;
                let steps = LoadSteps {
                    rows: match &self.options.state {
                        StateChoice::Memory => u64::MAX,
                        StateChoice::Durable(_) => load_step_rows(self.options, &self.desc),
                    },
                    resume: resumed_load,
                    validated: validation.outcome(),
                    checkpoint: validation.checkpoints(),
                    counters: Arc::default(),
                };
                let counters = steps.counters.clone();
                if let Some(resumed) = resumed_load {
                    counters.loaded.store(resumed.rows, Ordering::Relaxed);
                    counters.committed.store(resumed.rows, Ordering::Relaxed);
                }
                let snapshot_rows = match self.options.shard {
                    Some(_) => None,
                    None => Some(snapshot_row_count(self.dataset)?),
                };
                let stop = Arc::new(AtomicBool::new(false));
                let loading = tokio::task::spawn_blocking({
                    let (store, desc, dataset) =
                        (store.clone(), self.desc.clone(), self.dataset.clone());
                    // The validation's feed starts at or before the rows a resumed load
                    // holds (see `Validation::beside`); a resumed shard's load reads its
                    // own (it counts its rows after its filter).
                    let filter = self.shard_filter()?;
                    let feed_from = validation.feed_start();
                    let feed = validation
                        .take_snapshot_feed()
                        .filter(|_| steps.resume.is_none() || filter.is_none())
                        .map(|feed| (feed, feed_from));
                    let stop = stop.clone();
                    move || Self::load(store, desc, dataset, feed, filter, stop, steps)
                });
                let mut loading = loading;
                let loaded = loop {
                    tokio::select! {
                        biased;
                        signal = interrupted.as_mut() => {
                            stop.store(true, Ordering::Relaxed);
                            let _ = (&mut loading).await;
                            return Err(self.interruption(signal));
                        }
                        done = &mut loading => break done.map_err(|e| {
                            internal!("a blocking part of the job failed: {e}")
                        })?,
                        () = tokio::time::sleep(PROGRESS_INTERVAL) => on_progress(&ReplayProgress {
                            load: Some(counters.report(snapshot_rows)),
                            ..ReplayProgress::default()
                        }),
                    }
                };
                // Nothing of a bad dataset is committed: the load's commit waits for the
                // validation, whose error (naming file and row) wins over the load's.
                if let Some(signal) = validation_done(validation, interrupted.as_mut()).await {
                    return Err(self.interruption(signal));
                }
                let dataset = validation.finish()?;
                self.expected = validation.expected_digest().cloned();
                let loader = loaded?;
                self.snapshot_rows = dataset.snapshot_rows;
                self.last_epoch = dataset.last_epoch.unwrap_or(0);
                summary.snapshot_rows = dataset.snapshot_rows;
                summary.last_epoch = self.last_epoch;
                if store.meta(META_VALIDATED)?.is_none()
                    && let Some(outcome) = validation.outcome().get()
                {
                    store.stage_meta(META_VALIDATED, outcome)?;
                }
                let committed = loader.commit()?;
                if committed.epoch != SNAPSHOT_EPOCH {
                    return Err(internal!("the load committed epoch {}", committed.epoch));
                }
                if resumed_load.is_some() {
                    summary.validation_start = Some(match validation.resumed_at() {
                        _ if validation.was_recorded() => ValidationStart::Recorded,
                        Some(row) => ValidationStart::Resumed(row),
                        None => ValidationStart::FromStart,
                    });
                }
                // The validation's outcome is committed: its checkpoints are of no more use.
                if let StateChoice::Durable(dir) = &self.options.state {
                    remove_checkpoints(dir);
                }
                // Merge the load's sorted pieces into one run per vnode before the backfill
                // starts: its scans then read one source per vnode, not one per piece. (The
                // pieces of a snapshot in key order are each vnode's base already.) An
                // interruption abandons it: the committed load stays.
                let stop = Arc::new(AtomicBool::new(false));
                let compacting = tokio::task::spawn_blocking({
                    let (store, stop) = (store.clone(), stop.clone());
                    move || store.compact_until(&stop)
                });
                self.until_interrupted(&mut interrupted, &stop, compacting)
                    .await??;
                summary.load_time = load_started.elapsed();
                0
            }
        };
        // The backfill: the library's job over the upstream table, fed the changelog after
        // the rows the table holds, into the Parquet sink. The dataset was validated whole, so
        // the job's own checks of each change are off (it would look up every changed key).
        let actors = actors_for(
            self.options.parallelism,
            self.options.shard,
            self.desc.vnode_count().get(),
        );
        let options = JobOptions {
            parallelism: actors,
            order: self.options.order,
            batch_size: self.options.batch_size,
            rate_limit: self.options.rate_limit,
            checkpoint_every: self.options.checkpoint_every,
            barrier_interval: self.options.barrier_interval,
            check_changes: false,
            // A shard's rows are counted from its store (the dataset's count is every vnode's).
            estimate: (self.options.shard.is_none()).then_some(self.snapshot_rows),
            ..JobOptions::default()
        };
        let (changes_tx, changes_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let job = BackfillJob::start(store, JOB_NAME, &name, options, changes_rx)?;
        if job.resume_point().changes != applied {
            return Err(internal!(
                "the job resumes after {} changes, the replay's record says {applied}",
                job.resume_point().changes
            ));
        }
        let control = job.control();
        let stats = job.stats();
        let job_progress = job.progress();
        let mut rescales = self.options.rescales.clone();
        rescales.sort_by_key(|r| r.after_epoch);
        let (applied_tx, applied_rx) = watch::channel(applied);
        let source = ChangeSource {
            dataset: self.dataset.clone(),
            tx: changes_tx,
            batch_size: self.options.batch_size,
            upstream_rate: self.options.upstream_rate,
            skip: applied,
            control: control.clone(),
            rescales: rescales.into(),
            filter: self.shard_filter()?,
            shard: self.options.shard,
            vnodes: self.desc.vnode_count().get(),
        };
        let source_task = tokio::spawn(source.run(applied_tx));
        // Abort the source if this future is dropped or stops early.
        let _source_guard = AbortOnDrop(source_task.abort_handle());
        let published = sink.published_rows();
        let mut progress = ReplayProgress::default();
        let mut report = || {
            progress.backfill = stats.borrow().clone();
            progress.job = job_progress.borrow().clone();
            progress.upstream_changes = *applied_rx.borrow();
            progress.output_rows = published.load(Ordering::Relaxed);
            on_progress(&progress);
        };
        // A signal stops the job at its next checkpoint: what it committed stays.
        let mut stopped = None;
        let result = {
            let mut running = std::pin::pin!(job.run(&mut sink));
            let mut ticks = tokio::time::interval(PROGRESS_INTERVAL);
            loop {
                tokio::select! {
                    biased;
                    result = &mut running => break result,
                    signal = &mut interrupted, if stopped.is_none() => {
                        stopped = Some(signal);
                        // A job that already ended takes no request: it ends anyway.
                        let _ = control.stop();
                    }
                    _ = ticks.tick() => report(),
                }
            }
        };
        report();
        if let Some(signal) = stopped {
            return Err(self.interruption(signal));
        }
        let done = result?;
        if !done.ended {
            return Err(internal!("the job stopped before the backfill finished"));
        }
        // The source ended when the changelog did (its errors reached the job).
        if let Ok(Err(e)) = source_task.await {
            return Err(e);
        }
        let certificate = self.certify(&sink)?;
        summary.certificate = Some(certificate.clone());
        summary.final_checkpoint = done.checkpoint;
        self.record_finish(&certificate)?;
        summary.upstream_changes = done.changes;
        summary.output_rows = sink.rows_published();
        summary.output_files = sink.files_published();
        summary.commit_latencies = sink.commit_latencies().to_vec();
        summary.epochs = done.epochs;
        summary.checkpoints = done.checkpoints;
        {
            let job = job_progress.borrow().clone();
            summary.actors = job.actors.iter().map(|a| a.vnodes).collect();
            summary.rescales = job.rescales;
            summary.rescale_pause_max = job.rescale_pause_max;
            summary.rescale_restart_max = job.rescale_restart_max;
        }
        summary.elapsed = started.elapsed();
        Ok(summary)
    }

    /// The completion certificate at the final checkpoint `epoch` (committed and published),
    /// when the whole changelog is applied: the output's digest against that of the table
    /// the dataset ends with (digested by its validation, see `validation.rs`). The output's
    /// digest comes from the sink when it digested the whole output (a new job), and from
    /// reading the files back otherwise (a resumed one).
    fn certify(&self, sink: &ParquetSink) -> Result<Certificate> {
        let upstream = self
            .expected
            .as_ref()
            .ok_or_else(|| internal!("a certificate before the dataset's validation finished"))?;
        let downstream = match sink.published_digest() {
            Some(digest) => digest.clone(),
            None => TableDigest::of_part(&self.options.out, &self.desc, self.options.shard)?,
        };
        // A shard's table is its vnodes' rows.
        let mut upstream = upstream.clone();
        if let Some(shard) = self.options.shard {
            upstream.retain(shard.range(self.desc.vnode_count())?);
        }
        Ok(Certificate::compare(
            &self.desc,
            self.last_epoch,
            &downstream,
            &upstream,
        ))
    }

    /// Records the end of the job in its output's job record (the dataset epoch and the
    /// certificate); a mismatch is then the job's error: the output stays as it is.
    fn record_finish(&self, certificate: &Certificate) -> Result<()> {
        let finish = FinishRecord::of(certificate);
        self.write_record(Some(finish.clone()))?;
        if finish.certificate_matches {
            Ok(())
        } else {
            Err(Error::CertificateMismatch {
                out: self.options.out.clone(),
                message: finish.certificate,
            })
        }
    }
}

/// How [`Job::load`] commits its steps.
struct LoadSteps {
    /// What the load reports of its progress.
    counters: Arc<LoadCounters>,
    /// Where the validation beside the load publishes its checkpoints, which a step commits.
    checkpoint: Arc<std::sync::Mutex<Option<String>>>,
    /// Rows per step (`u64::MAX`: none, the in-memory store's load).
    rows: u64,
    /// The load to resume: what its committed steps hold.
    resume: Option<LoadProgress>,
    /// The validation's outcome once it passed, committed with the next step.
    validated: Arc<std::sync::OnceLock<String>>,
}

/// The snapshot's rows, by its files' footers.
fn snapshot_row_count(dataset: &Dataset) -> Result<u64> {
    let mut rows = 0u64;
    for path in dataset.snapshot_files() {
        let builder = crate::replay::files::builder(path)?;
        rows += u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    }
    Ok(rows)
}

/// Snapshot rows per load step of a durable state (see [`LOAD_STEP_ROWS`]).
fn load_step_rows(options: &ReplayOptions, desc: &TableDesc) -> u64 {
    (options.load_step_rows)
        .unwrap_or(LOAD_STEP_ROWS.max(256 * desc.vnode_count().get() as u64))
        .max(1)
}

/// Removes the validation's checkpoints of the state in `dir` (best effort: what is left
/// is removed by the next validation that keeps checkpoints there).
fn remove_checkpoints(dir: &Path) {
    let _ = std::fs::remove_dir_all(checkpoint_dir(dir));
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The replay's upstream: the dataset's changelog as the job's changes, after the rows the
/// table holds already, with a barrier at the end of every dataset epoch, paced at the
/// upstream rate, requesting the rescales due at each dataset epoch's end.
struct ChangeSource {
    dataset: Dataset,
    tx: mpsc::Sender<arrangement_backfill::Result<Change>>,
    batch_size: usize,
    upstream_rate: Option<u64>,
    /// Changelog rows the table holds already (committed before this run): skipped.
    skip: u64,
    /// Where rescales are requested.
    control: JobControl,
    /// Rescales not yet requested, by dataset epoch.
    rescales: VecDeque<RescalePoint>,
    /// A shard's filter: only its vnodes' changes reach the job.
    filter: Option<ShardFilter>,
    /// The shard (its rescales are to as many actors per shard's range, see [`actors_for`]).
    shard: Option<Shard>,
    /// The table's vnode count.
    vnodes: usize,
}

impl ChangeSource {
    /// Runs to the changelog's end; its errors go to the job too (which fails with them).
    async fn run(mut self, applied: watch::Sender<u64>) -> Result<()> {
        match self.replay(&applied).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let message = e.to_string();
                let _ = self.tx.send(Err(e.into_engine())).await;
                Err(internal!("the changelog source: {message}"))
            }
        }
    }

    async fn replay(&mut self, applied: &watch::Sender<u64>) -> Result<()> {
        let started = Instant::now();
        let mut rows = self.skip;
        let mut skip = self.skip;
        let mut paced = 0u64;
        let mut dataset_epoch: Option<u64> = None;
        let changes = self.dataset.read_changes(self.batch_size)?;
        for item in Prefetch::new("backfill-changes", READ_AHEAD, changes)? {
            let mut item = item?;
            // A shard applies only its vnodes' changes: the rows the job counts (and the
            // rows to skip on a resume) are those.
            if let Some(filter) = &self.filter {
                item.chunk = filter.chunk(item.chunk)?;
            }
            if skip > 0 {
                let n = item.chunk.num_rows() as u64;
                if skip >= n {
                    skip -= n;
                    continue;
                }
                // Committed checkpoints end between update pairs, so this cut is clean.
                let from = skip as usize;
                let (batch, ops) = item.chunk.into_parts();
                let len = batch.num_rows() - from;
                item.chunk = StreamChunk::new(batch.slice(from, len), ops[from..].to_vec())?;
                skip = 0;
            }
            // A new dataset epoch: close the previous one (the job skips an empty epoch).
            if let Some(closed) = dataset_epoch.filter(|e| *e != item.epoch) {
                self.request_rescales(closed)?;
                self.send(Change::Barrier).await?;
            }
            dataset_epoch = Some(item.epoch);
            if let Some(rate) = self.upstream_rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(paced as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            let n = item.chunk.num_rows() as u64;
            if n == 0 {
                continue;
            }
            self.send(Change::Chunk(item.chunk)).await?;
            rows += n;
            paced += n;
            applied.send_replace(rows);
        }
        if skip > 0 {
            return Err(Error::StateConflict {
                path: self.dataset.dir().to_path_buf(),
                message: format!(
                    "the state says {} changelog rows were applied, but the changelog has only {}",
                    self.skip,
                    self.skip - skip
                ),
            });
        }
        // Close the last dataset epoch; the job turns barriers until the backfill finishes.
        if let Some(closed) = dataset_epoch {
            self.request_rescales(closed)?;
            self.send(Change::Barrier).await?;
        }
        Ok(())
    }

    /// Requests the rescales due once dataset epoch `closed` is closed: the runtime attaches
    /// each to the first checkpoint barrier from the next one on.
    fn request_rescales(&mut self, closed: u64) -> Result<()> {
        while let Some(point) = self.rescales.front().copied() {
            if point.after_epoch > closed {
                break;
            }
            self.rescales.pop_front();
            self.control
                .rescale(actors_for(point.actors, self.shard, self.vnodes))?;
        }
        Ok(())
    }

    async fn send(&mut self, change: Change) -> Result<()> {
        self.tx
            .send(Ok(change))
            .await
            .map_err(|_| internal!("the job stopped reading its upstream"))
    }
}

/// The default output directory of a dataset: `out/<dataset name>`, with the name reduced to
/// a safe single path component (an untrusted name such as `/x` or `../y` never leaves
/// `out/`).
pub fn default_out_dir(dataset: &Dataset) -> PathBuf {
    Path::new("out").join(safe_component(dataset.name()))
}

/// `name` with every character outside `[A-Za-z0-9._-]` replaced by `_`, and no leading dot;
/// `dataset` when nothing is left.
fn safe_component(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = cleaned.trim_start_matches('.');
    if trimmed.is_empty() || trimmed.chars().all(|c| c == '_') {
        "dataset".to_string()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_stay_one_component_under_out() {
        assert_eq!(safe_component("lineitem"), "lineitem");
        assert_eq!(safe_component("/some/other/replay"), "_some_other_replay");
        assert_eq!(safe_component("../../etc"), "_.._etc");
        assert_eq!(safe_component(".."), "dataset");
        assert_eq!(safe_component(""), "dataset");
        assert_eq!(safe_component("a b"), "a_b");
    }
}
