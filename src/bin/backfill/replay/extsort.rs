//! External sort of Arrow batches by primary key, in memory bounded by a budget.
//!
//! Validation and verification look at a table key by key; the table does not have to fit in
//! memory for that, only in the scratch directory. [`ExternalSorter`] takes batches in any
//! order and hands them back sorted by a [`PrimaryKey`], **stably** (rows with equal keys come
//! out in the order they were pushed):
//!
//! ```text
//!   push ──> buffer (≤ run_bytes) ──full──> sort (rayon) ──> run-0000.arrow ─┐
//!   push ──> buffer ───────────────full──> sort ───────────> run-0001.arrow ─┼─> merge pass(es)
//!   ...                                                                      │   (≤ fan_in runs
//!   finish ─> last buffer ─────────────────> sort ───────────> run-000n.arrow ─┘    at a time)
//!                                                                              │
//!                              SortedStream <── loser tree over ≤ fan_in runs ──┘
//! ```
//!
//! - A full buffer is sorted and written on a background thread while the next one fills;
//!   the sort itself is a parallel stable sort of `(batch, row)` indices by encoded key.
//! - Input that comes in key order (a snapshot dumped from an arrangement) is not sorted at
//!   all: a buffer already in order is written as it is, and appended to the run before it
//!   when it starts at or after that run's last key, so a sorted table becomes one run
//!   however large, written once, with no sort and no gather of its rows.
//! - Runs are Arrow IPC streams of the typed columns: arrow-row bytes are not a persisted
//!   format (docs/DESIGN.md section 5), so keys are re-encoded with the same [`PrimaryKey`]
//!   when a run is read back.
//! - With more runs than `fan_in`, consecutive groups of runs are merged into longer runs
//!   first, so the final merge reads at most `fan_in` runs at once. Merging consecutive runs
//!   and breaking ties by run index keeps the sort stable.
//! - Input that fits in one buffer never touches the disk.
//!
//! Memory is bounded by the budget, independent of the input: one filling buffer and one run
//! being sorted (`run_bytes = budget / 4` each, plus their keys and indices), or during a merge
//! about two batches of `batch_bytes` per run read (`fan_in * batch_bytes = budget / 16`).
//! Scratch files live in a directory the caller owns (a [`ScratchDir`]: locked, removed on
//! drop, swept once its owner died); runs are deleted as soon as they are merged.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use arrow_array::cast::AsArray;
use arrow_array::{Array, BinaryArray, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use arrow_select::interleave::interleave;
use rayon::slice::ParallelSliceMut;

use super::scratch::ScratchDir;
use crate::error::{Error, Result, internal};
use crate::key::{KeyPrefix, PrimaryKey};
use crate::merge::{Entry, LoserTree};
use arrangement_backfill::interleave::interleave_batches;

/// The default memory budget of [`Dataset::validate`](super::Dataset::validate) and
/// [`super::verify`]: 64 MiB.
pub const DEFAULT_MEMORY_BUDGET: usize = 64 << 20;

/// The most rows in one spilled or merged batch.
const MAX_BATCH_ROWS: usize = 8192;

/// Where validation and verification spill, and how much memory they may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalSortOptions {
    /// The directory for scratch files. Each pass makes its own subdirectory in it,
    /// `backfill-sort-XXXXXX`, removed when the pass ends, also on error, and locked while it
    /// lives: a pass first removes the subdirectories of processes that died (see
    /// `scratch.rs`). Should be on a disk, not a RAM-backed `tmpfs`.
    pub scratch_dir: PathBuf,
    /// The memory the sorts may use, in bytes (approximately: Arrow buffer sizes). The
    /// reading of the input (Parquet decoding) comes on top.
    pub memory_budget: usize,
}

impl ExternalSortOptions {
    /// Options that spill to `scratch_dir` with the [`DEFAULT_MEMORY_BUDGET`].
    pub fn new(scratch_dir: impl Into<PathBuf>) -> Self {
        Self {
            scratch_dir: scratch_dir.into(),
            memory_budget: DEFAULT_MEMORY_BUDGET,
        }
    }

    /// The same options with another memory budget.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// A fresh scratch subdirectory of [`Self::scratch_dir`], removed when dropped, after
    /// the removal of dead processes' ones there.
    pub(crate) fn scratch(&self) -> Result<ScratchDir> {
        ScratchDir::create(&self.scratch_dir)
    }
}

/// How a budget is spent. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SortConfig {
    /// Buffered bytes that make a run.
    pub run_bytes: usize,
    /// Target bytes of one batch in a run file.
    pub batch_bytes: usize,
    /// The most runs merged at once (at least 2).
    pub fan_in: usize,
}

impl SortConfig {
    /// The most runs merged at once for large budgets: more would make run batches small.
    const MAX_FAN_IN: usize = 64;

    /// Bytes per run being merged below which the fan-in shrinks.
    const MIN_MERGE_BYTES: usize = 64 << 10;

    /// The share of one of `parts` sorts that together stay within this configuration's
    /// memory.
    pub fn split(self, parts: usize) -> Self {
        let parts = parts.max(1);
        Self {
            run_bytes: (self.run_bytes / parts).max(1),
            batch_bytes: (self.batch_bytes / parts).max(1),
            fan_in: self.fan_in,
        }
    }

