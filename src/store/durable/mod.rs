//! The durable, embedded store: sorted Arrow IPC run files, a manifest with a log of
//! changes, background compaction, memory bounded by a budget (DESIGN section 6.2).
//!
//! ```text
//!  handle.write ──▶ pending (memory) ──spill when over budget──▶ uncommitted run file
//!  handle.seal(e) ──▶ sealed layer e: per vnode, runs in memory or spilled, oldest first
//!  store.commit(c):  1. layers <= c: memory runs written to one run file per table, fsync
//!                    2. a record of what changed (epoch c, job values, new files, the runs
//!                       each touched vnode gains) appended to LOG-<g>, fsync  ◀── commit
//!                       point; or, once the log would outgrow LOG_GROWTH manifests, the
//!                       fresh LOG-<g + 1> holding its header (fsync), then the whole
//!                       state as MANIFEST.tmp (generation g + 1), fsync, rename over
//!                       MANIFEST, fsync the directory  ◀── commit point; then LOG-<g>
//!                       is removed
//!                    3. the layers become committed delta runs (an epoch's runs over
//!                       an empty vnode, inserts in key order without overlap, become its
//!                       base as they are: an ordered bulk load is never compacted);
//!                       memory is freed
//!  compactor thread: per dirty vnode, base + committed deltas ──merge──▶ new base run (a
//!                    new file), installed with a record replacing those vnodes' runs;
//!                    replaced files are removed once no reader holds them.
//!  open(dir):        lock dir/LOCK, read MANIFEST and apply the valid records of its
//!                    LOG-<g>, check every live file (size, footer and header checksums),
//!                    then remove what the committed state does not name.
//! ```
//!
//! A commit costs what it changed: its record names only the vnodes it touched, and its
//! in-memory install updates only those (live files are reference-counted, compaction
//! looks only at vnodes given deltas since its last pass). The manifest's rewrite costs
//! the whole state, but happens once the log has grown [`LOG_GROWTH`] times as large as the
//! manifest, so it adds a constant factor to the log's bytes. The formats, byte by byte, are in
//! `durable/manifest.rs` and `durable/log.rs`.
//!
//! Reads merge, per vnode, the base, the committed deltas and the visible sealed layers with
//! the same [`MergeReader`] as the in-memory store; committed runs are read block by block
//! from disk (each block checked against its CRC), so memory holds one block per source.
//!
//! Invariants:
//! - Only the manifest and the valid records of its log decide what is committed; run files
//!   are immutable once written and live while the committed state names them or a reader
//!   holds them. A record names only files already fsynced, with their directory entries.
//! - A crash at any point leaves the previous or the new committed state, each naming only
//!   fsynced files: reopening yields exactly the last committed state (a torn last record
//!   was never acknowledged, and is ignored).
//! - After an I/O error during a commit the outcome on disk is unknown: the store refuses
//!   every later operation until it is reopened (which tells which state won).

mod cache;
mod compaction;
mod file;
mod lock;
mod log;
mod manifest;
mod record;
mod stored;

pub use self::lock::{DirLock, LOCK_FILE};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;
use hashbrown::HashMap;

use self::file::{Chain, DiskRun, MIN_BLOCK_ROWS, RunFile, RunFileWriter, RunSpan};
use self::log::LogWriter;
use self::manifest::{MANIFEST_FILE, Manifest, TableEntry};
use self::record::{
    EditKind, FileEntry, LogRecord, RunEntry, TableEdit, VnodeEdit, log_file_name, log_generation,
};
use super::io::{RealIo, StorageIo};
use super::run::{MergeReader, Run, RunList, Views, build_pending_sliced_runs};
use super::{KeyedBatch, ScanRows, SnapshotScan, StateStore, StateTable, check_seal, check_write};
use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::key::Position;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// A bulk load's piece is the memory budget divided by this: one piece is filled while the
/// one before it is written, so the load holds about the budget. Half rather than a quarter
/// (lineitem scale 1: 12 pieces instead of 25, each vnode's base a chain of half as many
/// runs with half as many partial blocks): 3 to 10% less wall time in vnode and merged
/// order, 12 to 22 MB more peak memory (`docs/benchmarks-history.md`).
const LOAD_PIECE: usize = 2;

/// Settings of a [`DurableStore`].
#[derive(Debug, Clone)]
pub struct DurableOptions {
    /// Bytes of uncommitted data kept in memory (sealed layers and write buffers) before
    /// layers are spilled to run files.
    pub memory_budget: usize,
    /// Compact a vnode (rewrite its base) once it has this many committed delta runs (or
    /// earlier, once its deltas hold a quarter of its base's rows and a block's worth).
    pub max_deltas: usize,
    /// Merge a vnode's delta runs into one once it has this many (and no full compaction is
    /// due). A scan holds one loaded block per run it reads, so this bounds its memory
    /// without rewriting the base. At least 2.
    pub merge_deltas: usize,
    /// When compaction runs.
    pub compaction: Compaction,
    /// Bytes of decoded blocks kept for re-reads (a backfill re-opens its scans at every
    /// barrier, at the blocks it stopped in).
    pub block_cache: usize,
}

/// When a [`DurableStore`] compacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compaction {
    /// On a background thread woken after each commit: barriers never wait on it.
    #[default]
    Background,
    /// At the end of each commit, on the committing thread: deterministic, for tests that
    /// count I/O operations.
    Inline,
    /// Only when [`DurableStore::compact`] is called.
    Manual,
}

impl Default for DurableOptions {
    fn default() -> Self {
        Self {
            memory_budget: 256 << 20,
            max_deltas: 24,
            merge_deltas: 8,
            compaction: Compaction::Background,
            block_cache: 64 << 20,
        }
    }
}

/// The durable store. Clones share the same state; the directory is locked while any clone
/// lives.
#[derive(Debug, Clone)]
pub struct DurableStore {
    shared: Arc<Shared>,
    /// The background compactor, stopped and joined when the last clone goes.
    compactor: Arc<Mutex<Option<compaction::Compactor>>>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    io: Arc<dyn StorageIo>,
    options: DurableOptions,
    state: RwLock<State>,
    /// Serializes everything that writes a manifest (commits, compaction installs, table
    /// creation), so manifests are written in the order their states were built.
    manifest_lock: Mutex<()>,
    /// One compaction pass at a time (background or on demand): a pass's inputs change only
    /// by commits appending deltas.
    compaction_lock: Mutex<()>,
    next_file_id: AtomicU64,
    cache: Arc<cache::BlockCache>,
    /// The manifest log; locked under `manifest_lock`.
    log: Mutex<LogState>,
    _lock: DirLock,
}

