//! The durable, embedded store: sorted Arrow IPC run files, an atomically replaced manifest,
//! background compaction, memory bounded by a budget (DESIGN section 6.2).
//!
//! ```text
//!  handle.write ──▶ pending (memory) ──spill when over budget──▶ uncommitted run file
//!  handle.seal(e) ──▶ sealed layer e: per vnode, runs in memory or spilled, oldest first
//!  store.commit(c):  1. layers <= c: memory runs written to one run file per table, fsync
//!                    2. MANIFEST.tmp (epoch c, tables, live files and runs), fsync,
//!                       rename over MANIFEST, fsync the directory   ◀── the commit point
//!                    3. the layers become committed delta runs; memory is freed
//!  compactor thread: per vnode, base + committed deltas ──merge──▶ new base run (a new
//!                    file), installed with a new manifest; replaced files are removed once
//!                    no reader holds them.
//!  open(dir):        lock dir/LOCK, read MANIFEST, check every live file (size, footer and
//!                    header checksums), then remove what the manifest does not name.
//! ```
//!
//! Reads merge, per vnode, the base, the committed deltas and the visible sealed layers with
//! the same [`MergeReader`] as the in-memory store; committed runs are read block by block
//! from disk (each block checked against its CRC), so memory holds one block per source.
//!
//! Invariants:
//! - Only the manifest decides what is committed; run files are immutable once written and
//!   live while a manifest names them or a reader holds them.
//! - A crash at any point leaves the previous or the new manifest, each naming only fsynced
//!   files: reopening yields exactly the last committed state.
//! - After an I/O error during a commit the outcome on disk is unknown: the store refuses
//!   every later operation until it is reopened (which tells which manifest won).

mod cache;
mod compaction;
mod file;
mod lock;
mod manifest;

pub use self::lock::{DirLock, LOCK_FILE};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow_array::{Array, RecordBatch};
use hashbrown::HashMap;

use self::file::{DiskRun, RunFile, RunFileWriter, RunSpan};
use self::manifest::{FileEntry, MANIFEST_FILE, Manifest, RunEntry, TableEntry};
use super::io::{RealIo, StorageIo};
use super::run::{MergeReader, Run, RunList, build_pending_runs};
use super::{KeyedBatch, SnapshotScan, StateStore, StateTable, check_seal, check_write};
use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::key::Position;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// Settings of a [`DurableStore`].
#[derive(Debug, Clone)]
pub struct DurableOptions {
    /// Bytes of uncommitted data kept in memory (sealed layers and write buffers) before
    /// layers are spilled to run files.
    pub memory_budget: usize,
    /// Compact a vnode (rewrite its base) once it has this many committed delta runs (or
    /// earlier, once its deltas hold a quarter of its base's rows).
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
    _lock: DirLock,
}

/// One run of a sealed layer: still in memory, or spilled to an uncommitted file.
#[derive(Debug, Clone)]
enum LayerRun {
    Memory(Arc<Run>),
    Disk(DiskRun),
}

impl LayerRun {
    fn list(&self) -> Box<dyn RunList> {
        match self {
            LayerRun::Memory(run) => Box::new(vec![run.clone()]),
            LayerRun::Disk(run) => Box::new(run.clone()),
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            LayerRun::Memory(run) => run_bytes(run),
            LayerRun::Disk(_) => 0,
        }
    }
}

fn run_bytes(run: &Run) -> usize {
    run.data.batch.get_array_memory_size() + run.data.keys.get_array_memory_size()
}

/// One epoch's changes of a table: per vnode, its runs oldest first.
type Layer = HashMap<VirtualNode, Vec<LayerRun>>;
/// A table's sealed layers up to an epoch, oldest first.
type SealedLayers = Vec<(u64, Layer)>;
/// A committed layer: per vnode, its runs on disk, oldest first.
type CommittedLayer = Vec<(VirtualNode, Vec<DiskRun>)>;

