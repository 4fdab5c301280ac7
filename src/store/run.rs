//! Sorted runs and the merged read over them.
//!
//! A [`Run`] holds the rows of one vnode sorted by key, keys strictly increasing, with an
//! optional tombstone mask (delta runs of uncommitted epochs carry deletes). The committed
//! base of a vnode is a list of runs ("segments") whose key ranges follow each other.
//!
//! [`MergeReader`] reads a vnode at an epoch: the base plus the delta runs visible at that
//! epoch, oldest first. For equal keys the newest source wins; a winning tombstone hides the
//! key. With no delta it hands out zero-copy slices of the base.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::DataType;
use rayon::prelude::*;

use crate::chunk::{Op, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::key::KeyPrefix;
use crate::store::KeyedBatch;
use crate::store::scatter::{Destinations, scatter};
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

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
    fn start_after(&self, after: Option<&[u8]>) -> usize {
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
pub(crate) fn gc_views(batch: RecordBatch) -> Result<RecordBatch> {
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
fn with_views(column: ArrayRef, views: Views) -> ArrayRef {
    match views {
        Views::Compact => gc_view(column),
        Views::Shared => column,
    }
}

/// Which runs of a stack (sizes oldest first) to merge into one when it has grown too tall:
/// the newest ones, back to the first older run that holds more than twice their rows, and
/// at least two (returns the index of the oldest). Merged runs form size tiers, each at least
/// twice the next newer one, so a row is rewritten about `log2(runs pushed)` times; merging
/// every run each time rewrote the grown oldest one at every merge (quadratic).
pub(crate) fn newest_tier(sizes: &[u64]) -> usize {
    let newest = sizes.len().saturating_sub(1);
    let mut from = newest;
    let mut merged = sizes.get(from).copied().unwrap_or(0);
    while from > 0 {
        let older = sizes[from - 1];
        if from < newest && older > merged.saturating_mul(2) {
            break;
        }
        merged += older;
        from -= 1;
    }
    from
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

/// Groups buffered changes by vnode and builds one sorted run per vnode, keeping the last
/// change of each key. Runs are built in parallel (rayon).
pub(crate) fn build_runs(
    desc: &TableDesc,
    batch: &RecordBatch,
    ops: &[Op],
    vnodes: &[VirtualNode],
) -> Result<Vec<(VirtualNode, Run)>> {
    let keys = desc.pk().encode(batch)?;
    let mut groups: Vec<Vec<u32>> = vec![Vec::new(); desc.vnode_count().get()];
    for (row, vnode) in vnodes.iter().enumerate() {
        let row = u32::try_from(row)
            .map_err(|_| Error::InvalidConfig("more than 2^32 rows in one epoch".into()))?;
        groups[vnode.index()].push(row);
    }
    let any_delete = ops.iter().any(|op| !op.is_insert());
    groups
        .into_par_iter()
        .enumerate()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(vnode, rows)| {
            let last = newest_per_key(&rows, &keys);
            let deleted = any_delete.then(|| {
                BooleanBuffer::collect_bool(last.len(), |i| !ops[last[i] as usize].is_insert())
            });
            let take = UInt32Array::from(last);
            let data = KeyedBatch {
                batch: gc_views(arrow_select::take::take_record_batch(batch, &take)?)?,
                keys: arrow_select::take::take(&keys, &take, None)?
                    .as_binary::<i32>()
                    .clone(),
            };
            let vnode =
                u16::try_from(vnode).map_err(|_| internal!("vnode index {vnode} out of range"))?;
            Ok((VirtualNode::new(vnode), Run::new(data, deleted)?))
        })
        .collect()
}

/// [`build_runs`] for a store that writes its runs out soon: one gather of the rows sorted
/// by vnode then key, and each vnode's run a range of it. With many vnodes this is one copy
/// of the rows instead of one small batch per vnode (32768 vnodes: 32768 allocations per
/// column), and no per-vnode arrays at all. The runs share the rows until all are dropped,
/// so the second value is the rows' bytes per row (rounded up), to account each run's memory
/// as its share.
///
/// `batches` are read as one: rows numbered through them in order, `ops` and `vnodes` one
/// per row. Several batches are reordered straight into the sorted one (scattered, see
/// `gather_keyed`), not concatenated first: a bulk load's pieces are tens of MB, and the
/// concatenation was a whole extra copy of each.
pub(crate) fn build_sliced_runs(
    desc: &TableDesc,
    batches: &[&RecordBatch],
    ops: &[Op],
    vnodes: &[VirtualNode],
    counter: Option<&MemoryCounter>,
    views: Views,
) -> Result<(Vec<(VirtualNode, Run)>, usize)> {
    let keys = desc.pk().encode_all(batches)?;
    if keys.len() != vnodes.len() || ops.len() != vnodes.len() {
        return Err(internal!(
            "{} rows with {} ops and {} vnodes",
            keys.len(),
            ops.len(),
            vnodes.len()
        ));
    }
    // Rows grouped by vnode (a counting sort), then each group sorted by key.
    let mut starts = vec![0u32; desc.vnode_count().get() + 1];
    for vnode in vnodes {
        starts[vnode.index() + 1] += 1;
    }
    for v in 1..starts.len() {
        starts[v] += starts[v - 1];
    }
    let mut fill = starts.clone();
    let mut order = vec![0u32; vnodes.len()];
    for (row, vnode) in vnodes.iter().enumerate() {
        let row = u32::try_from(row)
            .map_err(|_| Error::InvalidConfig("more than 2^32 rows in one epoch".into()))?;
        let at = &mut fill[vnode.index()];
        order[*at as usize] = row;
        *at += 1;
    }
    let groups: Vec<(usize, std::ops::Range<usize>)> = starts
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] > w[0])
        .map(|(v, w)| (v, w[0] as usize..w[1] as usize))
        .collect();
    let sorted: Vec<(usize, Vec<u32>)> = groups
        .into_par_iter()
        .map(|(vnode, range)| {
            let last = newest_per_key(&order[range], &keys);
            (vnode, last)
        })
        .collect();
    let total: usize = sorted.iter().map(|(_, rows)| rows.len()).sum();
    let mut take = Vec::with_capacity(total);
    let mut ranges = Vec::with_capacity(sorted.len());
    for (vnode, rows) in sorted {
        let vnode =
            u16::try_from(vnode).map_err(|_| internal!("vnode index {vnode} out of range"))?;
        ranges.push((VirtualNode::new(vnode), take.len(), rows.len()));
        take.extend(rows);
    }
    let any_delete = ops.iter().any(|op| !op.is_insert());
    let deleted = any_delete
        .then(|| BooleanBuffer::collect_bool(take.len(), |i| !ops[take[i] as usize].is_insert()));
    let all = gather_keyed(batches, &keys, take, views)?;
    let bytes = all.batch.get_array_memory_size() + all.keys.get_array_memory_size();
    let per_row = bytes.div_ceil(total.max(1));
    let all = Rows::counted(all, deleted, counter)?;
    let runs = ranges
        .into_iter()
        .map(|(vnode, start, len)| Ok((vnode, Run::range(&all, start, len)?)))
        .collect::<Result<_>>()?;
    Ok((runs, per_row))
}

/// Output rows a stretch of input rows in input order must average for [`gather_keyed`] to
/// scatter: below it, the scatter's writes jump as much as a gather's reads do, and its
/// destinations cost a pass more.
const MIN_SCATTER_STRETCH: usize = 64;

/// Whether `rows` (a gather order) keeps the input's order in stretches of
/// [`MIN_SCATTER_STRETCH`] rows or more on average: each vnode's rows of an input in key
/// order, as a table exported in key order gives.
fn keeps_input_order(rows: &[u32]) -> bool {
    let stretches = 1 + rows.windows(2).filter(|w| w[1] < w[0]).count();
    rows.len() >= stretches * MIN_SCATTER_STRETCH
}

/// The rows `rows` (numbered through `batches` one after another) of the batches, with
/// their `keys`: every column on its own rayon task, views as `views` says.
///
/// When the order keeps the input's ([`keeps_input_order`]), columns of the types
/// [`scatter`] handles (primitives, string and binary views: all of a table read from
/// Parquet) are scattered; the rest, and every column otherwise, are gathered (`take` of a
/// single batch, an `interleave` of several).
fn gather_keyed(
    batches: &[&RecordBatch],
    keys: &BinaryArray,
    rows: Vec<u32>,
    views: Views,
) -> Result<KeyedBatch> {
    let Some(first) = batches.first() else {
        return Err(internal!("a gather of no batch"));
    };
    let input_rows = batches.iter().map(|b| b.num_rows()).sum();
    let dest = if keeps_input_order(&rows) {
        Some(Destinations::of_take(&rows, input_rows)?)
    } else {
        None
    };
    let indices = UInt32Array::from(rows);
    // Each row's (batch, row within it), for the columns gathered.
    let pairs = std::sync::OnceLock::new();
    let pairs = || {
        pairs.get_or_init(|| {
            let mut starts = Vec::with_capacity(batches.len());
            let mut at = 0usize;
            for batch in batches {
                starts.push(at);
                at += batch.num_rows();
            }
            (indices.values().iter())
                .map(|&row| {
                    let row = row as usize;
                    let batch = starts.partition_point(|&start| start <= row) - 1;
                    (batch, row - starts[batch])
                })
                .collect::<Vec<(usize, usize)>>()
        })
    };
    let (columns, keys) = rayon::join(
        || {
            (0..first.num_columns())
                .into_par_iter()
                .map(|c| -> Result<ArrayRef> {
                    let column: Vec<&dyn Array> =
                        batches.iter().map(|b| b.column(c).as_ref()).collect();
                    let scattered = dest.as_ref().and_then(|dest| scatter(&column, dest));
                    let column = match (scattered, column.as_slice()) {
                        (Some(scattered), _) => scattered,
                        (None, [single]) => arrow_select::take::take(*single, &indices, None)?,
                        (None, _) => crate::dictionary::interleave(
                            first.schema().field(c),
                            &column,
                            pairs(),
                        )?,
                    };
                    Ok(with_views(column, views))
                })
                .collect::<Result<Vec<_>>>()
        },
        || arrow_select::take::take(keys, &indices, None),
    );
    let options = RecordBatchOptions::new().with_row_count(Some(indices.len()));
    Ok(KeyedBatch {
        batch: RecordBatch::try_new_with_options(first.schema(), columns?, &options)?,
        keys: keys?.as_binary::<i32>().clone(),
    })
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

/// The error for chunks whose concatenation failed with `e`: an [`Error::InvalidValue`]
/// naming the column when a string or binary column holds more than `limit` bytes (one
/// array holds 2 GiB), `e` otherwise.
fn too_large(desc: &TableDesc, chunks: &[StreamChunk], e: Error, limit: usize) -> Error {
    if !e.to_string().contains("Offset overflow") {
        return e;
    }
    let bytes = |i: usize| -> usize {
        (chunks.iter())
            .map(|c| {
                let column = c.batch().column(i);
                let span = |offsets: &[i32]| match (offsets.first(), offsets.last()) {
                    (Some(&a), Some(&b)) => usize::try_from(b - a).unwrap_or(0),
                    _ => 0,
                };
                match column.data_type() {
                    DataType::Utf8 => span(column.as_string::<i32>().value_offsets()),
                    DataType::Binary => span(column.as_binary::<i32>().value_offsets()),
                    _ => 0,
                }
            })
            .sum()
    };
    match (0..desc.schema().fields().len()).find(|&i| bytes(i) > limit) {
        Some(i) => Error::InvalidValue {
            column: desc.schema().field(i).name().clone(),
            message: format!(
                "one epoch writes more than 2 GiB of it to table `{}`, which the in-memory \
                 store keeps in one array; use the durable store",
                desc.name()
            ),
        },
        None => e,
    }
}

/// Chunks buffered with their rows' vnodes, in write order, as one chunk and its vnodes;
/// `None` when nothing is buffered.
fn concat_pending(
    desc: &TableDesc,
    pending: &[(StreamChunk, Vec<VirtualNode>)],
) -> Result<Option<(StreamChunk, Vec<VirtualNode>)>> {
    if pending.is_empty() {
        return Ok(None);
    }
    let chunks: Vec<StreamChunk> = pending.iter().map(|(c, _)| c.clone()).collect();
    let all = StreamChunk::concat(desc.schema(), &chunks)
        .map_err(|e| too_large(desc, &chunks, e, i32::MAX as usize))?;
    let vnodes = pending
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    Ok(Some((all, vnodes)))
}

/// [`build_runs`] over chunks buffered with their rows' vnodes, in write order.
pub(crate) fn build_pending_runs(
    desc: &TableDesc,
    pending: &[(StreamChunk, Vec<VirtualNode>)],
) -> Result<Vec<(VirtualNode, Run)>> {
    match concat_pending(desc, pending)? {
        None => Ok(Vec::new()),
        Some((all, vnodes)) => build_runs(desc, all.batch(), all.ops(), &vnodes),
    }
}

/// [`build_sliced_runs`] of pending chunks, gathered from the chunks themselves.
pub(crate) fn build_pending_sliced_runs(
    desc: &TableDesc,
    pending: &[(StreamChunk, Vec<VirtualNode>)],
    views: Views,
) -> Result<(Vec<(VirtualNode, Run)>, usize)> {
    match pending {
        [] => Ok((Vec::new(), 0)),
        [(chunk, vnodes)] => {
            build_sliced_runs(desc, &[chunk.batch()], chunk.ops(), vnodes, None, views)
        }
        _ => {
            let batches: Vec<&RecordBatch> = pending.iter().map(|(c, _)| c.batch()).collect();
            let ops: Vec<Op> = (pending.iter())
                .flat_map(|(c, _)| c.ops().iter().copied())
                .collect();
            let vnodes: Vec<VirtualNode> = (pending.iter())
                .flat_map(|(_, v)| v.iter().copied())
                .collect();
            build_sliced_runs(desc, &batches, &ops, &vnodes, None, views)
        }
    }
}

/// One input of a merged read: a list of runs read in order.
struct Source {
    list: Box<dyn RunList>,
    /// Index of the current run in `list`.
    run: usize,
    /// The current run, loaded; `None` once the source is exhausted.
    current: Option<Arc<Run>>,
    /// Row within the current run.
    row: usize,
}

impl Source {
    /// The current run and row, if not exhausted.
    fn head(&self) -> Option<(&Arc<Run>, usize)> {
        self.current.as_ref().map(|run| (run, self.row))
    }

    fn head_key(&self) -> Option<&[u8]> {
        self.current.as_ref().map(|run| run.key(self.row))
    }

    /// Moves past exhausted runs, loading the next one as needed.
    fn settle(&mut self) -> Result<()> {
        while let Some(run) = &self.current {
            if self.row < run.len() {
                break;
            }
            self.run += 1;
            self.row = 0;
            self.current = if self.run < self.list.len() {
                Some(self.list.load(self.run)?)
            } else {
                None
            };
        }
        Ok(())
    }
}

/// A merged read's run lists and the key it starts after, before the first read.
type Unopened = (Vec<Box<dyn RunList>>, Option<Vec<u8>>);

/// A merged, sorted read of one vnode: base segments plus delta runs, newest wins.
///
/// Memory: one loaded run per source, plus the batch being assembled.
pub(crate) struct MergeReader {
    /// The run lists and the start, until the first read positions them.
    unopened: Option<Unopened>,
    sources: Vec<Source>,
    batch_size: usize,
    /// Whether winning tombstones are returned (merging deltas into a delta) or hidden.
    keep_tombstones: bool,
    /// Whether batches are filled across the runs of a lone source (for a rewrite, which
    /// writes each batch as blocks of its own) instead of handed out a run at a time.
    fill: bool,
}

impl MergeReader {
    /// `sources` are ordered oldest (the base) to newest; each is a list of runs whose key
    /// ranges follow each other. Reading starts strictly after `after`; runs that end at or
    /// before it are never loaded. Nothing is loaded before the first read: a backfill opens
    /// a scan per unfinished vnode at every barrier and may read a few of them.
    pub fn new(
        sources: Vec<Box<dyn RunList>>,
        after: Option<&[u8]>,
        batch_size: usize,
    ) -> Result<Self> {
        Ok(Self {
            unopened: Some((sources, after.map(<[u8]>::to_vec))),
            sources: Vec::new(),
            batch_size: batch_size.max(1),
            keep_tombstones: false,
            fill: false,
        })
    }

    /// Positions every source at its first row after the start, loading that run.
    fn open(&mut self) -> Result<()> {
        let Some((lists, after)) = self.unopened.take() else {
            return Ok(());
        };
        let after = after.as_deref();
        self.sources.reserve(lists.len());
        for list in lists {
            // Skip whole runs that end at or before `after`, then position within the first.
            let first = match after {
                None => 0,
                Some(after) => {
                    partition_point(list.len(), |i| list.last_key(i).is_none_or(|k| k <= after))
                }
            };
            let current = if first < list.len() {
                Some(list.load(first)?)
            } else {
                None
            };
            let row = current.as_ref().map_or(0, |r| r.start_after(after));
            let mut source = Source {
                list,
                run: first,
                current,
                row,
            };
            source.settle()?;
            self.sources.push(source);
        }
        Ok(())
    }

    /// Returns winning tombstones too (see [`Self::next_with_tombstones`]): for merging delta
    /// runs into one delta run, whose tombstones must still hide the rows of the base.
    pub fn keeping_tombstones(mut self) -> Self {
        self.keep_tombstones = true;
        self
    }

    /// Fills every batch up to the batch size across run boundaries, a lone source too (a
    /// copy): for rewriting runs into blocks of a good size (compaction), where a scan hands
    /// out a lone source's runs zero-copy, one at a time.
    pub fn filling(mut self) -> Self {
        self.fill = true;
        self
    }

    /// The next batch with its tombstone mask (`None` when it holds no tombstone).
    pub fn next_with_tombstones(&mut self) -> Result<Option<(KeyedBatch, Option<BooleanArray>)>> {
        let pieces = self.next_pieces()?;
        let Some(batch) = assemble(&pieces)? else {
            return Ok(None);
        };
        let any = pieces.iter().any(Run::has_tombstones);
        let deleted = any.then(|| {
            let mut mask = BooleanBufferBuilder::new(batch.num_rows());
            for piece in &pieces {
                piece.append_deleted(0, piece.len(), &mut mask);
            }
            BooleanArray::new(mask.finish(), None)
        });
        Ok(Some((batch, deleted)))
    }

    /// The next batch of visible rows (at most `batch_size`), or `None` when exhausted.
    ///
    /// Rows are taken in ranges: the winning source contributes every row whose key is below
    /// the smallest head of the other sources in one step (a binary search), so a base with
    /// sparse deltas is copied range by range, and a lone source is sliced without copying.
    pub fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        let pieces = self.next_pieces()?;
        assemble(&pieces)
    }

    /// [`MergeReader::next_batch`] as a run: a range of the rows it was read from when the
    /// batch is one range (no arrays sliced), else the assembled copy.
    pub fn next_run(&mut self) -> Result<Option<Run>> {
        let mut pieces = self.next_pieces()?;
        if pieces.len() == 1 {
            return Ok(pieces.pop());
        }
        assemble(&pieces)?
            .map(|batch| Run::new(batch, None))
            .transpose()
    }

    /// Whether at most one source has rows left.
    fn lone_source(&self) -> bool {
        self.sources.iter().filter(|s| s.current.is_some()).count() <= 1
    }

    /// The row ranges of the next batch, in order.
    fn next_pieces(&mut self) -> Result<Vec<Run>> {
        self.open()?;
        // A lone source's next run is loaded here, when it is read (see below).
        for source in &mut self.sources {
            source.settle()?;
        }
        let mut pieces: Vec<Run> = Vec::new();
        let mut total = 0;
        while total < self.batch_size {
            // The smallest head; among equal keys the newest source (highest index) wins.
            let mut best: Option<(usize, &[u8])> = None;
            for (s, source) in self.sources.iter().enumerate() {
                if let Some(key) = source.head_key()
                    && best.is_none_or(|(_, b)| key <= b)
                {
                    best = Some((s, key));
                }
            }
            let Some((winner, _)) = best else { break };
            let Some((run, row)) = self.sources[winner].head().map(|(r, row)| (r.clone(), row))
            else {
                break;
            };
            // A batch ends where its rows would have to come from another run when it is at
            // least half full, or when its source is the only one left (a base read alone:
            // its runs follow each other, so every batch can be a zero-copy range of one):
            // handing out a short zero-copy slice beats copying the pieces into one. A chain
            // of short runs over many vnodes was otherwise copied whole, into fresh memory.
            if pieces.last().is_some_and(|last| !last.same_rows(&run))
                && (total >= self.batch_size / 2 || (!self.fill && self.lone_source()))
            {
                break;
            }
            // The smallest head among the other sources bounds the winner's range.
            let mut bound: Option<&[u8]> = None;
            for (s, source) in self.sources.iter().enumerate() {
                if s != winner
                    && let Some(key) = source.head_key()
                    && bound.is_none_or(|b| key < b)
                {
                    bound = Some(key);
                }
            }
            let room = self.batch_size - total;
            let end = match bound {
                None => run.len(),
                Some(bound) => row + partition_point(run.len() - row, |j| run.key(row + j) < bound),
            }
            .min(row + room);
            if end > row {
                // Rows strictly below every other head: take them, skipping tombstones.
                total += push_rows(&mut pieces, &run, row, end, self.keep_tombstones);
                self.sources[winner].row = end;
                // A lone source's next rows come from its next run, handed out as a batch of
                // its own (above): load that run at the next read, not now, so a reader that
                // hands out a run zero-copy does not also hold the next one meanwhile.
                if end == run.len() && total > 0 && !self.fill && self.lone_source() {
                    break;
                }
                self.sources[winner].settle()?;
            } else {
                // The winner ties another head: one row, and every source at that key moves on.
                let key = run.key(row);
                for source in &mut self.sources {
                    if source.head_key() == Some(key) {
                        source.row += 1;
                        source.settle()?;
                    }
                }
                total += push_rows(&mut pieces, &run, row, row + 1, self.keep_tombstones);
            }
        }
        Ok(pieces)
    }
}

/// Average rows per piece from which [`assemble`] concatenates instead of interleaving.
const LONG_PIECE: usize = 32;

/// One batch of the rows of `pieces` (ranges of shared rows, in order): a zero-copy slice
/// when they are one range (adjacent ranges of the same rows join), a copy for several.
///
/// Long pieces are concatenated (a slice per piece per column); short ones, as a base read
/// through dense deltas alternates, are gathered with one `interleave` per column from the
/// shared rows they are ranges of (each rows once), whose cost follows the rows instead of
/// the pieces.
pub(crate) fn assemble(pieces: &[Run]) -> Result<Option<KeyedBatch>> {
    let rows: usize = pieces.iter().map(Run::len).sum();
    match pieces {
        [] => Ok(None),
        [one] => Ok(Some(one.data_of(0, one.len()))),
        [first, ..] if pieces.windows(2).all(|w| w[0].continued_by(&w[1])) => {
            let (shared, start) = first.rows();
            Ok(Some(shared.data.slice(start, rows)))
        }
        _ if rows >= pieces.len() * LONG_PIECE => {
            let slices: Vec<KeyedBatch> = pieces.iter().map(|p| p.data_of(0, p.len())).collect();
            KeyedBatch::concat(&slices).map(Some)
        }
        _ => {
            let mut sources: Vec<&Arc<Rows>> = Vec::new();
            let mut indices = Vec::with_capacity(rows);
            for piece in pieces {
                let (shared, offset) = piece.rows();
                let source = match sources.iter().position(|r| Arc::ptr_eq(r, shared)) {
                    Some(i) => i,
                    None => {
                        sources.push(shared);
                        sources.len() - 1
                    }
                };
                indices.extend((offset..offset + piece.len()).map(|row| (source, row)));
            }
            let batches: Vec<&RecordBatch> = sources.iter().map(|r| &r.data.batch).collect();
            let batch = crate::interleave::interleave_batches(&batches, &indices)?;
            let keys: Vec<&dyn Array> =
                sources.iter().map(|r| &r.data.keys as &dyn Array).collect();
            let keys = arrow_select::interleave::interleave(&keys, &indices)?
                .as_binary::<i32>()
                .clone();
            Ok(Some(KeyedBatch { batch, keys }))
        }
    }
}

/// Appends the rows of `run[start..end]` to `pieces` as ranges, tombstones only if `keep`
/// is set; returns their count.
fn push_rows(pieces: &mut Vec<Run>, run: &Arc<Run>, start: usize, end: usize, keep: bool) -> usize {
    let mut pushed = 0;
    let mut push = |from: usize, to: usize| {
        if to > from {
            push_joined(pieces, run.slice(from, to - from));
            pushed += to - from;
        }
    };
    if keep || run.rows.deleted.is_none() {
        push(start, end);
    } else {
        let mut from = start;
        for i in start..end {
            if run.is_deleted(i) {
                push(from, i);
                from = i + 1;
            }
        }
        push(from, end);
    }
    pushed
}

/// Applies delta runs (oldest first) to a vnode's base segments. Segments whose key range no
/// delta touches are kept as they are; touched ones are merged and re-cut.
pub(crate) fn compact(base: &[Arc<Run>], deltas: &[Arc<Run>]) -> Result<Vec<Arc<Run>>> {
    let mut out = Vec::with_capacity(base.len() + 1);
    // Delta rows with keys in (lower, upper] belong to the segment whose last key is `upper`;
    // the last segment takes everything above.
    let mut starts: Vec<usize> = vec![0; deltas.len()];
    let segments: Vec<Option<&Arc<Run>>> = if base.is_empty() {
        vec![None]
    } else {
        base.iter().map(Some).collect()
    };
    let n = segments.len();
    for (i, segment) in segments.into_iter().enumerate() {
        let upper = if i + 1 == n {
            None
        } else {
            segment.and_then(|s| s.last_key())
        };
        let mut sources: Vec<Box<dyn RunList>> = Vec::with_capacity(deltas.len() + 1);
        sources.push(Box::new(segment.into_iter().cloned().collect::<Vec<_>>()));
        let mut touched = false;
        for (d, delta) in deltas.iter().enumerate() {
            let start = starts[d];
            let end = match upper {
                None => delta.len(),
                Some(upper) => {
                    start + partition_point(delta.len() - start, |j| delta.key(start + j) <= upper)
                }
            };
            starts[d] = end;
            if end > start {
                touched = true;
                sources.push(Box::new(vec![Arc::new(delta.slice(start, end - start))]));
            }
        }
        if !touched {
            out.extend(segment.cloned());
            continue;
        }
        let mut reader = MergeReader::new(sources, None, SEGMENT_ROWS)?.filling();
        while let Some(data) = reader.next_batch()? {
            out.push(Arc::new(Run::new(
                KeyedBatch {
                    batch: gc_views(data.batch)?,
                    keys: data.keys,
                },
                None,
            )?));
        }
    }
    Ok(out)
}

/// Sorts `rows` (indices into `keys`, in arrival order) by key and keeps, of each run of
/// equal keys, the last to arrive: the newest write of each key. The sort is stable, so
/// equal keys keep their arrival order.
fn newest_per_key(rows: &[u32], keys: &arrow_array::BinaryArray) -> Vec<u32> {
    let key = |row: u32| keys.value(row as usize);
    let mut sorted: Vec<(KeyPrefix, u32)> = rows
        .iter()
        .map(|&row| (KeyPrefix::of(key(row)), row))
        .collect();
    sorted.sort_by(|&(ap, a), &(bp, b)| ap.cmp(&bp).then_with(|| key(a).cmp(key(b))));
    let mut last: Vec<u32> = Vec::with_capacity(sorted.len());
    for (i, &(prefix, row)) in sorted.iter().enumerate() {
        let next_differs = sorted
            .get(i + 1)
            .is_none_or(|&(next_prefix, next)| next_prefix != prefix || key(next) != key(row));
        if next_differs {
            last.push(row);
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array};
    use arrow_schema::{Field, Schema};

    /// Issue 41 item 8: an epoch whose strings overflow one array (here: a lowered limit)
    /// is an error naming the column, exit status 2, not a bare Arrow error.
    #[test]
    fn an_overflowing_concatenation_names_the_column() {
        use arrow_array::StringArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let desc =
            TableDesc::new("t", schema.clone(), vec![crate::key::KeyColumn::asc("k")]).unwrap();
        let chunk = |k: i64| {
            StreamChunk::inserts(
                RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(vec![k])),
                        Arc::new(StringArray::from(vec!["0123456789"])),
                    ],
                )
                .unwrap(),
            )
        };
        let chunks = [chunk(1), chunk(2)];
        let overflow = || {
            Error::Arrow(arrow_schema::ArrowError::InvalidArgumentError(
                "Offset overflow error: 20".into(),
            ))
        };
        let err = too_large(&desc, &chunks, overflow(), 15);
        assert!(
            matches!(&err, Error::InvalidValue { column, .. } if column == "s"),
            "{err:?}"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("durable store"), "{err}");
        // Within the limit, or another error: passed on as it is.
        assert!(matches!(
            too_large(&desc, &chunks, overflow(), 20),
            Error::Arrow(_)
        ));
        let other = Error::Internal("x".into());
        assert!(matches!(
            too_large(&desc, &chunks, other, 15),
            Error::Internal(_)
        ));
    }

    #[test]
    fn a_merge_takes_the_newest_runs_back_to_a_bigger_tier() {
        // Two at least, even when the older one is far bigger.
        assert_eq!(newest_tier(&[1000, 10]), 0);
        assert_eq!(newest_tier(&[1000, 300, 10]), 1);
        // Equal deltas: all of them.
        assert_eq!(newest_tier(&[10; 8]), 0);
        // A tier more than twice the newer ones stays.
        assert_eq!(newest_tier(&[700, 10, 10, 10, 10, 10, 10, 10]), 1);
        assert_eq!(newest_tier(&[700, 100, 10, 10, 10, 10, 10, 10]), 1);
        assert_eq!(newest_tier(&[700, 130, 10, 10, 10, 10, 10, 10]), 2);
    }

    /// Runs of one epoch's rows each, merged whenever there are 8: every row is rewritten a
    /// logarithmic number of times, and the runs stay few.
    #[test]
    fn tiers_rewrite_each_row_a_few_times() {
        let (epoch_rows, epochs) = (100u64, 1000);
        let mut deltas: Vec<u64> = Vec::new();
        let mut rewritten = 0;
        for _ in 0..epochs {
            deltas.push(epoch_rows);
            if deltas.len() >= 8 {
                let from = newest_tier(&deltas);
                let merged: u64 = deltas.drain(from..).sum();
                rewritten += merged;
                deltas.push(merged);
            }
        }
        let written = epoch_rows * epochs;
        assert!(rewritten <= 8 * written, "{rewritten} rows rewritten");
        assert!(deltas.len() < 8);
        assert_eq!(deltas.iter().sum::<u64>(), written);
    }

    /// A run of Int64 rows whose keys are the values' big-endian bytes (sorted as numbers).
    fn run(values: std::ops::RangeInclusive<i64>) -> Arc<Run> {
        let values: Vec<i64> = values.collect();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.clone()))]).unwrap();
        let keys = BinaryArray::from_iter_values(values.iter().map(|v| v.to_be_bytes()));
        Arc::new(Run::new(KeyedBatch { batch, keys }, None).unwrap())
    }

    /// The batches of a merged read of a base of two runs (1..=6, 7..=10), with a delta of
    /// one row (20) if `delta`.
    fn batches_of(batch_size: usize, delta: bool) -> Vec<Vec<i64>> {
        read_all(batch_size, delta, false)
    }

    /// [`batches_of`], from a [`MergeReader::filling`] reader if `fill`.
    fn read_all(batch_size: usize, delta: bool, fill: bool) -> Vec<Vec<i64>> {
        let mut sources: Vec<Box<dyn RunList>> = vec![Box::new(vec![run(1..=6), run(7..=10)])];
        if delta {
            sources.push(Box::new(vec![run(20..=20)]));
        }
        let mut reader = MergeReader::new(sources, None, batch_size).unwrap();
        if fill {
            reader = reader.filling();
        }
        let mut out = Vec::new();
        while let Some(b) = reader.next_batch().unwrap() {
            let k = b
                .batch
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            out.push(k.values().to_vec());
        }
        out
    }

    fn batches(batch_size: usize) -> Vec<Vec<i64>> {
        batches_of(batch_size, false)
    }

    #[test]
    fn a_half_full_batch_ends_at_a_run_boundary_instead_of_copying() {
        assert_eq!(
            batches(4),
            vec![vec![1, 2, 3, 4], vec![5, 6], vec![7, 8, 9, 10]]
        );
        assert_eq!(batches(8), vec![vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 10]]);
        assert_eq!(
            batches_of(4, true),
            vec![vec![1, 2, 3, 4], vec![5, 6], vec![7, 8, 9, 10], vec![20]]
        );
    }

    #[test]
    fn a_lone_source_never_copies_across_its_runs() {
        assert_eq!(batches(16), vec![vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 10]]);
        assert_eq!(
            batches(5),
            vec![vec![1, 2, 3, 4, 5], vec![6], vec![7, 8, 9, 10]]
        );
    }

    /// A run list that counts its loads.
    struct Counted {
        runs: Vec<Arc<Run>>,
        loads: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl RunList for Counted {
        fn len(&self) -> usize {
            self.runs.len()
        }
        fn last_key(&self, i: usize) -> Option<&[u8]> {
            self.runs[i].last_key()
        }
        fn load(&self, i: usize) -> Result<Arc<Run>> {
            self.loads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(self.runs[i].clone())
        }
    }

    /// A lone source hands out a run and loads the next one only when it is read: a reader
    /// holding a zero-copy run does not hold the next one too.
    #[test]
    fn a_lone_source_loads_its_next_run_when_it_is_read() {
        let loads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let list = Counted {
            runs: vec![run(1..=6), run(7..=10), run(11..=12)],
            loads: loads.clone(),
        };
        let mut reader = MergeReader::new(vec![Box::new(list)], None, 16).unwrap();
        let loaded = || loads.load(std::sync::atomic::Ordering::Relaxed);
        let keys = |b: KeyedBatch| -> Vec<i64> {
            let k = b
                .batch
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            k.values().to_vec()
        };
        assert_eq!(
            keys(reader.next_batch().unwrap().unwrap()),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(loaded(), 1);
        assert_eq!(keys(reader.next_batch().unwrap().unwrap()), [7, 8, 9, 10]);
        assert_eq!(loaded(), 2);
        assert_eq!(keys(reader.next_batch().unwrap().unwrap()), [11, 12]);
        assert!(reader.next_batch().unwrap().is_none());
        assert_eq!(loaded(), 3);
    }

    /// A rewrite (compaction) fills its batches across a lone source's runs: it writes each
    /// batch as blocks of its own, and a chain of short runs must not become short blocks.
    #[test]
    fn a_filling_reader_copies_across_a_lone_sources_runs() {
        assert_eq!(
            read_all(16, false, true),
            vec![(1..=10).collect::<Vec<i64>>()]
        );
        assert_eq!(
            read_all(32, true, true),
            vec![vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20]]
        );
        assert_eq!(
            read_all(4, false, true),
            vec![vec![1, 2, 3, 4], vec![5, 6], vec![7, 8, 9, 10]]
        );
    }

    #[test]
    fn a_batch_under_half_full_crosses_run_boundaries_while_sources_interleave() {
        // 6 then 7..=10 while the delta waits: one copied batch; then the delta alone.
        assert_eq!(
            batches_of(32, true),
            vec![vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10], vec![20]]
        );
        assert_eq!(
            batches_of(5, true),
            vec![vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10], vec![20]]
        );
    }

    /// Differential: the sliced runs hold the same rows, keys and tombstones per vnode as
    /// one batch per vnode, for random changes with repeated keys and deletes.
    #[test]
    fn sliced_runs_equal_runs_built_per_vnode() {
        use crate::key::KeyColumn;
        use crate::vnode::VnodeCount;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, true),
        ]));
        for (seed, vnodes) in [(1u64, 1usize), (2, 7), (3, 256)] {
            let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(vnodes).unwrap());
            let mut x = seed;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let n = 2000;
            let keys: Vec<i64> = (0..n).map(|_| (next() % 500) as i64).collect();
            let ops: Vec<Op> = (0..n)
                .map(|_| {
                    if next() % 4 == 0 {
                        Op::Delete
                    } else {
                        Op::Insert
                    }
                })
                .collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(keys.clone())),
                    Arc::new(arrow_array::StringViewArray::from_iter_values(
                        (0..n).map(|i| format!("a value long enough to live out of line {i}")),
                    )),
                ],
            )
            .unwrap();
            let vnode_of = desc.vnodes_of(&batch).unwrap();
            let want = build_runs(&desc, &batch, &ops, &vnode_of).unwrap();
            let same = |got: &[(VirtualNode, Run)]| {
                assert_eq!(got.len(), want.len());
                for ((gv, g), (wv, w)) in got.iter().zip(&want) {
                    assert_eq!(gv, wv);
                    assert_eq!(g.batch(), w.batch(), "vnode {gv}");
                    assert_eq!(g.data().keys, w.data().keys, "vnode {gv}");
                    let bits = |r: &Run| r.deleted().map(|d| d.iter().collect::<Vec<_>>());
                    assert_eq!(bits(g), bits(w), "vnode {gv}");
                }
            };
            // The input's string bytes: a run shares them, or has its own.
            let input = batch.column(1).as_string_view().data_buffers()[0].as_ptr();
            let shares_input = |runs: &[(VirtualNode, Run)]| {
                runs.iter().all(|(_, run)| {
                    let column = run.batch().column(1).clone();
                    (column.as_string_view().data_buffers().iter()).any(|b| b.as_ptr() == input)
                })
            };
            // The same rows in pieces of uneven sizes, gathered from the pieces.
            let pieces = [
                batch.slice(0, 1),
                batch.slice(1, 700),
                batch.slice(701, 0),
                batch.slice(701, n - 701),
            ];
            let pieces: Vec<&RecordBatch> = pieces.iter().collect();
            for views in [Views::Compact, Views::Shared] {
                let (got, per_row) =
                    build_sliced_runs(&desc, &[&batch], &ops, &vnode_of, None, views).unwrap();
                assert!(per_row > 0);
                same(&got);
                assert_eq!(shares_input(&got), views == Views::Shared, "{views:?}");
                let (split, split_per_row) =
                    build_sliced_runs(&desc, &pieces, &ops, &vnode_of, None, views).unwrap();
                assert!(split_per_row > 0);
                same(&split);
                assert_eq!(shares_input(&split), views == Views::Shared, "{views:?}");
            }
            // Rows, ops and vnodes that do not match are an error, not a panic.
            assert!(
                build_sliced_runs(&desc, &pieces[..2], &ops, &vnode_of, None, Views::Compact)
                    .is_err()
            );
        }
    }

    #[test]
    fn only_orders_that_keep_long_stretches_of_the_input_are_scattered() {
        // Eight vnodes, each taking its rows of a key-ordered input in input order.
        let by_vnode: Vec<u32> = (0..8u32)
            .flat_map(|v| (0..4096u32).filter(move |r| r % 8 == v))
            .collect();
        assert!(keeps_input_order(&by_vnode));
        assert!(keeps_input_order(&(0..100).collect::<Vec<u32>>()));
        // A shuffled input: every other row goes back.
        let zigzag: Vec<u32> = (0..4096u32).map(|r| r ^ 1).collect();
        assert!(!keeps_input_order(&zigzag));
        assert!(!keeps_input_order(&(0..4096u32).rev().collect::<Vec<_>>()));
    }
}
