//! Run files: sorted runs of one table as Arrow IPC files, with checksums and a block index.
//!
//! A run file is a standard Arrow IPC file (pyarrow's `pa.ipc.open_file` reads it) whose
//! schema is the table's columns plus a non-null Boolean `__deleted` column (tombstones of
//! delta runs; always false in a base run). Columns are stored in as few bytes as Arrow
//! allows for the same values ([`stored_type`]): string and binary views as offsets and
//! bytes, decimals of precision 18 or less in 64 bits, dictionaries as their values (a
//! lineitem row takes 146 bytes instead of 218, IPC framing included). Files of format 1,
//! which stored every column as the table holds it, are still read. Each record batch holds
//! at most [`SEGMENT_ROWS`] rows. The index lists *blocks*: rows of **one** vnode, sorted by key,
//! each a whole record batch or, for runs shorter than [`MIN_BLOCK_ROWS`] rows, a row range
//! of a record batch shared with other short runs (a *packed* batch: an epoch touching
//! 32768 vnodes a row each writes a few record batches, not 32768). Consecutive blocks of a
//! vnode form a *run* (the manifest names runs as `(file, first block, block count)`).
//!
//! ```text
//!   ARROW1 | schema message | batch 0 | batch 1 | ... | EOS | footer | len | ARROW1
//!   └──── header ─────────┘                            └──────── tail ─────────┘
//!   footer custom metadata:
//!     arrangement_backfill.index       hex of an Arrow IPC stream, one row per block:
//!                                      vnode u16, rows u32, offset u64, len u64, crc u32
//!                                      (of the record batch holding the block),
//!                                      start u32 (the block's first row in that batch),
//!                                      key_0.. = the block's last primary key (typed;
//!                                      dictionaries as their values)
//!     arrangement_backfill.header_crc  CRC-32 of the header bytes
//! ```
//!
//! Blocks of one packed batch are consecutive in the index, with the same offset, length
//! and CRC, and starts that follow each other from 0. Files written before packing have no
//! `start` column (every block is a whole batch) and are read as such.
//!
//! Integrity: the manifest records each file's size and the CRC-32 of its tail, checked when
//! the file is opened (so the index and header CRC are trusted); the header is checked
//! against its CRC at open too, and each block against its own CRC whenever it is read.
//! Every byte of the file is covered: corruption is an error naming the file, never data.
//! Keys in the index are typed values (arrow-row bytes are not a persisted format) and are
//! encoded with the table's key converter on open.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch, UInt16Array, UInt32Array, UInt64Array,
};
use arrow_buffer::{BooleanBufferBuilder, Buffer};
use arrow_ipc::reader::{FileDecoder, StreamReader};
use arrow_ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
use arrow_ipc::{Block, MetadataVersion};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::cache::BlockCache;
use super::stored::{
    MAX_BLOCK_VALUE_BYTES, decode_schema, from_stored, made_bytes, stored_type, stored_type_v1,
    stored_value_bytes, to_stored,
};
use crate::error::{Error, Result};
use crate::store::KeyedBatch;
use crate::store::io::{ReadFile, StorageIo, WriteFile};
use crate::store::run::{Rows, Run, RunList, SEGMENT_ROWS, gc_views, push_joined};
use crate::table::{TableDesc, same_fields};
use crate::vnode::VirtualNode;

/// The tombstone column appended to every run file's schema.
pub(crate) const DELETED_COLUMN: &str = "__deleted";
const INDEX_KEY: &str = "arrangement_backfill.index";
const HEADER_CRC_KEY: &str = "arrangement_backfill.header_crc";
/// Arrow IPC file magic and footer length: the last 10 bytes.
const TRAILER_LEN: usize = 10;

/// The target size of a block in memory: 128 KiB (about a thousand lineitem rows). Against 64 KiB,
/// a scale-1 vnode-order replay takes 6% less CPU (half the blocks to cut, index, check,
/// decode, key-encode and cache; fewer, longer slices to gather), merged order the same time
/// for 17 MB more peak memory (a merge holds a block per source per vnode); see
/// `docs/benchmarks-history.md`.
pub(crate) const BLOCK_BYTES: usize = 128 << 10;
/// The fewest rows in a block (unless the run is shorter).
pub(crate) const MIN_BLOCK_ROWS: usize = 64;

/// Rows per block for rows like these: about [`BLOCK_BYTES`] of them.
fn block_rows(batch: &RecordBatch) -> usize {
    let rows = batch.num_rows().max(1);
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum();
    let per_row = (bytes / rows).max(1);
    (BLOCK_BYTES / per_row).clamp(MIN_BLOCK_ROWS, SEGMENT_ROWS)
}

/// The schema of a run file of `table`: its columns as [`stored_type`] stores them, and the
/// tombstone column.
pub(crate) fn file_schema(table: &Schema) -> SchemaRef {
    schema_with(table, stored_type)
}

/// The schema of a run file of `table` in format 1 ([`stored_type_v1`]).
fn file_schema_v1(table: &Schema) -> SchemaRef {
    schema_with(table, stored_type_v1)
}

