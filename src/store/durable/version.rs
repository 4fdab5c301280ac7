//! The store's state in memory, guarded by its lock: the committed version (per table and
//! vnode, the runs that make up its rows at the committed epoch: a base and committed
//! deltas, [`VnodeRuns`]; the live files and how many runs name each, [`LiveFiles`]; the
//! job values) and, above it, each table's sealed layers, not committed yet ([`Layer`]).
//!
//! Commits and compaction installs change the version only after their record is durable
//! (see [`super::log`]); [`State::manifest`] writes the committed part out whole, as a
//! manifest does. Nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hashbrown::HashMap;

#[cfg(doc)]
use super::DurableOptions;
use super::file::{Chain, DiskRun, RunFile};
use super::manifest::{Manifest, TableEntry};
use super::record::{FileEntry, RunEntry};
use crate::error::{Error, Result};
use crate::runs::{Run, RunList};
use crate::store::rules::known;
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// One run of a sealed layer: still in memory, or spilled to an uncommitted file.
#[derive(Debug, Clone)]
pub(super) enum LayerRun {
    /// A run and its share of memory (runs of one seal are slices of one batch).
    Memory(Arc<Run>, usize),
    Disk(DiskRun),
}

impl LayerRun {
    pub(super) fn list(&self) -> Box<dyn RunList> {
        match self {
            LayerRun::Memory(run, _) => Box::new(vec![run.clone()]),
            LayerRun::Disk(run) => Box::new(run.clone()),
        }
    }

    pub(super) fn memory_bytes(&self) -> usize {
        match self {
            LayerRun::Memory(_, bytes) => *bytes,
            LayerRun::Disk(_) => 0,
        }
    }
}

/// One epoch's changes of a table, per vnode.
pub(super) type Layer = HashMap<VirtualNode, VnodeLayer>;

/// One epoch's changes of a vnode.
#[derive(Debug, Clone, Default)]
pub(super) struct VnodeLayer {
    /// Its runs, oldest first.
    pub(super) runs: Vec<LayerRun>,
    /// The runs hold no tombstone and follow each other in key order without overlapping:
    /// committed over an empty vnode, they become its base as they are, so a bulk load of
    /// ordered rows is written once, not written and compacted. A chain of short runs (each
    /// a range of a batch packed with other vnodes' runs: a load spread over many vnodes)
    /// qualifies while it is no longer than the deltas a vnode may hold
    /// ([`DurableOptions::max_deltas`]): a read of the vnode loads one shared block per run,
    /// as it would for that many deltas, and the blocks, shared by the neighbouring vnodes,
    /// are found in the block cache. Compacting such a load instead rewrote the whole table
    /// (32768 vnodes, lineitem scale 0.2: 58% more bytes written, 1.3x the replay's time).
    pub(super) ordered: bool,
}

/// A table's sealed layers up to an epoch, oldest first.
pub(super) type SealedLayers = Vec<(u64, Arc<Layer>)>;

/// Everything the store's lock guards.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) committed: Option<u64>,
    pub(super) meta: BTreeMap<String, String>,
    pub(super) staged_meta: BTreeMap<String, String>,
    /// Live files: named by the committed state, with how many runs name each.
    pub(super) files: LiveFiles,
    pub(super) tables: BTreeMap<String, TableState>,
    /// Bytes of sealed layers held in memory.
    pub(super) memory: usize,
    /// Set when a commit failed half way: the store must be reopened.
    pub(super) failed: Option<String>,
    /// Set when background compaction met rows the table's types cannot hold (the column and
    /// what is wrong): reported by every later call, as the bad input it is. The committed
    /// state is intact (the compaction installed nothing).
    pub(super) refused: Option<(String, String)>,
}

/// One table: its definition, the committed runs of each vnode, its sealed layers.
#[derive(Debug)]
pub(super) struct TableState {
    pub(super) desc: Arc<TableDesc>,
    pub(super) vnodes: Vec<VnodeRuns>,
    /// Shared, so a commit takes them without copying every vnode's entry.
    pub(super) sealed: BTreeMap<u64, Arc<Layer>>,
    /// Vnodes given committed deltas since compaction last looked at them: a compaction
    /// pass considers these only, not every vnode.
    pub(super) dirty: BTreeSet<u16>,
}

impl TableState {
    pub(super) fn new(desc: Arc<TableDesc>, vnodes: Vec<VnodeRuns>) -> Self {
        Self {
            desc,
            vnodes,
            sealed: BTreeMap::new(),
            dirty: BTreeSet::new(),
        }
    }
}

/// The live run files and how many committed runs name each: kept up to date by commits
/// and compaction installs, so neither walks every vnode to find which files are live.
#[derive(Debug, Default)]
pub(super) struct LiveFiles {
    pub(super) files: HashMap<u64, Arc<RunFile>>,
    pub(super) runs: HashMap<u64, usize>,
}

impl LiveFiles {
    pub(super) fn contains(&self, id: u64) -> bool {
        self.files.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.files.len()
    }

