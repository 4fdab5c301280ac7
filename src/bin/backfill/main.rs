//! The `backfill` command-line tool: replay a dataset through a backfill, verify a replay's
//! output, generate datasets.
//!
//! Exit status: 0 on success (the output is exactly once), 2 on bad input (a malformed
//! dataset, a usage error, a locked output, a state or output of another job), 3 when the
//! completion certificate does not match, 128 + the signal after SIGINT, SIGTERM or SIGHUP, 1
//! on any other failure.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

// The engine's modules, under the names the tool's modules use for them.
use arrangement_backfill::{backfill, chunk, dictionary, key, merge, store, table, vnode};

mod error;
mod job;
mod replay;
#[cfg(test)]
mod tool_tests;

use crate::error::Result;
use crate::job::replay::{
    DEFAULT_BATCH_SIZE, Interrupt, LoadReport, ReplayOptions, ReplayProgress, ReplaySummary,
    RescalePoint, STATE_DIR, StateChoice, ValidationStart, default_out_dir, default_parallelism,
    run_replay_until,
};
use crate::job::shard::Shard;
use crate::job::{Certificate, certify_output};
use crate::replay::{
    Dataset, ExternalSortOptions, GenKind, GenOptions, SyntheticShape, generate,
    remove_all_scratch, verify_with,
};
use arrangement_backfill::backfill::{MAX_BATCH_SIZE, SnapshotOrder};
use arrangement_backfill::vnode::VnodeCount;
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