fn schema_with(table: &Schema, stored: fn(&DataType) -> DataType) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = (table.fields().iter())
        .map(|f| Arc::new(f.as_ref().clone().with_data_type(stored(f.data_type()))))
        .collect();
    fields.push(Arc::new(Field::new(
        DELETED_COLUMN,
        DataType::Boolean,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// What the manifest records about a file to check it on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileCheck {
    /// Total length in bytes.
    pub size: u64,
    /// Length of the tail (EOS, footer, footer length, magic).
    pub tail_len: u64,
    /// CRC-32 of the tail.
    pub tail_crc: u32,
}

/// One block's place in the file.
#[derive(Debug, Clone, Copy)]
struct BlockMeta {
    vnode: VirtualNode,
    rows: u32,
    /// The record batch holding the block.
    offset: u64,
    len: u64,
    crc: u32,
    /// The block's first row in its batch.
    start: u32,
    /// The index of the first block of its batch (itself unless packed).
    batch: u32,
    /// The rows of its batch.
    batch_rows: u32,
}

/// A run inside a file: `count` blocks of `vnode` from block `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunSpan {
    /// The vnode.
    pub vnode: VirtualNode,
    /// The first block.
    pub first: u32,
    /// The number of blocks.
    pub count: u32,
    /// The rows (tombstones included).
    pub rows: u64,
}

/// A `Write` that counts bytes and keeps a running CRC-32 (restartable per region).
struct Checksummed<W> {
    inner: W,
    pos: u64,
    crc: crc32fast::Hasher,
}

impl<W: Write> Checksummed<W> {
    /// The CRC of the bytes since the last call, and a fresh start.
    fn take_crc(&mut self) -> u32 {
        std::mem::take(&mut self.crc).finalize()
    }
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

type Sink = Checksummed<BufWriter<Box<dyn WriteFile>>>;

/// Writes one run file, block by block. Nothing is visible until [`RunFileWriter::finish`]
/// returned (it fsyncs); the manifest decides whether the file is live.
pub(crate) struct RunFileWriter {
    id: u64,
    path: PathBuf,
    io: Arc<dyn StorageIo>,
    desc: Arc<TableDesc>,
    schema: SchemaRef,
    writer: FileWriter<Sink>,
    header_crc: u32,
    blocks: Vec<BlockMeta>,
    /// Each block's last key, encoded and owned (a slice of the block would keep the whole
    /// block's buffers alive until the file is finished).
    last_keys: Vec<Vec<u8>>,
    spans: Vec<RunSpan>,
    open_span: Option<RunSpan>,
    cache: Option<Arc<BlockCache>>,
    /// Short runs waiting to be written as one packed batch.
    pack: Vec<(VirtualNode, Run)>,
    pack_rows: usize,
    pack_limit: usize,
    /// The bytes of values the waiting short runs store in their largest offsets column.
    pack_value_bytes: usize,
    /// The most bytes of values a block may store in one offsets column
    /// ([`MAX_BLOCK_VALUE_BYTES`]; lower in tests).
    value_bytes_limit: usize,
}

impl RunFileWriter {
    /// Creates the file `path` (id `id`) for rows of `desc`.
    pub fn create(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
    ) -> Result<Self> {
        let schema = file_schema(desc.schema());
        Self::create_as(io, path, id, desc, schema)
    }

    /// A writer of format 1 ([`stored_type_v1`]), to test that such files are still read.
    #[cfg(test)]
    fn create_v1(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
    ) -> Result<Self> {
        let schema = file_schema_v1(desc.schema());
        Self::create_as(io, path, id, desc, schema)
    }

    fn create_as(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
        schema: SchemaRef,
    ) -> Result<Self> {
        let file = io.create(&path)?;
        let sink = Checksummed {
            inner: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            crc: crc32fast::Hasher::new(),
        };
        let mut writer =
            FileWriter::try_new_with_options(sink, &schema, IpcWriteOptions::default())?;
        let header_crc = writer.get_mut().take_crc();
        Ok(Self {
            id,
            path,
            io,
            desc,
            schema,
            writer,
            header_crc,
            blocks: Vec::new(),
            last_keys: Vec::new(),
            spans: Vec::new(),
            open_span: None,
            cache: None,
            pack: Vec::new(),
            pack_rows: 0,
            pack_limit: usize::MAX,
            pack_value_bytes: 0,
            value_bytes_limit: MAX_BLOCK_VALUE_BYTES,
        })
    }

    /// Caches the blocks the finished file decodes.
    pub fn with_cache(mut self, cache: Option<Arc<BlockCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// Starts a run of `vnode`; blocks written until [`Self::end_run`] belong to it.
    pub fn begin_run(&mut self, vnode: VirtualNode) -> Result<()> {
        self.end_run();
        self.flush_pack()?;
        let first = u32::try_from(self.blocks.len())
            .map_err(|_| Error::Internal("more than 2^32 blocks in a run file".into()))?;
        self.open_span = Some(RunSpan {
            vnode,
            first,
            count: 0,
            rows: 0,
        });
        Ok(())
    }

    /// Ends the open run, if any.
    pub fn end_run(&mut self) {
        if let Some(span) = self.open_span.take()
            && span.count > 0
        {
            self.spans.push(span);
        }
    }

    /// Writes sorted rows (and their tombstones) of the open run, cut into blocks of about
    /// [`BLOCK_BYTES`] (between [`MIN_BLOCK_ROWS`] and [`SEGMENT_ROWS`] rows): a scan holds
    /// one block per source, so the block size bounds a backfill's memory per vnode.
    pub fn write(&mut self, rows: &KeyedBatch, deleted: Option<&BooleanArray>) -> Result<()> {
        let batch = &rows.batch;
        if rows.keys.len() != batch.num_rows() {
            return Err(Error::Internal(format!(
                "{} keys for {} rows written to a run file",
                rows.keys.len(),
                batch.num_rows()
            )));
        }
        let block_rows = block_rows(batch);
        let mut offset = 0;
        while offset < batch.num_rows() {
            let mut len = (batch.num_rows() - offset).min(block_rows);
            // Rows of long values: fewer of them, so that no column's offsets overflow.
            while len > 1
                && stored_value_bytes(batch, offset, len, &self.schema) > self.value_bytes_limit
            {
                len = len.div_ceil(2);
            }
            let part = batch.slice(offset, len);
            let tombstones = match deleted {
                Some(d) => d.slice(offset, len),
                None => BooleanArray::from(vec![false; len]),
            };
            // The block's last key, as the rows came with it (no encoding of our own).
            let last_key = rows.keys.value(offset + len - 1);
            self.write_block(&part, last_key, tombstones)?;
            offset += len;
        }
        Ok(())
    }

    /// Writes a whole run of `vnode`. A run shorter than [`MIN_BLOCK_ROWS`] waits to share a
    /// packed batch with other short runs; runs keep their order in the file either way.
    pub fn write_run(&mut self, vnode: VirtualNode, run: &Run) -> Result<()> {
        if run.len() > 0 && run.len() < MIN_BLOCK_ROWS {
            let (rows, start) = run.rows();
            let value_bytes = stored_value_bytes(&rows.data.batch, start, run.len(), &self.schema);
            if value_bytes <= self.value_bytes_limit {
                if self.pack_value_bytes + value_bytes > self.value_bytes_limit {
                    self.flush_pack()?;
                }
                self.pack_value_bytes += value_bytes;
                self.end_run();
                if self.pack.is_empty() {
                    self.pack_limit = block_rows(&run.batch());
                }
                self.pack_rows += run.len();
                self.pack.push((vnode, run.clone()));
                if self.pack_rows >= self.pack_limit {
                    self.flush_pack()?;
                }
                return Ok(());
            }
        }
        let deleted = run.deleted().map(|d| BooleanArray::new(d, None));
        self.begin_run(vnode)?;
        self.write(&run.data_of(0, run.len()), deleted.as_ref())?;
        self.end_run();
        Ok(())
    }

    /// Writes the waiting short runs as one record batch, a block (and a run) each.
    fn flush_pack(&mut self) -> Result<()> {
        if self.pack.is_empty() {
            return Ok(());
        }
        let pack = std::mem::take(&mut self.pack);
        let rows = std::mem::take(&mut self.pack_rows);
        self.pack_limit = usize::MAX;
        self.pack_value_bytes = 0;
        // Runs that continue each other in shared rows (an epoch's runs are consecutive
        // ranges of one batch sorted by vnode) are written as one slice, not concatenated.
        let mut pieces: Vec<Run> = Vec::new();
        for (_, run) in &pack {
            push_joined(&mut pieces, run.clone());
        }
        let batch = match pieces.as_slice() {
            [one] => one.batch(),
            _ => {
                let batches: Vec<RecordBatch> = pieces.iter().map(Run::batch).collect();
                crate::dictionary::concat_batches(self.desc.schema(), &batches)?
            }
        };
        let mut deleted = BooleanBufferBuilder::new(rows);
        for piece in &pieces {
            piece.append_deleted(0, piece.len(), &mut deleted);
        }
        let deleted = BooleanArray::new(deleted.finish(), None);
        let (offset, len, crc) = self.write_batch(&batch, deleted)?;
        let first = u32::try_from(self.blocks.len())
            .map_err(|_| Error::Internal("more than 2^32 blocks in a run file".into()))?;
        let batch_rows = u32::try_from(batch.num_rows())
            .map_err(|_| Error::Internal("a block of more than 2^32 rows".into()))?;
        let mut start = 0u32;
        for (i, (vnode, part)) in pack.iter().enumerate() {
            let rows = u32::try_from(part.len())
                .map_err(|_| Error::Internal("a block of more than 2^32 rows".into()))?;
            self.blocks.push(BlockMeta {
                vnode: *vnode,
                rows,
                offset,
                len,
                crc,
                start,
                batch: first,
                batch_rows,
            });
            self.spans.push(RunSpan {
                vnode: *vnode,
                first: first + i as u32,
                count: 1,
                rows: u64::from(rows),
            });
            start += rows;
            // The runs' own keys: the same encoding as `desc.pk().encode` of their rows.
            self.last_keys
                .push(part.last_key().unwrap_or_default().to_vec());
        }
        Ok(())
    }

    fn write_block(
        &mut self,
        batch: &RecordBatch,
        last_key: &[u8],
        deleted: BooleanArray,
    ) -> Result<()> {
        let Some(span) = self.open_span.as_mut() else {
            return Err(Error::Internal("a run file block outside a run".into()));
        };
        let rows = u32::try_from(batch.num_rows())
            .map_err(|_| Error::Internal("a block of more than 2^32 rows".into()))?;
        span.count += 1;
        span.rows += u64::from(rows);
        let vnode = span.vnode;
        let (offset, len, crc) = self.write_batch(batch, deleted)?;
        let index = u32::try_from(self.blocks.len())
            .map_err(|_| Error::Internal("more than 2^32 blocks in a run file".into()))?;
        self.blocks.push(BlockMeta {
            vnode,
            rows,
            offset,
            len,
            crc,
            start: 0,
            batch: index,
            batch_rows: rows,
        });
        self.last_keys.push(last_key.to_vec());
        Ok(())
    }

    /// Writes one record batch of the file's schema; its offset, length and CRC.
    fn write_batch(
        &mut self,
        batch: &RecordBatch,
        deleted: BooleanArray,
    ) -> Result<(u64, u64, u32)> {
        let mut columns = to_stored(
            batch.columns(),
            &self.schema.fields()[..batch.num_columns()],
        )?;
        columns.push(Arc::new(deleted));
        // A slice of a view array (a column the file keeps as views) still points into all
        // of its data buffers, which the IPC writer would write out whole for every block:
        // keep only the bytes in use.
        let block = gc_views(RecordBatch::try_new(self.schema.clone(), columns)?)?;
        let offset = self.writer.get_ref().pos;
        self.writer.get_mut().take_crc();
        self.writer.write(&block)?;
        let crc = self.writer.get_mut().take_crc();
        let len = self.writer.get_ref().pos - offset;
        Ok((offset, len, crc))
    }

    /// Gives the file up: closes and removes it. (A file left behind by a crash is not named
    /// by the manifest and is removed the next time the store opens.)
    pub fn abandon(self) -> Result<()> {
        let (io, path) = (self.io.clone(), self.path.clone());
        drop(self);
        Ok(io.remove(&path)?)
    }

    /// Writes the index and footer, fsyncs, and returns the file (open for reads), its check
    /// values and its runs.
    pub fn finish(mut self) -> Result<(Arc<RunFile>, FileCheck, Vec<RunSpan>)> {
        self.end_run();
        self.flush_pack()?;
        let keys = self.key_columns()?;
        let index = index_batch(&self.blocks, &keys, self.desc.pk().decoded_schema())?;
        self.writer
            .write_metadata(INDEX_KEY, hex_encode(&ipc_stream(&index)?));
        self.writer
            .write_metadata(HEADER_CRC_KEY, self.header_crc.to_string());
        self.writer.get_mut().take_crc();
        let tail_start = self.writer.get_ref().pos;
        self.writer.finish()?;
        let tail_crc = self.writer.get_mut().take_crc();
        let size = self.writer.get_ref().pos;
        let sink = self.writer.into_inner()?;
        let mut file = sink
            .inner
            .into_inner()
            .map_err(|e| Error::Io(e.into_error()))?;
        file.sync()?;
        let check = FileCheck {
            size,
            tail_len: size - tail_start,
            tail_crc,
        };
        let encoded = if keys.is_empty() || self.blocks.is_empty() {
            BinaryArray::from_iter_values(std::iter::empty::<&[u8]>())
        } else {
            self.desc.pk().encode_key_columns(&keys)?
        };
        let file = RunFile {
            id: self.id,
            path: self.path,
            io: self.io,
            desc: self.desc,
            handle: std::sync::OnceLock::new(),
            check,
            blocks: self.blocks,
            last_keys: encoded,
            // Never `with_skip_validation`: `utf8_view` relies on the decoder's checks.
            decoder: FileDecoder::new(decode_schema(&self.schema), MetadataVersion::V5),
            obsolete: AtomicBool::new(false),
            cache: self.cache,
        };
        Ok((Arc::new(file), check, self.spans))
    }

    fn key_columns(&self) -> Result<Vec<ArrayRef>> {
        if self.last_keys.is_empty() {
            return Ok(self
                .desc
                .pk()
                .decoded_schema()
                .fields()
                .iter()
                .map(|f| arrow_array::new_empty_array(f.data_type()))
                .collect());
        }
        self.desc
            .pk()
            .decode(self.last_keys.iter().map(|k| k.as_slice()))
    }
}

/// The index as a batch (see the module docs).
fn index_batch(
    blocks: &[BlockMeta],
    keys: &[ArrayRef],
    key_schema: &Schema,
) -> Result<RecordBatch> {
    let mut fields = vec![
        Field::new("vnode", DataType::UInt16, false),
        Field::new("rows", DataType::UInt32, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("len", DataType::UInt64, false),
        Field::new("crc", DataType::UInt32, false),
        Field::new("start", DataType::UInt32, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt16Array::from_iter_values(
            blocks.iter().map(|b| b.vnode.get()),
        )),
        Arc::new(UInt32Array::from_iter_values(blocks.iter().map(|b| b.rows))),
        Arc::new(UInt64Array::from_iter_values(
            blocks.iter().map(|b| b.offset),
        )),
        Arc::new(UInt64Array::from_iter_values(blocks.iter().map(|b| b.len))),
        Arc::new(UInt32Array::from_iter_values(blocks.iter().map(|b| b.crc))),
        Arc::new(UInt32Array::from_iter_values(
            blocks.iter().map(|b| b.start),
        )),
    ];
    for (i, (field, column)) in key_schema.fields().iter().zip(keys).enumerate() {
        fields.push(Field::new(
            format!("key_{i}"),
            field.data_type().clone(),
            true,
        ));
        columns.push(column.clone());
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn ipc_stream(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// Lower-case hex.
pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The inverse of [`hex_encode`]; `None` on a malformed string.
pub(crate) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// A live run file, open for reads. When the last reference goes and the file was marked
/// obsolete (no manifest names it any more), it is removed from disk.
pub(crate) struct RunFile {
    id: u64,
    path: PathBuf,
    io: Arc<dyn StorageIo>,
    desc: Arc<TableDesc>,
    handle: std::sync::OnceLock<Box<dyn ReadFile>>,
    check: FileCheck,
    blocks: Vec<BlockMeta>,
    /// The last key of each block, encoded with the table's key converter.
    last_keys: BinaryArray,
    decoder: FileDecoder,
    obsolete: AtomicBool,
    cache: Option<Arc<BlockCache>>,
}

impl std::fmt::Debug for RunFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunFile")
            .field("path", &self.path)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl Drop for RunFile {
    fn drop(&mut self) {
        if self.obsolete.load(Ordering::SeqCst) {
            // Best effort: a file left behind is not named by the manifest and is removed
            // the next time the store opens.
            let _ = self.io.remove(&self.path);
        }
    }
}

fn corrupt(path: &Path, message: impl Into<String>) -> Error {
    Error::CorruptState {
        context: path.display().to_string(),
        message: message.into(),
    }
}

impl RunFile {
    /// Opens a file the manifest names, checking its size, tail and header.
    pub fn open(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
        check: FileCheck,
    ) -> Result<Self> {
        let handle = io.open(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                corrupt(&path, "the manifest names this file, which is missing")
            }
            _ => Error::Io(e),
        })?;
        if handle.len() != check.size {
            return Err(corrupt(
                &path,
                format!(
                    "size is {} bytes, the manifest says {} (truncated or overwritten)",
                    handle.len(),
                    check.size
                ),
            ));
        }
        let tail_len = usize::try_from(check.tail_len)
            .ok()
            .filter(|&l| l >= TRAILER_LEN && check.tail_len <= check.size)
            .ok_or_else(|| corrupt(&path, "the manifest gives an impossible tail length"))?;
        let mut tail = vec![0; tail_len];
        handle.read_at(check.size - check.tail_len, &mut tail)?;
        if crc32fast::hash(&tail) != check.tail_crc {
            return Err(corrupt(&path, "checksum mismatch in the file's footer"));
        }
        let mut trailer = [0u8; TRAILER_LEN];
        trailer.copy_from_slice(&tail[tail_len - TRAILER_LEN..]);
        let footer_len = arrow_ipc::reader::read_footer_length(trailer)
            .map_err(|e| corrupt(&path, format!("bad footer: {e}")))?;
        let footer_bytes = tail
            .get(
                tail_len - TRAILER_LEN - footer_len.min(tail_len - TRAILER_LEN)
                    ..tail_len - TRAILER_LEN,
            )
            .filter(|b| b.len() == footer_len)
            .ok_or_else(|| corrupt(&path, "footer length out of range"))?;
        let footer = arrow_ipc::root_as_footer(footer_bytes)
            .map_err(|e| corrupt(&path, format!("unreadable footer: {e}")))?;
        let schema = footer
            .schema()
            .map(arrow_ipc::convert::fb_to_schema)
            .ok_or_else(|| corrupt(&path, "footer without a schema"))?;
        let expected = [file_schema(desc.schema()), file_schema_v1(desc.schema())];
        let Some(stored) = expected.into_iter().find(|e| same_fields(&schema, e)) else {
            return Err(corrupt(
                &path,
                format!(
                    "schema {} is not the one of table `{}`",
                    crate::table::describe(&schema),
                    desc.name()
                ),
            ));
        };
        let mut index_hex = None;
        let mut header_crc = None;
        if let Some(metadata) = footer.custom_metadata() {
            for kv in metadata {
                match kv.key() {
                    Some(INDEX_KEY) => index_hex = kv.value(),
                    Some(HEADER_CRC_KEY) => {
                        header_crc = kv.value().and_then(|v| v.parse::<u32>().ok())
                    }
                    _ => {}
                }
            }
        }
        let index_bytes = index_hex
            .and_then(hex_decode)
            .ok_or_else(|| corrupt(&path, "missing or malformed block index"))?;
        let header_crc = header_crc.ok_or_else(|| corrupt(&path, "missing header checksum"))?;
        let index = StreamReader::try_new(io::Cursor::new(index_bytes), None)
            .and_then(|mut r| r.next().transpose())
            .map_err(|e| corrupt(&path, format!("unreadable block index: {e}")))?
            .ok_or_else(|| corrupt(&path, "empty block index"))?;
        let (blocks, keys) = parse_index(&index, &desc, check.size - check.tail_len)
            .map_err(|m| corrupt(&path, m))?;
        let header_end = blocks
            .first()
            .map_or(check.size - check.tail_len, |b| b.offset);
        let header_len = usize::try_from(header_end)
            .map_err(|_| corrupt(&path, "header length out of range"))?;
        let mut header = vec![0; header_len];
        handle.read_at(0, &mut header)?;
        if crc32fast::hash(&header) != header_crc {
            return Err(corrupt(&path, "checksum mismatch in the file's header"));
        }
        let last_keys = if blocks.is_empty() {
            BinaryArray::from_iter_values(std::iter::empty::<&[u8]>())
        } else {
            desc.pk().encode_key_columns(&keys)?
        };
        let handle_cell = std::sync::OnceLock::new();
        let _ = handle_cell.set(handle);
        Ok(Self {
            id,
            path,
            io,
            // Never `with_skip_validation`: `utf8_view` relies on the decoder's checks.
            decoder: FileDecoder::new(decode_schema(&stored), footer.version()),
            desc,
            handle: handle_cell,
            check,
            blocks,
            last_keys,
            obsolete: AtomicBool::new(false),
            cache: None,
        })
    }

    /// Caches the blocks this file decodes.
    pub fn with_cache(mut self, cache: Option<Arc<BlockCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// The file id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the manifest records to check the file.
    pub fn check(&self) -> FileCheck {
        self.check
    }

    /// The runs of the file, as written (consecutive blocks of one vnode).
    #[cfg(test)]
    pub fn spans(&self) -> Vec<RunSpan> {
        let mut spans: Vec<RunSpan> = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            match spans.last_mut() {
                Some(s) if s.vnode == b.vnode => {
                    s.count += 1;
                    s.rows += u64::from(b.rows);
                }
                _ => spans.push(RunSpan {
                    vnode: b.vnode,
                    first: i as u32,
                    count: 1,
                    rows: u64::from(b.rows),
                }),
            }
        }
        spans
    }

    /// Checks that a manifest's run lies in this file, on one vnode.
    pub fn check_span(&self, span: &RunSpan) -> Result<()> {
        let first = span.first as usize;
        let end = first + span.count as usize;
        let ok = span.count > 0
            && end <= self.blocks.len()
            && self.blocks[first..end]
                .iter()
                .all(|b| b.vnode == span.vnode)
            && self.blocks[first..end]
                .iter()
                .map(|b| u64::from(b.rows))
                .sum::<u64>()
                == span.rows;
        if ok {
            Ok(())
        } else {
            Err(corrupt(
                &self.path,
                format!(
                    "the manifest's run of vnode {} (blocks {first}..{end}, {} rows) does not match the file",
                    span.vnode, span.rows
                ),
            ))
        }
    }

    /// Marks the file for removal once nobody holds it.
    pub fn mark_obsolete(&self) {
        self.obsolete.store(true, Ordering::SeqCst);
    }

    /// Keeps the file when the last reference goes (a manifest names it).
    pub fn mark_live(&self) {
        self.obsolete.store(false, Ordering::SeqCst);
    }

    fn handle(&self) -> Result<&dyn ReadFile> {
        if let Some(h) = self.handle.get() {
            return Ok(h.as_ref());
        }
        let h = self.io.open(&self.path)?;
        let _ = self.handle.set(h);
        self.handle
            .get()
            .map(|h| h.as_ref())
            .ok_or_else(|| Error::Internal("run file handle vanished".into()))
    }

    /// Block `i`, from the cache or read, checked and decoded: the record batch holding it
    /// (cached as one, under its first block), sliced to the block's rows.
    pub fn load_block(&self, i: usize) -> Result<Arc<Run>> {
        let meta = *self
            .blocks
            .get(i)
            .ok_or_else(|| Error::Internal(format!("block {i} of {}", self.path.display())))?;
        let key = (self.id, meta.batch as usize);
        let cached = self.cache.as_ref().and_then(|cache| cache.get(key));
        let rows = match cached {
            Some(rows) => rows,
            None => {
                let (rows, made) = self.read_batch(meta.batch as usize)?;
                if let Some(cache) = &self.cache {
                    // The decoded columns share the batch's one buffer (counting each
                    // column's memory would count that buffer once per column), plus what
                    // making them the table's types allocated; the keys are their own.
                    let block = usize::try_from(meta.len).unwrap_or(usize::MAX);
                    let keys = rows.data.keys.values().len() + rows.data.keys.len() * 4;
                    cache.insert(key, rows.clone(), block.saturating_add(made + keys));
                }
                rows
            }
        };
        self.block_of(i, &rows, &meta).map(Arc::new)
    }

    /// Block `i` (described by `meta`): a range of the decoded rows of its batch.
    fn block_of(&self, i: usize, rows: &Arc<Rows>, meta: &BlockMeta) -> Result<Run> {
        Run::range(rows, meta.start as usize, meta.rows as usize)
            .map_err(|_| corrupt(&self.path, format!("block {i} lies outside its batch")))
    }

    /// Reads and checks block `i`.
    #[cfg(test)]
    pub fn read_block(&self, i: usize) -> Result<Run> {
        let meta = self
            .blocks
            .get(i)
            .ok_or_else(|| Error::Internal(format!("block {i} of {}", self.path.display())))?;
        let (rows, _) = self.read_batch(meta.batch as usize)?;
        self.block_of(i, &rows, meta)
    }

    /// Reads and checks the record batch of block `i`, the first block of its batch; with
    /// the bytes that making its columns the table's types allocated.
    fn read_batch(&self, i: usize) -> Result<(Arc<Rows>, usize)> {
        let meta = self
            .blocks
            .get(i)
            .ok_or_else(|| Error::Internal(format!("block {i} of {}", self.path.display())))?;
        let len = usize::try_from(meta.len).map_err(|_| corrupt(&self.path, "block too large"))?;
        let bytes = self.handle()?.read_vec_at(meta.offset, len)?;
        if crc32fast::hash(&bytes) != meta.crc {
            return Err(corrupt(
                &self.path,
                format!("checksum mismatch in block {i} (offset {})", meta.offset),
            ));
        }
        if len < 8 {
            return Err(corrupt(&self.path, format!("block {i} is too short")));
        }
        let meta_len = 8 + u64::from(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]));
        if meta_len > meta.len {
            return Err(corrupt(
                &self.path,
                format!("block {i} has a bad header length"),
            ));
        }
        let block = Block::new(
            meta.offset as i64,
            meta_len as i32,
            (meta.len - meta_len) as i64,
        );
        let batch = self
            .decoder
            .read_record_batch(&block, &Buffer::from_vec(bytes))
            .map_err(|e| corrupt(&self.path, format!("block {i}: {e}")))?
            .ok_or_else(|| corrupt(&self.path, format!("block {i} holds no record batch")))?;
        if batch.num_rows() != meta.batch_rows as usize {
            return Err(corrupt(&self.path, format!("block {i} row count mismatch")));
        }
        let n = batch.num_columns() - 1;
        let deleted = batch.column(n).as_boolean();
        let deleted = (deleted.true_count() > 0).then(|| deleted.values().clone());
        let stored = &batch.columns()[..n];
        let columns = from_stored(stored, self.desc.schema().fields())
            .map_err(|e| corrupt(&self.path, format!("block {i}: {e}")))?;
        let made = (stored.iter().zip(&columns))
            .filter(|(stored, column)| !Arc::ptr_eq(stored, column))
            .map(|(_, column)| made_bytes(column.as_ref()))
            .sum();
        let data = RecordBatch::try_new(self.desc.schema().clone(), columns)?;
        let keys = self.desc.pk().encode(&data)?;
        Ok((Rows::new(KeyedBatch { batch: data, keys }, deleted)?, made))
    }

    fn last_key(&self, i: usize) -> Option<&[u8]> {
        (i < self.last_keys.len() && self.blocks[i].rows > 0).then(|| self.last_keys.value(i))
    }
}

fn parse_index(
    index: &RecordBatch,
    desc: &TableDesc,
    data_end: u64,
) -> std::result::Result<(Vec<BlockMeta>, Vec<ArrayRef>), String> {
    let key_fields = desc.pk().key_schema().fields().len();
    // Files written before packed batches have no `start` column.
    let fixed = if index.num_columns() == 6 + key_fields {
        6
    } else if index.num_columns() == 5 + key_fields {
        5
    } else {
        return Err("block index has the wrong number of columns".into());
    };
    let col = |i: usize, t: DataType| -> std::result::Result<&ArrayRef, String> {
        let c = index.column(i);
        if c.data_type() == &t && c.null_count() == 0 {
            Ok(c)
        } else {
            Err(format!("block index column {i} is malformed"))
        }
    };
    let vnode = col(0, DataType::UInt16)?
        .as_primitive::<UInt16Type>()
        .clone();
    let rows = col(1, DataType::UInt32)?
        .as_primitive::<UInt32Type>()
        .clone();
    let offset = col(2, DataType::UInt64)?
        .as_primitive::<UInt64Type>()
        .clone();
    let len = col(3, DataType::UInt64)?
        .as_primitive::<UInt64Type>()
        .clone();
    let crc = col(4, DataType::UInt32)?
        .as_primitive::<UInt32Type>()
        .clone();
    let start = if fixed == 6 {
        Some(
            col(5, DataType::UInt32)?
                .as_primitive::<UInt32Type>()
                .clone(),
        )
    } else {
        None
    };
    let mut blocks: Vec<BlockMeta> = Vec::with_capacity(index.num_rows());
    let mut end = 0u64;
    for i in 0..index.num_rows() {
        let mut b = BlockMeta {
            vnode: VirtualNode::new(vnode.value(i)),
            rows: rows.value(i),
            offset: offset.value(i),
            len: len.value(i),
            crc: crc.value(i),
            start: start.as_ref().map_or(0, |s| s.value(i)),
            batch: i as u32,
            batch_rows: rows.value(i),
        };
        let out_of_range = || format!("block index entry {i} is out of range");
        if b.vnode.index() >= desc.vnode_count().get() {
            return Err(out_of_range());
        }
        match blocks.last().copied() {
            // The next block of a packed batch: the same batch, the rows after the last.
            Some(prev) if prev.offset == b.offset && b.start > 0 => {
                if prev.len != b.len
                    || prev.crc != b.crc
                    || prev.start.checked_add(prev.rows) != Some(b.start)
                {
                    return Err(out_of_range());
                }
                b.batch = prev.batch;
                b.batch_rows = b.start.checked_add(b.rows).ok_or_else(out_of_range)?;
                let first = prev.batch as usize;
                for block in &mut blocks[first..] {
                    block.batch_rows = b.batch_rows;
                }
            }
            _ => {
                if b.start != 0
                    || b.offset < end
                    || b.offset.checked_add(b.len).is_none_or(|e| e > data_end)
                {
                    return Err(out_of_range());
                }
            }
        }
        end = b.offset + b.len;
        blocks.push(b);
    }
    let mut keys = Vec::with_capacity(key_fields);
    for (i, field) in desc.pk().decoded_schema().fields().iter().enumerate() {
        let c = index.column(fixed + i);
        if c.data_type() != field.data_type() {
            return Err(format!("block index key column {i} has the wrong type"));
        }
        keys.push(c.clone());
    }
    Ok((blocks, keys))
}

/// A run of one vnode in a file, as a lazily loaded [`RunList`].
#[derive(Debug, Clone)]
pub(crate) struct DiskRun {
    /// The file.
    pub file: Arc<RunFile>,
    /// Where in it.
    pub span: RunSpan,
}

impl RunList for DiskRun {
    fn len(&self) -> usize {
        self.span.count as usize
    }

    fn last_key(&self, i: usize) -> Option<&[u8]> {
        self.file.last_key(self.span.first as usize + i)
    }

    fn load(&self, i: usize) -> Result<Arc<Run>> {
        self.file.load_block(self.span.first as usize + i)
    }
}

/// Disk runs of one vnode that follow each other in key order without overlapping (the
/// pieces of a bulk load), read as one [`RunList`]: a scan or a merge sees one source.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    runs: Vec<DiskRun>,
    /// `ends[i]`: the blocks of `runs[..=i]`.
    ends: Vec<usize>,
}

impl Chain {
    pub fn new(runs: Vec<DiskRun>) -> Self {
        let ends = runs
            .iter()
            .scan(0, |end, run| {
                *end += run.len();
                Some(*end)
            })
            .collect();
        Self { runs, ends }
    }

    /// The run holding block `i` and the block's place in it.
    fn locate(&self, i: usize) -> (&DiskRun, usize) {
        let run = self.ends.partition_point(|&end| end <= i);
        let start = run.checked_sub(1).map_or(0, |r| self.ends[r]);
        (&self.runs[run], i - start)
    }
}

impl RunList for Chain {
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn last_key(&self, i: usize) -> Option<&[u8]> {
        let (run, i) = self.locate(i);
        run.last_key(i)
    }

    fn load(&self, i: usize) -> Result<Arc<Run>> {
        let (run, i) = self.locate(i);
        run.load(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::StreamChunk;
    use crate::key::KeyColumn;
    use crate::store::io::RealIo;
    use crate::vnode::VnodeCount;
    use arrow_array::{Decimal128Array, Int64Array, StringArray};

    fn desc() -> Arc<TableDesc> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        Arc::new(
            TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(4).unwrap()),
        )
    }

    fn run(desc: &TableDesc, keys: std::ops::Range<i64>, deleted: bool) -> Run {
        let batch = RecordBatch::try_new(
            desc.schema().clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(keys.clone())),
                Arc::new(StringArray::from_iter_values(keys.map(|k| format!("v{k}")))),
            ],
        )
        .unwrap();
        let n = batch.num_rows();
        let keys = desc.pk().encode(&batch).unwrap();
        let deleted = deleted.then(|| arrow_buffer::BooleanBuffer::collect_bool(n, |i| i % 3 == 0));
        Run::new(KeyedBatch { batch, keys }, deleted).unwrap()
    }

    fn write_file(dir: &Path) -> (Arc<RunFile>, FileCheck, Vec<RunSpan>) {
        let desc = desc();
        let mut w =
            RunFileWriter::create(RealIo::shared(), dir.join("f.arrow"), 7, desc.clone()).unwrap();
        w.write_run(VirtualNode::new(1), &run(&desc, 0..20_000, false))
            .unwrap();
        w.write_run(VirtualNode::new(3), &run(&desc, 5..10, true))
            .unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn a_written_file_reopens_with_the_same_runs_and_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (file, check, spans) = write_file(dir.path());
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].rows, 20_000);
        assert!(
            spans[0].count >= 3,
            "cut into blocks of about {BLOCK_BYTES} bytes"
        );
        assert_eq!(
            (spans[1].vnode, spans[1].first, spans[1].rows),
            (VirtualNode::new(3), spans[0].count, 5)
        );
        let reopened = RunFile::open(
            RealIo::shared(),
            dir.path().join("f.arrow"),
            7,
            desc(),
            check,
        )
        .unwrap();
        assert_eq!(reopened.spans(), spans);
        assert_eq!(reopened.last_keys, file.last_keys);
        let last = DiskRun {
            file: Arc::new(reopened),
            span: spans[1],
        }
        .load(0)
        .unwrap();
        assert_eq!(last.len(), 5);
        let deleted: Vec<bool> = last.deleted().unwrap().iter().collect();
        assert_eq!(deleted, [true, false, false, true, false]);
        // pyarrow-compatible: the standard reader reads it too.
        let reader = arrow_ipc::reader::FileReader::try_new(
            std::fs::File::open(dir.path().join("f.arrow")).unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 20_005);
        let _ = StreamChunk::inserts; // keep the import used in every configuration
    }

    #[test]
    fn every_flipped_byte_and_truncation_is_detected_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (_, check, _) = write_file(dir.path());
        let path = dir.path().join("f.arrow");
        let original = std::fs::read(&path).unwrap();
        let step = (original.len() / 97).max(1);
        for at in (0..original.len()).step_by(step) {
            let mut bytes = original.clone();
            bytes[at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let result = RunFile::open(RealIo::shared(), path.clone(), 7, desc(), check)
                .and_then(|f| (0..f.blocks.len()).try_for_each(|i| f.read_block(i).map(|_| ())));
            let err = result.expect_err(&format!("flipped byte {at} not detected"));
            assert!(err.to_string().contains("f.arrow"), "{err}");
        }
        std::fs::write(&path, &original[..original.len() - 3]).unwrap();
        let err = RunFile::open(RealIo::shared(), path.clone(), 7, desc(), check).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    /// A one-vnode table of `schema`, keyed by its column `k`.
    fn one_vnode_keyed_by_k(schema: &SchemaRef) -> Arc<TableDesc> {
        Arc::new(
            TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(1).unwrap()),
        )
    }

    /// `batch` with its encoded keys.
    fn keyed(desc: &TableDesc, batch: &RecordBatch) -> KeyedBatch {
        let keys = desc.pk().encode(batch).unwrap();
        KeyedBatch {
            batch: batch.clone(),
            keys,
        }
    }

    /// `batch` written as one run of vnode 0 and read back, block by block, as one batch; in
    /// both formats, which must read back alike.
    fn round_trip(desc: &Arc<TableDesc>, batch: &RecordBatch) -> RecordBatch {
        let read = round_trip_as(desc, batch, RunFileWriter::create);
        let read_v1 = round_trip_as(desc, batch, RunFileWriter::create_v1);
        assert_eq!(read, read_v1, "format 1 reads back alike");
        read
    }

    type Create = fn(Arc<dyn StorageIo>, PathBuf, u64, Arc<TableDesc>) -> Result<RunFileWriter>;

    /// `batch` written by `create` as one run of vnode 0, reopened as the manifest would,
    /// and read back, block by block, as one batch.
    fn round_trip_as(desc: &Arc<TableDesc>, batch: &RecordBatch, create: Create) -> RecordBatch {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.arrow");
        let mut w = create(RealIo::shared(), path.clone(), 1, desc.clone()).unwrap();
        w.begin_run(VirtualNode::ZERO).unwrap();
        w.write(&keyed(desc, batch), None).unwrap();
        let (_, check, _) = w.finish().unwrap();
        let file = RunFile::open(RealIo::shared(), path, 1, desc.clone(), check).unwrap();
        let read: Vec<RecordBatch> = (0..file.blocks.len())
            .map(|i| file.read_block(i).unwrap().batch())
            .collect();
        arrow_select::concat::concat_batches(desc.schema(), &read).unwrap()
    }

    /// A table of every type a run file stores narrower than the table holds it, and rows
    /// of it: inline and out-of-line strings and binaries, nulls, short and long decimals
    /// (negative too), a dictionary of string views.
    fn narrowed_columns(n: i64) -> (Arc<TableDesc>, RecordBatch) {
        let dictionary =
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View));
        // Decimals in a dictionary are stored as the dictionary's values are: not narrowed.
        let tiers = DataType::Dictionary(
            Box::new(DataType::Int8),
            Box::new(DataType::Decimal128(10, 2)),
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
            Field::new("b", DataType::BinaryView, true),
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("wide", DataType::Decimal128(30, 2), true),
            Field::new("mode", dictionary.clone(), true),
            Field::new("tier", tiers.clone(), true),
        ]));
        let text = |k: i64| match k % 3 {
            0 => None,
            1 => Some(format!("s{k}")),
            _ => Some(format!("grüße, out of line {k}")),
        };
        let decimal = |k: i64| (k % 7 != 0).then_some(i128::from(k) * 99_999_999 - 10i128.pow(14));
        let modes = arrow_array::StringViewArray::from_iter((0..n).map(|k| match k % 4 {
            0 => None,
            1 => Some("AIR"),
            _ => Some("a mode long enough to be out of line"),
        }));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(arrow_array::StringViewArray::from_iter((0..n).map(text))),
                Arc::new(arrow_array::BinaryViewArray::from_iter(
                    (0..n).map(|k| text(k).map(String::into_bytes)),
                )),
                Arc::new(
                    Decimal128Array::from_iter((0..n).map(decimal))
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                Arc::new(
                    Decimal128Array::from_iter(
                        (0..n).map(|k| decimal(k).map(|d| d * 10i128.pow(12))),
                    )
                    .with_precision_and_scale(30, 2)
                    .unwrap(),
                ),
                arrow_cast::cast(&modes, &dictionary).unwrap(),
                arrow_cast::cast(
                    &Decimal128Array::from_iter(
                        (0..n).map(|k| (k % 9 != 0).then_some(i128::from(k % 3))),
                    )
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
                    &tiers,
                )
                .unwrap(),
            ],
        )
        .unwrap();
        (one_vnode_keyed_by_k(&schema), batch)
    }

    #[test]
    fn strings_are_stored_as_offsets_and_short_decimals_in_64_bits() {
        let (desc, batch) = narrowed_columns(5000);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.arrow");
        let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 1, desc.clone()).unwrap();
        w.begin_run(VirtualNode::ZERO).unwrap();
        w.write(&keyed(&desc, &batch), None).unwrap();
        w.finish().unwrap();
        // What a standard reader (pyarrow's too) sees.
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None)
                .unwrap();
        let types: Vec<DataType> = (reader.schema().fields().iter())
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(
            types,
            [
                DataType::Int64,
                DataType::Utf8,
                DataType::Binary,
                DataType::Decimal64(15, 2),
                DataType::Decimal128(30, 2),
                DataType::Utf8,
                DataType::Decimal128(10, 2),
                DataType::Boolean,
            ]
        );
        assert_eq!(round_trip(&desc, &batch), batch);
    }

    #[test]
    fn long_values_are_cut_into_blocks_their_offsets_can_hold() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, false),
        ]));
        let desc = one_vnode_keyed_by_k(&schema);
        let rows = |keys: std::ops::Range<i64>| {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(keys.clone())),
                    Arc::new(arrow_array::StringViewArray::from_iter_values(
                        keys.map(|k| format!("{k:>1000}")),
                    )),
                ],
            )
            .unwrap();
            let keys = desc.pk().encode(&batch).unwrap();
            Run::new(KeyedBatch { batch, keys }, None).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunFileWriter::create(
            RealIo::shared(),
            dir.path().join("l.arrow"),
            1,
            desc.clone(),
        )
        .unwrap();
        // A block may hold 10 000 bytes of values here: 10 rows.
        w.value_bytes_limit = 10_000;
        w.write_run(VirtualNode::ZERO, &rows(0..200)).unwrap();
        // Short runs share a packed batch only up to the limit too.
        for first in (200..400).step_by(5) {
            w.write_run(VirtualNode::new(0), &rows(first..first + 5))
                .unwrap();
        }
        let (file, _, spans) = w.finish().unwrap();
        let mut keys = Vec::new();
        for span in &spans {
            keys.extend(read_span(&file, span).0);
        }
        assert_eq!(keys, (0..400).collect::<Vec<_>>());
        for block in &file.blocks {
            assert!(
                block.batch_rows <= 10,
                "{} rows of 1000 bytes",
                block.batch_rows
            );
        }
    }

    #[test]
    fn slices_of_view_columns_write_only_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, false),
        ]));
        let desc = one_vnode_keyed_by_k(&schema);
        let n = 50_000i64;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(arrow_array::StringViewArray::from_iter_values((0..n).map(
                    |k| format!("a string long enough to be out of line {k:>10}"),
                ))),
            ],
        )
        .unwrap();
        let mut w = RunFileWriter::create(
            RealIo::shared(),
            dir.path().join("v.arrow"),
            1,
            desc.clone(),
        )
        .unwrap();
        w.begin_run(VirtualNode::ZERO).unwrap();
        w.write(&keyed(&desc, &batch), None).unwrap();
        let (_, check, _) = w.finish().unwrap();
        let raw = n as u64 * (8 + 16 + 50);
        assert!(
            check.size < raw * 2,
            "{} bytes on disk for {raw} bytes of rows: every block wrote all string data",
            check.size
        );
    }

    #[test]
    fn string_views_read_back_equal_ascii_or_not() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, true),
        ]));
        let desc = one_vnode_keyed_by_k(&schema);
        fn ascii(k: i64) -> Option<String> {
            match k % 4 {
                0 => None,
                1 => Some(format!("s{k}")),
                _ => Some(format!("an ascii string out of line {k}")),
            }
        }
        type Text = fn(i64) -> Option<String>;
        let texts: [(&str, Text); 3] = [
            ("ascii", ascii),
            // Non-ASCII out of line, in one row of a thousand.
            ("one long", |k| match k % 1000 {
                7 => Some(format!("grüße aus köln, zeile {k}")),
                _ => ascii(k),
            }),
            // Non-ASCII inline only: every data buffer is ASCII.
            ("one inline", |k| match k % 1000 {
                7 => Some("é".to_string()),
                _ => ascii(k),
            }),
        ];
        for (name, text) in texts {
            let n = 5000i64;
            let values = arrow_array::StringViewArray::from_iter((0..n).map(text));
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..n)),
                    Arc::new(values),
                ],
            )
            .unwrap();
            assert_eq!(round_trip(&desc, &batch), batch, "{name}");
        }
    }

    #[test]
    fn dictionary_string_columns_read_back_equal() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new(
                "v",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View)),
                true,
            ),
        ]));
        let desc = one_vnode_keyed_by_k(&schema);
        let n = 3000i64;
        let values = arrow_array::StringViewArray::from_iter((0..n).map(|k| match k % 5 {
            0 => None,
            1 => Some("é"),
            2 => Some("a mode out of line, and ascii"),
            _ => Some("grüße aus köln, out of line"),
        }));
        let values = arrow_cast::cast(&values, schema.field(1).data_type()).unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..n)), values],
        )
        .unwrap();
        let read = round_trip(&desc, &batch);
        let text = |b: &RecordBatch| {
            let v = arrow_cast::cast(b.column(1), &DataType::Utf8).unwrap();
            v.as_string::<i32>()
                .iter()
                .map(|s| s.map(str::to_string))
                .collect::<Vec<_>>()
        };
        assert_eq!(text(&read), text(&batch));
    }

    /// Short runs share record batches; each still reads back as its own rows (with its
    /// last key in the index), and runs keep their order around a long run.
    #[test]
    fn short_runs_share_packed_batches() {
        let dir = tempfile::tempdir().unwrap();
        let desc = Arc::new(
            TableDesc::new(
                "t",
                Arc::new(Schema::new(vec![
                    Field::new("k", DataType::Int64, false),
                    Field::new("v", DataType::Utf8, true),
                ])),
                vec![KeyColumn::asc("k")],
            )
            .unwrap()
            .with_vnode_count(VnodeCount::new(1024).unwrap()),
        );
        let path = dir.path().join("p.arrow");
        let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 3, desc.clone()).unwrap();
        let mut want = Vec::new();
        for v in 0..1000u16 {
            let keys = if v == 500 {
                0..5000 // a long run in the middle
            } else {
                i64::from(v) * 10..i64::from(v) * 10 + 1 + i64::from(v % 3)
            };
            let r = run(&desc, keys.clone(), v % 2 == 0);
            w.write_run(VirtualNode::new(v), &r).unwrap();
            want.push((v, keys.collect::<Vec<_>>()));
        }
        let (_, check, spans) = w.finish().unwrap();
        assert_eq!(spans.len(), 1000);
        let file = Arc::new(RunFile::open(RealIo::shared(), path.clone(), 3, desc, check).unwrap());
        for (span, (v, keys)) in spans.iter().zip(&want) {
            assert_eq!(span.vnode, VirtualNode::new(*v));
            file.check_span(span).unwrap();
            let (got, _) = read_span(&file, span);
            assert_eq!(&got, keys, "vnode {v}");
        }
        let batches =
            arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None)
                .unwrap()
                .count();
        assert!(
            batches < 100,
            "{batches} record batches for 999 short runs and one long"
        );
    }

    /// The keys (an `Int64` first column) and tombstone flags of a run of `file`, read block
    /// by block; each block's last key checked against the index.
    fn read_span(file: &Arc<RunFile>, span: &RunSpan) -> (Vec<i64>, Vec<bool>) {
        let run = DiskRun {
            file: file.clone(),
            span: *span,
        };
        let (mut keys, mut dead) = (Vec::new(), Vec::new());
        for i in 0..run.len() {
            let block = run.load(i).unwrap();
            let batch = block.batch();
            let k = batch
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            keys.extend(k.values().iter().copied());
            dead.extend((0..block.len()).map(|r| block.is_deleted(r)));
            assert!(block.last_key().is_some());
            assert_eq!(run.last_key(i), block.last_key());
        }
        (keys, dead)
    }

    /// An epoch's runs are consecutive ranges of one batch sorted by vnode: packed, they are
    /// written as slices of it (with their tombstones), and a run of other rows in between
    /// (or a long one) still lands where it belongs.
    #[test]
    fn ranges_of_shared_rows_pack_with_their_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let desc = Arc::new(
            TableDesc::new("t", desc().schema().clone(), vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(1024).unwrap()),
        );
        let keys_of = |v: u16| -> Vec<i64> {
            let v = i64::from(v);
            if v == 200 {
                (v * 100..v * 100 + 3000).collect() // long: blocks of its own
            } else {
                (v * 100..v * 100 + 1 + v % 3).collect()
            }
        };
        let vnodes: Vec<u16> = (0..300).collect();
        let all: Vec<i64> = vnodes.iter().flat_map(|&v| keys_of(v)).collect();
        let batch = RecordBatch::try_new(
            desc.schema().clone(),
            vec![
                Arc::new(Int64Array::from(all.clone())),
                Arc::new(StringArray::from_iter_values(
                    all.iter().map(|k| format!("v{k}")),
                )),
            ],
        )
        .unwrap();
        let keys = desc.pk().encode(&batch).unwrap();
        let dead: Vec<bool> = (0..all.len()).map(|i| i % 7 == 3).collect();
        let rows = Rows::new(
            KeyedBatch { batch, keys },
            Some(arrow_buffer::BooleanBuffer::from(dead.clone())),
        )
        .unwrap();
        let path = dir.path().join("r.arrow");
        let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 4, desc.clone()).unwrap();
        let mut want: Vec<(u16, Vec<i64>, Vec<bool>)> = Vec::new();
        let mut at = 0;
        for &v in &vnodes {
            let n = keys_of(v).len();
            if v == 150 {
                // Other rows between two ranges of the shared ones.
                let other = run(&desc, 15_000..15_002, true);
                w.write_run(VirtualNode::new(v), &other).unwrap();
                want.push((v, vec![15_000, 15_001], vec![true, false]));
            } else {
                w.write_run(VirtualNode::new(v), &Run::range(&rows, at, n).unwrap())
                    .unwrap();
                want.push((v, all[at..at + n].to_vec(), dead[at..at + n].to_vec()));
            }
            at += n;
        }
        let (_, check, spans) = w.finish().unwrap();
        assert_eq!(spans.len(), vnodes.len());
        let file = Arc::new(RunFile::open(RealIo::shared(), path.clone(), 4, desc, check).unwrap());
        for (span, (v, keys, dead)) in spans.iter().zip(&want) {
            assert_eq!(span.vnode, VirtualNode::new(*v));
            file.check_span(span).unwrap();
            let (got, got_dead) = read_span(&file, span);
            assert_eq!(&got, keys, "vnode {v}");
            assert_eq!(&got_dead, dead, "vnode {v}");
        }
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("zz").is_none());
    }
}