#[derive(Debug, Default)]
struct State {
    committed: Option<u64>,
    meta: BTreeMap<String, String>,
    staged_meta: BTreeMap<String, String>,
    /// Live files: named by the committed manifest.
    files: HashMap<u64, Arc<RunFile>>,
    tables: BTreeMap<String, TableState>,
    /// Bytes of sealed layers held in memory.
    memory: usize,
    /// Set when a commit failed half way: the store must be reopened.
    failed: Option<String>,
}

#[derive(Debug)]
struct TableState {
    desc: Arc<TableDesc>,
    vnodes: Vec<VnodeRuns>,
    sealed: BTreeMap<u64, Layer>,
}

/// The committed runs of a vnode.
#[derive(Debug, Clone, Default)]
struct VnodeRuns {
    base: Option<DiskRun>,
    /// Committed delta runs, oldest first, with their epochs.
    deltas: Vec<(u64, DiskRun)>,
}

impl VnodeRuns {
    fn sources(&self) -> Vec<Box<dyn RunList>> {
        let mut sources: Vec<Box<dyn RunList>> = Vec::with_capacity(1 + self.deltas.len());
        if let Some(base) = &self.base {
            sources.push(Box::new(base.clone()));
        }
        sources.extend(self.delta_sources());
        sources
    }

    /// The committed deltas alone, oldest first.
    fn delta_sources(&self) -> Vec<Box<dyn RunList>> {
        self.deltas
            .iter()
            .map(|(_, delta)| Box::new(delta.clone()) as Box<dyn RunList>)
            .collect()
    }
}