/// mimalloc: chosen by measurement over glibc's allocator (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`: its index in the `mi_option_e` enum of mimalloc v3's
/// `mimalloc.h`, as built by `libmimalloc-sys` 0.1.49 (pinned), which exports no constant
/// for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps the memory mimalloc frees for reuse instead of returning it to the system a second
/// later, unless the environment sets the purge delay (`MIMALLOC_PURGE_DELAY`, in any of the
/// spellings mimalloc reads).
///
/// A replay frees and allocates batches, blocks and Parquet pages at a high rate; returned
/// pages come back as page faults, each zeroing a fresh page (about a tenth of a scale-1
/// replay's samples). Its memory is bounded by its budgets, so keeping the high-water mark
/// costs little. Chosen by measurement (docs/benchmarks-history.md, "Fewer bytes for zstd, cheaper block
/// reads, integer sorts, kept pages": scale-1 CPU 0.91-0.95x, peak memory +5-8%).
///
/// mimalloc reads its options when the process starts, before `main`, so a *default* set
/// here would be ignored (`mi_option_set_default` skips an option already read, which every
/// option is by then): the value is set outright, unless the environment named the option.
#[expect(unsafe_code, reason = "setting a mimalloc option; see SAFETY")]
fn keep_freed_memory() {
    if purge_delay_in_environment() {
        return;
    }
    // SAFETY: mimalloc's options are not synchronized, so this must run before any other
    // thread may read them: first in `main`, before the program starts a thread (and in the
    // one test that calls it, which no other test's use of mimalloc options can race). -1 is
    // the documented "never purge" value of this option.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// Whether the environment sets mimalloc's purge delay: `MIMALLOC_PURGE_DELAY` or its legacy
/// name `MIMALLOC_RESET_DELAY`, in any case (mimalloc compares names case-insensitively).
fn purge_delay_in_environment() -> bool {
    std::env::vars_os().any(|(name, _)| {
        name.to_str().is_some_and(|name| {
            name.eq_ignore_ascii_case("MIMALLOC_PURGE_DELAY")
                || name.eq_ignore_ascii_case("MIMALLOC_RESET_DELAY")
        })
    })
}

/// Prints a line to stdout. A reader that went away (`backfill ... | head -1`) is not an
/// error of ours: the rest of the report is dropped and the exit status stays the job's.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

#[derive(Debug, Parser)]
#[command(
    name = "backfill",
    version,
    about = "Backfill a streaming view from a live table, on Apache Arrow"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a dataset: load its snapshot, backfill an identity view while its changelog is
    /// applied, write the view's changelog to OUT/changes.
    ///
    /// Running the same command again after any stop (even kill -9) resumes where it
    /// stopped. The snapshot load commits in steps of about half a million rows, each with
    /// the progress of the dataset's validation beside it: a stop during the load costs the
    /// rows loaded and validated since its last step (the next run loads and validates only
    /// the rest, and says where each resumed; a validation of a snapshot not in key order
    /// keeps no progress and starts over); after it, a stop costs at most the work since
    /// the last checkpoint (the validation, passed, is kept in the state and not run again).
    ///
    /// Shards: `--shard I/N` replays only the I-th of N even vnode ranges (I counts from 0),
    /// into its own files of the output (OUT/changes/epoch-E.shard-I-of-N.parquet) with its
    /// own state (OUT/state.shard-I-of-N): N processes, on one machine or N, share the
    /// dataset and the output with no coordination, and `verify` checks the N shards'
    /// output together. `--shard auto` takes I and N from a batch scheduler (Kubernetes
    /// indexed Job, Slurm array, AWS Batch array job).
    Replay(Box<ReplayArgs>),
    /// Check a replay's output: OUT/changes applied in order must equal snapshot + changes.
    Verify {
        /// The dataset directory.
        dataset: PathBuf,
        /// The replay's output directory.
        out: PathBuf,
        /// Where the verification's sort spills, in a scratch directory of its own removed
        /// on every exit [default: TMPDIR, or /tmp].
        #[arg(long, value_name = "DIR")]
        tmp: Option<PathBuf>,
    },
    /// Write a dataset (dataset.json, snapshot/, changes/).
    Gen(GenArgs),
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The dataset directory.
    dataset: PathBuf,
    /// Output directory, or an object storage URL (s3://BUCKET/PATH, gs://, az://; configured
    /// by the standard environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...): each committed
    /// checkpoint is uploaded beside it (OUT/_backfill-state) and its file then published
    /// once, readers never see an uncommitted one, one writer holds the output, and the same
    /// command on an empty machine restores the latest checkpoint [default: out/DATASET-NAME].
    #[arg(long)]
    out: Option<PathBuf>,
    /// For an output on object storage: the local directory of the state and of the files on
    /// their way, needed to resume [default: out/cache/<the URL as a name>].
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// For an output on object storage: where its checkpoints go (an object storage URL)
    /// [default: OUT/_backfill-state; a shard's in URL/shard-I-of-N]. Each committed
    /// checkpoint's state files are uploaded
    /// beside the output, so the same command on another machine, with an empty --cache,
    /// restores the latest checkpoint and resumes from it.
    #[arg(long, value_name = "URL")]
    checkpoint_url: Option<PathBuf>,
    /// State directory of the durable store [default: OUT/state]. Running the same command
    /// again after any stop resumes from the last committed checkpoint.
    #[arg(long, conflicts_with = "memory")]
    state: Option<PathBuf>,
    /// Keep the state in memory instead (faster, not resumable).
    #[arg(long)]
    memory: bool,
    /// Compress the bodies of the state's new run files (LZ4 about a third of the size,
    /// zstd smaller, each slower to write; BENCHMARKS.md): for a table whose state would
    /// not fit the disk. A state written with any setting is read with any other.
    #[arg(long, value_enum, default_value_t = CompressionArg::None)]
    state_compression: CompressionArg,
    /// Discard the state and output of an earlier run instead of resuming it.
    #[arg(long)]
    fresh: bool,
    /// Vnodes of the upstream table (1 to 32768).
    #[arg(long, default_value_t = 256, value_parser = parse_vnodes)]
    vnodes: usize,
    /// Rows per snapshot batch and per change chunk (1 to 16777216).
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE, value_parser = parse_batch_size)]
    batch_size: usize,
    /// Snapshot order: one key-ordered stream (merged) or per-vnode batches, one vnode after
    /// the other (vnode).
    #[arg(long, value_enum, default_value_t = OrderArg::Merged)]
    order: OrderArg,
    /// Make every N-th barrier a checkpoint (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_every: u64,
    /// Also inject a barrier every N milliseconds (and pace barriers after the changelog).
    #[arg(long)]
    barrier_interval_ms: Option<u64>,
    /// Snapshot rows per second (at least 1; leave out for no limit).
    #[arg(long, value_parser = parse_rate)]
    rate_limit: Option<u64>,
    /// Changelog rows per second, so that the changelog really overlaps the backfill (at
    /// least 1; leave out for no limit).
    #[arg(long, value_parser = parse_rate)]
    upstream_rate: Option<u64>,
    /// Backfill actors, each a task over an even share of the vnodes (1 to the vnode count)
    /// [default: the number of cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    parallelism: Option<u64>,
    /// Rescale online to N actors at the first checkpoint at or after the barrier that
    /// closes dataset epoch EPOCH (repeatable).
    #[arg(long, value_name = "EPOCH:N")]
    rescale: Vec<RescalePoint>,
    /// Progress display [default: bar on a terminal, plain otherwise].
    #[arg(long, value_enum)]
    progress: Option<ProgressArg>,
    /// After the run, check the output against snapshot + changes (for a shard: the whole
    /// output, so every shard must have finished).
    #[arg(long)]
    verify: bool,
    /// Replay only shard I of N (I from 0 to N-1): the I-th of N even vnode ranges (N at
    /// most --vnodes), into OUT/changes/epoch-E.shard-I-of-N.parquet, state in
    /// OUT/state.shard-I-of-N. `auto`: I (and N where given) from the batch scheduler's
    /// environment: JOB_COMPLETION_INDEX (Kubernetes indexed Job), SLURM_ARRAY_TASK_ID
    /// minus SLURM_ARRAY_TASK_MIN with N = SLURM_ARRAY_TASK_COUNT (Slurm array),
    /// AWS_BATCH_JOB_ARRAY_INDEX (AWS Batch array job); N from --shards or BACKFILL_SHARDS
    /// where the scheduler does not give it. A shard's state and output never take
    /// another I or N.
    #[arg(long, value_name = "I/N|auto")]
    shard: Option<ShardArg>,
    /// With --shard auto: the number of shards N (or BACKFILL_SHARDS).
    #[arg(long, value_name = "N", requires = "shard", value_parser = clap::value_parser!(u32).range(1..))]
    shards: Option<u32>,
    /// Where the dataset's validation (and `--verify`) spill their sorted runs, in scratch
    /// directories of their own removed on every exit [default: TMPDIR, or /tmp].
    #[arg(long, value_name = "DIR")]
    tmp: Option<PathBuf>,
    /// Snapshot rows per durable load step (tests: many steps on a small dataset).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    load_step_rows: Option<u64>,
}

