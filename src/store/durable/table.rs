//! A handle on some vnodes of a table ([`DurableTable`]) and its scans ([`DurableScan`]).
//!
//! Writes are buffered per epoch; a big epoch (a bulk load) is sorted and spilled to
//! uncommitted run files in pieces of a part of the memory budget, on a thread of its own.
//! A seal turns the epoch's changes into a sealed layer (runs kept in memory, or written out
//! when the store is over its memory budget), noting per vnode whether its runs are ordered
//! (so a commit can make them its base as they are). A read merges the vnode's committed
//! runs with the visible sealed layers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use hashbrown::HashMap;

use super::DurableStore;
use super::file::{DiskRun, MIN_BLOCK_ROWS, RunFile, RunSpan};
use super::version::{Layer, LayerRun, State};
use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::key::Position;
use crate::runs::{MergeReader, Run, RunList, Views, build_pending_sliced_runs};
use crate::store::rules::{
    check_owned, check_read_epoch, check_seal, check_write, install_sealed, keep_replicated, known,
    owner, replicated_visible,
};
use crate::store::{KeyedBatch, ScanRows, SnapshotScan, StateTable};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// A bulk load's piece is the memory budget divided by this: one piece is filled while the
/// one before it is written, so the load holds about the budget. Half rather than a quarter
/// (lineitem scale 1: 12 pieces instead of 25, each vnode's base a chain of half as many
/// runs with half as many partial blocks): 3 to 10% less wall time in vnode and merged
/// order, 12 to 22 MB more peak memory (`docs/benchmarks-history.md`).
const LOAD_PIECE: usize = 2;

/// This epoch's (or load step's) runs of a vnode so far, while they are ordered (see
/// [`VnodeLayer::ordered`]).
#[derive(Debug)]
pub(super) struct Ordered {
    /// The first key of the runs.
    pub(super) first: Vec<u8>,
    /// The last key of the runs.
    pub(super) last: Vec<u8>,
    pub(super) runs: usize,
    /// Some run is shorter than a block ([`MIN_BLOCK_ROWS`]).
    pub(super) short: bool,
}

/// A spilled run file and its runs.
type Spilled = (Arc<RunFile>, Vec<RunSpan>);

/// A handle on some vnodes of a table in a [`DurableStore`].
#[derive(Debug)]
pub struct DurableTable {
    store: DurableStore,
    desc: Arc<TableDesc>,
    vnodes: VnodeBitmap,
    replicated: bool,
    /// Chunks written since the last seal (or spill), with each row's vnode.
    pending: Vec<(StreamChunk, Vec<VirtualNode>)>,
    pending_bytes: usize,
    /// Runs of this epoch already spilled to disk, oldest first.
    spilled: Vec<(VirtualNode, DiskRun)>,
    /// The spill being written on its own thread, at most one: its runs follow `spilled`.
    spilling: Option<JoinHandle<Result<Spilled>>>,
    /// Per vnode given runs this epoch: its runs while they are ordered, `None` once they
    /// are not.
    order: HashMap<VirtualNode, Option<Ordered>>,
    last_sealed: Option<u64>,
    /// A replicated handle's own layers (never persisted).
    local: BTreeMap<u64, Layer>,
}

impl Drop for DurableTable {
    fn drop(&mut self) {
        // The spill's file was never committed: once written, it is dropped (and removed).
        if let Some(thread) = self.spilling.take() {
            let _ = thread.join();
        }
    }
}

impl DurableTable {
    /// A handle on `vnodes` of the table `desc` (checked by the caller) of `store`.
    pub(super) fn new(
        store: DurableStore,
        desc: Arc<TableDesc>,
        vnodes: VnodeBitmap,
        replicated: bool,
    ) -> Self {
        Self {
            store,
            desc,
            vnodes,
            replicated,
            pending: Vec::new(),
            pending_bytes: 0,
            spilled: Vec::new(),
            spilling: None,
            order: HashMap::new(),
            last_sealed: None,
            local: BTreeMap::new(),
        }
    }

