//! The dataset's validation, before or beside a replay's snapshot load.
//!
//! Nothing of a bad dataset may be committed, and an earlier output must survive a bad one.
//! So a replay that resumes, or that writes into directories that already exist, validates
//! first ([`Validation::first`]). A new job whose output and state directories do not exist
//! yet has nothing to lose: its validation runs on a thread beside the snapshot load
//! ([`Validation::beside`]); the load's commit waits for it, and on bad input the replay
//! removes the directories it created ([`NewDirs`]). The two passes read the same files on
//! two cores instead of one after the other.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crate::error::{Result, internal};
use crate::replay::{Dataset, DatasetSummary};

/// A dataset's validation: done, or running on its own thread.
#[derive(Debug)]
pub(crate) struct Validation {
    state: State,
    /// The validation found the dataset bad (or could not read it).
    failed: bool,
}

#[derive(Debug)]
enum State {
    Done(DatasetSummary),
    Running(JoinHandle<Result<DatasetSummary>>),
    /// Failed, and its error already returned.
    Failed,
}

impl Validation {
    /// Validates `dataset` now, on this thread.
    pub fn first(dataset: &Dataset) -> Result<Self> {
        Ok(Self {
            state: State::Done(dataset.validate()?),
            failed: false,
        })
    }

    /// Starts validating `dataset` on a thread of its own.
    pub fn beside(dataset: &Dataset) -> Result<Self> {
        let dataset = dataset.clone();
        let thread = std::thread::Builder::new()
            .name("backfill-validate".into())
            .spawn(move || dataset.validate())
            .map_err(|e| internal!("cannot start the validation thread: {e}"))?;
        Ok(Self {
            state: State::Running(thread),
            failed: false,
        })
    }

    /// The validation's result, waiting for it if it is still running.
    pub fn finish(&mut self) -> Result<DatasetSummary> {
        let result = match std::mem::replace(&mut self.state, State::Failed) {
            State::Done(summary) => Ok(summary),
            State::Running(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(internal!("the validation thread panicked"))),
            State::Failed => Err(internal!("the validation failed before")),
        };
        match &result {
            Ok(summary) => self.state = State::Done(*summary),
            Err(_) => self.failed = true,
        }
        result
    }

    /// Whether the validation found the dataset bad.
    pub fn failed(&self) -> bool {
        self.failed
    }
}

/// The directories a replay is about to create: the highest missing ancestor of each of
/// its directories, removed again when the dataset turns out bad.
#[derive(Debug, Default)]
pub(crate) struct NewDirs {
    roots: Vec<PathBuf>,
}

impl NewDirs {
    /// The new directories among `dirs`; `None` if any of them exists already.
    pub fn of(dirs: &[&Path]) -> Option<Self> {
        let mut roots: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            if dir.exists() {
                return None;
            }
            let mut root = dir.to_path_buf();
            while let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                if parent.exists() {
                    break;
                }
                root = parent.to_path_buf();
            }
            if !roots.iter().any(|r| root.starts_with(r)) {
                roots.retain(|r| !r.starts_with(&root));
                roots.push(root);
            }
        }
        Some(Self { roots })
    }

    /// Removes the directories (nothing in them was committed).
    pub fn remove(&self) {
        for root in &self.roots {
            // Best effort: the error being reported is the dataset's.
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_dirs_are_the_highest_missing_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("a/b/out");
        let state = tmp.path().join("a/b/out/state");
        let other = tmp.path().join("c");
        let dirs = NewDirs::of(&[&out, &state, &other]).unwrap();
        assert_eq!(dirs.roots, vec![tmp.path().join("a"), other.clone()]);
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        assert!(
            NewDirs::of(&[&out]).is_none(),
            "an existing directory has something to lose"
        );
        dirs.remove();
        assert!(!tmp.path().join("a").exists() && !other.exists());
        assert!(tmp.path().exists());
    }
}
