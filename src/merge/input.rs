//! One merge input: a vnode's scan, with empty batches skipped and key order checked.
//!
//! ```text
//!   scan.next_rows()          MergeInput::next_run()
//!   [1 2] [] [5 9] None  -->  Some([1 2]), Some([5 9]), None (and the scan is dropped)
//!   [1 2] [2 3]          -->  Some([1 2]), Err(OrderViolation { row: 0 })
//! ```
//!
//! The order check is the cheap runtime check of docs/DESIGN.md section 5: every batch's
//! encoded keys must strictly increase, and its first key must be above the last key of the
//! batch before it. It costs one `memcmp` per row, done once when the batch arrives. A disagreement
//! between storage order and comparator order would otherwise silently corrupt positions.

use std::collections::VecDeque;

use arrow_schema::SchemaRef;

use crate::error::{Error, Result};
use crate::key::Position;
use crate::merge::patch::{Patch, Patches};
use crate::runs::Run;
use crate::store::SnapshotScan;
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
    /// Rows to hand out before the scan's next, with every patch applied: the ranges a
    /// patched batch became (see [`Patches::apply`]).
    ready: VecDeque<Run>,
    /// Rows to hand out before those of the scan, still to be patched: rows handed out but
    /// not consumed when a patch came, and the ready ones then.
    unread: VecDeque<Run>,
    /// Changes not yet merged into the rows handed out (see `patch.rs`).
    patches: Patches,
    /// The last key handed out (reused buffer); meaningful when `seen_rows`.
    last_key: Vec<u8>,
    seen_rows: bool,
}

impl<S: SnapshotScan> MergeInput<S> {
    pub fn new(vnode: VirtualNode, scan: S) -> Self {
        Self {
            scan: Some(scan),
            ..Self::unopened(vnode)
        }
    }

    /// An input whose scan is not open yet: [`MergeInput::restart`] gives it one. Until
    /// then it reads as exhausted.
    pub fn unopened(vnode: VirtualNode) -> Self {
        Self {
            vnode,
            scan: None,
            retired: None,
            ready: VecDeque::new(),
            unread: VecDeque::new(),
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
        self.ready.clear();
        self.unread.clear();
        self.patches = Patches::default();
        self.continue_after(after);
    }

    /// Keeps the scan and merges `patch` (changes to the vnode's rows strictly after
    /// `after`, its position) into the rows it hands out from now on, starting with
    /// `unread`: the rows it handed out last that were not consumed, in order, all after
    /// `after` (and before any rows it holds).
    pub fn patch(
        &mut self,
        unread: Option<Run>,
        patch: Patch,
        after: Option<&Position>,
    ) -> Result<()> {
        // Everything held is patched again, in order: the given-back rows, the ready ones,
        // then those still to patch.
        let mut held: VecDeque<Run> = unread.filter(|r| r.len() > 0).into_iter().collect();
        held.extend(self.ready.drain(..));
        held.append(&mut self.unread);
        self.unread = held;
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
        self.scan.is_none()
            && self.ready.is_empty()
            && self.unread.is_empty()
            && self.patches.is_empty()
    }

    /// The next non-empty rows, checked, or `None` when the scan is exhausted (then, and on
    /// every later call). Records the schema of any rows seen, empty ones included, in
    /// `schema` if that is still unset.
    pub fn next_run(&mut self, table: &str, schema: &mut Option<SchemaRef>) -> Result<Option<Run>> {
        self.next_run_with(table, schema, Run::first_unordered)
    }

    /// Like [`MergeInput::next_run`], with `unordered` finding the first row of a run whose
    /// key does not strictly increase ([`Run::first_unordered`] on the encoded keys, or an
    /// equivalent check on native key values that is cheaper than a `memcmp` per row). The
    /// order across runs is always checked on the encoded keys.
    pub fn next_run_with(
        &mut self,
        table: &str,
        schema: &mut Option<SchemaRef>,
        unordered: impl Fn(&Run) -> Option<usize>,
    ) -> Result<Option<Run>> {
        loop {
            if let Some(run) = self.ready.pop_front() {
                if schema.is_none() {
                    *schema = Some(run.rows().0.data.batch.schema());
                }
                if run.len() == 0 {
                    continue;
                }
                self.check_order(table, &run, unordered(&run))?;
                return Ok(Some(run));
            }
            let next = match self.unread.pop_front() {
                Some(unread) => Some(unread),
                None => self.scan_next()?,
            };
            // Seen even when a patch deletes every row.
            if let (None, Some(run)) = (&schema, &next) {
                *schema = Some(run.rows().0.data.batch.schema());
            }
            let end = next.is_none();
            self.ready.extend(self.patches.apply(next)?);
            if end && self.ready.is_empty() {
                return Ok(None);
            }
        }
    }

    /// The scan's next rows; `None` once it is exhausted (and dropped).
    fn scan_next(&mut self) -> Result<Option<Run>> {
        let Some(scan) = self.scan.as_mut() else {
            return Ok(None);
        };
        let next = scan.next_rows()?;
        self.retired = None;
        if next.is_none() {
            self.scan = None;
        }
        Ok(next.map(|rows| rows.0))
    }

    /// Checks `run` follows the rows before it; `unordered` is its first row out of order.
    fn check_order(&mut self, table: &str, run: &Run, unordered: Option<usize>) -> Result<()> {
        let violation = |row| Error::OrderViolation {
            table: table.to_owned(),
            vnode: self.vnode.get(),
            row,
        };
        if self.seen_rows && run.key(0) <= self.last_key.as_slice() {
            return Err(violation(0));
        }
        if let Some(row) = unordered {
            return Err(violation(row));
        }
        self.last_key.clear();
        self.last_key.extend_from_slice(run.key(run.len() - 1));
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
        while let Some(run) = input.next_run("t", &mut schema)? {
            sizes.push(run.len());
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
