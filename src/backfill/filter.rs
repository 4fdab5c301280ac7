//! Filtering upstream changes against backfill progress.
//!
//! At a barrier every buffered upstream chunk is marked, row by row, against the progress of
//! the row's vnode (docs/DESIGN.md section 7.5):
//!
//! ```text
//!   vnode state      rule
//!   Completed        emit       (the downstream holds the whole vnode)
//!   NotStarted       drop       (the snapshot will bring the row later)
//!   InProgress(pos)  emit iff key <= pos   (inclusive; the snapshot bound is exclusive)
//! ```
//!
//! The work is vectorized: the vnode of every row (one hashing pass), the key of every row
//! (one arrow-row pass, only when some vnode is InProgress), one boolean mask built with
//! `collect_bool`, then one Arrow filter. A table keyed by one integer column skips key
//! encoding and compares native values, without a branch on the vnode's rule: each vnode's
//! rule and bound are laid out per vnode at preparation, and a row's verdict is a gather,
//! a compare and two masks. When one half of an update pair is dropped, the other
//! becomes a plain Delete or Insert ([`StreamChunk::filter`]).
//!
//! An [`UpstreamFilter`] is prepared once per barrier (positions do not move while buffered
//! chunks are filtered) and applied to each chunk, the builder/predicate shape of Arrow's
//! filter kernel.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, BooleanArray};
use arrow_buffer::BooleanBuffer;
use arrow_schema::DataType;

use crate::backfill::progress::{ProgressMap, VnodeProgress};
use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// What happens to upstream rows of one vnode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The vnode is not owned: its rows are an error.
    NotOwned,
    /// Drop every row.
    Drop,
    /// Emit every row.
    Emit,
    /// Emit rows whose key is at or below bound number `.0`.
    UpTo(usize),
}

/// A prepared filter: the rule of every vnode and the bounds in the forms the kernels need.
#[derive(Debug)]
pub struct UpstreamFilter {
    desc: Arc<TableDesc>,
    rules: Vec<Rule>,
    bounds: Vec<Position>,
    /// The bounds as native values, when the key is a single integer column.
    native: Option<NativeBounds>,
}

/// Bounds of a single integer key column, as the column's values, one per vnode, with what
/// each vnode's rows do, so the mask is a branch-free gather and compare per row.
#[derive(Debug)]
struct NativeBounds {
    column: usize,
    descending: bool,
    /// Per vnode, its bound (any value where the vnode has none).
    per_vnode: ArrayRef,
    /// Per vnode: [`EMIT`] for every row, [`BOUNDED`] for rows within the bound, or 0.
    modes: Vec<u8>,
}

/// A vnode's rows are all emitted.
const EMIT: u8 = 1;
/// A vnode's rows are emitted up to its bound.
const BOUNDED: u8 = 2;

impl UpstreamFilter {
    /// The arrangement backfill's filter: one rule per owned vnode from its progress.
    pub fn for_progress(desc: Arc<TableDesc>, progress: &ProgressMap) -> Result<Self> {
        let mut rules = vec![Rule::NotOwned; desc.vnode_count().get()];
        let mut bounds = Vec::new();
        for (vnode, state) in progress.iter() {
            rules[vnode.index()] = match state {
                VnodeProgress::NotStarted => Rule::Drop,
                VnodeProgress::Completed { .. } => Rule::Emit,
                VnodeProgress::InProgress { pos, .. } => {
                    bounds.push(pos.clone());
                    Rule::UpTo(bounds.len() - 1)
                }
            };
        }
        Self::prepare(desc, rules, bounds)
    }

    /// The no-shuffle baseline's filter: one global bound for every owned vnode
    /// (`None` and not finished: drop all; finished: emit all).
    pub fn global(
        desc: Arc<TableDesc>,
        owned: &VnodeBitmap,
        pos: Option<&Position>,
        finished: bool,
    ) -> Result<Self> {
        let rule = match (finished, pos) {
            (true, _) => Rule::Emit,
            (false, None) => Rule::Drop,
            (false, Some(_)) => Rule::UpTo(0),
        };
        let mut rules = vec![Rule::NotOwned; desc.vnode_count().get()];
        for v in owned.iter() {
            rules[v.index()] = rule;
        }
        let bounds = pos.into_iter().cloned().collect();
        Self::prepare(desc, rules, bounds)
    }

