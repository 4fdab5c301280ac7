//! The manifest log: what each commit changed, appended with one fsync.
//!
//! Rewriting the whole manifest at every checkpoint costs what the store holds (every
//! vnode's runs), not what the checkpoint changed: with 32768 vnodes that is megabytes of
//! JSON per barrier. Instead a commit appends a small checksummed *record* of its changes to
//! the current log file; the manifest is rewritten only when the log has grown past a few
//! times the manifest's own size (`LOG_GROWTH`; so the rewrites cost, amortized, a constant
//! factor of the log), on table creation, and at the first commit after an open.
//!
//! ```text
//!   LOG-<generation, 20 digits>:
//!     header  = "ABMLOG01" (8 bytes) | generation (u64 LE) | crc32 of the previous 16 bytes (u32 LE)
//!     record* = len (u32 LE) | crc (u32 LE): crc32 of the 4 len bytes then the body | body
//!
//!   body       = flags (u8; bit 0: a committed epoch follows) | committed_epoch (u64 LE)
//!                | next_file_id (u64 LE)
//!                | meta_count (u32 LE)    | meta_count × (key: str | value: str)
//!                | added_count (u32 LE)   | added_count × (id u64 | size u64 | tail_len u64
//!                                                        | tail_crc u32)
//!                | removed_count (u32 LE) | removed_count × id (u64)
//!                | table_count (u32 LE)   | table_count × (name: str | edit_count (u32 LE)
//!                                                        | edit_count × edit)
//!   edit       = vnode (u16 LE) | kind (u8: 1 append, 2 replace) | run_count (u32 LE)
//!                | run_count × run
//!   run        = file (u64) | first block (u32) | block count (u32) | rows (u64) | epoch (u64)
//!   str        = byte length (u32 LE) | UTF-8 bytes
//!   (every integer little-endian; `committed_epoch` is 0 when flag bit 0 is clear)
//! ```
//!
//! A record says, for the state it applies to: the new committed epoch and next file id, the
//! job values set, the run files that become live (with the size and tail checksum the open
//! checks) and those that stop being live, and per table and vnode either runs *appended*
//! after its existing ones (a commit's deltas, epoch > 0) or its whole run list *replaced* (a
//! compaction's result: a base with epoch 0, then deltas).
//!
//! The manifest names the generation of its log (`log_generation`); its state plus the
//! valid records of `LOG-<that generation>` is the committed state. The commit point of an
//! append is the fsync of its record. A rewrite writes the manifest of generation `g + 1`
//! (`MANIFEST.tmp`, fsync, rename, fsync the directory: the commit point), then creates
//! `LOG-<g + 1>` holding only its header (fsync, directory fsync) and removes `LOG-<g>`.
//!
//! Reading a log on open:
//! - a missing log, or one shorter than its header, holds no record (a crash came before the
//!   header was durable);
//! - a header with a bad magic, checksum or another generation than its name is corruption;
//! - a record that runs past the end of the file, or whose checksum fails and that ends
//!   exactly at the end of the file, is a torn tail: it was never acknowledged, so it is not
//!   committed and is ignored (the next commit rewrites the manifest and starts a new log);
//! - a record whose checksum fails and that is followed by more bytes is corruption, as is a
//!   record that does not decode or does not apply to the state before it;
//! - a log of a newer generation than the manifest is corruption (logs are only created
//!   after their manifest is durable).
//!
//! Corruption is an error naming the log file; nothing on disk is changed.

use std::path::{Path, PathBuf};

use super::manifest::{FileEntry, RunEntry};
use crate::error::{Error, Result};
use crate::store::io::{StorageIo, WriteFile};

const MAGIC: &[u8; 8] = b"ABMLOG01";
/// Bytes of a log file's header.
pub(crate) const HEADER_LEN: u64 = 20;
/// Bytes before a record's body: its length and checksum.
const FRAME_LEN: usize = 8;

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

/// What a vnode edit does to the vnode's run list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EditKind {
    /// The runs go after the vnode's existing runs (a commit's deltas).
    Append,
    /// The runs replace the vnode's run list (a compaction's result).
    Replace,
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