    /// One more run names `run.file`: it is live.
    pub(super) fn add(&mut self, run: &DiskRun) {
        let id = run.file.id();
        *self.runs.entry(id).or_default() += 1;
        self.files.entry(id).or_insert_with(|| {
            run.file.mark_live();
            run.file.clone()
        });
    }

    /// One run less names `run.file`: once none does, it is obsolete (removed from disk
    /// when the last reader lets go).
    pub(super) fn remove(&mut self, run: &DiskRun) -> Result<()> {
        let id = run.file.id();
        let n = self
            .runs
            .get_mut(&id)
            .ok_or_else(|| crate::error::internal!("run of file {id}, which is not live"))?;
        *n -= 1;
        if *n == 0 {
            self.runs.remove(&id);
            if let Some(file) = self.files.remove(&id) {
                file.mark_obsolete();
            }
        }
        Ok(())
    }

    /// The files that stop being live when `removed` runs go and `added` runs come.
    pub(super) fn dropped_by(&self, removed: &[&DiskRun], added: &[&DiskRun]) -> Vec<u64> {
        let mut delta: BTreeMap<u64, i64> = BTreeMap::new();
        for run in removed {
            *delta.entry(run.file.id()).or_default() -= 1;
        }
        for run in added {
            *delta.entry(run.file.id()).or_default() += 1;
        }
        delta
            .into_iter()
            .filter(|(id, d)| {
                let now = self.runs.get(id).copied().unwrap_or(0) as i64;
                now > 0 && now + d <= 0
            })
            .map(|(id, _)| id)
            .collect()
    }
}

/// The committed runs of a vnode.
#[derive(Debug, Clone, Default)]
pub(super) struct VnodeRuns {
    /// The base: no tombstones, one run, or (after a bulk load of ordered pieces) several
    /// that follow each other in key order without overlapping, read as one [`Chain`].
    pub(super) base: Vec<DiskRun>,
    /// Committed delta runs, oldest first, with their epochs.
    pub(super) deltas: Vec<(u64, DiskRun)>,
}

impl VnodeRuns {
    pub(super) fn sources(&self) -> Vec<Box<dyn RunList>> {
        let mut sources: Vec<Box<dyn RunList>> = Vec::with_capacity(1 + self.deltas.len());
        match self.base.as_slice() {
            [] => {}
            [base] => sources.push(Box::new(base.clone())),
            chain => sources.push(Box::new(Chain::new(chain.to_vec()))),
        }
        sources.extend(self.delta_sources(0));
        sources
    }

    pub(super) fn is_empty(&self) -> bool {
        self.base.is_empty() && self.deltas.is_empty()
    }

    /// The rows of the base.
    pub(super) fn base_rows(&self) -> u64 {
        self.base.iter().map(|b| b.span.rows).sum()
    }

    /// Every run, base first, with its manifest epoch (0 for the base).
    pub(super) fn entries(&self) -> Vec<RunEntry> {
        self.base
            .iter()
            .map(|b| run_entry(b, 0))
            .chain(self.deltas.iter().map(|(e, d)| run_entry(d, *e)))
            .collect()
    }

    /// Every run, base first.
    pub(super) fn runs(&self) -> impl Iterator<Item = &DiskRun> {
        self.base.iter().chain(self.deltas.iter().map(|(_, d)| d))
    }

    /// The committed deltas from `from` on, oldest first.
    pub(super) fn delta_sources(&self, from: usize) -> Vec<Box<dyn RunList>> {
        self.deltas[from..]
            .iter()
            .map(|(_, delta)| Box::new(delta.clone()) as Box<dyn RunList>)
            .collect()
    }
}

impl State {
    pub(super) fn check_ok(&self) -> Result<()> {
        match (&self.failed, &self.refused) {
            (Some(why), _) => Err(Error::StoreFailed(why.clone())),
            (None, Some((column, message))) => Err(Error::InvalidValue {
                column: column.clone(),
                message: message.clone(),
            }),
            (None, None) => Ok(()),
        }
    }

    pub(super) fn table(&self, name: &str) -> Result<&TableState> {
        known(self.tables.get(name), name)
    }

    /// The manifest of this state's committed part.
    pub(super) fn manifest(&self, next_file_id: u64) -> Result<Manifest> {
        let mut m = Manifest::empty();
        m.committed_epoch = self.committed;
        m.next_file_id = next_file_id;
        m.meta = self.meta.clone();
        let mut ids: Vec<u64> = self.files.files.keys().copied().collect();
        ids.sort_unstable();
        m.files = ids
            .into_iter()
            .map(|id| FileEntry::new(id, self.files.files[&id].check()))
            .collect();
        for table in self.tables.values() {
            let mut entry = TableEntry::of(&table.desc)?;
            for runs in &table.vnodes {
                entry.runs.extend(runs.entries());
            }
            m.tables.push(entry);
        }
        Ok(m)
    }
}

pub(super) fn run_entry(run: &DiskRun, epoch: u64) -> RunEntry {
    RunEntry {
        vnode: run.span.vnode.get(),
        file: run.file.id(),
        first: run.span.first,
        count: run.span.count,
        rows: run.span.rows,
        epoch,
    }
}
