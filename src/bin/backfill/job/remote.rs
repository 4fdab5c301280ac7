//! A replay's output on object storage (`--out s3://bucket/prefix`): exactly once, with no
//! rename, one writer.
//!
//! ```text
//!   the replay, as for a local --out, into CACHE (state, changes/*.parquet.tmp → rename)
//!        │ a published CACHE/changes/epoch-E.parquet is committed output (renamed after
//!        │ the store's commit)
//!        ▼ sync (a thread, every SYNC_INTERVAL, and once more at the end)
//!   URL/changes/epoch-E.parquet   one create-if-absent PUT each, in epoch order
//!   URL/_backfill-writer.json     the writer's claim, one create-if-absent PUT
//! ```
//!
//! Readers listing `URL/changes/*.parquet` see only whole objects (a PUT is atomic) of
//! committed checkpoints (only published files are uploaded, after their commit), each epoch
//! once. A crash between a commit and its upload leaves the file in the cache: the next run
//! uploads it. The remote changes are kept equal to the cache's published files: an object of
//! an epoch file the cache does not hold (an earlier output, replaced by `--fresh`) is
//! deleted, newest first, before any upload.
//!
//! One writer per output: the first run claims `URL` with a create-if-absent PUT of
//! `_backfill-writer.json` naming its writer id, kept in `CACHE/.backfill-writer`. A run from
//! another cache (another machine, another directory) finds the claim and stops with exit
//! status 2 before writing anything; of two writers starting together, exactly one creates
//! the claim. The cache is needed to resume: with an empty cache the claim refuses (restoring
//! the state from object storage is not built yet).
//!
//! A shard (`--shard I/N`) is a writer of its own part: its claim is
//! `_backfill-writer.shard-I-of-N.json`, its default cache `out/cache/<URL>.shard-I-of-N`, and
//! its sync lists, uploads and deletes only its own names (`epoch-E.shard-I-of-N.parquet`),
//! so the N shards of an output never touch each other's objects.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::job::output::{CHANGES_DIR, parse_output_name, part_files};
use crate::job::shard::Shard;
use crate::replay::storage::{self, Put};

/// The claim's object name under the output URL (`_`: readers' globs skip it).
pub const WRITER_OBJECT: &str = "_backfill-writer.json";
/// The writer id's file in the cache.
const WRITER_FILE: &str = ".backfill-writer";
/// How often the sync thread looks for newly published files.
const SYNC_INTERVAL: Duration = Duration::from_millis(250);

/// An output on object storage, claimed by this writer.
#[derive(Debug, Clone)]
pub struct RemoteOut {
    url: PathBuf,
    cache: PathBuf,
    shard: Option<Shard>,
    /// The cache's files (epoch, size, modification time) whose object is known to hold
    /// their bytes: uploaded by this process, or read back and compared once. An object of
    /// the same name and size is not enough: an earlier output's file may have both.
    confirmed: Arc<Mutex<HashSet<(u64, u64, SystemTime)>>>,
}

/// The claim's object name of the part `shard` of an output.
fn claim_object(shard: Option<Shard>) -> String {
    match shard {
        None => WRITER_OBJECT.to_string(),
        Some(shard) => format!("_backfill-writer.{}.json", shard.tag()),
    }
}

/// The part whose claim `name` is: `Some(None)` for the whole output's, `None` for any
/// other name.
pub fn part_of_claim(name: &str) -> Option<Option<Shard>> {
    if name == WRITER_OBJECT {
        return Some(None);
    }
    let tag = name
        .strip_prefix("_backfill-writer.")?
        .strip_suffix(".json")?;
    Shard::parse_tag(tag).map(Some)
}

/// A sync round that did not finish.
enum SyncError {
    /// A cache file went away while it was read.
    Gone,
    Failed(Error),
}

impl From<Error> for SyncError {
    fn from(e: Error) -> Self {
        SyncError::Failed(e)
    }
}

/// `read(path)` of a cache file: its going away is [`SyncError::Gone`].
fn local_file<T>(
    path: &Path,
    read: impl FnOnce(&Path) -> std::io::Result<T>,
) -> std::result::Result<T, SyncError> {
    match read(path) {
        Ok(value) => Ok(value),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SyncError::Gone),
        Err(e) => Err(SyncError::Failed(crate::store::io::named(path, e).into())),
    }
}

/// The default cache of the part `shard` of the output `url`:
/// `out/cache/<the URL, made a file name>` (`.shard-I-of-N` appended for a shard).
pub fn default_cache(url: &Path, shard: Option<Shard>) -> PathBuf {
    let name: String = (url.to_string_lossy().chars())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = match shard {
        None => name,
        Some(shard) => format!("{name}.{}", shard.tag()),
    };
    Path::new("out").join("cache").join(name)
}

