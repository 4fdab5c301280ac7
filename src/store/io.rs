//! The file I/O seam of the durable store and the replay's sink.
//!
//! Everything that touches the disk on the durable path goes through [`StorageIo`]: create,
//! write, fsync, rename, remove, read, list. [`RealIo`] is the file system; `FaultyIo` (feature `testing`)
//! wraps another implementation and fails (or "crashes") at the N-th mutating operation, so
//! tests can stop the world at every write, fsync and rename of a run and check that what
//! reopens is exactly the last committed state (the approach of redb's storage backend tests).
//!
//! Errors carry the path they are about: an `io::Error` from here always names its file.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file being written.
pub trait WriteFile: Write + Send {
    /// Makes everything written so far durable (`fsync`).
    fn sync(&mut self) -> io::Result<()>;
}

/// A file opened for random reads.
pub trait ReadFile: Send + Sync {
    /// The file's length in bytes.
    fn len(&self) -> u64;

    /// True for an empty file.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` from `offset`; reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// The `len` bytes from `offset`, in a new buffer; reading past the end is an error.
    ///
    /// This default zero-fills the buffer and calls [`ReadFile::read_at`]. [`RealIo`]'s files
    /// read into the buffer's unused capacity instead: a store scan reads every block this
    /// way, and zeroing bytes the read overwrites at once made an uncached scan 8 to 19%
    /// slower (`cargo bench --bench durable -- durable_scan`).
    fn read_vec_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read_at(offset, &mut buf)?;
        Ok(buf)
    }
}

/// The file operations of the durable path.
pub trait StorageIo: Send + Sync + fmt::Debug + 'static {
    /// Creates (or truncates) a file for writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>>;
    /// Opens a file for random reads.
    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;
    /// Renames a file, replacing the target atomically.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes a directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of a directory, sorted.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether a path exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// Reads a whole (small) file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let file = self.open(path)?;
        let len = usize::try_from(file.len())
            .map_err(|_| named(path, io::Error::other("file too large to read at once")))?;
        let mut buf = vec![0; len];
        file.read_at(0, &mut buf)?;
        Ok(buf)
    }
}

/// Adds the path to an I/O error's message.
pub fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealIo;

impl RealIo {
    /// The real file system, shared.
    pub fn shared() -> Arc<dyn StorageIo> {
        Arc::new(RealIo)
    }
}

struct RealWriteFile {
    path: PathBuf,
    file: io::BufWriter<File>,
}

impl Write for RealWriteFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf).map_err(|e| named(&self.path, e))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf).map_err(|e| named(&self.path, e))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush().map_err(|e| named(&self.path, e))
    }
}

impl WriteFile for RealWriteFile {
    fn sync(&mut self) -> io::Result<()> {
        self.file.flush().map_err(|e| named(&self.path, e))?;
        self.file
            .get_ref()
            .sync_all()
            .map_err(|e| named(&self.path, e))
    }
}

struct RealReadFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl ReadFile for RealReadFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| named(&self.path, e))
    }

    #[cfg(target_os = "linux")]
    fn read_vec_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        pread_vec(&self.file, offset, len).map_err(|e| named(&self.path, e))
    }
}

/// The `len` bytes at `offset` of `file`, read into a new vector's capacity (not zeroed
/// first); `UnexpectedEof` if the file ends before.
#[cfg(target_os = "linux")]
#[expect(
    unsafe_code,
    reason = "pread into a vector's spare capacity; see SAFETY"
)]
fn pread_vec(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let at = (offset.checked_add(buf.len() as u64))
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read offset too large"))?;
        let filled = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..len - filled];
        // SAFETY: `spare` is memory owned by `buf`, writable for `spare.len()` bytes, and
        // pread writes at most that many into it; the descriptor is `file`'s, open for the
        // whole call since `file` is borrowed.
        let read =
            unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
        match usize::try_from(read) {
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ends before byte {}",
                        offset.saturating_add(len as u64)
                    ),
                ));
            }
            Ok(read) => {
                // SAFETY: pread initialized the first `read` bytes of the spare capacity
                // (`read <= spare.len()`, so the new length is within the capacity).
                unsafe { buf.set_len(filled + read) };
            }
        }
    }
    Ok(buf)
}

