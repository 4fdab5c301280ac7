//! Building sorted runs from change chunks: an epoch's changes grouped by vnode, sorted by
//! key, the newest change of each key kept (inserts as rows, deletes as tombstones).
//!
//! [`build_runs`] makes a batch per vnode; [`build_sliced_runs`] makes one batch sorted by
//! vnode then key, each vnode's run a range of it (one copy of the rows, however many
//! vnodes), reordered by a scatter where the input's order allows ([`super::scatter`]).

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow_buffer::BooleanBuffer;
use arrow_schema::DataType;
use rayon::prelude::*;

use super::KeyedBatch;
use super::run::{MemoryCounter, Rows, Run, Views, gc_views, with_views};
use super::scatter::{Destinations, scatter};
use crate::chunk::{Op, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::key::KeyPrefix;
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

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
    use std::sync::Arc;

    use super::*;
    use arrow_array::Int64Array;
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
        assert!(err.is_bad_input());
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
