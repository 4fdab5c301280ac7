//! A committed state of the store, pinned so it can be copied elsewhere (a checkpoint's
//! upload to object storage), and its restore into an empty directory.
//!
//! ```text
//!   store.image_source().image()   under the manifest lock: the committed state as one
//!        │                         MANIFEST (no log records) + the run files it names,
//!        │                         each pinned (a compaction that replaces one meanwhile
//!        ▼                         leaves it on disk until the image is dropped)
//!   StoreImage { manifest bytes, files [name, path, size, tail crc], epoch, meta }
//!        │ copied anywhere, files first
//!        ▼
//!   restore(dir, manifest, fetch)  dir/RESTORING, each file fetched to NAME.part, checked
//!                                  (size), renamed; LOG-<g> (header); MANIFEST; RESTORING
//!                                  removed. `DurableStore::open` then checks every file as
//!                                  after any crash.
//! ```
//!
//! An image holds only committed state: sealed layers, spills and a commit under way are
//! not in it. Run files are immutable and named by id; their id with their size and tail
//! checksum tells one file's bytes from another's (ids are reused only by a store restored
//! from an older image, whose later files differ in content).
//!
//! A restore interrupted at any point leaves `RESTORING`: the next [`restore`] starts over
//! (it removes what the unfinished one wrote), and `DurableStore::open` refuses the directory
//! until then, naming the marker. A directory holding a store is restored over only when
//! asked (`replace`); only the store's own names are ever removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use super::file::RunFile;
use super::log::LogWriter;
use super::manifest::{self, MANIFEST_FILE, Manifest};
use super::record::log_generation;
use super::{DurableStore, Shared};
use crate::error::{Error, Result};
use crate::store::io::StorageIo;

/// What changes whenever a store's image would: its committed epoch, its next file id.
pub type StoreStamp = (Option<u64>, u64);

/// The marker of a restore under way (see the module docs).
pub const RESTORING_FILE: &str = "RESTORING";

/// One run file of a [`StoreImage`].
#[derive(Debug, Clone)]
pub struct ImageFile {
    /// Its name in the store's directory (`run-<id>.arrow`).
    pub name: String,
    /// Where it is now.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// The checksum of its tail (footer and block index, which hold every block's checksum):
    /// with the size and the id, it tells this file from any other of the same name.
    pub tail_crc: u32,
}

/// A committed state of a [`DurableStore`]: its manifest and the run files it names, kept
/// on disk while the image lives.
pub struct StoreImage {
    committed_epoch: Option<u64>,
    meta: BTreeMap<String, String>,
    manifest: Vec<u8>,
    files: Vec<ImageFile>,
    /// The files, held so that no compaction removes them while they are copied.
    _pins: Vec<Arc<RunFile>>,
}

impl std::fmt::Debug for StoreImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreImage")
            .field("committed_epoch", &self.committed_epoch)
            .field("files", &self.files.len())
            .field("manifest_bytes", &self.manifest.len())
            .finish()
    }
}

impl StoreImage {
    /// The last committed epoch (`None`: only load steps, or nothing, committed).
    pub fn committed_epoch(&self) -> Option<u64> {
        self.committed_epoch
    }

    /// The committed job values.
    pub fn meta(&self) -> &BTreeMap<String, String> {
        &self.meta
    }

    /// The `MANIFEST` file of this state (its log holds no record).
    pub fn manifest(&self) -> &[u8] {
        &self.manifest
    }

    /// The run files, by id.
    pub fn files(&self) -> &[ImageFile] {
        &self.files
    }
}

/// Takes images of a store without keeping it open: once every clone of the store is
/// dropped, [`ImageSource::image`] returns `None`.
#[derive(Debug, Clone)]
pub struct ImageSource(Weak<Shared>);

impl ImageSource {
    /// The store's committed state now, or `None` once the store is closed.
    pub fn image(&self) -> Result<Option<StoreImage>> {
        match self.0.upgrade() {
            Some(shared) => image_of(&shared).map(Some),
            None => Ok(None),
        }
    }
}

impl DurableStore {
    /// The committed state now (see [`StoreImage`]).
    pub fn image(&self) -> Result<StoreImage> {
        image_of(&self.shared)
    }

    /// A source of images of this store that does not keep it open.
    pub fn image_source(&self) -> ImageSource {
        ImageSource(Arc::downgrade(&self.shared))
    }
}

impl ImageSource {
    /// A stamp of the store's committed state that changes whenever an image would (a
    /// commit, a load step, a compaction: each makes a file or moves the epoch), read
    /// without the manifest lock; `None` once the store is closed.
    pub fn stamp(&self) -> Result<Option<StoreStamp>> {
        let Some(shared) = self.0.upgrade() else {
            return Ok(None);
        };
        let committed = shared.read()?.committed;
        let next_file_id = shared
            .next_file_id
            .load(std::sync::atomic::Ordering::SeqCst);
        Ok(Some((committed, next_file_id)))
    }
}