    /// A configuration that stays within `budget` bytes.
    pub fn for_budget(budget: usize) -> Self {
        let run_bytes = (budget / 4).max(1);
        let fan_in = (budget / Self::MIN_MERGE_BYTES).clamp(2, Self::MAX_FAN_IN);
        // Each run being merged holds about two batches (its head and one waiting to be
        // copied out): `fan_in * 2 * batch_bytes = budget / 8`. Making runs takes the most
        // memory; the merge, whose size grows with the number of runs (the table's size) up
        // to `fan_in`, stays well below it.
        let batch_bytes = (budget / (16 * fan_in)).clamp(1, 4 << 20);
        Self {
            run_bytes,
            batch_bytes,
            fan_in,
        }
    }
}

/// Sorted rows and their encoded keys (byte order is key order).
#[derive(Debug, Clone)]
pub(crate) struct SortedBatch {
    /// The rows.
    pub batch: RecordBatch,
    /// [`PrimaryKey::encode`] of the rows.
    pub keys: BinaryArray,
}

/// A sorted run on disk.
#[derive(Debug)]
pub(crate) struct Run {
    /// The run's files, read one after the other (one, except for an
    /// [`OrderedRun`](super::ordered_run::OrderedRun)'s segments).
    paths: Vec<PathBuf>,
    /// Rows per batch in the files (the last of each may have fewer).
    batch_rows: usize,
    /// The sort deletes the files once read (it made them); otherwise they are left.
    owned: bool,
}

impl Run {
    /// A run the sort made, in one file it deletes once read.
    fn new(path: PathBuf, batch_rows: usize) -> Self {
        Self {
            paths: vec![path],
            batch_rows,
            owned: true,
        }
    }

    /// A run made elsewhere, its rows in key order in `paths` one after the other (batches
    /// of about `batch_rows`); the sort leaves the files in place.
    pub(crate) fn segments(paths: Vec<PathBuf>, batch_rows: usize) -> Self {
        Self {
            paths,
            batch_rows,
            owned: false,
        }
    }
}

/// The sorter. See the module docs.
pub(crate) struct ExternalSorter {
    schema: SchemaRef,
    key: PrimaryKey,
    dir: PathBuf,
    name: String,
    config: SortConfig,
    buffer: Vec<RecordBatch>,
    buffered_bytes: usize,
    buffered_rows: usize,
    runs: Vec<Run>,
    /// The last run, while it is still open for a next buffer in order to extend it.
    open: Option<OpenRun>,
    runs_written: usize,
    in_flight: Option<JoinHandle<Result<Spilled>>>,
    /// Bytes written to scratch files, merge passes included.
    spilled: Arc<AtomicU64>,
}

impl ExternalSorter {
    /// A sorter of batches of `schema` by `key` (resolved against `schema`), spilling to
    /// files named `{name}-*.arrow` in `dir`.
    pub fn new(
        schema: SchemaRef,
        key: PrimaryKey,
        dir: &Path,
        name: &str,
        config: SortConfig,
    ) -> Self {
        Self {
            schema,
            key,
            dir: dir.to_path_buf(),
            name: name.to_string(),
            config,
            buffer: Vec::new(),
            buffered_bytes: 0,
            buffered_rows: 0,
            runs: Vec::new(),
            open: None,
            runs_written: 0,
            in_flight: None,
            spilled: Arc::default(),
        }
    }

    /// The schema of the batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Adds rows. Their schema must be the sorter's.
    pub fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.schema_ref() != &self.schema {
            return Err(internal!(
                "external sort of {:?} was given a batch of {:?}",
                self.schema,
                batch.schema()
            ));
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.buffered_bytes += batch.get_array_memory_size();
        self.buffered_rows += batch.num_rows();
        self.buffer.push(batch);
        if self.buffered_bytes >= self.config.run_bytes {
            self.spill_in_background()?;
        }
        Ok(())
    }

    /// Buffers spilled so far, or being spilled (a buffer in order may extend the run before
    /// it instead of starting one).
    #[cfg(test)]
    pub fn runs_written(&self) -> usize {
        self.runs_written
    }

    /// The count of bytes written to scratch files, merge passes (in [`Self::finish`])
    /// included.
    #[cfg(test)]
    pub fn bytes_spilled(&self) -> Arc<AtomicU64> {
        self.spilled.clone()
    }

    /// Rows per batch in a run of the buffered rows: about `batch_bytes` per batch.
    fn spill_batch_rows(&self) -> usize {
        let row_bytes = self
            .buffered_bytes
            .div_ceil(self.buffered_rows.max(1))
            .max(1);
        (self.config.batch_bytes / row_bytes).clamp(1, MAX_BATCH_ROWS)
    }

    fn next_run_path(&mut self) -> PathBuf {
        let path = self
            .dir
            .join(format!("{}-{:06}.arrow", self.name, self.runs_written));
        self.runs_written += 1;
        path
    }

