//! The state store: tables of rows keyed by `(vnode, primary key)`, versioned by epoch.
//!
//! One trait pair, several implementations (DESIGN section 6): [`MemoryStore`], the in-memory
//! columnar store used for embedding and benchmarks, and [`DurableStore`], the embedded store
//! of the command-line tool (sorted Arrow IPC run files, a manifest plus a log of each
//! commit's changes, background compaction, bounded memory; see [`durable`]). Both keep
//! their tables as sorted runs and read them through the same merge, from the run kernel
//! (`src/runs/`, which the backfill's merges use too), and pass the same model test. All
//! durable file I/O goes through the [`io`] seam.
//!
//! ```text
//!             write(chunk)          seal(e)                 commit(c)
//!  handle  ---------------> local -----------> sealed layer --------------> committed base
//!                           buffer             of epoch e    (all tables,   (per vnode: sorted
//!                                              (sorted runs,  atomically)    Arrow segments)
//!                                               tombstones)
//! ```
//!
//! Rules every implementation keeps (the checks written once, in `rules.rs`):
//! - A handle owns a set of vnodes; writing a row of another vnode is an error.
//! - Epochs a handle seals strictly increase; `commit(c)` needs `c` above the committed epoch.
//! - A read at epoch `e` sees the committed data plus the sealed layers up to `e` (for a
//!   *replicated* handle: its own layers only). Reading below the committed epoch is an
//!   error: history is compacted away.
//! - `scan(vnode, after, epoch)` yields batches sorted by key, strictly after `after`, with
//!   their encoded keys ([`KeyedBatch`]), so consumers never re-encode.
//! - A replicated handle's layers are readable through it, never persisted, and dropped once
//!   the store commits an epoch at or above them.
//!
//! The traits are synchronous: the in-memory and embedded stores answer from memory or local
//! files. A remote implementation is expected to prefetch behind [`SnapshotScan`].

pub mod durable;
pub mod io;
mod memory;
mod rules;

pub use crate::runs::{KeyedBatch, ScanRows, gc_views};
pub use durable::{
    Compaction, DurableOptions, DurableScan, DurableStore, DurableTable, StateCompression,
};
pub use memory::{MemoryScan, MemoryStore, MemoryTable};

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// Which job writes each upstream table of a store, in this process: one job at a time, so
/// that no change is applied twice. Shared by a store's clones.
#[derive(Debug, Clone, Default)]
pub struct WriterClaims(Arc<std::sync::Mutex<hashbrown::HashMap<String, String>>>);

impl WriterClaims {
    /// Claims `table` for `job` until the returned claim is dropped.
    pub fn claim(&self, table: &str, job: &str) -> Result<WriterClaim> {
        let mut writers = (self.0.lock()).map_err(|_| internal!("writer claims poisoned"))?;
        if let Some(other) = writers.get(table) {
            return Err(Error::InvalidConfig(format!(
                "table `{table}` is being written by job `{other}`, which is still running: one \
                 job writes a table at a time (stop or drop it first)"
            )));
        }
        writers.insert(table.to_string(), job.to_string());
        Ok(WriterClaim {
            claims: self.clone(),
            table: table.to_string(),
        })
    }
}

/// A job's claim on an upstream table ([`WriterClaims::claim`]); released when dropped.
#[derive(Debug)]
pub struct WriterClaim {
    claims: WriterClaims,
    table: String,
}

impl Drop for WriterClaim {
    fn drop(&mut self) {
        if let Ok(mut writers) = self.claims.0.lock() {
            writers.remove(&self.table);
        }
    }
}

