//! Sorted runs: the rows of one vnode, sorted by key, keys strictly increasing, with an
//! optional tombstone mask (delta runs of uncommitted epochs carry deletes).
//!
//! A [`Run`] is a range of shared [`Rows`]: cutting an epoch's rows into one run per vnode,
//! or a run into pieces, copies nothing. A [`RunList`] is a list of runs of one vnode whose
//! key ranges follow each other, loaded on demand (a base's segments in memory, the blocks
//! of a run file on disk). [`gc_views`] and [`Views`] say what view columns the rows keep.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::DataType;

use super::KeyedBatch;
use crate::error::{Result, internal};

/// Target rows per committed segment.
pub(crate) const SEGMENT_ROWS: usize = 8192;

/// Rows that runs are ranges of: one vnode's sorted rows, or an epoch's rows sorted by vnode
/// then key (each vnode's run a range of them), or a packed block of a run file.
/// `deleted[i]` marks a tombstone.
#[derive(Debug)]
pub(crate) struct Rows {
    pub data: KeyedBatch,
    pub deleted: Option<BooleanBuffer>,
    /// Where the rows' memory is counted while any range of them is held, if anywhere.
    counted: Option<Counted>,
}

/// A shared counter of bytes (the memory some kind of rows holds).
pub(crate) type MemoryCounter = Arc<AtomicUsize>;

/// Bytes counted in a [`MemoryCounter`] from when this is made until it is dropped.
#[derive(Debug)]
struct Counted {
    bytes: usize,
    counter: MemoryCounter,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Rows {
    /// Rows with their tombstones; `deleted`, when given, has one flag per row.
    pub fn new(data: KeyedBatch, deleted: Option<BooleanBuffer>) -> Result<Arc<Self>> {
        Self::counted(data, deleted, None)
    }

    /// [`Rows::new`], their memory (the arrays' buffers) counted in `counter` until the
    /// last range of them is dropped: a barrier's changes stay counted while any vnode's
    /// patch, or any rows a patch gave a scan, holds them.
    pub fn counted(
        data: KeyedBatch,
        deleted: Option<BooleanBuffer>,
        counter: Option<&MemoryCounter>,
    ) -> Result<Arc<Self>> {
        if data.keys.len() != data.num_rows() {
            return Err(internal!(
                "{} rows with {} keys",
                data.num_rows(),
                data.keys.len()
            ));
        }
        if let Some(d) = &deleted
            && d.len() != data.num_rows()
        {
            return Err(internal!(
                "{} rows with {} tombstone flags",
                data.num_rows(),
                d.len()
            ));
        }
        let counted = counter.map(|counter| {
            let bytes = data.batch.get_array_memory_size() + data.keys.get_array_memory_size();
            counter.fetch_add(bytes, Ordering::Relaxed);
            Counted {
                bytes,
                counter: counter.clone(),
            }
        });
        Ok(Arc::new(Self {
            data,
            deleted,
            counted,
        }))
    }

    /// The counter the rows' memory is counted in, if any.
    pub fn counter(&self) -> Option<&MemoryCounter> {
        self.counted.as_ref().map(|c| &c.counter)
    }

    pub fn len(&self) -> usize {
        self.data.num_rows()
    }
}

/// Rows of one vnode sorted by key, keys strictly increasing: a range of shared [`Rows`].
///
/// A run is a reference and two numbers: cutting an epoch's rows into one run per vnode, or
/// a run into pieces, copies nothing and allocates no arrays (a `RecordBatch` slice of a
/// wide table is an allocation per column, and with thousands of vnodes touched per epoch
/// those slices and their drops were a fifth of a replay). Arrays are sliced only when rows
/// leave the store ([`Run::data_of`], [`Run::batch`]). Holding a run keeps all of its `rows` alive, which is
/// also how a block read from a packed batch keeps that batch findable in the block cache.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    rows: Arc<Rows>,
    start: usize,
    len: usize,
}