    /// Takes the buffer: `(batches, rows per spilled batch)`.
    fn take_buffer(&mut self) -> (Vec<RecordBatch>, usize) {
        let batch_rows = self.spill_batch_rows();
        self.buffered_bytes = 0;
        self.buffered_rows = 0;
        (std::mem::take(&mut self.buffer), batch_rows)
    }

    /// Waits for the buffer being spilled, if any.
    fn join_in_flight(&mut self) -> Result<()> {
        if let Some(handle) = self.in_flight.take() {
            let (closed, open) = handle
                .join()
                .map_err(|_| internal!("an external sort thread panicked"))??;
            self.runs.extend(closed);
            self.open = open;
        }
        Ok(())
    }

    /// Sorts and writes the buffer as a run on a background thread (after the previous one
    /// is done, so at most one spill is in flight).
    fn spill_in_background(&mut self) -> Result<()> {
        self.join_in_flight()?;
        let path = self.next_run_path();
        let (batches, batch_rows) = self.take_buffer();
        let key = self.key.clone();
        let schema = self.schema.clone();
        let spilled = self.spilled.clone();
        let open = self.open.take();
        let handle = std::thread::Builder::new()
            .name("backfill-extsort".into())
            .spawn(move || spill(path, &schema, &key, batches, batch_rows, open, &spilled))
            .map_err(|e| Error::scratch(&self.dir, e))?;
        self.in_flight = Some(handle);
        Ok(())
    }

    /// All rows pushed, sorted.
    #[cfg(test)]
    pub fn finish(self) -> Result<SortedStream> {
        self.finish_after(None)
    }

    /// All rows pushed and those of `leading` (a run whose rows come before every row
    /// pushed that has the same key), sorted.
    pub fn finish_after(mut self, leading: Option<Run>) -> Result<SortedStream> {
        self.join_in_flight()?;
        if leading.is_none() && self.runs.is_empty() && self.open.is_none() {
            let (batches, batch_rows) = self.take_buffer();
            return Ok(SortedStream::Memory(MemorySorted::new(
                &self.key, batches, batch_rows,
            )?));
        }
        if !self.buffer.is_empty() {
            let path = self.next_run_path();
            let (batches, batch_rows) = self.take_buffer();
            let open = self.open.take();
            let (closed, open) = spill(
                path,
                &self.schema,
                &self.key,
                batches,
                batch_rows,
                open,
                &self.spilled,
            )?;
            self.runs.extend(closed);
            self.open = open;
        }
        if let Some(open) = self.open.take() {
            self.runs.push(open.close(&self.spilled)?);
        }
        // Ties go to the earlier run: the leading one first.
        let mut runs: Vec<Run> = leading.into_iter().chain(self.runs.drain(..)).collect();
        let fan_in = self.config.fan_in.max(2);
        while runs.len() > fan_in {
            let mut merged = Vec::with_capacity(runs.len().div_ceil(fan_in));
            let mut rest = runs.into_iter().peekable();
            while rest.peek().is_some() {
                let group: Vec<Run> = rest.by_ref().take(fan_in).collect();
                if group.len() == 1 {
                    merged.extend(group);
                    continue;
                }
                let path = self.next_run_path();
                merged.push(merge_to_run(
                    &self.schema,
                    &self.key,
                    group,
                    path,
                    &self.spilled,
                )?);
            }
            runs = merged;
        }
        Ok(SortedStream::Merge(Merge::new(&self.key, runs)?))
    }
}

impl Drop for ExternalSorter {
    fn drop(&mut self) {
        // An abandoned sort must not leave a thread writing into a directory being removed.
        if let Some(handle) = self.in_flight.take() {
            let _ = handle.join();
        }
    }
}

/// Whether the rows of `keys` (batch after batch) are in key order already: a stable sort
/// would leave them as they are.
fn in_order(keys: &[BinaryArray]) -> bool {
    let mut last: Option<&[u8]> = None;
    keys.iter().filter(|k| !k.is_empty()).all(|k| {
        let ordered = last.is_none_or(|last| last <= k.value(0))
            && (1..k.len()).all(|i| k.value(i - 1) <= k.value(i));
        last = Some(k.value(k.len() - 1));
        ordered
    })
}

/// The stable order of the rows of `batches` by key: `(batch, row)` pairs.
///
/// Each row is sorted with its [`KeyPrefix`]: most comparisons are integer compares in the
/// sorted array, and only rows whose prefixes tie compare their whole keys. Rows already in
/// order are left as they are, without a sort.
fn sort_order(keys: &[BinaryArray]) -> Result<Vec<(u32, u32)>> {
    if in_order(keys) {
        let mut order = Vec::with_capacity(keys.iter().map(|k| k.len()).sum());
        for (b, k) in keys.iter().enumerate() {
            let b = u32::try_from(b).map_err(|_| too_many_rows())?;
            let n = u32::try_from(k.len()).map_err(|_| too_many_rows())?;
            order.extend((0..n).map(|r| (b, r)));
        }
        return Ok(order);
    }
    sorted_order(keys)
}

/// The error of a sort run past 32-bit row numbers.
fn too_many_rows() -> Error {
    internal!("more than 2^32 rows or batches in one sort run")
}

