//! The full validation pass over a dataset, run before anything of a replay is committed.
//!
//! One pass reads the snapshot and the changelog in order and checks what the stream shows
//! (NULL keys, op codes, epochs, update pairs); every row goes, with its sequence number in
//! the stream and a 64-bit hash of its values, into an external sort by key (one a core, each
//! over the keys of a hash partition); then each key's rows are applied in stream order
//! ([`super::by_key`]), the partitions in parallel. Each error is an [`Error::Dataset`]
//! naming the file, the row within it (from 0) and, for changes, the epoch:
//!
//! | where     | what                                                                     |
//! |-----------|--------------------------------------------------------------------------|
//! | snapshot  | NULL key value, duplicate key                                            |
//! | changes   | NULL `_epoch`/`_op`, unknown op code, decreasing `_epoch`                 |
//! | changes   | U- not immediately followed by its U+ (same epoch), U+ without its U-    |
//! | changes   | NULL key value, delete/U- of an absent key or with other values,         |
//! |           | insert/U+ of an existing key (U- applies before U+)                      |
//!
//! When there are several, the one reported is the first in stream order that a table model
//! applying the rows one batch at a time would meet: an error about the rows of a batch
//! (a NULL key, a bad op, an unreadable file) comes after the application errors of the
//! batches before it.
//!
//! Before the snapshot, the pass reads the key columns alone of every change file
//! (`touched.rs`): while the snapshot comes in strictly increasing key order, its rows whose
//! key no change touches are left out of the sort (`by_key.rs`, "A snapshot in key order").
//!
//! Memory is bounded by [`ExternalSortOptions::memory_budget`], whatever the table's size,
//! plus the key filter of a changelog too long for its share of it (at most
//! [`MAX_FILTER_BYTES`]); the sort spills to [`ExternalSortOptions::scratch_dir`].

use super::by_key::{KeyedChanges, Payload, RunPlace, SortCheckpoint, first_violation_of};
use super::dataset::{Dataset, DatasetSummary};
use super::extsort::{ExternalSortOptions, SortConfig};
use super::files;
use super::prefetch::Prefetch;
use super::touched::{KeyFilter, changed_keys};
use crate::chunk::Op;
use crate::error::{Error, Result, internal};
use crate::vnode::VnodeCount;
use arrow_array::RecordBatch;

/// Rows per batch read during validation.
const BATCH_SIZE: usize = 8192;
/// The snapshot rows a validation takes at a time from the start of each file: a feed of
/// batches this size keeps its errors where reading the files itself would meet them.
pub(crate) const SNAPSHOT_CHUNK_ROWS: usize = BATCH_SIZE;
/// The most memory the key filter takes for a changelog too long for its share of the
/// budget: 64 MiB, 8 bits a change row for 64M rows (a lineitem scale 30 changelog, 36M
/// rows, gets 14 bits a row). Beyond, no filter: the whole snapshot is sorted.
const MAX_FILTER_BYTES: usize = 64 << 20;

/// Batches decoded ahead of the sort, on a reader thread.
const READ_AHEAD: usize = 8;

/// The one validation entry point is a method of [`Dataset`], defined here so that the
/// dataset module does not depend on its validation.
impl Dataset {
    /// The full validation pass (see the module docs of `validate.rs`): nothing of a dataset
    /// should be committed before it succeeds. Counts its rows and epochs, spilling to a
    /// temporary directory (`TMPDIR`, removed afterwards) with the default memory budget.
    #[cfg(test)]
    pub fn validate(&self) -> Result<DatasetSummary> {
        self.validate_observed(&mut |_| Ok(()))
    }

    /// [`Dataset::validate`], showing `observe` every row the pass reads, in stream order:
    /// the snapshot's, then the changelog's. A pass that reads the input anyway computes
    /// what else needs all of it (the completion certificate's expected digest) at no
    /// second read. What `observe` saw is meaningful only if the validation succeeds; its
    /// error ends the pass.
    #[cfg(test)]
    pub(crate) fn validate_observed(
        &self,
        observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
    ) -> Result<DatasetSummary> {
        self.validate_observed_from(&std::env::temp_dir(), None, observe)
    }

    /// [`Dataset::validate_observed`] spilling under `scratch`, with the snapshot's batches
    /// read by someone else (`snapshot`; `None`: read here): a replay decodes its snapshot
    /// once, for its load and its validation.
    pub(crate) fn validate_observed_from(
        &self,
        scratch: &std::path::Path,
        snapshot: Option<SnapshotFeed>,
        observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
    ) -> Result<DatasetSummary> {
        validate_with(
            self,
            &ExternalSortOptions::new(scratch.to_path_buf()),
            snapshot.map(|feed| (feed, 0)),
            None,
            observe,
        )
    }

    /// [`Dataset::validate_observed_from`] with checkpoints (see [`Checkpoints`]): `observe`
    /// is shown each one ([`Observed::Checkpoint`]) once its files are written, and a pass given one
    /// to resume from starts there (it says so first, [`Observed::Resumed`], and shows the
    /// rows after it). The `snapshot` feed comes with the snapshot row it starts at: the
    /// pass skips the rows before its own start, and reads the snapshot itself if the feed
    /// starts after it.
    pub(crate) fn validate_checkpointed(
        &self,
        scratch: &std::path::Path,
        snapshot: Option<(SnapshotFeed, u64)>,
        checkpoints: &Checkpoints,
        observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
    ) -> Result<DatasetSummary> {
        validate_with(
            self,
            &ExternalSortOptions::new(scratch.to_path_buf()),
            snapshot,
            Some(checkpoints),
            observe,
        )
    }
}

