//! The manifest: the one file that says what the durable store holds.
//!
//! ```text
//!   MANIFEST = "ABMANIF1" | crc32 (u32 LE) of the body | body length (u64 LE) | body (JSON)
//!   body     = { format, committed_epoch, next_file_id, log_generation, meta: {key: value},
//!                files:  [{ id, size, tail_len, tail_crc }],
//!                tables: [{ name, schema (hex of an Arrow IPC stream with no batches),
//!                           key: [{ column, descending, nulls_first }],
//!                           distribution: { hash: [columns] } | { vnode_column: column },
//!                           vnode_count,
//!                           runs: [{ vnode, file, first, count, rows, epoch }] }] }
//! ```
//!
//! A table's runs are listed per vnode oldest first: the base (`epoch` 0) then the deltas of
//! committed epochs in commit order. A base is one run, or several that follow each other in
//! key order without overlapping (the pieces of an ordered bulk load, read as one list; their
//! last keys rise, which opening checks). `format` is 4; `log_generation` names the log that
//! follows this manifest, whose header was made durable before this manifest (so a missing
//! log is corruption). Earlier formats are read: 3 differs from 4 only in that its log was
//! created after it (a missing log holds no record); 2 differs from 3 only in its run files,
//! which are read alike; 1, written before the log existed, is read as generation 0 with no
//! log. Run files are named `run-<id, 20 digits>.arrow`.
//!
//! The manifest is not rewritten at every commit: commits append what they changed to
//! `LOG-<log_generation>` (see [`super::log`]), and the committed state is this manifest
//! with that log's valid records applied ([`Manifest::apply`]). When the manifest is
//! rewritten (the log outgrew a few times its size, a table was created, the first commit
//! after an open), the next generation's log is created holding only its header (fsynced,
//! with its directory entry), then the new manifest, of that generation, is written to
//! `MANIFEST.tmp`, fsynced, renamed over `MANIFEST`, and the directory fsynced: the switch is
//! atomic, and a crash at any point leaves either the old manifest with its log (and maybe
//! the new log's header, removed on open) or the new one with its log.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
#[cfg(test)]
use arrow_schema::Schema;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

use super::file::{hex_decode, hex_encode};
use super::record::{EditKind, FileEntry, LogPresence, LogRecord, RunEntry};
use crate::error::{Error, Result};
use crate::key::KeyColumn;
use crate::store::io::StorageIo;
use crate::table::{Distribution, TableDesc};
use crate::vnode::VnodeCount;

/// The manifest's file name.
pub(crate) const MANIFEST_FILE: &str = "MANIFEST";
const MANIFEST_TMP: &str = "MANIFEST.tmp";
const MAGIC: &[u8; 8] = b"ABMANIF1";
/// Format 4: the manifest's log (`LOG-<log_generation>`) was durable, with its header,
/// before the manifest was: a missing log is corruption. A binary that knows only format 3
/// refuses the store instead of reading its log (format 2 of the log) as corrupt.
const FORMAT: u32 = 4;
/// The format whose log was created after it (a crash could leave it without one): read,
/// never written. Its run files are those of format 4.
const FORMAT_LOG_AFTER: u32 = 3;
/// The format before run files stored narrower types (their files are still read; its log
/// was created after it, as in format 3): read,
/// never written.
const FORMAT_RUN_VIEWS: u32 = 2;
/// The format before the manifest log: read, never written.
const FORMAT_WITHOUT_LOG: u32 = 1;

/// The file name of run file `id`.
pub(crate) fn run_file_name(id: u64) -> String {
    format!("run-{id:020}.arrow")
}

