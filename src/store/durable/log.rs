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
//!   LOG-<generation, 20 digits>, format 2:
//!     header  (20 bytes)  = "ABMLOG02" (8 bytes) | generation (u64 LE)
//!                           | crc32 of the previous 16 bytes (u32 LE)
//!     record* = frame (28 bytes) | body (len bytes)
//!     frame   = len (u32 LE): the body's bytes                       bytes  0..4
//!             | seq (u64 LE): 0 for the log's first record, then +1      4..12
//!             | offset (u64 LE): where this frame starts in the file    12..20
//!             | head_crc (u32 LE): crc32 of "LOGH" | generation (u64 LE)
//!                                  | the frame's bytes 0..20            20..24
//!             | body_crc (u32 LE): crc32 of "LOGB" | the frame's bytes
//!                                  0..24 | the body                     24..28
//!
//!   body       = flags (u8; bit 0: a committed epoch follows) | committed_epoch (u64 LE)
//!                | next_file_id (u64 LE)
//!                | meta_count (u32 LE)    | meta_count × (key: str | value: str)
//!                | added_count (u32 LE)   | added_count × (id u64 | size u64 | tail_len u64
//!                                                        | tail_crc u32)
//!                | removed_count (u32 LE) | removed_count × id (u64)
//!                | table_count (u32 LE)   | table_count × (name: str | edit_count (u32 LE)
//!                                                        | edit_count × edit)
//!   edit       = vnode (u16 LE) | kind (u8: 1 append, 2 replace, 3 append to the base)
//!                | run_count (u32 LE)
//!                | run_count × run
//!   run        = file (u64) | first block (u32) | block count (u32) | rows (u64) | epoch (u64)
//!   str        = byte length (u32 LE) | UTF-8 bytes
//!   (every integer little-endian; crc32 is the IEEE CRC-32 of `crc32fast`; "LOGH" and
//!   "LOGB" are those 4 ASCII bytes, so the two checksums differ even over equal bytes;
//!   `committed_epoch` is 0 when flag bit 0 is clear)
//! ```
//!
//! A frame's *checksums hold* in the log of generation `g` when its 28 bytes are in the file,
//! its `head_crc` holds (for `g`), its body is in the file and its `body_crc` holds; it is
//! *valid* at byte `at` when, moreover, its `offset` is `at`. The frame's own checksum guards
//! `len`: a damaged length is caught before it is used, and a record cannot pass for another
//! log's or another place's (its checksum covers the generation and its offset). A
//! zero-filled stretch (a file extended by a crash before its data reached the disk) is
//! never a valid frame: its checksums are not zero.
//!
//! A record says, for the state it applies to: the new committed epoch and next file id, the
//! job values set, the run files that become live (with the size and tail checksum the open
//! checks) and those that stop being live, and per table and vnode either runs *appended*
//! after its existing ones (a commit's deltas, epoch > 0), its whole run list *replaced* (a
//! compaction's result: a base with epoch 0, then deltas), or runs *appended to the base* of
//! a vnode that has no deltas (a bulk load's step, epoch 0, its keys after the base's: the
//! committed epoch is unchanged). A version that knows only kinds 1 and 2 refuses a log
//! holding kind 3 as corrupt (`unknown edit kind 3`), naming the log.
//!
//! The manifest names the generation of its log (`log_generation`); its state plus the
//! valid records of `LOG-<that generation>` is the committed state. The commit point of an
//! append is the fsync of its record; a log is only appended to by the process that created
//! it, one record after the other, each fsynced before the next is written. A rewrite
//! creates `LOG-<g + 1>` holding only its header (fsync, directory fsync), then writes the
//! manifest of generation `g + 1` (`MANIFEST.tmp`, fsync, rename, fsync the directory: the
//! commit point), then removes `LOG-<g>`. So a manifest of format 4 or later (see
//! `manifest.rs`) never exists without its log's header on disk.
//!
//! Reading the log of the manifest's generation on open:
//! - a missing log, or one shorter than its header, is corruption when the manifest is of
//!   format 4 or later (its log was durable before it); for an older manifest it holds no
//!   record (that version created the log after the manifest);
//! - a header with a bad magic, checksum or another generation than its name is corruption;
//!   a log of format 1 (`ABMLOG01`, written by an older version) is read only when it holds
//!   nothing but its header, and is otherwise refused, naming the older version;
//! - records are read from byte 20 while frames are valid; a valid frame whose `seq` is not
//!   the one after its predecessor's, or whose body does not decode or does not apply to the
//!   state before it, is corruption;
//! - at the first frame that is not valid (a checksum fails, its offset is not where it is, or
//!   it runs past the end of the file), every later byte offset is searched for a frame whose
//!   checksums hold, wherever it says it starts (so bytes lost or added before a record do
//!   not hide it): if there is one, the bad frame is a damaged committed record and the log
//!   is corruption, naming the byte offset of both; if there is none, the bytes from the bad
//!   frame on are a torn tail (the record being appended when a crash came, never
//!   acknowledged, partly written or zero-filled): not committed and ignored (the next
//!   commit rewrites the manifest and starts a new log, so it is never appended to);
//! - a log of a newer generation than the manifest holding at most a header's bytes is a
//!   leftover of a rewrite that crashed before its commit point, and is removed; one holding
//!   more is corruption (the manifest was replaced by an older one).
//!
//! Corruption is an error naming the log file; nothing on disk is changed.

