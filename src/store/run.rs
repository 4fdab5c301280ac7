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

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_buffer::BooleanBuffer;
use arrow_schema::DataType;
use rayon::prelude::*;

use crate::chunk::Op;
use crate::error::{Error, Result};
use crate::store::KeyedBatch;
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// Target rows per committed segment.
pub(crate) const SEGMENT_ROWS: usize = 8192;

/// Rows of one vnode sorted by key; `deleted[i]` marks a tombstone.
#[derive(Debug)]
pub(crate) struct Run {
    pub data: KeyedBatch,
    pub deleted: Option<BooleanBuffer>,
}

impl Run {
    pub fn len(&self) -> usize {
        self.data.num_rows()
    }

    fn key(&self, i: usize) -> &[u8] {
        self.data.keys.value(i)
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

    /// Rows `offset..offset + len`, zero-copy.
    fn slice(&self, offset: usize, len: usize) -> Run {
        Run {
            data: self.data.slice(offset, len),
            deleted: self.deleted.as_ref().map(|d| d.slice(offset, len)),
        }
    }

    pub fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }
}

/// Compacts the string and binary *view* columns of a batch kept by the store.
///
/// `take`, `interleave` and `concat` of view arrays keep every data buffer of their inputs
/// (views point into them), and concatenation appends the inputs' buffer lists. A segment
/// rewritten commit after commit would pile up references (and memory) without bound, so
/// every batch the store keeps holds its own copy of just the bytes it uses.
fn gc_views(batch: RecordBatch) -> Result<RecordBatch> {
    let needs_gc = batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView));
    if !needs_gc {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView => Arc::new(c.as_binary_view().gc()),
                _ => c.clone(),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The first index in `0..len` where `pred` is false (`pred` must be monotone).
fn partition_point(len: usize, pred: impl Fn(usize) -> bool) -> usize {
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
        .map(|(vnode, mut rows)| {
            // Stable: equal keys keep arrival order, so the last of a run of equals is the newest.
            rows.sort_by(|&a, &b| keys.value(a as usize).cmp(keys.value(b as usize)));
            let mut last: Vec<u32> = Vec::with_capacity(rows.len());
            for (i, &row) in rows.iter().enumerate() {
                let next_differs = rows
                    .get(i + 1)
                    .is_none_or(|&next| keys.value(next as usize) != keys.value(row as usize));
                if next_differs {
                    last.push(row);
                }
            }
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
            let vnode = u16::try_from(vnode)
                .map_err(|_| Error::Internal(format!("vnode index {vnode} out of range")))?;
            Ok((VirtualNode::new(vnode), Run { data, deleted }))
        })
        .collect()
}

/// One input of a merged read: a list of runs read in order.
struct Source {
    /// Global ids of this source's runs (indices into `MergeReader::runs`).
    run_ids: Vec<usize>,
    /// Index into `run_ids` of the current run.
    run: usize,
    /// Row within the current run.
    row: usize,
}

/// A merged, sorted read of one vnode: base segments plus delta runs, newest wins.
pub(crate) struct MergeReader {
    runs: Vec<Arc<Run>>,
    sources: Vec<Source>,
    batch_size: usize,
}

impl MergeReader {
    /// `sources` are ordered oldest (the base) to newest; each is a list of runs whose key
    /// ranges follow each other. Reading starts strictly after `after`.
    pub fn new(sources: Vec<Vec<Arc<Run>>>, after: Option<&[u8]>, batch_size: usize) -> Self {
        let mut runs = Vec::new();
        let mut out = Vec::with_capacity(sources.len());
        for source in sources {
            // Skip whole runs that end at or before `after`, then position within the first.
            let first = match after {
                None => 0,
                Some(after) => partition_point(source.len(), |i| {
                    source[i].last_key().is_none_or(|k| k <= after)
                }),
            };
            let row = source.get(first).map_or(0, |r| r.start_after(after));
            let base_id = runs.len();
            let n = source.len();
            runs.extend(source);
            out.push(Source {
                run_ids: (base_id..base_id + n).collect(),
                run: first,
                row,
            });
        }
        let mut reader = Self {
            runs,
            sources: out,
            batch_size: batch_size.max(1),
        };
        for s in 0..reader.sources.len() {
            reader.settle(s);
        }
        reader
    }

    /// Moves source `s` past exhausted runs.
    fn settle(&mut self, s: usize) {
        let source = &mut self.sources[s];
        while let Some(&id) = source.run_ids.get(source.run) {
            if source.row < self.runs[id].len() {
                break;
            }
            source.run += 1;
            source.row = 0;
        }
    }

    /// The current (run id, row) of source `s`, if not exhausted.
    fn head(&self, s: usize) -> Option<(usize, usize)> {
        let source = &self.sources[s];
        source.run_ids.get(source.run).map(|&id| (id, source.row))
    }

    /// The next batch of visible rows, or `None` when exhausted.
    ///
    /// Rows are taken in ranges: the winning source contributes every row whose key is below
    /// the smallest head of the other sources in one step (a binary search), so a base with
    /// sparse deltas is copied range by range, and a lone source is sliced without copying.
    pub fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        let mut pieces: Vec<(usize, usize, usize)> = Vec::new(); // (run id, start, len)
        let mut total = 0;
        while total < self.batch_size {
            // The smallest head; among equal keys the newest source (highest index) wins.
            let mut best: Option<(usize, usize, usize)> = None; // (source, run id, row)
            for s in 0..self.sources.len() {
                if let Some((id, row)) = self.head(s) {
                    let better = best.is_none_or(|(_, bid, brow)| {
                        self.runs[id].key(row) <= self.runs[bid].key(brow)
                    });
                    if better {
                        best = Some((s, id, row));
                    }
                }
            }
            let Some((winner, id, row)) = best else { break };
            let run = self.runs[id].clone();
            // The smallest head among the other sources bounds the winner's range.
            let mut bound: Option<&[u8]> = None;
            for s in (0..self.sources.len()).filter(|s| *s != winner) {
                if let Some((sid, srow)) = self.head(s) {
                    let key = self.runs[sid].key(srow);
                    if bound.is_none_or(|b| key < b) {
                        bound = Some(key);
                    }
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
                total += push_live(&mut pieces, &run, id, row, end);
                self.sources[winner].row = end;
                self.settle(winner);
            } else {
                // The winner ties another head: one row, and every source at that key moves on.
                let key = run.key(row).to_vec();
                for s in 0..self.sources.len() {
                    if let Some((sid, srow)) = self.head(s)
                        && self.runs[sid].key(srow) == key.as_slice()
                    {
                        self.sources[s].row += 1;
                        self.settle(s);
                    }
                }
                total += push_live(&mut pieces, &run, id, row, row + 1);
            }
        }
        match pieces.as_slice() {
            [] => Ok(None),
            [(id, start, len)] => Ok(Some(self.runs[*id].data.slice(*start, *len))),
            _ => {
                let slices: Vec<KeyedBatch> = pieces
                    .iter()
                    .map(|(id, start, len)| self.runs[*id].data.slice(*start, *len))
                    .collect();
                let schema = slices[0].batch.schema();
                let batch =
                    arrow_select::concat::concat_batches(&schema, slices.iter().map(|s| &s.batch))?;
                let keys: Vec<&dyn Array> = slices.iter().map(|s| &s.keys as &dyn Array).collect();
                let keys = arrow_select::concat::concat(&keys)?
                    .as_binary::<i32>()
                    .clone();
                Ok(Some(KeyedBatch { batch, keys }))
            }
        }
    }
}

/// Appends the live rows of `run[start..end]` to `pieces` as ranges; returns their count.
fn push_live(
    pieces: &mut Vec<(usize, usize, usize)>,
    run: &Run,
    id: usize,
    start: usize,
    end: usize,
) -> usize {
    let mut pushed = 0;
    let mut push = |from: usize, to: usize| {
        if to > from {
            match pieces.last_mut() {
                Some((last_id, last_start, last_len))
                    if *last_id == id && *last_start + *last_len == from =>
                {
                    *last_len += to - from;
                }
                _ => pieces.push((id, from, to - from)),
            }
            pushed += to - from;
        }
    };
    match &run.deleted {
        None => push(start, end),
        Some(deleted) => {
            let mut from = start;
            for i in start..end {
                if deleted.value(i) {
                    push(from, i);
                    from = i + 1;
                }
            }
            push(from, end);
        }
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
        let mut sources: Vec<Vec<Arc<Run>>> = Vec::with_capacity(deltas.len() + 1);
        sources.push(segment.into_iter().cloned().collect());
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
                sources.push(vec![Arc::new(delta.slice(start, end - start))]);
            }
        }
        if !touched {
            out.extend(segment.cloned());
            continue;
        }
        let mut reader = MergeReader::new(sources, None, SEGMENT_ROWS);
        while let Some(data) = reader.next_batch()? {
            out.push(Arc::new(Run {
                data: KeyedBatch {
                    batch: gc_views(data.batch)?,
                    keys: data.keys,
                },
                deleted: None,
            }));
        }
    }
    Ok(out)
}
