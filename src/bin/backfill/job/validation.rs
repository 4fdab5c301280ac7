//! The dataset's validation, before or beside a replay's snapshot load.
//!
//! Nothing of a bad dataset may be committed, and an earlier output must survive a bad one.
//! So a replay that resumes, or that writes into directories that already exist, validates
//! first ([`Validation::first`]). A new job whose output and state directories do not exist
//! yet has nothing to lose: its validation runs on a thread beside the snapshot load
//! ([`Validation::beside`]); the load's commit waits for it, and on bad input the replay
//! removes the directories it created ([`NewDirs`]). The snapshot is then decoded once, on a
//! reader thread that hands every batch to both the validation and the load
//! ([`Validation::take_snapshot_feed`]).
//!
//! A validation that passed is kept in the replay's state ([`Validation::outcome`], committed
//! with a snapshot load step or the load's final commit, beside the job's identity, which
//! names every input file's size, time and footer checksum): a run that resumes on the same
//! input takes it from there ([`Validation::recorded`]) instead of reading the dataset again.
//!
//! A validation beside the load of a durable state also keeps its progress with the load's
//! steps ([`CheckpointDir`]): every load step's worth of snapshot rows, while the snapshot
//! comes in key order, it records what it did (the snapshot rows it sorts, written in
//! key order in `STATE/validation/`, and the digest so far) and hands the record to the
//! load ([`Validation::checkpoints`]), which commits it with its next step. A run killed
//! during the load resumes both: the load after its last step, the validation after the
//! checkpoint that step committed ([`CheckpointDir::resume`]), so a kill costs the rows of
//! both since that step. Each validation writes its files under a name of its own (a
//! *lineage*, which a resumed one keeps); a resume checks each file's size and CRC-32 and,
//! if one is not as recorded, validates from the start. The directory is removed once the
//! validation's outcome is committed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::error::{Result, internal};
use crate::job::certificate::TableDigest;
use crate::replay::prefetch::tee;
use crate::replay::{
    Checkpoints, Dataset, DatasetSummary, Observed, RunPlace, SNAPSHOT_CHUNK_ROWS, SnapshotFeed,
    ValidationCheckpoint,
};
use crate::store::durable::{DirLock, LOCK_FILE};
use crate::table::TableDesc;

/// A dataset's validation: done, or running on its own thread.
///
/// The pass reads every row of the input, so it also digests the table the input ends with
/// (the snapshot, then every change), as rows of the job's table: the completion
/// certificate's expected side, with no second read of the input or scan of the state.
pub(crate) struct Validation {
    state: State,
    /// The validation found the dataset bad (or could not read it).
    failed: bool,
    /// The snapshot's batches the validation reads, for the load to read too.
    snapshot_feed: Option<SnapshotFeed>,
    /// The snapshot row that feed starts at.
    feed_start: u64,
    /// The outcome of a validation that passed, encoded for the state ([`Self::outcome`]).
    outcome: Arc<OnceLock<String>>,
    /// The last checkpoint, encoded for the state ([`Self::checkpoints`]).
    checkpoint: Arc<Mutex<Option<String>>>,
    /// The snapshot row a resumed validation started at.
    resumed_at: Arc<OnceLock<u64>>,
    /// Made by [`Self::recorded`].
    recorded: bool,
}

/// Batches the snapshot reader decodes ahead of the slower of its two consumers.
const READ_AHEAD: usize = 4;

impl std::fmt::Debug for Validation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validation")
            .field("state", &self.state)
            .field("failed", &self.failed)
            .field("snapshot_feed", &self.snapshot_feed.is_some())
            .finish()
    }
}

/// What a successful validation found.
type Validated = (DatasetSummary, TableDigest);

/// A validation's outcome as the state keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Recorded {
    summary: DatasetSummary,
    digest: TableDigest,
}