/// `--shard`: `I/N`, or `auto` (from the scheduler's environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardArg {
    Given(Shard),
    Auto,
}

impl std::str::FromStr for ShardArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(ShardArg::Auto);
        }
        s.parse().map(ShardArg::Given).map_err(|e| e.to_string())
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OrderArg {
    Merged,
    Vnode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CompressionArg {
    None,
    Lz4,
    Zstd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProgressArg {
    Bar,
    Plain,
    None,
}

#[derive(Debug, clap::Args)]
struct GenArgs {
    /// What to generate.
    #[arg(value_enum)]
    kind: GenKindArg,
    /// The dataset directory to create (must not exist or be empty).
    #[arg(long)]
    out: PathBuf,
    /// Scale: TPC-H scale factor, or 100k rows per unit for synthetic (positive; the range
    /// per kind is checked by `gen`).
    #[arg(long, default_value_t = 0.01, value_parser = parse_scale)]
    scale: f64,
    /// Changelog rows [default: 20% of the snapshot].
    #[arg(long)]
    changes: Option<u64>,
    /// Upstream epochs the changelog spans (at least 1).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Seed of the changelog (and of synthetic data).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Key shape of a synthetic dataset.
    #[arg(long, value_enum, default_value_t = ShapeArg::Int64)]
    shape: ShapeArg,
    /// Skewed synthetic keys (many rows crowded in few vnodes).
    #[arg(long)]
    skew: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum GenKindArg {
    TpchLineitem,
    TpchOrders,
    Synthetic,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ShapeArg {
    /// One Int64 key column.
    Int64,
    /// (Utf8, Int32 descending) key distributed by the Utf8 column.
    Composite,
}

/// The summary's line of a restore from object storage.
fn restored_line(r: &crate::job::checkpoint::Restored) -> String {
    format!(
        "  restored          checkpoint {} (epoch {}) from object storage: {} files, {:.1} MB in \
         {:.2} s",
        r.seq,
        r.committed_epoch.map_or("none".into(), |e| e.to_string()),
        r.files,
        r.bytes as f64 / 1e6,
        r.seconds
    )
}

/// The `q` quantile (0 to 1, nearest rank) of `values`; 0 when there are none.
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n => sorted[((n as f64 * q).ceil() as usize).clamp(1, n) - 1],
    }
}

/// `--vnodes`: `1..=32768`.
fn parse_vnodes(s: &str) -> std::result::Result<usize, String> {
    parse_in_range(s, 1, VnodeCount::MAX as u64).map(|n| n as usize)
}

/// `--batch-size`: `1..=MAX_BATCH_SIZE` rows (larger batches only cost memory).
fn parse_batch_size(s: &str) -> std::result::Result<usize, String> {
    parse_in_range(s, 1, MAX_BATCH_SIZE as u64).map(|n| n as usize)
}

/// `--rate-limit`, `--upstream-rate`: at least 1 row per second. 0 would pause that side
/// for good, so the replay would never finish.
fn parse_rate(s: &str) -> std::result::Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err(
            "0 rows/s would pause it for good and the replay would never finish; \
                      give at least 1, or leave the option out for no limit"
                .into(),
        ),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a number of rows per second: {e}")),
    }
}

