//! A replay's output directory: what a path really names, which job an output belongs to,
//! and whether its committed files are still the ones committed.
//!
//! ```text
//!   OUT/.backfill-job           the output's job record (JSON): job id, state directory,
//!                               and, once finished, the final certificate
//!   OUT/changes/epoch-E.parquet the output files (`parse_output_name`, here)
//!
//!   a shard's (`--shard I/N`, `shard.rs`): every name carries its tag, shard-I-of-N
//!   OUT/.backfill-job.shard-I-of-N
//!   OUT/changes/epoch-E.shard-I-of-N.parquet
//!   OUT/.lock.shard-I-of-N
//!   STATE (meta)                replay.job_id: the same job id
//!                               the job's sink record of checkpoint E
//!                               (job.replay.sink.<E, 20 digits>): rows, size, crc32 of epoch-E
//! ```
//!
//! Invariants this module keeps:
//! - **Paths are compared by what they are**, never by how they are spelled
//!   (`Place`): the existing part of a path is resolved (symbolic links, `..`), the missing
//!   part is taken as the directories a replay would create, and containment is decided by
//!   the device and inode of each existing ancestor, so `nope/../DATASET`, a symbolic link
//!   and a bind mount of the dataset are all the dataset.
//! - **A state and its output name each other**: a durable job's id is committed in its
//!   state and written into `OUT/.backfill-job` before the job writes any output file. A
//!   state resumes only into the output that names its id; a new job takes over a
//!   directory holding another job's output files only with `--fresh` (or when that output
//!   was an in-memory job's, which can never be resumed).
//! - **Committed files are checked before a resume**: each checkpoint's file is recorded in
//!   the state at its commit (rows, size, CRC-32 of its bytes, computed as it was written);
//!   a resume refuses an output whose committed file is missing or altered, a file the state
//!   never recorded, and a published file of an epoch the state says never committed (which
//!   can only mean the state lost committed checkpoints).
//! - **Never a link out of OUT**: `OUT/changes` must be a real directory.
//! - **One layout per output**: unsharded, or N shards for one N. Each part (the whole
//!   output, or one shard) reads, checks and cleans up only its own names, so N shards share
//!   an output with no coordination; a run whose layout differs from what the output holds
//!   is refused ([`check_layout`]).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Error, Result};
use crate::job::shard::Shard;
use crate::store::durable::DirLock;
use crate::store::io::{StorageIo, named};

/// The output's job record, in the output directory.
pub const JOB_FILE: &str = ".backfill-job";
/// The output files' directory inside the output directory.
pub const CHANGES_DIR: &str = "changes";
/// The state's job id (meta key).
pub(crate) const META_JOB_ID: &str = "replay.job_id";

/// A path resolved to what it names: its existing part canonical (links and `..`
/// followed as the system does), its missing part as the directories a replay would create.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The resolved path.
    pub path: PathBuf,
    /// `(device, inode)` of the path and of each existing ancestor.
    ids: Vec<(u64, u64)>,
    /// Whether the path itself exists.
    exists: bool,
}

