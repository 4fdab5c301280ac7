//! Checkpoints on object storage: a replay whose output is on object storage keeps its
//! state there too, so that a worker on an empty machine, running the same command,
//! restores the latest checkpoint and resumes exactly; the local state is a cache.
//!
//! ```text
//!   CK = URL/_backfill-state (a shard's: URL/_backfill-state.shard-I-of-N), or --checkpoint-url
//!   CK/files/run-<id>.<size>-<tail crc>.arrow  the state's run files (immutable; the name
//!                                               tells one file's bytes from another's)
//!   CK/changes/<output file name>               committed output files, staged before
//!                                               their checkpoint, removed once published
//!   CK/manifest-<seq>                           the store's manifest at checkpoint seq
//!   CK/checkpoint-<seq, 20 digits>.json         the commit point: names all of the above,
//!                                               with the output's job record
//!
//!   a round (the upload thread, every 250 ms, and once more at the end):
//!   1. an image of the store's committed state (its files pinned: compaction cannot
//!      remove them meanwhile); nothing new since the last round: done
//!   2. run files not yet in CK/files uploaded (in parts, bounded memory); output files of
//!      the image's checkpoints not yet published staged in CK/changes
//!   3. PUT CK/manifest-<S>, then create-if-absent PUT CK/checkpoint-<S>.json  ◀── commit
//!      point. Found there already: another worker took the output over since this one's
//!      last checkpoint; this one stops (exit 2)
//!   4. publish: each output file the checkpoint names that readers do not see yet is
//!      copied (server side) to URL/changes; this part's objects there that the checkpoint
//!      does not name (an output replaced by --fresh) are deleted
//!   5. collect: run files neither this checkpoint nor the one before names, checkpoints
//!      and manifests before the one before
//! ```
//!
//! Exactly once: a reader of `URL/changes` sees an output file only after a checkpoint
//! naming it is durable in the bucket, so whatever the bucket's latest checkpoint, every
//! visible file is one of its files: a worker restoring it continues right after them.
//! Checkpoint numbers fence writers: a worker writes checkpoint S + 1 only after its own
//! checkpoint S (or after restoring S), so of two workers that both continue from S (a
//! machine presumed lost, and its replacement) exactly one creates S + 1; the other finds
//! it, stops before publishing anything, and exits with status 2.
//!
//! Restore (before the replay starts, [`Checkpoints::prepare`]): when the bucket holds a
//! checkpoint and the cache holds no state, or an older one than the bucket's latest (its
//! last checkpoint number, kept in `CACHE/.backfill-checkpoint`, is lower: another worker
//! went on since), the cache is rebuilt from the latest checkpoint: the state's files
//! through `durable::restore` (checked as any store is on open), the output files, the job
//! record and the writer's id, which makes the new machine the same writer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::output::{
    CHANGES_DIR, FileRecord, JobRecord, META_JOB_ID, Place, job_file, parse_output_name,
    part_file_name, part_tmp_name,
};
use crate::job::shard::Shard;
use crate::replay::storage::{self, Put};
use crate::store::durable::{self, DurableOptions, DurableStore, ImageSource, StoreImage};
use crate::store::io::{RealIo, StorageIo, named};

/// The checkpoints' folder under the output URL (`_`: readers' globs skip it).
pub const STATE_OBJECT: &str = "_backfill-state";
/// The last checkpoint this cache wrote or restored, in the cache.
const SEQ_FILE: &str = ".backfill-checkpoint";
/// The entity tags of the output objects this cache published, in the cache.
const TAGS_FILE: &str = ".backfill-published";
/// The prefix of the sink's records of output files in the state's meta.
const SINK_RECORDS: &str = "job.replay.sink.";
/// The format of a checkpoint object.
const FORMAT: u32 = 1;
/// Restores started over from a later checkpoint before one is let fail.
const RESTORE_ATTEMPTS: usize = 4;

/// The checkpoints' folder of the part `shard` of the output `url`.
pub fn default_root(url: &Path, shard: Option<Shard>) -> PathBuf {
    match shard {
        None => url.join(STATE_OBJECT),
        Some(shard) => url.join(format!("{STATE_OBJECT}.{}", shard.tag())),
    }
}