/// `gen --scale`: a finite positive number.
fn parse_scale(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is not a positive finite scale")),
        Err(e) => Err(format!("not a number: {e}")),
    }
}

fn parse_in_range(s: &str, min: u64, max: u64) -> std::result::Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is not in {min}..={max}")),
        Err(e) => Err(format!("not a whole number in {min}..={max}: {e}")),
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    name_rayon_threads();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Names rayon's global pool's threads `backfill-par-N` (Linux keeps 15 bytes of a name).
/// Unnamed, they take the name of the thread that first used rayon (Linux copies a new
/// thread's name from its creator), and a per-thread profile then credits the sink's column
/// encoding and the load's gathers to, say, `backfill-extsort`. Best effort: a pool that
/// could not be built this way is built with rayon's defaults at its first use.
fn name_rayon_threads() {
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("backfill-par-{i}"))
        .build_global();
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Replay(args) => replay(*args),
        Command::Verify { dataset, out, tmp } => {
            // Kept until the command ends: a signal meanwhile removes the sort's scratch.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("backfill-signal")
                .enable_all()
                .build()?;
            exit_on_signal(&runtime);
            let dataset = open_dataset(&dataset)?;
            let report = verify_with(&dataset, &out, &sort_options(tmp.as_deref()))?;
            say!(
                "verified: {} output rows in {} files give the expected {} rows",
                report.output_rows,
                report.output_files,
                report.final_rows
            );
            if let Some(line) = shards_line(&report) {
                say!("{line}");
            }
            check_certificate(&dataset, &out)
        }
        Command::Gen(args) => {
            let kind = match args.kind {
                GenKindArg::TpchLineitem => GenKind::TpchLineitem,
                GenKindArg::TpchOrders => GenKind::TpchOrders,
                GenKindArg::Synthetic => GenKind::Synthetic {
                    shape: match args.shape {
                        ShapeArg::Int64 => SyntheticShape::Int64,
                        ShapeArg::Composite => SyntheticShape::Composite,
                    },
                    skew: args.skew,
                },
            };
            let mut options = GenOptions::new(&kind, args.scale);
            if let Some(changes) = args.changes {
                options.changes = changes;
            }
            options.epochs = args.epochs;
            options.seed = args.seed;
            let started = Instant::now();
            let summary = generate(&kind, &args.out, &options)?;
            say!(
                "wrote {}: {} snapshot rows, {} changes over {} epochs in {:.1?}",
                args.out.display(),
                summary.snapshot_rows,
                summary.change_rows,
                summary.epochs,
                started.elapsed()
            );
            Ok(())
        }
    }
}

/// Opens a dataset and warns, on stderr, about every file it skips.
fn open_dataset(dir: &std::path::Path) -> Result<Dataset> {
    let dataset = Dataset::open(dir)?;
    for path in dataset.skipped_files() {
        eprintln!(
            "warning: skipping {} (names starting with `_` or `.` are not read)",
            path.display()
        );
    }
    Ok(dataset)
}