impl Place {
    /// Resolves `path` (relative to the working directory). A dangling symbolic link, or a
    /// component that exists but is not a directory, is an error naming it.
    pub fn of(path: &Path) -> Result<Self> {
        let mut resolved = if path.is_absolute() {
            PathBuf::from("/")
        } else {
            let cwd = std::env::current_dir()?;
            cwd.canonicalize().map_err(|e| named(&cwd, e))?
        };
        let mut exists = true;
        for component in path.components() {
            match component {
                Component::Prefix(_) | Component::RootDir => {
                    resolved = PathBuf::from("/");
                    exists = true;
                }
                Component::CurDir => {}
                Component::ParentDir => {
                    resolved.pop();
                    exists = std::fs::symlink_metadata(&resolved).is_ok();
                }
                Component::Normal(name) => {
                    let next = resolved.join(name);
                    if !exists {
                        resolved = next;
                        continue;
                    }
                    match std::fs::symlink_metadata(&next) {
                        Ok(meta) => match next.canonicalize() {
                            Ok(real) => resolved = real,
                            Err(e) if meta.file_type().is_symlink() => {
                                let target = std::fs::read_link(&next)
                                    .map_or_else(|_| "?".into(), |t| t.display().to_string());
                                return Err(Error::config(format!(
                                    "{} is a symbolic link to {target}, which cannot be \
                                     followed ({e})",
                                    path_shown(path, &next)
                                )));
                            }
                            Err(e) => return Err(named(&next, e).into()),
                        },
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            resolved = next;
                            exists = false;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                            // An ancestor is a file.
                            return Err(Error::config(format!(
                                "{}: {} is not a directory",
                                path.display(),
                                resolved.display()
                            )));
                        }
                        Err(e) => return Err(named(&next, e).into()),
                    }
                }
            }
        }
        let mut ids = Vec::new();
        for ancestor in resolved.ancestors() {
            if let Ok(meta) = std::fs::metadata(ancestor) {
                ids.push((meta.dev(), meta.ino()));
            }
        }
        let exists = std::fs::symlink_metadata(&resolved).is_ok();
        Ok(Self {
            path: resolved,
            ids,
            exists,
        })
    }

    /// Whether this place is `outer` or lies inside it.
    pub fn is_within(&self, outer: &Place) -> bool {
        if outer.exists {
            match outer.ids.first() {
                Some(id) => self.ids.contains(id),
                None => self.path.starts_with(&outer.path),
            }
        } else {
            self.path.starts_with(&outer.path)
        }
    }

    /// Whether either place lies inside (or is) the other.
    pub fn overlaps(&self, other: &Place) -> bool {
        self.is_within(other) || other.is_within(self)
    }
}

/// `path` as given, and what it resolved to when that differs.
fn path_shown(given: &Path, resolved: &Path) -> String {
    if given == resolved {
        given.display().to_string()
    } else {
        format!("{} ({})", given.display(), resolved.display())
    }
}

/// Refuses directories that would mix a replay's input, output and state: the output or
/// the state inside the dataset (or the dataset inside either), the state being the
/// output directory or inside its `changes/`, the output inside the state. Also refuses an
/// output that exists and is not a directory, and an `OUT/changes` that is a symbolic link
/// or not a directory. Nothing is created or changed.
pub(crate) fn check_places(dataset: &Path, out: &Path, state: Option<&Path>) -> Result<()> {
    let data = Place::of(dataset)?;
    let out_place = Place::of(out)?;
    if out_place.overlaps(&data) {
        return Err(Error::config(format!(
            "the output directory {} overlaps the dataset directory {}: the replay would write \
             into (or clean up) its input; choose an --out outside the dataset",
            path_shown(out, &out_place.path),
            dataset.display()
        )));
    }
    if out_place.exists {
        let meta = std::fs::metadata(&out_place.path).map_err(|e| named(out, e))?;
        if !meta.is_dir() {
            return Err(Error::config(format!(
                "--out {} is not a directory (it is {}): give a directory to write the output into",
                path_shown(out, &out_place.path),
                file_kind(&meta)
            )));
        }
        let changes = out_place.path.join(CHANGES_DIR);
        if let Ok(meta) = std::fs::symlink_metadata(&changes) {
            if meta.file_type().is_symlink() {
                return Err(Error::config(format!(
                    "{} is a symbolic link: the replay never follows a link out of its output \
                     directory (its cleanup would remove files elsewhere); make it a directory",
                    changes.display()
                )));
            }
            if !meta.is_dir() {
                return Err(Error::config(format!(
                    "{} is not a directory (it is {}); the output files go there",
                    changes.display(),
                    file_kind(&meta)
                )));
            }
        }
    }
    if let Some(state) = state {
        let state_place = Place::of(state)?;
        if state_place.overlaps(&data) {
            return Err(Error::config(format!(
                "the state directory {} overlaps the dataset directory {}: the store's files \
                 would land in the input; choose a --state outside the dataset",
                path_shown(state, &state_place.path),
                dataset.display()
            )));
        }
        let changes = Place::of(&out_place.path.join(CHANGES_DIR))?;
        if state_place.is_within(&changes)
            || out_place.is_within(&state_place)
            || changes.is_within(&state_place)
        {
            return Err(Error::config(format!(
                "the state directory {} and the output directory {} overlap (the state may be \
                 a directory inside the output, such as the default OUT/state, but not the \
                 output itself, nor inside OUT/changes, nor contain it)",
                path_shown(state, &state_place.path),
                path_shown(out, &out_place.path),
            )));
        }
        if state_place.exists {
            let meta = std::fs::metadata(&state_place.path).map_err(|e| named(state, e))?;
            if !meta.is_dir() {
                return Err(Error::config(format!(
                    "--state {} is not a directory (it is {})",
                    path_shown(state, &state_place.path),
                    file_kind(&meta)
                )));
            }
        }
    }
    Ok(())
}

