//! The directory lock: one process (and one open store) per state directory at a time.
//!
//! `DIR/LOCK` is locked with an advisory exclusive lock (`flock`) for as long as the store is
//! open, and holds the owner's process id so that a refused opener can name it. The lock
//! goes away with the process, so a killed run never leaves a stale lock behind.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::store::io::named;

/// The lock file's name.
pub const LOCK_FILE: &str = "LOCK";

/// A held directory lock; released on drop.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (which must exist) through `dir/LOCK`, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self> {
        Self::acquire_file(&dir.join(LOCK_FILE))
    }

    /// Locks through the file `path` (created if needed), or says who holds it.
    pub fn acquire_file(path: &Path) -> Result<Self> {
        let path = path.to_path_buf();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| named(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(locked(path, &mut file)),
            Err(std::fs::TryLockError::Error(e)) => return Err(named(&path, e).into()),
        }
        file.set_len(0).map_err(|e| named(&path, e))?;
        file.seek(SeekFrom::Start(0)).map_err(|e| named(&path, e))?;
        write!(file, "{}", std::process::id()).map_err(|e| named(&path, e))?;
        Ok(Self { _file: file })
    }

    /// A shared lock through the existing file `path`, opened read-only, or who holds it
    /// exclusively: for a reader of a directory it cannot write, which no
    /// [`Self::acquire_file`] can lock while the reader holds this. `None`: there is no such
    /// file (so no writer that locks through it can be running).
    pub fn share_existing_file(path: &Path) -> Result<Option<Self>> {
        let path = path.to_path_buf();
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(named(&path, e).into()),
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(std::fs::TryLockError::WouldBlock) => Err(locked(path, &mut file)),
            Err(std::fs::TryLockError::Error(e)) => Err(named(&path, e).into()),
        }
    }
}

/// The error of a lock through `file` (at `path`) held by someone else, naming the holder
/// the file names.
fn locked(path: std::path::PathBuf, file: &mut File) -> Error {
    let mut holder = String::new();
    let _ = file.read_to_string(&mut holder);
    let own = std::process::id().to_string();
    let holder = match holder.trim() {
        "" => "another process".to_string(),
        // Opened twice in one process: another process id would send the user looking for
        // a process that is not there.
        pid if pid == own => format!(
            "this process ({pid}) already: it is opened twice, so close the first store (or \
             handle) before opening it again"
        ),
        pid => format!("process {pid}"),
    };
    Error::Locked { path, holder }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }));
        let message = err.to_string();
        assert!(message.contains(&std::process::id().to_string()), "{err}");
        assert!(message.contains("this process"), "{err}");
        assert!(message.contains("opened twice"), "{err}");
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_shared_lock_excludes_an_exclusive_one_and_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        assert!(DirLock::share_existing_file(&path).unwrap().is_none());
        let writer = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::share_existing_file(&path).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(err.to_string().contains(&std::process::id().to_string()));
        drop(writer);
        let readers = [
            DirLock::share_existing_file(&path).unwrap().unwrap(),
            DirLock::share_existing_file(&path).unwrap().unwrap(),
        ];
        assert!(matches!(
            DirLock::acquire(dir.path()),
            Err(Error::Locked { .. })
        ));
        drop(readers);
        DirLock::acquire(dir.path()).unwrap();
    }
}
