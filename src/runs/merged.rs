//! The merged read over sorted runs, and what is built on it.
//!
//! [`MergeReader`] reads a vnode at an epoch: the base plus the delta runs visible at that
//! epoch, oldest first. For equal keys the newest source wins; a winning tombstone hides the
//! key. With no delta it hands out zero-copy slices of the base. [`assemble`] makes one
//! batch of the ranges a read took; [`compact`] folds delta runs into a base's segments;
//! [`newest_tier`] picks the runs of a stack to merge next.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_buffer::BooleanBufferBuilder;

use super::KeyedBatch;
use super::run::{Rows, Run, RunList, SEGMENT_ROWS, gc_views, partition_point, push_joined};
use crate::error::Result;

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
    /// a scan per unfinished vnode when its snapshot starts and may read a few of them.
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
    if keep || run.rows().0.deleted.is_none() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array};
    use arrow_schema::{DataType, Field, Schema};

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
}