/// [`sort_order`] of rows known to be out of order: always sorted.
fn sorted_order(keys: &[BinaryArray]) -> Result<Vec<(u32, u32)>> {
    let mut order: Vec<(KeyPrefix, u32, u32)> =
        Vec::with_capacity(keys.iter().map(|k| k.len()).sum());
    for (b, k) in keys.iter().enumerate() {
        let b = u32::try_from(b).map_err(|_| too_many_rows())?;
        let n = u32::try_from(k.len()).map_err(|_| too_many_rows())?;
        order.extend((0..n).map(|r| (KeyPrefix::of(k.value(r as usize)), b, r)));
    }
    // Equal keys keep their push order, `(batch, row)`, the last tie-break: the result of a
    // stable sort without a stable sort's scratch copy of `order`.
    order.par_sort_unstable_by(|&(ap, ab, ar), &(bp, bb, br)| {
        ap.cmp(&bp)
            .then_with(|| {
                keys[ab as usize]
                    .value(ar as usize)
                    .cmp(keys[bb as usize].value(br as usize))
            })
            .then((ab, ar).cmp(&(bb, br)))
    });
    Ok(order.into_iter().map(|(_, b, r)| (b, r)).collect())
}

fn encode_all(key: &PrimaryKey, batches: &[RecordBatch]) -> Result<Vec<BinaryArray>> {
    batches.iter().map(|b| Ok(key.encode(b)?)).collect()
}

/// Rows `order` of `batches` as one batch.
fn gather(batches: &[RecordBatch], order: &[(u32, u32)]) -> Result<RecordBatch> {
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    let indices: Vec<(usize, usize)> = order
        .iter()
        .map(|&(b, r)| (b as usize, r as usize))
        .collect();
    Ok(interleave_batches(&refs, &indices)?)
}

/// A run whose rows came in key order, its file still open: the next buffer extends it if
/// that buffer is in order too and starts at or after its last key.
struct OpenRun {
    run: Run,
    writer: RunWriter,
    /// The encoded key of its last row.
    last_key: Vec<u8>,
}

impl OpenRun {
    /// Finishes the file.
    fn close(self, spilled: &AtomicU64) -> Result<Run> {
        spilled.fetch_add(self.writer.finish()?, Ordering::Relaxed);
        Ok(self.run)
    }
}

/// What a spill leaves: the runs it finished, in order, and the run it left open.
type Spilled = (Vec<Run>, Option<OpenRun>);

/// Writes a buffer's `batches` (in push order) in batches of `batch_rows` rows: rows in key
/// order extend `open` (or start a new open run at `path`), others are sorted into a run of
/// their own at `path` (after `open` is finished).
fn spill(
    path: PathBuf,
    schema: &SchemaRef,
    key: &PrimaryKey,
    batches: Vec<RecordBatch>,
    batch_rows: usize,
    open: Option<OpenRun>,
    spilled: &AtomicU64,
) -> Result<Spilled> {
    let batch_rows = batch_rows.max(1);
    let keys = encode_all(key, &batches)?;
    let mut closed = Vec::new();
    let (Some(first), Some(last)) = (first_key(&keys), last_key(&keys)) else {
        // Nothing to write.
        return Ok((closed, open));
    };
    if !in_order(&keys) {
        if let Some(open) = open {
            closed.push(open.close(spilled)?);
        }
        let order = sorted_order(&keys)?;
        drop(keys);
        let mut writer = RunWriter::create(&path, schema)?;
        for chunk in order.chunks(batch_rows) {
            writer.write(&gather(&batches, chunk)?)?;
        }
        spilled.fetch_add(writer.finish()?, Ordering::Relaxed);
        closed.push(Run::new(path, batch_rows));
        return Ok((closed, None));
    }
    let mut open = match open {
        Some(open) if open.last_key.as_slice() <= first => open,
        other => {
            if let Some(open) = other {
                closed.push(open.close(spilled)?);
            }
            OpenRun {
                writer: RunWriter::create(&path, schema)?,
                run: Run::new(path, batch_rows),
                last_key: Vec::new(),
            }
        }
    };
    open.last_key = last.to_vec();
    drop(keys);
    // The rows as they are, in batches of the run's size (slices, or pieces of consecutive
    // batches joined where a batch boundary falls inside one).
    let rows = open.run.batch_rows;
    let mut pieces: Vec<RecordBatch> = Vec::new();
    let mut piece_rows = 0;
    for batch in &batches {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = (rows - piece_rows).min(batch.num_rows() - offset);
            pieces.push(batch.slice(offset, len));
            piece_rows += len;
            offset += len;
            if piece_rows == rows {
                open.writer.write(&join(schema, &pieces)?)?;
                pieces.clear();
                piece_rows = 0;
            }
        }
    }
    if !pieces.is_empty() {
        open.writer.write(&join(schema, &pieces)?)?;
    }
    Ok((closed, Some(open)))
}

/// The first key of `keys` (batch after batch), if any.
fn first_key(keys: &[BinaryArray]) -> Option<&[u8]> {
    keys.iter().find(|k| !k.is_empty()).map(|k| k.value(0))
}