fn image_of(shared: &Shared) -> Result<StoreImage> {
    // Commits and compaction installs change the committed state under the manifest lock:
    // under it, the state in memory is exactly the committed one. The manifest is encoded
    // once the lock is let go: commits never wait for the encoding.
    let (manifest, files, pins) = {
        let _m = shared.lock_manifest()?;
        let generation = shared.lock_log()?.generation;
        let state = shared.read()?;
        state.check_ok()?;
        let next_file_id = shared
            .next_file_id
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut manifest = state.manifest(next_file_id)?;
        manifest.log_generation = generation;
        let mut files = Vec::with_capacity(manifest.files.len());
        let mut pins = Vec::with_capacity(manifest.files.len());
        for entry in &manifest.files {
            let file = state.files.files.get(&entry.id).ok_or_else(|| {
                Error::Internal(format!(
                    "the committed state names unknown file {}",
                    entry.id
                ))
            })?;
            files.push(ImageFile {
                name: manifest::run_file_name(entry.id),
                path: Manifest::file_path(&shared.dir, entry.id),
                size: entry.size,
                tail_crc: entry.tail_crc,
            });
            pins.push(file.clone());
        }
        (manifest, files, pins)
    };
    Ok(StoreImage {
        committed_epoch: manifest.committed_epoch,
        meta: manifest.meta.clone(),
        manifest: manifest.encode()?,
        files,
        _pins: pins,
    })
}

/// The run files a manifest (an image's [`StoreImage::manifest`]) names, as in
/// [`ImageFile`] (`path` in `dir`); `what` names the manifest in errors.
pub fn manifest_files(manifest: &[u8], what: &Path, dir: &Path) -> Result<Vec<ImageFile>> {
    let decoded = Manifest::decode(manifest, what)?;
    Ok(decoded
        .files
        .iter()
        .map(|entry| ImageFile {
            name: manifest::run_file_name(entry.id),
            path: Manifest::file_path(dir, entry.id),
            size: entry.size,
            tail_crc: entry.tail_crc,
        })
        .collect())
}

/// Restores the image whose manifest is `manifest` into `dir`, which must not hold a store
/// unless `replace` (then its files go, once the marker is durable: a crash leaves an
/// unfinished restore, never a mix); an unfinished restore's leftovers are removed first.
/// Only the store's own names are removed: other files in `dir` stay. `fetch(file, to)` writes the
/// bytes of `file` (found by its name; its `path` is where it goes in `dir`) to the path
/// `to`; each is checked against the manifest's size. `what`
/// names the manifest's origin in errors. Open the store afterwards with
/// [`DurableStore::open_with`], which checks every file.
pub fn restore(
    io: &dyn StorageIo,
    dir: &Path,
    manifest: &[u8],
    what: &Path,
    replace: bool,
    mut fetch: impl FnMut(&ImageFile, &Path) -> Result<()>,
) -> Result<()> {
    let decoded = Manifest::decode(manifest, what)?;
    io.create_dir_all(dir)?;
    let _lock = super::DirLock::acquire(dir)?;
    let marker = dir.join(RESTORING_FILE);
    let names = io.list(dir)?;
    let unfinished = replace || names.iter().any(|n| n == RESTORING_FILE);
    if !unfinished && names.iter().any(|n| n == MANIFEST_FILE) {
        return Err(Error::CorruptState {
            context: dir.display().to_string(),
            message: "holds a store: a restore never replaces one (remove the directory \
                      to restore into it)"
                .into(),
        });
    }
    if !unfinished && names.iter().any(|n| is_store_file(n)) {
        return Err(Error::CorruptState {
            context: dir.display().to_string(),
            message: "holds run files or logs but no manifest: not a directory to restore \
                      into"
                .into(),
        });
    }
    // The marker first: from here on an interruption is an unfinished restore.
    let mut file = io.create(&marker)?;
    file.sync()?;
    drop(file);
    io.sync_dir(dir)?;
    for name in names {
        if is_store_file(&name) || name.ends_with(".part") {
            io.remove(&dir.join(name))?;
        }
    }
    for entry in manifest_files(manifest, what, dir)? {
        let part = dir.join(format!("{}.part", entry.name));
        fetch(&entry, &part)?;
        let got = io.open(&part)?.len();
        if got != entry.size {
            return Err(Error::CorruptState {
                context: part.display().to_string(),
                message: format!(
                    "restored {got} bytes of {}, whose manifest says {} bytes",
                    entry.name, entry.size
                ),
            });
        }
        io.rename(&part, &entry.path)?;
    }
    // As after a manifest's rewrite: its log's header durable before the manifest.
    drop(LogWriter::create(io, dir, decoded.log_generation)?);
    decoded.store(io, dir)?;
    io.remove(&marker)?;
    io.sync_dir(dir)?;
    Ok(())
}

/// A name the store owns: a run file, a log, the manifest or its temporary.
fn is_store_file(name: &str) -> bool {
    manifest::run_file_id(name).is_some()
        || log_generation(name).is_some()
        || name == MANIFEST_FILE
        || name == "MANIFEST.tmp"
}
