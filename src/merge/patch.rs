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
//!   input:  [2] [5'] [8] [9] [11] [20] (rows of the patch up to a batch's last key go into
//!                                       that batch; what is left after the scan's end last;
//!                                       each piece a range of the rows it is in: no copy)
//! ```
//!
//! A patch holds, per key, the newest change: an upsert (Insert or U+) or a tombstone
//! (Delete or U-), as a store applies an epoch's changes.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_select::interleave::interleave;

use crate::chunk::{Op, StreamChunk};
use crate::error::{Result, internal};
use crate::interleave::interleave_batches;
use crate::runs::{KeyedBatch, gc_views};
use crate::runs::{Rows, Run, Views, build_sliced_runs, newest_tier, partition_point};
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// Changes to one vnode's rows: upserts and tombstones, keys strictly increasing.
#[derive(Debug, Clone)]
pub struct Patch {
    /// The changes, tombstones flagged: a range of rows shared with the other vnodes'
    /// patches of a barrier (no arrays of its own), their memory counted in the barrier's
    /// ledger while any range of them is held (a patch's, or rows a patch gave a scan).
    rows: Run,
}

/// The memory of patches, counted once per buffer while any patch, or any rows a patch
/// gave a scan, holds a range of it.
pub type PatchLedger = Arc<AtomicUsize>;

impl Patch {
    /// A patch of `rows` (keys strictly increasing), `deleted` marking tombstones.
    pub fn new(rows: KeyedBatch, deleted: Option<BooleanBuffer>) -> Result<Self> {
        // A key and a tombstone flag per row, checked by the run.
        let rows = Run::new(rows, deleted)?;
        if let Some(row) = rows.first_unordered() {
            return Err(internal!("patch keys do not increase at row {row}"));
        }
        Ok(Self { rows })
    }

    /// The changes of `chunks` (in order: the newest change of a key wins) per vnode, for
    /// the vnodes `wanted` keeps, their memory counted in `ledger` (once: the patches are
    /// slices of one batch) until the last of them, or what is merged from them, is dropped.
    pub(crate) fn by_vnode(
        desc: &TableDesc,
        chunks: &[StreamChunk],
        ledger: &PatchLedger,
        wanted: impl Fn(VirtualNode) -> bool,
    ) -> Result<Vec<(VirtualNode, Patch)>> {
        let mut batches: Vec<RecordBatch> = Vec::with_capacity(chunks.len());
        let mut ops: Vec<Op> = Vec::new();
        let mut vnodes: Vec<VirtualNode> = Vec::new();
        for chunk in chunks {
            let of_rows = desc.vnodes_of(chunk.batch())?;
            let keep: Vec<bool> = of_rows.iter().map(|v| wanted(*v)).collect();
            if keep.iter().all(|k| *k) {
                batches.push(chunk.batch().clone());
                ops.extend_from_slice(chunk.ops());
                vnodes.extend(of_rows);
            } else if keep.iter().any(|k| *k) {
                // Only the wanted rows are copied into the patches.
                let mask = arrow_array::BooleanArray::from(keep.clone());
                batches.push(arrow_select::filter::filter_record_batch(
                    chunk.batch(),
                    &mask,
                )?);
                let zipped = chunk.ops().iter().zip(of_rows).zip(&keep);
                for ((op, vnode), _) in zipped.filter(|(_, keep)| **keep) {
                    ops.push(*op);
                    vnodes.push(vnode);
                }
            }
        }
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let batches: Vec<&RecordBatch> = batches.iter().collect();
        // One copy of the rows, sorted by vnode and key; each vnode's patch is a range.
        let (runs, _) =
            build_sliced_runs(desc, &batches, &ops, &vnodes, Some(ledger), Views::Compact)?;
        Ok(runs
            .into_iter()
            .map(|(vnode, rows)| (vnode, Patch { rows }))
            .collect())
    }

