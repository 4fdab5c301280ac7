//! One merge input: a vnode's scan, with empty batches skipped and key order checked.
//!
//! ```text
//!   scan.next_batch()         MergeInput::next_batch()
//!   [1 2] [] [5 9] None  -->  Some([1 2]), Some([5 9]), None (and the scan is dropped)
//!   [1 2] [2 3]          -->  Some([1 2]), Err(OrderViolation { row: 0 })
//! ```
//!
//! The order check is the cheap runtime check of DESIGN section 5: every batch's encoded keys
//! must strictly increase, and its first key must be above the last key of the batch before
//! it. It costs one `memcmp` per row, done once when the batch arrives. A disagreement
//! between storage order and comparator order would otherwise silently corrupt positions.

use arrow_array::Array;
use arrow_schema::SchemaRef;

use crate::error::{Error, Result, internal};
use crate::key::{Position, first_unordered};
use crate::merge::patch::{Patch, Patches};
use crate::store::{KeyedBatch, SnapshotScan};
use crate::vnode::VirtualNode;

/// A vnode's scan and what the mergers need to know about it.
#[derive(Debug)]
pub(crate) struct MergeInput<S> {
    vnode: VirtualNode,
    /// `None` once the scan returned `None`.
    scan: Option<S>,
    /// The scan a restart replaced, kept until the new one has read: what it holds loaded
    /// (a block the new scan starts in, say) stays where a store's cache can find it.
    retired: Option<S>,
    /// Rows handed out but not consumed when a patch came, handed out again first.
    unread: Option<KeyedBatch>,
    /// Changes not yet merged into the rows handed out (see `patch.rs`).
    patches: Patches,
    /// The last key handed out (reused buffer); meaningful when `seen_rows`.
    last_key: Vec<u8>,
    seen_rows: bool,
}

impl<S: SnapshotScan> MergeInput<S> {
    pub fn new(vnode: VirtualNode, scan: S) -> Self {
        Self {
            vnode,
            scan: Some(scan),
            retired: None,
            unread: None,
            patches: Patches::default(),
            last_key: Vec::new(),
            seen_rows: false,
        }
    }

    pub fn vnode(&self) -> VirtualNode {
        self.vnode
    }

    /// Replaces the scan with `scan`, which yields the vnode's rows strictly after `after`
    /// (the key of its last row handed out and emitted; `None` when none was). The order
    /// check continues from `after`: rows read ahead of it and not emitted may come again.
    pub fn restart(&mut self, scan: S, after: Option<&Position>) {
        self.retired = self.scan.replace(scan);
        self.unread = None;
        self.patches = Patches::default();
        self.continue_after(after);
    }

    /// Keeps the scan and merges `patch` (changes to the vnode's rows strictly after
    /// `after`, its position) into the rows it hands out from now on, starting with
    /// `unread`: the rows it handed out that were not consumed, in order, all after `after`.
    pub fn patch(
        &mut self,
        unread: Option<KeyedBatch>,
        patch: Patch,
        after: Option<&Position>,
    ) -> Result<()> {
        if let Some(unread) = unread.filter(|b| !b.is_empty()) {
            if self.unread.is_some() {
                return Err(internal!(
                    "vnode {} gave back rows twice without reading",
                    self.vnode
                ));
            }
            self.unread = Some(unread);
        }
        self.patches.push(patch)?;
        self.continue_after(after);
        Ok(())
    }

    /// The order check continues from `after`: rows read ahead of it and not emitted may
    /// come again.
    fn continue_after(&mut self, after: Option<&Position>) {
        self.last_key.clear();
        if let Some(after) = after {
            self.last_key.extend_from_slice(after.as_bytes());
        }
        self.seen_rows = after.is_some();
    }

    /// True once the scan returned `None` and nothing is left to hand out.
    #[cfg(test)]
    pub fn is_exhausted(&self) -> bool {
        self.scan.is_none() && self.unread.is_none() && self.patches.is_empty()
    }

    /// The next non-empty batch, checked, or `None` when the scan is exhausted (then, and on
    /// every later call). Records the schema of any batch seen, empty ones included, in
    /// `schema` if that is still unset.
    pub fn next_batch(
        &mut self,
        table: &str,
        schema: &mut Option<SchemaRef>,
    ) -> Result<Option<KeyedBatch>> {
        self.next_batch_with(table, schema, |batch| first_unordered(&batch.keys))
    }