/// "a regular file", "a character device", ... for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// A fresh job id: 128 random bits as hex (from the system's hasher keys, the time and the
/// process).
pub(crate) fn new_job_id() -> String {
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        *part = h.finish();
    }
    format!("{:016x}{:016x}", parts[0], parts[1])
}

/// What ended a finished job, as recorded in its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishRecord {
    /// The dataset epoch the output is complete up to.
    pub epoch: u64,
    /// Whether the completion certificate matched.
    pub certificate_matches: bool,
    /// The certificate's summary line.
    pub certificate: String,
}

/// The output's job record (`OUT/.backfill-job`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's id; a durable job's state holds the same id.
    pub job: String,
    /// The job's state directory (resolved when the job started); `None`: in memory.
    pub state: Option<PathBuf>,
    /// Set once the job finished.
    #[serde(default)]
    pub finished: Option<FinishRecord>,
}

impl JobRecord {
    /// Reads the job record of `out`'s part `shard` (`None`: the whole output); `None` when
    /// there is none.
    pub fn read(io: &dyn StorageIo, out: &Path, shard: Option<Shard>) -> Result<Option<Self>> {
        let path = out.join(job_file(shard));
        if !io.exists(&path)? {
            return Ok(None);
        }
        let bytes = io.read(&path)?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Engine(EngineError::CorruptState {
                context: path.display().to_string(),
                message: format!(
                    "unreadable job record ({e}); remove the output directory or use --fresh"
                ),
            })
        })
    }

    /// Writes it durably into `out` as the record of its part `shard` (a new file renamed
    /// over the old one).
    pub fn write(&self, io: &dyn StorageIo, out: &Path, shard: Option<Shard>) -> Result<()> {
        let path = out.join(job_file(shard));
        let tmp = out.join(format!("{}.tmp", job_file(shard)));
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| crate::error::internal!("job record: {e}"))?;
        let mut file = io.create(&tmp)?;
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| named(&tmp, e))?;
        file.sync().map_err(|e| named(&tmp, e))?;
        drop(file);
        io.rename(&tmp, &path)?;
        io.sync_dir(out)?;
        Ok(())
    }

    /// How the record names its job's state, for messages.
    pub fn state_shown(&self) -> String {
        match &self.state {
            Some(dir) => format!("job {} with its state in {}", self.job, dir.display()),
            None => format!("job {} (an in-memory run)", self.job),
        }
    }
}

/// The job record's file name of the part `shard` of an output.
pub fn job_file(shard: Option<Shard>) -> String {
    match shard {
        None => JOB_FILE.to_string(),
        Some(shard) => format!("{JOB_FILE}.{}", shard.tag()),
    }
}

/// The lock file's name of the part `shard` of an output.
pub fn lock_file(shard: Option<Shard>) -> String {
    match shard {
        None => OUT_LOCK_FILE.to_string(),
        Some(shard) => format!("{OUT_LOCK_FILE}.{}", shard.tag()),
    }
}

/// The part a file name of `base` (`JOB_FILE`, `OUT_LOCK_FILE`) belongs to: `Some(None)` for
/// the whole output's (`base` itself), `Some(Some(shard))` for `base.shard-I-of-N`, `None`
/// for other names.
fn part_of_file(name: &str, base: &str) -> Option<Option<Shard>> {
    if name == base {
        return Some(None);
    }
    let tag = name.strip_prefix(base)?.strip_prefix('.')?;
    Shard::parse_tag(tag).map(Some)
}