/// The id of a run file name, if it is one.
pub(crate) fn run_file_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("run-")?.strip_suffix(".arrow")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The decoded manifest.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Manifest {
    pub format: u32,
    pub committed_epoch: Option<u64>,
    pub next_file_id: u64,
    /// The generation of the log that follows this manifest.
    #[serde(default)]
    pub log_generation: u64,
    pub meta: BTreeMap<String, String>,
    pub files: Vec<FileEntry>,
    pub tables: Vec<TableEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct KeyEntry {
    pub column: String,
    pub descending: bool,
    pub nulls_first: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DistributionEntry {
    Hash(Vec<String>),
    VnodeColumn(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct TableEntry {
    pub name: String,
    pub schema: String,
    pub key: Vec<KeyEntry>,
    pub distribution: DistributionEntry,
    pub vnode_count: usize,
    pub runs: Vec<RunEntry>,
}

impl TableEntry {
    /// The definition part of a table's entry (no runs).
    pub fn of(desc: &TableDesc) -> Result<Self> {
        let schema = desc.schema();
        let name_of = |i: usize| schema.field(i).name().clone();
        Ok(Self {
            name: desc.name().to_string(),
            schema: hex_encode(&schema_bytes(schema)?),
            key: desc
                .pk()
                .columns()
                .iter()
                .map(|c| KeyEntry {
                    column: c.name.clone(),
                    descending: c.descending,
                    nulls_first: c.nulls_first,
                })
                .collect(),
            distribution: match desc.distribution() {
                Distribution::Hash(columns) => {
                    DistributionEntry::Hash(columns.iter().map(|&i| name_of(i)).collect())
                }
                Distribution::VnodeColumn(i) => DistributionEntry::VnodeColumn(name_of(*i)),
            },
            vnode_count: desc.vnode_count().get(),
            runs: Vec::new(),
        })
    }

    /// The table definition this entry describes.
    pub fn desc(&self, manifest: &Path) -> Result<TableDesc> {
        let bad = |message: String| Error::CorruptState {
            context: format!("{} (table `{}`)", manifest.display(), self.name),
            message,
        };
        let bytes = hex_decode(&self.schema).ok_or_else(|| bad("malformed schema".into()))?;
        let schema = StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| bad(format!("unreadable schema: {e}")))?
            .schema();
        let key = self
            .key
            .iter()
            .map(|k| KeyColumn {
                name: k.column.clone(),
                descending: k.descending,
                nulls_first: k.nulls_first,
            })
            .collect();
        let vnodes = VnodeCount::new(self.vnode_count).map_err(|e| bad(e.to_string()))?;
        // Built with its own distribution from the start: `TableDesc::new` would distribute
        // by the whole key, and refuse a key column only the distribution must not have (a
        // dictionary, say) in a table distributed by other columns.
        let name = self.name.clone();
        let desc = match &self.distribution {
            DistributionEntry::Hash(columns) => {
                TableDesc::with_distribution(name, schema, key, columns)
            }
            DistributionEntry::VnodeColumn(column) => {
                TableDesc::with_distribution(name, schema, key, &[] as &[&str])
                    .and_then(|desc| desc.with_vnode_column(column))
            }
        }
        .map_err(|e| bad(e.to_string()))?;
        Ok(desc.with_vnode_count(vnodes))
    }
}

fn schema_bytes(schema: &SchemaRef) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, schema.as_ref())?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// Whether two schemas have the same columns (names, types, nullability).
#[cfg(test)]
pub(crate) fn same_schema(a: &Schema, b: &Schema) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields()).all(|(x, y)| {
            x.name() == y.name()
                && x.data_type() == y.data_type()
                && x.is_nullable() == y.is_nullable()
        })
}

impl Manifest {
    /// An empty store's manifest.
    pub fn empty() -> Self {
        Self {
            format: FORMAT,
            ..Self::default()
        }
    }

    /// Reads `dir/MANIFEST`; `None` when there is none.
    pub fn load(io: &dyn StorageIo, dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(MANIFEST_FILE);
        if !io.exists(&path)? {
            return Ok(None);
        }
        let bytes = io.read(&path)?;
        Self::decode(&bytes, &path).map(Some)
    }

