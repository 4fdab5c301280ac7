//! An epoch's upstream changes to the rows a merge input has not handed out yet.
//!
//! At a barrier the changes the filter dropped are the ones beyond their vnode's position:
//! they change rows the vnode's scan has still to hand out. Instead of a fresh scan at the new
//! epoch (reading the vnode's rows after its position from the store again), the input keeps
//! its scan and the rows it read ahead and merges the changes into them as it goes: the rows
//! after the position at the new epoch are the rows after it at the scan's epoch with the
//! changes of every epoch since applied, and each of those epochs' changes beyond the position
//! came as a patch (a change at or before the position never affects rows after it). A
//! barrier then costs the changes, not a re-read of a block per touched vnode.
//!
//! ```text
//!   scan:   [2 5 8] [11 14]            patch: 5 (new value), 9, 14 (tombstone), 20
//!   input:  [2 5' 8 9] [11] [20]       (rows of the patch up to a batch's last key go into
//!                                       that batch; what is left after the scan's end last)
//! ```
//!
//! A patch holds, per key, the newest change: an upsert (Insert or U+) or a tombstone
//! (Delete or U-), as a store applies an epoch's changes.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_select::interleave::{interleave, interleave_record_batch};

use crate::chunk::StreamChunk;
use crate::error::{Result, internal};
use crate::key::first_unordered;
use crate::store::KeyedBatch;
use crate::store::run::{build_sliced_runs, partition_point};
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// Changes to one vnode's rows: upserts and tombstones, keys strictly increasing.
#[derive(Debug, Clone)]
pub struct Patch {
    rows: KeyedBatch,
    /// `deleted[i]`: row `i` is a tombstone; `None` when none is.
    deleted: Option<BooleanBuffer>,
    /// The memory a row accounts for (rows may share buffers with other patches).
    row_bytes: usize,
}

impl Patch {
    /// A patch of `rows` (keys strictly increasing), `deleted` marking tombstones.
    pub fn new(rows: KeyedBatch, deleted: Option<BooleanBuffer>) -> Result<Self> {
        if rows.keys.len() != rows.num_rows() {
            return Err(internal!(
                "a patch of {} rows with {} keys",
                rows.num_rows(),
                rows.keys.len()
            ));
        }
        if let Some(deleted) = &deleted
            && deleted.len() != rows.num_rows()
        {
            return Err(internal!(
                "a patch of {} rows with {} tombstone flags",
                rows.num_rows(),
                deleted.len()
            ));
        }
        if let Some(row) = first_unordered(&rows.keys) {
            return Err(internal!("patch keys do not increase at row {row}"));
        }
        let bytes = rows.batch.get_array_memory_size() + rows.keys.get_array_memory_size();
        let row_bytes = bytes.div_ceil(rows.num_rows().max(1));
        Ok(Self {
            rows,
            deleted,
            row_bytes,
        })
    }

    /// The changes of `chunks` (in order: the newest change of a key wins) per vnode.
    pub(crate) fn by_vnode(
        desc: &TableDesc,
        chunks: &[StreamChunk],
    ) -> Result<Vec<(VirtualNode, Patch)>> {
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let all = StreamChunk::concat(desc.schema(), chunks)?;
        let vnodes = desc.vnodes_of(all.batch())?;
        // One copy of the rows, sorted by vnode and key; each vnode's patch is a slice.
        let (runs, row_bytes) = build_sliced_runs(desc, all.batch(), all.ops(), &vnodes)?;
        Ok(runs
            .into_iter()
            .map(|(vnode, run)| {
                let patch = Patch {
                    rows: run.data,
                    deleted: run.deleted,
                    row_bytes,
                };
                (vnode, patch)
            })
            .collect())
    }

    /// Rows (upserts and tombstones).
    pub fn len(&self) -> usize {
        self.rows.num_rows()
    }

    /// True when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory the patch accounts for.
    pub fn bytes(&self) -> usize {
        self.len() * self.row_bytes
    }

    fn key(&self, i: usize) -> &[u8] {
        self.rows.keys.value(i)
    }

    fn is_tombstone(&self, i: usize) -> bool {
        self.deleted.as_ref().is_some_and(|d| d.value(i))
    }

    /// Rows `from..`, zero-copy.
    fn tail(&self, from: usize) -> Self {
        let len = self.len() - from;
        Self {
            rows: self.rows.slice(from, len),
            deleted: self.deleted.as_ref().map(|d| d.slice(from, len)),
            row_bytes: self.row_bytes,
        }
    }

