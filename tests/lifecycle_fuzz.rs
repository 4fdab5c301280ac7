//! The tool's directory life cycle, fuzzed end to end with the real binary (issue 41):
//! seeded random sequences of replays into shared and separate `--out` / `--state`
//! directories (`--memory`, `--fresh`, random options), replays killed with SIGKILL or
//! stopped by SIGINT / SIGTERM / SIGHUP at random moments, published output files deleted,
//! altered or truncated, dataset files rewritten in place, and `backfill verify`.
//!
//! After every step:
//! - a replay that exits 0 (also one that says "already finished") left an output that
//!   `backfill verify` accepts and that an **independent reader** (the `parquet` crate read
//!   directly, each published `changes/epoch-<20 digits>.parquet` applied in file order to a
//!   map keyed by the primary key) finds exactly once and equal to the dataset's final table
//!   (its snapshot, then its changelog, applied the same way);
//! - a `verify` that exits 0 is confirmed by the same reader;
//! - the only other exit statuses are the documented ones: 2 (a refusal), 3 (a certificate
//!   mismatch), 128 + the signal the test sent; never 1, never a panic;
//! - a refused run (2 or 3) changed nothing: the published files and job record of its
//!   output are the same bytes as before, each state directory that committed data still
//!   belongs to the same job, and its message never calls a state corrupt (no step here
//!   touches a state directory);
//! - no run touches the published files of an output it was not pointed at, and a run
//!   without `--fresh` removes or changes none of its own output's unless they are an
//!   in-memory job's (which the next run redoes), however it ends.
//!
//! At the end of a sequence, `--fresh` recovers every output (exit 0, checked the same way).
//!
//! Seeds: `LIFECYCLE_FUZZ_SEEDS` = `N` (seeds 1..=N), `A..B` (inclusive) or `A,B,C`; the
//! default is 8 seeds. `LIFECYCLE_FUZZ_STEPS` sets the steps per sequence (default 12). A
//! failure names its seed and every step so far, and keeps its directory for inspection.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use arrow_array::{Array, Int8Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::cli::{bin, published, tmp_files};

/// How long any one command may take before the test calls it hung.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// The independent reader.

/// A row: each column's value, formatted (NULL distinct from any string).
type Row = Vec<String>;
/// A table: each row by its primary key.
type Table = BTreeMap<Row, Row>;

/// What a dataset's table looks like: its columns, which of them form the key.
#[derive(Debug, Clone)]
struct Spec {
    columns: Vec<String>,
    key: Vec<usize>,
}

const NULL: &str = "\u{0}NULL";