/// `validated` encoded for the state.
fn encode(validated: &Validated) -> Result<String> {
    let recorded = Recorded {
        summary: validated.0,
        digest: validated.1.clone(),
    };
    serde_json::to_string(&recorded).map_err(|e| internal!("a validation's record: {e}"))
}

/// [`validate`], its outcome encoded into `outcome` once it passed.
fn validate_keeping(
    dataset: &Dataset,
    desc: &TableDesc,
    scratch: &Path,
    snapshot: Option<SnapshotFeed>,
    outcome: &OnceLock<String>,
) -> Result<Validated> {
    let validated = validate(dataset, desc, scratch, snapshot)?;
    let _ = outcome.set(encode(&validated)?);
    Ok(validated)
}

#[derive(Debug)]
enum State {
    Done(Box<Validated>),
    Running(JoinHandle<Result<Validated>>),
    /// Failed, and its error already returned.
    Failed,
}

/// Validates `dataset`, digesting its final table as rows of `desc`; the snapshot comes from
/// `snapshot` if given.
fn validate(
    dataset: &Dataset,
    desc: &TableDesc,
    scratch: &Path,
    snapshot: Option<SnapshotFeed>,
) -> Result<Validated> {
    let mut digest = TableDigest::new(desc.vnode_count());
    let summary = dataset
        .validate_observed_from(scratch, snapshot, &mut |rows| digest.observe(desc, rows))?;
    Ok((summary, digest))
}

/// Where a validation beside the load keeps its checkpoints (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CheckpointDir {
    /// `STATE/validation`.
    pub dir: PathBuf,
    /// The checkpoint record a stopped run's load step committed, to resume from (as the
    /// state keeps it; [`CheckpointDir::record`] reads it).
    pub resume: Option<String>,
    /// Snapshot rows between checkpoints.
    pub every_rows: u64,
}

/// The directory of a state's validation checkpoints.
pub(crate) fn checkpoint_dir(state: &Path) -> PathBuf {
    state.join("validation")
}

/// The version of a checkpoint's record and files: the binary's, whose hashes of rows and
/// sorted-row files a checkpoint keeps (another version's checkpoint is not resumed from).
const CHECKPOINT_FORMAT: &str = concat!(env!("CARGO_PKG_VERSION"), "/1");

/// A checkpoint as the state keeps it: the pass's own, and the digest of the rows before it.
#[derive(serde::Serialize, serde::Deserialize)]
struct CheckpointRecord {
    /// [`CHECKPOINT_FORMAT`] when it was made.
    #[serde(default)]
    format: String,
    /// The name of the validation's files (see the module docs).
    lineage: String,
    checkpoint: ValidationCheckpoint,
    digest: TableDigest,
}

impl CheckpointDir {
    /// The record to resume from, if it is one this binary can resume (its version, a
    /// lineage that names files).
    fn record(&self) -> Option<CheckpointRecord> {
        let record: CheckpointRecord = serde_json::from_str(self.resume.as_deref()?).ok()?;
        (record.format == CHECKPOINT_FORMAT && valid_lineage(&record.lineage)).then_some(record)
    }
}

/// What the validation's thread keeps checkpoints with.
struct Prepared {
    /// Its directory, locked for the pass.
    _lock: DirLock,
    /// The name of its files.
    lineage: String,
    checkpoints: Checkpoints,
    /// The digest of the rows before the checkpoint it resumes from.
    digest: Option<TableDigest>,
}