/// Where commits go: the log of the current generation (see [`log`]).
#[derive(Debug)]
struct LogState {
    /// The generation of the committed manifest and of its log.
    generation: u64,
    /// The open log; `None` until the first rewrite of this process (a log found on open is
    /// read, never appended to: the first commit rewrites the manifest).
    writer: Option<LogWriter>,
    /// The size of the committed manifest: the log is folded into a new manifest once it
    /// would outgrow [`LOG_GROWTH`] times that.
    manifest_len: u64,
}

/// How many times the manifest's size the log may grow to before the next commit rewrites
/// the manifest. A rewrite costs the whole state (at 32768 vnodes, 19 MB of JSON for
/// lineitem at scale 0.2, where a commit's record is about 1 MB); an open reads the log
/// whole. At 1, a 50-epoch replay at 32768 vnodes rewrote its manifest 5 times, a tenth of
/// its commit time; at 4, once or twice, and an open reads at most 4 manifests' worth of
/// records (binary, about half the JSON's bytes per run).
const LOG_GROWTH: u64 = 4;

/// One run of a sealed layer: still in memory, or spilled to an uncommitted file.
#[derive(Debug, Clone)]
enum LayerRun {
    /// A run and its share of memory (runs of one seal are slices of one batch).
    Memory(Arc<Run>, usize),
    Disk(DiskRun),
}

impl LayerRun {
    fn list(&self) -> Box<dyn RunList> {
        match self {
            LayerRun::Memory(run, _) => Box::new(vec![run.clone()]),
            LayerRun::Disk(run) => Box::new(run.clone()),
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            LayerRun::Memory(_, bytes) => *bytes,
            LayerRun::Disk(_) => 0,
        }
    }
}

/// One epoch's changes of a table, per vnode.
type Layer = HashMap<VirtualNode, VnodeLayer>;

/// One epoch's changes of a vnode.
#[derive(Debug, Clone, Default)]
struct VnodeLayer {
    /// Its runs, oldest first.
    runs: Vec<LayerRun>,
    /// The runs hold no tombstone and follow each other in key order without overlapping:
    /// committed over an empty vnode, they become its base as they are, so a bulk load of
    /// ordered rows is written once, not written and compacted. A chain of short runs (each
    /// a range of a batch packed with other vnodes' runs: a load spread over many vnodes)
    /// qualifies while it is no longer than the deltas a vnode may hold
    /// ([`DurableOptions::max_deltas`]): a read of the vnode loads one shared block per run,
    /// as it would for that many deltas, and the blocks, shared by the neighbouring vnodes,
    /// are found in the block cache. Compacting such a load instead rewrote the whole table
    /// (32768 vnodes, lineitem scale 0.2: 58% more bytes written, 1.3x the replay's time).
    ordered: bool,
}

/// This epoch's runs of a vnode so far, while they are ordered (see [`VnodeLayer::ordered`]).
#[derive(Debug)]
struct Ordered {
    /// The last key of the runs.
    last: Vec<u8>,
    runs: usize,
    /// Some run is shorter than a block ([`MIN_BLOCK_ROWS`]).
    short: bool,
}
/// A table's sealed layers up to an epoch, oldest first.
type SealedLayers = Vec<(u64, Arc<Layer>)>;
/// A committed layer: per vnode, its runs on disk, oldest first, and whether they are
/// ordered (see [`VnodeLayer::ordered`]).
type CommittedLayer = Vec<(VirtualNode, Vec<DiskRun>, bool)>;

/// What a commit gives one vnode: runs with their epochs, as deltas or as its base.
#[derive(Debug)]
struct VnodeGain {
    runs: Vec<(u64, DiskRun)>,
    as_base: bool,
}