fn replay(args: ReplayArgs) -> Result<()> {
    // Signals are caught from the start, so an early Ctrl-C also ends with a clean message.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let interrupted = shutdown_signal(&runtime);
    let dataset = open_dataset(&args.dataset)?;
    let out = (args.out.as_ref())
        .map(|out| crate::replay::storage::local_or_url(&out.to_string_lossy()))
        .unwrap_or_else(|| default_out_dir(&dataset));
    let shard = match args.shard {
        None => None,
        Some(ShardArg::Given(shard)) => {
            if let Some(n) = args.shards.filter(|n| *n != shard.count()) {
                return Err(crate::error::Error::config(format!(
                    "--shard {shard} is one of {} shards, but --shards says {n}",
                    shard.count()
                )));
            }
            Some(shard)
        }
        Some(ShardArg::Auto) => Some(Shard::from_env(args.shards)?),
    };
    let mut options = ReplayOptions::new(out.clone());
    options.state = match (args.memory, &args.state) {
        (true, _) => StateChoice::Memory,
        (false, Some(dir)) => StateChoice::Durable(dir.clone()),
        (false, None) => StateChoice::Durable(out.join(STATE_DIR)),
    };
    let mut options = options.with_shard(shard);
    options.fresh = args.fresh;
    let options = ReplayOptions {
        vnodes: VnodeCount::new(args.vnodes)?,
        batch_size: args.batch_size,
        order: match args.order {
            OrderArg::Merged => SnapshotOrder::Merged,
            OrderArg::Vnode => SnapshotOrder::PerVnode,
        },
        checkpoint_every: args.checkpoint_every,
        barrier_interval: args.barrier_interval_ms.map(Duration::from_millis),
        rate_limit: args.rate_limit,
        upstream_rate: args.upstream_rate,
        parallelism: match args.parallelism {
            Some(n) if n > args.vnodes as u64 => {
                return Err(crate::error::Error::config(format!(
                    "--parallelism {n} exceeds the {} vnodes: choose 1 to {}",
                    args.vnodes, args.vnodes
                )));
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => default_parallelism().min(args.vnodes),
        },
        shard,
        rescales: args.rescale.clone(),
        scratch: scratch_dir(args.tmp.as_deref()),
        cache: args.cache.clone(),
        checkpoint_url: (args.checkpoint_url.as_ref())
            .map(|url| crate::replay::storage::local_or_url(&url.to_string_lossy())),
        load_step_rows: args.load_step_rows,
        durable: store::DurableOptions {
            compression: match args.state_compression {
                CompressionArg::None => store::StateCompression::None,
                CompressionArg::Lz4 => store::StateCompression::Lz4,
                CompressionArg::Zstd => store::StateCompression::Zstd,
            },
            ..options.durable
        },
        ..options
    };
    let mode = args.progress.unwrap_or(if std::io::stderr().is_terminal() {
        ProgressArg::Bar
    } else {
        ProgressArg::Plain
    });
    let mut display = ProgressDisplay::new(mode, args.vnodes as u64);
    let summary = runtime.block_on(run_replay_until(
        &dataset,
        &options,
        |p| display.update(p),
        interrupted,
    ));
    display.finish();
    if let Err(crate::error::Error::Interrupted { .. }) = &summary {
        // No sort outlives the job today; one that did would end with the process.
        remove_scratch();
    }
    let summary = summary?;
    if summary.already_finished {
        let finish = summary.finish_record.as_ref();
        say!(
            "replay of {} already finished (dataset epoch {}, checkpoint {}): its output is \
             complete in {} (its committed files checked); use --fresh to run it again",
            dataset.name(),
            finish.map_or(summary.last_epoch, |f| f.epoch),
            summary.resumed_from.unwrap_or(0),
            out.join("changes").display()
        );
        if let Some(finish) = finish {
            say!("  certificate       {}", finish.certificate);
        }
        if let Some(r) = &summary.restored {
            say!("{}", restored_line(r));
        }
    } else {
        print_summary(dataset.name(), &summary);
    }
    if args.verify {
        // A signal now ends the process: the verification cannot stop between steps.
        exit_on_signal(&runtime);
        let report = verify_with(&dataset, &out, &sort_options(args.tmp.as_deref()))?;
        say!(
            "verified: the output applies cleanly and equals snapshot + changes ({} rows)",
            report.final_rows
        );
        if let Some(line) = shards_line(&report) {
            say!("{line}");
        }
        check_certificate(&dataset, &out)?;
    }
    Ok(())
}

/// Computes the completion certificate of the output in `out` from the files alone (the
/// output's changes against the dataset's snapshot and changes, per vnode), prints it, and
/// fails on a mismatch.
fn check_certificate(dataset: &Dataset, out: &std::path::Path) -> Result<()> {
    let c = certify_output(dataset, out)?;
    say!("{}", certificate_line(&c));
    if c.matches() {
        Ok(())
    } else {
        Err(crate::error::Error::CertificateMismatch {
            out: out.to_path_buf(),
            message: c.describe(),
        })
    }
}

/// What `verify` saw of a sharded output: "  shards            0/2, 1/2 (all 2)".
fn shards_line(report: &crate::replay::VerifyReport) -> Option<String> {
    let seen = report.shards.as_ref()?;
    let names: Vec<String> = seen.iter().map(|s| s.to_string()).collect();
    let count = seen.first().map_or(0, |s| s.count());
    Some(format!(
        "  shards            {} (all {count}, checked together)",
        names.join(", ")
    ))
}

/// The summary line of a completion certificate.
fn certificate_line(c: &Certificate) -> String {
    if c.matches() {
        format!("  certificate       {}", c.describe())
    } else {
        format!("  certificate       MISMATCH: {}", c.describe())
    }
}

/// Installs SIGINT, SIGTERM and SIGHUP handlers (in `runtime`'s context) and returns a
/// future that completes on the first of them (never, if the handlers cannot be installed).
fn shutdown_signal(
    runtime: &tokio::runtime::Runtime,
) -> impl std::future::Future<Output = Interrupt> + use<> {
    use tokio::signal::unix::{SignalKind, signal};
    let _context = runtime.enter();
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    async move {
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) = handlers else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = int.recv() => Interrupt::Interrupt,
            _ = term.recv() => Interrupt::Terminate,
            _ = hup.recv() => Interrupt::Hangup,
        }
    }
}