    /// Like [`MergeInput::next_batch`], with `unordered` finding the first row of a batch
    /// whose key does not strictly increase (`key::first_unordered` on the encoded keys, or
    /// an equivalent check on native key values that is cheaper than a `memcmp` per row).
    /// The order across batches is always checked on the encoded keys.
    pub fn next_batch_with(
        &mut self,
        table: &str,
        schema: &mut Option<SchemaRef>,
        unordered: impl Fn(&KeyedBatch) -> Option<usize>,
    ) -> Result<Option<KeyedBatch>> {
        loop {
            let next = match self.unread.take() {
                Some(unread) => Some(unread),
                None => self.scan_next()?,
            };
            let next = self.patches.apply(next)?;
            let Some(batch) = next else {
                return Ok(None);
            };
            if schema.is_none() {
                *schema = Some(batch.batch.schema());
            }
            if batch.keys.len() != batch.num_rows() {
                return Err(internal!(
                    "snapshot batch of vnode {} has {} rows but {} keys",
                    self.vnode,
                    batch.num_rows(),
                    batch.keys.len()
                ));
            }
            if batch.is_empty() {
                continue;
            }
            self.check_order(table, &batch, unordered(&batch))?;
            return Ok(Some(batch));
        }
    }

    /// The scan's next batch; `None` once it is exhausted (and dropped).
    fn scan_next(&mut self) -> Result<Option<KeyedBatch>> {
        let Some(scan) = self.scan.as_mut() else {
            return Ok(None);
        };
        let next = scan.next_batch()?;
        self.retired = None;
        if next.is_none() {
            self.scan = None;
        }
        Ok(next)
    }

    /// Checks `batch` follows the batch before it; `unordered` is its first row out of order.
    fn check_order(
        &mut self,
        table: &str,
        batch: &KeyedBatch,
        unordered: Option<usize>,
    ) -> Result<()> {
        let keys = &batch.keys;
        let violation = |row| Error::OrderViolation {
            table: table.to_owned(),
            vnode: self.vnode.get(),
            row,
        };
        if self.seen_rows && keys.value(0) <= self.last_key.as_slice() {
            return Err(violation(0));
        }
        if let Some(row) = unordered {
            return Err(violation(row));
        }
        self.last_key.clear();
        self.last_key
            .extend_from_slice(keys.value(keys.len().saturating_sub(1)));
        self.seen_rows = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::testing::{VecScan, int_key, int_rows};

    fn drain(input: &mut MergeInput<VecScan>) -> Result<Vec<usize>> {
        let mut schema = None;
        let mut sizes = Vec::new();
        while let Some(b) = input.next_batch("t", &mut schema)? {
            sizes.push(b.num_rows());
        }
        Ok(sizes)
    }

    #[test]
    fn empty_batches_are_skipped_and_the_end_is_sticky() {
        let pk = int_key(false);
        let scan = VecScan::new(vec![
            int_rows(&pk, &[1, 2]),
            int_rows(&pk, &[]),
            int_rows(&pk, &[5]),
        ]);
        let mut input = MergeInput::new(VirtualNode::new(4), scan);
        assert_eq!(drain(&mut input).unwrap(), vec![2, 1]);
        assert!(input.is_exhausted());
        assert_eq!(drain(&mut input).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn keys_going_backwards_or_repeating_are_order_violations() {
        let pk = int_key(false);
        let cases: [(&[&[i64]], usize); 3] = [
            (&[&[1, 3], &[2]], 0),
            (&[&[1, 3], &[3, 4]], 0),
            (&[&[1], &[2, 5, 4]], 2),
        ];
        for (batches, row) in cases {
            let scan = VecScan::new(batches.iter().map(|k| int_rows(&pk, k)).collect());
            let mut input = MergeInput::new(VirtualNode::new(9), scan);
            match drain(&mut input) {
                Err(Error::OrderViolation {
                    vnode: 9, row: r, ..
                }) => assert_eq!(r, row),
                other => panic!("{batches:?}: {other:?}"),
            }
        }
    }
}