    /// Rows (upserts and tombstones).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn key(&self, i: usize) -> &[u8] {
        self.rows.key(i)
    }

    /// Rows `from..`, zero-copy.
    fn tail(&self, from: usize) -> Self {
        Self {
            rows: self.rows.slice(from, self.len() - from),
        }
    }

    /// The patches (oldest first) as one, the newest change of a key winning. Tombstones are
    /// kept (they still hide rows the scan has to hand out).
    fn merged(patches: &[&Patch]) -> Result<Patch> {
        match patches {
            [] => Err(internal!("a merge of no patches")),
            [one] => Ok((*one).clone()),
            _ => {
                let sources: Vec<Sorted<'_>> = patches.iter().map(|p| p.sorted(p.len())).collect();
                let picks = merge_sorted(&sources);
                let any_deleted = (sources.iter()).any(|s| s.deleted.is_some());
                let deleted = any_deleted.then(|| {
                    let mut mask = BooleanBufferBuilder::new(picks.len());
                    for &(_, _, dead) in &picks {
                        mask.append(dead);
                    }
                    mask.finish()
                });
                let indices: Vec<(usize, usize)> = picks.iter().map(|&(s, r, _)| (s, r)).collect();
                let batches: Vec<&KeyedBatch> = sources.iter().map(|s| s.rows).collect();
                let mut rows = gather(&batches, &indices)?;
                // A copy of its own, counted where the patches merged were: its string views
                // get their own bytes too (gathered views point into every source's buffers,
                // which would stay alive, uncounted).
                rows.batch = gc_views(rows.batch)?;
                let counter = patches[0].rows.rows().0.counter();
                let rows = Rows::counted(rows, deleted, counter)?;
                Ok(Patch {
                    rows: Run::whole(rows),
                })
            }
        }
    }

    /// Rows `..end` as a merge source: the shared rows, from where the patch starts in
    /// them.
    fn sorted(&self, end: usize) -> Sorted<'_> {
        let (shared, start) = self.rows.rows();
        Sorted {
            shared,
            rows: &shared.data,
            deleted: shared.deleted.as_ref(),
            start,
            end: start + end,
        }
    }

    /// How many rows have a key at most `last`.
    fn upto(&self, last: &[u8]) -> usize {
        partition_point(self.len(), |j| self.key(j) <= last)
    }
}

/// The patches an input holds, oldest first: a stack kept short by merging its newest
/// patches by size tiers ([`newest_tier`]), so a change is rewritten a few times however
/// many barriers come, and a scanned batch meets a few patches.
#[derive(Debug, Default)]
pub(crate) struct Patches {
    stack: Vec<Patch>,
}

/// Patches an input holds before the newest are merged.
const MAX_PATCHES: usize = 8;

impl Patches {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }

    /// Adds the newest patch.
    pub fn push(&mut self, patch: Patch) -> Result<()> {
        if patch.is_empty() {
            return Ok(());
        }
        self.stack.push(patch);
        if self.stack.len() >= MAX_PATCHES {
            let sizes: Vec<u64> = self.stack.iter().map(|p| p.len() as u64).collect();
            let newest = self.stack.split_off(newest_tier(&sizes));
            let refs: Vec<&Patch> = newest.iter().collect();
            self.stack.push(Patch::merged(&refs)?);
        }
        Ok(())
    }

    /// `rows` (the input's next rows, keys strictly increasing) with the changes up to their
    /// last key applied, or, at the end of the scan (`None`), every change left that is not a
    /// tombstone. The changes used are dropped.
    ///
    /// The result is ranges of the rows they already are in, in key order, not a copy: the
    /// stretches of `rows` between changed keys and the stretches of upserts of the patches
    /// (tombstones cut them). A vnode with a few changes in a long batch costs a few ranges,
    /// and many vnodes patched at a barrier stay ranges of a few shared batches (their blocks
    /// and the barrier's changes), which is what a merge of them gathers from.
    pub fn apply(&mut self, rows: Option<Run>) -> Result<Vec<Run>> {
        if self.stack.is_empty() {
            return Ok(rows.into_iter().collect());
        }
        let upto: Vec<usize> = match &rows {
            Some(run) => match run.last_key() {
                None => return Ok(rows.into_iter().collect()),
                Some(last) => self.stack.iter().map(|p| p.upto(last)).collect(),
            },
            None => self.stack.iter().map(Patch::len).collect(),
        };
        if upto.iter().all(|&n| n == 0) {
            return Ok(rows.into_iter().collect());
        }
        // The scanned rows are the oldest source and hold no tombstone.
        let mut sources: Vec<Sorted<'_>> = Vec::with_capacity(1 + self.stack.len());
        if let Some(run) = &rows {
            let (shared, start) = run.rows();
            sources.push(Sorted {
                shared,
                rows: &shared.data,
                deleted: None,
                start,
                end: start + run.len(),
            });
        }
        for (patch, &end) in self.stack.iter().zip(&upto) {
            sources.push(patch.sorted(end));
        }
        let pieces = ranges(&sources, &merge_sorted(&sources))?;
        // What is left of each patch: the rows after the batch.
        let stack = std::mem::take(&mut self.stack);
        self.stack = stack
            .into_iter()
            .zip(upto)
            .filter(|(patch, used)| *used < patch.len())
            .map(|(patch, used)| patch.tail(used))
            .collect();
        Ok(pieces)
    }
}