/// Ends the process on SIGINT, SIGTERM or SIGHUP, with status 128 + the signal, after
/// removing the scratch directories of its external sorts: for `verify`, a synchronous pass
/// that cannot stop between steps, whose scratch (up to the size of the data) would
/// otherwise stay behind. The handlers run on `runtime`, which must outlive the pass.
fn exit_on_signal(runtime: &tokio::runtime::Runtime) {
    let signal = shutdown_signal(runtime);
    runtime.spawn(async move {
        let signal = signal.await;
        remove_scratch();
        eprintln!(
            "error: interrupted by {}; the scratch files were removed",
            signal.name()
        );
        std::process::exit(i32::from(signal.exit_code()));
    });
}

/// Removes this process's sort scratch directories, saying which it could not.
fn remove_scratch() {
    for dir in remove_all_scratch() {
        eprintln!("warning: could not remove scratch {}", dir.display());
    }
}

/// The environment variable that sets the memory budget of `verify`'s sorts, in bytes: for
/// tests, which need a sort that spills on a small dataset. Not a user option.
const TEST_SORT_MEMORY_ENV: &str = "BACKFILL_TEST_SORT_MEMORY";

/// Where the sorts spill: `--tmp DIR`, or `TMPDIR` (or `/tmp`).
fn scratch_dir(tmp: Option<&std::path::Path>) -> PathBuf {
    tmp.map_or_else(std::env::temp_dir, std::path::Path::to_path_buf)
}

/// Where `verify` spills ([`scratch_dir`]) and how much memory its sorts use (the default,
/// or [`TEST_SORT_MEMORY_ENV`]).
fn sort_options(tmp: Option<&std::path::Path>) -> ExternalSortOptions {
    let options = ExternalSortOptions::new(scratch_dir(tmp));
    match std::env::var(TEST_SORT_MEMORY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(bytes) => options.with_memory_budget(bytes),
        None => options,
    }
}

