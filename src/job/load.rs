//! Loading an upstream table: its rows from any Arrow reader or from Parquet files, written,
//! sealed and committed in one call, so that a [`BackfillJob`](crate::BackfillJob) can start.

use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;

use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VnodeBitmap;

/// What a load did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Rows written.
    pub rows: u64,
    /// The epoch the load committed.
    pub epoch: u64,
}

/// Creates table `desc` in `store`, writes every row of `batches` (for example a
/// `RecordBatchReader`) and commits them at the epoch after the store's committed one.
///
/// Memory: the durable store spills sorted runs as the rows come, so a load takes memory for
/// a few batches and the store's write budget, not for the table; the in-memory store holds
/// the table. Keys must be unique: the store keeps one row per key (the last written).
pub fn load_table<S, I>(store: &S, desc: TableDesc, batches: I) -> Result<Loaded>
where
    S: StateStore,
    I: IntoIterator<Item = std::result::Result<RecordBatch, ArrowError>>,
{
    let name = desc.name().to_string();
    let desc = store.create_table(desc)?;
    let mut table = store.table(&name, VnodeBitmap::full(desc.vnode_count()))?;
    let mut rows = 0u64;
    for batch in batches {
        let batch = batch?;
        desc.check_schema(batch.schema_ref(), "a loaded batch")?;
        rows += batch.num_rows() as u64;
        table.write(&StreamChunk::inserts(batch))?;
    }
    let epoch = store.committed_epoch()?.map_or(1, |e| e + 1);
    table.seal(epoch)?;
    drop(table);
    store.commit(epoch)?;
    store.compact()?;
    Ok(Loaded { rows, epoch })
}

/// [`load_table`] from Parquet files, read in batches of `batch_size` rows. The files'
/// columns must be the table's (the same names and types, in the same order).
pub fn load_parquet<S: StateStore>(
    store: &S,
    desc: TableDesc,
    files: &[impl AsRef<Path>],
    batch_size: usize,
) -> Result<Loaded> {
    let mut readers = Vec::with_capacity(files.len());
    for file in files {
        let path = file.as_ref();
        let opened = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(opened)
            .map_err(|e| {
                Error::InvalidConfig(format!(
                    "{}: not a readable Parquet file: {e}",
                    path.display()
                ))
            })?
            .with_batch_size(batch_size.max(1))
            .build()?;
        readers.push(reader);
    }
    load_table(store, desc, readers.into_iter().flatten())
}
