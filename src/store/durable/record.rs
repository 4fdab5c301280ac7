//! The records the manifest and its log share: what the committed state is made of (the
//! live run files, [`FileEntry`], and the runs of each vnode, [`RunEntry`]) and how a commit
//! or a compaction changes it ([`LogRecord`]: per vnode, runs appended or replaced,
//! [`EditKind`]).
//!
//! The manifest (`manifest.rs`) lists the entries whole, as JSON, and applies records to
//! them ([`super::manifest::Manifest::apply`]); the log (`log.rs`) holds the records, in
//! the binary layout its module docs give. Both name the log file of a generation
//! ([`log_file_name`]) and say whether it must exist ([`LogPresence`]). Nothing here reads
//! or writes a file.

use serde::{Deserialize, Serialize};

use super::file::{FileCheck, RunSpan};
use crate::vnode::VirtualNode;

/// The file name of the log of `generation`.
pub(crate) fn log_file_name(generation: u64) -> String {
    format!("LOG-{generation:020}")
}

/// The generation of a log file name, if it is one.
pub(crate) fn log_generation(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("LOG-")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A live run file, with what its open checks ([`FileCheck`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct FileEntry {
    pub id: u64,
    pub size: u64,
    pub tail_len: u64,
    pub tail_crc: u32,
}

impl FileEntry {
    /// The entry of file `id`, checked on open by `check`.
    pub fn new(id: u64, check: FileCheck) -> Self {
        Self {
            id,
            size: check.size,
            tail_len: check.tail_len,
            tail_crc: check.tail_crc,
        }
    }

    /// What the open of the file checks.
    pub fn check(&self) -> FileCheck {
        FileCheck {
            size: self.size,
            tail_len: self.tail_len,
            tail_crc: self.tail_crc,
        }
    }
}

/// A run of one vnode: `count` blocks of `file` from block `first`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RunEntry {
    pub vnode: u16,
    pub file: u64,
    pub first: u32,
    pub count: u32,
    pub rows: u64,
    /// 0 for a base run, else the epoch the delta was committed with.
    pub epoch: u64,
}

impl RunEntry {
    /// Where the run lies in its file.
    pub fn span(&self) -> RunSpan {
        RunSpan {
            vnode: VirtualNode::new(self.vnode),
            first: self.first,
            count: self.count,
            rows: self.rows,
        }
    }
}

/// What a vnode edit does to the vnode's run list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EditKind {
    /// The runs go after the vnode's existing runs (a commit's deltas).
    Append,
    /// The runs replace the vnode's run list (a compaction's result).
    Replace,
    /// The runs (epoch 0) go after the vnode's base, which has no deltas: a step of a bulk
    /// load (`StateTable::commit_load_step`), whose rows follow the base's in key order.
    AppendBase,
}

/// The runs of one vnode that a record changes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VnodeEdit {
    /// The vnode.
    pub vnode: u16,
    /// Append or replace.
    pub kind: EditKind,
    /// The runs (their `vnode` is `self.vnode`).
    pub runs: Vec<RunEntry>,
}

/// The vnode edits of one table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TableEdit {
    /// The table's name.
    pub table: String,
    /// Its edited vnodes.
    pub vnodes: Vec<VnodeEdit>,
}

/// One commit's (or compaction install's) changes. See the module docs.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct LogRecord {
    /// The committed epoch after this record.
    pub committed_epoch: Option<u64>,
    /// The next file id after this record.
    pub next_file_id: u64,
    /// Job values set.
    pub meta: Vec<(String, String)>,
    /// Files that become live.
    pub added: Vec<FileEntry>,
    /// Files that stop being live.
    pub removed: Vec<u64>,
    /// Run changes per table.
    pub tables: Vec<TableEdit>,
}

/// Whether the log must exist with its header: the manifest that names it was written after
/// the log's header was durable (manifest format 4 and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogPresence {
    /// A missing or short log is corruption.
    Required,
    /// A missing or short log holds no record (a manifest of an older version, which
    /// created the log after the manifest).
    Optional,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_names_parse_back() {
        assert_eq!(log_generation(&log_file_name(42)), Some(42));
        assert_eq!(log_generation("LOG-42"), None);
        assert_eq!(log_generation("MANIFEST"), None);
    }
}