/// Checkpoints for the validation's thread: its files' name and place (their directory
/// locked for the pass, other files in it removed), and `record`, where it resumes.
/// `None` (no checkpoints) if another process holds the directory or it cannot be made.
fn prepare_checkpoints(at: &CheckpointDir, record: Option<CheckpointRecord>) -> Option<Prepared> {
    std::fs::create_dir_all(&at.dir).ok()?;
    let lock = DirLock::acquire(&at.dir).ok()?;
    let (lineage, resume, digest) = match record {
        Some(r) => (r.lineage, Some(r.checkpoint), Some(r.digest)),
        None => (new_lineage(), None, None),
    };
    let keep: Vec<&str> = match &resume {
        Some(c) => (c.sort.segments.iter().flatten())
            .map(|s| s.name.as_str())
            .collect(),
        None => Vec::new(),
    };
    // What no checkpoint to resume names: a killed run's later files, another lineage's.
    for entry in std::fs::read_dir(&at.dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name != LOCK_FILE && !keep.contains(&name.as_ref()) {
            std::fs::remove_file(entry.path()).ok()?;
        }
    }
    let checkpoints = Checkpoints {
        place: RunPlace {
            dir: at.dir.clone(),
            prefix: format!("validate-{lineage}"),
        },
        every_rows: at.every_rows.max(1),
        resume,
    };
    Some(Prepared {
        _lock: lock,
        lineage,
        checkpoints,
        digest,
    })
}

/// A new lineage: 16 hex digits, from the clock and the process.
fn new_lineage() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = hashbrown::DefaultHashBuilder::default().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// Whether `lineage` is one [`new_lineage`] could have made (a record's name is used in
/// file names).
fn valid_lineage(lineage: &str) -> bool {
    lineage.len() == 16 && lineage.bytes().all(|b| b.is_ascii_hexdigit())
}

/// [`validate`] with checkpoints in `at` (see the module docs), resuming from `record`,
/// each published into `published` once written; the snapshot comes from `snapshot` (a
/// feed, and the snapshot row it starts at) if given. The row it resumed at goes into
/// `resumed_at`.
#[expect(
    clippy::too_many_arguments,
    reason = "the thread's inputs and its two outputs"
)]
fn validate_checkpointed(
    dataset: &Dataset,
    desc: &TableDesc,
    scratch: &Path,
    snapshot: Option<(SnapshotFeed, u64)>,
    at: &CheckpointDir,
    record: Option<CheckpointRecord>,
    published: &Mutex<Option<String>>,
    resumed_at: &OnceLock<u64>,
) -> Result<Validated> {
    let Some(prepared) = prepare_checkpoints(at, record) else {
        // (A feed from a later row is dropped: the pass reads the snapshot itself.)
        let feed = snapshot.and_then(|(feed, from)| (from == 0).then_some(feed));
        return validate(dataset, desc, scratch, feed);
    };
    let Prepared {
        _lock,
        lineage,
        checkpoints,
        digest: recorded_digest,
    } = prepared;
    let mut digest = TableDigest::new(desc.vnode_count());
    let mut observe = |rows: Observed<'_>| -> Result<()> {
        match rows {
            Observed::Resumed(from) => {
                let _ = resumed_at.set(from.snapshot_rows);
                digest = (recorded_digest.clone())
                    .ok_or_else(|| internal!("a validation resumed without its digest"))?;
                Ok(())
            }
            Observed::Checkpoint(checkpoint) => {
                let record = CheckpointRecord {
                    format: CHECKPOINT_FORMAT.to_string(),
                    lineage: lineage.clone(),
                    checkpoint: checkpoint.clone(),
                    digest: digest.clone(),
                };
                let value = serde_json::to_string(&record)
                    .map_err(|e| internal!("a validation checkpoint's record: {e}"))?;
                *published
                    .lock()
                    .map_err(|_| internal!("the validation's checkpoint slot is poisoned"))? =
                    Some(value);
                Ok(())
            }
            rows => digest.observe(desc, rows),
        }
    };
    let summary = dataset.validate_checkpointed(scratch, snapshot, &checkpoints, &mut observe)?;
    Ok((summary, digest))
}