/// A validation's checkpoints: while the snapshot comes in key order (the rows it sorts
/// are then written in key order, `ordered_run.rs`), every `every_rows` snapshot rows the
/// pass writes what it has done and shows it ([`Observed::Checkpoint`]); a pass
/// given `resume` (a checkpoint of the same dataset, the same `place`) starts after it,
/// or from the start if its files are not as it recorded them.
#[derive(Debug, Clone)]
pub(crate) struct Checkpoints {
    /// Where the snapshot's sorted rows go (a directory that survives the process).
    pub place: RunPlace,
    pub every_rows: u64,
    pub resume: Option<ValidationCheckpoint>,
}

/// What a validation did up to a point of its snapshot pass (see [`Checkpoints`]); its
/// files are checked when a pass resumes from it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ValidationCheckpoint {
    /// The snapshot rows validated: the pass resumes at this row (in file order).
    pub snapshot_rows: u64,
    /// The snapshot files begun, each as (its index in [`Dataset::snapshot_files`], the
    /// number of its first row in the snapshot).
    pub files: Vec<(usize, u64)>,
    /// The rows sorted so far.
    pub sort: SortCheckpoint,
}

/// The snapshot's batches in file order, each with the index of its file in
/// [`Dataset::snapshot_files`] (as [`Dataset::read_snapshot_files`] reads them, whatever
/// their size); an error ends it.
pub(crate) type SnapshotFeed = Box<dyn Iterator<Item = Result<(usize, RecordBatch)>> + Send>;

/// Rows the validation read (see [`Dataset::validate_observed`]), and its checkpoints.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Observed<'a> {
    /// Snapshot rows, with their certificate row hashes if the pass computed them.
    Snapshot(&'a RecordBatch, Option<&'a [u64]>),
    /// Changelog rows, with their ops and their certificate row hashes if computed.
    Changes(&'a RecordBatch, &'a [Op], Option<&'a [u64]>),
    /// A checkpoint ([`Dataset::validate_checkpointed`]), after the rows shown so
    /// far: a pass resumed from it shows the rows after them.
    Checkpoint(&'a ValidationCheckpoint),
    /// The pass resumed from this checkpoint, before any row: what the observer saw up to
    /// it, it would have seen again.
    Resumed(&'a ValidationCheckpoint),
}

/// The partitions of the keys the validation sorts and folds: one a core (at most
/// [`MAX_FOLD_PARTITIONS`]), so that the pass's last step, the fold of every key after the
/// input is read, runs on every core instead of one.
fn fold_partitions() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_FOLD_PARTITIONS))
}

/// The most partitions of the validation's keys: each has a spill thread and a share of
/// the memory budget, whose runs get smaller with more.
const MAX_FOLD_PARTITIONS: usize = 4;