use std::path::{Path, PathBuf};

use super::record::{
    EditKind, FileEntry, LogPresence, LogRecord, RunEntry, TableEdit, VnodeEdit, log_file_name,
};
use crate::error::{Error, Result};
use crate::store::io::{StorageIo, WriteFile};

const MAGIC: &[u8; 8] = b"ABMLOG02";
/// The magic of format 1 (frames of a length and one checksum, no place or sequence), which
/// a damaged length could pass for a torn tail: read only when it holds no record.
const MAGIC_V1: &[u8; 8] = b"ABMLOG01";
/// Bytes of a log file's header.
pub(crate) const HEADER_LEN: u64 = 20;
/// Bytes before a record's body (see the module docs).
const FRAME_LEN: usize = 28;
/// What each checksum starts with, so the frame's and the body's differ over equal bytes.
const HEAD_TAG: &[u8; 4] = b"LOGH";
const BODY_TAG: &[u8; 4] = b"LOGB";

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
                    EditKind::AppendBase => 3,
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
                    3 => EditKind::AppendBase,
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

/// Bytes a record of `body_len` bytes takes in the log, frame included.
pub(crate) fn framed_len(body_len: usize) -> u64 {
    (FRAME_LEN + body_len) as u64
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut out = [0u8; 4];
    out.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(out)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(out)
}

/// The checksum of a frame's first 20 bytes in the log of `generation`.
fn head_crc(generation: u64, head: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(HEAD_TAG);
    h.update(&generation.to_le_bytes());
    h.update(&head[..20]);
    h.finalize()
}

/// The checksum of a body, bound to the frame's first 24 bytes.
fn body_crc(head: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(BODY_TAG);
    h.update(&head[..24]);
    h.update(body);
    h.finalize()
}

