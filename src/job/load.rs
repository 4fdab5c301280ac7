//! Loading an upstream table: its rows from any Arrow reader or from Parquet files, written,
//! sealed and committed in one call, so that a [`BackfillJob`](crate::BackfillJob) can start.

use std::path::Path;

use arrow_array::RecordBatch;

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
pub fn load_table<S, I, E>(store: &S, desc: TableDesc, batches: I) -> Result<Loaded>
where
    S: StateStore,
    I: IntoIterator<Item = std::result::Result<RecordBatch, E>>,
    E: Into<Error>,
{
    let mut loader = TableLoader::create(store, desc)?;
    for batch in batches {
        loader.write(batch.map_err(Into::into)?)?;
    }
    let loaded = loader.commit()?;
    store.compact()?;
    Ok(loaded)
}

/// A table being loaded, for a caller that commits when it decides (with values staged for
/// the same commit, after checks of its own): [`load_table`] in steps.
pub struct TableLoader<S: StateStore> {
    store: S,
    desc: std::sync::Arc<TableDesc>,
    table: S::Table,
    rows: u64,
}

impl<S: StateStore> TableLoader<S> {
    /// Creates table `desc` in `store` (its name must be new).
    pub fn create(store: &S, desc: TableDesc) -> Result<Self> {
        let name = desc.name().to_string();
        let desc = store.create_table(desc)?;
        let table = store.table(&name, VnodeBitmap::full(desc.vnode_count()))?;
        Ok(Self {
            store: store.clone(),
            desc,
            table,
            rows: 0,
        })
    }

    /// Writes rows (of the table's schema).
    pub fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.desc
            .check_schema(batch.schema_ref(), "a loaded batch")?;
        self.rows += batch.num_rows() as u64;
        self.table.write(&StreamChunk::inserts(batch))
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Seals the rows at the epoch after the store's committed one (the durable store
    /// writes what it still buffers): the load's last step before its commit, which
    /// [`SealedLoad::commit`] makes when the caller decides.
    pub fn seal(mut self) -> Result<SealedLoad<S>> {
        let epoch = self.store.committed_epoch()?.map_or(1, |e| e + 1);
        self.table.seal(epoch)?;
        Ok(SealedLoad {
            store: self.store,
            loaded: Loaded {
                rows: self.rows,
                epoch,
            },
        })
    }

    /// Seals and commits the rows (with whatever values were staged with
    /// `StateStore::stage_meta`). The store may then be compacted (`StateStore::compact`)
    /// before a backfill reads it.
    pub fn commit(self) -> Result<Loaded> {
        self.seal()?.commit()
    }
}

/// A load sealed and not yet committed ([`TableLoader::seal`]).
#[derive(Debug)]
pub struct SealedLoad<S: StateStore> {
    store: S,
    loaded: Loaded,
}

impl<S: StateStore> SealedLoad<S> {
    /// Commits the load (with whatever values were staged with `StateStore::stage_meta`).
    pub fn commit(self) -> Result<Loaded> {
        self.store.commit(self.loaded.epoch)?;
        Ok(self.loaded)
    }
}

impl<S: StateStore> std::fmt::Debug for TableLoader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLoader")
            .field("table", &self.desc.name())
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
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
