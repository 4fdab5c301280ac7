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
//! the whole state, but happens once the log has grown `LOG_GROWTH` (4) times as large as the
//! manifest, so it adds a constant factor to the log's bytes. The formats, byte by byte, are in
//! `durable/manifest.rs` and `durable/log.rs`.
//!
//! Reads merge, per vnode, the base, the committed deltas and the visible sealed layers with
//! the same merged read as the in-memory store (`MergeReader`, in `src/runs/`); committed runs are read block by block
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
//!
//! Where each part lives:
//!
//! | File | What |
//! |------|------|
//! | `mod.rs` | the options, the store, the commit, the log's append or the manifest's rewrite |
//! | `open.rs` | opening a directory (the checks and the clean-up above), [`destroy`] |
//! | `version.rs` | the state in memory: per vnode the committed runs, the live files, the sealed layers |
//! | `table.rs` | handles: writes, spills, seals, reads ([`DurableTable`], [`DurableScan`]) |
//! | `compaction.rs` | the compactor: which vnodes are due, their merge, its install |
//! | `image.rs` | a committed state pinned for copying ([`StoreImage`]), and its [`restore`] |
//! | `load_step.rs` | a bulk load's step: rows committed into the base without an epoch |
//! | `file/` | run files: writer, reader, block index |
//! | `stored.rs` | how run files store each column type |
//! | `cache.rs` | decoded blocks kept for re-reads |
//! | `manifest.rs`, `log.rs`, `record.rs` | the manifest, the log, the records both hold |
//! | `lock.rs` | the directory lock |

mod cache;
mod compaction;
mod file;
mod image;
mod load_step;
mod lock;
mod log;
mod manifest;
mod open;
mod record;
mod stored;
mod table;
mod version;

#[cfg(test)]
mod tests;

pub use self::image::{
    ImageFile, ImageSource, RESTORING_FILE, StoreImage, StoreStamp, manifest_files, restore,
};
pub use self::lock::{DirLock, LOCK_FILE};
pub use self::open::{committed_meta, destroy};
pub use self::table::{DurableScan, DurableTable};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use self::file::{DiskRun, RunFile, RunFileWriter, RunSpan};
use self::log::LogWriter;
use self::manifest::{Manifest, TableEntry};
use self::record::{EditKind, FileEntry, LogRecord, TableEdit, VnodeEdit, log_file_name};
use self::version::{LayerRun, SealedLayers, State, TableState, VnodeLayer, VnodeRuns, run_entry};
use super::StateStore;
use super::io::StorageIo;
use super::rules::{check_commit, check_handle, meta_with_prefix};
use crate::error::{Error, Result};
use crate::runs::Run;
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// Settings of a [`DurableStore`].
#[derive(Debug, Clone)]
pub struct DurableOptions {
    /// Bytes of uncommitted data kept in memory (sealed layers and write buffers) before
    /// layers are spilled to run files.
    pub memory_budget: usize,
    /// Compact a vnode (rewrite its base) once it has this many committed delta runs (0 is
    /// taken as 1), or earlier, once it has two or more whose rows together are at least a
    /// quarter of its base's rows and at least 64 (the fewest rows a block holds).
    pub max_deltas: usize,
    /// Merge a vnode's delta runs into one once it has this many (and no full compaction is
    /// due). A scan holds one loaded block per run it reads, so this bounds its memory
    /// without rewriting the base. At least 2.
    pub merge_deltas: usize,
    /// When compaction runs.
    pub compaction: Compaction,
    /// Bytes of decoded blocks kept for re-reads: the blocks of a packed batch that many
    /// vnodes' short runs share, and the block a scan opened afresh (past the backfill's
    /// patch budget, or after a pause, a resume or a throttle) stopped in before.
    pub block_cache: usize,
    /// How the bodies of the run files this store writes are compressed (files written
    /// with any setting are read whatever the setting).
    pub compression: StateCompression,
}

/// How a [`DurableStore`] compresses the bodies of its run files (Arrow IPC's own body
/// compression: each buffer compressed on its own, the file's layout unchanged, so a
/// reader of the format reads any setting and the manifest does not change).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateCompression {
    /// Uncompressed: the fastest to write and to read.
    #[default]
    None,
    /// LZ4 frames: about a third of the size at a small cost to write and read.
    Lz4,
    /// Zstandard: smaller than LZ4, slower to write.
    Zstd,
}

impl StateCompression {
    /// The IPC compression of run file bodies.
    pub(crate) fn ipc(self) -> Option<arrow_ipc::CompressionType> {
        match self {
            StateCompression::None => None,
            StateCompression::Lz4 => Some(arrow_ipc::CompressionType::LZ4_FRAME),
            StateCompression::Zstd => Some(arrow_ipc::CompressionType::ZSTD),
        }
    }
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
            compression: StateCompression::None,
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
    writers: super::WriterClaims,
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

impl DurableStore {
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
        let desc = {
            let state = self.read()?;
            state.check_ok()?;
            state.table(name)?.desc.clone()
        };
        check_handle(&desc, &vnodes)?;
        Ok(DurableTable::new(self.clone(), desc, vnodes, replicated))
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
        RunFileWriter::create_compressed(
            self.io.clone(),
            Manifest::file_path(&self.dir, id),
            id,
            desc.clone(),
            self.options.compression,
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

    fn table_desc(&self, name: &str) -> Result<Arc<TableDesc>> {
        let state = self.read()?;
        state.check_ok()?;
        Ok(state.table(name)?.desc.clone())
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
            check_commit(epoch, state.committed)?;
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

    fn writer_claims(&self) -> &super::WriterClaims {
        &self.writers
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

    fn discard_uncommitted_of(&self, table: &str) -> Result<()> {
        let mut state = self.write()?;
        let t = state.tables.get_mut(table);
        let dropped = std::mem::take(&mut crate::store::rules::known(t, table)?.sealed);
        // Spilled runs' files are obsolete until a manifest names them: dropped, removed.
        let freed: usize = (dropped.values().flat_map(|layer| layer.values()))
            .flat_map(|v| &v.runs)
            .map(LayerRun::memory_bytes)
            .sum();
        state.memory = state.memory.saturating_sub(freed);
        Ok(())
    }

    fn stage_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write()?
            .staged_meta
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn meta_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(meta_with_prefix(&self.read()?.meta, prefix))
    }
}