impl Validation {
    /// Validates `dataset` now, on this thread; `desc` is the job's table.
    #[cfg(test)]
    pub fn first(dataset: &Dataset, desc: &TableDesc) -> Result<Self> {
        Ok(Self {
            state: State::Done(Box::new(validate(
                dataset,
                desc,
                &std::env::temp_dir(),
                None,
            )?)),
            failed: false,
            snapshot_feed: None,
            feed_start: 0,
            outcome: Arc::default(),
            checkpoint: Arc::default(),
            resumed_at: Arc::default(),
            recorded: false,
        })
    }

    /// The validation a state recorded (`value`, from [`Self::outcome`]), for a run that
    /// resumes on the same input: done, nothing read. `None` if the value is unreadable (an
    /// older or damaged record: the caller validates again).
    pub fn recorded(value: &str) -> Option<Self> {
        let recorded: Recorded = serde_json::from_str(value).ok()?;
        Some(Self {
            state: State::Done(Box::new((recorded.summary, recorded.digest))),
            failed: false,
            snapshot_feed: None,
            feed_start: 0,
            outcome: Arc::new(OnceLock::from(value.to_string())),
            checkpoint: Arc::default(),
            resumed_at: Arc::default(),
            recorded: true,
        })
    }

    /// Where the outcome of this validation appears once it passed, encoded for the state
    /// (set by the validation's thread: a load step may commit it while the load goes on).
    pub fn outcome(&self) -> Arc<OnceLock<String>> {
        self.outcome.clone()
    }

    /// [`Self::first`] on a thread of its own, so that the caller can watch for signals
    /// while it runs; nothing may be written before [`Self::finish`] succeeded.
    /// It spills under `scratch`.
    pub fn first_in_background(
        dataset: &Dataset,
        desc: Arc<TableDesc>,
        scratch: PathBuf,
    ) -> Result<Self> {
        let dataset = dataset.clone();
        let outcome: Arc<OnceLock<String>> = Arc::default();
        let cell = outcome.clone();
        let thread = std::thread::Builder::new()
            .name("backfill-validate".into())
            .spawn(move || validate_keeping(&dataset, &desc, &scratch, None, &cell))
            .map_err(|e| internal!("cannot start the validation thread: {e}"))?;
        Ok(Self {
            state: State::Running(thread),
            failed: false,
            snapshot_feed: None,
            feed_start: 0,
            outcome,
            checkpoint: Arc::default(),
            resumed_at: Arc::default(),
            recorded: false,
        })
    }