    fn prepare(desc: Arc<TableDesc>, rules: Vec<Rule>, bounds: Vec<Position>) -> Result<Self> {
        let pk = desc.pk();
        let native = match (pk.indices(), pk.key_schema().field(0).data_type()) {
            ([column], dt) if dt.is_integer() && !bounds.is_empty() => {
                let values = pk
                    .decode(bounds.iter().map(Position::as_bytes))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| internal!("decoded key has no column"))?;
                // NULL bounds order by null rules; leave those to the encoded path.
                if values.null_count() == 0 {
                    let bound_of = rules.iter().map(|rule| match rule {
                        Rule::UpTo(b) => *b as u32,
                        _ => 0,
                    });
                    let per_vnode = arrow_select::take::take(
                        &values,
                        &arrow_array::UInt32Array::from_iter_values(bound_of),
                        None,
                    )?;
                    let modes = rules
                        .iter()
                        .map(|rule| match rule {
                            Rule::Emit => EMIT,
                            Rule::UpTo(_) => BOUNDED,
                            Rule::Drop | Rule::NotOwned => 0,
                        })
                        .collect();
                    Some(NativeBounds {
                        column: *column,
                        descending: pk.columns()[0].descending,
                        per_vnode,
                        modes,
                    })
                } else {
                    None
                }
            }
            _ => None,
        };
        Ok(Self {
            desc,
            rules,
            bounds,
            native,
        })
    }

    /// Which rows of `chunk` to emit.
    pub fn mask(&self, chunk: &StreamChunk) -> Result<BooleanArray> {
        Ok(self.mask_with_vnodes(chunk)?.0)
    }

    /// The rows of `chunk` to emit, with update pairs repaired, and the rows it drops (the
    /// same repair: a dropped half of a pair whose other half is kept is a plain Delete or
    /// Insert), their vnodes added to `dropped`: the rows change the snapshot beyond their
    /// vnode's position (the backfill patches or restarts those scans at the barrier).
    pub fn split_noting_drops(
        &self,
        chunk: &StreamChunk,
        dropped: &mut VnodeBitmap,
    ) -> Result<(StreamChunk, Option<StreamChunk>)> {
        let (mask, vnodes) = self.mask_with_vnodes(chunk)?;
        if mask.true_count() == mask.len() {
            return Ok((chunk.clone(), None));
        }
        for (i, vnode) in vnodes.iter().enumerate() {
            if !mask.value(i) {
                dropped.insert(*vnode)?;
            }
        }
        // The mask has no NULLs (`mask_with_vnodes` builds it without).
        let drop = BooleanArray::new(!mask.values(), None);
        Ok((chunk.filter(&mask)?, Some(chunk.filter(&drop)?)))
    }

    /// The mask, and the vnode of every row.
    fn mask_with_vnodes(&self, chunk: &StreamChunk) -> Result<(BooleanArray, Vec<VirtualNode>)> {
        let batch = chunk.batch();
        self.desc
            .check_schema(batch.schema_ref(), "a filtered chunk")?;
        let n = batch.num_rows();
        let vnodes = self.desc.vnodes_of(batch)?;
        let rule = |i: usize| self.rules[vnodes[i].index()];
        if let Some(i) = (0..n).find(|&i| rule(i) == Rule::NotOwned) {
            return Err(Error::VnodeNotOwned {
                vnode: vnodes[i].get(),
                owner: format!("the backfill of table `{}`", self.desc.name()),
            });
        }
        // Usually decided by the first rows.
        let any_bounded = (0..n).any(|i| matches!(rule(i), Rule::UpTo(_)));
        let keep = if !any_bounded {
            BooleanBuffer::collect_bool(n, |i| rule(i) == Rule::Emit)
        } else if let Some(keep) = self.native_mask(batch, &vnodes)? {
            keep
        } else {
            let keys = self.desc.pk().encode(batch)?;
            BooleanBuffer::collect_bool(n, |i| match rule(i) {
                Rule::Emit => true,
                Rule::UpTo(b) => keys.value(i) <= self.bounds[b].as_bytes(),
                Rule::Drop | Rule::NotOwned => false,
            })
        };
        Ok((BooleanArray::new(keep, None), vnodes))
    }

    /// The rows of `chunk` to emit, with update pairs repaired.
    pub fn filter(&self, chunk: &StreamChunk) -> Result<StreamChunk> {
        chunk.filter(&self.mask(chunk)?)
    }

    /// The mask by native comparison, when the key is one integer column without NULLs.
    fn native_mask(
        &self,
        batch: &arrow_array::RecordBatch,
        vnodes: &[VirtualNode],
    ) -> Result<Option<BooleanBuffer>> {
        let Some(native) = &self.native else {
            return Ok(None);
        };
        let column = batch.column(native.column);
        if column.null_count() > 0 {
            return Ok(None);
        }
        macro_rules! native {
            ($t:ty) => {
                Some(native_mask_typed::<$t>(column, native, vnodes))
            };
        }
        Ok(match column.data_type() {
            DataType::Int8 => native!(Int8Type),
            DataType::Int16 => native!(Int16Type),
            DataType::Int32 => native!(Int32Type),
            DataType::Int64 => native!(Int64Type),
            DataType::UInt8 => native!(UInt8Type),
            DataType::UInt16 => native!(UInt16Type),
            DataType::UInt32 => native!(UInt32Type),
            DataType::UInt64 => native!(UInt64Type),
            _ => None,
        })
    }
}