/// The output files of part `shard` in `out/changes` by epoch: `(published, tmp)` presence.
pub(crate) fn output_names(
    io: &dyn StorageIo,
    out: &Path,
    shard: Option<Shard>,
) -> Result<BTreeMap<u64, (bool, bool)>> {
    let dir = out.join(CHANGES_DIR);
    let mut files: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
    if !io.exists(&dir)? {
        return Ok(files);
    }
    for name in io.list(&dir)? {
        if let Some(OutputName { epoch, tmp, .. }) =
            parse_output_name(&name).filter(|n| n.shard == shard)
        {
            let entry = files.entry(epoch).or_default();
            if tmp {
                entry.1 = true;
            } else {
                entry.0 = true;
            }
        }
    }
    Ok(files)
}

/// A committed output file as the state records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRecord {
    /// Rows in the file.
    pub rows: u64,
    /// Its size in bytes.
    pub size: u64,
    /// CRC-32 of its bytes.
    pub crc: u32,
}

impl FileRecord {
    /// The meta value.
    pub(crate) fn encode(&self) -> String {
        format!("{} {} {:08x}", self.rows, self.size, self.crc)
    }

    /// Parses a meta value.
    pub(crate) fn decode(value: &str) -> Option<Self> {
        let mut parts = value.split(' ');
        let rows = parts.next()?.parse().ok()?;
        let size = parts.next()?.parse().ok()?;
        let crc = u32::from_str_radix(parts.next()?, 16).ok()?;
        parts.next().is_none().then_some(Self { rows, size, crc })
    }
}

/// Size and CRC-32 of the file at `path`, read in 1 MiB pieces.
pub(crate) fn checksum_file(io: &dyn StorageIo, path: &Path) -> Result<(u64, u32)> {
    let file = io.open(path).map_err(|e| named(path, e))?;
    let len = file.len();
    let mut hasher = crc32fast::Hasher::new();
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(1 << 20) as usize;
        let bytes = file.read_vec_at(at, n).map_err(|e| named(path, e))?;
        hasher.update(&bytes);
        at += n as u64;
    }
    Ok((len, hasher.finalize()))
}

/// Checks, before a resume, that the output in `out` is exactly the committed output the
/// state recorded (`recorded`, by epoch) up to its committed epoch `committed`: every
/// recorded file present (published, or a committed `.tmp` still to roll forward) with its
/// size and checksum, no published file the state did not record, no published file of a
/// later epoch. Nothing is changed; an error names the file.
pub(crate) fn check_committed_files(
    io: &dyn StorageIo,
    out: &Path,
    shard: Option<Shard>,
    state: &Path,
    committed: u64,
    recorded: &BTreeMap<u64, FileRecord>,
) -> Result<()> {
    let dir = out.join(CHANGES_DIR);
    let names = output_names(io, out, shard)?;
    let file_name = |epoch| part_file_name(epoch, shard);
    let tmp_name = |epoch| part_tmp_name(epoch, shard);
    let conflict = |path: PathBuf, message: String| Error::StateConflict { path, message };
    for (&epoch, &(published, _)) in &names {
        if epoch > committed && published {
            return Err(Error::Engine(EngineError::CorruptState {
                context: state.display().to_string(),
                message: format!(
                    "{} is published, so its checkpoint {epoch} committed, but the state's last \
                     committed checkpoint is {committed}: the state lost committed checkpoints \
                     (a damaged or replaced state directory); nothing was changed. Use --fresh \
                     to start over",
                    dir.join(file_name(epoch)).display()
                ),
            }));
        }
        if epoch <= committed && published && !recorded.contains_key(&epoch) {
            return Err(conflict(
                dir.join(file_name(epoch)),
                format!(
                    "is not a file this job committed (its state {} records no output at \
                     checkpoint {epoch}); move it away, or use --fresh to start over",
                    state.display()
                ),
            ));
        }
    }
    for (&epoch, record) in recorded.range(..=committed) {
        let (published, tmp) = names.get(&epoch).copied().unwrap_or_default();
        let path = if published {
            dir.join(file_name(epoch))
        } else if tmp {
            dir.join(tmp_name(epoch))
        } else {
            return Err(conflict(
                dir.join(file_name(epoch)),
                format!(
                    "is missing: checkpoint {epoch} committed it ({} rows, {} bytes), so the \
                     output cannot be resumed exactly once; use --fresh to start over",
                    record.rows, record.size
                ),
            ));
        };
        let (size, crc) = checksum_file(io, &path)?;
        if size != record.size || crc != record.crc {
            return Err(conflict(
                path,
                format!(
                    "was changed after checkpoint {epoch} committed it ({} bytes, CRC-32 {:08x}; \
                     now {size} bytes, {crc:08x}), so the output is no longer the committed \
                     one; use --fresh to start over",
                    record.size, record.crc
                ),
            ));
        }
    }
    Ok(())
}

