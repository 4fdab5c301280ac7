//! Combining per-vnode snapshot scans into one stream of output batches.
//!
//! The backfill reads the snapshot of each vnode it owns as a [`SnapshotScan`]: batches of
//! rows with their encoded keys ([`KeyedBatch`]), keys strictly increasing within the vnode.
//! A [`SnapshotMerger`] pulls from all of them and hands out [`MergeOutput`]s: a batch of
//! rows, how far each vnode advanced in it, and which vnodes are now completely emitted
//! (docs/DESIGN.md sections 7.3 and 7.6).
//!
//! Two mergers share that interface:
//! - [`KWayMerge`], the default: a k-way merge that emits rows in global key order, in
//!   batches of exactly `batch_size` rows (except the last).
//! - [`RoundRobin`], the unordered per-vnode mode: whole input batches, zero-copy, one input
//!   after the other.
//!
//! Both live across epochs ([`RestartInputs`]): at a barrier the backfill patches (or gives
//! fresh scans to) only the vnodes whose remaining rows the epoch's upstream changes touched.
//!
//! ```text
//!  vnode 3: [1 4 9] [12 15] --.
//!  vnode 7: [2 3] [8 20]    ---+--> cursors --> loser tree --> output builder --> MergeOutput
//!  vnode 9: (empty)         --'    (head of     (which input   (indices, then     batch: 1 2 3 4
//!                                   each input)   is smallest)   interleave)       progress: 3@4 (2 rows)
//!                                                                                           7@3 (2 rows)
//!                                                                                  exhausted: [9]
//! ```
//!
//! One file per job, as in DataFusion's `sorts/`:
//! - `input.rs`: one input: pulls non-empty batches, checks key order, knows when it is done;
//! - `patch.rs`: an epoch's changes merged into an input's rows instead of a fresh scan;
//! - `cursor/`: how the heads of two inputs compare (`row.rs`: encoded keys, `primitive.rs`:
//!   native integers);
//! - `loser_tree.rs`: which input holds the smallest head;
//! - `builder.rs`: gathers winning rows as indices and materializes them with `interleave`;
//! - `kway.rs` and `round_robin.rs`: the two mergers.
//!
//! Invariants every merger keeps:
//! - Per vnode, rows come out in key order, each exactly once. [`VnodeAdvance::last`] is the
//!   key of that vnode's last row *in this output*; a vnode without rows in the output is not
//!   listed, so its position does not move.
//! - A vnode is listed in [`MergeOutput::exhausted`] exactly once, in the output that carries
//!   its last row or a later one (an empty vnode: in the first output).
//! - An input whose keys do not strictly increase (also across its batches) is an
//!   [`Error::OrderViolation`](crate::Error::OrderViolation), never a panic or silent output.
//! - After an error, the merger must not be polled again.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use arrow_schema::{DataType, Field, Schema};
//! use arrangement_backfill::key::{KeyColumn, PrimaryKey};
//! use arrangement_backfill::merge::{KWayMerge, SnapshotMerger};
//! use arrangement_backfill::store::{KeyedBatch, SnapshotScan};
//! use arrangement_backfill::vnode::VirtualNode;
//!
//! /// A scan over batches kept in memory.
//! struct Batches(std::vec::IntoIter<KeyedBatch>);
//! impl SnapshotScan for Batches {
//!     fn next_batch(&mut self) -> arrangement_backfill::Result<Option<KeyedBatch>> {
//!         Ok(self.0.next())
//!     }
//! }
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
//! let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("k")])?;
//! let scan = |keys: Vec<i64>| -> arrangement_backfill::Result<Batches> {
//!     let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(keys))])?;
//!     let keys = pk.encode(&batch)?;
//!     Ok(Batches(vec![KeyedBatch { batch, keys }].into_iter()))
//! };
//! let inputs = vec![
//!     (VirtualNode::new(3), scan(vec![1, 4, 9])?),
//!     (VirtualNode::new(7), scan(vec![2, 3])?),
//! ];
//! let mut merge = KWayMerge::new(&pk, inputs, 4)?;
//! let first = merge.next_output()?.expect("rows");
//! assert_eq!(first.batch.num_rows(), 4); // keys 1 2 3 4
//! assert_eq!(first.exhausted, vec![VirtualNode::new(7)]);
//! let second = merge.next_output()?.expect("rows");
//! assert_eq!(second.batch.num_rows(), 1); // key 9
//! assert_eq!(second.exhausted, vec![VirtualNode::new(3)]);
//! assert!(merge.next_output()?.is_none());
//! # Ok::<(), arrangement_backfill::Error>(())
//! ```