/// A store of versioned tables.
pub trait StateStore: Clone + Send + Sync + 'static {
    /// The handle type.
    type Table: StateTable;

    /// Defines a table. Its name must be new.
    fn create_table(&self, desc: TableDesc) -> Result<Arc<TableDesc>>;

    /// The definition of table `name` ([`Error::UnknownTable`] if there is none).
    fn table_desc(&self, name: &str) -> Result<Arc<TableDesc>>;

    /// Opens a writable handle on the given vnodes of a table.
    fn table(&self, name: &str, vnodes: VnodeBitmap) -> Result<Self::Table>;

    /// Opens a replicated handle: its writes are readable through it and never persisted.
    fn replicated_table(&self, name: &str, vnodes: VnodeBitmap) -> Result<Self::Table>;

    /// Makes every layer sealed at or below `epoch` durable, atomically across all tables.
    fn commit(&self, epoch: u64) -> Result<()>;

    /// Drops `table`'s sealed, uncommitted epochs: what a writer that stopped between a seal
    /// and its commit left in this store (a job dropped or shut down mid-epoch; a crash
    /// leaves nothing, the store reopens at its commit). The caller holds the table's writer
    /// claim: no live handle writes it.
    fn discard_uncommitted_of(&self, table: &str) -> Result<()>;

    /// The last committed epoch, if any.
    fn committed_epoch(&self) -> Result<Option<u64>>;

    /// A committed job value: what a job records to resume (which input, how far, whether
    /// it finished). See [`StateStore::stage_meta`].
    fn meta(&self, key: &str) -> Result<Option<String>>;

    /// Sets a job value that becomes visible (and, in a durable store, durable) with the next
    /// commit, atomically with its data: the sink's commit record.
    fn stage_meta(&self, key: &str, value: &str) -> Result<()>;

    /// The committed job values whose keys start with `prefix`, in key order.
    fn meta_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>>;

    /// The jobs writing this store's tables now (see [`WriterClaims`]).
    fn writer_claims(&self) -> &WriterClaims;

    /// Folds committed changes into the committed base now, on this thread, where the store
    /// keeps them apart (a bulk load's sorted pieces, delta runs). Reads are the same before
    /// and after; they get cheaper. The in-memory store has nothing to do.
    fn compact(&self) -> Result<()> {
        Ok(())
    }

    /// [`StateStore::compact`], abandoned (nothing installed, no file left) once `stop` is
    /// set: an interrupted job does not wait for a compaction of the whole table.
    fn compact_until(&self, stop: &std::sync::atomic::AtomicBool) -> Result<()> {
        let _ = stop;
        self.compact()
    }
}

/// A handle on some vnodes of one table.
pub trait StateTable: Send + Sync + 'static {
    /// The scan type.
    type Scan: SnapshotScan;

    /// The table definition.
    fn desc(&self) -> &Arc<TableDesc>;

    /// The vnodes this handle owns.
    fn vnodes(&self) -> &VnodeBitmap;

    /// Buffers a chunk of changes for the current epoch.
    fn write(&mut self, chunk: &StreamChunk) -> Result<()>;

    /// Freezes the buffered changes as epoch `epoch`.
    fn seal(&mut self, epoch: u64) -> Result<()>;

    /// Commits the rows written through this handle since it last sealed or committed a
    /// step straight into the committed state of its vnodes, with the job values staged so
    /// far ([`StateStore::stage_meta`]), without committing an epoch: a step of a bulk load
    /// (`TableLoader::commit_step`), so that a crash loses only the rows written since.
    ///
    /// Only for a table that nothing reads or writes until its load's final commit: readers
    /// of the committed epoch would see the rows appear. The table must have no sealed,
    /// uncommitted epoch. The durable store appends the rows to each vnode's base when they
    /// follow it in key order (an ordered load is written once, never compacted) and as
    /// delta runs otherwise; its record is made durable as a commit's is (a crash leaves the
    /// state before or after the step).
    fn commit_load_step(&mut self) -> Result<()>;

    /// Rows of `vnode` visible at `epoch`, strictly after `after`, in key order, in batches
    /// of at most `batch_size` rows.
    fn scan(
        &self,
        vnode: VirtualNode,
        after: Option<&Position>,
        epoch: u64,
        batch_size: usize,
    ) -> Result<Self::Scan>;

    /// The row with this encoded key in `vnode` at `epoch`, as a one-row batch.
    fn get(&self, vnode: VirtualNode, key: &[u8], epoch: u64) -> Result<Option<RecordBatch>>;

    /// The number of committed rows in `vnode` (an estimate for progress reporting).
    fn committed_rows(&self, vnode: VirtualNode) -> Result<usize>;
}

/// A pull-based scan of one vnode.
pub trait SnapshotScan: Send + 'static {
    /// The next batch, or `None` when the scan is exhausted.
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>>;

    /// The next rows as the merges read them: [`SnapshotScan::next_batch`]'s batch, unless a
    /// store hands out a range of rows it shares with other scans ([`ScanRows`]).
    fn next_rows(&mut self) -> Result<Option<ScanRows>> {
        self.next_batch()?.map(ScanRows::new).transpose()
    }
}
