//! The full validation pass over a dataset, run before anything of a replay is committed.
//!
//! One pass over the snapshot and the changelog, with a table model of encoded keys (and a
//! 64-bit hash of each row, so a delete must carry the values the row has). Each error is an
//! [`Error::Dataset`] naming the file, the row within it (from 0) and, for changes, the epoch:
//!
//! | where     | what                                                                     |
//! |-----------|--------------------------------------------------------------------------|
//! | snapshot  | NULL key value, duplicate key                                            |
//! | changes   | NULL `_epoch`/`_op`, unknown op code, decreasing `_epoch`                 |
//! | changes   | U- not immediately followed by its U+ (same epoch), U+ without its U-    |
//! | changes   | NULL key value, delete/U- of an absent key or with other values,         |
//! |           | insert/U+ of an existing key (U- applies before U+)                      |
//!
//! Memory is O(table): one encoded key and one hash per live row.

use super::apply::KeyedTable;
use super::dataset::{Dataset, DatasetSummary};
use crate::error::{Error, Result};
use crate::vnode::VnodeCount;

/// Rows per batch read during validation.
const BATCH_SIZE: usize = 8192;

/// Validates `dataset` (see the module docs) and counts its rows and epochs.
pub fn validate(dataset: &Dataset) -> Result<DatasetSummary> {
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let mut table = KeyedTable::<u64>::new(dataset.schema(), desc.pk().clone())?;
    let mut summary = DatasetSummary::default();
    for path in dataset.snapshot_files() {
        let mut first_row = 0u64;
        for batch in dataset.snapshot_file_reader(path, BATCH_SIZE)? {
            let batch = batch?;
            table.load(&batch, |i, message| {
                Error::dataset(path, format!("row {}", first_row + i as u64), message)
            })?;
            first_row += batch.num_rows() as u64;
        }
        summary.snapshot_rows += first_row;
    }
    for rows in dataset.changelog(BATCH_SIZE) {
        let rows = rows?;
        table.apply(&rows.data, &rows.ops, |i, message| {
            rows.location(i).error(message)
        })?;
        for &epoch in &rows.epochs {
            if summary.last_epoch != Some(epoch) {
                summary.epochs += 1;
                summary.first_epoch.get_or_insert(epoch);
                summary.last_epoch = Some(epoch);
            }
        }
        summary.change_rows += rows.ops.len() as u64;
    }
    Ok(summary)
}