/// This cache's writer id, made (and kept) on its first use.
fn writer_id(cache: &Path) -> Result<String> {
    let path = cache.join(WRITER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(id) => return Ok(id.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::from(crate::store::io::named(&path, e))),
    }
    std::fs::create_dir_all(cache).map_err(|e| crate::store::io::named(cache, e))?;
    let id = format!("{:032x}", rand::random::<u128>());
    let tmp = cache.join(format!("{WRITER_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| crate::store::io::named(&path, e))?;
    Ok(id)
}

impl RemoteOut {
    /// Claims the part `shard` of `url` for the writer of `cache` (see the module docs), or
    /// refuses naming the writer that holds it. An output holding another layout's parts
    /// (unsharded and sharded, or shards of another N) is refused first.
    pub fn claim(url: &Path, cache: &Path, shard: Option<Shard>) -> Result<Self> {
        crate::job::output::check_layout(url, shard)?;
        let id = writer_id(cache)?;
        let claim_path = url.join(claim_object(shard));
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let cache_shown = std::fs::canonicalize(cache).unwrap_or_else(|_| cache.to_path_buf());
        let claim = serde_json::json!({
            "writer": id,
            "cache": cache_shown.display().to_string(),
            "host": host.trim(),
        });
        let bytes = bytes::Bytes::from(claim.to_string());
        if storage::put_if_absent(&claim_path, bytes)? == Put::Exists {
            let held = storage::read(&claim_path)?.unwrap_or_default();
            let held: serde_json::Value = serde_json::from_slice(&held).unwrap_or_default();
            if held["writer"].as_str() != Some(id.as_str()) {
                return Err(Error::dataset(
                    &claim_path,
                    "",
                    format!(
                        "the output is written by another replay (writer {}, cache {} on host \
                         {}); two writers never share an output: use another --out, or run \
                         from that cache (--cache) to resume it",
                        held["writer"].as_str().unwrap_or("?"),
                        held["cache"].as_str().unwrap_or("?"),
                        held["host"].as_str().unwrap_or("?"),
                    ),
                ));
            }
        }
        Ok(Self {
            url: url.to_path_buf(),
            cache: cache.to_path_buf(),
            confirmed: Arc::default(),
            shard,
        })
    }

    /// Makes `URL/changes` hold exactly the cache's published files (see the module docs);
    /// the files uploaded.
    pub fn sync(&self) -> Result<u64> {
        match self.sync_once() {
            Ok(uploaded) => Ok(uploaded),
            // A cache file went away while it was read: the replay is replacing its output
            // (`--fresh`, a new job). The next round sees the cache as it is then.
            Err(SyncError::Gone) => Ok(0),
            Err(SyncError::Failed(e)) => Err(e),
        }
    }

    fn sync_once(&self) -> std::result::Result<u64, SyncError> {
        let local = match part_files(&self.cache, self.shard) {
            Ok(files) => files,
            // No output yet: nothing to upload (and nothing remote is the cache's).
            Err(_) if !self.cache.join(CHANGES_DIR).exists() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut sizes = std::collections::BTreeMap::new();
        for (epoch, path) in &local {
            let meta = local_file(path, |p| std::fs::metadata(p))?;
            let modified = local_file(path, |_| meta.modified())?;
            sizes.insert(*epoch, (path.clone(), meta.len(), modified));
        }
        let mut confirmed = (self.confirmed.lock())
            .map_err(|_| Error::config("the upload's record is poisoned".into()))?;
        let remote_dir = self.url.join(CHANGES_DIR);
        let mut remote = std::collections::BTreeMap::new();
        for entry in storage::list(&remote_dir)?.unwrap_or_default() {
            if let Some(name) = parse_output_name(&entry.name)
                && !name.tmp
                && name.shard == self.shard
                && entry.is_file
            {
                remote.insert(name.epoch, entry);
            }
        }
        // Objects the cache does not hold as they are: an earlier output's. Newest first. An
        // object of the cache file's name and size is read back once and compared.
        let mut stale = Vec::new();
        for (epoch, entry) in remote.iter().rev() {
            let same = match sizes.get(epoch) {
                Some((path, size, modified)) if *size == entry.size => {
                    let key = (*epoch, *size, *modified);
                    confirmed.contains(&key) || {
                        let local = local_file(path, |p| std::fs::read(p))?;
                        let held = storage::read(&entry.path)?;
                        let same = held.is_some_and(|held| held.as_ref() == local.as_slice());
                        if same {
                            confirmed.insert(key);
                        }
                        same
                    }
                }
                _ => false,
            };
            if !same {
                storage::delete(&entry.path)?;
                stale.push(*epoch);
            }
        }
        let mut uploaded = 0;
        for (epoch, (path, size, modified)) in &sizes {
            if remote.contains_key(epoch) && !stale.contains(epoch) {
                continue;
            }
            let name = path.file_name().map(|n| n.to_owned()).unwrap_or_default();
            let target = remote_dir.join(name);
            let bytes = match local_file(path, |p| std::fs::read(p)) {
                Ok(bytes) => bytes,
                Err(SyncError::Gone) => return Ok(uploaded),
                Err(e) => return Err(e),
            };
            if storage::put_if_absent(&target, bytes.into())? == Put::Exists
                && storage::size(&target)? != Some(*size)
            {
                return Err(SyncError::Failed(Error::dataset(
                    &target,
                    "",
                    "another writer's object is in the output (its size differs from this \
                     checkpoint's file): two writers never share an output",
                )));
            }
            confirmed.insert((*epoch, *size, *modified));
            uploaded += 1;
        }
        Ok(uploaded)
    }

    /// Starts syncing on a thread of its own until [`Syncing::finish`].
    pub fn start(self) -> Syncing {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("backfill-upload".into())
            .spawn({
                let stop = stop.clone();
                let remote = self.clone();
                move || {
                    let mut uploaded = 0;
                    while !stop.load(Ordering::Relaxed) {
                        uploaded += remote.sync()?;
                        std::thread::sleep(SYNC_INTERVAL);
                    }
                    Ok(uploaded)
                }
            });
        Syncing {
            remote: self,
            stop,
            thread: thread.ok(),
        }
    }
}

/// A [`RemoteOut`] being synced by its thread.
pub struct Syncing {
    remote: RemoteOut,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<u64>>>,
}

impl Syncing {
    /// Stops the thread and syncs once more (what the run committed last); the files
    /// uploaded in all.
    pub fn finish(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut uploaded = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result?,
            Some(Err(_)) => return Err(Error::config("the upload thread panicked".into())),
            None => 0,
        };
        uploaded += self.remote.sync()?;
        Ok(uploaded)
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