    /// A manifest from its file's bytes; `path` names it in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |message: &str| Error::CorruptState {
            context: path.display().to_string(),
            message: message.to_string(),
        };
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err(bad("not a manifest of this store (bad magic or truncated)"));
        }
        let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[12..20]);
        let len = u64::from_le_bytes(len);
        let body = &bytes[20..];
        if body.len() as u64 != len {
            return Err(bad("length mismatch (truncated manifest)"));
        }
        if crc32fast::hash(body) != crc {
            return Err(bad("checksum mismatch"));
        }
        let manifest: Manifest =
            serde_json::from_slice(body).map_err(|e| bad(&format!("malformed manifest: {e}")))?;
        if ![
            FORMAT,
            FORMAT_LOG_AFTER,
            FORMAT_RUN_VIEWS,
            FORMAT_WITHOUT_LOG,
        ]
        .contains(&manifest.format)
        {
            return Err(bad(&format!(
                "format {} is not the supported format {FORMAT}",
                manifest.format
            )));
        }
        Ok(manifest)
    }

    /// Whether this manifest's log must be on disk: from format 4 on, its header was durable
    /// before the manifest.
    pub fn log_presence(&self) -> LogPresence {
        if self.format >= FORMAT {
            LogPresence::Required
        } else {
            LogPresence::Optional
        }
    }

    /// The manifest file's bytes: magic, checksum, length, body.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_vec(self)
            .map_err(|e| Error::Internal(format!("manifest encoding: {e}")))?;
        let mut bytes = Vec::with_capacity(body.len() + 20);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        Ok(bytes)
    }

    /// Atomically replaces `dir/MANIFEST` with this manifest; returns its size in bytes.
    pub fn store(&self, io: &dyn StorageIo, dir: &Path) -> Result<u64> {
        let bytes = self.encode()?;
        let tmp = dir.join(MANIFEST_TMP);
        let mut file = io.create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync()?;
        drop(file);
        io.rename(&tmp, &dir.join(MANIFEST_FILE))?;
        io.sync_dir(dir)?;
        Ok(bytes.len() as u64)
    }

    /// Applies log records in order (see [`super::log`]). `log` names the log file in
    /// errors: a record that does not fit the state before it is corruption.
    pub fn apply(&mut self, records: &[LogRecord], log: &Path) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let bad = |message: String| Error::CorruptState {
            context: log.display().to_string(),
            message,
        };
        // Per table, per vnode run lists: edits are O(1) each, the flattening O(runs).
        let mut per_vnode: Vec<Vec<Vec<RunEntry>>> = Vec::with_capacity(self.tables.len());
        for table in &mut self.tables {
            let mut vnodes = vec![Vec::new(); table.vnode_count];
            for run in table.runs.drain(..) {
                vnodes
                    .get_mut(usize::from(run.vnode))
                    .ok_or_else(|| bad(format!("vnode {} out of range", run.vnode)))?
                    .push(run);
            }
            per_vnode.push(vnodes);
        }
        let mut files: BTreeMap<u64, FileEntry> = self.files.drain(..).map(|f| (f.id, f)).collect();
        for (i, record) in records.iter().enumerate() {
            let bad = |message: String| bad(format!("record {i}: {message}"));
            if let (Some(before), Some(after)) = (self.committed_epoch, record.committed_epoch)
                && after < before
            {
                return Err(bad(format!("epoch {after} after epoch {before}")));
            }
            if record.committed_epoch.is_none() && self.committed_epoch.is_some() {
                return Err(bad("no committed epoch after one".into()));
            }
            self.committed_epoch = record.committed_epoch;
            self.next_file_id = self.next_file_id.max(record.next_file_id);
            for (k, v) in &record.meta {
                self.meta.insert(k.clone(), v.clone());
            }
            for id in &record.removed {
                if files.remove(id).is_none() {
                    return Err(bad(format!("removes file {id}, which is not live")));
                }
            }
            for f in &record.added {
                if files.insert(f.id, f.clone()).is_some() {
                    return Err(bad(format!("adds file {}, which is already live", f.id)));
                }
            }
            for edit in &record.tables {
                let t = self
                    .tables
                    .iter()
                    .position(|t| t.name == edit.table)
                    .ok_or_else(|| bad(format!("unknown table `{}`", edit.table)))?;
                for v in &edit.vnodes {
                    let runs = per_vnode[t]
                        .get_mut(usize::from(v.vnode))
                        .ok_or_else(|| bad(format!("vnode {} out of range", v.vnode)))?;
                    let base_only = |runs: &[RunEntry]| runs.iter().all(|r| r.epoch == 0);
                    if v.runs.iter().any(|r| r.vnode != v.vnode)
                        || (v.kind == EditKind::Append && v.runs.iter().any(|r| r.epoch == 0))
                        || (v.kind == EditKind::AppendBase
                            && !(base_only(&v.runs) && base_only(runs)))
                    {
                        return Err(bad(format!("malformed runs of vnode {}", v.vnode)));
                    }
                    match v.kind {
                        EditKind::Append | EditKind::AppendBase => {
                            runs.extend(v.runs.iter().cloned())
                        }
                        EditKind::Replace => *runs = v.runs.clone(),
                    }
                }
            }
        }
        self.files = files.into_values().collect();
        for (table, vnodes) in self.tables.iter_mut().zip(per_vnode) {
            table.runs = vnodes.into_iter().flatten().collect();
        }
        Ok(())
    }

    /// The path of run file `id` in `dir`.
    pub fn file_path(dir: &Path, id: u64) -> PathBuf {
        dir.join(run_file_name(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::io::RealIo;
    use arrow_schema::{DataType, Field};
    use std::sync::Arc;

    #[test]
    fn round_trips_and_rejects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let io = RealIo;
        assert!(Manifest::load(&io, dir.path()).unwrap().is_none());
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("d", DataType::Date64, true),
        ]));
        let desc = TableDesc::new("t", schema, vec![KeyColumn::desc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(8).unwrap());
        let mut m = Manifest::empty();
        m.committed_epoch = Some(5);
        m.meta.insert("dataset".into(), "x".into());
        m.tables.push(TableEntry::of(&desc).unwrap());
        m.store(&io, dir.path()).unwrap();
        let back = Manifest::load(&io, dir.path()).unwrap().unwrap();
        assert_eq!(back, m);
        let d = back.tables[0].desc(dir.path()).unwrap();
        assert!(same_schema(d.schema(), desc.schema()));
        assert_eq!(d.pk().columns(), desc.pk().columns());
        assert_eq!(d.vnode_count(), desc.vnode_count());
        let path = dir.path().join(MANIFEST_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = Manifest::load(&io, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("MANIFEST") && err.contains("checksum"),
            "{err}"
        );
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(Manifest::load(&io, dir.path()).is_err());
    }

    /// Issue 41 item 7: a key column the distribution key leaves out need not be hashable,
    /// and a manifest naming such a table reads back (it was refused as corrupt).
    #[test]
    fn a_table_with_an_unhashable_key_column_outside_its_distribution_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let io = RealIo;
        let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::UInt16, false),
            Field::new("b", dictionary, false),
            Field::new("c", DataType::FixedSizeBinary(2), false),
        ]));
        let key = || {
            vec![
                KeyColumn::asc("a"),
                KeyColumn::asc("b"),
                KeyColumn::asc("c"),
            ]
        };
        let hashed = TableDesc::with_distribution("t", schema.clone(), key(), &["a"]).unwrap();
        let by_column = TableDesc::with_distribution("p", schema.clone(), key(), &[] as &[&str])
            .unwrap()
            .with_vnode_column("a")
            .unwrap();
        let mut m = Manifest::empty();
        for desc in [&hashed, &by_column] {
            m.tables.push(TableEntry::of(desc).unwrap());
        }
        m.store(&io, dir.path()).unwrap();
        let back = Manifest::load(&io, dir.path()).unwrap().unwrap();
        for (entry, desc) in back.tables.iter().zip([&hashed, &by_column]) {
            let d = entry.desc(dir.path()).unwrap();
            assert!(same_schema(d.schema(), desc.schema()));
            assert_eq!(d.pk().columns(), desc.pk().columns());
            assert_eq!(d.distribution(), desc.distribution());
        }
    }

    #[test]
    fn earlier_formats_load_and_a_later_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let io = RealIo;
        for format in [
            FORMAT_WITHOUT_LOG,
            FORMAT_RUN_VIEWS,
            FORMAT_LOG_AFTER,
            FORMAT,
        ] {
            let mut m = Manifest::empty();
            m.format = format;
            m.store(&io, dir.path()).unwrap();
            let back = Manifest::load(&io, dir.path()).unwrap().unwrap();
            assert_eq!(back.format, format);
        }
        let mut m = Manifest::empty();
        m.format = FORMAT + 1;
        m.store(&io, dir.path()).unwrap();
        let err = Manifest::load(&io, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("format 5 is not the supported format 4"),
            "{err}"
        );
    }

    #[test]
    fn run_file_names_parse_back() {
        assert_eq!(run_file_id(&run_file_name(42)), Some(42));
        assert_eq!(run_file_id("run-42.arrow"), None);
        assert_eq!(run_file_id("notes.txt"), None);
    }
}