struct Encoder(Vec<u8>);

impl Encoder {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn count(&mut self, n: usize) -> Result<()> {
        let n =
            u32::try_from(n).map_err(|_| crate::error::internal!("{n} items in a log record"))?;
        self.u32(n);
        Ok(())
    }
    fn str(&mut self, s: &str) -> Result<()> {
        self.count(s.len())?;
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| format!("record body ends early (at byte {})", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> std::result::Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A count of items of at least `min_bytes` each: never more than the bytes left allow,
    /// so a corrupt count cannot make us allocate without bound.
    fn count(&mut self, min_bytes: usize) -> std::result::Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_bytes) > self.bytes.len() - self.at {
            return Err(format!("count {n} at byte {} exceeds the record", self.at));
        }
        Ok(n)
    }
    fn str(&mut self) -> std::result::Result<String, String> {
        let n = self.count(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }
}

impl LogRecord {
    /// The record's body (see the module docs).
    pub fn encode_body(&self) -> Result<Vec<u8>> {
        let mut e = Encoder(Vec::with_capacity(64));
        e.u8(u8::from(self.committed_epoch.is_some()));
        e.u64(self.committed_epoch.unwrap_or(0));
        e.u64(self.next_file_id);
        e.count(self.meta.len())?;
        for (k, v) in &self.meta {
            e.str(k)?;
            e.str(v)?;
        }
        e.count(self.added.len())?;
        for f in &self.added {
            e.u64(f.id);
            e.u64(f.size);
            e.u64(f.tail_len);
            e.u32(f.tail_crc);
        }
        e.count(self.removed.len())?;
        for id in &self.removed {
            e.u64(*id);
        }
        e.count(self.tables.len())?;
        for t in &self.tables {
            e.str(&t.table)?;
            e.count(t.vnodes.len())?;
            for v in &t.vnodes {
                e.u16(v.vnode);
                e.u8(match v.kind {
                    EditKind::Append => 1,
                    EditKind::Replace => 2,
                });
                e.count(v.runs.len())?;
                for r in &v.runs {
                    e.u64(r.file);
                    e.u32(r.first);
                    e.u32(r.count);
                    e.u64(r.rows);
                    e.u64(r.epoch);
                }
            }
        }
        Ok(e.0)
    }