impl Run {
    /// All of `rows` as one run.
    pub fn whole(rows: Arc<Rows>) -> Self {
        let len = rows.len();
        Self {
            rows,
            start: 0,
            len,
        }
    }

    /// `data` (with its tombstones) as one run.
    pub fn new(data: KeyedBatch, deleted: Option<BooleanBuffer>) -> Result<Self> {
        Ok(Self::whole(Rows::new(data, deleted)?))
    }

    /// Rows `start..start + len` of `rows`.
    pub fn range(rows: &Arc<Rows>, start: usize, len: usize) -> Result<Self> {
        if start.checked_add(len).is_none_or(|end| end > rows.len()) {
            return Err(internal!(
                "rows {start}..+{len} of a batch of {} rows",
                rows.len()
            ));
        }
        Ok(Self {
            rows: rows.clone(),
            start,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The shared rows this run is a range of, and where the range starts in them.
    pub fn rows(&self) -> (&Arc<Rows>, usize) {
        (&self.rows, self.start)
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        debug_assert!(i < self.len);
        self.rows.data.keys.value(self.start + i)
    }

    /// Whether row `i` is a tombstone.
    pub fn is_deleted(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        (self.rows.deleted.as_ref()).is_some_and(|d| d.value(self.start + i))
    }

    /// The tombstone flags of the run's rows, if its rows have any.
    pub fn deleted(&self) -> Option<BooleanBuffer> {
        (self.rows.deleted.as_ref()).map(|d| d.slice(self.start, self.len))
    }

    /// Rows `offset..offset + len` of the run, with their keys, as arrays (zero-copy slices).
    pub fn data_of(&self, offset: usize, len: usize) -> KeyedBatch {
        debug_assert!(offset + len <= self.len);
        if offset == 0 && self.start == 0 && len == self.rows.len() {
            return self.rows.data.clone();
        }
        self.rows.data.slice(self.start + offset, len)
    }

    /// The run's rows, with their keys, as arrays (zero-copy slices).
    #[cfg(test)]
    pub fn data(&self) -> KeyedBatch {
        self.data_of(0, self.len)
    }

    /// The run's rows as a record batch (zero-copy slices).
    pub fn batch(&self) -> RecordBatch {
        if self.start == 0 && self.len == self.rows.len() {
            return self.rows.data.batch.clone();
        }
        self.rows.data.batch.slice(self.start, self.len)
    }

    /// The first row whose key is strictly greater than `after`.
    pub fn start_after(&self, after: Option<&[u8]>) -> usize {
        match after {
            None => 0,
            Some(after) => partition_point(self.len(), |i| self.key(i) <= after),
        }
    }

    /// The row with exactly this key, if any.
    pub fn find(&self, key: &[u8]) -> Option<usize> {
        let i = partition_point(self.len(), |i| self.key(i) < key);
        (i < self.len() && self.key(i) == key).then_some(i)
    }

    /// Whether `other` is a range of the same shared rows.
    pub fn same_rows(&self, other: &Run) -> bool {
        Arc::ptr_eq(&self.rows, &other.rows)
    }

    /// Rows `offset..offset + len`, a range of the same rows.
    pub(crate) fn slice(&self, offset: usize, len: usize) -> Run {
        debug_assert!(offset + len <= self.len);
        Run {
            rows: self.rows.clone(),
            start: self.start + offset,
            len,
        }
    }

    pub fn first_key(&self) -> Option<&[u8]> {
        (self.len() > 0).then(|| self.key(0))
    }

    pub fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    /// Appends the tombstone flags of rows `offset..offset + len` to `mask`.
    pub fn append_deleted(&self, offset: usize, len: usize, mask: &mut BooleanBufferBuilder) {
        debug_assert!(offset + len <= self.len);
        match &self.rows.deleted {
            Some(d) => mask.append_buffer(&d.slice(self.start + offset, len)),
            None => mask.append_n(len, false),
        }
    }

    /// Whether any row is a tombstone.
    pub fn has_tombstones(&self) -> bool {
        self.deleted().is_some_and(|d| d.count_set_bits() > 0)
    }

    /// Whether `next` continues this run in the same rows (its range starts where this one
    /// ends).
    pub fn continued_by(&self, next: &Run) -> bool {
        self.same_rows(next) && self.start + self.len == next.start
    }

    /// The first row whose key is not strictly above the key before it, if any.
    pub fn first_unordered(&self) -> Option<usize> {
        crate::key::first_unordered_in(&self.rows.data.keys, self.start, self.len)
    }

    /// Row `i` as a one-row record batch (zero-copy).
    pub fn row(&self, i: usize) -> RecordBatch {
        debug_assert!(i < self.len);
        self.rows.data.batch.slice(self.start + i, 1)
    }
}

/// Appends `piece` to `pieces`, as part of the last one if it continues it in the same rows.
pub(crate) fn push_joined(pieces: &mut Vec<Run>, piece: Run) {
    match pieces.last_mut() {
        Some(last) if last.continued_by(&piece) => last.len += piece.len,
        _ => pieces.push(piece),
    }
}

/// Compacts the string and binary *view* columns of a batch kept by the store.
///
/// `take`, `interleave` and `concat` of view arrays keep every data buffer of their inputs
/// (views point into them), and concatenation appends the inputs' buffer lists. A segment
/// rewritten commit after commit would pile up references (and memory) without bound, so
/// every batch the store keeps holds its own copy of just the bytes it uses.
pub fn gc_views(batch: RecordBatch) -> Result<RecordBatch> {
    let needs_gc = batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView));
    if !needs_gc {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch.columns().iter().cloned().map(gc_view).collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// A string or binary view column with its own copy of just the bytes it uses (see
/// [`gc_views`]); any other column as it is.
fn gc_view(column: ArrayRef) -> ArrayRef {
    match column.data_type() {
        DataType::Utf8View => Arc::new(column.as_string_view().gc()),
        DataType::BinaryView => Arc::new(column.as_binary_view().gc()),
        _ => column,
    }
}

/// What a gather does with string and binary views: the rows it makes either keep only
/// the bytes they use, or point into the buffers they were gathered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Views {
    /// Copied into buffers of their own ([`gc_views`]): for rows kept in memory, which
    /// must not hold whole input batches alive.
    Compact,
    /// Left pointing into the input's buffers: for rows written out at once (a durable
    /// spill), whose run file stores each value's bytes anyway; compacting them first was
    /// a copy of every string for nothing.
    Shared,
}

/// A column gathered by `gather`, its views compacted if `views` says so.
pub(super) fn with_views(column: ArrayRef, views: Views) -> ArrayRef {
    match views {
        Views::Compact => gc_view(column),
        Views::Shared => column,
    }
}

/// The first index in `0..len` where `pred` is false (`pred` must be monotone).
pub(crate) fn partition_point(len: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// A list of runs of one vnode whose key ranges follow each other, loaded on demand: the
/// committed segments of the in-memory store, or the blocks of a run file on disk.
pub(crate) trait RunList: Send + Sync {
    /// The number of runs.
    fn len(&self) -> usize;

    /// The last key of run `i` (`None` for an empty run), known without loading it.
    fn last_key(&self, i: usize) -> Option<&[u8]>;

    /// Run `i`'s rows.
    fn load(&self, i: usize) -> Result<Arc<Run>>;
}

impl RunList for Vec<Arc<Run>> {
    fn len(&self) -> usize {
        <[Arc<Run>]>::len(self)
    }

    fn last_key(&self, i: usize) -> Option<&[u8]> {
        self[i].last_key()
    }

    fn load(&self, i: usize) -> Result<Arc<Run>> {
        Ok(self[i].clone())
    }
}