/// The live picks of a merge (tombstones dropped) as ranges of their sources' shared rows:
/// successive picks of successive rows of one source are one range.
fn ranges(sources: &[Sorted<'_>], picks: &[(usize, usize, bool)]) -> Result<Vec<Run>> {
    let mut pieces = Vec::new();
    // The range being extended: (source, first row, rows).
    let mut open: Option<(usize, usize, usize)> = None;
    let mut close = |open: &mut Option<(usize, usize, usize)>| -> Result<()> {
        if let Some((source, first, len)) = open.take() {
            pieces.push(Run::range(sources[source].shared, first, len)?);
        }
        Ok(())
    };
    for &(source, row, dead) in picks {
        match &mut open {
            _ if dead => close(&mut open)?,
            Some((s, first, len)) if *s == source && *first + *len == row => *len += 1,
            _ => {
                close(&mut open)?;
                open = Some((source, row, 1));
            }
        }
    }
    close(&mut open)?;
    Ok(pieces)
}

/// Rows `start..end` of a sorted source of a merge, with its tombstones.
struct Sorted<'a> {
    /// The shared rows (`rows` and `deleted` are theirs).
    shared: &'a Arc<Rows>,
    rows: &'a KeyedBatch,
    deleted: Option<&'a BooleanBuffer>,
    start: usize,
    end: usize,
}

