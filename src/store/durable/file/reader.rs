//! Reading a run file: [`RunFile`] opens a file the manifest names (its size, tail and
//! header checked against the manifest's values) and loads its blocks, each checked against
//! its CRC, decoded to the table's types and key-encoded, through the block cache;
//! [`DiskRun`] and [`Chain`] read a run (or a chain of runs) of it as a [`RunList`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::{Array, BinaryArray, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::Block;
use arrow_ipc::reader::{FileDecoder, StreamReader};

use super::index::{BlockMeta, hex_decode, parse_index};
use super::{FileCheck, HEADER_CRC_KEY, INDEX_KEY, RunSpan, file_schema, file_schema_v1};
use crate::error::{Error, Result};
use crate::runs::{Rows, Run, RunList};
use crate::store::KeyedBatch;
use crate::store::durable::cache::BlockCache;
use crate::store::durable::stored::{decode_schema, from_stored, made_bytes};
use crate::store::io::{ReadFile, StorageIo};
use crate::table::{TableDesc, same_fields};

/// Arrow IPC file magic and footer length: the last 10 bytes.
const TRAILER_LEN: usize = 10;

/// A live run file, open for reads. When the last reference goes and the file was marked
/// obsolete (no manifest names it any more), it is removed from disk.
pub(crate) struct RunFile {
    pub(super) id: u64,
    pub(super) path: PathBuf,
    pub(super) io: Arc<dyn StorageIo>,
    pub(super) desc: Arc<TableDesc>,
    pub(super) handle: std::sync::OnceLock<Box<dyn ReadFile>>,
    pub(super) check: FileCheck,
    pub(super) blocks: Vec<BlockMeta>,
    /// The last key of each block, encoded with the table's key converter.
    pub(super) last_keys: BinaryArray,
    pub(super) decoder: FileDecoder,
    pub(super) obsolete: AtomicBool,
    pub(super) cache: Option<Arc<BlockCache>>,
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