/// `n` with a comma every three digits: 4,800,000.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_summary(name: &str, s: &ReplaySummary) {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let rows = s.snapshot_rows + s.upstream_changes;
    say!(
        "replay of {name} done in {:.2?} (snapshot load {:.2?})",
        s.elapsed,
        s.load_time
    );
    if let Some(rows) = s.load_resumed_at {
        say!(
            "  load resumed at {} of {} rows (committed by a stopped run's load steps)",
            thousands(rows),
            thousands(s.snapshot_rows)
        );
        match s.validation_start {
            Some(ValidationStart::Resumed(rows)) => say!(
                "  validation resumed at {} of {} snapshot rows (its checkpoint in that step)",
                thousands(rows),
                thousands(s.snapshot_rows)
            ),
            Some(ValidationStart::FromStart) => {
                say!("  validation started over (no usable checkpoint of it was committed)")
            }
            Some(ValidationStart::Recorded) | None => {}
        }
    }
    if let Some((shard, range)) = &s.shard {
        say!(
            "  shard             {shard}  (vnodes {}..{}; this shard's rows only)",
            range.start,
            range.end
        );
    }
    if let Some(r) = &s.restored {
        say!("{}", restored_line(r));
    }
    if let Some(epoch) = s.resumed_from {
        say!(
            "  resumed from checkpoint epoch {epoch} ({} changes already applied)",
            s.changes_already_applied
        );
    }
    say!("  snapshot rows     {:>12}", s.snapshot_rows);
    say!("  upstream changes  {:>12}", s.upstream_changes);
    say!(
        "  output rows       {:>12}  in {} files under {}",
        s.output_rows,
        s.output_files,
        s.out.join("changes").display()
    );
    if let Some(uploaded) = s.uploaded_files {
        say!(
            "  published         {:>12}  files to {} (this run; each committed file once)",
            uploaded,
            s.out.display()
        );
    }
    if !s.commit_latencies.is_empty() {
        say!(
            "  commit latency    p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms  (barrier to published \
             file, per checkpoint)",
            percentile(&s.commit_latencies, 0.5) * 1e3,
            percentile(&s.commit_latencies, 0.99) * 1e3,
            percentile(&s.commit_latencies, 1.0) * 1e3
        );
    }
    if let Some(u) = &s.uploads {
        say!(
            "  checkpoints       {:>12}  uploaded ({:.1} MB; upload to commit p50 {:.0} ms, \
             p99 {:.0} ms, max {:.0} ms)",
            u.checkpoints,
            u.bytes as f64 / 1e6,
            percentile(&u.latencies, 0.5) * 1e3,
            percentile(&u.latencies, 0.99) * 1e3,
            percentile(&u.latencies, 1.0) * 1e3
        );
    }
    say!(
        "  epochs            {:>12}  ({} checkpoints)",
        s.epochs,
        s.checkpoints
    );
    say!(
        "  actors            {:>12}  (vnodes each: {:?}; {} online rescales, longest pause {:.1?} \
         of which restart {:.1?})",
        s.actors.len(),
        s.actors,
        s.rescales,
        s.rescale_pause_max,
        s.rescale_restart_max
    );
    if let Some(c) = &s.certificate {
        say!("{}", certificate_line(c));
    }
    if let Some(checkpoint) = s.final_checkpoint {
        say!(
            "  output complete   up to dataset epoch {} (the replay's internal barrier epoch {checkpoint})",
            s.last_epoch
        );
    }
    say!("  throughput        {:>12.0}  rows/s", rows as f64 / secs);
}

/// The live progress: an indicatif bar, a line a second, or nothing.
enum ProgressDisplay {
    Bar(ProgressBar, u64),
    /// The time of the last line, the vnode count, the load's committed rows of the last
    /// line (a line each second, and one each committed load step).
    Plain(Instant, u64, u64),
    None,
}