/// The last key of `keys` (batch after batch), if any.
fn last_key(keys: &[BinaryArray]) -> Option<&[u8]> {
    (keys.iter().rev())
        .find(|k| !k.is_empty())
        .map(|k| k.value(k.len() - 1))
}

/// Consecutive pieces of rows as one batch (the piece itself when there is one).
fn join(schema: &SchemaRef, pieces: &[RecordBatch]) -> Result<RecordBatch> {
    match pieces {
        [piece] => Ok(piece.clone()),
        _ => Ok(crate::dictionary::concat_batches(schema, pieces)?),
    }
}

/// Merges `runs` into one run at `path` and deletes them.
fn merge_to_run(
    schema: &SchemaRef,
    key: &PrimaryKey,
    runs: Vec<Run>,
    path: PathBuf,
    spilled: &AtomicU64,
) -> Result<Run> {
    let batch_rows = runs.iter().map(|r| r.batch_rows).max().unwrap_or(1);
    let mut merge = Merge::new(key, runs)?;
    let mut writer = RunWriter::create(&path, schema)?;
    while let Some(sorted) = merge.next_batch()? {
        writer.write(&sorted.batch)?;
    }
    spilled.fetch_add(writer.finish()?, Ordering::Relaxed);
    Ok(Run::new(path, batch_rows))
}

/// An IPC stream file being written; errors name the file.
struct RunWriter {
    path: PathBuf,
    writer: StreamWriter<BufWriter<File>>,
}

impl RunWriter {
    fn create(path: &Path, schema: &SchemaRef) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::scratch(path, e))?;
        let writer = StreamWriter::try_new(BufWriter::new(file), schema)
            .map_err(|e| Error::scratch(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            writer,
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer
            .write(&compact_views(batch)?)
            .map_err(|e| Error::scratch(&self.path, e))
    }

    /// Finishes the file; returns its size.
    fn finish(mut self) -> Result<u64> {
        self.writer
            .finish()
            .map_err(|e| Error::scratch(&self.path, e))?;
        let file = self
            .writer
            .into_inner()
            .map_err(|e| Error::scratch(&self.path, e))?;
        let file = file
            .into_inner()
            .map_err(|e| Error::scratch(&self.path, e.into_error()))?;
        let metadata = file.metadata().map_err(|e| Error::scratch(&self.path, e))?;
        Ok(metadata.len())
    }
}

/// `batch` with its string and binary *view* columns holding only the bytes they use.
///
/// `interleave` of view arrays keeps every data buffer of its inputs (the views point into
/// them), and the IPC writer writes each batch's buffers whole: without this, every spilled
/// batch of a run would carry the whole run's strings.
fn compact_views(batch: &RecordBatch) -> Result<RecordBatch> {
    Ok(crate::store::gc_views(batch.clone())?)
}

/// Sorted batches: straight from memory, or merged from runs on disk.
pub(crate) enum SortedStream {
    /// Everything fit in one buffer.
    Memory(MemorySorted),
    /// At most `fan_in` runs, merged.
    Merge(Merge),
}

impl SortedStream {
    /// The next sorted batch (never empty), or `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<SortedBatch>> {
        match self {
            SortedStream::Memory(m) => m.next_batch(),
            SortedStream::Merge(m) => m.next_batch(),
        }
    }
}

/// Rows sorted in memory, handed out in batches.
pub(crate) struct MemorySorted {
    batches: Vec<RecordBatch>,
    keys: Vec<BinaryArray>,
    order: Vec<(u32, u32)>,
    batch_rows: usize,
    next: usize,
}

impl MemorySorted {
    fn new(key: &PrimaryKey, batches: Vec<RecordBatch>, batch_rows: usize) -> Result<Self> {
        let keys = encode_all(key, &batches)?;
        let order = sort_order(&keys)?;
        Ok(Self {
            batches,
            keys,
            order,
            // Sorting in memory needs no small batches for a merge.
            batch_rows: batch_rows.max(MAX_BATCH_ROWS),
            next: 0,
        })
    }

    fn next_batch(&mut self) -> Result<Option<SortedBatch>> {
        if self.next >= self.order.len() {
            return Ok(None);
        }
        let end = (self.next + self.batch_rows).min(self.order.len());
        let chunk = &self.order[self.next..end];
        self.next = end;
        let batch = gather(&self.batches, chunk)?;
        let key_refs: Vec<&dyn Array> = self.keys.iter().map(|k| k as &dyn Array).collect();
        let indices: Vec<(usize, usize)> = chunk
            .iter()
            .map(|&(b, r)| (b as usize, r as usize))
            .collect();
        let keys = interleave(&key_refs, &indices)?.as_binary::<i32>().clone();
        Ok(Some(SortedBatch { batch, keys }))
    }
}

/// One run being merged: its reader and its current batch.
struct MergeInput {
    /// The file being read.
    path: PathBuf,
    /// The run's files still to read, after `path`.
    next_paths: std::collections::VecDeque<PathBuf>,
    /// Whether the run's files are deleted once read.
    owned: bool,
    reader: Option<StreamReader<BufReader<File>>>,
    /// The current batch (`None` once the run is exhausted) and the next row in it.
    head: Option<SortedBatch>,
    pos: usize,
    /// Where the current batch is in [`Merge::sources`].
    source: usize,
}