    /// The pending chunks as sorted runs per vnode (last change per key), in memory: slices
    /// of one batch, with its bytes per row. `views`: [`Views::Shared`] for runs written out
    /// at once, [`Views::Compact`] for runs that may stay in memory.
    fn build_pending(&mut self, views: Views) -> Result<(Vec<(VirtualNode, Run)>, usize)> {
        let built = build_pending_sliced_runs(&self.desc, &self.pending, views)?;
        self.pending.clear();
        self.pending_bytes = 0;
        // Order only matters to a commit (a replicated handle's layers are never committed).
        if !self.replicated {
            for (vnode, run) in &built.0 {
                self.note_order(*vnode, run);
            }
        }
        Ok(built)
    }

    /// Notes whether `run` keeps this epoch's runs of `vnode` ordered: no tombstone, and
    /// its first key above the last key of the runs before it.
    fn note_order(&mut self, vnode: VirtualNode, run: &Run) {
        let (Some(first), Some(last)) = (run.first_key(), run.last_key()) else {
            return;
        };
        let (follows, runs, short, start) = match self.order.get(&vnode) {
            None => (true, 0, false, first),
            Some(None) => (false, 0, false, first),
            Some(Some(before)) => (
                first > before.last.as_slice(),
                before.runs,
                before.short,
                before.first.as_slice(),
            ),
        };
        let ordered = follows && !run.has_tombstones();
        let state = ordered.then(|| Ordered {
            first: start.to_vec(),
            last: last.to_vec(),
            runs: runs + 1,
            short: short || run.len() < MIN_BLOCK_ROWS,
        });
        self.order.insert(vnode, state);
    }

    /// Sorts the pending chunks and writes them to an (uncommitted) run file, on a thread of
    /// its own: a bulk load sorts (and reads) its next piece while the last one is written.
    /// One spill at a time, so the runs in flight are at most one piece ([`LOAD_PIECE`]); a
    /// write error surfaces at the next spill or at the seal.
    fn spill_pending(&mut self) -> Result<()> {
        // Written out by the spill thread, then dropped: their strings are copied once, into
        // the file.
        let (runs, _) = self.build_pending(Views::Shared)?;
        if runs.is_empty() {
            return Ok(());
        }
        self.finish_spill()?;
        let shared = Arc::clone(&self.store.shared);
        let desc = Arc::clone(&self.desc);
        let thread = std::thread::Builder::new()
            .name("backfill-spill".into())
            .spawn(move || shared.write_runs(&desc, runs.iter().map(|(v, r)| (*v, r))))
            .map_err(Error::Io)?;
        self.spilling = Some(thread);
        Ok(())
    }

    /// Waits for the spill in flight, if any, and adds its runs to `spilled`.
    fn finish_spill(&mut self) -> Result<()> {
        let Some(thread) = self.spilling.take() else {
            return Ok(());
        };
        let (file, spans) = thread
            .join()
            .map_err(|_| Error::Internal("the spill thread panicked".into()))??;
        for span in spans {
            self.spilled.push((
                span.vnode,
                DiskRun {
                    file: file.clone(),
                    span,
                },
            ));
        }
        Ok(())
    }

    /// The delta runs of `vnode` visible at `epoch` above the committed state, oldest first.
    fn visible_layers(
        &self,
        state: &State,
        vnode: VirtualNode,
        epoch: u64,
    ) -> Result<Vec<LayerRun>> {
        let layers: Box<dyn Iterator<Item = &Layer>> = if self.replicated {
            Box::new(replicated_visible(&self.local, state.committed, epoch))
        } else {
            Box::new(
                state
                    .table(self.desc.name())?
                    .sealed
                    .range(..=epoch)
                    .map(|(_, l)| l.as_ref()),
            )
        };
        Ok(layers
            .filter_map(|layer| layer.get(&vnode))
            .flat_map(|v| v.runs.iter().cloned())
            .collect())
    }
}

