//! A replay's output on object storage (`--out s3://bucket/prefix`): exactly once, with no
//! rename, one writer; its checkpoints kept beside it (`checkpoint.rs`), so that any machine
//! resumes it.
//!
//! ```text
//!   the replay, as for a local --out, into CACHE (state, changes/*.parquet.tmp → rename)
//!        │ the store's committed state (an image: manifest + run files, pinned)
//!        ▼ a round (a thread, every SYNC_INTERVAL, and once more at the end, whatever the end)
//!   URL/_backfill-state/...       run files, staged output files, manifest, then
//!                                 checkpoint-S.json (create-if-absent: the commit point)
//!   URL/changes/epoch-E.parquet   published once a checkpoint names it (server-side copy)
//!   URL/_backfill-writer.json     the writer's claim, one create-if-absent PUT
//! ```
//!
//! Readers listing `URL/changes/*.parquet` see only whole objects (a PUT or copy is atomic)
//! of committed checkpoints, each epoch once (see `checkpoint.rs` for why, and for the
//! restore on an empty cache).
//!
//! One writer per output: the first run claims `URL` with a create-if-absent PUT of
//! `_backfill-writer.json` naming its writer id, kept in `CACHE/.backfill-writer`. A run from
//! another cache holding another writer's id finds the claim and stops with exit status 2
//! before writing anything; of two writers starting together, exactly one creates the claim.
//! A run on an empty cache restores the latest checkpoint first, and with it the writer's
//! id: it is the same writer, on another machine. Two such workers at once are told apart by
//! the checkpoints' numbers: the second to write a number stops (exit 2).
//!
//! A shard (`--shard I/N`) is a writer of its own part: its claim is
//! `_backfill-writer.shard-I-of-N.json`, its checkpoints `_backfill-state.shard-I-of-N/`,
//! its default cache `out/cache/<URL>.shard-I-of-N`, and it publishes and deletes only its
//! own names (`epoch-E.shard-I-of-N.parquet`), so the N shards of an output never touch
//! each other's objects.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::job::checkpoint::{Checkpoints, Uploads};
use crate::job::shard::Shard;
use crate::replay::storage::{self, Put};
use crate::store::durable::{ImageSource, StoreStamp};

/// The claim's object name under the output URL (`_`: readers' globs skip it).
pub const WRITER_OBJECT: &str = "_backfill-writer.json";
/// The writer id's file in the cache.
const WRITER_FILE: &str = ".backfill-writer";
/// How often the sync thread looks for newly published files.
const SYNC_INTERVAL: Duration = Duration::from_millis(250);

/// An output on object storage, claimed by this writer.
#[derive(Debug, Clone)]
pub struct RemoteOut {
    checkpoints: Arc<Checkpoints>,
    /// Where the replay puts its store's image source once the store is open.
    source: ImageSlot,
    /// The store's stamp at the last round's image ([`ImageSource::stamp`]): a round
    /// whose stamp is the same takes no image.
    stamp: Arc<Mutex<Option<StoreStamp>>>,
}

/// Where a replay leaves its durable store's [`ImageSource`] for the upload thread.
pub type ImageSlot = Arc<Mutex<Option<ImageSource>>>;

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
    let id = format!("{:032x}", rand::random::<u128>());
    write_writer_id(cache, &id)?;
    Ok(id)
}

/// Makes `id` the writer id of `cache` (a restore makes the new machine the same writer).
pub fn write_writer_id(cache: &Path, id: &str) -> Result<()> {
    let path = cache.join(WRITER_FILE);
    std::fs::create_dir_all(cache).map_err(|e| crate::store::io::named(cache, e))?;
    let tmp = cache.join(format!("{WRITER_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| crate::store::io::named(&path, e))?;
    Ok(())
}

impl RemoteOut {
    /// Claims the part `shard` of `url` for the writer of `cache` (see the module docs), or
    /// refuses naming the writer that holds it. The caller has refused an output holding
    /// another layout's parts (`output::check_layout`) before the checkpoints' restore.
    pub fn claim(
        url: &Path,
        cache: &Path,
        shard: Option<Shard>,
        checkpoints: Checkpoints,
        source: ImageSlot,
    ) -> Result<Self> {
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
        checkpoints.set_writer(&id)?;
        Ok(Self {
            checkpoints: Arc::new(checkpoints),
            source,
            stamp: Arc::default(),
        })
    }

    /// One round: a checkpoint of the store's committed state, if it holds anything new
    /// (nothing while no store is open).
    fn round(&self) -> Result<()> {
        let Some(source) = self.source_now()? else {
            return Ok(());
        };
        let stamp = source.stamp()?;
        let mut last = (self.stamp.lock())
            .map_err(|_| Error::config("the store's stamp is poisoned".into()))?;
        if stamp.is_none() || *last == stamp {
            return Ok(());
        }
        match source.image()? {
            Some(image) => {
                self.checkpoints.round(&image)?;
                *last = stamp;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn source_now(&self) -> Result<Option<ImageSource>> {
        Ok((self.source.lock())
            .map_err(|_| Error::config("the store's image source is poisoned".into()))?
            .clone())
    }

    /// Starts the rounds on a thread of their own until [`Syncing::finish`]. A round that
    /// fails ends the thread and sets [`Syncing::failed`]: the replay stops at its next
    /// checkpoint and `finish` returns the error.
    pub fn start(self) -> Syncing {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("backfill-upload".into())
            .spawn({
                let stop = stop.clone();
                let failed = failed.clone();
                let remote = self.clone();
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = remote.round() {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        std::thread::sleep(SYNC_INTERVAL);
                    }
                    Ok(())
                }
            });
        Syncing {
            remote: self,
            stop,
            failed,
            thread: thread.ok(),
        }
    }
}

/// A [`RemoteOut`] whose rounds run on their thread.
pub struct Syncing {
    remote: RemoteOut,
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Syncing {
    /// Set once a round failed (the thread has ended).
    pub fn failed(&self) -> Arc<AtomicBool> {
        self.failed.clone()
    }

    /// Stops the thread and runs the last round on what the run committed last (the store
    /// closed: from its directory); what the rounds did.
    pub fn finish(mut self) -> Result<Uploads> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result?,
            Some(Err(_)) => return Err(Error::config("the upload thread panicked".into())),
            None => {}
        }
        let source = self.remote.source_now()?;
        self.remote.checkpoints.final_round(source.as_ref())?;
        self.remote.checkpoints.uploads()
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