/// The rows of one Parquet file as `(op, row)`: `op` is the `_op` column, if there is one.
fn read_rows(path: &Path, spec: &Spec) -> Result<Vec<(Option<i8>, Row)>, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let options = FormatOptions::default().with_null(NULL);
    let mut rows = Vec::new();
    for batch in reader {
        let batch: RecordBatch = batch.map_err(|e| format!("{}: {e}", path.display()))?;
        let ops = match batch.column_by_name("_op") {
            Some(c) => Some(
                c.as_any()
                    .downcast_ref::<Int8Array>()
                    .ok_or_else(|| format!("{}: `_op` is not Int8", path.display()))?
                    .clone(),
            ),
            None => None,
        };
        let columns = spec
            .columns
            .iter()
            .map(|name| {
                batch
                    .column_by_name(name)
                    .ok_or_else(|| format!("{}: no column `{name}`", path.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let formatters = columns
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for i in 0..batch.num_rows() {
            let op = match &ops {
                Some(ops) if ops.is_null(i) => {
                    return Err(format!("{}: row {i}: NULL `_op`", path.display()));
                }
                Some(ops) => Some(ops.value(i)),
                None => None,
            };
            let row = formatters.iter().map(|f| f.value(i).to_string()).collect();
            rows.push((op, row));
        }
    }
    Ok(rows)
}

/// Applies one change (`_op` codes of `src/chunk.rs`: 1 insert, 2 delete, 3 the old row of
/// an update, 4 its new row) to `table`, exactly once: an insert of a present key, or a
/// delete of an absent key or of other values than the stored ones, is an error.
fn apply(table: &mut Table, spec: &Spec, op: i8, row: Row) -> Result<(), String> {
    let key: Row = spec.key.iter().map(|&i| row[i].clone()).collect();
    match op {
        1 | 4 => {
            if let Some(old) = table.insert(key.clone(), row) {
                return Err(format!("insert of key {key:?} already present as {old:?}"));
            }
        }
        2 | 3 => match table.remove(&key) {
            None => return Err(format!("delete of absent key {key:?}")),
            Some(old) if old != row => {
                return Err(format!("delete of {row:?} but the table holds {old:?}"));
            }
            Some(_) => {}
        },
        other => return Err(format!("op code {other}")),
    }
    Ok(())
}

/// The `.parquet` files of `dir` that a dataset reads, in name order.
fn dataset_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.ends_with(".parquet") && !name.starts_with('_') && !name.starts_with('.')
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// A dataset and its final table, computed here from its files.
struct Dataset {
    dir: PathBuf,
    spec: Spec,
    table: Table,
}

impl Dataset {
    fn open(dir: PathBuf) -> Self {
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("dataset.json")).unwrap()).unwrap();
        let key_names: Vec<String> = manifest["primary_key"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        let snapshot = dataset_files(&dir.join("snapshot"));
        let schema = ParquetRecordBatchReaderBuilder::try_new(File::open(&snapshot[0]).unwrap())
            .unwrap()
            .schema()
            .clone();
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let key = key_names
            .iter()
            .map(|k| columns.iter().position(|c| c == k).unwrap())
            .collect();
        let spec = Spec { columns, key };
        let mut table = Table::new();
        for file in &snapshot {
            for (_, row) in read_rows(file, &spec).unwrap() {
                apply(&mut table, &spec, 1, row).unwrap();
            }
        }
        for file in dataset_files(&dir.join("changes")) {
            for (op, row) in read_rows(&file, &spec).unwrap() {
                apply(&mut table, &spec, op.unwrap(), row).unwrap();
            }
        }
        Self { dir, spec, table }
    }

    /// The dataset's own files (snapshot and changes).
    fn files(&self) -> Vec<PathBuf> {
        let mut files = dataset_files(&self.dir.join("snapshot"));
        files.extend(dataset_files(&self.dir.join("changes")));
        files
    }
}

/// The table the published files of `out` net to, each change applied exactly once, read
/// with `spec`.
fn net_table(spec: &Spec, out: &Path) -> Result<Table, String> {
    let mut table = Table::new();
    for file in &published(out) {
        for (i, (op, row)) in read_rows(file, spec)?.into_iter().enumerate() {
            let op = op.ok_or_else(|| format!("{}: no `_op` column", file.display()))?;
            apply(&mut table, spec, op, row)
                .map_err(|e| format!("{}, row {i}: {e}", file.display()))?;
        }
    }
    Ok(table)
}

/// No `.tmp` file left in `out/changes` (a run that ended by itself, or by its signal
/// handler, leaves nothing half-written).
fn no_tmp(out: &Path) -> Result<(), String> {
    match tmp_files(out).first() {
        Some(name) => Err(format!("{name} left in {}", out.display())),
        None => Ok(()),
    }
}

/// The output of a stopped run, read independently: whatever it holds (the committed
/// checkpoints of one job, or a prefix of an older output being removed) applies exactly
/// once, and comes from one of `datasets` (by its columns).
fn partial_check(datasets: &[Dataset], out: &Path) -> Result<(), String> {
    let Some(first) = published(out).into_iter().next() else {
        return Ok(());
    };
    let builder = File::open(&first)
        .map_err(|e| e.to_string())
        .and_then(|f| ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| e.to_string()))
        .map_err(|e| format!("{}: {e}", first.display()))?;
    let columns: Vec<String> = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != "_epoch" && n != "_op")
        .collect();
    let dataset = datasets
        .iter()
        .find(|d| d.spec.columns == columns)
        .ok_or_else(|| format!("{}: columns {columns:?} of no dataset", first.display()))?;
    net_table(&dataset.spec, out).map(|_| ())
}

/// The epoch of the last published file of `out`.
fn last_published_epoch(out: &Path) -> Option<u64> {
    let last = published(out).pop()?;
    let name = last.file_name()?.to_str()?;
    name.strip_prefix("epoch-")?
        .strip_suffix(".parquet")?
        .parse()
        .ok()
}