impl DurableTable {
    /// Everything a read of `vnode` at `epoch` merges, oldest first: the base, the committed
    /// deltas, then the visible sealed layers.
    fn sources(&self, vnode: VirtualNode, epoch: u64) -> Result<Vec<Box<dyn RunList>>> {
        check_owned(&self.desc, &self.vnodes, self.replicated, vnode)?;
        let state = self.store.read()?;
        state.check_ok()?;
        check_read_epoch(self.desc.name(), epoch, state.committed)?;
        let table = state.table(self.desc.name())?;
        let mut sources = table.vnodes[vnode.index()].sources();
        for run in self.visible_layers(&state, vnode, epoch)? {
            sources.push(run.list());
        }
        Ok(sources)
    }
}

/// Point lookup in a run list: the row with `key` and whether it is a tombstone.
fn find_in(list: &dyn RunList, key: &[u8]) -> Result<Option<(Arc<Run>, usize)>> {
    let (mut lo, mut hi) = (0, list.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if list.last_key(mid).is_none_or(|k| k < key) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == list.len() {
        return Ok(None);
    }
    let run = list.load(lo)?;
    Ok(run.find(key).map(|row| (run, row)))
}

impl StateTable for DurableTable {
    type Scan = DurableScan;

    fn desc(&self) -> &Arc<TableDesc> {
        &self.desc
    }

    fn vnodes(&self) -> &VnodeBitmap {
        &self.vnodes
    }

    fn write(&mut self, chunk: &StreamChunk) -> Result<()> {
        let vnodes = check_write(&self.desc, &self.vnodes, chunk, || {
            owner(&self.desc, self.replicated)
        })?;
        if chunk.is_empty() {
            return Ok(());
        }
        self.pending_bytes += chunk.batch().get_array_memory_size();
        self.pending.push((chunk.clone(), vnodes));
        // A big epoch (a bulk load) is sorted and spilled in bounded pieces.
        if !self.replicated
            && self.pending_bytes > self.store.shared.options.memory_budget / LOAD_PIECE
        {
            self.spill_pending()?;
        }
        Ok(())
    }

    fn seal(&mut self, epoch: u64) -> Result<()> {
        let committed = {
            let state = self.store.read()?;
            state.check_ok()?;
            state.committed
        };
        check_seal(
            &self.desc,
            epoch,
            self.last_sealed,
            committed,
            self.replicated,
        )?;
        self.finish_spill()?;
        let (memory_runs, row_bytes) = self.build_pending(Views::Compact)?;
        let memory_bytes: usize = memory_runs.iter().map(|(_, r)| r.len() * row_bytes).sum();
        let over_budget = !self.replicated && {
            let state = self.store.read()?;
            state.memory + memory_bytes > self.store.shared.options.memory_budget
        };
        let mut layer = Layer::new();
        for (vnode, run) in self.spilled.drain(..) {
            layer
                .entry(vnode)
                .or_default()
                .runs
                .push(LayerRun::Disk(run));
        }
        let mut kept_bytes = 0;
        if over_budget && !memory_runs.is_empty() {
            let (file, spans) = self
                .store
                .shared
                .write_runs(&self.desc, memory_runs.iter().map(|(v, r)| (*v, r)))?;
            for span in spans {
                layer
                    .entry(span.vnode)
                    .or_default()
                    .runs
                    .push(LayerRun::Disk(DiskRun {
                        file: file.clone(),
                        span,
                    }));
            }
        } else {
            kept_bytes = memory_bytes;
            for (vnode, run) in memory_runs {
                let bytes = run.len() * row_bytes;
                layer
                    .entry(vnode)
                    .or_default()
                    .runs
                    .push(LayerRun::Memory(Arc::new(run), bytes));
            }
        }
        for (vnode, order) in std::mem::take(&mut self.order) {
            if let Some(v) = layer.get_mut(&vnode) {
                let chain = self.store.shared.options.max_deltas;
                v.ordered = order.is_some_and(|o| o.runs <= chain.max(1) || !o.short);
            }
        }
        if self.replicated {
            let layer = (!layer.is_empty()).then_some(layer);
            keep_replicated(&mut self.local, committed, epoch, layer);
        } else if !layer.is_empty() {
            let mut state = self.store.write()?;
            state.memory += kept_bytes;
            let name = self.desc.name();
            let table = known(state.tables.get_mut(name), name)?;
            let slot = Arc::make_mut(table.sealed.entry(epoch).or_default());
            install_sealed(slot, layer, &self.desc, epoch)?;
        }
        self.last_sealed = Some(epoch);
        Ok(())
    }

    /// Writes what is pending to a run file (beside the pieces already spilled) and commits
    /// them with one log record that appends each vnode's runs to its base when they follow
    /// it in key order (no tombstone, no delta on the vnode, the chain no longer than the
    /// rule of `VnodeLayer::ordered` allows), as deltas otherwise (compacted later, as an
    /// unordered load's are). The committed epoch is unchanged.
    fn commit_load_step(&mut self) -> Result<()> {
        if self.replicated {
            return Err(Error::InvalidConfig(
                "a replicated handle's writes are never committed".into(),
            ));
        }
        self.finish_spill()?;
        let (runs, _) = self.build_pending(Views::Shared)?;
        if !runs.is_empty() {
            let (file, spans) =
                (self.store.shared).write_runs(&self.desc, runs.iter().map(|(v, r)| (*v, r)))?;
            for span in spans {
                let run = DiskRun {
                    file: file.clone(),
                    span,
                };
                self.spilled.push((span.vnode, run));
            }
        }
        let runs = std::mem::take(&mut self.spilled);
        let order = std::mem::take(&mut self.order);
        self.store.commit_load_step(&self.desc, runs, &order)
    }

    fn scan(
        &self,
        vnode: VirtualNode,
        after: Option<&Position>,
        epoch: u64,
        batch_size: usize,
    ) -> Result<DurableScan> {
        let sources = self.sources(vnode, epoch)?;
        Ok(DurableScan {
            reader: MergeReader::new(sources, after.map(Position::as_bytes), batch_size)?,
        })
    }

    fn get(&self, vnode: VirtualNode, key: &[u8], epoch: u64) -> Result<Option<RecordBatch>> {
        let sources = self.sources(vnode, epoch)?;
        for source in sources.iter().rev() {
            if let Some((run, row)) = find_in(source.as_ref(), key)? {
                return Ok((!run.is_deleted(row)).then(|| run.row(row)));
            }
        }
        Ok(None)
    }

    /// Exact: the base's row count, or a merged count when committed deltas await compaction.
    fn committed_rows(&self, vnode: VirtualNode) -> Result<usize> {
        let runs = {
            let state = self.store.read()?;
            state.table(self.desc.name())?.vnodes[vnode.index()].clone()
        };
        if runs.deltas.is_empty() {
            return Ok(runs.base_rows() as usize);
        }
        let mut reader = MergeReader::new(runs.sources(), None, 1 << 16)?;
        let mut rows = 0;
        while let Some(batch) = reader.next_batch()? {
            rows += batch.num_rows();
        }
        Ok(rows)
    }
}

/// A scan of one vnode of a [`DurableTable`]: holds its files, not the lock.
pub struct DurableScan {
    reader: MergeReader,
}

impl SnapshotScan for DurableScan {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        self.reader.next_batch()
    }

    /// A range of the rows the run was read into when the batch is one (no arrays sliced).
    fn next_rows(&mut self) -> Result<Option<ScanRows>> {
        Ok(self.reader.next_run()?.map(ScanRows))
    }
}