impl MergeInput {
    fn open(run: Run) -> Result<Self> {
        let mut paths: std::collections::VecDeque<PathBuf> = run.paths.into();
        let path = paths
            .pop_front()
            .ok_or_else(|| internal!("a sort run of no file"))?;
        Ok(Self {
            reader: Some(Self::reader(&path)?),
            path,
            next_paths: paths,
            owned: run.owned,
            head: None,
            pos: 0,
            source: 0,
        })
    }

    fn reader(path: &Path) -> Result<StreamReader<BufReader<File>>> {
        let file = File::open(path).map_err(|e| Error::scratch(path, e))?;
        StreamReader::try_new(BufReader::new(file), None).map_err(|e| Error::scratch(path, e))
    }

    /// Loads the next non-empty batch into `head`, or ends the run (deleting its file).
    fn advance(&mut self, key: &PrimaryKey) -> Result<()> {
        self.head = None;
        self.pos = 0;
        while let Some(reader) = &mut self.reader {
            match reader.next() {
                Some(batch) => {
                    let batch = batch.map_err(|e| Error::scratch(&self.path, e))?;
                    if batch.num_rows() > 0 {
                        let keys = key.encode(&batch)?;
                        self.head = Some(SortedBatch { batch, keys });
                        return Ok(());
                    }
                }
                None => {
                    self.reader = None;
                    if self.owned {
                        std::fs::remove_file(&self.path)
                            .map_err(|e| Error::scratch(&self.path, e))?;
                    }
                    if let Some(next) = self.next_paths.pop_front() {
                        self.reader = Some(Self::reader(&next)?);
                        self.path = next;
                    }
                }
            }
        }
        Ok(())
    }

    /// The key of the next row, `None` once exhausted.
    fn key(&self) -> Option<&[u8]> {
        self.head.as_ref().map(|h| h.keys.value(self.pos))
    }
}

/// A loser-tree entry: the number of a merge input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot(usize);

impl Entry for Slot {
    fn select(condition: bool, a: Self, b: Self) -> Self {
        if condition { a } else { b }
    }
}

/// Whether input `a`'s next row comes strictly before input `b`'s: by key, then (for
/// stability) by input number; an exhausted input loses.
fn beats(inputs: &[MergeInput], a: Slot, b: Slot) -> bool {
    match (inputs[a.0].key(), inputs[b.0].key()) {
        (Some(x), Some(y)) => match x.cmp(y) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => a.0 < b.0,
        },
        (Some(_), None) => true,
        (None, Some(_)) => false,
        (None, None) => a.0 < b.0,
    }
}

/// A k-way merge of sorted runs.
pub(crate) struct Merge {
    key: PrimaryKey,
    inputs: Vec<MergeInput>,
    tree: LoserTree<Slot>,
    /// Batches rows of the output being built may come from.
    sources: Vec<SortedBatch>,
    batch_rows: usize,
}

impl Merge {
    fn new(key: &PrimaryKey, runs: Vec<Run>) -> Result<Self> {
        let batch_rows = runs
            .iter()
            .map(|r| r.batch_rows)
            .max()
            .unwrap_or(1)
            .clamp(1, MAX_BATCH_ROWS);
        let mut inputs = Vec::with_capacity(runs.len());
        let mut sources = Vec::new();
        for run in runs {
            let mut input = MergeInput::open(run)?;
            input.advance(key)?;
            if let Some(head) = &input.head {
                input.source = sources.len();
                sources.push(head.clone());
            }
            inputs.push(input);
        }
        let slots: Vec<Slot> = (0..inputs.len()).map(Slot).collect();
        let tree = LoserTree::new(&slots, |a, b| beats(&inputs, a, b));
        Ok(Self {
            key: key.clone(),
            inputs,
            tree,
            sources,
            batch_rows,
        })
    }