/// The number right after the first `needle` in `text`.
fn number_after(text: &str, needle: &str) -> Option<u64> {
    let at = text.find(needle)? + needle.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// No published file of `out` is of a later checkpoint than `epoch`, the last one the run
/// says it committed.
fn published_up_to(out: &Path, epoch: Option<u64>, ran: &Ran) -> Result<(), String> {
    match (epoch, last_published_epoch(out)) {
        (Some(epoch), Some(last)) if last > epoch => Err(format!(
            "the run says it committed up to epoch {epoch}, but {} holds a file of epoch \
             {last}\n{}",
            out.display(),
            ran.text()
        )),
        _ => Ok(()),
    }
}

/// Reads `out` independently and compares it with `dataset`'s final table.
fn independent_check(dataset: &Dataset, out: &Path) -> Result<(), String> {
    let table = net_table(&dataset.spec, out)?;
    no_tmp(out)?;
    if table == dataset.table {
        return Ok(());
    }
    let missing: Vec<_> = dataset
        .table
        .keys()
        .filter(|k| !table.contains_key(*k))
        .collect();
    let extra: Vec<_> = table
        .keys()
        .filter(|k| !dataset.table.contains_key(*k))
        .collect();
    let differ: Vec<_> = table
        .iter()
        .filter(|(k, v)| dataset.table.get(*k).is_some_and(|w| w != *v))
        .map(|(k, _)| k)
        .collect();
    Err(format!(
        "{} files in {} net to {} rows, the dataset has {}: {} missing (e.g. {:?}), {} extra \
         (e.g. {:?}), {} with other values (e.g. {:?})",
        published(out).len(),
        out.display(),
        table.len(),
        dataset.table.len(),
        missing.len(),
        missing.first(),
        extra.len(),
        extra.first(),
        differ.len(),
        differ.first()
    ))
}

// ---------------------------------------------------------------------------------------
// Running the binary.

/// What a command did.
struct Ran {
    command: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn text(&self) -> String {
        format!(
            "$ {}\n{}\nstdout:\n{}stderr:\n{}",
            self.command,
            self.describe(),
            self.stdout,
            self.stderr
        )
    }

    fn describe(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            _ => format!("{:?}", self.status),
        }
    }

    /// One line: the status and the first line of stderr.
    fn brief(&self) -> String {
        let first = self.stderr.lines().next().unwrap_or("").trim();
        let first = if first.chars().count() > 160 {
            format!("{}...", first.chars().take(160).collect::<String>())
        } else {
            first.to_string()
        };
        if first.is_empty() {
            self.describe()
        } else {
            format!("{} ({first})", self.describe())
        }
    }
}

/// How a spawned command is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// Left to run to its end.
    Never,
    /// Sent `signal` (`KILL`, `INT`, `TERM`, `HUP`) after `after`.
    Signal { name: &'static str, after: Duration },
}

/// Runs the binary with `args` (stdout and stderr to files in `logs`, `TMPDIR` = `scratch`),
/// stopped as `stop` says; a command that runs past [`COMMAND_TIMEOUT`] is killed and
/// reported as hung.
fn run(args: &[String], stop: Stop, logs: &Path, scratch: &Path) -> Result<Ran, String> {
    let command = format!("backfill {}", args.join(" "));
    let stdout_path = logs.join("stdout");
    let stderr_path = logs.join("stderr");
    let mut child = bin()
        .args(args)
        .env("TMPDIR", scratch)
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path).unwrap())
        .stderr(File::create(&stderr_path).unwrap())
        .spawn()
        .map_err(|e| format!("{command}: {e}"))?;
    let started = Instant::now();
    let mut signalled = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if let Stop::Signal { name, after } = stop
            && !signalled
            && started.elapsed() >= after
        {
            // Not yet reaped, so the id is still this child's. A child that ended meanwhile
            // is not signalled (`kill` fails): the next poll sees its status.
            Command::new("kill")
                .args([format!("-{name}"), child.id().to_string()])
                .stderr(Stdio::null())
                .status()
                .unwrap();
            signalled = true;
        }
        if started.elapsed() > COMMAND_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{command}: still running after {COMMAND_TIMEOUT:?} (signalled: {signalled}); \
                 stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Ran {
        command,
        status,
        stdout: std::fs::read_to_string(&stdout_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    })
}

/// Why a run was refused, in a few words (for the summary).
fn reason(stderr: &str) -> &'static str {
    const REASONS: [(&str, &str); 12] = [
        ("holds no output of it", "state of another output"),
        ("now holds the output of", "output of another state"),
        ("holds the output of job", "output of another job"),
        ("is missing", "committed file missing"),
        ("was changed after checkpoint", "committed file changed"),
        ("not a file this job committed", "file not committed"),
        ("lost committed checkpoints", "lost checkpoints"),
        ("files changed", "dataset changed"),
        ("was made for another replay", "state of another dataset"),
        ("MISMATCH", "certificate mismatch"),
        ("unreadable Parquet", "unreadable output file"),
        ("backfill knows", "unknown output files"),
    ];
    REASONS
        .iter()
        .find(|(needle, _)| stderr.contains(needle))
        .map_or("other", |(_, reason)| reason)
}

// ---------------------------------------------------------------------------------------
// Steps.

/// Where a replay keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateChoice {
    /// `OUT/state`.
    Default,
    /// `--state S<i>`.
    Dir(usize),
    /// `--memory`.
    Memory,
}

/// A replay's command line.
#[derive(Debug, Clone)]
struct ReplaySpec {
    dataset: usize,
    out: usize,
    state: StateChoice,
    fresh: bool,
    vnodes: u32,
    order: &'static str,
    parallelism: u32,
    checkpoint_every: u32,
    batch_size: u32,
    upstream_rate: Option<u32>,
    verify: bool,
}

#[derive(Debug, Clone)]
enum Step {
    /// A replay, stopped as `Stop` says.
    Replay(ReplaySpec, Stop),
    /// Delete a random published file of an output.
    DeleteFile { out: usize },
    /// Flip a byte of, or truncate, a random published file of an output.
    Damage { out: usize, truncate: bool },
    /// Rewrite a dataset file in place: the same bytes, a new modification time.
    Rewrite { dataset: usize },
    /// `backfill verify DATASET OUT`.
    Verify { dataset: usize, out: usize },
}