/// A checkpoint object: everything a worker needs to restore it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointDoc {
    format: u32,
    seq: u64,
    /// The writer's id (`CACHE/.backfill-writer`): a restoring worker becomes this writer.
    writer: String,
    /// The store's last committed epoch (`None`: load steps only).
    committed_epoch: Option<u64>,
    /// The manifest's object, under the checkpoints' folder.
    manifest: String,
    files: Vec<DocFile>,
    changes: Vec<DocChange>,
    /// The output's job record (`OUT/.backfill-job`), as JSON.
    job_record: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DocFile {
    /// Its name in the state directory.
    name: String,
    /// Its object, under the checkpoints' folder.
    object: String,
    size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DocChange {
    name: String,
    size: u64,
}

/// The object name of a checkpoint.
fn checkpoint_name(seq: u64) -> String {
    format!("checkpoint-{seq:020}.json")
}

/// The number of a checkpoint's object name.
fn checkpoint_seq(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The object name of a manifest.
fn manifest_name(seq: u64) -> String {
    format!("manifest-{seq:020}")
}

/// The number of a manifest's object name.
fn manifest_seq(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("manifest-")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The object (under the folder) of a run file, named by what tells its bytes apart.
fn file_object(file: &durable::ImageFile) -> String {
    let stem = file.name.strip_suffix(".arrow").unwrap_or(&file.name);
    format!("files/{stem}.{}-{:08x}.arrow", file.size, file.tail_crc)
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    pub seq: u64,
    pub committed_epoch: Option<u64>,
    pub files: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// What the rounds of one run did.
#[derive(Debug, Clone, Default)]
pub struct Uploads {
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Output files published.
    pub published: u64,
    /// Bytes uploaded (run files, staged output files, manifests).
    pub bytes: u64,
    /// Each checkpoint's upload, from its image to its commit point, in seconds.
    pub latencies: Vec<f64>,
}

/// The checkpoints of one part of an output on object storage (see the module docs).
#[derive(Debug)]
pub struct Checkpoints {
    out: PathBuf,
    root: PathBuf,
    cache: PathBuf,
    state: PathBuf,
    shard: Option<Shard>,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    writer: String,
    /// The next checkpoint's number.
    next_seq: u64,
    /// What the last checkpoint held (`None`: none written by this run).
    last: Option<u64>,
    /// Run file objects in the folder.
    files: HashSet<String>,
    /// The run file objects of the last two checkpoints (the older first).
    named: [HashSet<String>; 2],
    /// Output files this run staged in the folder, with their sizes.
    staged: HashMap<String, u64>,
    /// Staged output files found in the folder at the start: an earlier run's, never trusted
    /// (a killed worker may have staged a file of the same name and size but other bytes
    /// for a checkpoint it never wrote). Deleted after this run's first checkpoint (the
    /// latest then: no other checkpoint can name them).
    leftovers: HashSet<String>,
    /// This part's output files readers see, with their sizes: published by this cache
    /// (their entity tag unchanged since), or read back and found equal to the cache's.
    visible: BTreeMap<String, u64>,
    /// The entity tags of the objects this cache published (`TAGS_FILE`).
    tags: BTreeMap<String, String>,
    /// Checkpoint and manifest numbers in the folder.
    old: Vec<(u64, String)>,
    uploads: Uploads,
}

impl Checkpoints {
    /// Looks at the bucket and the cache: restores the latest checkpoint into the cache
    /// when the cache holds no state or an older one (see the module docs), unless
    /// `fresh` (a new job: the next checkpoint replaces the output). `state` is the
    /// cache's state directory.
    pub fn prepare(
        out: &Path,
        root: &Path,
        cache: &Path,
        state: &Path,
        shard: Option<Shard>,
        fresh: bool,
    ) -> Result<(Self, Option<Restored>)> {
        let mut inner = Inner::default();
        let mut latest: Option<u64> = None;
        for entry in storage::list(root)?.unwrap_or_default() {
            let seq = checkpoint_seq(&entry.name).or_else(|| manifest_seq(&entry.name));
            if let Some(seq) = seq {
                inner.old.push((seq, entry.name.clone()));
            }
            if let Some(seq) = checkpoint_seq(&entry.name) {
                latest = latest.max(Some(seq));
            }
        }
        for entry in storage::list(&root.join("files"))?.unwrap_or_default() {
            inner.files.insert(format!("files/{}", entry.name));
        }
        for entry in storage::list(&root.join(CHANGES_DIR))?.unwrap_or_default() {
            inner.leftovers.insert(entry.name.clone());
        }
        inner.next_seq = latest.map_or(1, |s| s + 1);
        let this = Self {
            out: out.to_path_buf(),
            root: root.to_path_buf(),
            cache: cache.to_path_buf(),
            state: state.to_path_buf(),
            shard,
            inner: Mutex::new(inner),
        };
        let has_state =
            state.join("MANIFEST").exists() && !state.join(durable::RESTORING_FILE).exists();
        let local_seq = read_seq(cache)?;
        let restored = match latest {
            Some(latest) if !(fresh || has_state && local_seq >= Some(latest)) => {
                Some(this.restore_latest(latest)?)
            }
            _ => None,
        };
        this.list_visible()?;
        Ok((this, restored))
    }

    /// Reads which of this part's output objects readers see hold what this cache
    /// published ([`visible_as_published`]); records the tags of those found equal.
    fn list_visible(&self) -> Result<()> {
        let mut inner = self.lock()?;
        inner.tags = read_tags(&self.cache)?;
        let mut found = BTreeMap::new();
        for entry in storage::list(&self.out.join(CHANGES_DIR))?.unwrap_or_default() {
            if let Some(name) = parse_output_name(&entry.name)
                && !name.tmp
                && name.shard == self.shard
                && entry.is_file
                && visible_as_published(&entry, &inner.tags, &self.cache.join(CHANGES_DIR))?
            {
                inner.visible.insert(entry.name.clone(), entry.size);
                if let Some(tag) = &entry.e_tag {
                    found.insert(entry.name.clone(), tag.clone());
                }
            }
        }
        if found != inner.tags {
            inner.tags = found;
            write_tags(&self.cache, &inner.tags)?;
        }
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| Error::config("the checkpoints' record is poisoned".into()))
    }

    /// The writer id this run writes as (set once the claim is made).
    pub fn set_writer(&self, writer: &str) -> Result<()> {
        self.lock()?.writer = writer.to_string();
        Ok(())
    }

    fn read_doc(&self, seq: u64) -> Result<CheckpointDoc> {
        let path = self.root.join(checkpoint_name(seq));
        let bytes = storage::read(&path)?.ok_or_else(|| {
            Error::dataset(&path, "", "the checkpoint went away while it was read")
        })?;
        let doc: CheckpointDoc = serde_json::from_slice(&bytes)
            .map_err(|e| Error::dataset(&path, "", format!("not a checkpoint: {e}")))?;
        if doc.format != FORMAT || doc.seq != seq {
            return Err(Error::dataset(
                &path,
                "",
                format!(
                    "a checkpoint of format {} numbered {}, not format {FORMAT} numbered {seq}: \
                     written by another version of backfill",
                    doc.format, doc.seq
                ),
            ));
        }
        Ok(doc)
    }

    /// Rebuilds the cache from checkpoint `seq`, or from a later one: a worker still
    /// writing the output may collect the objects of `seq` while they are read (two
    /// checkpoints later), and the restore then starts over from the latest.
    fn restore_latest(&self, mut seq: u64) -> Result<Restored> {
        for _ in 0..RESTORE_ATTEMPTS {
            match self.restore(seq) {
                Ok(restored) => return Ok(restored),
                Err(e) => {
                    let latest = (storage::list(&self.root)?.unwrap_or_default().iter())
                        .filter_map(|entry| checkpoint_seq(&entry.name))
                        .max();
                    match latest {
                        Some(latest) if latest > seq => seq = latest,
                        _ => return Err(e),
                    }
                }
            }
        }
        self.restore(seq)
    }

    /// Rebuilds the cache from checkpoint `seq` (see the module docs).
    fn restore(&self, seq: u64) -> Result<Restored> {
        let started = Instant::now();
        let doc = self.read_doc(seq)?;
        let io = RealIo;
        // The cache's state (its store's files only: `--state` may name a directory that
        // holds others) and this part's output files are replaced.
        let changes = self.cache.join(CHANGES_DIR);
        if let Ok(entries) = std::fs::read_dir(&changes) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                // An interrupted restore's downloads end in `.part`.
                let name = name.strip_suffix(".part").unwrap_or(&name);
                if parse_output_name(name).is_some_and(|n| n.shard == self.shard) {
                    std::fs::remove_file(entry.path()).map_err(|e| named(&entry.path(), e))?;
                }
            }
        }
        let tags = self.cache.join(TAGS_FILE);
        if tags.exists() {
            std::fs::remove_file(&tags).map_err(|e| named(&tags, e))?;
        }
        let manifest_path = self.root.join(&doc.manifest);
        let manifest =
            storage::read(&manifest_path)?.ok_or_else(|| missing_object(&manifest_path, seq))?;
        let objects: HashMap<&str, &DocFile> =
            doc.files.iter().map(|f| (f.name.as_str(), f)).collect();
        let mut bytes = 0;
        // The tool's error of a failed download, told instead of the store's.
        let mut failed: Option<Error> = None;
        let restored = durable::restore(
            &io,
            &self.state,
            &manifest,
            &manifest_path,
            true,
            |file, to| {
                let fetched = (objects.get(file.name.as_str()))
                    .ok_or_else(|| {
                        Error::dataset(
                            self.root.join(checkpoint_name(seq)),
                            "",
                            format!("names no object for the state's file {}", file.name),
                        )
                    })
                    .and_then(|entry| {
                        let object = self.root.join(&entry.object);
                        storage::get_file(&object, to)?.ok_or_else(|| missing_object(&object, seq))
                    });
                match fetched {
                    Ok(size) => {
                        bytes += size;
                        Ok(())
                    }
                    Err(e) => {
                        let message = e.to_string();
                        failed = Some(e);
                        Err(arrangement_backfill::Error::Internal(message))
                    }
                }
            },
        );
        if let Err(e) = restored {
            return Err(failed.take().unwrap_or_else(|| e.into()));
        }
        std::fs::create_dir_all(&changes).map_err(|e| named(&changes, e))?;
        for change in &doc.changes {
            let target = changes.join(&change.name);
            let part = changes.join(format!("{}.part", change.name));
            let visible = self.out.join(CHANGES_DIR).join(&change.name);
            let staged = self.root.join(CHANGES_DIR).join(&change.name);
            let got = match storage::get_file(&visible, &part)? {
                Some(size) => size,
                None => storage::get_file(&staged, &part)?
                    .ok_or_else(|| missing_object(&staged, seq))?,
            };
            if got != change.size {
                return Err(Error::dataset(
                    &visible,
                    "",
                    format!(
                        "{got} bytes, where checkpoint {seq} says {} bytes: the output was \
                         changed by something else than backfill",
                        change.size
                    ),
                ));
            }
            io.rename(&part, &target)?;
            bytes += got;
        }
        if let Some(value) = &doc.job_record {
            let mut record: JobRecord = serde_json::from_value(value.clone()).map_err(|e| {
                Error::dataset(
                    self.root.join(checkpoint_name(seq)),
                    "",
                    format!("unreadable job record: {e}"),
                )
            })?;
            record.state = Some(Place::of(&self.state)?.path);
            record.write(&io, &self.cache, self.shard)?;
        }
        crate::job::remote::write_writer_id(&self.cache, &doc.writer)?;
        write_seq(&self.cache, seq)?;
        let mut inner = self.lock()?;
        inner.named = [
            HashSet::new(),
            doc.files.iter().map(|f| f.object.clone()).collect(),
        ];
        inner.next_seq = inner.next_seq.max(seq + 1);
        Ok(Restored {
            seq,
            committed_epoch: doc.committed_epoch,
            files: doc.files.len() + doc.changes.len(),
            bytes,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// One round (see the module docs): a checkpoint of `image` if it holds anything new.
    pub fn round(&self, image: &StoreImage) -> Result<()> {
        let record_path = self.cache.join(job_file(self.shard));
        let record: Option<serde_json::Value> = match std::fs::read(&record_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(named(&record_path, e).into()),
        };
        // Only a state tied to the output's record is this output's checkpoint (a run that
        // refused another job's state leaves both as they were).
        let job = image.meta().get(META_JOB_ID);
        let record_job = record.as_ref().and_then(|r| r["job"].as_str());
        if job.is_none() || job.map(String::as_str) != record_job {
            return Ok(());
        }
        let fingerprint = fingerprint(image, record.as_ref());
        let mut inner = self.lock()?;
        if inner.last == Some(fingerprint) {
            return Ok(());
        }
        let started = Instant::now();
        let seq = inner.next_seq;
        // 2. Files first.
        let mut files = Vec::with_capacity(image.files().len());
        for file in image.files() {
            let object = file_object(file);
            if !inner.files.contains(&object) {
                inner.uploads.bytes += storage::put_file(&file.path, &self.root.join(&object))?;
                inner.files.insert(object.clone());
            }
            files.push(DocFile {
                name: file.name.clone(),
                object,
                size: file.size,
            });
        }
        let mut changes = Vec::new();
        for (key, value) in image.meta().range(SINK_RECORDS.to_string()..) {
            let Some(epoch) = key.strip_prefix(SINK_RECORDS) else {
                break;
            };
            let (Ok(epoch), Some(record)) = (epoch.parse::<u64>(), FileRecord::decode(value))
            else {
                continue;
            };
            let name = part_file_name(epoch, self.shard);
            if inner.visible.get(&name) != Some(&record.size)
                && inner.staged.get(&name) != Some(&record.size)
            {
                let local = self.committed_file(epoch)?;
                let target = self.root.join(CHANGES_DIR).join(&name);
                inner.uploads.bytes += storage::put_file(&local, &target)?;
                inner.staged.insert(name.clone(), record.size);
            }
            changes.push(DocChange {
                name,
                size: record.size,
            });
        }
        // 3. The commit point.
        let manifest = manifest_name(seq);
        storage::put(&self.root.join(&manifest), image.manifest().to_vec().into())?;
        inner.uploads.bytes += image.manifest().len() as u64;
        let doc = CheckpointDoc {
            format: FORMAT,
            seq,
            writer: inner.writer.clone(),
            committed_epoch: image.committed_epoch(),
            manifest: manifest.clone(),
            files,
            changes,
            job_record: record,
        };
        let bytes = serde_json::to_vec(&doc)
            .map_err(|e| crate::error::internal!("checkpoint encoding: {e}"))?;
        let path = self.root.join(checkpoint_name(seq));
        if storage::put_if_absent(&path, bytes.into())? == Put::Exists {
            return Err(Error::StateConflict {
                path,
                message: format!(
                    "another worker wrote this checkpoint after this run's last ({}): it took \
                     the output over (two workers never share an output); this run stops, \
                     its later work unpublished",
                    seq - 1
                ),
            });
        }
        write_seq(&self.cache, seq)?;
        inner
            .uploads
            .latencies
            .push(started.elapsed().as_secs_f64());
        inner.uploads.checkpoints += 1;
        inner.next_seq = seq + 1;
        inner.last = Some(fingerprint);
        inner.old.push((seq, checkpoint_name(seq)));
        inner.old.push((seq, manifest));
        let named_now: HashSet<String> = doc.files.iter().map(|f| f.object.clone()).collect();
        inner.named.swap(0, 1);
        inner.named[1] = named_now;
        // 4. Publish: from the object this run staged, or else from the cache's file (an
        //    earlier run's checkpoint restored before it was published; a visible object
        //    since changed by something else).
        let mut tags_changed = false;
        for change in &doc.changes {
            let target = self.out.join(CHANGES_DIR).join(&change.name);
            if inner.visible.get(&change.name) != Some(&change.size) {
                if inner.staged.contains_key(&change.name) {
                    let staged = self.root.join(CHANGES_DIR).join(&change.name);
                    storage::copy(&staged, &target)?;
                } else {
                    let epoch = (parse_output_name(&change.name).map(|n| n.epoch))
                        .ok_or_else(|| crate::error::internal!("output name {}", change.name))?;
                    inner.uploads.bytes +=
                        storage::put_file(&self.committed_file(epoch)?, &target)?;
                }
                inner.visible.insert(change.name.clone(), change.size);
                inner.uploads.published += 1;
                match storage::e_tag(&target)? {
                    Some(tag) => inner.tags.insert(change.name.clone(), tag),
                    None => inner.tags.remove(&change.name),
                };
                tags_changed = true;
            }
            if inner.staged.remove(&change.name).is_some() {
                storage::delete(&self.root.join(CHANGES_DIR).join(&change.name))?;
            }
        }
        for name in std::mem::take(&mut inner.leftovers) {
            if !inner.staged.contains_key(&name) {
                storage::delete(&self.root.join(CHANGES_DIR).join(&name))?;
            }
        }
        let named_changes: HashSet<&str> = doc.changes.iter().map(|c| c.name.as_str()).collect();
        let stale: Vec<String> = (inner.visible.keys().rev())
            .filter(|name| !named_changes.contains(name.as_str()))
            .cloned()
            .collect();
        for name in stale {
            storage::delete(&self.out.join(CHANGES_DIR).join(&name))?;
            inner.visible.remove(&name);
            tags_changed |= inner.tags.remove(&name).is_some();
        }
        if tags_changed {
            write_tags(&self.cache, &inner.tags)?;
        }
        // 5. Collect.
        let keep: HashSet<String> = inner.named.iter().flatten().cloned().collect();
        let unused: Vec<String> = (inner.files.iter())
            .filter(|object| !keep.contains(*object))
            .cloned()
            .collect();
        for object in unused {
            storage::delete(&self.root.join(&object))?;
            inner.files.remove(&object);
        }
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.old)
            .into_iter()
            .partition(|(s, _)| *s + 1 < seq);
        inner.old = kept;
        for (_, name) in old {
            storage::delete(&self.root.join(name))?;
        }
        Ok(())
    }

    /// The cache's file of checkpoint `epoch`: published, or still `.tmp` (the replay
    /// publishes it right after its commit).
    fn committed_file(&self, epoch: u64) -> Result<PathBuf> {
        let dir = self.cache.join(CHANGES_DIR);
        let published = dir.join(part_file_name(epoch, self.shard));
        let tmp = dir.join(part_tmp_name(epoch, self.shard));
        for path in [&published, &tmp, &published] {
            if path.exists() {
                return Ok(path.clone());
            }
        }
        Err(Error::StateConflict {
            path: published,
            message: "is missing: the state recorded it at its checkpoint's commit (the \
                      cache was changed by something else than backfill)"
                .into(),
        })
    }

    /// A round on the state directory's committed state, with the store closed (the
    /// replay ended): the last checkpoint of a run.
    pub fn final_round(&self, source: Option<&ImageSource>) -> Result<()> {
        if let Some(image) = source.map(ImageSource::image).transpose()?.flatten() {
            return self.round(&image);
        }
        if !self.state.join("MANIFEST").exists() {
            return Ok(());
        }
        let options = DurableOptions {
            compaction: durable::Compaction::Manual,
            ..DurableOptions::default()
        };
        let store = DurableStore::open_with(&self.state, RealIo::shared(), options)?;
        let image = store.image()?;
        self.round(&image)
    }

    /// What the rounds did so far.
    pub fn uploads(&self) -> Result<Uploads> {
        Ok(self.lock()?.uploads.clone())
    }
}

/// A hash of what a checkpoint of `image` would hold.
fn fingerprint(image: &StoreImage, record: Option<&serde_json::Value>) -> u64 {
    // Fixed keys: equal images hash alike.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for file in image.files() {
        h.write(file.name.as_bytes());
        h.write_u64(file.size);
        h.write_u32(file.tail_crc);
    }
    h.write_u64(image.committed_epoch().map_or(0, |e| e + 1));
    for (key, value) in image.meta() {
        h.write(key.as_bytes());
        h.write(value.as_bytes());
    }
    if let Some(record) = record {
        h.write(record.to_string().as_bytes());
    }
    h.finish()
}

fn missing_object(path: &Path, seq: u64) -> Error {
    Error::dataset(
        path,
        "",
        format!(
            "is missing, though checkpoint {seq} names it: the bucket was changed by \
             something else than backfill"
        ),
    )
}

/// Whether the output object `entry` holds what this cache published under its name: its
/// entity tag is the one recorded at its publication, or its bytes are the cache's file's
/// (read back once; an earlier output's file may have the same name and size).
fn visible_as_published(
    entry: &storage::Entry,
    tags: &BTreeMap<String, String>,
    changes: &Path,
) -> Result<bool> {
    if entry.e_tag.is_some() && tags.get(&entry.name) == entry.e_tag.as_ref() {
        return Ok(true);
    }
    let local = changes.join(&entry.name);
    let Ok(meta) = std::fs::metadata(&local) else {
        // Not in the cache (a restore reads it; the state's record of its checksum checks
        // it then).
        return Ok(true);
    };
    if meta.len() != entry.size {
        return Ok(false);
    }
    let held = storage::read(&entry.path)?;
    let bytes = std::fs::read(&local).map_err(|e| named(&local, e))?;
    Ok(held.is_some_and(|held| held.as_ref() == bytes.as_slice()))
}

fn read_tags(cache: &Path) -> Result<BTreeMap<String, String>> {
    let path = cache.join(TAGS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(named(&path, e).into()),
    }
}

fn write_tags(cache: &Path, tags: &BTreeMap<String, String>) -> Result<()> {
    let path = cache.join(TAGS_FILE);
    let tmp = cache.join(format!("{TAGS_FILE}.tmp"));
    let bytes = serde_json::to_vec(tags).map_err(|e| crate::error::internal!("tags: {e}"))?;
    std::fs::create_dir_all(cache).map_err(|e| named(cache, e))?;
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| named(&path, e))?;
    Ok(())
}

/// The last checkpoint number the cache wrote or restored.
fn read_seq(cache: &Path) -> Result<Option<u64>> {
    let path = cache.join(SEQ_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(named(&path, e).into()),
    }
}

fn write_seq(cache: &Path, seq: u64) -> Result<()> {
    let path = cache.join(SEQ_FILE);
    let tmp = cache.join(format!("{SEQ_FILE}.tmp"));
    std::fs::create_dir_all(cache).map_err(|e| named(cache, e))?;
    std::fs::write(&tmp, format!("{seq}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| named(&path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use object_store::memory::InMemory;

    use super::*;
    use crate::chunk::StreamChunk;
    use crate::key::KeyColumn;
    use crate::replay::storage::faulty::FaultyStore;
    use crate::store::{StateStore, StateTable};
    use crate::table::TableDesc;
    use crate::vnode::{VnodeBitmap, VnodeCount};

    /// A cache whose durable store (table `t` of 4 vnodes) is tied to job `J` and commits
    /// epochs that each add 100 rows and an output file (`changes/epoch-E.parquet`, recorded
    /// in the state as the sink records it).
    struct Cache {
        dir: tempfile::TempDir,
        store: DurableStore,
        table: crate::store::DurableTable,
    }

    impl Cache {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let options = DurableOptions {
                compaction: durable::Compaction::Manual,
                ..DurableOptions::default()
            };
            let store =
                DurableStore::open_with(dir.path().join("state"), RealIo::shared(), options)
                    .unwrap();
            let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
            let desc = TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(4).unwrap());
            let desc = store.create_table(desc).unwrap();
            let table = store
                .table("t", VnodeBitmap::full(desc.vnode_count()))
                .unwrap();
            let record = serde_json::json!({"job": "J", "state": null});
            std::fs::write(dir.path().join(job_file(None)), record.to_string()).unwrap();
            std::fs::create_dir_all(dir.path().join(CHANGES_DIR)).unwrap();
            Self { dir, store, table }
        }

        fn commit(&mut self, epoch: u64) {
            let schema = self.table.desc().schema().clone();
            let keys = Int64Array::from_iter_values((0..100).map(|i| epoch as i64 * 1000 + i));
            let batch = RecordBatch::try_new(schema, vec![Arc::new(keys)]).unwrap();
            self.table.write(&StreamChunk::inserts(batch)).unwrap();
            self.table.seal(epoch).unwrap();
            let bytes = format!("output of epoch {epoch}").repeat(epoch as usize);
            let name = part_file_name(epoch, None);
            std::fs::write(self.dir.path().join(CHANGES_DIR).join(&name), &bytes).unwrap();
            let record = FileRecord {
                rows: 1,
                size: bytes.len() as u64,
                crc: crc32fast::hash(bytes.as_bytes()),
            };
            let store = &self.store;
            store.stage_meta(META_JOB_ID, "J").unwrap();
            store
                .stage_meta(&format!("{SINK_RECORDS}{epoch:020}"), &record.encode())
                .unwrap();
            store.commit(epoch).unwrap();
        }

        fn checkpoints(&self, bucket: &str) -> Checkpoints {
            let out = PathBuf::from(format!("memory://{bucket}/out"));
            let (checkpoints, restored) = Checkpoints::prepare(
                &out,
                &default_root(&out, None),
                self.dir.path(),
                &self.dir.path().join("state"),
                None,
                false,
            )
            .unwrap();
            assert!(restored.is_none());
            checkpoints.set_writer("W").unwrap();
            checkpoints
        }
    }

    /// Restores the bucket's latest checkpoint onto an empty cache: its committed epoch
    /// (as the opened store says), and the output files readers see.
    fn restore_elsewhere(bucket: &str) -> (Option<u64>, Vec<String>) {
        let out = PathBuf::from(format!("memory://{bucket}/out"));
        let elsewhere = tempfile::tempdir().unwrap();
        let state = elsewhere.path().join("state");
        let (_, restored) = Checkpoints::prepare(
            &out,
            &default_root(&out, None),
            elsewhere.path(),
            &state,
            None,
            false,
        )
        .unwrap();
        let restored = restored.expect("a checkpoint to restore");
        let store = DurableStore::open(&state).unwrap();
        let epoch = store.committed_epoch().unwrap();
        assert_eq!(epoch, restored.committed_epoch);
        // The restored output files are the ones the state recorded.
        for (key, value) in store.meta_with_prefix(SINK_RECORDS).unwrap() {
            let epoch: u64 = key[SINK_RECORDS.len()..].parse().unwrap();
            let record = FileRecord::decode(&value).unwrap();
            let path = elsewhere
                .path()
                .join(CHANGES_DIR)
                .join(part_file_name(epoch, None));
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(crc32fast::hash(&bytes), record.crc, "{}", path.display());
        }
        let visible = (storage::list(&out.join(CHANGES_DIR))
            .unwrap()
            .unwrap_or_default())
        .into_iter()
        .map(|e| e.name)
        .collect();
        (epoch, visible)
    }

    fn names(epochs: std::ops::RangeInclusive<u64>) -> Vec<String> {
        epochs.map(|e| part_file_name(e, None)).collect()
    }

    /// Issue 45 items 3 and 5: a round whose N-th mutating call fails, for every N, leaves
    /// the bucket at the last checkpoint or the new one, whole (a restore elsewhere opens at
    /// its epoch with its recorded files), and readers never see a file of a checkpoint the
    /// bucket does not hold; the next run's round completes it.
    #[test]
    fn a_failed_call_at_any_point_of_a_round_leaves_a_whole_checkpoint() {
        let mut fault = 1;
        loop {
            let bucket = format!("ck-fault-{fault}");
            let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
            storage::register_memory_store(&bucket, faulty.clone());
            let mut cache = Cache::new();
            cache.commit(1);
            let checkpoints = cache.checkpoints(&bucket);
            checkpoints.round(&cache.store.image().unwrap()).unwrap();
            assert_eq!(restore_elsewhere(&bucket), (Some(1), names(1..=1)));
            cache.commit(2);
            cache.commit(3);
            faulty.fail_call(fault);
            let failed = checkpoints.round(&cache.store.image().unwrap());
            faulty.fail_call(0);
            let Err(error) = failed else {
                // Past the round's last call: every point was tried.
                assert!(fault > 5, "a round makes more than {fault} calls");
                break;
            };
            assert!(error.to_string().contains("injected failure"), "{error}");
            let (epoch, visible) = restore_elsewhere(&bucket);
            match epoch {
                Some(1) => assert_eq!(visible, names(1..=1), "fault {fault}"),
                Some(3) => assert!(
                    visible.iter().all(|v| names(1..=3).contains(v)),
                    "fault {fault}: {visible:?}"
                ),
                other => panic!("fault {fault}: restored epoch {other:?}"),
            }
            // The next run (a new round on the same cache) completes the checkpoint.
            drop(checkpoints);
            let next = cache.checkpoints(&bucket);
            next.round(&cache.store.image().unwrap()).unwrap();
            assert_eq!(restore_elsewhere(&bucket), (Some(3), names(1..=3)));
            fault += 1;
        }
    }

    /// A cache older than the bucket (its last checkpoint number lower) is restored over:
    /// only its store's files and its part's output files go; other files stay.
    #[test]
    fn an_older_cache_is_restored_over_keeping_what_is_not_the_stores() {
        let bucket = "ck-older";
        storage::register_memory_store(bucket, Arc::new(InMemory::new()));
        let mut cache = Cache::new();
        cache.commit(1);
        cache.commit(2);
        cache
            .checkpoints(bucket)
            .round(&cache.store.image().unwrap())
            .unwrap();
        let Cache { dir, store, table } = cache;
        drop((table, store));
        let state = dir.path().join("state");
        std::fs::write(state.join("notes.txt"), b"mine").unwrap();
        std::fs::write(dir.path().join(CHANGES_DIR).join("notes.txt"), b"mine").unwrap();
        write_seq(dir.path(), 0).unwrap();
        let out = PathBuf::from(format!("memory://{bucket}/out"));
        let (_, restored) = Checkpoints::prepare(
            &out,
            &default_root(&out, None),
            dir.path(),
            &state,
            None,
            false,
        )
        .unwrap();
        assert_eq!(restored.map(|r| r.committed_epoch), Some(Some(2)));
        assert_eq!(std::fs::read(state.join("notes.txt")).unwrap(), b"mine");
        let changes = dir.path().join(CHANGES_DIR);
        assert_eq!(std::fs::read(changes.join("notes.txt")).unwrap(), b"mine");
        let store = DurableStore::open(&state).unwrap();
        assert_eq!(store.committed_epoch().unwrap(), Some(2));
    }

    /// A checkpoint number another worker wrote first: the round stops with a state
    /// conflict (exit status 2) naming it, and publishes nothing.
    #[test]
    fn a_taken_checkpoint_number_stops_the_round_before_it_publishes() {
        let bucket = "ck-taken";
        storage::register_memory_store(bucket, Arc::new(InMemory::new()));
        let mut cache = Cache::new();
        cache.commit(1);
        let checkpoints = cache.checkpoints(bucket);
        checkpoints.round(&cache.store.image().unwrap()).unwrap();
        cache.commit(2);
        let out = PathBuf::from(format!("memory://{bucket}/out"));
        let taken = default_root(&out, None).join(checkpoint_name(2));
        storage::put(&taken, bytes::Bytes::from_static(b"{}")).unwrap();
        let error = checkpoints
            .round(&cache.store.image().unwrap())
            .unwrap_err();
        assert_eq!(error.exit_code(), 2, "{error}");
        assert!(error.to_string().contains("another worker"), "{error}");
        assert!(error.to_string().contains(&checkpoint_name(2)), "{error}");
        let visible: Vec<String> = (storage::list(&out.join(CHANGES_DIR)).unwrap())
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(visible, names(1..=1));
    }

    /// A stalled upload (every put held) never holds the store's commits: epochs commit
    /// while a round waits; once the upload goes on, that round's checkpoint is the state it
    /// took, and the next round's the latest.
    #[test]
    fn a_stalled_upload_does_not_hold_commits() {
        let bucket = "ck-stalled";
        let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
        storage::register_memory_store(bucket, faulty.clone());
        let mut cache = Cache::new();
        cache.commit(1);
        let checkpoints = Arc::new(cache.checkpoints(bucket));
        faulty.hold();
        let image = cache.store.image().unwrap();
        let round = std::thread::spawn({
            let checkpoints = checkpoints.clone();
            move || checkpoints.round(&image)
        });
        // Commits go on while the round waits on its first put (were they to wait for
        // the upload, this would never return).
        for epoch in 2..=4 {
            cache.commit(epoch);
        }
        assert!(!round.is_finished(), "the round waits for its upload");
        faulty.release();
        round.join().unwrap().unwrap();
        assert_eq!(restore_elsewhere(bucket), (Some(1), names(1..=1)));
        checkpoints.round(&cache.store.image().unwrap()).unwrap();
        assert_eq!(restore_elsewhere(bucket), (Some(4), names(1..=4)));
    }
}