    /// The record with its frame (length and checksum), ready to append.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let body = self.encode_body()?;
        let len = u32::try_from(body.len())
            .map_err(|_| crate::error::internal!("a log record of {} bytes", body.len()))?;
        let mut out = Vec::with_capacity(FRAME_LEN + body.len());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&frame_crc(len, &body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decodes a record's body.
    pub fn decode_body(bytes: &[u8]) -> std::result::Result<Self, String> {
        let mut d = Decoder { bytes, at: 0 };
        let flags = d.u8()?;
        if flags > 1 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let epoch = d.u64()?;
        let committed_epoch = (flags & 1 == 1).then_some(epoch);
        let next_file_id = d.u64()?;
        let mut meta = Vec::new();
        for _ in 0..d.count(8)? {
            let k = d.str()?;
            let v = d.str()?;
            meta.push((k, v));
        }
        let mut added = Vec::new();
        for _ in 0..d.count(28)? {
            added.push(FileEntry {
                id: d.u64()?,
                size: d.u64()?,
                tail_len: d.u64()?,
                tail_crc: d.u32()?,
            });
        }
        let mut removed = Vec::new();
        for _ in 0..d.count(8)? {
            removed.push(d.u64()?);
        }
        let mut tables = Vec::new();
        for _ in 0..d.count(8)? {
            let table = d.str()?;
            let mut vnodes = Vec::new();
            for _ in 0..d.count(7)? {
                let vnode = d.u16()?;
                let kind = match d.u8()? {
                    1 => EditKind::Append,
                    2 => EditKind::Replace,
                    k => return Err(format!("unknown edit kind {k}")),
                };
                let mut runs = Vec::new();
                for _ in 0..d.count(32)? {
                    runs.push(RunEntry {
                        vnode,
                        file: d.u64()?,
                        first: d.u32()?,
                        count: d.u32()?,
                        rows: d.u64()?,
                        epoch: d.u64()?,
                    });
                }
                vnodes.push(VnodeEdit { vnode, kind, runs });
            }
            tables.push(TableEdit { table, vnodes });
        }
        if d.at != bytes.len() {
            return Err(format!(
                "{} bytes after the record's last field",
                bytes.len() - d.at
            ));
        }
        Ok(Self {
            committed_epoch,
            next_file_id,
            meta,
            added,
            removed,
            tables,
        })
    }
}

fn frame_crc(len: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

fn header(generation: u64) -> [u8; HEADER_LEN as usize] {
    let mut out = [0u8; HEADER_LEN as usize];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&out[..16]);
    out[16..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Reads the log of `generation` in `dir`: its committed records, in order (see the module
/// docs for what is valid; a torn tail is left out). A missing file is an empty log.
pub(crate) fn read_log(io: &dyn StorageIo, dir: &Path, generation: u64) -> Result<Vec<LogRecord>> {
    let path = dir.join(log_file_name(generation));
    if !io.exists(&path)? {
        return Ok(Vec::new());
    }
    let bytes = io.read(&path)?;
    parse_log(&bytes, generation)
        .map(|log| log.records)
        .map_err(|message| Error::CorruptState {
            context: path.display().to_string(),
            message,
        })
}

/// The valid records of a log file and how it ends.
#[derive(Debug, Default)]
struct LogContents {
    /// The committed records, in order.
    records: Vec<LogRecord>,
    /// Bytes of the valid prefix (header and records).
    valid_len: u64,
    /// Whether bytes after the valid prefix were ignored (a torn tail).
    torn: bool,
}

fn parse_log(bytes: &[u8], generation: u64) -> std::result::Result<LogContents, String> {
    let header_len = HEADER_LEN as usize;
    if bytes.len() < header_len {
        return Ok(LogContents {
            torn: !bytes.is_empty(),
            ..LogContents::default()
        });
    }
    if bytes[..header_len] != header(generation) {
        return Err(if &bytes[..8] != MAGIC {
            "not a manifest log of this store (bad magic)".into()
        } else if bytes[8..16] != generation.to_le_bytes() {
            "the log's generation does not match its manifest".into()
        } else {
            "header checksum mismatch".into()
        });
    }
    let mut out = LogContents {
        valid_len: HEADER_LEN,
        ..LogContents::default()
    };
    let mut at = header_len;
    while at < bytes.len() {
        let rest = bytes.len() - at;
        if rest < FRAME_LEN {
            out.torn = true;
            break;
        }
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let crc = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        let end = at + FRAME_LEN + len as usize;
        if end > bytes.len() {
            out.torn = true;
            break;
        }
        let body = &bytes[at + FRAME_LEN..end];
        if frame_crc(len, body) != crc {
            if end == bytes.len() {
                out.torn = true;
                break;
            }
            return Err(format!(
                "checksum mismatch in the record at byte {at}, followed by {} more bytes",
                bytes.len() - end
            ));
        }
        let record = LogRecord::decode_body(body)
            .map_err(|e| format!("malformed record at byte {at}: {e}"))?;
        out.records.push(record);
        at = end;
        out.valid_len = end as u64;
    }
    Ok(out)
}

/// The open log of the current generation, appended to by commits.
pub(crate) struct LogWriter {
    path: PathBuf,
    file: Box<dyn WriteFile>,
    len: u64,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl LogWriter {
    /// Creates the log of `generation` in `dir` holding only its header, durably (the file
    /// and the directory entry are fsynced).
    pub fn create(io: &dyn StorageIo, dir: &Path, generation: u64) -> Result<Self> {
        let path = dir.join(log_file_name(generation));
        let mut file = io.create(&path)?;
        std::io::Write::write_all(&mut file, &header(generation))?;
        file.sync()?;
        io.sync_dir(dir)?;
        Ok(Self {
            path,
            file,
            len: HEADER_LEN,
        })
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends a framed record ([`LogRecord::encode`]) and fsyncs: the commit point.
    pub fn append(&mut self, framed: &[u8]) -> Result<()> {
        std::io::Write::write_all(&mut self.file, framed)?;
        self.file.sync()?;
        self.len += framed.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(epoch: u64) -> LogRecord {
        LogRecord {
            committed_epoch: Some(epoch),
            next_file_id: 9,
            meta: vec![("replay.changes_applied".into(), "12".into())],
            added: vec![FileEntry {
                id: 8,
                size: 1000,
                tail_len: 200,
                tail_crc: 0xdead_beef,
            }],
            removed: vec![3, 4],
            tables: vec![TableEdit {
                table: "upstream".into(),
                vnodes: vec![
                    VnodeEdit {
                        vnode: 32767,
                        kind: EditKind::Append,
                        runs: vec![RunEntry {
                            vnode: 32767,
                            file: 8,
                            first: 0,
                            count: 1,
                            rows: 5,
                            epoch,
                        }],
                    },
                    VnodeEdit {
                        vnode: 2,
                        kind: EditKind::Replace,
                        runs: Vec::new(),
                    },
                ],
            }],
        }
    }

    fn log_bytes(records: &[LogRecord]) -> Vec<u8> {
        let mut bytes = header(7).to_vec();
        for r in records {
            bytes.extend(r.encode().unwrap());
        }
        bytes
    }

    #[test]
    fn records_round_trip() {
        let r = record(5);
        assert_eq!(
            LogRecord::decode_body(&r.encode_body().unwrap()).unwrap(),
            r
        );
        let empty = LogRecord::default();
        assert_eq!(
            LogRecord::decode_body(&empty.encode_body().unwrap()).unwrap(),
            empty
        );
        let log = parse_log(&log_bytes(&[record(1), record(2)]), 7).unwrap();
        assert_eq!(log.records, [record(1), record(2)]);
        assert!(!log.torn);
    }

    #[test]
    fn the_body_layout_is_as_documented() {
        let r = LogRecord {
            committed_epoch: Some(0x0102),
            next_file_id: 3,
            ..LogRecord::default()
        };
        let body = r.encode_body().unwrap();
        let mut want = vec![1u8];
        want.extend(0x0102u64.to_le_bytes());
        want.extend(3u64.to_le_bytes());
        want.extend([0u8; 16]); // four empty lists
        assert_eq!(body, want);
        let framed = r.encode().unwrap();
        assert_eq!(framed[..4], (body.len() as u32).to_le_bytes());
        assert_eq!(&framed[8..], &body[..]);
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail() {
        let full = log_bytes(&[record(1), record(2)]);
        let second = header(7).len() + record(1).encode().unwrap().len();
        for cut in second..full.len() {
            let log = parse_log(&full[..cut], 7).unwrap();
            assert_eq!(log.records, [record(1)], "cut at {cut}");
            assert_eq!(log.valid_len, second as u64);
            assert_eq!(log.torn, cut > second);
        }
        // A flipped byte in the last record: torn, not corruption.
        let mut bytes = full.clone();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let log = parse_log(&bytes, 7).unwrap();
        assert_eq!((log.records.len(), log.torn), (1, true));
        // A short header is an empty log.
        assert!(parse_log(&full[..10], 7).unwrap().records.is_empty());
    }

    #[test]
    fn a_corrupt_record_followed_by_more_is_refused() {
        let mut bytes = log_bytes(&[record(1), record(2)]);
        let at = header(7).len() + 12;
        bytes[at] ^= 0x20;
        let err = parse_log(&bytes, 7).unwrap_err();
        assert!(err.contains("checksum mismatch"), "{err}");
        // A header of another generation or damaged.
        let err = parse_log(&log_bytes(&[record(1)]), 8).unwrap_err();
        assert!(err.contains("generation"), "{err}");
        let mut bytes = log_bytes(&[]);
        bytes[0] = b'X';
        assert!(parse_log(&bytes, 7).unwrap_err().contains("magic"));
    }

    #[test]
    fn log_names_parse_back() {
        assert_eq!(log_generation(&log_file_name(42)), Some(42));
        assert_eq!(log_generation("LOG-42"), None);
        assert_eq!(log_generation("MANIFEST"), None);
    }
}