    /// This patch followed by `newer`: for a key in both, `newer`'s change wins. Tombstones
    /// are kept (they still hide rows the scan has to hand out).
    pub(crate) fn then(self, newer: Patch) -> Result<Patch> {
        if self.is_empty() {
            return Ok(newer);
        }
        if newer.is_empty() {
            return Ok(self);
        }
        let (mut i, mut j) = (0, 0);
        let mut indices = Vec::with_capacity(self.len() + newer.len());
        while i < self.len() || j < newer.len() {
            let take_old = j == newer.len() || (i < self.len() && self.key(i) < newer.key(j));
            if take_old {
                indices.push((0, i));
                i += 1;
            } else {
                if i < self.len() && self.key(i) == newer.key(j) {
                    i += 1;
                }
                indices.push((1, j));
                j += 1;
            }
        }
        let any_deleted = self.deleted.is_some() || newer.deleted.is_some();
        let deleted = any_deleted.then(|| {
            let mut mask = BooleanBufferBuilder::new(indices.len());
            for &(source, row) in &indices {
                let from = if source == 0 { &self } else { &newer };
                mask.append(from.is_tombstone(row));
            }
            mask.finish()
        });
        let rows = gather(&[&self.rows, &newer.rows], &indices)?;
        Ok(Patch {
            rows,
            deleted,
            row_bytes: self.row_bytes.max(newer.row_bytes),
        })
    }

    /// `batch` (the input's next rows, keys strictly increasing) with the changes up to its
    /// last key applied, or, at the end of the scan (`None`), every change left that is not a
    /// tombstone. Returns the rows and what is left of the patch (`None` once used up).
    pub(crate) fn apply(
        self,
        batch: Option<KeyedBatch>,
    ) -> Result<(Option<KeyedBatch>, Option<Patch>)> {
        let Some(batch) = batch else {
            let live: Vec<(usize, usize)> = (0..self.len())
                .filter(|&j| !self.is_tombstone(j))
                .map(|j| (0, j))
                .collect();
            if live.is_empty() {
                return Ok((None, None));
            }
            return Ok((Some(gather(&[&self.rows], &live)?), None));
        };
        let Some(last) = batch.keys.len().checked_sub(1).map(|i| batch.keys.value(i)) else {
            return Ok((Some(batch), Some(self)));
        };
        // The changes that fall within the batch (or before it: none, the patch starts after
        // the position and the batch follows it).
        let upto = partition_point(self.len(), |j| self.key(j) <= last);
        if upto == 0 {
            return Ok((Some(batch), Some(self)));
        }
        let (mut i, mut j) = (0, 0);
        let mut indices = Vec::with_capacity(batch.num_rows() + upto);
        while i < batch.num_rows() || j < upto {
            let from_batch =
                j == upto || (i < batch.num_rows() && batch.keys.value(i) < self.key(j));
            if from_batch {
                indices.push((0, i));
                i += 1;
                continue;
            }
            if i < batch.num_rows() && batch.keys.value(i) == self.key(j) {
                // The change replaces (or deletes) the scanned row.
                i += 1;
            }
            if !self.is_tombstone(j) {
                indices.push((1, j));
            }
            j += 1;
        }
        let merged = gather(&[&batch, &self.rows], &indices)?;
        let rest = (upto < self.len()).then(|| self.tail(upto));
        Ok((Some(merged), rest))
    }
}