impl ProgressDisplay {
    fn new(mode: ProgressArg, vnodes: u64) -> Self {
        match mode {
            ProgressArg::Bar => {
                let bar = ProgressBar::new(0);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} snapshot \
                         rows ({rate}, ETA {eta}) {msg}",
                    )
                    .map(|style| {
                        style.with_key(
                            "rate",
                            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                                let _ = write!(w, "{:.0} rows/s", state.per_sec());
                            },
                        )
                    })
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                ProgressDisplay::Bar(bar, vnodes)
            }
            ProgressArg::Plain => ProgressDisplay::Plain(Instant::now(), vnodes, 0),
            ProgressArg::None => ProgressDisplay::None,
        }
    }

    fn update(&mut self, p: &ReplayProgress) {
        if let Some(load) = &p.load {
            self.update_load(load);
            return;
        }
        match self {
            ProgressDisplay::Bar(bar, vnodes) => {
                // `rows_total` is never below `rows_read`: the bar stays within 100%.
                bar.set_length(p.job.rows_total);
                bar.set_position(p.job.rows_read);
                bar.set_message(format!(
                    "| vnodes done {}/{} | actors {} | upstream changes {} | output rows {}{}",
                    p.job.vnodes.completed,
                    vnodes,
                    p.job.actors.len(),
                    p.upstream_changes,
                    p.output_rows,
                    p.job
                        .slowest_vnodes
                        .first()
                        .map_or_else(String::new, |s| format!(
                            " | slowest vnode {} (since epoch {})",
                            s.vnode, s.since_epoch
                        ))
                ));
            }
            ProgressDisplay::Plain(last, vnodes, _) => {
                if last.elapsed() >= Duration::from_secs(1) {
                    *last = Instant::now();
                    let j = &p.job;
                    let actors: Vec<String> = j.actors.iter().map(|a| a.rows.to_string()).collect();
                    let eta = j
                        .eta
                        .map_or_else(|| "?".to_string(), |eta| format!("{:.0?}", eta));
                    let slowest: Vec<String> = j
                        .slowest_vnodes
                        .iter()
                        .map(|s| {
                            format!(
                                "{} since epoch {} ({} rows)",
                                s.vnode, s.since_epoch, s.rows
                            )
                        })
                        .collect();
                    eprintln!(
                        "snapshot {}/{} rows ({:.0} rows/s, ETA {eta}), vnodes done {}/{} \
                         (in progress {}, not started {}), actor rows [{}], slowest vnodes [{}], \
                         upstream changes {}, output rows {}, epoch {}",
                        j.rows_read,
                        j.rows_total,
                        j.rate,
                        j.vnodes.completed,
                        vnodes,
                        j.vnodes.in_progress,
                        j.vnodes.not_started,
                        actors.join(", "),
                        slowest.join(", "),
                        p.upstream_changes,
                        p.output_rows,
                        j.epoch
                    );
                }
            }
            ProgressDisplay::None => {}
        }
    }

    /// The snapshot load's progress.
    fn update_load(&mut self, load: &LoadReport) {
        let of = load
            .snapshot_rows
            .map_or_else(String::new, |total| format!("/{total}"));
        match self {
            ProgressDisplay::Bar(bar, _) => {
                if let Some(total) = load.snapshot_rows {
                    bar.set_length(total);
                }
                bar.set_position(load.rows_loaded);
                bar.set_message(format!(
                    "| loading the snapshot, {} rows committed",
                    load.rows_committed
                ));
            }
            ProgressDisplay::Plain(last, _, committed) => {
                if last.elapsed() >= Duration::from_secs(1) || load.rows_committed > *committed {
                    *last = Instant::now();
                    *committed = load.rows_committed;
                    eprintln!(
                        "load {}{of} snapshot rows, {} committed (a kill now keeps those)",
                        load.rows_loaded, load.rows_committed
                    );
                }
            }
            ProgressDisplay::None => {}
        }
    }

    fn finish(&self) {
        if let ProgressDisplay::Bar(bar, _) = self {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The index the binary sets is mimalloc's purge delay (read back with its default of
    /// 1000 ms in mimalloc v3, nothing else's value), and setting it takes effect although
    /// mimalloc read its options before the test started. The only test touching it.
    #[test]
    #[expect(unsafe_code, reason = "reading a mimalloc option; see SAFETY")]
    fn the_purge_delay_is_mimallocs_and_is_set() {
        if purge_delay_in_environment() {
            return;
        }
        // SAFETY: reads an option; no other test of this binary touches mimalloc options.
        let delay = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(delay(), 1000);
        keep_freed_memory();
        assert_eq!(delay(), -1);
    }

    #[test]
    fn unknown_progress_mode_is_a_usage_error() {
        let err =
            Cli::try_parse_from(["backfill", "replay", "d", "--progress", "loud"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn bad_input_errors_exit_two() {
        use crate::error::Error;
        let e = Error::from(crate::error::EngineError::InvalidChunk("x".into()));
        assert!(e.is_bad_input());
        assert!(!crate::error::internal!("x").is_bad_input());
    }
}
