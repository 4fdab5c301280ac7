//! Test helpers over directory trees: their files compared byte for byte, a durable
//! store's files found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file under `dir` with its bytes, lock files left out (they are held, not data).
pub fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n != "LOCK" && n != ".lock")
            {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// The one manifest log (`LOG-*`) of a durable store's directory (there is one after a
/// commit).
pub fn log_file(dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("LOG-"))
        .collect();
    assert_eq!(logs.len(), 1, "one log in {}: {logs:?}", dir.display());
    logs.pop().unwrap()
}