/// The rows `(source, row)` of `sources` (one schema), with their keys.
fn gather(sources: &[&KeyedBatch], indices: &[(usize, usize)]) -> Result<KeyedBatch> {
    let batches: Vec<_> = sources.iter().map(|s| &s.batch).collect();
    let batch = interleave_record_batch(&batches, indices)?;
    let keys: Vec<&dyn Array> = sources.iter().map(|s| &s.keys as &dyn Array).collect();
    let keys = interleave(&keys, indices)?.as_binary::<i32>().clone();
    Ok(KeyedBatch { batch, keys })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, UInt64Type};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::merge::testing::{int_key, int_rows_with_ids};

    /// Key to value (`None`: a tombstone), as a BTreeMap: the oracle.
    type Rows = BTreeMap<i64, Option<u64>>;

    fn rows_of(batch: &KeyedBatch, deleted: Option<&BooleanBuffer>) -> Rows {
        let keys = batch.batch.column(0).as_primitive::<Int64Type>();
        let ids = batch.batch.column(1).as_primitive::<UInt64Type>();
        (0..batch.num_rows())
            .map(|i| {
                let dead = deleted.is_some_and(|d| d.value(i));
                (keys.value(i), (!dead).then(|| ids.value(i)))
            })
            .collect()
    }

    /// Random changes to keys `0..domain`: a row of value `first_id + i` or a tombstone.
    fn random_patch(rng: &mut StdRng, domain: i64, first_id: u64) -> (Patch, Rows) {
        let keys: Vec<i64> = (0..domain).filter(|_| rng.random_bool(0.3)).collect();
        let dead: Vec<bool> = keys.iter().map(|_| rng.random_bool(0.3)).collect();
        let rows = int_rows_with_ids(&int_key(false), &keys, first_id);
        let deleted = BooleanBuffer::from(dead);
        let oracle = rows_of(&rows, Some(&deleted));
        (Patch::new(rows, Some(deleted)).unwrap(), oracle)
    }

    #[test]
    fn a_later_patch_wins_and_tombstones_are_kept() {
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (older, mut expected) = random_patch(&mut rng, 40, 0);
            let (newer, news) = random_patch(&mut rng, 40, 1000);
            expected.extend(news);
            let both = older.then(newer).unwrap();
            assert_eq!(
                rows_of(&both.rows, both.deleted.as_ref()),
                expected,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn scanned_batches_come_out_with_the_changes_applied() {
        let pk = int_key(false);
        for seed in 0..300 {
            let mut rng = StdRng::seed_from_u64(seed);
            let domain = 60;
            let scanned: Vec<i64> = (0..domain).filter(|_| rng.random_bool(0.5)).collect();
            let mut expected: BTreeMap<i64, u64> = scanned.iter().map(|&k| (k, 0)).collect();
            let mut patch = None;
            for id in [100, 200, 300] {
                if rng.random_bool(0.7) {
                    let (next, changes) = random_patch(&mut rng, domain, id);
                    for (key, value) in changes {
                        match value {
                            Some(v) => expected.insert(key, v),
                            None => expected.remove(&key),
                        };
                    }
                    patch = Some(match patch {
                        Some(p) => Patch::then(p, next).unwrap(),
                        None => next,
                    });
                }
            }
            // The scan in random batches (ids 0), then its end.
            let mut got = BTreeMap::new();
            let mut last = None;
            let mut rest = scanned.as_slice();
            loop {
                let batch = (!rest.is_empty()).then(|| {
                    let n = rng.random_range(1..=rest.len().min(9));
                    let ids = int_rows_with_ids(&pk, &rest[..n], 0);
                    rest = &rest[n..];
                    let zero = arrow_array::UInt64Array::from(vec![0; n]);
                    let batch = arrow_array::RecordBatch::try_new(
                        ids.batch.schema(),
                        vec![ids.batch.column(0).clone(), std::sync::Arc::new(zero)],
                    )
                    .unwrap();
                    KeyedBatch {
                        batch,
                        keys: ids.keys,
                    }
                });
                let end = batch.is_none();
                let out = match patch.take() {
                    Some(p) => {
                        let (out, left) = p.apply(batch).unwrap();
                        patch = left;
                        out
                    }
                    None => batch,
                };
                if let Some(out) = out {
                    assert_eq!(first_unordered(&out.keys), None, "seed {seed}");
                    for (key, value) in rows_of(&out, None) {
                        assert!(last < Some(key), "seed {seed}: {key} out of order");
                        last = Some(key);
                        got.insert(key, value.unwrap());
                    }
                }
                if end {
                    break;
                }
            }
            assert!(patch.is_none(), "seed {seed}: changes left");
            assert_eq!(got, expected, "seed {seed}");
        }
    }

    #[test]
    fn a_patch_checks_its_shape() {
        let pk = int_key(false);
        let unordered = int_rows_with_ids(&pk, &[3, 1], 0);
        assert!(Patch::new(unordered, None).is_err());
        let rows = int_rows_with_ids(&pk, &[1, 2], 0);
        let short = BooleanBuffer::from(vec![false]);
        assert!(Patch::new(rows.clone(), Some(short)).is_err());
        let patch = Patch::new(rows, None).unwrap();
        assert_eq!(patch.len(), 2);
        assert!(patch.bytes() > 0);
    }
}
