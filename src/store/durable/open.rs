//! Opening a store's directory: the manifest read and its log's records applied, every
//! live file checked, what the committed state does not name removed (only once every
//! check passed); and [`destroy`], which empties a directory crash-safely.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use hashbrown::HashMap;

use super::file::{DiskRun, RunFile};
use super::log::{self, LogWriter};
use super::manifest::{self, MANIFEST_FILE, Manifest};
use super::record::{log_file_name, log_generation};
use super::version::{State, TableState, VnodeRuns};
use super::{
    Compaction, DirLock, DurableOptions, DurableStore, LogState, Shared, cache, compaction,
};
use crate::error::{Error, Result};
use crate::runs::RunList;
use crate::store::io::{RealIo, StorageIo};

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

/// The committed job values of the store in `dir`, read without opening it: nothing is
/// locked, checked beyond the manifest and its log, or changed on disk. `None` when `dir`
/// holds no manifest. For a caller that decides what to do before it opens the store (a
/// replay that may skip its dataset's validation); what the open then finds decides.
pub fn committed_meta(
    io: &dyn StorageIo,
    dir: &Path,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    if !io.exists(dir)? {
        return Ok(None);
    }
    let Some(mut manifest) = Manifest::load(io, dir)? else {
        return Ok(None);
    };
    let generation = manifest.log_generation;
    let records = log::read_log(io, dir, generation, manifest.log_presence())?;
    manifest.apply(&records, &dir.join(log_file_name(generation)))?;
    Ok(Some(manifest.meta))
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
        if names.iter().any(|n| n == super::RESTORING_FILE) {
            return Err(Error::CorruptState {
                context: dir.join(super::RESTORING_FILE).display().to_string(),
                message: "a restore into this directory did not finish: restore it again \
                          (it starts over), or remove the directory"
                    .into(),
            });
        }
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
            writers: super::super::WriterClaims::default(),
        };
        if store.shared.options.compaction == Compaction::Background {
            let compactor = compaction::Compactor::start(Arc::downgrade(&store.shared))?;
            *store.lock_compactor()? = Some(compactor);
            store.wake_compactor();
        }
        Ok(store)
    }
}
