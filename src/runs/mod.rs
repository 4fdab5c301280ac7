//! The run kernel: sorted runs of rows with their encoded keys, built from change chunks
//! and read merged. The state stores ([`crate::store`]) keep their tables as runs; the
//! merges of the backfill ([`crate::merge`]) compare, patch and gather them. Neither owns
//! this layer; it knows nothing of epochs, handles, files or vnodes' owners.
//!
//! ```text
//!   chunks ──build──▶ runs (ranges of shared Rows) ──MergeReader──▶ KeyedBatch / ScanRows
//!                         │                                          (to the merges)
//!                         └── compact: deltas folded into a base's segments
//! ```
//!
//! - `run.rs`: [`Rows`] and [`Run`] (a range of them), [`RunList`], view compaction.
//! - `build.rs`: an epoch's changes grouped by vnode, sorted, the newest change per key kept.
//! - `merged.rs`: [`MergeReader`] (base plus deltas, newest wins), [`assemble`],
//!   [`compact`], [`newest_tier`].
//! - `scatter.rs`: reordering by scattering rows to their places (a bulk load's sort).
//!
//! The two types that leave the layer are [`KeyedBatch`] (rows and their encoded keys) and
//! [`ScanRows`] (what a store's scan hands the merges); the store re-exports both, as its
//! scan trait returns them.

mod build;
mod merged;
mod run;
mod scatter;

pub(crate) use self::build::{build_pending_runs, build_pending_sliced_runs, build_sliced_runs};
pub(crate) use self::merged::{MergeReader, assemble, compact, newest_tier};
pub use self::run::gc_views;
pub(crate) use self::run::{Rows, Run, RunList, SEGMENT_ROWS, Views, partition_point, push_joined};

use std::sync::Arc;

use arrow_array::{Array, BinaryArray, RecordBatch};

use crate::error::Result;
use crate::key::Position;

/// Rows of one table with their encoded primary keys (`keys.value(i)` is row `i`'s key).
#[derive(Debug, Clone)]
pub struct KeyedBatch {
    /// The rows.
    pub batch: RecordBatch,
    /// Their encoded keys (see [`crate::key`]).
    pub keys: BinaryArray,
}

impl KeyedBatch {
    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }

    /// A zero-copy slice.
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        Self {
            batch: self.batch.slice(offset, len),
            keys: self.keys.slice(offset, len),
        }
    }

    /// The rows of `pieces` (at least one, all of one schema) in order, as one batch.
    pub fn concat(pieces: &[KeyedBatch]) -> Result<Self> {
        let first = pieces
            .first()
            .ok_or_else(|| crate::error::internal!("concatenation of no batches"))?;
        let schema = first.batch.schema_ref();
        // Pieces of one table share one schema: comparing pointers is the usual answer.
        let differs = |p: &&KeyedBatch| {
            let other = p.batch.schema_ref();
            !Arc::ptr_eq(other, schema) && other != schema
        };
        if let Some(other) = pieces.iter().find(differs) {
            return Err(crate::error::internal!(
                "concatenation of batches of different schemas: {schema:?} and {:?}",
                other.batch.schema()
            ));
        }
        let batch = crate::dictionary::concat_batches(schema, pieces.iter().map(|p| &p.batch))?;
        let keys: Vec<&dyn arrow_array::Array> = pieces
            .iter()
            .map(|p| &p.keys as &dyn arrow_array::Array)
            .collect();
        let keys = arrow_select::concat::concat(&keys)?;
        let keys = keys
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| crate::error::internal!("encoded keys are not binary"))?
            .clone();
        Ok(Self { batch, keys })
    }

    /// The position of the last row, if any.
    pub fn last_position(&self) -> Option<Position> {
        (!self.keys.is_empty()).then(|| Position::from_keys(&self.keys, self.keys.len() - 1))
    }
}

/// Rows a scan hands out, in key order: a batch of their own, or a range of rows shared with
/// other scans (the block of a run file several vnodes' runs are packed into, say).
///
/// A merge of many vnodes reads ranges as they are: it compares their keys in place and
/// gathers its output from the shared rows, never slicing each vnode's range into arrays of
/// its own (at thousands of vnodes a read, those slices and their drops were a large part of
/// the work).
#[derive(Debug, Clone)]
pub struct ScanRows(pub(crate) Run);

impl ScanRows {
    /// `batch` as scan rows: its keys must be one per row.
    pub fn new(batch: KeyedBatch) -> Result<Self> {
        Run::new(batch, None).map(Self)
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.0.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The rows as a batch of arrays (zero-copy slices of the shared rows).
    pub fn to_batch(&self) -> KeyedBatch {
        self.0.data_of(0, self.0.len())
    }
}