/// See [`Dataset::validate_observed_from`] and [`Dataset::validate_checkpointed`].
fn validate_with(
    dataset: &Dataset,
    options: &ExternalSortOptions,
    snapshot: Option<(SnapshotFeed, u64)>,
    checkpoints: Option<&Checkpoints>,
    observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
) -> Result<DatasetSummary> {
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let scratch = options.scratch()?;
    let mut rows = KeyedChanges::new(
        dataset.schema(),
        desc.pk(),
        Payload::Hash,
        scratch.path(),
        "validate",
        SortConfig::for_budget(options.memory_budget),
        fold_partitions(),
    )?;
    // The changelog's keys first: snapshot rows no change touches need no sort while the
    // snapshot comes in key order (`touched.rs`). Their filter takes at most a quarter of
    // the memory budget (16 MiB by default: 64 bits a change row up to 2M change rows,
    // fewer bits up to 16M), or, for a longer changelog, the fewest bits (at least 8 a
    // row) that fit [`MAX_FILTER_BYTES`] (up to 64M change rows); none beyond: then every
    // snapshot row is sorted, and no checkpoint is kept.
    let filter_budget = options.memory_budget / 4;
    let touched = changed_keys(dataset, desc.pk(), filter_budget)
        .or_else(|| changed_keys(dataset, desc.pk(), filter_budget.max(MAX_FILTER_BYTES)));
    // Their run (and its checkpoints) in the scratch directory unless the caller keeps it.
    let scratch_place = RunPlace {
        dir: scratch.path().to_path_buf(),
        prefix: "validate-snapshot".into(),
    };
    let place = checkpoints.map_or(&scratch_place, |c| &c.place);
    let mut progress = Progress::default();
    if let Some(touched) = touched {
        let resume = checkpoints.and_then(|c| c.resume.as_ref());
        match resume {
            Some(from) if resume_from(dataset, &mut rows, &touched, place, from)? => {
                observe(Observed::Resumed(from))?;
                progress = Progress {
                    files: from.files.clone(),
                    last_checkpoint: from.snapshot_rows,
                    every: checkpoints.map(|c| c.every_rows),
                };
            }
            _ => {
                rows.skip_untouched_snapshot_rows(touched, place);
                progress.every = checkpoints.map(|c| c.every_rows);
            }
        }
    }
    let start = progress.last_checkpoint;
    let mut summary = DatasetSummary {
        snapshot_rows: start,
        ..DatasetSummary::default()
    };
    let snapshot = match snapshot {
        Some((feed, from)) if from <= start => skip_rows(feed, start - from),
        // (A feed that starts later is dropped: its other reader goes on alone.)
        _ => Box::new(Prefetch::new(
            "backfill-validate",
            READ_AHEAD,
            dataset.read_snapshot_files_from(BATCH_SIZE, start),
        )?),
    };
    let stream_error = read(
        dataset,
        snapshot,
        &mut rows,
        &mut summary,
        &mut progress,
        observe,
    )?;
    if let Some(violation) = first_violation_of(rows.finish()?)? {
        return Err(violation);
    }
    match stream_error {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// `feed` without its first `n` rows.
fn skip_rows(feed: SnapshotFeed, mut n: u64) -> SnapshotFeed {
    if n == 0 {
        return feed;
    }
    Box::new(feed.filter_map(move |item| match item {
        Ok((file, batch)) if n > 0 => {
            let rows = batch.num_rows() as u64;
            let skip = n.min(rows);
            n -= skip;
            // `skip` is at most the batch's row count, a usize.
            let skip = skip as usize;
            (skip < batch.num_rows())
                .then(|| Ok((file, batch.slice(skip, batch.num_rows() - skip))))
        }
        item => Some(item),
    }))
}

/// Resumes `rows` from checkpoint `from` (see [`KeyedChanges::resume`]); `Ok(false)` if
/// it cannot be.
fn resume_from(
    dataset: &Dataset,
    rows: &mut KeyedChanges,
    touched: &KeyFilter,
    place: &RunPlace,
    from: &ValidationCheckpoint,
) -> Result<bool> {
    let mut files = Vec::with_capacity(from.files.len());
    for &(file, first_seq) in &from.files {
        match dataset.snapshot_files().get(file) {
            Some(path) => files.push((path.clone(), first_seq)),
            None => return Ok(false),
        }
    }
    rows.resume(touched.clone(), place, from.sort.clone(), &files)
}

/// Where the snapshot pass is, for its checkpoints.
#[derive(Debug, Default)]
struct Progress {
    /// As [`ValidationCheckpoint::files`].
    files: Vec<(usize, u64)>,
    /// The snapshot rows at the last checkpoint (or the one resumed from).
    last_checkpoint: u64,
    /// Snapshot rows between checkpoints; `None`: no checkpoints.
    every: Option<u64>,
}

impl Progress {
    /// Notes that snapshot file `file` begins at snapshot row `first_seq`.
    fn begin_file(&mut self, file: usize, first_seq: u64) {
        if self.files.last().is_none_or(|&(f, _)| f != file) {
            self.files.push((file, first_seq));
        }
    }

    /// The snapshot's row (within its file) that file `file` resumes at, from snapshot row
    /// `at`.
    fn row_in_file(&self, file: usize, at: u64) -> u64 {
        match self.files.last() {
            Some(&(f, first)) if f == file => at - first,
            _ => 0,
        }
    }

    /// Makes a checkpoint at `summary.snapshot_rows` (a chunk boundary) if one is due and
    /// `rows` can.
    fn maybe_checkpoint(
        &mut self,
        rows: &mut KeyedChanges,
        summary: &DatasetSummary,
        observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(every) = self.every else {
            return Ok(());
        };
        if summary.snapshot_rows < self.last_checkpoint.saturating_add(every) {
            return Ok(());
        }
        let Some(sort) = rows.checkpoint()? else {
            // The snapshot's key order broke: no more checkpoints.
            self.every = None;
            return Ok(());
        };
        self.last_checkpoint = summary.snapshot_rows;
        observe(Observed::Checkpoint(&ValidationCheckpoint {
            snapshot_rows: summary.snapshot_rows,
            files: self.files.clone(),
            sort,
        }))
    }
}

/// Reads the snapshot and the changelog into `rows`, counting. `Ok(Some(e))`: the data is
/// bad at `e`, and only the rows before the batch of `e` were added; `Err`: a system error.
/// The snapshot starts at row `summary.snapshot_rows` (a resumed pass, see `progress`).
fn read(
    dataset: &Dataset,
    snapshot: SnapshotFeed,
    rows: &mut KeyedChanges,
    summary: &mut DatasetSummary,
    progress: &mut Progress,
    observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
) -> Result<Option<Error>> {
    macro_rules! input {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Ok(Some(e)),
            }
        };
    }
    // Rows are taken BATCH_SIZE at a time from the start of each file, whatever the batches
    // they come in: which error is met first depends on it (module docs).
    let mut chunk: Option<Chunk> = None;
    for item in snapshot {
        let (file, batch) = match item {
            Ok(item) => item,
            Err(e) => {
                // What was read before the error comes first. (Read BATCH_SIZE rows a
                // batch, a chunk left is the end of a file before the one that failed.)
                if let Some(chunk) = &mut chunk {
                    input!(chunk.flush(dataset, rows, summary, observe)?);
                }
                return Ok(Some(e));
            }
        };
        let current = match &mut chunk {
            Some(current) if current.file == file => current,
            _ => {
                if let Some(done) = &mut chunk {
                    input!(done.flush(dataset, rows, summary, observe)?);
                    progress.maybe_checkpoint(rows, summary, observe)?;
                }
                // (A resumed pass may begin within its first file.)
                let first_row = progress.row_in_file(file, summary.snapshot_rows);
                progress.begin_file(file, summary.snapshot_rows - first_row);
                chunk.insert(Chunk {
                    file,
                    first_row,
                    ..Chunk::default()
                })
            }
        };
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = (BATCH_SIZE - current.rows).min(batch.num_rows() - offset);
            current.pieces.push(batch.slice(offset, len));
            current.rows += len;
            offset += len;
            if current.rows == BATCH_SIZE {
                input!(current.flush(dataset, rows, summary, observe)?);
                progress.maybe_checkpoint(rows, summary, observe)?;
            }
        }
    }
    if let Some(chunk) = &mut chunk {
        input!(chunk.flush(dataset, rows, summary, observe)?);
    }
    for changes in Prefetch::new(
        "backfill-validate",
        READ_AHEAD,
        dataset.changelog(BATCH_SIZE),
    )? {
        let changes = input!(changes);
        input!(rows.push_changes(&changes)?);
        observe(Observed::Changes(
            &changes.data,
            &changes.ops,
            rows.certificate_hashes(),
        ))?;
        for &epoch in &changes.epochs {
            if summary.last_epoch != Some(epoch) {
                summary.epochs += 1;
                summary.first_epoch.get_or_insert(epoch);
                summary.last_epoch = Some(epoch);
            }
        }
        summary.change_rows += changes.ops.len() as u64;
    }
    Ok(None)
}

