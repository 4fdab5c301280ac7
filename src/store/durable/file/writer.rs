//! Writing a run file: rows cut into blocks of about [`BLOCK_BYTES`], runs shorter than
//! [`MIN_BLOCK_ROWS`] packed into shared record batches, every byte counted into the CRCs
//! the index and the manifest record; then the index and footer, and an fsync.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arrow_array::{Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch};
use arrow_buffer::BooleanBufferBuilder;
use arrow_ipc::MetadataVersion;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::writer::{FileWriter, IpcWriteOptions};

use crate::store::durable::StateCompression;
use arrow_schema::SchemaRef;

#[cfg(test)]
use super::file_schema_v1;
use super::index::{BlockMeta, hex_encode, index_batch, ipc_stream};
use super::reader::RunFile;
use super::{
    BLOCK_BYTES, FileCheck, HEADER_CRC_KEY, INDEX_KEY, MIN_BLOCK_ROWS, RunSpan, file_schema,
};
use crate::error::{Error, Result};
use crate::runs::{Run, SEGMENT_ROWS, gc_views, push_joined};
use crate::store::KeyedBatch;
use crate::store::durable::cache::BlockCache;
#[cfg(doc)]
use crate::store::durable::stored::stored_type_v1;
use crate::store::durable::stored::{
    MAX_BLOCK_VALUE_BYTES, decode_schema, stored_value_bytes, to_stored,
};
use crate::store::io::{StorageIo, WriteFile};
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

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
    pub(super) value_bytes_limit: usize,
}

impl RunFileWriter {
    /// Creates the file `path` (id `id`) for rows of `desc`, uncompressed.
    #[cfg(test)]
    pub fn create(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
    ) -> Result<Self> {
        Self::create_compressed(io, path, id, desc, StateCompression::None)
    }

    /// [`Self::create`] with its blocks' bodies compressed as `compression` says.
    pub fn create_compressed(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
        compression: StateCompression,
    ) -> Result<Self> {
        let schema = file_schema(desc.schema());
        Self::create_as(io, path, id, desc, schema, compression)
    }

    /// A writer of format 1 ([`stored_type_v1`]), to test that such files are still read.
    #[cfg(test)]
    pub(super) fn create_v1(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
    ) -> Result<Self> {
        let schema = file_schema_v1(desc.schema());
        Self::create_as(io, path, id, desc, schema, StateCompression::None)
    }

    fn create_as(
        io: Arc<dyn StorageIo>,
        path: PathBuf,
        id: u64,
        desc: Arc<TableDesc>,
        schema: SchemaRef,
        compression: StateCompression,
    ) -> Result<Self> {
        let file = io.create(&path)?;
        let sink = Checksummed {
            inner: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            crc: crc32fast::Hasher::new(),
        };
        let options = IpcWriteOptions::default().try_with_compression(compression.ipc())?;
        let mut writer = FileWriter::try_new_with_options(sink, &schema, options)?;
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
