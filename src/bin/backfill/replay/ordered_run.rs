//! A run of the external sort written as its rows come, in key order, in segments a
//! checkpoint can name.
//!
//! The validation's snapshot rows that the changelog may touch arrive in key order while the
//! snapshot does (`by_key.rs`, "A snapshot in key order"): they need no sort, only writing.
//! [`OrderedRun`] writes them as one run of the sort, split into segment files: at a
//! checkpoint ([`OrderedRun::close_segment`]) the open segment is finished, and its name,
//! size and CRC-32 go into the checkpoint's record. A run that resumes after a kill
//! ([`OrderedRun::resume`]) checks every recorded segment (a missing, shorter, longer or
//! changed file refuses the resume: the caller validates from the start) and writes the
//! next ones; the sort reads the segments in order as one run ([`Run::segments`]) and never
//! deletes them: they belong to the checkpoint until the validation's outcome is committed.
//!
//! Segments are not fsynced: a process killed leaves what it wrote in the page cache, and
//! a machine that lost power may lose some, which the resume's check then finds (and the
//! validation starts over). Only the speed of a resume depends on them, never its result.
//!
//! ```text
//!   push ─> pending (≤ batch_rows) ─> PREFIX-000000.arrow  (closed: in checkpoint 1)
//!                                  ─> PREFIX-000001.arrow  (closed: in checkpoint 2)
//!                                  ─> PREFIX-000002.arrow  (open: not in any checkpoint)
//! ```

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

use super::extsort::Run;
use crate::error::{Error, Result};

/// Rows per batch written (the batches a merge reads back).
const BATCH_ROWS: usize = 8192;

/// A closed segment, as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Segment {
    /// The file's name in the run's directory.
    pub name: String,
    pub bytes: u64,
    /// CRC-32 of the file's bytes.
    pub crc: u32,
}

/// See the module docs.
pub(crate) struct OrderedRun {
    dir: PathBuf,
    prefix: String,
    schema: SchemaRef,
    /// Closed segments, in order.
    closed: Vec<Segment>,
    open: Option<SegmentWriter>,
    /// Rows pushed and not yet written, fewer than [`BATCH_ROWS`].
    pending: Vec<RecordBatch>,
    pending_rows: usize,
}

impl std::fmt::Debug for OrderedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderedRun")
            .field("dir", &self.dir)
            .field("prefix", &self.prefix)
            .field("closed", &self.closed.len())
            .finish_non_exhaustive()
    }
}

impl OrderedRun {
    /// A new run of `schema` rows in `dir` (which must exist), its segments named
    /// `{prefix}-NNNNNN.arrow`.
    pub fn create(dir: &Path, prefix: &str, schema: SchemaRef) -> Self {
        Self {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            schema,
            closed: Vec::new(),
            open: None,
            pending: Vec::new(),
            pending_rows: 0,
        }
    }

    /// The run a checkpoint recorded (`segments`), to write on after them; `None` if a
    /// segment is not as recorded (missing, another size, another CRC).
    pub fn resume(
        dir: &Path,
        prefix: &str,
        schema: SchemaRef,
        segments: Vec<Segment>,
    ) -> Result<Option<Self>> {
        for (i, segment) in segments.iter().enumerate() {
            if segment.name != segment_name(prefix, i)
                || !matches(&dir.join(&segment.name), segment)?
            {
                return Ok(None);
            }
        }
        Ok(Some(Self {
            closed: segments,
            ..Self::create(dir, prefix, schema)
        }))
    }

    /// Appends rows, which must follow the run's rows so far in key order.
    pub fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.pending_rows += batch.num_rows();
        self.pending.push(batch);
        if self.pending_rows >= BATCH_ROWS {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = match self.pending.as_slice() {
            [one] => one.clone(),
            many => crate::dictionary::concat_batches(&self.schema, many)?,
        };
        self.pending.clear();
        self.pending_rows = 0;
        if self.open.is_none() {
            let path = self.dir.join(segment_name(&self.prefix, self.closed.len()));
            self.open = Some(SegmentWriter::create(path, &self.schema)?);
        }
        match &mut self.open {
            Some(writer) => writer.write(&batch),
            None => Ok(()),
        }
    }

    /// Finishes the open segment (with what is pending): the segments so far, for a
    /// checkpoint. Nothing pushed since the last call: no new segment.
    pub fn close_segment(&mut self) -> Result<&[Segment]> {
        self.write_pending()?;
        if let Some(writer) = self.open.take() {
            self.closed.push(writer.finish()?);
        }
        Ok(&self.closed)
    }

    /// The run for the sort: every segment, in order, the last one closed, or `None` if no
    /// row was pushed. The sort reads them and leaves them in place.
    pub fn into_run(mut self) -> Result<Option<Run>> {
        self.write_pending()?;
        if let Some(writer) = self.open.take() {
            self.closed.push(writer.finish()?);
        }
        if self.closed.is_empty() {
            return Ok(None);
        }
        let paths = self.closed.iter().map(|s| self.dir.join(&s.name)).collect();
        Ok(Some(Run::segments(paths, BATCH_ROWS)))
    }
}

/// The name of segment `i` of a run named `prefix`.
fn segment_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:06}.arrow")
}

/// Whether the file at `path` is `segment` (size and CRC-32).
fn matches(path: &Path, segment: &Segment) -> Result<bool> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::scratch(path, e)),
    };
    let len = file.metadata().map_err(|e| Error::scratch(path, e))?.len();
    if len != segment.bytes {
        return Ok(false);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::scratch(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize() == segment.crc)
}

/// A writer that counts and checksums what passes through it.
struct Checksummed<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A segment being written.
struct SegmentWriter {
    path: PathBuf,
    writer: StreamWriter<Checksummed<BufWriter<File>>>,
}

impl SegmentWriter {
    fn create(path: PathBuf, schema: &SchemaRef) -> Result<Self> {
        let file = File::create(&path).map_err(|e| Error::scratch(&path, e))?;
        let sink = Checksummed {
            inner: BufWriter::new(file),
            hasher: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let writer = StreamWriter::try_new(sink, schema).map_err(|e| Error::scratch(&path, e))?;
        Ok(Self { path, writer })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = crate::store::gc_views(batch.clone())?;
        self.writer
            .write(&batch)
            .map_err(|e| Error::scratch(&self.path, e))
    }

    /// Finishes the stream and flushes it: its record.
    fn finish(mut self) -> Result<Segment> {
        let path = self.path;
        self.writer.finish().map_err(|e| Error::scratch(&path, e))?;
        let sink = self
            .writer
            .into_inner()
            .map_err(|e| Error::scratch(&path, e))?;
        sink.inner
            .into_inner()
            .map_err(|e| Error::scratch(&path, e.into_error()))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let segment = Segment {
            name,
            bytes: sink.bytes,
            crc: sink.hasher.finalize(),
        };
        Ok(segment)
    }
}