/// Per row: emitted when its vnode emits everything, or bounds it and the value is within
/// the bound. Written without branches on the rule (a third each of emit, drop and bounded
/// rows mispredicted every other row), it runs as gathers, compares and masks.
fn native_mask_typed<T: ArrowPrimitiveType>(
    column: &ArrayRef,
    native: &NativeBounds,
    vnodes: &[VirtualNode],
) -> BooleanBuffer
where
    T::Native: Ord,
{
    let values = column.as_primitive::<T>().values();
    let bounds = native.per_vnode.as_primitive::<T>().values();
    let modes = &native.modes;
    let keep = |i: usize, within: fn(T::Native, T::Native) -> bool| {
        let v = vnodes[i].index();
        let mode = modes[v];
        (mode & EMIT != 0) | ((mode & BOUNDED != 0) & within(values[i], bounds[v]))
    };
    if native.descending {
        BooleanBuffer::collect_bool(values.len(), |i| keep(i, |x, b| x >= b))
    } else {
        BooleanBuffer::collect_bool(values.len(), |i| keep(i, |x, b| x <= b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Op;
    use crate::key::KeyColumn;
    use crate::vnode::{self, VnodeCount};
    use arrow_array::{Int32Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{Field, Schema, SchemaRef};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    fn int_table(vnodes: usize, descending: bool) -> Arc<TableDesc> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]));
        let key = if descending {
            KeyColumn::desc("k")
        } else {
            KeyColumn::asc("k")
        };
        Arc::new(
            TableDesc::new("t", schema, vec![key])
                .unwrap()
                .with_vnode_count(VnodeCount::new(vnodes).unwrap()),
        )
    }

    fn composite_table(vnodes: usize) -> Arc<TableDesc> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        Arc::new(
            TableDesc::new("c", schema, vec![KeyColumn::asc("s"), KeyColumn::desc("i")])
                .unwrap()
                .with_distribution_key(&["s"])
                .unwrap()
                .with_vnode_count(VnodeCount::new(vnodes).unwrap()),
        )
    }

    fn position_of(desc: &TableDesc, batch: &RecordBatch, row: usize) -> Position {
        Position::from_keys(&desc.pk().encode(batch).unwrap(), row)
    }

    /// The plain per-row reference: vnode and key of one row at a time.
    fn reference_mask(desc: &TableDesc, progress: &ProgressMap, chunk: &StreamChunk) -> Vec<bool> {
        let batch = chunk.batch();
        let dist: Vec<ArrayRef> = match desc.distribution() {
            crate::table::Distribution::Hash(cols) => {
                cols.iter().map(|&c| batch.column(c).clone()).collect()
            }
            crate::table::Distribution::VnodeColumn(_) => unreachable!(),
        };
        (0..batch.num_rows())
            .map(|row| {
                let vnode = vnode::vnode_of_row(&dist, row, desc.vnode_count()).unwrap();
                match progress.get(vnode).unwrap() {
                    VnodeProgress::NotStarted => false,
                    VnodeProgress::Completed { .. } => true,
                    VnodeProgress::InProgress { pos, .. } => {
                        let one = batch.slice(row, 1);
                        desc.pk().encode(&one).unwrap().value(0) <= pos.as_bytes()
                    }
                }
            })
            .collect()
    }

    fn int_chunk(desc: &TableDesc, keys: &[Option<i64>]) -> StreamChunk {
        let batch = RecordBatch::try_new(
            desc.schema().clone(),
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(StringArray::from(vec!["x"; keys.len()])),
            ],
        )
        .unwrap();
        StreamChunk::inserts(batch)
    }

    #[test]
    fn rules_per_state_on_a_single_vnode() {
        let desc = int_table(1, false);
        let chunk = int_chunk(&desc, &[Some(1), Some(5), Some(6), Some(9)]);
        let mut progress = ProgressMap::new(VnodeBitmap::full(desc.vnode_count()));
        let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
        assert_eq!(
            filter.filter(&chunk).unwrap().num_rows(),
            0,
            "NotStarted drops"
        );
        progress
            .advance(VirtualNode::ZERO, position_of(&desc, chunk.batch(), 1), 2)
            .unwrap();
        let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
        assert!(
            filter.native.is_some(),
            "an Int64 key takes the native path"
        );
        let mask = filter.mask(&chunk).unwrap();
        assert_eq!(
            mask.values().iter().collect::<Vec<_>>(),
            [true, true, false, false]
        );
        progress.complete(VirtualNode::ZERO).unwrap();
        let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
        assert_eq!(
            filter.filter(&chunk).unwrap().num_rows(),
            4,
            "Completed emits"
        );
    }

    #[test]
    fn update_pair_across_the_position_becomes_plain_changes() {
        let desc = int_table(1, false);
        let schema: SchemaRef = desc.schema().clone();
        // U- at key 3 (kept, <= pos 4) / U+ at key 8 (dropped): a Delete remains.
        let chunk = StreamChunk::from_text(&schema, "U- 3 a\nU+ 8 b\nU- 9 c\nU+ 2 d").unwrap();
        let pos_batch = int_chunk(&desc, &[Some(4)]);
        let mut progress = ProgressMap::new(VnodeBitmap::full(desc.vnode_count()));
        progress
            .advance(
                VirtualNode::ZERO,
                position_of(&desc, pos_batch.batch(), 0),
                1,
            )
            .unwrap();
        let filter = UpstreamFilter::for_progress(desc, &progress).unwrap();
        let out = filter.filter(&chunk).unwrap();
        assert_eq!(out.ops(), &[Op::Delete, Op::Insert]);
        assert_eq!(out.to_text().unwrap(), "- 3 a\n+ 2 d\n");
    }

    #[test]
    fn rows_of_unowned_vnodes_are_an_error() {
        let desc = int_table(4, false);
        let chunk = int_chunk(&desc, &[Some(1)]);
        let vnode = desc.vnodes_of(chunk.batch()).unwrap()[0];
        let owned = VnodeBitmap::from_vnodes(
            desc.vnode_count(),
            desc.vnode_count().vnodes().filter(|v| *v != vnode),
        )
        .unwrap();
        let filter = UpstreamFilter::for_progress(desc, &ProgressMap::new(owned)).unwrap();
        assert!(matches!(
            filter.mask(&chunk),
            Err(Error::VnodeNotOwned { .. })
        ));
    }

    #[test]
    fn global_bound_applies_to_every_vnode() {
        let desc = int_table(4, false);
        let chunk = int_chunk(&desc, &(0..20).map(Some).collect::<Vec<_>>());
        let pos = position_of(&desc, chunk.batch(), 9);
        let all = VnodeBitmap::full(desc.vnode_count());
        let filter = UpstreamFilter::global(desc.clone(), &all, Some(&pos), false).unwrap();
        assert_eq!(filter.filter(&chunk).unwrap().num_rows(), 10);
        let done = UpstreamFilter::global(desc.clone(), &all, Some(&pos), true).unwrap();
        assert_eq!(done.filter(&chunk).unwrap().num_rows(), 20);
        let none = UpstreamFilter::global(desc, &all, None, false).unwrap();
        assert_eq!(none.filter(&chunk).unwrap().num_rows(), 0);
    }

    /// Random progress over the vnodes: NotStarted, Completed, or InProgress at a random row.
    fn random_progress(
        desc: &TableDesc,
        batch: &RecordBatch,
        states: &[(u8, usize)],
    ) -> ProgressMap {
        let mut progress = ProgressMap::new(VnodeBitmap::full(desc.vnode_count()));
        let keys = desc.pk().encode(batch).unwrap();
        for (vnode, &(kind, row)) in desc.vnode_count().vnodes().zip(states) {
            match kind % 3 {
                0 => {}
                1 => progress.complete(vnode).unwrap(),
                _ if batch.num_rows() > 0 => progress
                    .advance(vnode, Position::from_keys(&keys, row % batch.num_rows()), 1)
                    .unwrap(),
                _ => {}
            }
        }
        progress
    }

    proptest! {
        #![proptest_config(Config {
            cases: 256,
            rng_seed: RngSeed::Fixed(0xf117e7),
            failure_persistence: None,
            ..Config::default()
        })]

        #[test]
        fn int_key_filter_matches_per_row_reference(
            keys in prop::collection::vec(prop::option::weighted(0.9, -50i64..50), 0..80),
            states in prop::collection::vec((0u8..3, 0usize..80), 4),
            descending in any::<bool>(),
        ) {
            let desc = int_table(4, descending);
            let chunk = int_chunk(&desc, &keys);
            let progress = random_progress(&desc, chunk.batch(), &states);
            let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
            let got: Vec<bool> = filter.mask(&chunk).unwrap().values().iter().collect();
            prop_assert_eq!(got, reference_mask(&desc, &progress, &chunk));
        }

        /// Without NULL keys: the native (branch-free) kernel decides every bounded chunk.
        #[test]
        fn int_key_native_filter_matches_per_row_reference(
            keys in prop::collection::vec(-50i64..50, 0..80),
            states in prop::collection::vec((0u8..3, 0usize..80), 4),
            descending in any::<bool>(),
        ) {
            let desc = int_table(4, descending);
            let keys: Vec<Option<i64>> = keys.into_iter().map(Some).collect();
            let chunk = int_chunk(&desc, &keys);
            let progress = random_progress(&desc, chunk.batch(), &states);
            let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
            let got: Vec<bool> = filter.mask(&chunk).unwrap().values().iter().collect();
            prop_assert_eq!(got, reference_mask(&desc, &progress, &chunk));
        }

        #[test]
        fn composite_key_filter_matches_per_row_reference(
            rows in prop::collection::vec(("[a-d]{0,3}", -5i32..5), 0..80),
            states in prop::collection::vec((0u8..3, 0usize..80), 8),
        ) {
            let desc = composite_table(8);
            let batch = RecordBatch::try_new(
                desc.schema().clone(),
                vec![
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0.as_str()))),
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
                    Arc::new(StringArray::from(vec!["v"; rows.len()])),
                ],
            )
            .unwrap();
            let chunk = StreamChunk::inserts(batch);
            let progress = random_progress(&desc, chunk.batch(), &states);
            let filter = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
            let got: Vec<bool> = filter.mask(&chunk).unwrap().values().iter().collect();
            prop_assert_eq!(got, reference_mask(&desc, &progress, &chunk));
        }
    }
}