impl State {
    fn check_ok(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::StoreFailed(why.clone())),
            None => Ok(()),
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
        let mut ids: Vec<u64> = self.files.keys().copied().collect();
        ids.sort_unstable();
        m.files = ids
            .into_iter()
            .map(|id| FileEntry::new(id, self.files[&id].check()))
            .collect();
        for table in self.tables.values() {
            let mut entry = TableEntry::of(&table.desc)?;
            for runs in &table.vnodes {
                if let Some(base) = &runs.base {
                    entry.runs.push(run_entry(base, 0));
                }
                for (epoch, delta) in &runs.deltas {
                    entry.runs.push(run_entry(delta, *epoch));
                }
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
    Manifest::empty().store(io, dir)?;
    for name in io.list(dir)? {
        if manifest::run_file_id(&name).is_some() || name == "MANIFEST.tmp" {
            io.remove(&dir.join(name))?;
        }
    }
    io.sync_dir(dir)?;
    Ok(())
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
        let manifest = match Manifest::load(io.as_ref(), &dir)? {
            Some(m) => m,
            None => {
                if let Some(name) = names.iter().find(|n| manifest::run_file_id(n).is_some()) {
                    return Err(Error::CorruptState {
                        context: dir.join(MANIFEST_FILE).display().to_string(),
                        message: format!(
                            "missing, but the directory holds run files ({name}): refusing to \
                             treat it as a new store"
                        ),
                    });
                }
                Manifest::empty()
            }
        };
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
            state.files.insert(id, file);
        }
        for (entry, desc) in manifest.tables.iter().zip(descs) {
            let mut vnodes = vec![VnodeRuns::default(); desc.vnode_count().get()];
            for run in &entry.runs {
                let span = run.span();
                let file = state
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
                if run.epoch == 0 {
                    if slot.base.is_some() || !slot.deltas.is_empty() {
                        return Err(Error::CorruptState {
                            context: manifest_path.display().to_string(),
                            message: format!(
                                "vnode {} of `{}`: misplaced base run",
                                span.vnode, entry.name
                            ),
                        });
                    }
                    slot.base = Some(disk);
                } else {
                    slot.deltas.push((run.epoch, disk));
                }
            }
            state.tables.insert(
                entry.name.clone(),
                TableState {
                    desc,
                    vnodes,
                    sealed: BTreeMap::new(),
                },
            );
        }
        // Everything checks out: only now remove what the manifest does not name.
        for name in &names {
            let unlisted = match manifest::run_file_id(name) {
                Some(id) => !state.files.contains_key(&id),
                None => name == "MANIFEST.tmp",
            };
            if unlisted {
                io.remove(&dir.join(name))?;
            }
        }
        let next_id = manifest
            .next_file_id
            .max(state.files.keys().max().map_or(0, |m| m + 1));
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

    /// Writes `manifest` and marks the store failed if that does not fully succeed. `files`
    /// are the files it names: after a failure they are kept on disk, since the new manifest
    /// may have become durable anyway (reopening removes them if it did not).
    fn store_manifest(
        &self,
        manifest: &Manifest,
        files: &HashMap<u64, Arc<RunFile>>,
    ) -> Result<()> {
        match manifest.store(self.io.as_ref(), &self.dir) {
            Ok(()) => Ok(()),
            Err(e) => {
                for file in files.values() {
                    file.mark_live();
                }
                if let Ok(mut state) = self.write() {
                    state.failed = Some(format!(
                        "writing the manifest in {} failed ({e}); reopen the store",
                        self.dir.display()
                    ));
                }
                Err(e)
            }
        }
    }

    /// Makes the files named by the new committed state live and marks the ones it no
    /// longer names obsolete.
    fn swap_files(state: &mut State, live: HashMap<u64, Arc<RunFile>>) {
        for (id, file) in &state.files {
            if !live.contains_key(id) {
                file.mark_obsolete();
            }
        }
        for file in live.values() {
            file.mark_live();
        }
        state.files = live;
    }
}

/// The files the committed runs of `tables` name.
fn files_of(tables: &BTreeMap<String, TableState>) -> HashMap<u64, Arc<RunFile>> {
    let mut files = HashMap::new();
    for table in tables.values() {
        for runs in &table.vnodes {
            for run in runs.base.iter().chain(runs.deltas.iter().map(|(_, d)| d)) {
                files
                    .entry(run.file.id())
                    .or_insert_with(|| run.file.clone());
            }
        }
    }
    files
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
        self.shared.store_manifest(&manifest, &HashMap::new())?;
        self.write()?.tables.insert(
            desc.name().to_string(),
            TableState {
                desc: desc.clone(),
                vnodes: vec![VnodeRuns::default(); desc.vnode_count().get()],
                sealed: BTreeMap::new(),
            },
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
            let mut memory: Vec<(VirtualNode, &Run)> = Vec::new();
            for (_, layer) in &table_layers {
                let mut vnodes: Vec<&VirtualNode> = layer.keys().collect();
                vnodes.sort_unstable();
                for vnode in vnodes {
                    for run in &layer[vnode] {
                        if let LayerRun::Memory(run) = run
                            && run.len() > 0
                        {
                            memory.push((*vnode, run));
                        }
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
            let mut out = Vec::with_capacity(table_layers.len());
            for (e, layer) in &table_layers {
                let mut vnodes: Vec<&VirtualNode> = layer.keys().collect();
                vnodes.sort_unstable();
                let mut per_vnode = Vec::with_capacity(vnodes.len());
                for vnode in vnodes {
                    let mut runs = Vec::new();
                    for run in &layer[vnode] {
                        match run {
                            LayerRun::Disk(d) => runs.push(d.clone()),
                            LayerRun::Memory(r) if r.len() > 0 => {
                                let d = written.next().ok_or_else(|| {
                                    Error::Internal("a committed run was not written".into())
                                })?;
                                runs.push(d);
                            }
                            LayerRun::Memory(_) => {}
                        }
                    }
                    per_vnode.push((*vnode, runs));
                }
                out.push((*e, per_vnode));
            }
            committed_layers.push((name, out));
        }
        // 3. The new committed state, its manifest, the switch.
        let (tables, meta) = {
            let state = self.read()?;
            let mut tables: BTreeMap<String, Vec<VnodeRuns>> = state
                .tables
                .iter()
                .map(|(n, t)| (n.clone(), t.vnodes.clone()))
                .collect();
            for (name, layers) in &committed_layers {
                if let Some(vnodes) = tables.get_mut(name) {
                    for (e, per_vnode) in layers {
                        for (vnode, runs) in per_vnode {
                            for run in runs {
                                vnodes[vnode.index()].deltas.push((*e, run.clone()));
                            }
                        }
                    }
                }
            }
            let mut meta = state.meta.clone();
            meta.extend(state.staged_meta.clone());
            (tables, meta)
        };
        let manifest = {
            let state = self.read()?;
            let mut next = State {
                committed: Some(epoch),
                meta: meta.clone(),
                ..State::default()
            };
            for (name, vnodes) in &tables {
                let desc = state.table(name)?.desc.clone();
                next.tables.insert(
                    name.clone(),
                    TableState {
                        desc,
                        vnodes: vnodes.clone(),
                        sealed: BTreeMap::new(),
                    },
                );
            }
            next.files = files_of(&next.tables);
            (
                next.manifest(shared.next_file_id.load(Ordering::SeqCst))?,
                next.files,
            )
        };
        let (manifest, named) = manifest;
        shared.store_manifest(&manifest, &named)?;
        // 4. Committed: install it.
        {
            let mut state = self.write()?;
            let mut freed = 0;
            for (name, vnodes) in tables {
                if let Some(t) = state.tables.get_mut(&name) {
                    t.vnodes = vnodes;
                    let rest = t.sealed.split_off(&(epoch + 1));
                    for layer in t.sealed.values() {
                        freed += layer
                            .values()
                            .flatten()
                            .map(LayerRun::memory_bytes)
                            .sum::<usize>();
                    }
                    t.sealed = rest;
                }
            }
            state.memory = state.memory.saturating_sub(freed);
            state.committed = Some(epoch);
            state.meta = meta;
            state.staged_meta.clear();
            let live = files_of(&state.tables);
            Shared::swap_files(&mut state, live);
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

    fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self.read()?.meta.get(key).cloned())
    }

    fn stage_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write()?
            .staged_meta
            .insert(key.to_string(), value.to_string());
        Ok(())
    }
}

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
    last_sealed: Option<u64>,
    /// A replicated handle's own layers (never persisted).
    local: BTreeMap<u64, Layer>,
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

    /// The pending chunks as sorted runs per vnode (last change per key), in memory.
    fn build_pending(&mut self) -> Result<Vec<(VirtualNode, Run)>> {
        let runs = build_pending_runs(&self.desc, &self.pending)?;
        self.pending.clear();
        self.pending_bytes = 0;
        Ok(runs)
    }

    /// Sorts the pending chunks and writes them to an (uncommitted) run file.
    fn spill_pending(&mut self) -> Result<()> {
        let runs = self.build_pending()?;
        if runs.is_empty() {
            return Ok(());
        }
        let (file, spans) = self
            .store
            .shared
            .write_runs(&self.desc, runs.iter().map(|(v, r)| (*v, r)))?;
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
                    .map(|(_, l)| l),
            )
        };
        Ok(layers
            .filter_map(|layer| layer.get(&vnode))
            .flat_map(|runs| runs.iter().cloned())
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
        if !self.replicated && self.pending_bytes > self.store.shared.options.memory_budget / 4 {
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
        let memory_runs = self.build_pending()?;
        let memory_bytes: usize = memory_runs.iter().map(|(_, r)| run_bytes(r)).sum();
        let over_budget = !self.replicated && {
            let state = self.store.read()?;
            state.memory + memory_bytes > self.store.shared.options.memory_budget
        };
        let mut layer = Layer::new();
        for (vnode, run) in self.spilled.drain(..) {
            layer.entry(vnode).or_default().push(LayerRun::Disk(run));
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
                    .push(LayerRun::Disk(DiskRun {
                        file: file.clone(),
                        span,
                    }));
            }
        } else {
            kept_bytes = memory_bytes;
            for (vnode, run) in memory_runs {
                layer
                    .entry(vnode)
                    .or_default()
                    .push(LayerRun::Memory(Arc::new(run)));
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
            let slot = table.sealed.entry(epoch).or_default();
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
                let deleted = run.deleted.as_ref().is_some_and(|d| d.value(row));
                return Ok((!deleted).then(|| run.data.batch.slice(row, 1)));
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
            return Ok(runs.base.map_or(0, |b| b.span.rows as usize));
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
}
