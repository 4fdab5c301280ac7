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

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crate::error::{Result, internal};
use crate::job::certificate::TableDigest;
use crate::replay::prefetch::tee;
use crate::replay::{Dataset, DatasetSummary, SNAPSHOT_CHUNK_ROWS, SnapshotFeed};
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
    /// The outcome of a validation that passed, encoded for the state ([`Self::outcome`]).
    outcome: Arc<OnceLock<String>>,
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
            outcome: Arc::default(),
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
            outcome: Arc::new(OnceLock::from(value.to_string())),
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
            outcome,
        })
    }

    /// Starts validating `dataset` on a thread of its own; `desc` is the job's table. The
    /// snapshot is read for the validation and, if it takes them
    /// ([`Self::take_snapshot_feed`]), the load, in the batches the validation takes its rows
    /// in (so that a batch the reader cannot decode holds back no rows the validation would
    /// have checked before it). It spills under `scratch`.
    pub fn beside(dataset: &Dataset, desc: Arc<TableDesc>, scratch: PathBuf) -> Result<Self> {
        // A batch is shared (its buffers' handles cloned); an error goes to the validation,
        // which reports it naming file and row, and ends the load's feed too.
        let split = |item: Result<(usize, arrow_array::RecordBatch)>| match item {
            Ok(batch) => (Ok(batch.clone()), Ok(batch)),
            Err(e) => {
                let stop = internal!("the snapshot read failed (the validation says why): {e}");
                (Err(e), Err(stop))
            }
        };
        let batches = dataset.read_snapshot_files(SNAPSHOT_CHUNK_ROWS);
        let (for_validation, for_load) = tee("backfill-read", READ_AHEAD, batches, split)?;
        let dataset = dataset.clone();
        let outcome: Arc<OnceLock<String>> = Arc::default();
        let cell = outcome.clone();
        let thread = std::thread::Builder::new()
            .name("backfill-validate".into())
            .spawn(move || {
                let feed: SnapshotFeed = Box::new(for_validation);
                validate_keeping(&dataset, &desc, &scratch, Some(feed), &cell)
            })
            .map_err(|e| internal!("cannot start the validation thread: {e}"))?;
        Ok(Self {
            state: State::Running(thread),
            failed: false,
            snapshot_feed: Some(Box::new(for_load)),
            outcome,
        })
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
                let mut beside = Validation::beside(&data, desc, std::env::temp_dir()).unwrap();
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
        let mut beside = Validation::beside(&data, desc, std::env::temp_dir()).unwrap();
        assert!(beside.finish().is_err());
        assert!(beside.failed());
        assert!(beside.outcome().get().is_none(), "no outcome kept");
        assert!(Validation::recorded("{\"summary\": 1}").is_none());
        assert_eq!(beside.expected_digest(), None);
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
