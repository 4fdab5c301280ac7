//! The scratch directories of the external sorts: owned, locked while in use, and swept when
//! their owner died.
//!
//! A sort spills into `PARENT/backfill-sort-XXXXXX` (six random letters and digits). The
//! directory holds a lock file, `LOCK`, that its owner keeps locked (`flock`) for as long as
//! it uses the directory; the lock goes away with the process, whatever ends it:
//!
//! ```text
//!   create:  mkdir backfill-sort-XXXXXX.new ─> lock .new/LOCK ─> rename to backfill-sort-XXXXXX
//!   drop:    remove backfill-sort-XXXXXX (lock still held) ─> unlock
//!   sweep:   each backfill-sort-XXXXXX: lock its LOCK? ── yes: owner dead, remove it
//!                                                     └─ no (held, or no LOCK): leave it
//! ```
//!
//! - A directory appears under its final name only with its lock held (it is locked under
//!   the staging name, which the sweep never matches), so a sweep never takes a live
//!   directory for a dead one, whatever the timing.
//! - The sweep ([`sweep`], run by [`ScratchDir::create`] before it makes a directory) removes
//!   only directories of exactly that name shape whose `LOCK` it can lock: those of a process
//!   that was killed (`kill -9`, a power loss). A directory without a `LOCK` (an older
//!   version's) or whose lock is held is left alone, and so is every other name.
//! - [`ScratchDir`] removes its directory when dropped, so every error return removes it;
//!   [`remove_all_scratch`] removes every directory this process holds, for a process about to exit
//!   on a signal (which runs no destructors).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::store::durable::{DirLock, LOCK_FILE};

/// The name prefix of scratch directories.
pub(crate) const PREFIX: &str = "backfill-sort-";

/// The random letters and digits after [`PREFIX`].
const RANDOM_CHARS: usize = 6;

/// The suffix of a directory being created (locked, not yet under its final name).
const STAGING_SUFFIX: &str = ".new";

/// Attempts at a free name.
const NAME_ATTEMPTS: usize = 16;

/// The scratch directories this process holds, and whether it is exiting (then no new one
/// is made).
static LIVE: Mutex<Live> = Mutex::new(Live {
    dirs: Vec::new(),
    exiting: false,
});

struct Live {
    dirs: Vec<PathBuf>,
    exiting: bool,
}

fn live() -> std::sync::MutexGuard<'static, Live> {
    // A panic while holding it leaves a list still worth using.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A scratch directory of this process, locked while it lives and removed when dropped.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
    /// Held until the directory is removed.
    _lock: DirLock,
}