/// The job id of a state directory that committed data (holds a `run-*` file), read from
/// its manifest (`replay.job_id`, committed with the snapshot load).
///
/// Only this, not the state's bytes: opening a store legitimately removes what it never
/// committed (the run files of a killed run), its background compaction may rewrite the
/// manifest and log with the same content meanwhile, and a store that never committed
/// anything is started over by the next run.
fn state_job(dir: &Path) -> Option<String> {
    let has_runs = std::fs::read_dir(dir)
        .ok()?
        .any(|e| e.unwrap().file_name().to_string_lossy().starts_with("run-"));
    if !has_runs {
        return None;
    }
    let manifest = std::fs::read(dir.join("MANIFEST")).ok()?;
    let text = String::from_utf8_lossy(&manifest);
    let at = text.find("\"replay.job_id\":\"")? + 17;
    Some(
        text[at..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit())
            .collect(),
    )
}

/// What a refused run may not change: its output's published files and job record (their
/// bytes), and which job each state directory that committed data belongs to.
fn guarded(out: &Path, states: &[PathBuf]) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all: BTreeMap<PathBuf, Vec<u8>> = published(out)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    let record = out.join(".backfill-job");
    if let Ok(bytes) = std::fs::read(&record) {
        all.insert(record, bytes);
    }
    for state in states {
        if let Some(job) = state_job(state) {
            all.insert(state.join("MANIFEST: replay.job_id"), job.into_bytes());
        }
    }
    all
}