// ---- output file names, and the output's lock ----

/// The output file name of a checkpoint epoch (of an unsharded replay).
#[cfg(test)]
pub fn file_name(epoch: u64) -> String {
    part_file_name(epoch, None)
}

/// The name of a checkpoint's file before it is published (of an unsharded replay).
#[cfg(test)]
pub fn tmp_name(epoch: u64) -> String {
    part_tmp_name(epoch, None)
}

/// The output file name of a checkpoint epoch of the part `shard` of an output:
/// `epoch-<20 digits>.parquet`, or `epoch-<20 digits>.shard-I-of-N.parquet` for a shard.
pub fn part_file_name(epoch: u64, shard: Option<Shard>) -> String {
    match shard {
        None => format!("epoch-{epoch:020}.parquet"),
        Some(shard) => format!("epoch-{epoch:020}.{}.parquet", shard.tag()),
    }
}

/// [`part_file_name`] before it is published (`.tmp` appended).
pub fn part_tmp_name(epoch: u64, shard: Option<Shard>) -> String {
    format!("{}.tmp", part_file_name(epoch, shard))
}

/// What an output file's name says ([`parse_output_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputName {
    /// The checkpoint epoch (of the shard's own job, for a shard).
    pub epoch: u64,
    /// Not yet published.
    pub tmp: bool,
    /// The shard that wrote it; `None`: an unsharded replay.
    pub shard: Option<Shard>,
}

/// An unsharded replay's output file name: `(epoch, is_tmp)` ([`parse_output_name`]).
#[cfg(test)]
pub fn parse_name(name: &str) -> Option<(u64, bool)> {
    parse_output_name(name)
        .filter(|n| n.shard.is_none())
        .map(|n| (n.epoch, n.tmp))
}

/// A name a replay's sink writes: exactly `epoch-<20 digits>.parquet`, or
/// `epoch-<20 digits>.shard-I-of-N.parquet` (see [`Shard::parse_tag`]), either with `.tmp`
/// appended, of an epoch that fits in a `u64`: the one rule for which files are a replay's
/// output, so `epoch-my-notes.parquet`, `epoch-10.parquet` or
/// `epoch-99999999999999999999.parquet` (20 digits past `u64::MAX`) are not.
pub fn parse_output_name(name: &str) -> Option<OutputName> {
    let rest = name.strip_prefix("epoch-")?;
    let (rest, tmp) = match rest.strip_suffix(".parquet.tmp") {
        Some(d) => (d, true),
        None => (rest.strip_suffix(".parquet")?, false),
    };
    let (digits, shard) = match rest.split_once('.') {
        None => (rest, None),
        Some((digits, tag)) => (digits, Some(Shard::parse_tag(tag)?)),
    };
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let epoch = digits.parse().ok()?;
    Some(OutputName { epoch, tmp, shard })
}

/// A published output file: its name's parts and its path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OutputFile {
    /// The shard that wrote it (`None`: an unsharded replay).
    pub shard: Option<Shard>,
    /// Its checkpoint epoch.
    pub epoch: u64,
    /// `out/changes/<name>`.
    pub path: PathBuf,
}

/// The published output files of a replay in `out`: `out/changes/<name>` for each name
/// `parse_output_name` accepts that is not a `.tmp`, with its epoch, in epoch order (and by
/// shard within an epoch), of every part. Every reader of an output (`verify`, the
/// certificate) reads these files and no others; the replay's recovery and cleanup touch
/// the same names (of its own part).
pub fn output_files(out: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut files: Vec<(u64, PathBuf)> = (output_parts(out)?.into_iter())
        .map(|f| (f.epoch, f.path))
        .collect();
    files.sort();
    Ok(files)
}

/// The published output files of the part `shard` of `out`, in epoch order.
pub fn part_files(out: &Path, shard: Option<Shard>) -> Result<Vec<(u64, PathBuf)>> {
    Ok((output_parts(out)?.into_iter())
        .filter(|f| f.shard == shard)
        .map(|f| (f.epoch, f.path))
        .collect())
}