/// The record `body` framed as record `seq` at byte `offset` of the log of `generation`.
fn frame(generation: u64, seq: u64, offset: u64, body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .map_err(|_| crate::error::internal!("a log record of {} bytes", body.len()))?;
    let mut out = Vec::with_capacity(FRAME_LEN + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    let crc = head_crc(generation, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    let crc = body_crc(&out, body);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// A frame whose checksums hold: its sequence number, the offset it says it starts at, its
/// body and end.
struct Frame<'a> {
    seq: u64,
    offset: u64,
    body: &'a [u8],
    end: usize,
}

/// The frame at byte `at` of `bytes` if its checksums hold (for `generation`), or why not.
/// Whether it says it starts at `at` is the caller's check.
fn frame_at(bytes: &[u8], at: usize, generation: u64) -> std::result::Result<Frame<'_>, String> {
    let rest = bytes.len().saturating_sub(at);
    if rest < FRAME_LEN {
        return Err(format!(
            "a frame cut short ({rest} of its {FRAME_LEN} bytes)"
        ));
    }
    let head = &bytes[at..at + FRAME_LEN];
    if head_crc(generation, head) != u32_at(head, 20) {
        return Err("frame checksum mismatch (length, sequence number or offset)".into());
    }
    let len = u32_at(head, 0) as usize;
    let end = at + FRAME_LEN + len;
    if end > bytes.len() {
        return Err(format!(
            "a body of {len} bytes that runs past the end of the file ({} bytes)",
            bytes.len()
        ));
    }
    let body = &bytes[at + FRAME_LEN..end];
    if body_crc(head, body) != u32_at(head, 24) {
        return Err("body checksum mismatch".into());
    }
    Ok(Frame {
        seq: u64_at(head, 4),
        offset: u64_at(head, 12),
        body,
        end,
    })
}

/// The first byte offset from `from` on where a frame whose checksums hold starts, if any,
/// wherever it says it starts (a record moved by bytes lost or added before it is still a
/// record). Only offsets whose frame's body fits in the file are checksummed.
fn next_valid_frame(bytes: &[u8], from: usize, generation: u64) -> Option<usize> {
    let last = bytes.len().checked_sub(FRAME_LEN)?;
    (from..=last).find(|&at| {
        at + FRAME_LEN + u32_at(bytes, at) as usize <= bytes.len()
            && frame_at(bytes, at, generation).is_ok()
    })
}

fn header_of(magic: &[u8; 8], generation: u64) -> [u8; HEADER_LEN as usize] {
    let mut out = [0u8; HEADER_LEN as usize];
    out[..8].copy_from_slice(magic);
    out[8..16].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32fast::hash(&out[..16]);
    out[16..].copy_from_slice(&crc.to_le_bytes());
    out
}

fn header(generation: u64) -> [u8; HEADER_LEN as usize] {
    header_of(MAGIC, generation)
}

/// Reads the log of `generation` in `dir`: its committed records, in order (see the module
/// docs for what is valid; a torn tail is left out).
pub(crate) fn read_log(
    io: &dyn StorageIo,
    dir: &Path,
    generation: u64,
    presence: LogPresence,
) -> Result<Vec<LogRecord>> {
    let path = dir.join(log_file_name(generation));
    let corrupt = |message: String| Error::CorruptState {
        context: path.display().to_string(),
        message,
    };
    if !io.exists(&path)? {
        return match presence {
            LogPresence::Optional => Ok(Vec::new()),
            LogPresence::Required => Err(corrupt(format!(
                "missing: the manifest (of generation {generation}) names this log, whose \
                 header was written before it"
            ))),
        };
    }
    let bytes = io.read(&path)?;
    if bytes.len() < HEADER_LEN as usize && presence == LogPresence::Required {
        return Err(corrupt(format!(
            "truncated: {} bytes, shorter than its {HEADER_LEN}-byte header, which was written \
             before the manifest that names it",
            bytes.len()
        )));
    }
    parse_log(&bytes, generation)
        .map(|log| log.records)
        .map_err(corrupt)
}

/// Whether a log of a generation newer than the manifest's is a leftover of a rewrite that
/// crashed before its commit point: it holds at most its header's bytes, so no record.
pub(crate) fn is_unfinished_rewrite(io: &dyn StorageIo, path: &Path) -> Result<bool> {
    Ok(io.open(path)?.len() <= HEADER_LEN)
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
        return Err(if &bytes[..8] == MAGIC_V1 {
            if bytes.len() == header_len && bytes[..] == header_of(MAGIC_V1, generation) {
                // Format 1 holding no record reads as what it is: an empty log.
                return Ok(LogContents {
                    valid_len: HEADER_LEN,
                    ..LogContents::default()
                });
            }
            "written by an older version of backfill (log format ABMLOG01), which this \
             version does not read: start over with --fresh (or finish the job with that \
             version)"
                .into()
        } else if &bytes[..8] != MAGIC {
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
        let seq = out.records.len() as u64;
        let found = frame_at(bytes, at, generation).and_then(|frame| {
            if frame.offset == at as u64 {
                Ok(frame)
            } else {
                Err(format!(
                    "a frame that says it starts at byte {}",
                    frame.offset
                ))
            }
        });
        match found {
            Ok(frame) => {
                if frame.seq != seq {
                    return Err(format!(
                        "the record at byte {at} has sequence number {}, not {seq}",
                        frame.seq
                    ));
                }
                let record = LogRecord::decode_body(frame.body)
                    .map_err(|e| format!("malformed record at byte {at}: {e}"))?;
                out.records.push(record);
                at = frame.end;
                out.valid_len = at as u64;
            }
            Err(why) => {
                if let Some(later) = next_valid_frame(bytes, at + 1, generation) {
                    return Err(format!(
                        "damaged record {seq} at byte {at} ({why}), followed by a valid record \
                         at byte {later}: a committed record is damaged (a torn write can only \
                         be the last)"
                    ));
                }
                out.torn = true;
                break;
            }
        }
    }
    Ok(out)
}

/// The open log of the current generation, appended to by commits.
pub(crate) struct LogWriter {
    path: PathBuf,
    file: Box<dyn WriteFile>,
    generation: u64,
    /// The next record's sequence number.
    seq: u64,
    len: u64,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("path", &self.path)
            .field("seq", &self.seq)
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
            generation,
            seq: 0,
            len: HEADER_LEN,
        })
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends a record's body ([`LogRecord::encode_body`]) in its frame and fsyncs: the
    /// commit point.
    pub fn append(&mut self, body: &[u8]) -> Result<()> {
        let framed = frame(self.generation, self.seq, self.len, body)?;
        std::io::Write::write_all(&mut self.file, &framed)?;
        self.file.sync()?;
        self.len += framed.len() as u64;
        self.seq += 1;
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
                    VnodeEdit {
                        vnode: 3,
                        kind: EditKind::AppendBase,
                        runs: vec![RunEntry {
                            vnode: 3,
                            file: 8,
                            first: 1,
                            count: 2,
                            rows: 700,
                            epoch: 0,
                        }],
                    },
                ],
            }],
        }
    }

    /// A log of generation 7 holding `records`, framed as the writer frames them.
    fn log_bytes(records: &[LogRecord]) -> Vec<u8> {
        let mut bytes = header(7).to_vec();
        for (seq, r) in records.iter().enumerate() {
            let body = r.encode_body().unwrap();
            let offset = bytes.len() as u64;
            bytes.extend(frame(7, seq as u64, offset, &body).unwrap());
        }
        bytes
    }

    /// Where each record's frame starts in a log of `log_bytes`.
    fn offsets(records: &[LogRecord]) -> Vec<usize> {
        let mut at = HEADER_LEN as usize;
        records
            .iter()
            .map(|r| {
                let start = at;
                at += FRAME_LEN + r.encode_body().unwrap().len();
                start
            })
            .collect()
    }

    fn three() -> Vec<LogRecord> {
        vec![record(1), record(2), record(3)]
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
        let log = parse_log(&log_bytes(&three()), 7).unwrap();
        assert_eq!(log.records, three());
        assert!(!log.torn);
    }

    #[test]
    fn the_layout_is_as_documented() {
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
        let framed = frame(7, 5, 20, &body).unwrap();
        assert_eq!(framed.len() as u64, framed_len(body.len()));
        assert_eq!(framed[..4], (body.len() as u32).to_le_bytes());
        assert_eq!(framed[4..12], 5u64.to_le_bytes());
        assert_eq!(framed[12..20], 20u64.to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(b"LOGH");
        h.update(&7u64.to_le_bytes());
        h.update(&framed[..20]);
        assert_eq!(framed[20..24], h.finalize().to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(b"LOGB");
        h.update(&framed[..24]);
        h.update(&body);
        assert_eq!(framed[24..28], h.finalize().to_le_bytes());
        assert_eq!(&framed[28..], &body[..]);
        let head = header(7);
        assert_eq!(&head[..8], b"ABMLOG02");
        assert_eq!(head[8..16], 7u64.to_le_bytes());
        assert_eq!(head[16..], crc32fast::hash(&head[..16]).to_le_bytes());
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail() {
        let full = log_bytes(&three());
        let last = offsets(&three())[2];
        for cut in last..full.len() {
            let log = parse_log(&full[..cut], 7).unwrap();
            assert_eq!(log.records, [record(1), record(2)], "cut at {cut}");
            assert_eq!(log.valid_len, last as u64);
            assert_eq!(log.torn, cut > last);
        }
        // A short header is an empty log (for a manifest that does not require it).
        assert!(parse_log(&full[..10], 7).unwrap().records.is_empty());
    }

    #[test]
    fn any_flipped_bit_of_the_last_record_is_a_torn_tail() {
        let full = log_bytes(&three());
        let last = offsets(&three())[2];
        for at in last..full.len() {
            for bit in 0..8 {
                let mut bytes = full.clone();
                bytes[at] ^= 1 << bit;
                let log =
                    parse_log(&bytes, 7).unwrap_or_else(|e| panic!("byte {at} bit {bit}: {e}"));
                assert_eq!(log.records, [record(1), record(2)], "byte {at} bit {bit}");
                assert!(log.torn);
                assert_eq!(log.valid_len, last as u64);
            }
        }
    }

    #[test]
    fn a_flipped_length_of_a_middle_record_is_refused() {
        // The damage of issue 41: the length made the frame run past the end of the file,
        // which read as a torn tail and rolled committed records back.
        let full = log_bytes(&three());
        for (i, &start) in offsets(&three())[..2].iter().enumerate() {
            for bit in 0..32 {
                let mut bytes = full.clone();
                bytes[start + bit / 8] ^= 1 << (bit % 8);
                let err = parse_log(&bytes, 7).unwrap_err();
                assert!(
                    err.contains(&format!("damaged record {i} at byte {start}"))
                        && err.contains("followed by a valid record"),
                    "record {i} bit {bit}: {err}"
                );
            }
        }
    }

    #[test]
    fn any_flipped_bit_of_a_record_followed_by_a_valid_one_is_refused() {
        let full = log_bytes(&three());
        let ends = offsets(&three())[1..].to_vec();
        for at in HEADER_LEN as usize..ends[1] {
            for bit in 0..8 {
                let mut bytes = full.clone();
                bytes[at] ^= 1 << bit;
                let err = parse_log(&bytes, 7).unwrap_err();
                assert!(err.contains("damaged record"), "byte {at} bit {bit}: {err}");
            }
        }
        // Bytes cut out of a middle record: the next one is no longer where it says it is,
        // but it is still found.
        let mut bytes = full.clone();
        bytes.drain(ends[0] - 5..ends[0]);
        assert!(
            parse_log(&bytes, 7)
                .unwrap_err()
                .contains("damaged record 0")
        );
    }

    #[test]
    fn a_zero_filled_tail_is_torn() {
        let full = log_bytes(&three());
        let last = offsets(&three())[2];
        // Zeros after the last record, or over part or all of it (a file extended by the
        // crash before its data reached the disk).
        for (keep, zeros) in [
            (full.len(), 1),
            (full.len(), 28),
            (full.len(), 4096),
            (last, full.len() - last),
            (last, 4096),
            (last + 3, 4096),
            (last + FRAME_LEN, 4096),
        ] {
            let mut bytes = full[..keep].to_vec();
            bytes.resize(keep + zeros, 0);
            let log = parse_log(&bytes, 7).unwrap();
            let want = if keep == full.len() { 3 } else { 2 };
            assert_eq!(log.records.len(), want, "keep {keep} zeros {zeros}");
            assert!(log.torn);
        }
        // Zeros over a middle record, with a valid one after them: refused.
        let mut bytes = full.clone();
        let middle = offsets(&three())[1];
        bytes[middle..last].fill(0);
        assert!(
            parse_log(&bytes, 7)
                .unwrap_err()
                .contains("damaged record 1")
        );
    }

    #[test]
    fn a_valid_record_out_of_sequence_or_place_is_refused() {
        let records = three();
        let bodies: Vec<Vec<u8>> = records.iter().map(|r| r.encode_body().unwrap()).collect();
        // Record 1 written twice (sequence numbers 0, 1, 1).
        let mut bytes = header(7).to_vec();
        for (seq, body) in [(0, &bodies[0]), (1, &bodies[1]), (1, &bodies[2])] {
            let offset = bytes.len() as u64;
            bytes.extend(frame(7, seq, offset, body).unwrap());
        }
        let err = parse_log(&bytes, 7).unwrap_err();
        assert!(err.contains("sequence number 1, not 2"), "{err}");
        // A record framed for another place (or another generation's log) is not valid
        // where it lies; it is the last, so a torn tail.
        let mut bytes = log_bytes(&records[..2]);
        bytes.extend(frame(7, 2, 20, &bodies[2]).unwrap());
        let log = parse_log(&bytes, 7).unwrap();
        assert_eq!((log.records.len(), log.torn), (2, true));
        let mut bytes = log_bytes(&records[..2]);
        let offset = bytes.len() as u64;
        bytes.extend(frame(8, 2, offset, &bodies[2]).unwrap());
        assert_eq!(parse_log(&bytes, 7).unwrap().records.len(), 2);
    }

    #[test]
    fn a_damaged_header_or_another_generation_is_refused() {
        let err = parse_log(&log_bytes(&[record(1)]), 8).unwrap_err();
        assert!(err.contains("generation"), "{err}");
        let mut bytes = log_bytes(&[]);
        bytes[0] = b'X';
        assert!(parse_log(&bytes, 7).unwrap_err().contains("magic"));
        let mut bytes = log_bytes(&[]);
        bytes[17] ^= 1;
        assert!(parse_log(&bytes, 7).unwrap_err().contains("checksum"));
    }

    #[test]
    fn a_log_of_format_1_is_read_only_when_it_holds_no_record() {
        let old = header_of(MAGIC_V1, 7).to_vec();
        let log = parse_log(&old, 7).unwrap();
        assert!(log.records.is_empty() && !log.torn);
        let mut with_record = old.clone();
        with_record.extend([4, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0]);
        let err = parse_log(&with_record, 7).unwrap_err();
        assert!(
            err.contains("older version") && err.contains("--fresh"),
            "{err}"
        );
    }

    #[test]
    fn a_required_log_that_is_missing_or_short_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let io = crate::store::io::RealIo;
        let name = log_file_name(7);
        for presence in [LogPresence::Optional, LogPresence::Required] {
            let got = read_log(&io, dir.path(), 7, presence);
            match presence {
                LogPresence::Optional => assert!(got.unwrap().is_empty()),
                LogPresence::Required => {
                    let err = got.unwrap_err().to_string();
                    assert!(err.contains(&name) && err.contains("missing"), "{err}");
                }
            }
        }
        std::fs::write(dir.path().join(&name), &header(7)[..12]).unwrap();
        assert!(
            read_log(&io, dir.path(), 7, LogPresence::Optional)
                .unwrap()
                .is_empty()
        );
        let err = read_log(&io, dir.path(), 7, LogPresence::Required)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&name) && err.contains("truncated"), "{err}");
        std::fs::write(dir.path().join(&name), header(7)).unwrap();
        assert!(
            read_log(&io, dir.path(), 7, LogPresence::Required)
                .unwrap()
                .is_empty()
        );
        // A damaged record names the file and the byte.
        let mut bytes = log_bytes(&three());
        bytes[HEADER_LEN as usize] ^= 0x10;
        std::fs::write(dir.path().join(&name), &bytes).unwrap();
        let err = read_log(&io, dir.path(), 7, LogPresence::Required)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&name) && err.contains("at byte 20"), "{err}");
    }

    #[test]
    fn the_writer_frames_records_as_the_reader_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let io = crate::store::io::RealIo;
        let mut writer = LogWriter::create(&io, dir.path(), 7).unwrap();
        for r in three() {
            writer.append(&r.encode_body().unwrap()).unwrap();
        }
        let bytes = std::fs::read(dir.path().join(log_file_name(7))).unwrap();
        assert_eq!(bytes, log_bytes(&three()));
        assert_eq!(writer.len(), bytes.len() as u64);
    }
}