impl VnodeGain {
    /// The log's edit: deltas appended, or the (empty) run list replaced by the base.
    fn edit(&self, vnode: VirtualNode) -> VnodeEdit {
        let (kind, runs) = if self.as_base {
            let base = self.runs.iter().map(|(_, run)| run_entry(run, 0));
            (EditKind::Replace, base.collect())
        } else {
            let deltas = self.runs.iter().map(|(e, run)| run_entry(run, *e));
            (EditKind::Append, deltas.collect())
        };
        VnodeEdit {
            vnode: vnode.get(),
            kind,
            runs,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    committed: Option<u64>,
    meta: BTreeMap<String, String>,
    staged_meta: BTreeMap<String, String>,
    /// Live files: named by the committed state, with how many runs name each.
    files: LiveFiles,
    tables: BTreeMap<String, TableState>,
    /// Bytes of sealed layers held in memory.
    memory: usize,
    /// Set when a commit failed half way: the store must be reopened.
    failed: Option<String>,
    /// Set when background compaction met rows the table's types cannot hold (the column and
    /// what is wrong): reported by every later call, as the bad input it is. The committed
    /// state is intact (the compaction installed nothing).
    refused: Option<(String, String)>,
}

#[derive(Debug)]
struct TableState {
    desc: Arc<TableDesc>,
    vnodes: Vec<VnodeRuns>,
    /// Shared, so a commit takes them without copying every vnode's entry.
    sealed: BTreeMap<u64, Arc<Layer>>,
    /// Vnodes given committed deltas since compaction last looked at them: a compaction
    /// pass considers these only, not every vnode.
    dirty: BTreeSet<u16>,
}

impl TableState {
    fn new(desc: Arc<TableDesc>, vnodes: Vec<VnodeRuns>) -> Self {
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
struct LiveFiles {
    files: HashMap<u64, Arc<RunFile>>,
    runs: HashMap<u64, usize>,
}

impl LiveFiles {
    fn contains(&self, id: u64) -> bool {
        self.files.contains_key(&id)
    }

    fn len(&self) -> usize {
        self.files.len()
    }

    /// One more run names `run.file`: it is live.
    fn add(&mut self, run: &DiskRun) {
        let id = run.file.id();
        *self.runs.entry(id).or_default() += 1;
        self.files.entry(id).or_insert_with(|| {
            run.file.mark_live();
            run.file.clone()
        });
    }

    /// One run less names `run.file`: once none does, it is obsolete (removed from disk
    /// when the last reader lets go).
    fn remove(&mut self, run: &DiskRun) -> Result<()> {
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
    fn dropped_by(&self, removed: &[&DiskRun], added: &[&DiskRun]) -> Vec<u64> {
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
struct VnodeRuns {
    /// The base: no tombstones, one run, or (after a bulk load of ordered pieces) several
    /// that follow each other in key order without overlapping, read as one [`Chain`].
    base: Vec<DiskRun>,
    /// Committed delta runs, oldest first, with their epochs.
    deltas: Vec<(u64, DiskRun)>,
}

impl VnodeRuns {
    fn sources(&self) -> Vec<Box<dyn RunList>> {
        let mut sources: Vec<Box<dyn RunList>> = Vec::with_capacity(1 + self.deltas.len());
        match self.base.as_slice() {
            [] => {}
            [base] => sources.push(Box::new(base.clone())),
            chain => sources.push(Box::new(Chain::new(chain.to_vec()))),
        }
        sources.extend(self.delta_sources(0));
        sources
    }

    fn is_empty(&self) -> bool {
        self.base.is_empty() && self.deltas.is_empty()
    }

    /// The rows of the base.
    fn base_rows(&self) -> u64 {
        self.base.iter().map(|b| b.span.rows).sum()
    }

    /// Every run, base first, with its manifest epoch (0 for the base).
    fn entries(&self) -> Vec<RunEntry> {
        self.base
            .iter()
            .map(|b| run_entry(b, 0))
            .chain(self.deltas.iter().map(|(e, d)| run_entry(d, *e)))
            .collect()
    }

    /// Every run, base first.
    fn runs(&self) -> impl Iterator<Item = &DiskRun> {
        self.base.iter().chain(self.deltas.iter().map(|(_, d)| d))
    }

    /// The committed deltas from `from` on, oldest first.
    fn delta_sources(&self, from: usize) -> Vec<Box<dyn RunList>> {
        self.deltas[from..]
            .iter()
            .map(|(_, delta)| Box::new(delta.clone()) as Box<dyn RunList>)
            .collect()
    }
}

impl State {
    fn check_ok(&self) -> Result<()> {
        match (&self.failed, &self.refused) {
            (Some(why), _) => Err(Error::StoreFailed(why.clone())),
            (None, Some((column, message))) => Err(Error::InvalidValue {
                column: column.clone(),
                message: message.clone(),
            }),
            (None, None) => Ok(()),
        }
    }

    fn table(&self, name: &str) -> Result<&TableState> {
        self.tables
            .get(name)
            .ok_or_else(|| Error::UnknownTable(name.to_string()))
    }

    fn check_read_epoch(&self, table: &str, epoch: u64) -> Result<()> {
        match self.committed {
            Some(committed) if epoch < committed => Err(Error::StaleRead {
                table: table.to_string(),
                epoch,
                committed,
            }),
            _ => Ok(()),
        }
    }

    /// The manifest of this state's committed part.
    fn manifest(&self, next_file_id: u64) -> Result<Manifest> {
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

fn run_entry(run: &DiskRun, epoch: u64) -> RunEntry {
    RunEntry {
        vnode: run.span.vnode.get(),
        file: run.file.id(),
        first: run.span.first,
        count: run.span.count,
        rows: run.span.rows,
        epoch,
    }
}

/// Empties the store in `dir` (if any), crash-safely: an empty manifest replaces the old one
/// first, then the run files go. Files the store does not own are left alone.
pub fn destroy(io: &dyn StorageIo, dir: &Path) -> Result<()> {
    if !io.exists(dir)? {
        return Ok(());
    }
    let _lock = DirLock::acquire(dir)?;
    let names = io.list(dir)?;
    // Generations only grow: no log left behind by a crash here can pass for the new one's.
    let newest = names
        .iter()
        .filter_map(|n| log_generation(n))
        .chain(
            Manifest::load(io, dir)
                .ok()
                .flatten()
                .map(|m| m.log_generation),
        )
        .max()
        .unwrap_or(0);
    let next = newest + 1;
    // The new manifest's log is durable before the manifest, as after any rewrite.
    drop(LogWriter::create(io, dir, next)?);
    let mut empty = Manifest::empty();
    empty.log_generation = next;
    empty.store(io, dir)?;
    for name in names {
        if manifest::run_file_id(&name).is_some()
            || name == "MANIFEST.tmp"
            || log_generation(&name).is_some_and(|g| g != next)
        {
            io.remove(&dir.join(name))?;
        }
    }
    io.sync_dir(dir)?;
    Ok(())
}

/// The error for a directory that holds `name` (a run file, or a log with records) but no
/// manifest.
fn missing_manifest(dir: &Path, name: &str) -> Error {
    Error::CorruptState {
        context: dir.join(MANIFEST_FILE).display().to_string(),
        message: format!(
            "missing, but the directory holds files of a store ({name}): refusing to treat it \
             as a new store"
        ),
    }
}

impl DurableStore {
    /// Opens (or creates) the store in `dir` on the real file system.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with(dir, RealIo::shared(), DurableOptions::default())
    }

    /// Opens (or creates) the store in `dir` through `io`. See the module docs for what is
    /// checked; nothing is changed on disk before every check passed.
    pub fn open_with(
        dir: impl Into<PathBuf>,
        io: Arc<dyn StorageIo>,
        options: DurableOptions,
    ) -> Result<Self> {
        let dir = dir.into();
        io.create_dir_all(&dir)?;
        let lock = DirLock::acquire(&dir)?;
        let block_cache = cache::BlockCache::new(options.block_cache);
        let names = io.list(&dir)?;
        let loaded = Manifest::load(io.as_ref(), &dir)?;
        if loaded.is_none()
            && let Some(name) = names.iter().find(|n| manifest::run_file_id(n).is_some())
        {
            return Err(missing_manifest(&dir, name));
        }
        let has_manifest = loaded.is_some();
        let mut manifest = loaded.unwrap_or_else(Manifest::empty);
        let generation = manifest.log_generation;
        // Logs the manifest does not name yet: a rewrite's, created before its manifest.
        let mut unfinished = Vec::new();
        for name in &names {
            let Some(g) = log_generation(name) else {
                continue;
            };
            if has_manifest && g <= generation {
                continue;
            }
            if log::is_unfinished_rewrite(io.as_ref(), &dir.join(name))? {
                unfinished.push(name.clone());
            } else if !has_manifest {
                return Err(missing_manifest(&dir, name));
            } else {
                return Err(Error::CorruptState {
                    context: dir.join(name).display().to_string(),
                    message: format!(
                        "a log newer than the manifest (of generation {generation}) holds \
                         records: the manifest was replaced by an older one"
                    ),
                });
            }
        }
        if has_manifest {
            let log_path = dir.join(log_file_name(generation));
            let records = log::read_log(io.as_ref(), &dir, generation, manifest.log_presence())?;
            manifest.apply(&records, &log_path)?;
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let mut state = State {
            committed: manifest.committed_epoch,
            meta: manifest.meta.clone(),
            ..State::default()
        };
        let mut descs = Vec::with_capacity(manifest.tables.len());
        for entry in &manifest.tables {
            descs.push(Arc::new(entry.desc(&manifest_path)?));
        }
        // Files are checked against the table whose runs they hold.
        let mut owner: HashMap<u64, usize> = HashMap::new();
        for (t, entry) in manifest.tables.iter().enumerate() {
            for run in &entry.runs {
                owner.insert(run.file, t);
            }
        }
        let opened: Vec<Result<(u64, Arc<RunFile>)>> = {
            use rayon::prelude::*;
            manifest
                .files
                .par_iter()
                .map(|f| {
                    let t = owner
                        .get(&f.id)
                        .copied()
                        .ok_or_else(|| Error::CorruptState {
                            context: manifest_path.display().to_string(),
                            message: format!("file {} holds no run of any table", f.id),
                        })?;
                    let file = RunFile::open(
                        io.clone(),
                        Manifest::file_path(&dir, f.id),
                        f.id,
                        descs[t].clone(),
                        f.check(),
                    )?
                    .with_cache(Some(block_cache.clone()));
                    Ok((f.id, Arc::new(file)))
                })
                .collect()
        };
        for result in opened {
            let (id, file) = result?;
            state.files.files.insert(id, file);
        }
        for (entry, desc) in manifest.tables.iter().zip(descs) {
            let mut vnodes = vec![VnodeRuns::default(); desc.vnode_count().get()];
            for run in &entry.runs {
                let span = run.span();
                let file = state
                    .files
                    .files
                    .get(&run.file)
                    .ok_or_else(|| Error::CorruptState {
                        context: manifest_path.display().to_string(),
                        message: format!("table `{}` names unknown file {}", entry.name, run.file),
                    })?;
                file.check_span(&span)?;
                let slot =
                    vnodes
                        .get_mut(span.vnode.index())
                        .ok_or_else(|| Error::CorruptState {
                            context: manifest_path.display().to_string(),
                            message: format!("vnode {} out of range", span.vnode),
                        })?;
                let disk = DiskRun {
                    file: file.clone(),
                    span,
                };
                *state.files.runs.entry(run.file).or_default() += 1;
                if run.epoch == 0 {
                    // A base of several runs must be in key order (their last keys rise).
                    let out_of_order = slot.base.last().is_some_and(|prev| {
                        let last = |r: &DiskRun| {
                            r.len()
                                .checked_sub(1)
                                .and_then(|i| r.last_key(i).map(<[u8]>::to_vec))
                        };
                        last(prev) >= last(&disk)
                    });
                    if !slot.deltas.is_empty() || out_of_order {
                        return Err(Error::CorruptState {
                            context: manifest_path.display().to_string(),
                            message: format!(
                                "vnode {} of `{}`: misplaced base run",
                                span.vnode, entry.name
                            ),
                        });
                    }
                    slot.base.push(disk);
                } else {
                    slot.deltas.push((run.epoch, disk));
                }
            }
            let mut table = TableState::new(desc, vnodes);
            // Deltas left by an earlier run are due for a look.
            table.dirty = (0..table.vnodes.len())
                .filter(|&v| !table.vnodes[v].deltas.is_empty())
                .map(|v| v as u16)
                .collect();
            state.tables.insert(entry.name.clone(), table);
        }
        // Everything checks out: only now remove what the manifest does not name.
        for name in &names {
            let unlisted = match (manifest::run_file_id(name), log_generation(name)) {
                (Some(id), _) => !state.files.contains(id),
                (None, Some(g)) => g < generation || unfinished.contains(name),
                (None, None) => name == "MANIFEST.tmp",
            };
            if unlisted {
                io.remove(&dir.join(name))?;
            }
        }
        let next_id = manifest
            .next_file_id
            .max(state.files.files.keys().max().map_or(0, |m| m + 1));
        let store = Self {
            shared: Arc::new(Shared {
                dir,
                io,
                options,
                state: RwLock::new(state),
                manifest_lock: Mutex::new(()),
                compaction_lock: Mutex::new(()),
                cache: block_cache.clone(),
                next_file_id: AtomicU64::new(next_id),
                log: Mutex::new(LogState {
                    generation,
                    writer: None,
                    manifest_len: 0,
                }),
                _lock: lock,
            }),
            compactor: Arc::new(Mutex::new(None)),
        };
        if store.shared.options.compaction == Compaction::Background {
            let compactor = compaction::Compactor::start(Arc::downgrade(&store.shared))?;
            *store.lock_compactor()? = Some(compactor);
            store.wake_compactor();
        }
        Ok(store)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The definition of a table, if it exists.
    pub fn table_desc(&self, name: &str) -> Result<Option<Arc<TableDesc>>> {
        Ok(self.read()?.tables.get(name).map(|t| t.desc.clone()))
    }

    /// Live run files (for tests and reports).
    pub fn live_files(&self) -> Result<usize> {
        Ok(self.read()?.files.len())
    }

    fn read(&self) -> Result<RwLockReadGuard<'_, State>> {
        self.shared.read()
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, State>> {
        self.shared.write()
    }

    fn lock_compactor(&self) -> Result<MutexGuard<'_, Option<compaction::Compactor>>> {
        self.compactor
            .lock()
            .map_err(|_| Error::Internal("compactor lock poisoned".into()))
    }

    fn wake_compactor(&self) {
        if let Ok(c) = self.compactor.lock()
            && let Some(c) = c.as_ref()
        {
            c.wake();
        }
    }

    fn open_handle(
        &self,
        name: &str,
        vnodes: VnodeBitmap,
        replicated: bool,
    ) -> Result<DurableTable> {
        let state = self.read()?;
        state.check_ok()?;
        let desc = state.table(name)?.desc.clone();
        if vnodes.count() != desc.vnode_count() {
            return Err(Error::InvalidConfig(format!(
                "a handle on {} vnodes for table `{name}` of {} vnodes",
                vnodes.count().get(),
                desc.vnode_count().get()
            )));
        }
        Ok(DurableTable {
            store: self.clone(),
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
        })
    }
}

impl Shared {
    fn read(&self) -> Result<RwLockReadGuard<'_, State>> {
        self.state
            .read()
            .map_err(|_| Error::Internal("durable store lock poisoned".into()))
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, State>> {
        self.state
            .write()
            .map_err(|_| Error::Internal("durable store lock poisoned".into()))
    }

    fn lock_manifest(&self) -> Result<MutexGuard<'_, ()>> {
        self.manifest_lock
            .lock()
            .map_err(|_| Error::Internal("manifest lock poisoned".into()))
    }

    fn new_file(&self, desc: &Arc<TableDesc>) -> Result<RunFileWriter> {
        let id = self.next_file_id.fetch_add(1, Ordering::SeqCst);
        RunFileWriter::create(
            self.io.clone(),
            Manifest::file_path(&self.dir, id),
            id,
            desc.clone(),
        )
        .map(|w| w.with_cache(Some(self.cache.clone())))
    }

    /// Writes runs of one table to a new file; the file is removed again unless a manifest
    /// comes to name it.
    fn write_runs<'a>(
        &self,
        desc: &Arc<TableDesc>,
        runs: impl IntoIterator<Item = (VirtualNode, &'a Run)>,
    ) -> Result<(Arc<RunFile>, Vec<RunSpan>)> {
        let mut writer = self.new_file(desc)?;
        for (vnode, run) in runs {
            writer.write_run(vnode, run)?;
        }
        let (file, _, spans) = writer.finish()?;
        file.mark_obsolete();
        Ok((file, spans))
    }

    fn lock_log(&self) -> Result<MutexGuard<'_, LogState>> {
        self.log
            .lock()
            .map_err(|_| Error::Internal("manifest log lock poisoned".into()))
    }

    /// Makes `record` (changes to the committed state) durable: appended to the log, or
    /// folded into a new manifest when the log would outgrow [`LOG_GROWTH`] manifests. Called
    /// under the manifest lock, before the state changes in memory. On failure the store is marked
    /// failed and `keep` (files the record names) stay on disk: the record may have become
    /// durable anyway (reopening removes them if it did not).
    fn persist(&self, record: &LogRecord, keep: &[Arc<RunFile>]) -> Result<()> {
        let result = self.lock_log().and_then(|mut guard| {
            let log = &mut *guard;
            let body = record.encode_body()?;
            if let Some(writer) = log.writer.as_mut()
                && writer.len() + log::framed_len(body.len()) <= LOG_GROWTH * log.manifest_len
            {
                if !record.added.is_empty() {
                    // The new files' directory entries are durable before a record names them.
                    self.io.sync_dir(&self.dir)?;
                }
                return writer.append(&body);
            }
            let mut manifest = self
                .read()?
                .manifest(self.next_file_id.load(Ordering::SeqCst))?;
            let path = self.dir.join(log_file_name(log.generation));
            manifest.apply(std::slice::from_ref(record), &path)?;
            self.rewrite(log, manifest)
        });
        self.fail_on_error(result, keep)
    }

    /// Starts the next generation's log, writes `manifest` as that generation's (the commit
    /// point: the log's header is durable before the manifest names it) and removes the
    /// previous log.
    fn rewrite(&self, log: &mut LogState, mut manifest: Manifest) -> Result<()> {
        let old = log.generation;
        let next = old + 1;
        manifest.log_generation = next;
        log.writer = None;
        let writer = LogWriter::create(self.io.as_ref(), &self.dir, next)?;
        log.manifest_len = manifest.store(self.io.as_ref(), &self.dir)?;
        log.generation = next;
        log.writer = Some(writer);
        let old = self.dir.join(log_file_name(old));
        if self.io.exists(&old).unwrap_or(false) {
            // Best effort: the next open removes it otherwise.
            let _ = self.io.remove(&old);
        }
        Ok(())
    }

    /// Marks the store failed if `result` is an error (the outcome on disk is unknown), and
    /// keeps `keep` on disk.
    fn fail_on_error(&self, result: Result<()>, keep: &[Arc<RunFile>]) -> Result<()> {
        if let Err(e) = &result {
            for file in keep {
                file.mark_live();
            }
            if let Ok(mut state) = self.write()
                && state.failed.is_none()
            {
                state.failed = Some(format!(
                    "making a commit durable in {} failed ({e}); reopen the store",
                    self.dir.display()
                ));
            }
        }
        result
    }
}

impl StateStore for DurableStore {
    type Table = DurableTable;

    fn create_table(&self, desc: TableDesc) -> Result<Arc<TableDesc>> {
        if let Some(field) = desc.schema().fields().iter().find(|f| {
            f.name() == file::DELETED_COLUMN
                || matches!(f.data_type(), arrow_schema::DataType::Dictionary(_, v)
                    if matches!(v.as_ref(), arrow_schema::DataType::Dictionary(..)))
        }) {
            return Err(Error::UnsupportedType {
                column: field.name().clone(),
                data_type: field.data_type().clone(),
                usage: "the durable store (nested dictionaries and the name `__deleted` are not supported)",
            });
        }
        let _m = self.shared.lock_manifest()?;
        let desc = Arc::new(desc);
        let manifest = {
            let state = self.read()?;
            state.check_ok()?;
            if state.tables.contains_key(desc.name()) {
                return Err(Error::TableExists(desc.name().to_string()));
            }
            let mut m = state.manifest(self.shared.next_file_id.load(Ordering::SeqCst))?;
            m.tables.push(TableEntry::of(&desc)?);
            m
        };
        let result = self
            .shared
            .lock_log()
            .and_then(|mut log| self.shared.rewrite(&mut log, manifest));
        self.shared.fail_on_error(result, &[])?;
        self.write()?.tables.insert(
            desc.name().to_string(),
            TableState::new(
                desc.clone(),
                vec![VnodeRuns::default(); desc.vnode_count().get()],
            ),
        );
        Ok(desc)
    }

    fn table(&self, name: &str, vnodes: VnodeBitmap) -> Result<DurableTable> {
        self.open_handle(name, vnodes, false)
    }

    fn replicated_table(&self, name: &str, vnodes: VnodeBitmap) -> Result<DurableTable> {
        self.open_handle(name, vnodes, true)
    }

    fn commit(&self, epoch: u64) -> Result<()> {
        let shared = &self.shared;
        let manifest_guard = shared.lock_manifest()?;
        // 1. What to commit: every table's layers up to `epoch`.
        let layers: Vec<(String, Arc<TableDesc>, SealedLayers)> = {
            let state = self.read()?;
            state.check_ok()?;
            if let Some(committed) = state.committed
                && epoch <= committed
            {
                return Err(Error::EpochOrder {
                    context: "store commit".into(),
                    epoch,
                    previous: committed,
                });
            }
            state
                .tables
                .iter()
                .map(|(name, t)| {
                    let layers = t
                        .sealed
                        .range(..=epoch)
                        .map(|(e, l)| (*e, l.clone()))
                        .collect();
                    (name.clone(), t.desc.clone(), layers)
                })
                .collect()
        };
        // 2. Memory runs go to one new file per table (no lock held: handles keep sealing
        //    later epochs meanwhile). Each memory run becomes a disk run in place.
        let mut committed_layers: Vec<(String, Vec<(u64, CommittedLayer)>)> = Vec::new();
        for (name, desc, table_layers) in layers {
            // Each layer's vnodes in order, sorted once.
            let sorted: Vec<(u64, Vec<(&VirtualNode, &VnodeLayer)>)> = (table_layers.iter())
                .map(|(e, layer)| {
                    let mut vnodes: Vec<_> = layer.iter().collect();
                    vnodes.sort_unstable_by_key(|(vnode, _)| **vnode);
                    (*e, vnodes)
                })
                .collect();
            let mut memory: Vec<(VirtualNode, &Run)> = Vec::new();
            for (vnode, layer) in sorted.iter().flat_map(|(_, vnodes)| vnodes) {
                for run in &layer.runs {
                    if let LayerRun::Memory(run, _) = run
                        && run.len() > 0
                    {
                        memory.push((**vnode, run));
                    }
                }
            }
            let mut written = if memory.is_empty() {
                Vec::new().into_iter()
            } else {
                let (file, spans) =
                    shared.write_runs(&desc, memory.iter().map(|(v, r)| (*v, *r)))?;
                spans
                    .into_iter()
                    .map(|span| DiskRun {
                        file: file.clone(),
                        span,
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
            };
            let mut out = Vec::with_capacity(sorted.len());
            for (e, vnodes) in &sorted {
                let mut per_vnode = Vec::with_capacity(vnodes.len());
                for (vnode, layer) in vnodes {
                    let mut runs = Vec::with_capacity(layer.runs.len());
                    for run in &layer.runs {
                        match run {
                            LayerRun::Disk(d) => runs.push(d.clone()),
                            LayerRun::Memory(r, _) if r.len() > 0 => {
                                let d = written.next().ok_or_else(|| {
                                    Error::Internal("a committed run was not written".into())
                                })?;
                                runs.push(d);
                            }
                            LayerRun::Memory(..) => {}
                        }
                    }
                    per_vnode.push((**vnode, runs, layer.ordered));
                }
                out.push((*e, per_vnode));
            }
            committed_layers.push((name, out));
        }
        // 3. The record of the commit: the runs each vnode gains, the files that become
        //    live, the job values; durable with one append (the commit point). Ordered
        //    runs of one epoch over an empty vnode become its base (see `VnodeLayer`).
        let (record, keep, gains) = {
            let state = self.read()?;
            let mut added = Vec::new();
            let mut keep: Vec<Arc<RunFile>> = Vec::new();
            let mut edits = Vec::new();
            let mut gains = Vec::with_capacity(committed_layers.len());
            for (name, layers) in committed_layers {
                let current = &state.table(&name)?.vnodes;
                // Every layer's vnodes, by vnode then epoch (each layer is in vnode order
                // and they come oldest first: a stable sort, one pass for a single layer).
                let mut all: Vec<(u64, VirtualNode, Vec<DiskRun>, bool)> = (layers.into_iter())
                    .flat_map(|(e, per)| per.into_iter().map(move |(v, r, o)| (e, v, r, o)))
                    .filter(|(_, _, runs, _)| !runs.is_empty())
                    .collect();
                all.sort_by_key(|(_, vnode, _, _)| *vnode);
                let mut per_vnode: Vec<(VirtualNode, VnodeGain)> = Vec::new();
                for (e, vnode, runs, ordered) in all {
                    for run in &runs {
                        let id = run.file.id();
                        if !state.files.contains(id) && !keep.iter().any(|f| f.id() == id) {
                            added.push(FileEntry::new(id, run.file.check()));
                            keep.push(run.file.clone());
                        }
                    }
                    let runs = runs.into_iter().map(|run| (e, run));
                    match per_vnode.last_mut() {
                        Some((last, gain)) if *last == vnode => {
                            // Runs of two epochs: deltas, oldest first.
                            gain.as_base = false;
                            gain.runs.extend(runs);
                        }
                        _ => {
                            let as_base = ordered && current[vnode.index()].is_empty();
                            let runs = runs.collect();
                            per_vnode.push((vnode, VnodeGain { runs, as_base }));
                        }
                    }
                }
                if !per_vnode.is_empty() {
                    edits.push(TableEdit {
                        table: name.clone(),
                        vnodes: per_vnode
                            .iter()
                            .map(|(vnode, gain)| gain.edit(*vnode))
                            .collect(),
                    });
                }
                gains.push((name, per_vnode));
            }
            let record = LogRecord {
                committed_epoch: Some(epoch),
                next_file_id: shared.next_file_id.load(Ordering::SeqCst),
                meta: state
                    .staged_meta
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                added,
                removed: Vec::new(),
                tables: edits,
            };
            (record, keep, gains)
        };
        shared.persist(&record, &keep)?;
        // 4. Committed: install it.
        {
            let mut state = self.write()?;
            let state = &mut *state;
            let mut freed = 0;
            for (name, per_vnode) in gains {
                if let Some(t) = state.tables.get_mut(&name) {
                    for (vnode, gain) in per_vnode {
                        let slot = &mut t.vnodes[vnode.index()];
                        for (_, run) in &gain.runs {
                            state.files.add(run);
                        }
                        if gain.as_base {
                            slot.base = gain.runs.into_iter().map(|(_, run)| run).collect();
                        } else {
                            slot.deltas.extend(gain.runs);
                            t.dirty.insert(vnode.get());
                        }
                    }
                }
            }
            for t in state.tables.values_mut() {
                let rest = t.sealed.split_off(&(epoch + 1));
                for layer in t.sealed.values() {
                    freed += layer
                        .values()
                        .flat_map(|v| &v.runs)
                        .map(LayerRun::memory_bytes)
                        .sum::<usize>();
                }
                t.sealed = rest;
            }
            state.memory = state.memory.saturating_sub(freed);
            state.committed = Some(epoch);
            state.meta.extend(record.meta);
            state.staged_meta.clear();
        }
        drop(manifest_guard);
        match self.shared.options.compaction {
            Compaction::Background => self.wake_compactor(),
            Compaction::Inline => compaction::compact_all(
                &self.shared,
                compaction::Policy::of(&self.shared.options),
                &std::sync::atomic::AtomicBool::new(false),
            )?,
            Compaction::Manual => {}
        }
        Ok(())
    }

    fn committed_epoch(&self) -> Result<Option<u64>> {
        Ok(self.read()?.committed)
    }

    /// Compacts every vnode with committed deltas now, on this thread.
    fn compact(&self) -> Result<()> {
        compaction::compact_all(
            &self.shared,
            compaction::Policy::EVERYTHING,
            &std::sync::atomic::AtomicBool::new(false),
        )
    }

    fn compact_until(&self, stop: &std::sync::atomic::AtomicBool) -> Result<()> {
        compaction::compact_all(&self.shared, compaction::Policy::EVERYTHING, stop)
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self.read()?.meta.get(key).cloned())
    }

    fn stage_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write()?
            .staged_meta
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn meta_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(self
            .read()?
            .meta
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
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
    fn owner(&self) -> String {
        let kind = if self.replicated { "replicated " } else { "" };
        format!("this {kind}handle on table `{}`", self.desc.name())
    }

    fn check_owned(&self, vnode: VirtualNode) -> Result<()> {
        if self.vnodes.contains(vnode) {
            Ok(())
        } else {
            Err(Error::VnodeNotOwned {
                vnode: vnode.get(),
                owner: self.owner(),
            })
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
        let (follows, runs, short) = match self.order.get(&vnode) {
            None => (true, 0, false),
            Some(None) => (false, 0, false),
            Some(Some(before)) => (first > before.last.as_slice(), before.runs, before.short),
        };
        let ordered = follows && !run.has_tombstones();
        let state = ordered.then(|| Ordered {
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
            let after = state.committed.map_or(0, |c| c + 1);
            Box::new(
                self.local
                    .range(after..)
                    .take_while(move |(e, _)| **e <= epoch)
                    .map(|(_, l)| l),
            )
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
        self.check_owned(vnode)?;
        let state = self.store.read()?;
        state.check_ok()?;
        state.check_read_epoch(self.desc.name(), epoch)?;
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
        let vnodes = check_write(&self.desc, &self.vnodes, chunk, || self.owner())?;
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
            let keep_after = committed.map_or(0, |c| c + 1);
            self.local = self.local.split_off(&keep_after);
            if epoch >= keep_after && !layer.is_empty() {
                self.local.insert(epoch, layer);
            }
        } else if !layer.is_empty() {
            let mut state = self.store.write()?;
            state.memory += kept_bytes;
            let table = state
                .tables
                .get_mut(self.desc.name())
                .ok_or_else(|| Error::UnknownTable(self.desc.name().to_string()))?;
            let slot = Arc::make_mut(table.sealed.entry(epoch).or_default());
            for (vnode, runs) in layer {
                if slot.insert(vnode, runs).is_some() {
                    return Err(Error::Internal(format!(
                        "two handles wrote vnode {vnode} of table `{}` in epoch {epoch}",
                        self.desc.name()
                    )));
                }
            }
        }
        self.last_sealed = Some(epoch);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyColumn;
    use crate::vnode::VnodeCount;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    /// `a|b|...` of each row of a batch: column `a` (Int64), then every other column as
    /// strings (any layout: dictionaries as their values).
    fn rows_of(batch: &RecordBatch) -> Vec<String> {
        let a = batch.column(0).as_primitive::<Int64Type>();
        let rest: Vec<ArrayRef> = (1..batch.num_columns())
            .map(|i| arrow_cast::cast(batch.column(i), &DataType::Utf8).unwrap())
            .collect();
        (0..batch.num_rows())
            .map(|i| {
                let mut row = a.value(i).to_string();
                for c in &rest {
                    row.push('|');
                    row.push_str(c.as_string::<i32>().value(i));
                }
                row
            })
            .collect()
    }

    /// A table `t` of a key `(a, b)` distributed by `a`, `b` a dictionary of `key_type`
    /// keys, a value column `d` of the same type, and `v`.
    fn dictionary_table(key_type: &DataType) -> (Arc<Schema>, TableDesc) {
        let dictionary = DataType::Dictionary(Box::new(key_type.clone()), Box::new(DataType::Utf8));
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", dictionary.clone(), false),
            Field::new("d", dictionary, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let key = vec![KeyColumn::asc("a"), KeyColumn::asc("b")];
        let desc = TableDesc::with_distribution("t", schema.clone(), key, &["a"])
            .unwrap()
            .with_vnode_count(VnodeCount::new(4).unwrap());
        (schema, desc)
    }

    /// Batch `part` of [`dictionary_table`]: 6000 rows, 60 values of `a`, each with
    /// `distinct` values of `b` (out of `labels`, a window moving by `stride` a part) and of
    /// `d` (some null); each batch's dictionaries in their own order.
    fn dictionary_batch(
        schema: &Arc<Schema>,
        part: i64,
        distinct: i64,
        (labels, stride): (i64, i64),
    ) -> RecordBatch {
        let dictionary = schema.field(1).data_type();
        let label = |i: i64| format!("{:04}-a label long enough", (i + part * stride) % labels);
        let b = StringArray::from_iter_values((0..6000).map(|i| label(i % distinct)));
        let d = StringArray::from_iter(
            (0..6000).map(|i| (i % 13 != 0).then(|| label((i * 7 + 3) % distinct))),
        );
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    (0..6000).map(|i| part * 60 + i / distinct),
                )),
                arrow_cast::cast(&b, dictionary).unwrap(),
                arrow_cast::cast(&d, dictionary).unwrap(),
                Arc::new(Int64Array::from_iter_values(
                    (0..6000).map(|i| part * 10_000 + i),
                )),
            ],
        )
        .unwrap()
    }

    /// Writes `parts` batches of [`dictionary_table`] with `key_type` keys, one commit each,
    /// compacts, reopens and checks every row reads back, in key order.
    fn dictionary_round_trip(key_type: &DataType, parts: i64) {
        let dir = tempfile::tempdir().unwrap();
        let (schema, desc) = dictionary_table(key_type);
        let mut expected: Vec<String> = (0..parts)
            .flat_map(|part| rows_of(&dictionary_batch(&schema, part, 100, (100, 7))))
            .collect();
        expected.sort();
        let options = DurableOptions {
            memory_budget: 64 << 10,
            compaction: Compaction::Inline,
            max_deltas: 6,
            merge_deltas: 3,
            ..DurableOptions::default()
        };
        {
            let store =
                DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
            let desc = store.create_table(desc).unwrap();
            let mut table = store
                .table("t", VnodeBitmap::full(desc.vnode_count()))
                .unwrap();
            for part in 0..parts {
                let batch = dictionary_batch(&schema, part, 100, (100, 7));
                table.write(&StreamChunk::inserts(batch)).unwrap();
                table.seal(part as u64 + 1).unwrap();
                store.commit(part as u64 + 1).unwrap();
            }
            store.compact().unwrap();
        }
        let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
        let table = store
            .table("t", VnodeBitmap::full(VnodeCount::new(4).unwrap()))
            .unwrap();
        let mut rows = Vec::new();
        for vnode in table.vnodes().iter() {
            let mut scan = table.scan(vnode, None, parts as u64, 1000).unwrap();
            let mut last: Option<Vec<u8>> = None;
            while let Some(keyed) = scan.next_batch().unwrap() {
                let batch = &keyed.batch;
                assert_eq!(batch.schema(), schema);
                for i in 0..batch.num_rows() {
                    let key = keyed.keys.value(i).to_vec();
                    assert!(last.as_ref().is_none_or(|l| *l < key), "key order");
                    last = Some(key);
                }
                rows.extend(rows_of(batch));
            }
        }
        rows.sort();
        assert_eq!(rows, expected);
    }

    /// Issue 41 item 7: a dictionary key column outside the distribution key (each batch's
    /// dictionary in another order) is stored, committed in files whose index
    /// holds its values, and reads back the same after a reopen and compaction, in key order.
    #[test]
    fn a_dictionary_key_column_commits_and_reads_back_after_a_reopen() {
        dictionary_round_trip(&DataType::Int32, 6);
    }

    /// Dictionaries of narrow keys whose distinct values do not fit (each part's 100 fit,
    /// every part has others): a compaction's merge across parts is refused naming the
    /// column, as bad input (inline: by the commit; in the background: by the next call),
    /// installing nothing; the store reopens at its committed epoch, never as corrupt.
    #[test]
    fn narrow_dictionary_keys_beyond_their_type_are_refused_naming_the_column() {
        for compaction in [Compaction::Inline, Compaction::Background] {
            let dir = tempfile::tempdir().unwrap();
            let (schema, desc) = dictionary_table(&DataType::Int8);
            let options = DurableOptions {
                memory_budget: 64 << 10,
                compaction,
                max_deltas: 4,
                merge_deltas: 2,
                ..DurableOptions::default()
            };
            let mut committed = 0;
            let error = {
                let store =
                    DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
                let desc = store.create_table(desc).unwrap();
                let mut table = store
                    .table("t", VnodeBitmap::full(desc.vnode_count()))
                    .unwrap();
                let mut step = |epoch: u64| -> Result<()> {
                    if epoch <= 12 {
                        let batch = dictionary_batch(&schema, epoch as i64, 100, (10_000, 100));
                        table.write(&StreamChunk::inserts(batch))?;
                    }
                    table.seal(epoch)?;
                    store.commit(epoch)
                };
                // The background thread fails some time after a commit: empty epochs until
                // a call reports it.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                loop {
                    match step(committed + 1) {
                        Ok(()) => committed += 1,
                        Err(e) => break e,
                    }
                    assert!(std::time::Instant::now() < deadline, "no error");
                    if committed > 12 {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            };
            assert!(error.is_bad_input(), "{compaction:?}: {error}");
            let text = error.to_string();
            assert!(
                (text.starts_with("column `b`: ") || text.starts_with("column `d`: "))
                    && text.contains("Int8"),
                "{compaction:?}: {text}"
            );
            // The store reopens (nothing corrupt) with every commit that succeeded, or one
            // more (an inline compaction fails after its commit's record is durable).
            let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
            let reopened = store.committed_epoch().unwrap().unwrap();
            assert!(
                reopened == committed || reopened == committed + 1,
                "{compaction:?}: {reopened} after {committed}"
            );
        }
    }

    /// Dictionaries of narrow keys (100 distinct values, which fit): the store's
    /// concatenations and merges of many runs, inline and at the final compaction, keep
    /// one dictionary of the distinct values instead of overflowing the key type.
    #[test]
    fn narrow_dictionary_keys_survive_compaction_of_many_runs() {
        for key_type in [DataType::Int8, DataType::UInt8, DataType::Int16] {
            dictionary_round_trip(&key_type, 16);
        }
    }
}