impl ScratchDir {
    /// Sweeps `parent` (see [`sweep`]), then makes a fresh locked directory in it.
    pub fn create(parent: &Path) -> Result<Self> {
        sweep(parent);
        let mut last_error = None;
        for _ in 0..NAME_ATTEMPTS {
            let staging = tempfile::Builder::new()
                .prefix(PREFIX)
                .suffix(STAGING_SUFFIX)
                .rand_bytes(RANDOM_CHARS)
                .tempdir_in(parent)
                .map_err(|e| Error::scratch(parent, e))?;
            let lock = DirLock::acquire(staging.path())?;
            let name = staging.path().file_name().map(|n| n.to_string_lossy());
            let Some(name) = name.as_deref().and_then(|n| n.strip_suffix(STAGING_SUFFIX)) else {
                return Err(Error::scratch(parent, "unexpected scratch directory name"));
            };
            let path = parent.join(name);
            // `rename` would replace an empty directory of that name: never take a name in use.
            if std::fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            let mut live = live();
            if live.exiting {
                return Err(Error::scratch(parent, "the process is exiting"));
            }
            match std::fs::rename(staging.path(), &path) {
                Ok(()) => {
                    // Renamed: the staging name is gone, so `TempDir` must not remove it.
                    let _ = staging.keep();
                    live.dirs.push(path.clone());
                    return Ok(Self { path, _lock: lock });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(Error::scratch(
            parent,
            last_error.map_or_else(
                || "no free scratch directory name".to_string(),
                |e| e.to_string(),
            ),
        ))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Removed while the lock is held: a sweep meanwhile sees a live directory.
        let _ = std::fs::remove_dir_all(&self.path);
        live().dirs.retain(|d| d != &self.path);
    }
}

/// Removes every scratch directory this process holds and makes later ones fail: for a
/// process about to exit on a signal, whose sorts (on other threads) never finish. Returns
/// the directories it could not remove.
pub fn remove_all_scratch() -> Vec<PathBuf> {
    let mut live = live();
    live.exiting = true;
    let mut left = Vec::new();
    for dir in &live.dirs {
        // A sort still running may create a run file between the removal's listing and its
        // removal of the directory: try again.
        let removed = (0..10).any(|_| {
            let _ = std::fs::remove_dir_all(dir);
            std::fs::symlink_metadata(dir).is_err()
        });
        if !removed {
            left.push(dir.clone());
        }
    }
    left
}

/// Whether `name` is a scratch directory's name: [`PREFIX`] then exactly [`RANDOM_CHARS`]
/// ASCII letters and digits.
fn is_scratch_name(name: &str) -> bool {
    name.strip_prefix(PREFIX).is_some_and(|rest| {
        rest.len() == RANDOM_CHARS && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// Removes the scratch directories in `parent` whose owner died (see the module docs);
/// returns how many. Best effort: a directory it cannot read or remove is left as it is.
pub(crate) fn sweep(parent: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_scratch_name) {
            continue;
        }
        let dir = entry.path();
        // A directory, not a link to one.
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        if remove_if_dead(&dir) {
            removed += 1;
        }
    }
    removed
}

/// Removes the scratch directory `dir` if its `LOCK` can be locked (its owner is gone).
fn remove_if_dead(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let lock_path = dir.join(LOCK_FILE);
    // A regular file, not a link; never created here (no `LOCK`: not ours to judge).
    if !std::fs::symlink_metadata(&lock_path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let Ok(file) = File::open(&lock_path) else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    // The file locked must still be the directory's (not one its owner removed, with the
    // directory, just before a new one took the same name).
    let same = match (file.metadata(), std::fs::symlink_metadata(&lock_path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    };
    same && std::fs::remove_dir_all(dir).is_ok()
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// A directory with `name` in `parent` holding a `LOCK` file.
    fn with_lock_file(parent: &Path, name: &str) -> PathBuf {
        let dir = parent.join(name);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(LOCK_FILE), b"12345").unwrap();
        fs::write(dir.join("validate-000000.arrow"), b"run").unwrap();
        dir
    }

    #[test]
    fn the_sweep_removes_dead_owners_scratch_only() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        // Live: locked by a directory of this process, and by a lock taken by hand.
        let live = ScratchDir::create(p).unwrap();
        fs::write(live.path().join("output-000000.arrow"), b"run").unwrap();
        // Dead: a `LOCK` nobody holds (its owner was killed).
        let dead = with_lock_file(p, "backfill-sort-dEad01");
        let held = with_lock_file(p, "backfill-sort-held01");
        let holder = File::open(held.join(LOCK_FILE)).unwrap();
        holder.try_lock().unwrap();
        // Not ours to judge: other shapes, no lock file, a link, a file.
        let unrelated = [
            with_lock_file(p, "backfill-sort-abc"),
            with_lock_file(p, "backfill-sort-abcdefg"),
            with_lock_file(p, "backfill-sort-abc12.new"),
            with_lock_file(p, "backfill-sort-ab-c12"),
            with_lock_file(p, "other-dir"),
            with_lock_file(p, "xbackfill-sort-abc123"),
        ];
        let no_lock = p.join("backfill-sort-noLck1");
        fs::create_dir(&no_lock).unwrap();
        let target = with_lock_file(p, "target");
        std::os::unix::fs::symlink(&target, p.join("backfill-sort-link01")).unwrap();
        fs::write(p.join("backfill-sort-file01"), b"x").unwrap();

        assert_eq!(sweep(p), 1);
        assert!(!dead.exists(), "a dead owner's scratch is removed");
        assert!(live.path().join("output-000000.arrow").exists());
        assert!(held.join("validate-000000.arrow").exists());
        for dir in unrelated.iter().chain([&no_lock, &target]) {
            assert!(dir.exists(), "{} is left alone", dir.display());
        }
        assert!(target.join("validate-000000.arrow").exists());
        assert!(p.join("backfill-sort-link01").exists());
        assert!(p.join("backfill-sort-file01").exists());

        // Released: swept next time (here by the next directory made).
        drop(holder);
        let next = ScratchDir::create(p).unwrap();
        assert!(!held.exists());
        let path = next.path().to_path_buf();
        drop(next);
        assert!(!path.exists(), "a directory is removed when dropped");
        assert!(live.path().exists());
        drop(live);
        let names: Vec<_> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(PREFIX))
            .collect();
        assert_eq!(names.len(), 7, "{names:?}");
    }

    #[test]
    fn a_directory_is_named_and_locked_from_birth() {
        let parent = tempfile::tempdir().unwrap();
        let dir = ScratchDir::create(parent.path()).unwrap();
        let name = dir.path().file_name().unwrap().to_str().unwrap();
        assert!(is_scratch_name(name), "{name}");
        let lock = File::open(dir.path().join(LOCK_FILE)).unwrap();
        assert!(lock.try_lock().is_err(), "held by its owner");
        assert_eq!(
            fs::read_dir(parent.path()).unwrap().count(),
            1,
            "no staging directory is left"
        );
    }
}