/// Whether the job record of `out` names an in-memory job (`"state": null`).
fn held_by_memory_job(out: &Path) -> bool {
    std::fs::read(out.join(".backfill-job"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|record| record.get("state").is_some_and(|s| s.is_null()))
}

/// How two snapshots of files differ, in a few lines.
fn difference(before: &BTreeMap<PathBuf, Vec<u8>>, after: &BTreeMap<PathBuf, Vec<u8>>) -> String {
    let mut lines = String::new();
    for (path, bytes) in before {
        match after.get(path) {
            None => writeln!(lines, "  removed {}", path.display()).unwrap(),
            Some(now) if now != bytes => writeln!(
                lines,
                "  changed {} ({} -> {} bytes)",
                path.display(),
                bytes.len(),
                now.len()
            )
            .unwrap(),
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        writeln!(lines, "  added {}", path.display()).unwrap();
    }
    lines
}

/// One sequence's directories and what the test knows about them.
struct World {
    scratch: PathBuf,
    logs: PathBuf,
    datasets: Vec<Dataset>,
    outs: Vec<PathBuf>,
    states: Vec<PathBuf>,
    /// Per output: the dataset whose complete output it holds, known from a replay that
    /// exited 0 with nothing done to the output since.
    complete: Vec<Option<usize>>,
    /// Per output: a step deleted or altered one of its files since a replay last exited 0
    /// there (a stopped run's output is then not necessarily consistent).
    damaged: Vec<bool>,
    /// Per output: the last replay's exit status was 2 (a user would try `--fresh` next).
    refused: Vec<bool>,
    /// The last replay, for "the same command again".
    last: Option<ReplaySpec>,
    /// Counts of what happened, by kind, for the summary.
    counts: BTreeMap<String, usize>,
}

impl World {
    fn new(root: &Path, rng: &mut StdRng) -> Self {
        let gen_args = [
            // An Int64 key.
            vec!["--epochs", "12", "--shape", "int64"],
            // A composite key distributed by its Utf8 column, one column descending.
            vec!["--epochs", "7", "--shape", "composite"],
        ];
        let scratch = root.join("tmp");
        let logs = root.join("logs");
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::create_dir_all(&logs).unwrap();
        let mut datasets = Vec::new();
        for (i, extra) in gen_args.iter().enumerate() {
            let dir = root.join(["a", "b"][i]);
            let seed = rng.random_range(0..1000u32).to_string();
            let mut args: Vec<String> = [
                "gen",
                "synthetic",
                "--out",
                dir.to_str().unwrap(),
                "--scale",
                "0.02",
                "--seed",
                &seed,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            let ran = run(&args, Stop::Never, &logs, &scratch).unwrap();
            assert!(ran.status.success(), "{}", ran.text());
            datasets.push(Dataset::open(dir));
        }
        Self {
            scratch,
            logs,
            datasets,
            outs: vec![root.join("o1"), root.join("o2")],
            states: vec![root.join("s1"), root.join("s2")],
            complete: vec![None, None],
            damaged: vec![false, false],
            refused: vec![false, false],
            last: None,
            counts: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: impl Into<String>) {
        *self.counts.entry(what.into()).or_default() += 1;
    }

    /// A replay's command line: the last one again (a resume, or a rerun of a finished
    /// job), the last one with one thing changed (another state, output or dataset, or
    /// `--fresh`: how a user mixes up directories), or a new one.
    fn random_replay(&self, rng: &mut StdRng) -> ReplaySpec {
        let fresh_chance = |out: usize| if self.refused[out] { 0.5 } else { 0.1 };
        let mut spec = match &self.last {
            Some(last) if rng.random_bool(0.7) => {
                let mut spec = last.clone();
                spec.fresh = rng.random_bool(fresh_chance(spec.out));
                if rng.random_bool(0.4) {
                    match rng.random_range(0..4) {
                        0 => spec.state = self.random_state(rng),
                        1 => spec.out = rng.random_range(0..self.outs.len()),
                        2 => spec.dataset = rng.random_range(0..self.datasets.len()),
                        _ => spec.fresh = !spec.fresh,
                    }
                }
                spec
            }
            _ => {
                let out = rng.random_range(0..self.outs.len());
                ReplaySpec {
                    dataset: usize::from(rng.random_bool(0.2)),
                    out,
                    state: self.random_state(rng),
                    fresh: rng.random_bool(fresh_chance(out)),
                    vnodes: if rng.random_bool(0.1) { 32 } else { 16 },
                    order: "merged",
                    parallelism: 1,
                    checkpoint_every: 1,
                    batch_size: 8192,
                    upstream_rate: None,
                    verify: false,
                }
            }
        };
        // The options that are not part of a job's identity, new at any run.
        spec.order = if rng.random_bool(0.5) {
            "merged"
        } else {
            "vnode"
        };
        spec.parallelism = rng.random_range(1..=4);
        spec.checkpoint_every = rng.random_range(1..=3);
        spec.batch_size = [64, 500, 8192][rng.random_range(0..3)];
        spec.upstream_rate = None;
        spec.verify = rng.random_bool(0.2);
        spec
    }

    fn random_state(&self, rng: &mut StdRng) -> StateChoice {
        match rng.random_range(0..5) {
            0 | 1 => StateChoice::Default,
            2 | 3 => StateChoice::Dir(rng.random_range(0..self.states.len())),
            _ => StateChoice::Memory,
        }
    }

    fn random_step(&self, rng: &mut StdRng) -> Step {
        let roll = rng.random_range(0..100);
        match roll {
            0..35 => Step::Replay(self.random_replay(rng), Stop::Never),
            35..65 => {
                let mut spec = self.random_replay(rng);
                // Slow enough that the signal lands part way: batches of 64 rows, the
                // changelog at a few hundred rows a second.
                spec.batch_size = 64;
                spec.upstream_rate = Some(rng.random_range(150..=800));
                spec.verify = false;
                let name = match rng.random_range(0..6) {
                    0..3 => "KILL",
                    3 => "INT",
                    4 => "TERM",
                    _ => "HUP",
                };
                let after = Duration::from_millis(rng.random_range(0..=1500));
                Step::Replay(spec, Stop::Signal { name, after })
            }
            65..74 => Step::DeleteFile {
                out: rng.random_range(0..self.outs.len()),
            },
            74..83 => Step::Damage {
                out: rng.random_range(0..self.outs.len()),
                truncate: rng.random_bool(0.4),
            },
            83..87 => Step::Rewrite {
                dataset: rng.random_range(0..self.datasets.len()),
            },
            _ => Step::Verify {
                dataset: rng.random_range(0..self.datasets.len()),
                out: rng.random_range(0..self.outs.len()),
            },
        }
    }

    fn replay_args(&self, spec: &ReplaySpec) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "replay".into(),
            self.datasets[spec.dataset].dir.display().to_string(),
            "--out".into(),
            self.outs[spec.out].display().to_string(),
            "--progress".into(),
            "none".into(),
        ];
        match spec.state {
            StateChoice::Default => {}
            StateChoice::Dir(i) => {
                args.extend(["--state".into(), self.states[i].display().to_string()])
            }
            StateChoice::Memory => args.push("--memory".into()),
        }
        if spec.fresh {
            args.push("--fresh".into());
        }
        for (option, value) in [
            ("--vnodes", spec.vnodes.to_string()),
            ("--order", spec.order.to_string()),
            ("--parallelism", spec.parallelism.to_string()),
            ("--checkpoint-every", spec.checkpoint_every.to_string()),
            ("--batch-size", spec.batch_size.to_string()),
        ] {
            args.extend([option.to_string(), value]);
        }
        if let Some(rate) = spec.upstream_rate {
            args.extend(["--upstream-rate".into(), rate.to_string()]);
        }
        if spec.verify {
            args.push("--verify".into());
        }
        args
    }

    /// Every state directory a run may touch: the two `--state` directories and each
    /// output's `state`.
    fn all_states(&self) -> Vec<PathBuf> {
        let mut states = self.states.clone();
        states.extend(self.outs.iter().map(|o| o.join("state")));
        states
    }

    fn run(&self, args: &[String], stop: Stop) -> Result<Ran, String> {
        run(args, stop, &self.logs, &self.scratch)
    }

    /// `backfill verify` of `out` against `dataset` must pass, and the independent reader
    /// must agree.
    fn check_complete(&self, dataset: usize, out: usize, why: &Ran) -> Result<(), String> {
        let ds = &self.datasets[dataset];
        let path = &self.outs[out];
        let args = vec![
            "verify".to_string(),
            ds.dir.display().to_string(),
            path.display().to_string(),
        ];
        let verify = self.run(&args, Stop::Never)?;
        if verify.code() != Some(0) {
            return Err(format!(
                "a run exited 0 but verify does not accept its output\n{}\n{}",
                why.text(),
                verify.text()
            ));
        }
        independent_check(ds, path).map_err(|e| {
            format!(
                "a run exited 0 but the independent reader disagrees: {e}\n{}",
                why.text()
            )
        })
    }

    /// Runs one step and checks the invariants; returns a line for the log.
    fn step(&mut self, step: &Step, rng: &mut StdRng) -> Result<String, String> {
        match step {
            Step::Replay(spec, stop) => self.replay(spec, *stop),
            Step::DeleteFile { out } => {
                let files = published(&self.outs[*out]);
                if files.is_empty() {
                    return Ok(format!("delete a file of o{}: none published", out + 1));
                }
                let file = &files[rng.random_range(0..files.len())];
                std::fs::remove_file(file).unwrap();
                self.complete[*out] = None;
                self.damaged[*out] = true;
                self.count("delete a published file");
                Ok(format!("deleted {}", file.display()))
            }
            Step::Damage { out, truncate } => {
                let files = published(&self.outs[*out]);
                if files.is_empty() {
                    return Ok(format!("damage a file of o{}: none published", out + 1));
                }
                let file = &files[rng.random_range(0..files.len())];
                let mut bytes = std::fs::read(file).unwrap();
                let what = if *truncate || bytes.is_empty() {
                    let len = rng.random_range(0..bytes.len().max(1));
                    bytes.truncate(len);
                    format!("truncated to {len} bytes")
                } else {
                    let at = rng.random_range(0..bytes.len());
                    let mask = rng.random_range(1..=255u8);
                    bytes[at] ^= mask;
                    format!("byte {at} xor {mask:#04x}")
                };
                std::fs::write(file, &bytes).unwrap();
                self.complete[*out] = None;
                self.damaged[*out] = true;
                self.count(if *truncate {
                    "truncate a published file"
                } else {
                    "alter a published file"
                });
                Ok(format!("{} {what}", file.display()))
            }
            Step::Rewrite { dataset } => {
                let files = self.datasets[*dataset].files();
                let file = &files[rng.random_range(0..files.len())];
                let bytes = std::fs::read(file).unwrap();
                std::fs::write(file, &bytes).unwrap();
                // A modification time surely different from the one recorded.
                let when = SystemTime::now() + Duration::from_secs(rng.random_range(1..1000));
                File::options()
                    .write(true)
                    .open(file)
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
                self.count("rewrite a dataset file");
                Ok(format!("rewrote {} in place", file.display()))
            }
            Step::Verify { dataset, out } => {
                let ds = &self.datasets[*dataset];
                let path = &self.outs[*out];
                let args = vec![
                    "verify".to_string(),
                    ds.dir.display().to_string(),
                    path.display().to_string(),
                ];
                let ran = self.run(&args, Stop::Never)?;
                match ran.code() {
                    Some(0) => independent_check(ds, path).map_err(|e| {
                        format!(
                            "verify exited 0 but the independent reader disagrees: {e}\n{}",
                            ran.text()
                        )
                    })?,
                    Some(2 | 3) if self.complete[*out] != Some(*dataset) => {}
                    _ => {
                        return Err(format!(
                            "verify of {} (complete: {:?}): {}",
                            path.display(),
                            self.complete[*out],
                            ran.text()
                        ));
                    }
                }
                self.count(format!("verify: {}", ran.describe()));
                Ok(format!("$ {} -> {}", ran.command, ran.brief()))
            }
        }
    }

    fn replay(&mut self, spec: &ReplaySpec, stop: Stop) -> Result<String, String> {
        let args = self.replay_args(spec);
        let out = &self.outs[spec.out];
        let others: Vec<(PathBuf, BTreeMap<PathBuf, Vec<u8>>)> = self
            .outs
            .iter()
            .filter(|o| *o != out)
            .map(|o| (o.clone(), guarded(o, &[])))
            .collect();
        let before = guarded(out, &self.all_states());
        // Without --fresh, a run may replace the output only of an in-memory job (which
        // can never be resumed); a durable job's output it resumes, or leaves alone.
        let keeps_files = !spec.fresh && !held_by_memory_job(out);
        let files_before: Vec<(PathBuf, Vec<u8>)> = published(out)
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        let ran = self.run(&args, stop)?;
        self.last = Some(spec.clone());
        if keeps_files {
            for (file, bytes) in &files_before {
                if std::fs::read(file).ok().as_ref() != Some(bytes) {
                    return Err(format!(
                        "a run without --fresh removed or changed {}, a published file of a \
                         durable job's output\n{}",
                        file.display(),
                        ran.text()
                    ));
                }
            }
        }
        for (other, files) in &others {
            let now = guarded(other, &[]);
            if &now != files {
                return Err(format!(
                    "a run into {} changed the output {}:\n{}{}",
                    out.display(),
                    other.display(),
                    difference(files, &now),
                    ran.text()
                ));
            }
        }
        let sent = match stop {
            Stop::Signal { name, .. } => Some(name),
            Stop::Never => None,
        };
        let signal_code = |name: &str| match name {
            "INT" => 2,
            "TERM" => 15,
            "HUP" => 1,
            _ => 9,
        };
        let outcome = match (ran.code(), ran.status.signal()) {
            (Some(0), _) => {
                let finished = ran.stdout.contains("already finished");
                self.check_complete(spec.dataset, spec.out, &ran)?;
                let last = if finished {
                    number_after(&ran.stdout, ", checkpoint ")
                } else {
                    number_after(&ran.stdout, "internal barrier epoch ")
                };
                if last.is_none() {
                    return Err(format!(
                        "no final checkpoint in the summary\n{}",
                        ran.text()
                    ));
                }
                published_up_to(out, last, &ran)?;
                self.complete[spec.out] = Some(spec.dataset);
                self.damaged[spec.out] = false;
                self.refused[spec.out] = false;
                if finished {
                    "exit 0, already finished".to_string()
                } else {
                    "exit 0".to_string()
                }
            }
            (Some(code @ (2 | 3)), _) => {
                if ran.stderr.contains("corrupt") {
                    return Err(format!(
                        "a state no step touched is called corrupt\n{}",
                        ran.text()
                    ));
                }
                let now = guarded(out, &self.all_states());
                if now != before {
                    return Err(format!(
                        "a refused run (exit {code}) changed what it refused:\n{}{}",
                        difference(&before, &now),
                        ran.text()
                    ));
                }
                self.refused[spec.out] = code == 2;
                self.count(format!("  refused: {}", reason(&ran.stderr)));
                format!("exit {code}")
            }
            // Stopped by the signal the test sent: by its handler (128 + the signal) or,
            // before the handler was installed, by the signal itself.
            (Some(code), _) if sent.is_some_and(|s| code == 128 + signal_code(s)) => {
                self.stopped(spec.out, true, &ran)?;
                format!("exit {code}")
            }
            (None, Some(signal)) if sent.is_some_and(|s| signal == signal_code(s)) => {
                self.stopped(spec.out, false, &ran)?;
                format!("signal {signal}")
            }
            _ => {
                return Err(format!("an undocumented exit status\n{}", ran.text()));
            }
        };
        let kind = match sent {
            None => "replay".to_string(),
            Some(name) => format!("replay stopped by SIG{name}"),
        };
        self.count(format!("{kind}: {outcome}"));
        let stopped = match stop {
            Stop::Never => String::new(),
            Stop::Signal { name, after } => format!(" [SIG{name} after {after:?}]"),
        };
        Ok(format!("$ {}{stopped} -> {}", ran.command, ran.brief()))
    }

    /// After a run stopped by a signal: its output is consistent (unless a step damaged it
    /// before and the run may have stopped before it checked), and one that a handler
    /// stopped left no `.tmp` behind.
    fn stopped(&mut self, out: usize, handled: bool, ran: &Ran) -> Result<(), String> {
        self.complete[out] = None;
        let path = &self.outs[out];
        if handled {
            no_tmp(path)
                .map_err(|e| format!("a run stopped by its handler: {e}\n{}", ran.text()))?;
            if !ran.stderr.contains("run the same command again to resume") {
                return Err(format!(
                    "a stop that does not say how to resume\n{}",
                    ran.text()
                ));
            }
            let committed = number_after(&ran.stderr, "committed up to epoch ");
            published_up_to(path, committed, ran)?;
        }
        if !self.damaged[out] {
            partial_check(&self.datasets, path).map_err(|e| {
                format!(
                    "the output of a stopped run is not exactly once: {e}\n{}",
                    ran.text()
                )
            })?;
        }
        Ok(())
    }

    /// `--fresh` recovers every output: exit 0, checked like any other.
    fn recover(&mut self) -> Result<Vec<String>, String> {
        let mut lines = Vec::new();
        for out in 0..self.outs.len() {
            let spec = ReplaySpec {
                dataset: out % self.datasets.len(),
                out,
                state: StateChoice::Default,
                fresh: true,
                vnodes: 16,
                order: "merged",
                parallelism: 2,
                checkpoint_every: 1,
                batch_size: 8192,
                upstream_rate: None,
                verify: false,
            };
            let line = self.replay(&spec, Stop::Never)?;
            if self.complete[out] != Some(spec.dataset) {
                return Err(format!("--fresh did not recover o{}: {line}", out + 1));
            }
            lines.push(line);
        }
        // Runs that could run code removed their sort scratch, and swept that of the
        // killed ones.
        let left: Vec<String> = std::fs::read_dir(&self.scratch)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("backfill-sort-"))
            .collect();
        if !left.is_empty() {
            return Err(format!(
                "scratch left in TMPDIR after the last runs: {left:?}"
            ));
        }
        Ok(lines)
    }
}

/// One random sequence of `steps` steps from `seed`; an error names the seed and every step.
fn sequence(seed: u64, steps: usize) -> BTreeMap<String, usize> {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("lifecycle-fuzz-{seed}-"))
        .tempdir()
        .unwrap();
    let mut log = Vec::new();
    let mut counts = BTreeMap::new();
    // A panic of the test's own code is reported with the seed too.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut world = World::new(tmp.path(), &mut rng);
        for i in 0..steps {
            let step = world.random_step(&mut rng);
            match world.step(&step, &mut rng) {
                Ok(line) => log.push(format!("{i:>3}. {line}")),
                Err(e) => return Err(format!("step {i} ({step:?}): {e}")),
            }
        }
        let lines = world
            .recover()
            .map_err(|e| format!("recovery with --fresh: {e}"))?;
        log.extend(lines.into_iter().map(|l| format!("end. {l}")));
        counts = std::mem::take(&mut world.counts);
        Ok(())
    }));
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(panic) => Some(format!(
            "a panic of the test: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    };
    if let Some(failure) = failure {
        let kept = tmp.keep();
        panic!(
            "lifecycle fuzz, seed {seed} (rerun: LIFECYCLE_FUZZ_SEEDS={seed}..{seed}), \
             directory kept: {}\nsteps before the failure:\n{}\nfailure at {failure}",
            kept.display(),
            log.join("\n")
        );
    }
    counts
}

/// The seeds to run: `LIFECYCLE_FUZZ_SEEDS` (`N`, `A..B`, `A,B,C`), 8 by default.
fn seeds() -> Vec<u64> {
    let Ok(value) = std::env::var("LIFECYCLE_FUZZ_SEEDS") else {
        return (1..=8).collect();
    };
    let value = value.trim();
    if let Some((a, b)) = value.split_once("..") {
        let a: u64 = a.trim().parse().expect("LIFECYCLE_FUZZ_SEEDS: A..B");
        let b: u64 = b.trim().parse().expect("LIFECYCLE_FUZZ_SEEDS: A..B");
        (a..=b).collect()
    } else if value.contains(',') {
        value
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().expect("LIFECYCLE_FUZZ_SEEDS: A,B,C"))
            .collect()
    } else {
        let n: u64 = value.parse().expect("LIFECYCLE_FUZZ_SEEDS: N");
        (1..=n).collect()
    }
}