    /// Starts validating `dataset` on a thread of its own; `desc` is the job's table. The
    /// snapshot is read for the validation and, if it takes them
    /// ([`Self::take_snapshot_feed`]), the load, in the batches the validation takes its rows
    /// in (so that a batch the reader cannot decode holds back no rows the validation would
    /// have checked before it). It spills under `scratch`.
    ///
    /// With `checkpoints`, it keeps its progress there and resumes from the checkpoint given
    /// (see the module docs). `load_from` is the snapshot row the load resumes at (`None`:
    /// the load reads the snapshot itself): the feed then starts at the earlier of that row
    /// and the validation's ([`Self::feed_start`]), and a validation that cannot resume
    /// after all reads the snapshot itself.
    pub fn beside(
        dataset: &Dataset,
        desc: Arc<TableDesc>,
        scratch: PathBuf,
        checkpoints: Option<CheckpointDir>,
        load_from: Option<u64>,
    ) -> Result<Self> {
        let record = checkpoints.as_ref().and_then(CheckpointDir::record);
        let resume_at = record.as_ref().map(|r| r.checkpoint.snapshot_rows);
        let feed_from = match (resume_at, load_from) {
            (Some(validation), Some(load)) => Some(validation.min(load)),
            (Some(_), None) => None,
            (None, _) => Some(0),
        };
        let (for_validation, for_load) = if let Some(from) = feed_from {
            // A batch is shared (its buffers' handles cloned); an error goes to the
            // validation, which reports it naming file and row, and ends the load's feed too.
            let split = |item: Result<(usize, arrow_array::RecordBatch)>| match item {
                Ok(batch) => (Ok(batch.clone()), Ok(batch)),
                Err(e) => {
                    let stop = internal!("the snapshot read failed (the validation says why): {e}");
                    (Err(e), Err(stop))
                }
            };
            let batches = dataset.read_snapshot_files_from(SNAPSHOT_CHUNK_ROWS, from);
            let (for_validation, for_load) = tee("backfill-read", READ_AHEAD, batches, split)?;
            let for_validation: SnapshotFeed = Box::new(for_validation);
            let for_load: SnapshotFeed = Box::new(for_load);
            (Some((for_validation, from)), Some(for_load))
        } else {
            (None, None)
        };
        let dataset = dataset.clone();
        let outcome: Arc<OnceLock<String>> = Arc::default();
        let checkpoint: Arc<Mutex<Option<String>>> = Arc::default();
        let resumed_at: Arc<OnceLock<u64>> = Arc::default();
        let (cell, published, resumed) = (outcome.clone(), checkpoint.clone(), resumed_at.clone());
        let thread = std::thread::Builder::new()
            .name("backfill-validate".into())
            .spawn(move || {
                let validated = match &checkpoints {
                    Some(at) => validate_checkpointed(
                        &dataset,
                        &desc,
                        &scratch,
                        for_validation,
                        at,
                        record,
                        &published,
                        &resumed,
                    )?,
                    None => validate(&dataset, &desc, &scratch, for_validation.map(|f| f.0))?,
                };
                let _ = cell.set(encode(&validated)?);
                Ok(validated)
            })
            .map_err(|e| internal!("cannot start the validation thread: {e}"))?;
        Ok(Self {
            state: State::Running(thread),
            failed: false,
            snapshot_feed: for_load,
            feed_start: feed_from.unwrap_or(0),
            outcome,
            checkpoint,
            resumed_at,
            recorded: false,
        })
    }

    /// The last checkpoint the validation wrote, encoded for the state, once (a load
    /// step commits it; see the module docs): `None` if there is none since the last call.
    pub fn take_checkpoint(slot: &Mutex<Option<String>>) -> Option<String> {
        slot.lock().ok().and_then(|mut v| v.take())
    }

    /// The snapshot row the feed of [`Self::take_snapshot_feed`] starts at.
    pub fn feed_start(&self) -> u64 {
        self.feed_start
    }

    /// Where the validation's checkpoints appear ([`Self::take_checkpoint`]).
    pub fn checkpoints(&self) -> Arc<Mutex<Option<String>>> {
        self.checkpoint.clone()
    }

    /// Whether this is the outcome a state recorded ([`Self::recorded`]).
    pub fn was_recorded(&self) -> bool {
        self.recorded
    }

    /// The snapshot row a validation resumed from a checkpoint started at, once it did.
    pub fn resumed_at(&self) -> Option<u64> {
        self.resumed_at.get().copied()
    }

    /// The snapshot's batches as the running validation reads them (once): the load reads
    /// them instead of decoding the files again. `None` for a validation done first. The
    /// validation stays at most a few batches ahead of whoever holds the feed; one never
    /// taken is dropped by [`Self::finish`].
    pub fn take_snapshot_feed(&mut self) -> Option<SnapshotFeed> {
        self.snapshot_feed.take()
    }