mod builder;
mod cursor;
mod input;
mod kway;
mod loser_tree;
mod patch;
mod round_robin;
#[cfg(test)]
pub(crate) mod testing;

pub use cursor::CursorKind;
pub use kway::KWayMerge;
pub use loser_tree::{Entry, LoserTree};
pub use patch::{Patch, PatchLedger};
pub use round_robin::RoundRobin;

use crate::error::Result;
use crate::key::Position;
use crate::runs::KeyedBatch;
use crate::vnode::VirtualNode;

use crate::store::SnapshotScan;

/// What one pull of a snapshot merger produced.
#[derive(Debug, Clone)]
pub struct MergeOutput {
    /// The rows, with their encoded keys. Empty when the output only carries exhaustion news.
    pub batch: KeyedBatch,
    /// One entry per vnode with rows in `batch`, in no particular order.
    pub progress: Vec<VnodeAdvance>,
    /// Vnodes whose whole stream is now emitted (in this output or an earlier one).
    pub exhausted: Vec<VirtualNode>,
}

/// How far one vnode advanced in one output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnodeAdvance {
    /// The vnode.
    pub vnode: VirtualNode,
    /// The key of its last row in the output: the vnode's new position.
    pub last: Position,
    /// How many of its rows the output holds.
    pub rows: usize,
}

/// Common interface of the ordered merge and the unordered mode.
pub trait SnapshotMerger: Send {
    /// Next output; `None` when every input is exhausted and reported.
    fn next_output(&mut self) -> Result<Option<MergeOutput>>;
}

/// A merger that lives across epochs: between two outputs, the input of one vnode can be
/// given a fresh scan or a patch of changes, while every other input keeps its scan and the
/// rows it read ahead.
///
/// The backfill keeps one merger for as long as the snapshot is read and, at each barrier,
/// patches (or restarts) only the vnodes whose rows beyond their position the epoch's
/// upstream changes touched (the ones whose changes the filter dropped). An untouched vnode's rows after its
/// position are the same at the new epoch as at the epoch its scan was opened at, so its
/// scan stays valid; restarting it would only read the same rows again. The output is the
/// one a merger opened afresh at the barrier would give: each input's head is its first row
/// after its position either way.
pub trait RestartInputs<S: SnapshotScan>: SnapshotMerger {
    /// Replaces the scan of `vnode` (one of the merger's inputs, possibly exhausted) with
    /// `scan`, which yields its rows strictly after `after`: the key of the vnode's last
    /// emitted row (`None` when none was). Rows read ahead and not emitted are dropped.
    /// Only between outputs.
    fn restart(&mut self, vnode: VirtualNode, scan: S, after: Option<&Position>) -> Result<()>;

    /// Keeps the scan of `vnode` (one of the merger's inputs) and the rows it read ahead,
    /// and merges `patch` into them: changes to the vnode's rows strictly after `after`, its
    /// position (the key of its last emitted row, `None` when none was). What the input
    /// hands out from then on is what a scan restarted at the epoch after the changes would:
    /// the changes of a barrier the filter dropped are exactly those. Patches of several
    /// barriers stack, the newest winning. Only between outputs.
    fn patch(&mut self, vnode: VirtualNode, patch: Patch, after: Option<&Position>) -> Result<()>;

    /// Whether the input of `vnode` has no scan yet and opens one only when the merger
    /// reaches it ([`RoundRobin::deferred`]): it reads the store at the epoch current then,
    /// so a barrier's changes to it need neither a patch nor a restart.
    fn is_deferred(&self, vnode: VirtualNode) -> bool {
        let _ = vnode;
        false
    }

    /// [`SnapshotMerger::next_output`], opening each deferred input it reaches with `open`
    /// (the vnode, and the position to scan after).
    fn next_output_opening(&mut self, open: &mut OpenScan<'_, S>) -> Result<Option<MergeOutput>> {
        let _ = open;
        self.next_output()
    }
}

/// Opens the scan of a vnode after a position (`None`: from its first row), at the epoch the
/// caller reads at: how a merger opens its deferred inputs.
pub type OpenScan<'a, S> = dyn FnMut(VirtualNode, Option<&Position>) -> Result<S> + 'a;