/// [`output_files`] with the shard of each, ordered by shard, then epoch.
pub fn output_parts(out: &Path) -> Result<Vec<OutputFile>> {
    let dir = out.join("changes");
    let mut files = Vec::new();
    let mut add = |name: &str, path: PathBuf| {
        if let Some(OutputName {
            epoch,
            tmp: false,
            shard,
        }) = parse_output_name(name)
        {
            files.push(OutputFile { shard, epoch, path });
        }
    };
    if crate::replay::storage::is_url(out) {
        for entry in (crate::replay::storage::list(&dir)?).unwrap_or_default() {
            if entry.is_file {
                add(&entry.name, entry.path);
            }
        }
    } else {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::dataset(&dir, "", format!("cannot list the replay output: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::dataset(&dir, "", format!("cannot list: {e}")))?;
            if let Some(name) = entry.file_name().to_str() {
                add(name, entry.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The parts of an output: which shards (or the whole) left files or records in `out`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    /// An unsharded replay's files or record.
    pub whole: bool,
    /// Shards with files or records, with the N each names.
    pub shards: std::collections::BTreeSet<Shard>,
}

impl Parts {
    /// The parts in `out`: from the names in `out/changes` (published or not) and the job
    /// records in `out` (a shard with no row leaves no file), or, on object storage, the
    /// writers' claims.
    pub fn of(out: &Path) -> Result<Self> {
        let mut parts = Parts::default();
        let mut add = |part: Option<Shard>| match part {
            None => parts.whole = true,
            Some(shard) => {
                parts.shards.insert(shard);
            }
        };
        if crate::replay::storage::is_url(out) {
            let changes = crate::replay::storage::list(&out.join(CHANGES_DIR))?;
            for entry in changes.unwrap_or_default() {
                if let Some(name) = parse_output_name(&entry.name) {
                    add(name.shard);
                }
            }
            for entry in crate::replay::storage::list(out)?.unwrap_or_default() {
                if let Some(part) = crate::job::remote::part_of_claim(&entry.name) {
                    add(part);
                }
            }
            return Ok(parts);
        }
        let changes = out.join(CHANGES_DIR);
        for dir in [&changes, &out.to_path_buf()] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if dir == &changes {
                    if let Some(name) = parse_output_name(&name) {
                        add(name.shard);
                    }
                } else if let Some(part) = part_of_file(&name, JOB_FILE) {
                    add(part);
                }
            }
        }
        Ok(parts)
    }

    /// The layouts found, for messages: "an unsharded replay", "2 shards".
    pub fn layouts(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.whole {
            out.push("an unsharded replay's".to_string());
        }
        let counts: std::collections::BTreeSet<u32> =
            self.shards.iter().map(|s| s.count()).collect();
        for n in counts {
            out.push(format!("{n} shards'"));
        }
        out
    }

    /// Whether a run of the part `shard` fits these parts: the same layout (unsharded, or
    /// shards of the same N) or nothing yet.
    pub fn admit(&self, shard: Option<Shard>) -> bool {
        match shard {
            None => self.shards.is_empty(),
            Some(shard) => !self.whole && self.shards.iter().all(|s| s.count() == shard.count()),
        }
    }
}

/// Refuses a run of the part `shard` on an output holding another layout's files or records
/// (an unsharded replay's and a shard's, or shards of another N): the two would mix in one
/// output, and no run removes what another part wrote. Nothing is changed.
pub(crate) fn check_layout(out: &Path, shard: Option<Shard>) -> Result<()> {
    let parts = Parts::of(out)?;
    if parts.admit(shard) {
        return Ok(());
    }
    let this = match shard {
        None => "this unsharded run".to_string(),
        Some(shard) => format!("this run, shard {shard}"),
    };
    Err(Error::StateConflict {
        path: out.to_path_buf(),
        message: format!(
            "holds {} output, and {this} would mix another layout into it (an output is either              unsharded or the N shards of one N; a shard restarted with another N is refused):              remove that output, or choose another --out",
            parts.layouts().join(" and ")
        ),
    })
}

/// The output directory's lock file.
pub const OUT_LOCK_FILE: &str = ".lock";

/// Locks the output directory `out` for a reader of it (`verify`, the certificate), for as
/// long as the lock lives: a replay into `out` is refused meanwhile, and a reader that starts
/// while a replay writes there fails with [`Error::Locked`] naming the replay's process
/// instead of reading a half-written output. The same lock as a replay's; where `out` cannot
/// be written, a shared lock on its lock file. A sharded output's shards hold locks of their
/// own (`.lock.shard-I-of-N`): each one present is locked too. Empty: `out` is not a
/// directory (the reader says so), or is read-only with no lock file (no replay can write
/// there).
pub fn lock_output_to_read(out: &Path) -> Result<Vec<DirLock>> {
    // An output on object storage has no lock: its writer uploads only whole committed files.
    if !out.is_dir() {
        return Ok(Vec::new());
    }
    // The whole output's lock, and each shard's that exists (a shard's replay holds its own).
    let mut names = vec![OUT_LOCK_FILE.to_string()];
    if let Ok(entries) = std::fs::read_dir(out) {
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str()
                && matches!(part_of_file(name, OUT_LOCK_FILE), Some(Some(_)))
            {
                names.push(name.to_string());
            }
        }
    }
    names[1..].sort();
    let mut locks = Vec::new();
    for name in names {
        let path = out.join(name);
        match DirLock::acquire_file(&path) {
            Ok(lock) => locks.push(lock),
            Err(EngineError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                locks.extend(DirLock::share_existing_file(&path)?);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(locks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_component_followed_by_dotdot_is_where_the_system_puts_it() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let data_place = Place::of(&data).unwrap();
        let sneaky = Place::of(&tmp.path().join("nope/../data")).unwrap();
        assert_eq!(sneaky.path, data_place.path);
        assert!(sneaky.is_within(&data_place));
        let inside = Place::of(&tmp.path().join("nope/../data/x/../y/z")).unwrap();
        assert!(inside.is_within(&data_place));
        let outside = Place::of(&tmp.path().join("data/../other")).unwrap();
        assert!(!outside.overlaps(&data_place));
        // A link to the dataset is the dataset.
        std::os::unix::fs::symlink(&data, tmp.path().join("link")).unwrap();
        let link = Place::of(&tmp.path().join("link/out")).unwrap();
        assert!(link.is_within(&data_place));
        // Containment the other way.
        let parent = Place::of(tmp.path()).unwrap();
        assert!(data_place.is_within(&parent) && data_place.overlaps(&parent));
    }

    #[test]
    fn a_hard_to_spell_same_directory_is_found_by_its_inode() {
        // Two paths to one directory that no lexical rule relates: a bind mount needs root,
        // so a second name through a link chain stands in; the inode decides.
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("a/b/data");
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("a/b"), tmp.path().join("c")).unwrap();
        let other = Place::of(&tmp.path().join("c/./data/out")).unwrap();
        assert!(other.is_within(&Place::of(&data).unwrap()));
    }

    #[test]
    fn a_dangling_link_and_a_file_on_the_way_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path().join("gone"), tmp.path().join("dangling")).unwrap();
        let err = Place::of(&tmp.path().join("dangling")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        std::fs::write(tmp.path().join("file"), b"x").unwrap();
        let err = Place::of(&tmp.path().join("file/sub")).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }

    #[test]
    fn places_that_mix_input_output_and_state_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(data.join("changes")).unwrap();
        let out = tmp.path().join("out");
        let ok = check_places(&data, &out, Some(&out.join("state")));
        assert!(ok.is_ok(), "{ok:?}");
        for (o, s) in [
            (tmp.path().join("nope/../data"), None),
            (data.join("x"), None),
            (out.clone(), Some(data.join("changes"))),
            (out.clone(), Some(out.clone())),
            (out.clone(), Some(out.join("changes/state"))),
            (out.join("state/out"), Some(out.join("state"))),
        ] {
            let err = check_places(&data, &o, s.as_deref()).unwrap_err();
            assert!(
                matches!(err, Error::Engine(EngineError::InvalidConfig(_))),
                "{o:?} {s:?}: {err}"
            );
        }
        // An output that is a file, a device, or whose changes/ is a link.
        std::fs::write(tmp.path().join("file"), b"x").unwrap();
        let err = check_places(&data, &tmp.path().join("file"), None).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let err = check_places(&data, Path::new("/dev/full"), None).unwrap_err();
        assert!(err.to_string().contains("character device"), "{err}");
        std::fs::create_dir_all(&out).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), out.join("changes")).unwrap();
        let err = check_places(&data, &out, None).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn shard_names_parse_one_way_and_stay_apart() {
        let shard = Shard::new(1, 3).ok();
        let name = part_file_name(42, shard);
        assert_eq!(name, "epoch-00000000000000000042.shard-1-of-3.parquet");
        let parsed = |tmp| OutputName {
            epoch: 42,
            tmp,
            shard,
        };
        assert_eq!(parse_output_name(&name), Some(parsed(false)));
        assert_eq!(
            parse_output_name(&part_tmp_name(42, shard)),
            Some(parsed(true))
        );
        // An unsharded reader of names never takes a shard's file, nor the other way.
        assert_eq!(parse_name(&name), None);
        assert_eq!(parse_name(&file_name(42)), Some((42, false)));
        assert_eq!(parse_output_name(&file_name(42)).unwrap().shard, None);
        for bad in [
            "epoch-00000000000000000042.shard-3-of-3.parquet",
            "epoch-00000000000000000042.shard-01-of-3.parquet",
            "epoch-00000000000000000042.shard-1-of-3.parquet.bak",
            "epoch-00000000000000000042.shard-1-of-3.x.parquet",
            "epoch-00000000000000000042..parquet",
            "epoch-42.shard-1-of-3.parquet",
            "epoch-00000000000000000042.notes.parquet",
        ] {
            assert_eq!(parse_output_name(bad), None, "{bad}");
        }
        assert_eq!(job_file(shard), ".backfill-job.shard-1-of-3");
        assert_eq!(lock_file(shard), ".lock.shard-1-of-3");
        assert_eq!(
            part_of_file(".backfill-job.shard-1-of-3", JOB_FILE),
            Some(shard)
        );
        assert_eq!(part_of_file(".backfill-job", JOB_FILE), Some(None));
        assert_eq!(part_of_file(".backfill-job.tmp", JOB_FILE), None);
    }

    #[test]
    fn one_layout_per_output() {
        let s = |i, n| Shard::new(i, n).unwrap();
        let empty = Parts::default();
        assert!(empty.admit(None) && empty.admit(Some(s(0, 2))));
        let two = Parts {
            whole: false,
            shards: [s(0, 2)].into(),
        };
        assert!(two.admit(Some(s(1, 2))) && two.admit(Some(s(0, 2))));
        assert!(!two.admit(Some(s(0, 3))) && !two.admit(None));
        let whole = Parts {
            whole: true,
            shards: Default::default(),
        };
        assert!(whole.admit(None) && !whole.admit(Some(s(0, 2))));
        // From the files and records in a directory.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join(CHANGES_DIR)).unwrap();
        std::fs::write(tmp.path().join(job_file(Some(s(1, 2)))), b"{}").unwrap();
        std::fs::write(tmp.path().join(OUT_LOCK_FILE), b"").unwrap();
        let names = [part_tmp_name(3, Some(s(0, 2))), "notes.txt".to_string()];
        for name in names {
            std::fs::write(tmp.path().join(CHANGES_DIR).join(name), b"x").unwrap();
        }
        let parts = Parts::of(tmp.path()).unwrap();
        assert_eq!(parts.shards, [s(0, 2), s(1, 2)].into());
        assert!(!parts.whole, "a reader's lock is no part");
        assert!(check_layout(tmp.path(), Some(s(0, 2))).is_ok());
        let err = check_layout(tmp.path(), Some(s(0, 3))).unwrap_err();
        assert!(err.to_string().contains("2 shards'"), "{err}");
        assert!(check_layout(tmp.path(), None).is_err());
    }

    #[test]
    fn file_records_round_trip_and_ids_differ() {
        let r = FileRecord {
            rows: 12,
            size: 3456,
            crc: 0x0bad_cafe,
        };
        assert_eq!(FileRecord::decode(&r.encode()), Some(r));
        assert_eq!(FileRecord::decode("1 2"), None);
        assert_eq!(FileRecord::decode("1 2 3 4"), None);
        assert_ne!(new_job_id(), new_job_id());
        assert_eq!(new_job_id().len(), 32);
    }
}