/// Up to [`BATCH_SIZE`] rows of one snapshot file, gathered from the batches read.
#[derive(Default)]
struct Chunk {
    /// The file's index in [`Dataset::snapshot_files`].
    file: usize,
    /// The file's row the chunk starts at.
    first_row: u64,
    pieces: Vec<RecordBatch>,
    rows: usize,
}

impl Chunk {
    /// Adds the chunk's rows to `rows` (a bad row: `Ok(Err(..))`, nothing added) and starts
    /// the next chunk of the file.
    fn flush(
        &mut self,
        dataset: &Dataset,
        rows: &mut KeyedChanges,
        summary: &mut DatasetSummary,
        observe: &mut dyn FnMut(Observed<'_>) -> Result<()>,
    ) -> Result<Result<()>> {
        let bytes: usize = (self.pieces.iter())
            .map(|p| files::batch_offset_bytes(p, 0, p.num_rows()))
            .sum();
        let batches = match self.pieces.as_slice() {
            [] => return Ok(Ok(())),
            [one] => vec![one.clone()],
            // Pieces whose strings one array might not hold go on as they are.
            many if bytes > files::GATHER_BYTES => many.to_vec(),
            // Batches that do not fall on chunk boundaries: one copy of the chunk.
            many => vec![crate::dictionary::concat_batches(&many[0].schema(), many)?],
        };
        let path = dataset
            .snapshot_files()
            .get(self.file)
            .ok_or_else(|| internal!("snapshot file {} out of range", self.file))?;
        for batch in &batches {
            let mut pushed = rows.push_snapshot(path, self.first_row, batch)?;
            if let Some(until) = rows.left_out_until() {
                // The snapshot's key order broke in this chunk: the rows left out of the
                // sort before it go in first, then the chunk.
                push_left_out(dataset, rows, until)?;
                pushed = rows.push_snapshot(path, self.first_row, batch)?;
            }
            if let Err(e) = pushed {
                return Ok(Err(e));
            }
            observe(Observed::Snapshot(batch, rows.certificate_hashes()))?;
            summary.snapshot_rows += batch.num_rows() as u64;
            self.first_row += batch.num_rows() as u64;
        }
        self.pieces.clear();
        self.rows = 0;
        Ok(Ok(()))
    }
}

/// Sorts the snapshot rows `rows` left out before sequence `until`, when the snapshot's key
/// order broke there ([`KeyedChanges::left_out_until`]): reads the snapshot again from its
/// start (its rows are the first of the sequence, in order) up to that row.
fn push_left_out(dataset: &Dataset, rows: &mut KeyedChanges, until: u64) -> Result<()> {
    let mut seq = 0;
    for item in dataset.read_snapshot_files(BATCH_SIZE) {
        if seq >= until {
            break;
        }
        let (_, batch) = item?;
        let n = batch.num_rows() as u64;
        let batch = match usize::try_from(until - seq) {
            Ok(left) if left < batch.num_rows() => batch.slice(0, left),
            _ => batch,
        };
        rows.push_left_out(&batch, seq)?;
        seq += n;
    }
    if seq < until {
        return Err(internal!(
            "the snapshot has fewer rows ({seq}) than the validation read ({until})"
        ));
    }
    rows.left_out_pushed();
    Ok(())
}

/// The validation pass with the whole table in memory: the reference the bounded one must
/// agree with, error for error.
#[cfg(test)]
pub(crate) fn validate_in_memory(dataset: &Dataset) -> Result<DatasetSummary> {
    use super::model::KeyedTable;
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let mut table = KeyedTable::<u64>::new(dataset.schema(), desc.pk().clone())?;
    let mut summary = DatasetSummary::default();
    for path in dataset.snapshot_files() {
        let mut first_row = 0u64;
        for batch in dataset.snapshot_file_reader(path, BATCH_SIZE)? {
            let batch = batch?;
            table.load(&batch, |i, message| {
                Error::dataset(path, format!("row {}", first_row + i as u64), message)
            })?;
            first_row += batch.num_rows() as u64;
        }
        summary.snapshot_rows += first_row;
    }
    for rows in dataset.changelog(BATCH_SIZE) {
        let rows = rows?;
        table.apply(&rows.data, &rows.ops, |i, message| {
            rows.location(i).error(message)
        })?;
        for &epoch in &rows.epochs {
            if summary.last_epoch != Some(epoch) {
                summary.epochs += 1;
                summary.first_epoch.get_or_insert(epoch);
                summary.last_epoch = Some(epoch);
            }
        }
        summary.change_rows += rows.ops.len() as u64;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::testing::{
        MANIFEST, assert_dataset_error, changes, dataset, random_dataset, raw_changes, rows,
    };

    fn check(
        snapshot: &[&str],
        change_files: &[arrow_array::RecordBatch],
    ) -> Result<DatasetSummary> {
        let snapshot: Vec<_> = snapshot.iter().map(|t| rows(t)).collect();
        let dir = dataset(MANIFEST, &snapshot, change_files);
        Dataset::open(dir.path())?.validate()
    }

    #[test]
    fn valid_dataset_is_counted() {
        let summary = check(
            &["1 a\n2 b", "3 c"],
            &[
                changes(&[(7, "+ 4 d\nU- 1 a\nU+ 1 x"), (7, "- 2 b")]),
                changes(&[(9, "+ 2 b2\n- 4 d\n+ 4 d"), (12, "U- 3 c\nU+ 5 c")]),
            ],
        )
        .unwrap();
        assert_eq!(
            summary,
            DatasetSummary {
                snapshot_rows: 3,
                change_rows: 9,
                epochs: 3,
                first_epoch: Some(7),
                last_epoch: Some(12),
            }
        );
    }

    #[test]
    fn no_changes_is_valid() {
        let summary = check(&["1 a"], &[]).unwrap();
        assert_eq!((summary.snapshot_rows, summary.epochs), (1, 0));
        assert_eq!(summary.first_epoch, None);
    }

    #[test]
    fn snapshot_null_key_names_file_and_row() {
        let err = check(&["1 a", "2 b\nNULL c"], &[]).unwrap_err();
        assert_dataset_error(
            err,
            "snapshot/part-00001.parquet",
            "row 1",
            "NULL in primary key column `k`",
        );
    }

    #[test]
    fn snapshot_duplicate_key_names_file_and_row() {
        let err = check(&["1 a\n2 b", "3 c\n2 z"], &[]).unwrap_err();
        assert_dataset_error(
            err,
            "snapshot/part-00001.parquet",
            "row 1",
            "duplicate primary key (k=2)",
        );
    }

    #[test]
    fn unknown_op_code() {
        let bad = raw_changes(&[
            (Some(1), Some(1), Some(5), None),
            (Some(1), Some(7), Some(6), None),
        ]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 1",
            "unknown op code 7",
        );
    }

    #[test]
    fn null_epoch_and_null_op() {
        let bad = raw_changes(&[
            (Some(1), Some(1), Some(5), None),
            (None, Some(1), Some(6), None),
        ]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(err, "changes/part-00000.parquet", "row 1", "NULL `_epoch`");
        let bad = raw_changes(&[(Some(3), None, Some(5), None)]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 3, row 0",
            "NULL `_op`",
        );
    }

    #[test]
    fn decreasing_epoch_within_and_across_files() {
        let err = check(&["1 a"], &[changes(&[(5, "+ 2 b"), (4, "+ 3 c")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 4, row 1",
            "after epoch 5",
        );
        let err = check(
            &["1 a"],
            &[
                changes(&[(5, "+ 2 b")]),
                changes(&[(5, "+ 3 c"), (2, "+ 4 d")]),
            ],
        )
        .unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00001.parquet",
            "epoch 2, row 1",
            "must never decrease",
        );
    }

    #[test]
    fn lone_update_halves() {
        // U- followed by an insert.
        let bad = raw_changes(&[
            (Some(1), Some(3), Some(1), Some("a")),
            (Some(1), Some(1), Some(2), None),
        ]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 0",
            "not immediately followed",
        );
        // U- at the very end.
        let bad = raw_changes(&[
            (Some(1), Some(1), Some(2), None),
            (Some(1), Some(3), Some(1), Some("a")),
        ]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 1",
            "end of the changelog",
        );
        // U+ alone.
        let bad = raw_changes(&[(Some(2), Some(4), Some(1), Some("b"))]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 2, row 0",
            "without an immediately preceding",
        );
        // A pair split by an epoch boundary.
        let bad = raw_changes(&[
            (Some(1), Some(3), Some(1), Some("a")),
            (Some(2), Some(4), Some(1), Some("b")),
        ]);
        let err = check(&["1 a"], &[bad]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 0",
            "same epoch",
        );
    }

    #[test]
    fn update_pair_across_files_is_fine() {
        let a = raw_changes(&[(Some(1), Some(3), Some(1), Some("a"))]);
        let b = raw_changes(&[(Some(1), Some(4), Some(1), Some("b"))]);
        assert_eq!(check(&["1 a"], &[a, b]).unwrap().change_rows, 2);
    }

    #[test]
    fn deletes_of_absent_keys() {
        let err = check(&["1 a"], &[changes(&[(1, "+ 2 b"), (2, "- 3 c")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 2, row 1",
            "delete of key (k=3), which does not exist",
        );
        let err = check(&["1 a"], &[changes(&[(1, "- 1 a\nU- 1 a\nU+ 1 b")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 1",
            "update-delete (U-) of key (k=1)",
        );
    }

    #[test]
    fn inserts_of_existing_keys() {
        let err = check(&["1 a"], &[changes(&[(1, "+ 2 b\n+ 1 z")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 1",
            "insert of key (k=1), which already exists",
        );
        // U- applies before U+: a pair with different keys is a delete then an insert.
        let err = check(&["1 a\n2 b"], &[changes(&[(3, "U- 1 a\nU+ 2 x")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 3, row 1",
            "update-insert (U+) of key (k=2)",
        );
        assert!(check(&["1 a"], &[changes(&[(3, "U- 1 a\nU+ 2 x\n+ 1 y")])]).is_ok());
    }

    #[test]
    fn delete_with_other_values() {
        let err = check(&["1 a"], &[changes(&[(1, "- 1 b")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 1, row 0",
            "differ from the stored row",
        );
    }

    #[test]
    fn null_key_in_a_change() {
        let err = check(&["1 a"], &[changes(&[(4, "+ 2 b\n+ NULL c")])]).unwrap_err();
        assert_dataset_error(
            err,
            "changes/part-00000.parquet",
            "epoch 4, row 1",
            "NULL in primary key column `k`",
        );
    }

    /// Which of two errors is reported depends on the chunks rows are taken in: a duplicate
    /// key in the first chunk comes before a NULL key in the second (the first chunk is
    /// applied before the second is read), a NULL in the same chunk first. Fed in batches of
    /// any size, the pass takes the same chunks.
    #[test]
    fn fed_batches_of_any_size_meet_the_same_first_error() {
        for (null_at, message) in [
            (BATCH_SIZE + 5, "duplicate"),
            (BATCH_SIZE - 5, "NULL in primary key"),
        ] {
            let text: String = (0..BATCH_SIZE + 100)
                .map(|i| match i {
                    10 => "3 dup\n".to_string(),
                    i if i == null_at => "NULL x\n".to_string(),
                    i => format!("{i} v\n"),
                })
                .collect();
            let dir = dataset(MANIFEST, &[rows(&text)], &[]);
            let ds = Dataset::open(dir.path()).unwrap();
            let expected = format!("{:?}", ds.validate());
            assert!(expected.contains(message), "{expected}");
            for batch_rows in [7, 1000, BATCH_SIZE, 4 * BATCH_SIZE] {
                let options = ExternalSortOptions::new(std::env::temp_dir());
                let feed: SnapshotFeed = Box::new(ds.read_snapshot_files(batch_rows));
                let found = format!(
                    "{:?}",
                    validate_with(&ds, &options, Some((feed, 0)), None, &mut |_| Ok(()))
                );
                assert_eq!(found, expected, "fed {batch_rows} rows a batch");
            }
        }
    }

    /// A file that cannot be decoded comes after the rows of the files before it: a
    /// duplicate key in the last rows of the first file is the error reported, fed or not.
    #[test]
    fn rows_before_an_unreadable_file_are_checked_first() {
        let dir = dataset(MANIFEST, &[rows("1 a\n2 b\n1 c"), rows("5 e\n6 f")], &[]);
        let ds = Dataset::open(dir.path()).unwrap();
        // Garbage over the second file's first page (its footer, read on open, stays).
        let second = ds.snapshot_files()[1].clone();
        let mut bytes = std::fs::read(&second).unwrap();
        for b in &mut bytes[4..40] {
            *b = 0xEE;
        }
        std::fs::write(&second, bytes).unwrap();
        let expected = format!("{:?}", ds.validate());
        assert!(expected.contains("duplicate"), "{expected}");
        let options = ExternalSortOptions::new(std::env::temp_dir());
        let feed: SnapshotFeed = Box::new(ds.read_snapshot_files(BATCH_SIZE));
        let found = format!(
            "{:?}",
            validate_with(&ds, &options, Some((feed, 0)), None, &mut |_| Ok(()))
        );
        assert_eq!(found, expected);
    }

    /// Asserts that the bounded validator's result for `ds` is the in-memory model's, error
    /// for error (the same file, row, epoch and message), with each memory budget of
    /// `budgets` and with the snapshot fed in batches of each size of `fed`; whether `ds`
    /// is valid.
    fn agrees_with_the_model(
        ds: &Dataset,
        scratch: &std::path::Path,
        budgets: &[usize],
        fed: &[usize],
        case: usize,
    ) -> bool {
        let expected = format!("{:?}", validate_in_memory(ds));
        for &budget in budgets {
            let options = ExternalSortOptions::new(scratch).with_memory_budget(budget);
            let found = format!(
                "{:?}",
                validate_with(ds, &options, None, None, &mut |_| Ok(()))
            );
            assert_eq!(found, expected, "case {case}, budget {budget}");
        }
        for &batch_rows in fed {
            let options = ExternalSortOptions::new(scratch);
            let feed: SnapshotFeed = Box::new(ds.read_snapshot_files(batch_rows));
            let found = format!(
                "{:?}",
                validate_with(ds, &options, Some((feed, 0)), None, &mut |_| Ok(()))
            );
            assert_eq!(
                found, expected,
                "case {case}, fed {batch_rows} rows a batch"
            );
        }
        expected.starts_with("Ok")
    }

    /// A random dataset whose snapshot comes in key order, case `case` of a series: with
    /// faults one time in four; its order broken at the end (case 1 mod 5) or by a
    /// duplicate of a key met before (2 mod 5); more than one chunk, its order broken or not
    /// after [`BATCH_SIZE`] rows (3 mod 5).
    fn key_ordered_dataset(rng: &mut rand::rngs::StdRng, case: usize) -> tempfile::TempDir {
        use crate::replay::testing::{log, random_dataset_text, split};
        use rand::Rng;
        let key = |line: &str| line.split(' ').next().and_then(|k| k.parse::<i64>().ok());
        let (snapshot, change_files) = random_dataset_text(rng, case.is_multiple_of(4));
        let mut lines: Vec<String> = snapshot
            .iter()
            .flat_map(|t| t.lines())
            .map(String::from)
            .collect();
        lines.sort_by_key(|line| key(line));
        match case % 5 {
            // Order broken at the end, or by a duplicate of a key met before.
            1 if lines.len() > 2 => {
                let last = lines.len() - 1;
                lines.swap(last - 1, last);
            }
            2 if !lines.is_empty() => {
                let again = lines[rng.random_range(0..lines.len())].clone();
                lines.push(again);
            }
            // More than one chunk: the order breaks (or not) after BATCH_SIZE rows.
            3 => {
                let base = 1000;
                let mut long: Vec<String> = (0..BATCH_SIZE as i64 + 50)
                    .map(|k| format!("{} v", base + k))
                    .collect();
                if rng.random_bool(0.5) {
                    long.push(format!(
                        "{} dup",
                        base + rng.random_range(0..BATCH_SIZE as i64)
                    ));
                }
                lines.extend(long);
            }
            _ => {}
        }
        let snapshot: Vec<_> = split(rng, &lines, 3).iter().map(|t| rows(t)).collect();
        let snapshot = if snapshot.is_empty() {
            vec![rows("")]
        } else {
            snapshot
        };
        let change_files: Vec<_> = change_files.iter().map(|t| log(t)).collect();
        dataset(MANIFEST, &snapshot, &change_files)
    }

    /// Differential, with snapshots in key order (whose rows no change touches the pass
    /// leaves out of its sort, `touched.rs`): the same errors as the in-memory model, also
    /// when the order breaks late (the rows left out are sorted after all), at a duplicate
    /// key or in a chunk after the first.
    #[test]
    fn snapshots_in_key_order_agree_with_the_in_memory_model() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x04de7);
        let scratch = tempfile::tempdir().unwrap();
        let mut valid = 0;
        for case in 0..160 {
            let dir = key_ordered_dataset(&mut rng, case);
            let ds = Dataset::open(dir.path()).unwrap();
            valid += usize::from(agrees_with_the_model(
                &ds,
                scratch.path(),
                &[1, 1 << 20],
                &[7],
                case,
            ));
        }
        assert!(
            valid > 20 && 160 - valid > 20,
            "{valid} of 160 datasets valid"
        );
    }

    /// Differential: the bounded validator and the in-memory model agree, error for error
    /// (the same file, row, epoch and message), whatever the budget.
    #[test]
    fn agrees_with_the_in_memory_model() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let scratch = tempfile::tempdir().unwrap();
        let mut valid = 0;
        for case in 0..150 {
            let (snapshot, change_files) = random_dataset(&mut rng, case % 4 != 0);
            let dir = dataset(MANIFEST, &snapshot, &change_files);
            let ds = Dataset::open(dir.path()).unwrap();
            // Fed in batches of other sizes too, as a replay's load reads the snapshot.
            let (budgets, fed) = ([1, 4 << 10, 1 << 20], [1, 3, BATCH_SIZE * 2]);
            valid += usize::from(agrees_with_the_model(
                &ds,
                scratch.path(),
                &budgets,
                &fed,
                case,
            ));
        }
        assert!(
            valid > 20 && 150 - valid > 20,
            "{valid} of 150 datasets valid"
        );
        let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
        assert!(left.is_empty(), "scratch space is cleaned up: {left:?}");
    }

    /// A pass with checkpoints meets the same result (and digest) as one without; a pass
    /// resumed from one of them, its observer's state restored as the checkpoint had it,
    /// meets the same result and digest; a checkpoint whose files changed is not resumed
    /// from: the pass starts over, with the same result.
    #[test]
    fn a_pass_resumed_from_a_checkpoint_agrees_with_a_whole_one() {
        use crate::job::TableDigest;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xc4ec);
        let scratch = tempfile::tempdir().unwrap();
        let (mut resumed_cases, mut damaged_cases) = (0, 0);
        for case in 0..160 {
            let dir = key_ordered_dataset(&mut rng, case);
            let ds = Dataset::open(dir.path()).unwrap();
            let desc = ds.table_desc(VnodeCount::new(7).unwrap()).unwrap();
            let mut whole_digest = TableDigest::new(desc.vnode_count());
            let whole = ds.validate_observed_from(scratch.path(), None, &mut |rows| {
                whole_digest.observe(&desc, rows)
            });
            let whole = format!("{whole:?}");
            assert_eq!(
                whole,
                format!("{:?}", validate_in_memory(&ds)),
                "case {case}"
            );

            let runs = tempfile::tempdir().unwrap();
            let place = RunPlace {
                dir: runs.path().to_path_buf(),
                prefix: "t".into(),
            };
            let mut checkpoints = Checkpoints {
                place,
                every_rows: rng.random_range(1..20),
                resume: None,
            };
            let mut made = Vec::new();
            let mut digest = TableDigest::new(desc.vnode_count());
            let found = ds.validate_checkpointed(scratch.path(), None, &checkpoints, &mut |o| {
                match o {
                    Observed::Checkpoint(c) => made.push((c.clone(), digest.clone())),
                    Observed::Resumed(_) => panic!("case {case}: nothing to resume"),
                    rows => digest.observe(&desc, rows)?,
                }
                Ok(())
            });
            assert_eq!(format!("{found:?}"), whole, "case {case}, with checkpoints");
            if found.is_ok() {
                assert_eq!(digest, whole_digest, "case {case}");
            }
            if made.is_empty() {
                continue;
            }
            let (from, at) = made.swap_remove(rng.random_range(0..made.len()));
            let first_segment = from.sort.segments.iter().flatten().next().cloned();
            let damaged = match first_segment {
                Some(segment) if rng.random_bool(0.3) => {
                    let path = runs.path().join(&segment.name);
                    let mut bytes = std::fs::read(&path).unwrap();
                    bytes[0] ^= 1;
                    std::fs::write(&path, bytes).unwrap();
                    true
                }
                _ => false,
            };
            checkpoints.resume = Some(from);
            let mut digest = TableDigest::new(desc.vnode_count());
            let mut resumed = false;
            let found = ds.validate_checkpointed(scratch.path(), None, &checkpoints, &mut |o| {
                match o {
                    Observed::Resumed(_) => {
                        resumed = true;
                        digest = at.clone();
                    }
                    Observed::Checkpoint(_) => {}
                    rows => digest.observe(&desc, rows)?,
                }
                Ok(())
            });
            assert_eq!(format!("{found:?}"), whole, "case {case}, resumed");
            assert_eq!(resumed, !damaged, "case {case}: resumed unless damaged");
            if found.is_ok() {
                assert_eq!(digest, whole_digest, "case {case}, resumed");
            }
            resumed_cases += usize::from(resumed);
            damaged_cases += usize::from(damaged);
        }
        assert!(
            resumed_cases > 20 && damaged_cases > 5,
            "{resumed_cases} resumed, {damaged_cases} damaged"
        );
    }

    /// A changelog too long for the key filter's share of a budget still gets a filter (up
    /// to [`MAX_FILTER_BYTES`]): the snapshot's untouched rows are left out of the sort, so
    /// the pass keeps checkpoints, and its result is the same.
    #[test]
    fn a_long_changelog_for_the_budget_still_gets_a_key_filter() {
        use crate::replay::testing::{changes, rows};
        let snapshot = [rows("1 a\n2 b\n3 c"), rows("4 d\n5 e")];
        let change_files = [changes(&[(7, "U- 2 b\nU+ 2 x\n- 4 d"), (8, "+ 9 j")])];
        let dir = dataset(MANIFEST, &snapshot, &change_files);
        let ds = Dataset::open(dir.path()).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let runs = tempfile::tempdir().unwrap();
        // A quarter of 4 bytes holds no filter (of 64 bits at least).
        let options = ExternalSortOptions::new(scratch.path()).with_memory_budget(4);
        let checkpoints = Checkpoints {
            place: RunPlace {
                dir: runs.path().to_path_buf(),
                prefix: "t".into(),
            },
            every_rows: 1,
            resume: None,
        };
        let mut made = 0;
        let found = validate_with(&ds, &options, None, Some(&checkpoints), &mut |o| {
            made += usize::from(matches!(o, Observed::Checkpoint(_)));
            Ok(())
        });
        assert_eq!(
            format!("{found:?}"),
            format!("{:?}", validate_in_memory(&ds))
        );
        assert!(made > 0, "no checkpoint: no key filter");
    }
}
