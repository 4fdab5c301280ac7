//! A replay job: a dataset's snapshot and changelog through a backfill into Parquet files,
//! resumable after any stop.
//!
//! ```text
//!   snapshot/*.parquet ──bulk load──▶ upstream table @ epoch 1 (committed)
//!                                                     │ replicated scans
//!   changes/*.parquet ──▶ source task ──bounded──▶ backfill executor ──▶ sink (2PC) ──▶ OUT/changes/
//!                          (materialize: write       (k-way merge,        epoch-<e>.parquet
//!                           upstream, seal, inject    filter, progress)
//!                           barriers, pace)
//! ```
//!
//! The source task applies each change chunk to the upstream table and sends it on; every
//! distinct dataset `_epoch` ends with a barrier (and, with a barrier interval, a long epoch
//! is split by extra barriers). When the changelog is exhausted, barriers keep coming at the
//! interval until the backfill reports it has finished; then one last checkpoint barrier
//! carries `Stop`. The consumer commits every checkpoint: prepare the file, commit the store
//! (with the job record below), publish the file; on a blocking thread, while the consumer
//! goes on with the next epoch's chunks (one commit at a time, in epoch order).
//!
//! At most [`MAX_BARRIERS_IN_FLIGHT`] barriers are between the source and the consumer's
//! commit: a barrier interval shorter than a checkpoint's cost spaces barriers by that cost
//! instead of queueing them, so the actors read the snapshot between barriers rather than
//! one batch per barrier (an epoch that reads once, I6) with a commit each.
//!
//! # Resuming
//! With the durable store (the default, in `OUT/state`) every checkpoint commits, atomically
//! with the upstream table and the backfill's progress, a job record in the store's meta:
//! - `replay.job`: the job's identity (dataset name, columns, keys, vnode count, input files
//!   and sizes); a state directory of another job is refused;
//! - `replay.changes_applied`: changelog rows applied upstream as of the committed epoch;
//! - `replay.finished`: set by the final `Stop` checkpoint.
//!
//! Running the same replay again resumes from the last committed checkpoint: the sink rolls
//! committed `.tmp` files forward and removes uncommitted ones, the changelog is re-applied
//! from the first uncommitted row, the backfill restores each vnode's position (Completed
//! vnodes are never read again), and barriers continue after the committed epoch. A finished
//! job says so and does nothing. The output directory is locked (`OUT/.lock`) for the run.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::backfill::BackfillStats;
use crate::backfill::{BackfillConfig, SnapshotOrder};
use crate::chunk::{Message, Mutation, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::job::barrier::{BarrierInjector, InFlight};
use crate::job::output::{
    self, FileRecord, FinishRecord, JobRecord, META_FILE_PREFIX, META_JOB_ID, Place,
};
use crate::job::sink::{ParquetSink, Prepared, Preparing};
use crate::job::validation::{NewDirs, Validation};
use crate::job::{Certificate, JobControl, JobProgress, ParallelBackfill, TableDigest, VnodeMap};
use crate::replay::Dataset;
use crate::replay::SnapshotFeed;
use crate::replay::prefetch::Prefetch;
use crate::store::durable::{self, DirLock};
use crate::store::io::{RealIo, StorageIo};
use crate::store::{DurableOptions, DurableStore, MemoryStore, StateStore, StateTable};
use crate::table::{TableDesc, describe};
use crate::vnode::{VnodeBitmap, VnodeCount};

/// The epoch the snapshot is committed at.
const SNAPSHOT_EPOCH: u64 = 1;
/// Rows per Parquet read and store write while bulk loading the snapshot.
const LOAD_BATCH_ROWS: usize = 64 * 1024;

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
/// Upstream messages in flight between the source task and the backfill.
const CHANNEL_CAPACITY: usize = 64;
/// The barrier interval once the changelog is exhausted, when none is configured.
const DEFAULT_IDLE_BARRIER_INTERVAL: Duration = Duration::from_millis(100);

/// Barriers sent by the source and not yet collected (committed, for a checkpoint) by the
/// consumer, at most: one being committed, one on its way.
pub const MAX_BARRIERS_IN_FLIGHT: u64 = 2;
/// The output directory's lock file.
pub const OUT_LOCK_FILE: &str = ".lock";

/// Locks the output directory `out` for a reader of it (`verify`, the certificate), for as
/// long as the lock lives: a replay into `out` is refused meanwhile, and a reader that starts
/// while a replay writes there fails with [`Error::Locked`] naming the replay's process
/// instead of reading a half-written output. The same lock as a replay's; where `out` cannot
/// be written, a shared lock on its lock file. `None`: `out` is not a directory (the reader
/// says so), or is read-only with no lock file (no replay can write there).
pub fn lock_output_to_read(out: &Path) -> Result<Option<DirLock>> {
    if !out.is_dir() {
        return Ok(None);
    }
    let path = out.join(OUT_LOCK_FILE);
    match DirLock::acquire_file(&path) {
        Ok(lock) => Ok(Some(lock)),
        Err(Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            DirLock::share_existing_file(&path)
        }
        Err(e) => Err(e),
    }
}
/// The state directory inside the output directory, by default.
pub const STATE_DIR: &str = "state";

const META_JOB: &str = "replay.job";
const META_APPLIED: &str = "replay.changes_applied";
const META_FINISHED: &str = "replay.finished";
/// The output directory a state's job writes (resolved when the job began), for messages.
const META_OUT: &str = "replay.out";

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
    /// Online rescales: at the first checkpoint at or after the barrier that closes dataset
    /// epoch `after_epoch`, move to `actors` actors.
    pub rescales: Vec<RescalePoint>,
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
        let bad = || Error::InvalidConfig(format!("a rescale is EPOCH:ACTORS, not `{s}`"));
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
        }
    }
}