impl StorageIo for RealIo {
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| named(path, e))?;
        Ok(Box::new(RealWriteFile {
            path: path.to_path_buf(),
            file: io::BufWriter::with_capacity(1 << 20, file),
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let file = File::open(path).map_err(|e| named(path, e))?;
        let len = file.metadata().map_err(|e| named(path, e))?.len();
        Ok(Box::new(RealReadFile {
            path: path.to_path_buf(),
            file,
            len,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to).map_err(|e| named(to, e))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path).map_err(|e| named(path, e))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| named(dir, e))
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir).map_err(|e| named(dir, e))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| named(dir, e))? {
            let entry = entry.map_err(|e| named(dir, e))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists().map_err(|e| named(path, e))
    }
}

#[cfg(any(test, feature = "testing"))]
pub use faulty::{Fault, FaultyIo};

/// Fault injection (feature `testing`).
#[cfg(any(test, feature = "testing"))]
mod faulty {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// What [`FaultyIo`] does at its chosen operation.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Fault {
        /// The operation fails with an error; later operations work (a transient error).
        Fail,
        /// The operation and every later one fail, as if the process died there. Call
        /// [`FaultyIo::lose_unsynced`] to also drop what was written but not fsynced.
        Crash,
    }

    /// A [`StorageIo`] that injects a fault at the N-th mutating operation (create, write,
    /// fsync, rename, remove, directory sync), counting from 1.
    #[derive(Debug)]
    pub struct FaultyIo {
        inner: Arc<dyn StorageIo>,
        state: Arc<FaultState>,
    }

    #[derive(Debug)]
    struct FaultState {
        ops: AtomicU64,
        at: Option<u64>,
        fault: Fault,
        crashed: AtomicBool,
        /// Files written since creation: path -> (written length, synced length).
        lengths: Mutex<Vec<(PathBuf, u64, u64)>>,
    }

    impl FaultState {
        /// Counts an operation; the error to return if it is the faulty one (or after a crash).
        fn tick(&self, what: &str, path: &Path) -> io::Result<()> {
            if self.crashed.load(Ordering::SeqCst) {
                return Err(named(
                    path,
                    io::Error::other("injected crash: the world stopped"),
                ));
            }
            let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
            if self.at == Some(n) {
                if self.fault == Fault::Crash {
                    self.crashed.store(true, Ordering::SeqCst);
                }
                return Err(named(
                    path,
                    io::Error::other(format!("injected fault at operation {n} ({what})")),
                ));
            }
            Ok(())
        }

        fn record(&self, path: &Path, written: Option<u64>, synced: bool) {
            if let Ok(mut lengths) = self.lengths.lock() {
                let entry = match lengths.iter_mut().find(|(p, _, _)| p == path) {
                    Some(e) => e,
                    None => {
                        lengths.push((path.to_path_buf(), 0, 0));
                        let last = lengths.len() - 1;
                        &mut lengths[last]
                    }
                };
                if let Some(w) = written {
                    entry.1 += w;
                }
                if synced {
                    entry.2 = entry.1;
                }
            }
        }
    }

    impl FaultyIo {
        /// Injects `fault` at operation `at` (`None`: never; counts only).
        pub fn new(inner: Arc<dyn StorageIo>, at: Option<u64>, fault: Fault) -> Self {
            Self {
                inner,
                state: Arc::new(FaultState {
                    ops: AtomicU64::new(0),
                    at,
                    fault,
                    crashed: AtomicBool::new(false),
                    lengths: Mutex::new(Vec::new()),
                }),
            }
        }

        /// Mutating operations seen so far.
        pub fn operations(&self) -> u64 {
            self.state.ops.load(Ordering::SeqCst)
        }

        /// Whether the fault has fired.
        pub fn fired(&self) -> bool {
            self.state.at.is_some_and(|at| self.operations() >= at)
        }

        /// Simulates a power loss after a crash: every file written through this seam is cut
        /// back to the length it had at its last fsync.
        pub fn lose_unsynced(&self) -> io::Result<()> {
            let lengths = self
                .state
                .lengths
                .lock()
                .map_err(|_| io::Error::other("fault state poisoned"))?;
            for (path, written, synced) in lengths.iter() {
                if written != synced && path.exists() {
                    let file = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(|e| named(path, e))?;
                    file.set_len(*synced).map_err(|e| named(path, e))?;
                }
            }
            Ok(())
        }
    }

    struct FaultyWriteFile {
        path: PathBuf,
        inner: Box<dyn WriteFile>,
        state: Arc<FaultState>,
    }

    impl Write for FaultyWriteFile {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.state.tick("write", &self.path)?;
            let n = self.inner.write(buf)?;
            // Unbuffered below us would be more precise; the inner writer may buffer, so
            // flush to make the written length real for `lose_unsynced`.
            self.inner.flush()?;
            self.state.record(&self.path, Some(n as u64), false);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.inner.flush()
        }
    }

    impl WriteFile for FaultyWriteFile {
        fn sync(&mut self) -> io::Result<()> {
            self.state.tick("fsync", &self.path)?;
            self.inner.sync()?;
            self.state.record(&self.path, None, true);
            Ok(())
        }
    }

    impl StorageIo for FaultyIo {
        fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
            self.state.tick("create", path)?;
            let inner = self.inner.create(path)?;
            self.state.record(path, None, false);
            Ok(Box::new(FaultyWriteFile {
                path: path.to_path_buf(),
                inner,
                state: self.state.clone(),
            }))
        }

        fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
            if self.state.crashed.load(Ordering::SeqCst) {
                return Err(named(
                    path,
                    io::Error::other("injected crash: the world stopped"),
                ));
            }
            self.inner.open(path)
        }

        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.state.tick("rename", to)?;
            self.inner.rename(from, to)?;
            if let Ok(mut lengths) = self.state.lengths.lock()
                && let Some(entry) = lengths.iter_mut().find(|(p, _, _)| p == from)
            {
                entry.0 = to.to_path_buf();
            }
            Ok(())
        }

        fn remove(&self, path: &Path) -> io::Result<()> {
            self.state.tick("remove", path)?;
            self.inner.remove(path)
        }

        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            self.state.tick("directory sync", dir)?;
            self.inner.sync_dir(dir)
        }

        fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
            self.state.tick("mkdir", dir)?;
            self.inner.create_dir_all(dir)
        }

        fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
            self.inner.list(dir)
        }

        fn exists(&self, path: &Path) -> io::Result<bool> {
            self.inner.exists(path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faulty_io_fails_at_the_chosen_operation_and_then_stays_down_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let io = FaultyIo::new(RealIo::shared(), Some(3), Fault::Crash);
        let path = dir.path().join("a");
        let mut f = io.create(&path).unwrap(); // 1
        f.write_all(b"hello").unwrap(); // 2
        let err = f.sync().unwrap_err(); // 3
        assert!(
            err.to_string()
                .contains("injected fault at operation 3 (fsync)")
        );
        assert!(err.to_string().contains(&path.display().to_string()));
        assert!(io.fired());
        assert!(io.rename(&path, &dir.path().join("b")).is_err());
        io.lose_unsynced().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"", "unsynced bytes are lost");
    }

    #[test]
    fn read_vec_at_reads_the_bytes_read_at_reads_and_not_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(&path, &bytes).unwrap();
        let file = RealIo.open(&path).unwrap();
        for (offset, len) in [(0, 0), (0, 100_000), (3, 17), (65_536, 34_464), (99_999, 1)] {
            let read = file.read_vec_at(offset, len).unwrap();
            assert_eq!(read, &bytes[offset as usize..offset as usize + len]);
            let mut zeroed = vec![0; len];
            file.read_at(offset, &mut zeroed).unwrap();
            assert_eq!(read, zeroed);
        }
        for (offset, len) in [(99_999, 2), (100_000, 1), (u64::MAX - 1, 4)] {
            let err = file.read_vec_at(offset, len).unwrap_err();
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        }
        let err = file.read_vec_at(50_000, 50_001).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_transient_fault_fails_once() {
        let dir = tempfile::tempdir().unwrap();
        let io = FaultyIo::new(RealIo::shared(), Some(1), Fault::Fail);
        let path = dir.path().join("a");
        assert!(io.create(&path).is_err());
        let mut f = io.create(&path).unwrap();
        f.write_all(b"x").unwrap();
        f.sync().unwrap();
        assert_eq!(io.read(&path).unwrap(), b"x");
        assert_eq!(io.list(dir.path()).unwrap(), ["a"]);
    }
}