    /// The validation's result, waiting for it if it is still running.
    pub fn finish(&mut self) -> Result<DatasetSummary> {
        // A feed nobody took would hold the shared reader (and the validation) back.
        self.snapshot_feed = None;
        let result = match std::mem::replace(&mut self.state, State::Failed) {
            State::Done(done) => Ok(done),
            State::Running(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(internal!("the validation thread panicked")))
                .map(Box::new),
            State::Failed => Err(internal!("the validation failed before")),
        };
        match result {
            Ok(done) => {
                let summary = done.0;
                self.state = State::Done(done);
                Ok(summary)
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    /// The digest of the table the dataset ends with, once [`Self::finish`] succeeded.
    pub fn expected_digest(&self) -> Option<&TableDigest> {
        match &self.state {
            State::Done(done) => Some(&done.1),
            _ => None,
        }
    }

    /// Whether the validation is still running on its thread.
    pub fn is_running(&self) -> bool {
        matches!(&self.state, State::Running(thread) if !thread.is_finished())
    }

    /// Whether the validation found the dataset bad.
    pub fn failed(&self) -> bool {
        self.failed
    }
}

/// The directories a replay is about to create: the highest missing ancestor of each of
/// its directories, removed again when the dataset turns out bad.
#[derive(Debug, Default)]
pub(crate) struct NewDirs {
    roots: Vec<PathBuf>,
}

impl NewDirs {
    /// The new directories among `dirs`; `None` if any of them exists already.
    pub fn of(dirs: &[&Path]) -> Option<Self> {
        let mut roots: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            if dir.exists() {
                return None;
            }
            let mut root = dir.to_path_buf();
            while let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                if parent.exists() {
                    break;
                }
                root = parent.to_path_buf();
            }
            if !roots.iter().any(|r| root.starts_with(r)) {
                roots.retain(|r| !r.starts_with(&root));
                roots.push(root);
            }
        }
        Some(Self { roots })
    }

    /// Removes the directories (nothing in them was committed).
    pub fn remove(&self) {
        for root in &self.roots {
            // Best effort: the error being reported is the dataset's.
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::replay::testing::{MANIFEST, dataset, random_dataset};
    use crate::vnode::VnodeCount;
    use rand::SeedableRng;

    #[test]
    fn the_validation_digests_the_table_the_dataset_ends_with() {
        let mut valid = 0;
        for seed in 0..40 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (snapshot, changes) = random_dataset(&mut rng, false);
            let dir = dataset(MANIFEST, &snapshot, &changes);
            let data = Dataset::open(dir.path()).unwrap();
            if data.validate().is_err() {
                continue; // The generator breaks a rule now and then.
            }
            valid += 1;
            for vnodes in [1, 7, 256] {
                let desc = Arc::new(data.table_desc(VnodeCount::new(vnodes).unwrap()).unwrap());
                let (expected, _) = TableDigest::of_dataset(&data, &desc).unwrap();
                let mut first = Validation::first(&data, &desc).unwrap();
                first.finish().unwrap();
                assert_eq!(first.expected_digest(), Some(&expected), "seed {seed}");
                let mut beside =
                    Validation::beside(&data, desc, std::env::temp_dir(), None, Some(0)).unwrap();
                assert_eq!(beside.expected_digest(), None, "not before it finished");
                beside.finish().unwrap();
                assert_eq!(beside.expected_digest(), Some(&expected), "seed {seed}");
                let value = beside
                    .outcome()
                    .get()
                    .cloned()
                    .expect("an outcome once passed");
                let mut recorded = Validation::recorded(&value).unwrap();
                assert_eq!(recorded.expected_digest(), Some(&expected), "seed {seed}");
                assert_eq!(recorded.finish().unwrap(), beside.finish().unwrap());
            }
        }
        assert!(valid >= 10, "only {valid} valid datasets");
    }

    #[test]
    fn a_failed_validation_has_no_digest() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (snapshot, mut changes) = random_dataset(&mut rng, false);
        changes.push(crate::replay::testing::log("1000000 - 987654321 absent"));
        let dir = dataset(MANIFEST, &snapshot, &changes);
        let data = Dataset::open(dir.path()).unwrap();
        let desc = Arc::new(data.table_desc(VnodeCount::DEFAULT).unwrap());
        let mut beside =
            Validation::beside(&data, desc, std::env::temp_dir(), None, Some(0)).unwrap();
        assert!(beside.finish().is_err());
        assert!(beside.failed());
        assert!(beside.outcome().get().is_none(), "no outcome kept");
        assert!(Validation::recorded("{\"summary\": 1}").is_none());
        assert_eq!(beside.expected_digest(), None);
    }

    /// A validation beside the load with checkpoints publishes them; one resumed from its
    /// last checkpoint (the load's feed starting at an earlier row) reads only the rows
    /// after it, says where it resumed, and ends with the same outcome; the feed it shares
    /// with the load starts at the earlier of the two rows.
    #[test]
    fn a_validation_resumes_from_its_checkpoint_beside_a_resumed_load() {
        use crate::replay::testing::{changes, rows};
        let snapshot = [
            rows("1 a\n2 b\n3 c"),
            rows("4 d\n5 e"),
            rows("6 f\n7 g\n8 h\n9 i"),
        ];
        let change_files = [changes(&[(7, "U- 2 b\nU+ 2 x\n- 6 f"), (8, "+ 10 j")])];
        let dir = dataset(MANIFEST, &snapshot, &change_files);
        let data = Dataset::open(dir.path()).unwrap();
        let desc = Arc::new(data.table_desc(VnodeCount::new(7).unwrap()).unwrap());
        let state = tempfile::tempdir().unwrap();
        let at = |resume: Option<String>| CheckpointDir {
            dir: checkpoint_dir(state.path()),
            resume,
            every_rows: 1,
        };
        let mut first = Validation::beside(
            &data,
            desc.clone(),
            std::env::temp_dir(),
            Some(at(None)),
            Some(0),
        )
        .unwrap();
        drop(first.take_snapshot_feed());
        first.finish().unwrap();
        let slot = first.checkpoints();
        let checkpoint = Validation::take_checkpoint(&slot).expect("a checkpoint");
        assert!(Validation::take_checkpoint(&slot).is_none(), "taken once");
        let record: CheckpointRecord = serde_json::from_str(&checkpoint).unwrap();
        let resumed_row = record.checkpoint.snapshot_rows;
        assert!(resumed_row > 0, "{resumed_row}");

        let mut second = Validation::beside(
            &data,
            desc.clone(),
            std::env::temp_dir(),
            Some(at(Some(checkpoint.clone()))),
            Some(2),
        )
        .unwrap();
        assert_eq!(
            second.feed_start(),
            2,
            "the earlier of the load's row and its own"
        );
        let feed: Vec<_> = second.take_snapshot_feed().unwrap().collect();
        let fed: usize = feed.iter().map(|b| b.as_ref().unwrap().1.num_rows()).sum();
        assert_eq!(fed, 9 - 2, "the feed starts at row 2");
        second.finish().unwrap();
        assert_eq!(second.resumed_at(), Some(resumed_row));
        assert_eq!(second.expected_digest(), first.expected_digest());
        assert_eq!(second.outcome().get(), first.outcome().get());

        // A checkpoint of another version is not resumed from: the validation reads all.
        let other = checkpoint.replace(CHECKPOINT_FORMAT, "0.0.0/0");
        let mut third = Validation::beside(
            &data,
            desc,
            std::env::temp_dir(),
            Some(at(Some(other))),
            Some(2),
        )
        .unwrap();
        assert_eq!(third.feed_start(), 0);
        drop(third.take_snapshot_feed());
        third.finish().unwrap();
        assert_eq!(third.resumed_at(), None);
        assert_eq!(third.expected_digest(), first.expected_digest());
    }

    #[test]
    fn new_dirs_are_the_highest_missing_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("a/b/out");
        let state = tmp.path().join("a/b/out/state");
        let other = tmp.path().join("c");
        let dirs = NewDirs::of(&[&out, &state, &other]).unwrap();
        assert_eq!(dirs.roots, vec![tmp.path().join("a"), other.clone()]);
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        assert!(
            NewDirs::of(&[&out]).is_none(),
            "an existing directory has something to lose"
        );
        dirs.remove();
        assert!(!tmp.path().join("a").exists() && !other.exists());
        assert!(tmp.path().exists());
    }
}