    fn next_batch(&mut self) -> Result<Option<SortedBatch>> {
        let mut indices: Vec<(usize, usize)> = Vec::with_capacity(self.batch_rows);
        while indices.len() < self.batch_rows {
            let Some(Slot(winner)) = self.tree.winner() else {
                break;
            };
            let input = &mut self.inputs[winner];
            let Some(head) = &input.head else {
                break;
            };
            indices.push((input.source, input.pos));
            input.pos += 1;
            if input.pos == head.batch.num_rows() {
                input.advance(&self.key)?;
                if let Some(head) = &input.head {
                    input.source = self.sources.len();
                    self.sources.push(head.clone());
                }
            }
            let inputs = &self.inputs;
            self.tree
                .replay(winner, Slot(winner), |a, b| beats(inputs, a, b));
        }
        if indices.is_empty() {
            return Ok(None);
        }
        let batches: Vec<&RecordBatch> = self.sources.iter().map(|s| &s.batch).collect();
        let batch = interleave_batches(&batches, &indices)?;
        let key_refs: Vec<&dyn Array> =
            self.sources.iter().map(|s| &s.keys as &dyn Array).collect();
        let keys = interleave(&key_refs, &indices)?.as_binary::<i32>().clone();
        // Keep only the batches still being read.
        self.sources.clear();
        for input in &mut self.inputs {
            if let Some(head) = &input.head {
                input.source = self.sources.len();
                self.sources.push(head.clone());
            }
        }
        Ok(Some(SortedBatch { batch, keys }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray, UInt64Array};
    use arrow_schema::{DataType, Field, Schema};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::key::KeyColumn;

    /// `(k1 Int64 desc, k2 Utf8 asc)` key, `seq` the push order.
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k1", DataType::Int64, false),
            Field::new("k2", DataType::Utf8, false),
            Field::new("seq", DataType::UInt64, false),
        ]))
    }

    fn key() -> PrimaryKey {
        PrimaryKey::new(&schema(), vec![KeyColumn::desc("k1"), KeyColumn::asc("k2")]).unwrap()
    }

    type Row = (i64, String, u64);

    fn batch(rows: &[Row]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.1.clone()),
                )),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    fn rows_of(batch: &RecordBatch) -> Vec<Row> {
        let k1 = batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>();
        let k2 = batch.column(1).as_string::<i32>();
        let seq = batch
            .column(2)
            .as_primitive::<arrow_array::types::UInt64Type>();
        (0..batch.num_rows())
            .map(|i| (k1.value(i), k2.value(i).to_string(), seq.value(i)))
            .collect()
    }

    /// Random rows with many equal keys, in random batch sizes; the first `ordered` rows
    /// come in key order (equal keys in push order).
    fn input_ordered(rng: &mut StdRng, rows: usize, ordered: usize) -> Vec<RecordBatch> {
        let mut all: Vec<Row> = (0..rows as u64)
            .map(|seq| {
                let k1 = rng.random_range(-20..20);
                let k2 = format!("{}", rng.random_range(0..5));
                (k1, k2, seq)
            })
            .collect();
        let ordered = ordered.min(rows);
        all[..ordered].sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (seq, row) in all.iter_mut().enumerate() {
            row.2 = seq as u64;
        }
        let sizes = [1, 2, 7, 49, 50, 51, 300];
        let mut batches = Vec::new();
        let mut start = 0;
        while start < all.len() {
            let n = sizes[rng.random_range(0..sizes.len())].min(all.len() - start);
            batches.push(batch(&all[start..start + n]));
            start += n;
        }
        batches
    }

    /// The oracle: a stable in-memory sort by (k1 desc, k2 asc).
    fn oracle(batches: &[RecordBatch]) -> Vec<Row> {
        let mut rows: Vec<Row> = batches.iter().flat_map(rows_of).collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        rows
    }

    /// Sorts `batches` with `config`: the rows out, and how many runs were written.
    fn sort(batches: &[RecordBatch], config: SortConfig) -> (Vec<Row>, usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut sorter = ExternalSorter::new(schema(), key(), dir.path(), "t", config);
        for b in batches {
            sorter.push(b.clone()).unwrap();
        }
        let runs = sorter.runs_written();
        let mut stream = sorter.finish().unwrap();
        let mut rows = Vec::new();
        while let Some(sorted) = stream.next_batch().unwrap() {
            assert!(sorted.batch.num_rows() > 0);
            assert_eq!(sorted.keys, key().encode(&sorted.batch).unwrap());
            rows.extend(rows_of(&sorted.batch));
        }
        drop(stream);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "runs are deleted once merged: {left:?}");
        (rows, runs)
    }

    #[test]
    fn matches_a_stable_in_memory_sort() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen_runs = std::collections::BTreeSet::new();
        for case in 0..40 {
            let rows = [0, 1, 5, 100, 1000, 3000][case % 6];
            // Random, in key order, or in key order up to the middle.
            let ordered = [0, rows, rows / 2][(case / 6) % 3];
            let batches = input_ordered(&mut rng, rows, ordered);
            let total: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
            let configs = [
                // Everything in memory.
                SortConfig::for_budget(usize::MAX / 2),
                // About two runs.
                SortConfig {
                    run_bytes: total / 2 + 1,
                    batch_bytes: 1000,
                    fan_in: 4,
                },
                // About three runs.
                SortConfig {
                    run_bytes: total / 3 + 1,
                    batch_bytes: 1000,
                    fan_in: 2,
                },
                // Many runs, tiny batches, several merge passes.
                SortConfig {
                    run_bytes: 4000,
                    batch_bytes: 1,
                    fan_in: 2,
                },
                SortConfig {
                    run_bytes: 20_000,
                    batch_bytes: 500,
                    fan_in: 3,
                },
                SortConfig::for_budget(64 << 10),
            ];
            let expected = oracle(&batches);
            for config in configs {
                let (found, runs) = sort(&batches, config);
                assert_eq!(found, expected, "case {case}, {config:?}");
                seen_runs.insert(runs.min(3));
            }
        }
        assert_eq!(
            seen_runs.into_iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 3],
            "no spill, one, two and many spills while pushing all occur"
        );
    }

    /// Input in key order is written once, as one run, however many buffers it fills; a
    /// buffer out of order after it starts a run of its own.
    #[test]
    fn input_in_key_order_becomes_one_run() {
        let mut rng = StdRng::seed_from_u64(11);
        for ordered in [3000, 2000] {
            let batches = input_ordered(&mut rng, 3000, ordered);
            let total: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
            let config = SortConfig {
                run_bytes: total / 10 + 1,
                batch_bytes: 1000,
                fan_in: 64,
            };
            let dir = tempfile::tempdir().unwrap();
            let mut sorter = ExternalSorter::new(schema(), key(), dir.path(), "t", config);
            for b in &batches {
                sorter.push(b.clone()).unwrap();
            }
            assert!(
                sorter.runs_written() >= 8,
                "{} spills",
                sorter.runs_written()
            );
            let spilled = sorter.bytes_spilled();
            let mut stream = sorter.finish().unwrap();
            let files = std::fs::read_dir(dir.path()).unwrap().count();
            if ordered == 3000 {
                assert_eq!(files, 1, "one run for input in key order");
            } else {
                // The ordered two thirds, then a run per unordered buffer (the first of
                // them begins in order and ends out of it).
                assert!((2..=5).contains(&files), "{files} runs");
            }
            let raw: u64 = 3000 * (8 + 4 + 8 + 2);
            let spilled = spilled.load(Ordering::Relaxed);
            assert!(spilled < 3 * raw, "{spilled} bytes spilled for {raw}");
            let mut rows = Vec::new();
            while let Some(sorted) = stream.next_batch().unwrap() {
                assert_eq!(sorted.keys, key().encode(&sorted.batch).unwrap());
                rows.extend(rows_of(&sorted.batch));
            }
            assert_eq!(rows, oracle(&batches), "{ordered} rows in order");
        }
    }

    #[test]
    fn budget_configuration() {
        let c = SortConfig::for_budget(DEFAULT_MEMORY_BUDGET);
        assert_eq!(c.run_bytes, 16 << 20);
        assert_eq!(c.fan_in, 64);
        assert_eq!(c.batch_bytes, 64 << 10);
        let tiny = SortConfig::for_budget(0);
        assert!(tiny.run_bytes >= 1 && tiny.batch_bytes >= 1 && tiny.fan_in >= 2);
    }

    #[test]
    fn a_batch_of_another_schema_is_an_internal_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut sorter = ExternalSorter::new(
            schema(),
            key(),
            dir.path(),
            "t",
            SortConfig::for_budget(1 << 20),
        );
        let other = batch(&[(1, "a".into(), 0)]).project(&[0, 1]).unwrap();
        assert!(matches!(
            sorter.push(other),
            Err(Error::Engine(crate::error::EngineError::Internal(_)))
        ));
    }

    #[test]
    fn a_missing_scratch_directory_is_a_scratch_error() {
        let options = ExternalSortOptions::new("/nonexistent/scratch");
        let err = options.scratch().unwrap_err();
        assert!(matches!(err, Error::Scratch { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/scratch"), "{err}");
        assert!(!err.is_bad_input());
    }

    /// Spilled batches of view columns carry only their own strings, not the whole run's.
    #[test]
    fn view_columns_spill_compactly() {
        use arrow_array::StringViewArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, false),
        ]));
        let key = PrimaryKey::new(&schema, vec![KeyColumn::asc("k")]).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let batches: Vec<RecordBatch> = (0..50)
            .map(|_| {
                let keys: Vec<i64> = (0..100).map(|_| rng.random_range(0..1000)).collect();
                let values = keys.iter().map(|k| format!("{k:0>100}"));
                RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(keys.clone())),
                        Arc::new(StringViewArray::from_iter_values(values)),
                    ],
                )
                .unwrap()
            })
            .collect();
        let raw: u64 = 50 * 100 * (100 + 8);
        let dir = tempfile::tempdir().unwrap();
        let config = SortConfig {
            run_bytes: 50_000,
            batch_bytes: 2_000,
            fan_in: 4,
        };
        let mut sorter = ExternalSorter::new(schema.clone(), key.clone(), dir.path(), "v", config);
        for b in &batches {
            sorter.push(b.clone()).unwrap();
        }
        let runs = sorter.runs_written();
        let spilled = sorter.bytes_spilled();
        let mut stream = sorter.finish().unwrap();
        let mut last: Option<i64> = None;
        let mut rows = 0;
        while let Some(sorted) = stream.next_batch().unwrap() {
            let k = sorted
                .batch
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            let v = sorted.batch.column(1).as_string_view();
            for i in 0..sorted.batch.num_rows() {
                assert!(last.is_none_or(|l| l <= k.value(i)));
                assert_eq!(v.value(i), format!("{:0>100}", k.value(i)));
                last = Some(k.value(i));
                rows += 1;
            }
        }
        assert_eq!(rows, 5000);
        assert!(runs > 4, "{runs} runs: a merge pass is needed");
        let SortedStream::Merge(_) = stream else {
            panic!("the input spilled");
        };
        // Initial runs and two merge passes (10+ runs, fan-in 4), each about the raw size;
        // without compaction each spilled batch would carry its run's strings, 25x more.
        let spilled = spilled.load(Ordering::Relaxed);
        assert!(
            spilled < 6 * raw,
            "{spilled} bytes spilled for {raw} bytes of rows"
        );
    }
}