#[test]
fn random_directory_life_cycles_keep_exit_zero_exact() {
    let steps: usize = std::env::var("LIFECYCLE_FUZZ_STEPS")
        .ok()
        .map(|s| s.trim().parse().expect("LIFECYCLE_FUZZ_STEPS: a number"))
        .unwrap_or(12);
    let seeds = seeds();
    // Two sequences at a time: most of a step is waiting on a process.
    let (left, right): (Vec<u64>, Vec<u64>) = {
        let mut left = Vec::new();
        let mut right = Vec::new();
        for (i, seed) in seeds.iter().enumerate() {
            if i % 2 == 0 {
                left.push(*seed);
            } else {
                right.push(*seed);
            }
        }
        (left, right)
    };
    let started = Instant::now();
    let totals = std::thread::scope(|scope| {
        let handles: Vec<_> = [left, right]
            .into_iter()
            .map(|seeds| {
                scope.spawn(move || {
                    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                    for seed in seeds {
                        for (what, n) in sequence(seed, steps) {
                            *counts.entry(what).or_default() += n;
                        }
                    }
                    counts
                })
            })
            .collect();
        let mut totals: BTreeMap<String, usize> = BTreeMap::new();
        let mut panics = Vec::new();
        for handle in handles {
            match handle.join() {
                Ok(counts) => {
                    for (what, n) in counts {
                        *totals.entry(what).or_default() += n;
                    }
                }
                Err(e) => panics.push(e),
            }
        }
        if let Some(e) = panics.into_iter().next() {
            std::panic::resume_unwind(e);
        }
        totals
    });
    println!(
        "{} sequences of {steps} steps in {:.1?}:",
        seeds.len(),
        started.elapsed()
    );
    for (what, n) in &totals {
        println!("  {n:>4}  {what}");
    }
}