/// The rows of sorted sources (oldest first, keys strictly increasing in each) in key order,
/// one per key: the newest source's. Each pick is `(source, row, is a tombstone)`.
fn merge_sorted(sources: &[Sorted<'_>]) -> Vec<(usize, usize, bool)> {
    let mut heads: Vec<usize> = sources.iter().map(|s| s.start).collect();
    let mut picks = Vec::with_capacity(sources.iter().map(|s| s.end - s.start).sum());
    loop {
        // The smallest head key; among equal keys the newest source wins.
        let mut best: Option<(usize, &[u8])> = None;
        for (s, source) in sources.iter().enumerate() {
            if heads[s] < source.end {
                let key = source.rows.keys.value(heads[s]);
                if best.is_none_or(|(_, b)| key <= b) {
                    best = Some((s, key));
                }
            }
        }
        let Some((winner, key)) = best else {
            return picks;
        };
        let row = heads[winner];
        let dead = sources[winner].deleted.is_some_and(|d| d.value(row));
        picks.push((winner, row, dead));
        for (s, source) in sources.iter().enumerate() {
            if heads[s] < source.end && source.rows.keys.value(heads[s]) == key {
                heads[s] += 1;
            }
        }
    }
}

/// The rows `(source, row)` of `sources` (one schema), with their keys.
fn gather(sources: &[&KeyedBatch], indices: &[(usize, usize)]) -> Result<KeyedBatch> {
    let batches: Vec<_> = sources.iter().map(|s| &s.batch).collect();
    let batch = interleave_batches(&batches, indices)?;
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
    use crate::key::first_unordered;
    use crate::merge::testing::{int_key, int_rows_with_ids};
    use crate::runs::Rows as SharedRows;

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
            let both = Patch::merged(&[&older, &newer]).unwrap();
            assert_eq!(
                rows_of(&both.rows.data(), both.rows.deleted().as_ref()),
                expected,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn unchanged_stretches_and_upserts_stay_ranges_of_the_rows_they_are_in() {
        let pk = int_key(false);
        let block = SharedRows::new(int_rows_with_ids(&pk, &[0, 2, 4, 6, 8, 10], 0), None).unwrap();
        // The scan's rows are a range of a block: keys 2..=10.
        let scanned = Run::range(&block, 1, 5).unwrap();
        // 4 changes, 5 is new, 8 is deleted.
        let rows = int_rows_with_ids(&pk, &[4, 5, 8], 100);
        let deleted = BooleanBuffer::from(vec![false, false, true]);
        let mut patches = Patches::default();
        patches
            .push(Patch::new(rows, Some(deleted)).unwrap())
            .unwrap();
        let pieces = patches.apply(Some(scanned.clone())).unwrap();
        let got: Vec<Vec<u64>> = (pieces.iter())
            .map(|p| rows_of(&p.data(), None).into_values().flatten().collect())
            .collect();
        assert_eq!(got, vec![vec![1], vec![100, 101], vec![3], vec![5]]);
        assert_eq!(
            pieces
                .iter()
                .map(|p| p.same_rows(&scanned))
                .collect::<Vec<_>>(),
            [true, false, true, true],
            "no copy: the scan's stretches are ranges of its block"
        );
        assert!(patches.is_empty());
    }

    #[test]
    fn scanned_batches_come_out_with_the_changes_applied() {
        let pk = int_key(false);
        for seed in 0..300 {
            let mut rng = StdRng::seed_from_u64(seed);
            let domain = 60;
            let scanned: Vec<i64> = (0..domain).filter(|_| rng.random_bool(0.5)).collect();
            let mut expected: BTreeMap<i64, u64> = scanned.iter().map(|&k| (k, 0)).collect();
            // More patches than the stack holds, so that it merges tiers too.
            let mut patches = Patches::default();
            for id in (1..=12).map(|i| i * 100) {
                if rng.random_bool(0.7) {
                    let (next, changes) = random_patch(&mut rng, domain, id);
                    for (key, value) in changes {
                        match value {
                            Some(v) => expected.insert(key, v),
                            None => expected.remove(&key),
                        };
                    }
                    patches.push(next).unwrap();
                    assert!(patches.stack.len() < MAX_PATCHES);
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
                    let rows = KeyedBatch {
                        batch,
                        keys: ids.keys,
                    };
                    // A range at an offset in shared rows, as a scan of a packed block hands
                    // it out.
                    let shared = KeyedBatch::concat(&[rows.clone(), rows]).unwrap();
                    Run::range(&SharedRows::new(shared, None).unwrap(), n, n).unwrap()
                });
                let end = batch.is_none();
                let out = patches.apply(batch).unwrap();
                for out in out.iter().map(|run| run.data_of(0, run.len())) {
                    assert!(!out.is_empty(), "seed {seed}: an empty range");
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
            assert!(patches.is_empty(), "seed {seed}: changes left");
            assert_eq!(got, expected, "seed {seed}");
        }
    }

    /// A table `t` of the test rows of `pk` (key `k`) over `vnodes` vnodes.
    fn int_table(pk: &crate::key::PrimaryKey, vnodes: usize) -> TableDesc {
        TableDesc::new(
            "t",
            int_rows_with_ids(pk, &[], 0).batch.schema(),
            vec![crate::key::KeyColumn::asc("k")],
        )
        .unwrap()
        .with_vnode_count(crate::vnode::VnodeCount::new(vnodes).unwrap())
    }

    /// A barrier's changes are counted once however many patches hold ranges of them,
    /// until the last patch, and the last rows a patch gave a scan, are dropped; a merge
    /// counts its own copy.
    #[test]
    fn the_ledger_counts_each_buffer_once_while_held() {
        use std::sync::atomic::Ordering;
        let pk = int_key(false);
        let desc = int_table(&pk, 1);
        let ledger = PatchLedger::default();
        let held = || ledger.load(Ordering::Relaxed);
        let chunk = |keys: &[i64], id| StreamChunk::inserts(int_rows_with_ids(&pk, keys, id).batch);
        let mut older =
            Patch::by_vnode(&desc, &[chunk(&[2, 4, 6], 100)], &ledger, |_| true).unwrap();
        let one = held();
        assert!(one > 0);
        let mut newer = Patch::by_vnode(&desc, &[chunk(&[5, 7], 200)], &ledger, |_| true).unwrap();
        let two = held();
        assert!(two > one);
        let (older, newer) = (older.remove(0).1, newer.remove(0).1);
        // Held by a tail, then by the rows a scan was given: still counted.
        let tail = older.tail(1);
        drop(older);
        assert_eq!(held(), two, "a range still holds it");
        let mut patches = Patches::default();
        patches.push(tail).unwrap();
        let scanned = Run::new(int_rows_with_ids(&pk, &[1, 3], 0), None).unwrap();
        let given = patches.apply(Some(scanned)).unwrap();
        assert_eq!(held(), two);
        let rest = patches.apply(None).unwrap();
        assert!(patches.is_empty());
        drop(given);
        assert_eq!(held(), two, "the patch's last rows are in the scan's hands");
        drop(rest);
        assert_eq!(held(), two - one, "the older barrier's changes are freed");
        // A merge counts its copy where its sources were counted.
        let merged = Patch::merged(&[&newer.tail(0), &newer]).unwrap();
        assert!(held() > two - one);
        drop((newer, merged));
        assert_eq!(held(), 0);
    }

    /// Patches for some vnodes only: each is the one all vnodes' patches give it, and the
    /// others' rows are not copied (not counted in the ledger).
    #[test]
    fn patches_of_the_wanted_vnodes_only() {
        use std::sync::atomic::Ordering;
        let pk = int_key(false);
        let desc = int_table(&pk, 8);
        let keys: Vec<i64> = (0..200).collect();
        let chunks = [
            StreamChunk::inserts(int_rows_with_ids(&pk, &keys[..120], 0).batch),
            StreamChunk::inserts(int_rows_with_ids(&pk, &keys[120..], 120).batch),
        ];
        let keys_of = |patch: &Patch| -> Vec<Vec<u8>> {
            (0..patch.len()).map(|i| patch.key(i).to_vec()).collect()
        };
        let all_ledger = PatchLedger::default();
        let all = Patch::by_vnode(&desc, &chunks, &all_ledger, |_| true).unwrap();
        assert_eq!(all.len(), 8);
        let even = |v: VirtualNode| v.index().is_multiple_of(2);
        let some_ledger = PatchLedger::default();
        let some = Patch::by_vnode(&desc, &chunks, &some_ledger, even).unwrap();
        let expected: Vec<(VirtualNode, Vec<Vec<u8>>)> = (all.iter())
            .filter(|(v, _)| even(*v))
            .map(|(v, p)| (*v, keys_of(p)))
            .collect();
        let got: Vec<(VirtualNode, Vec<Vec<u8>>)> =
            some.iter().map(|(v, p)| (*v, keys_of(p))).collect();
        assert_eq!(got, expected);
        let (all_bytes, some_bytes) = (
            all_ledger.load(Ordering::Relaxed),
            some_ledger.load(Ordering::Relaxed),
        );
        assert!(some_bytes < all_bytes, "{some_bytes} of {all_bytes} bytes");
        // None wanted: nothing copied.
        let none_ledger = PatchLedger::default();
        assert!(
            Patch::by_vnode(&desc, &chunks, &none_ledger, |_| false)
                .unwrap()
                .is_empty()
        );
        assert_eq!(none_ledger.load(Ordering::Relaxed), 0);
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
    }
}