/// A progress report, sent after every downstream message.
#[derive(Debug, Clone, Default)]
pub struct ReplayProgress {
    /// Snapshot rows in the dataset.
    pub snapshot_total: u64,
    /// The backfill's counters, summed over its actors.
    pub backfill: BackfillStats,
    /// The job's progress: rows read of the estimated total, rate, ETA, per-actor rows.
    pub job: JobProgress,
    /// Changelog rows applied upstream so far (including before a resume).
    pub upstream_changes: u64,
    /// Rows published to the output by this run.
    pub output_rows: u64,
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
}

/// Why a replay stopped early at the user's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
pub async fn run_replay(
    dataset: &Dataset,
    options: &ReplayOptions,
    on_progress: impl FnMut(&ReplayProgress),
) -> Result<ReplaySummary> {
    run_replay_until(dataset, options, on_progress, std::future::pending()).await
}

/// [`run_replay`], stopped cleanly when `interrupted` completes: the current epoch is
/// abandoned (committed checkpoints stay; nothing half-written is left in the output) and the
/// result is an [`Error::Interrupted`] naming the epoch to resume from.
pub async fn run_replay_until(
    dataset: &Dataset,
    options: &ReplayOptions,
    on_progress: impl FnMut(&ReplayProgress),
    interrupted: impl Future<Output = Interrupt>,
) -> Result<ReplaySummary> {
    if !(1..=crate::backfill::MAX_BATCH_SIZE).contains(&options.batch_size) {
        return Err(Error::InvalidConfig(format!(
            "batch size must be between 1 and {}",
            crate::backfill::MAX_BATCH_SIZE
        )));
    }
    if options.upstream_rate == Some(0) || options.rate_limit == Some(0) {
        return Err(Error::InvalidConfig(
            "a rate of 0 rows/s would never finish; leave the option out for no limit".into(),
        ));
    }
    BarrierInjector::new(SNAPSHOT_EPOCH, options.checkpoint_every)?;
    let vnodes = options.vnodes.get();
    // The initial parallelism is capped at the vnode count (one actor per vnode at most); a
    // rescale names its actors exactly, so it must fit.
    let actors = std::iter::once((options.parallelism, true))
        .chain(options.rescales.iter().map(|r| (r.actors, false)));
    for (actors, initial) in actors {
        if actors == 0 || (actors > vnodes && !initial) {
            return Err(Error::InvalidConfig(format!(
                "{actors} backfill actors for {vnodes} vnodes: choose 1 to {vnodes}"
            )));
        }
    }
    let state_dir = match &options.state {
        StateChoice::Memory => None,
        StateChoice::Durable(dir) => Some(dir.as_path()),
    };
    output::check_places(dataset.dir(), &options.out, state_dir)?;
    // New directories have nothing to lose: validate beside the load (see `validation.rs`).
    let new_dirs = match &options.state {
        StateChoice::Memory => NewDirs::of(&[&options.out]),
        StateChoice::Durable(dir) => NewDirs::of(&[&options.out, dir]),
    };
    let desc = Arc::new(dataset.table_desc(options.vnodes)?);
    let mut interrupted = std::pin::pin!(interrupted);
    let mut validation = match new_dirs {
        Some(_) => Validation::beside(dataset, desc)?,
        None => {
            // Existing directories have something to lose: nothing is touched before the
            // dataset is known good. A signal meanwhile stops the run at once.
            let mut validation = Validation::first_in_background(dataset, desc)?;
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
    let result = run_validated(dataset, options, &mut validation, on_progress, interrupted).await;
    if result.is_err()
        && validation.failed()
        && let Some(new_dirs) = new_dirs
    {
        new_dirs.remove();
    }
    result
}

/// [`run_replay_until`] once the options are checked and the validation started: the store
/// opened, the job run.
async fn run_validated(
    dataset: &Dataset,
    options: &ReplayOptions,
    validation: &mut Validation,
    on_progress: impl FnMut(&ReplayProgress),
    interrupted: impl Future<Output = Interrupt>,
) -> Result<ReplaySummary> {
    let desc = dataset.table_desc(options.vnodes)?;
    let io = options.io.clone();
    io.create_dir_all(&options.out)?;
    let _out_lock = DirLock::acquire_file(&options.out.join(OUT_LOCK_FILE))?;
    match &options.state {
        StateChoice::Memory => {
            let job = Job::new(MemoryStore::new(), dataset, options, desc)?;
            job.run(validation, on_progress, interrupted).await
        }
        StateChoice::Durable(dir) => {
            if !io.exists(dir)? {
                // A new state: refuse another job's output before creating it.
                check_claim(
                    options,
                    JobRecord::read(io.as_ref(), &options.out)?.as_ref(),
                )?;
            }
            if options.fresh {
                durable::destroy(io.as_ref(), dir)?;
            }
            let mut store = DurableStore::open_with(dir, io.clone(), options.durable.clone())?;
            if store.committed_epoch()?.is_none() {
                // Nothing was ever committed (a run that died during its load): start clean.
                drop(store);
                durable::destroy(io.as_ref(), dir)?;
                store = DurableStore::open_with(dir, io.clone(), options.durable.clone())?;
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
    let names = output::output_names(io, out)?;
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
            None => Some(
                "holds output files (changes/epoch-*.parquet) of no job this version of \
                 backfill knows, which this run would delete: use --fresh to discard them, \
                 or choose another --out"
                    .to_string(),
            ),
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
        use std::io::{Read, Seek, SeekFrom};
        use std::os::unix::fs::MetadataExt;
        let mut file = std::fs::File::open(path).map_err(|e| crate::store::io::named(path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| crate::store::io::named(path, e))?;
        let size = meta.len();
        let bad = |what: &str| Error::dataset(path, "", format!("not a Parquet file: {what}"));
        if size < 12 {
            return Err(bad("shorter than a footer"));
        }
        let mut tail = [0u8; 8];
        file.seek(SeekFrom::End(-8))
            .and_then(|_| file.read_exact(&mut tail))
            .map_err(|e| crate::store::io::named(path, e))?;
        let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        if &tail[4..] != b"PAR1" || footer_len + 8 > size {
            return Err(bad("no footer"));
        }
        let mut footer = vec![0u8; footer_len as usize + 8];
        file.seek(SeekFrom::End(-(footer.len() as i64)))
            .and_then(|_| file.read_exact(&mut footer))
            .map_err(|e| crate::store::io::named(path, e))?;
        Ok(Self {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size,
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
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
    fn of(dataset: &Dataset, desc: &TableDesc) -> Result<Self> {
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
        let identity = JobIdentity::of(dataset, &desc)?;
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
    /// ones a validation beside the load decodes) or are read here.
    ///
    /// Stops between batches once `stop` is set (with [`Error::Internal`]; the caller
    /// reports the interruption). Runs on a blocking thread of its own, so the job can
    /// watch for signals meanwhile.
    fn load(
        store: S,
        desc: TableDesc,
        dataset: Dataset,
        feed: Option<SnapshotFeed>,
        stop: Arc<AtomicBool>,
    ) -> Result<()> {
        store.create_table(desc.clone())?;
        let all = VnodeBitmap::full(desc.vnode_count());
        let mut upstream = store.table(desc.name(), all)?;
        // Decoding on a reader thread overlaps with the load's hashing, sorting and writing.
        let batches: Box<dyn Iterator<Item = Result<arrow_array::RecordBatch>>> = match feed {
            Some(feed) => Box::new(feed.map(|item| item.map(|(_, batch)| batch))),
            None => {
                let batches = dataset.read_snapshot(LOAD_BATCH_ROWS)?;
                Box::new(Prefetch::new("backfill-load", READ_AHEAD, batches)?)
            }
        };
        for batch in batches {
            if stop.load(Ordering::Relaxed) {
                return Err(internal!("the snapshot load was stopped"));
            }
            upstream.write(&StreamChunk::inserts(batch?))?;
        }
        upstream.seal(SNAPSHOT_EPOCH)
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
        let applied = self
            .store
            .meta(META_APPLIED)?
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| conflict("the job record lacks the changelog position".into()))?;
        let finished = self.store.meta(META_FINISHED)?.as_deref() == Some("true");
        Ok(Some((epoch, applied, finished)))
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
        for (key, value) in self.store.meta_with_prefix(META_FILE_PREFIX)? {
            let record = key
                .strip_prefix(META_FILE_PREFIX)
                .and_then(|e| e.parse::<u64>().ok())
                .zip(FileRecord::decode(&value));
            let Some((epoch, record)) = record else {
                return Err(Error::CorruptState {
                    context: self.state_dir().display().to_string(),
                    message: format!("unreadable output file record `{key}` = `{value}`"),
                });
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
        record.write(self.options.io.as_ref(), &self.options.out)
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
                let c = crate::job::certificate::certify_locked_output(
                    self.dataset,
                    &self.options.out,
                )?;
                let finish = FinishRecord::of(&c);
                record.finished = Some(finish.clone());
                record.write(self.options.io.as_ref(), &self.options.out)?;
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
        on_progress: impl FnMut(&ReplayProgress),
        interrupted: impl Future<Output = Interrupt>,
    ) -> Result<ReplaySummary> {
        let started = Instant::now();
        let mut interrupted = std::pin::pin!(interrupted);
        let io = self.options.io.clone();
        let record = self.committed_record()?;
        let out_record = JobRecord::read(io.as_ref(), &self.options.out)?;
        match record {
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
            out: self.options.out.clone(),
            resumed_from: record.map(|(epoch, _, _)| epoch),
            changes_already_applied: record.map_or(0, |(_, applied, _)| applied),
            already_finished: record.is_some_and(|(_, _, finished)| finished),
            last_epoch: self.last_epoch,
            finish_record: None,
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
        let mut sink = ParquetSink::open(
            self.options.io.clone(),
            &self.options.out,
            self.desc.schema(),
            record.map(|(epoch, _, _)| epoch),
        )?
        .with_key_statistics(&key)?;
        if record.is_none() {
            // The earlier output is gone (the sink removed it): the output is this job's.
            self.write_claim()?;
            // A new job's sink writes the whole output: it digests it as it goes, so the
            // certificate need not read the output back.
            sink = sink.with_digest(Arc::new(self.desc.clone()))?;
        }
        let all = VnodeBitmap::full(self.desc.vnode_count());
        let (committed, applied) = match record {
            Some((epoch, applied, _)) => (epoch, applied),
            None => {
                // The upstream table, bulk loaded and committed at the snapshot epoch.
                let load_started = Instant::now();
                let stop = Arc::new(AtomicBool::new(false));
                let loading = tokio::task::spawn_blocking({
                    let (store, desc, dataset) =
                        (store.clone(), self.desc.clone(), self.dataset.clone());
                    let feed = validation.take_snapshot_feed();
                    let stop = stop.clone();
                    move || Self::load(store, desc, dataset, feed, stop)
                });
                let loaded = self
                    .until_interrupted(&mut interrupted, &stop, loading)
                    .await?;
                // Nothing of a bad dataset is committed: the load's commit waits for the
                // validation, whose error (naming file and row) wins over the load's.
                if let Some(signal) = validation_done(validation, interrupted.as_mut()).await {
                    return Err(self.interruption(signal));
                }
                let dataset = validation.finish()?;
                self.expected = validation.expected_digest().cloned();
                loaded?;
                self.snapshot_rows = dataset.snapshot_rows;
                self.last_epoch = dataset.last_epoch.unwrap_or(0);
                summary.snapshot_rows = dataset.snapshot_rows;
                summary.last_epoch = self.last_epoch;
                let identity = serde_json::to_string(&self.identity)
                    .map_err(|e| internal!("job record: {e}"))?;
                store.stage_meta(META_JOB, &identity)?;
                store.stage_meta(META_JOB_ID, &self.job_id)?;
                store.stage_meta(
                    META_OUT,
                    &Place::of(&self.options.out)?.path.display().to_string(),
                )?;
                store.stage_meta(META_APPLIED, "0")?;
                store.commit(SNAPSHOT_EPOCH)?;
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
                (SNAPSHOT_EPOCH, 0)
            }
        };
        let upstream = store.table(&name, all.clone())?;
        let injector = BarrierInjector::new(committed, self.options.checkpoint_every)?;
        let config = BackfillConfig {
            batch_size: self.options.batch_size,
            order: self.options.order,
            rate_limit: self.options.rate_limit,
            ..BackfillConfig::default()
        };
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let actors = self.options.parallelism.min(self.desc.vnode_count().get());
        let map = VnodeMap::even(self.desc.vnode_count(), actors)?;
        let mut runtime =
            ParallelBackfill::start(store, &name, map, config, self.snapshot_rows, rx)?;
        let stats = runtime.stats();
        let mut rescales = self.options.rescales.clone();
        rescales.sort_by_key(|r| r.after_epoch);
        let applied_at: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
        let (in_flight, collected) = InFlight::new(MAX_BARRIERS_IN_FLIGHT);
        let source = Source {
            dataset: self.dataset.clone(),
            upstream,
            injector,
            tx,
            stats: stats.clone(),
            batch_size: self.options.batch_size,
            barrier_interval: self.options.barrier_interval,
            upstream_rate: self.options.upstream_rate,
            skip: applied,
            applied_at: applied_at.clone(),
            control: runtime.control(),
            rescales: rescales.into(),
            in_flight,
        };
        let (changes_tx, changes_rx) = watch::channel(applied);
        let mut source_task = tokio::spawn(source.run(changes_tx));
        // Abort the source if this future is dropped or stops early.
        let source_guard = AbortOnDrop(source_task.abort_handle());
        let result = self
            .drive(
                &mut runtime,
                &stats,
                &changes_rx,
                &applied_at,
                &collected,
                &mut sink,
                committed,
                &mut summary,
                on_progress,
                interrupted,
            )
            .await;
        // No barrier will be collected any more: a source waiting for a place in flight
        // fails instead of waiting forever.
        drop(collected);
        if result.is_err() {
            // Wait for the aborted source and actors to let go of their table handles (and
            // so of the store and its directory lock) before reporting.
            drop(source_guard);
            let _ = (&mut source_task).await;
            runtime.shutdown().await;
            return Err(result.err().unwrap_or_else(|| internal!("unreachable")));
        }
        let total_applied = source_task
            .await
            .map_err(|e| internal!("the source task failed: {e}"))??;
        drop(source_guard);
        runtime.shutdown().await;
        if !stats.borrow().finished {
            return Err(internal!("the job stopped before the backfill finished"));
        }
        summary.upstream_changes = total_applied - applied;
        summary.output_rows = sink.rows_published();
        summary.output_files = sink.files_published();
        {
            let job = runtime.progress().borrow().clone();
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
            None => TableDigest::of_output(&self.options.out, &self.desc)?,
        };
        Ok(Certificate::compare(
            &self.desc,
            self.last_epoch,
            &downstream,
            upstream,
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

    /// Runs the backfill over the source's messages and commits its checkpoints, until the
    /// final `Stop` barrier, an error or an interruption.
    ///
    /// A checkpoint commits off this loop ([`Committing`]): the loop goes on taking the next
    /// epoch's chunks (into the sink's next file) while the encoder finishes the checkpoint's
    /// file, the store commits and the file is published, so neither the backfill nor the
    /// encoder waits for a commit. One commit at a time, in epoch order: the next checkpoint
    /// barrier waits for the one before. However the loop ends, a commit under way is waited
    /// for before this returns (nothing writes after the job reports).
    #[expect(
        clippy::too_many_arguments,
        reason = "the job's parts, borrowed from `run`"
    )]
    async fn drive(
        &self,
        downstream: &mut ParallelBackfill,
        stats: &watch::Receiver<BackfillStats>,
        changes_rx: &watch::Receiver<u64>,
        applied_at: &Mutex<BTreeMap<u64, u64>>,
        collected: &watch::Sender<u64>,
        sink: &mut ParquetSink,
        committed: u64,
        summary: &mut ReplaySummary,
        on_progress: impl FnMut(&ReplayProgress),
        interrupted: impl Future<Output = Interrupt>,
    ) -> Result<()> {
        let mut committing = None;
        let mut loop_parts = DriveLoop {
            downstream,
            stats,
            changes_rx,
            applied_at,
            collected,
            sink,
            summary,
            committing: &mut committing,
        };
        let result = self
            .drive_loop(&mut loop_parts, committed, on_progress, interrupted)
            .await;
        if let Some(commit) = committing.take() {
            // Only an error leaves one: its outcome no longer matters, its end does.
            let _ = commit.task.await;
        }
        result
    }

    /// [`Job::drive`]'s loop; a commit it leaves under way is the caller's to wait for.
    async fn drive_loop(
        &self,
        parts: &mut DriveLoop<'_>,
        committed: u64,
        mut on_progress: impl FnMut(&ReplayProgress),
        interrupted: impl Future<Output = Interrupt>,
    ) -> Result<()> {
        let store = &self.store;
        let job_progress = parts.downstream.progress();
        let mut progress = ReplayProgress {
            snapshot_total: self.snapshot_rows,
            ..ReplayProgress::default()
        };
        let mut open_epoch = committed;
        let mut interrupted = std::pin::pin!(interrupted);
        loop {
            let message = tokio::select! {
                biased;
                signal = &mut interrupted => {
                    if let Some(commit) = parts.committing.take() {
                        // Report the epoch committed once the commit under way has ended.
                        let _ = commit.task.await;
                    }
                    return Err(Error::Interrupted {
                        signal: signal.name(),
                        code: signal.exit_code(),
                        committed: store.committed_epoch()?,
                    });
                }
                outcome = commit_done(parts.committing), if parts.committing.is_some() => {
                    self.settle(parts, Some(outcome)).await?;
                    continue;
                }
                message = parts.downstream.next() => message,
            };
            let Some(message) = message else {
                self.settle(parts, None).await?;
                break;
            };
            match message? {
                Message::Chunk(chunk) => parts.sink.push(open_epoch, chunk)?,
                Message::Watermark(_) => {}
                Message::Barrier(barrier) => {
                    parts.summary.epochs += 1;
                    open_epoch = barrier.epoch.curr;
                    let prev = barrier.epoch.prev;
                    if barrier.is_checkpoint() && prev > committed {
                        // One commit at a time, in epoch order.
                        self.settle(parts, None).await?;
                        let rows = {
                            let mut map = (parts.applied_at.lock())
                                .map_err(|_| internal!("applied map poisoned"))?;
                            let rows = map.get(&prev).copied().ok_or_else(|| {
                                internal!("no changelog position for epoch {prev}")
                            })?;
                            *map = map.split_off(&(prev + 1));
                            rows
                        };
                        let stop = barrier.mutation == Some(Mutation::Stop);
                        let preparing = parts.sink.start_prepare(prev)?;
                        let store = store.clone();
                        let task = tokio::task::spawn_blocking(move || {
                            commit_checkpoint(&store, prev, rows, stop, preparing)
                        });
                        *parts.committing = Some(Committing {
                            epoch: prev,
                            stop,
                            later_barriers: 0,
                            task,
                        });
                        if stop {
                            self.settle(parts, None).await?;
                        }
                    } else if let Some(commit) = parts.committing.as_mut() {
                        commit.later_barriers += 1;
                    } else {
                        parts.collected.send_modify(|n| *n += 1);
                    }
                }
            }
            progress.backfill = parts.stats.borrow().clone();
            progress.job = job_progress.borrow().clone();
            progress.upstream_changes = *parts.changes_rx.borrow();
            progress.output_rows = parts.sink.rows_published();
            on_progress(&progress);
        }
        Ok(())
    }

    /// Waits for the commit under way, if any, and accounts for it: the runtime learns the
    /// epoch is committed, the sink counts its file, its barrier (and the ones that came
    /// during it) are collected, and the final checkpoint gets its certificate. `outcome`:
    /// the commit's, when already taken from its task.
    async fn settle(
        &self,
        parts: &mut DriveLoop<'_>,
        outcome: Option<CommitOutcome>,
    ) -> Result<()> {
        let Some(commit) = parts.committing.take() else {
            return Ok(());
        };
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => commit.task.await,
        };
        let prepared = outcome
            .map_err(|e| internal!("the commit of checkpoint {} failed: {e}", commit.epoch))??;
        parts.downstream.committed(commit.epoch);
        if let Some(prepared) = prepared {
            parts.sink.published(prepared)?;
        }
        parts.summary.checkpoints += 1;
        if commit.stop {
            let certificate = self.certify(parts.sink)?;
            parts.summary.certificate = Some(certificate.clone());
            parts.summary.final_checkpoint = Some(commit.epoch);
            self.record_finish(&certificate)?;
        }
        parts
            .collected
            .send_modify(|n| *n += 1 + commit.later_barriers);
        Ok(())
    }
}

/// The parts of a job the consumer's loop drives.
struct DriveLoop<'a> {
    downstream: &'a mut ParallelBackfill,
    stats: &'a watch::Receiver<BackfillStats>,
    changes_rx: &'a watch::Receiver<u64>,
    /// Per epoch, the changelog rows applied by its end.
    applied_at: &'a Mutex<BTreeMap<u64, u64>>,
    collected: &'a watch::Sender<u64>,
    sink: &'a mut ParquetSink,
    summary: &'a mut ReplaySummary,
    committing: &'a mut Option<Committing>,
}

/// The outcome of the commit under way, once it has ended (never, without one).
async fn commit_done(committing: &mut Option<Committing>) -> CommitOutcome {
    match committing {
        Some(commit) => (&mut commit.task).await,
        None => std::future::pending().await,
    }
}

/// What a commit's blocking task returns: the published file, if the checkpoint had one.
type CommitOutcome = std::result::Result<Result<Option<Prepared>>, tokio::task::JoinError>;

/// A checkpoint committing on a blocking thread ([`commit_checkpoint`]).
struct Committing {
    epoch: u64,
    /// Whether it is the final (`Stop`) checkpoint.
    stop: bool,
    /// Barriers that reached the consumer after this checkpoint's: collected with it, so
    /// that the source never has more than [`MAX_BARRIERS_IN_FLIGHT`] uncommitted.
    later_barriers: u64,
    task: tokio::task::JoinHandle<Result<Option<Prepared>>>,
}

/// Commits checkpoint `epoch` (two-phase, see [`ParquetSink`]): waits for its file (if it has
/// one) to be written and synced, commits the store with the job record (`rows` of the
/// changelog applied; finished, at the final checkpoint), then makes the file visible.
fn commit_checkpoint<S: StateStore>(
    store: &S,
    epoch: u64,
    rows: u64,
    stop: bool,
    preparing: Option<Preparing>,
) -> Result<Option<Prepared>> {
    let prepared = preparing.map(Preparing::wait).transpose()?;
    if let Some(prepared) = &prepared {
        // A resume checks the committed files against this record (`output.rs`).
        store.stage_meta(&FileRecord::key(epoch), &prepared.record().encode())?;
    }
    store.stage_meta(META_APPLIED, &rows.to_string())?;
    if stop {
        store.stage_meta(META_FINISHED, "true")?;
    }
    store.commit(epoch)?;
    if let Some(prepared) = &prepared {
        prepared.reveal()?;
    }
    Ok(prepared)
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The upstream source and materialize: applies the changelog to the upstream table and
/// sends it, with barriers, to the backfill.
struct Source<T: StateTable> {
    dataset: Dataset,
    upstream: T,
    injector: BarrierInjector,
    tx: mpsc::Sender<Result<Message>>,
    stats: watch::Receiver<BackfillStats>,
    batch_size: usize,
    barrier_interval: Option<Duration>,
    upstream_rate: Option<u64>,
    /// Changelog rows already applied (committed) before this run: skipped.
    skip: u64,
    /// Changelog rows applied as of each sealed epoch (the job record of its checkpoint).
    applied_at: Arc<Mutex<BTreeMap<u64, u64>>>,
    /// Where rescales are requested.
    control: JobControl,
    /// Rescales not yet requested, by dataset epoch.
    rescales: VecDeque<RescalePoint>,
    /// Bounds the barriers not yet collected by the consumer ([`MAX_BARRIERS_IN_FLIGHT`]).
    in_flight: InFlight,
}

impl<T: StateTable> Source<T> {
    /// Runs to the final `Stop` barrier; returns the changelog rows applied in all (those
    /// skipped included). Errors are also sent downstream, so the job fails with them.
    async fn run(mut self, applied: watch::Sender<u64>) -> Result<u64> {
        match self.replay(&applied).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                let message = e.to_string();
                // The executor ends its output with this error; the job reports it.
                let _ = self.tx.send(Err(e)).await;
                Err(internal!("upstream source: {message}"))
            }
        }
    }

    async fn replay(&mut self, applied: &watch::Sender<u64>) -> Result<u64> {
        let started = Instant::now();
        let mut last_barrier = Instant::now();
        let mut rows = self.skip;
        let mut skip = self.skip;
        let mut paced = 0u64;
        let mut dataset_epoch: Option<u64> = None;
        let mut dirty = false;
        // The first barrier closes the committed epoch, which the store already holds.
        self.in_flight.acquire().await?;
        let first = self.injector.next(None);
        self.send(Message::Barrier(first)).await?;
        let changes = self.dataset.read_changes(self.batch_size)?;
        for item in Prefetch::new("backfill-changes", READ_AHEAD, changes)? {
            let mut item = item?;
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
            // A new dataset epoch: close the previous one, unless an interval barrier did.
            if let Some(closed) = dataset_epoch.filter(|e| *e != item.epoch) {
                self.request_rescales(closed)?;
                if dirty {
                    self.barrier(None, rows).await?;
                    last_barrier = Instant::now();
                }
            }
            dataset_epoch = Some(item.epoch);
            if let Some(rate) = self.upstream_rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(paced as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            self.upstream.write(&item.chunk)?;
            let n = item.chunk.num_rows() as u64;
            rows += n;
            paced += n;
            dirty = true;
            self.send(Message::Chunk(item.chunk)).await?;
            applied.send_replace(rows);
            if self
                .barrier_interval
                .is_some_and(|interval| last_barrier.elapsed() >= interval)
            {
                self.barrier(None, rows).await?;
                last_barrier = Instant::now();
                dirty = false;
            }
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
        // Close the last dataset epoch.
        if let Some(closed) = dataset_epoch {
            self.request_rescales(closed)?;
        }
        if dirty {
            self.barrier(None, rows).await?;
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
            self.barrier(None, rows).await?;
            if read {
                // Give that barrier the time to pass before sending another.
                self.wait_for(idle, |s| s.finished).await;
            }
        }
        self.barrier(Some(Mutation::Stop), rows).await?;
        Ok(rows)
    }

    /// Requests the rescales due once dataset epoch `closed` is closed: the runtime attaches
    /// each to the first checkpoint barrier from the next one on.
    fn request_rescales(&mut self, closed: u64) -> Result<()> {
        while let Some(point) = self.rescales.front().copied() {
            if point.after_epoch > closed {
                break;
            }
            self.rescales.pop_front();
            self.control.rescale(point.actors)?;
        }
        Ok(())
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

    /// Seals the open epoch upstream (with `rows` changelog rows applied as of it) and sends
    /// its closing barrier.
    async fn barrier(&mut self, mutation: Option<Mutation>, rows: u64) -> Result<()> {
        self.in_flight.acquire().await?;
        let barrier = self.injector.next(mutation);
        self.upstream.seal(barrier.epoch.prev)?;
        self.applied_at
            .lock()
            .map_err(|_| internal!("applied map poisoned"))?
            .insert(barrier.epoch.prev, rows);
        self.send(Message::Barrier(barrier)).await
    }

    async fn send(&mut self, message: Message) -> Result<()> {
        self.tx
            .send(Ok(message))
            .await
            .map_err(|_| internal!("the backfill stopped reading its upstream"))
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
