//! The Parquet changelog sink, exactly once by two-phase commit with the store as
//! coordinator.
//!
//! The downstream changes of each checkpoint go to one file,
//! `changes/epoch-<checkpoint epoch, 20 digits>.parquet` (columns `_epoch`, `_op`, then the
//! table's). A checkpoint is written in two phases around the store's commit:
//!
//! ```text
//!   prepare(e): write epoch-e.parquet.tmp, fsync      (nothing visible yet)
//!   store.commit(e)                                    (progress and data durable)
//!   publish(e): rename .tmp -> .parquet, fsync dir     (the output of e is visible)
//! ```
//!
//! Recovery ([`ParquetSink::open`] with the store's committed epoch `c`): a `.tmp` of an
//! epoch at or below `c` was committed and is rolled forward (renamed); a `.tmp` or a file of
//! an epoch above `c` was never committed and is removed. So after a crash at any moment the
//! published files are exactly the output of the committed checkpoints.
//!
//! Cleanup touches only the names this sink writes (`epoch-<20 digits>.parquet` and
//! `.parquet.tmp`; a shard's sink, `ParquetSink::open_part`, only its own
//! `epoch-<20 digits>.shard-I-of-N.parquet` and `.tmp`), checks first that it can remove all of them, and removes the newest
//! first: a crash during it leaves a prefix of the old output, never a set with gaps.
//! Checkpoints without changes write no file. All file operations go through the store's
//! [`StorageIo`] seam, so fault-injection tests reach them too.
//!
//! Encoding (the changelog layout, Parquet, zstd) runs on the sink's own thread as chunks
//! arrive, straight into the file: the encoder creates a `.tmp` named after the epoch of the
//! file's first chunk and appends each row group as it closes, so memory holds one row
//! group, not the file (a checkpoint that takes most of the snapshot is tens of MB).
//! [`ParquetSink::start_prepare`] closes the epoch's file at its place in the queue and
//! returns at once: the chunks pushed after it go to the next file while
//! [`Preparing::wait`] (on whichever thread commits) waits for the footer, fsyncs the file
//! and, when the checkpoint's epoch is a later one than its first chunk's, renames it to the
//! checkpoint's `.tmp` and fsyncs the directory. The backfill never waits on zstd, only on a
//! full queue of chunks (so a slow encoder slows the backfill instead of growing a queue),
//! and the encoder never waits on an fsync.
//!
//! A file being written is always named after an epoch above the last prepared checkpoint
//! (its first chunk's), so recovery removes it as uncommitted, like any `.tmp` the store did
//! not commit. A file whose encoding fails, or that the job leaves unfinished, is removed by
//! the encoder.
//!
//! Statistics: every column of a file keeps min/max statistics (per column chunk and page)
//! except the string and binary columns outside the primary key (named with
//! [`ParquetSink::with_key_statistics`]). A file is ordered by epoch, then key or vnode and
//! key: statistics of the key, `_epoch`, numbers and dates let a reader skip row groups and
//! pages, those of free text, flags and modes hardly ever do (every page holds a spread of
//! them), and they cost the most to compute (a byte-wise compare a value). Encodings,
//! dictionaries and compression are chosen per column from a sample of the first rows
//! (`job::encoding`).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use arrow_schema::SchemaRef;
use parquet::file::properties::WriterProperties;

use crate::chunk::{StreamChunk, changelog_schema};
use crate::error::EngineError;
use crate::error::{Error, Result, internal};
use crate::job::certificate::TableDigest;
use crate::job::column_writer::ColumnParallelWriter;
use crate::job::encoding::EncodingChoice;
use crate::job::output::{OutputName, parse_output_name, part_file_name, part_tmp_name};
use crate::job::shard::Shard;
use crate::job::{ExactlyOnceSink, PreparedCheckpoint, Recovery as JobRecovery};

/// The engine's `Result`, which the library's sink interface returns.
type EngineResult<T> = std::result::Result<T, EngineError>;
use crate::store::io::{StorageIo, WriteFile, named};
use crate::table::TableDesc;

/// A checkpoint file the encoder is finishing ([`ParquetSink::start_prepare`]).
#[derive(Debug)]
#[must_use = "a file being prepared is waited for, then published after the store commits"]
pub struct Preparing {
    io: Arc<dyn StorageIo>,
    dir: PathBuf,
    tmp: PathBuf,
    path: PathBuf,
    answer: Receiver<Result<Finished>>,
}

impl Preparing {
    /// Waits until the file is encoded, then fsyncs it (and gives it the checkpoint's
    /// `.tmp` name). On error the file is removed.
    pub fn wait(self) -> Result<Prepared> {
        let finished =
            (self.answer.recv()).map_err(|_| internal!("the sink's encoder thread stopped"))??;
        let Finished {
            mut file,
            written,
            rows,
            digest,
        } = finished;
        let (size, crc) = (file.written, file.crc.clone().finalize());
        let synced = (|| -> Result<()> {
            file.sync()?;
            drop(file);
            if written != self.tmp {
                self.io.rename(&written, &self.tmp)?;
                // The store's commit must find the file under the checkpoint's name.
                self.io.sync_dir(&self.dir)?;
            }
            Ok(())
        })();
        if let Err(e) = synced {
            // Whichever name it has now. (Its I/O errors name the file already.)
            let _ = self.io.remove(&written);
            let _ = self.io.remove(&self.tmp);
            return Err(e);
        }
        Ok(Prepared {
            io: self.io,
            dir: self.dir,
            tmp: self.tmp,
            path: self.path,
            rows,
            size,
            crc,
            digest,
        })
    }
}

/// A prepared, not yet published, checkpoint file.
#[derive(Debug)]
#[must_use = "a prepared file is published after the store commits"]
pub struct Prepared {
    io: Arc<dyn StorageIo>,
    dir: PathBuf,
    tmp: PathBuf,
    path: PathBuf,
    rows: u64,
    /// The file's size in bytes.
    size: u64,
    /// CRC-32 of the file's bytes, computed as they were written.
    crc: u32,
    /// The file's digest, when the sink digests what it writes.
    digest: Option<TableDigest>,
}

impl Prepared {
    /// What the store records of the file at its commit: rows, size, checksum.
    pub fn record(&self) -> crate::job::output::FileRecord {
        crate::job::output::FileRecord {
            rows: self.rows,
            size: self.size,
            crc: self.crc,
        }
    }

    /// Makes the file visible (a rename and a sync of the directory): phase two, after the
    /// store committed. [`ParquetSink::published`] counts it in.
    pub fn reveal(&self) -> Result<()> {
        self.io.rename(&self.tmp, &self.path)?;
        self.io.sync_dir(&self.dir)?;
        Ok(())
    }
}

/// What [`ParquetSink::open`] did to an earlier run's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Committed `.tmp` files renamed into place.
    pub rolled_forward: u64,
    /// Files of uncommitted epochs (or of a discarded run) removed.
    pub removed: u64,
    /// Published files kept.
    pub kept: u64,
}

/// Rows queued for the encoder before `push` blocks (a chunk is admitted into an empty queue
/// whatever its size).
///
/// Chosen by measurement (docs/benchmarks-history.md, "A deeper queue before the sink's encoder"): 64
/// chunks of 1024 rows left the consumer waiting on the encoder and the actors waiting on the
/// consumer at every burst (lineitem scale 1: 0.92 to 0.96x wall at 256 chunks, worse again at
/// 1024: 1 GB peak). About 40 MB of lineitem rows.
const QUEUE_ROWS: usize = 256 * 1024;

/// The rows queued for the encoder, bounded by [`QUEUE_ROWS`]; closed when the encoder
/// thread ends, so that no `push` waits for it forever.
#[derive(Debug, Default)]
struct Backlog {
    state: Mutex<BacklogState>,
    drained: Condvar,
}

#[derive(Debug, Default)]
struct BacklogState {
    rows: usize,
    closed: bool,
}

impl Backlog {
    /// Waits for room for `rows` more rows and counts them in; false once closed.
    fn admit(&self, rows: usize) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        while !state.closed && state.rows > 0 && state.rows + rows > QUEUE_ROWS {
            state = match self.drained.wait(state) {
                Ok(state) => state,
                Err(_) => return false,
            };
        }
        state.rows += rows;
        !state.closed
    }

    /// Counts `rows` out (taken off the queue by the encoder).
    fn release(&self, rows: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.rows = state.rows.saturating_sub(rows);
            self.drained.notify_all();
        }
    }

    /// No more rows will be taken off the queue.
    fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
            self.drained.notify_all();
        }
    }
}

/// Closes the backlog when the encoder thread ends, however it ends.
struct CloseOnDrop(Arc<Backlog>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// What the encoder thread is asked to do.
enum Job {
    /// From now on, also digest every chunk (per file) as rows of this table.
    Digest(Arc<TableDesc>),
    /// Files begun from now on keep min/max statistics of these string and binary columns
    /// (see [`ParquetSink::with_key_statistics`]).
    KeyColumns(Vec<String>),
    /// Encode a chunk emitted in an epoch into the current file.
    Chunk(u64, StreamChunk),
    /// Finish the current file as the file of this checkpoint epoch and hand it over, with
    /// its rows and digest.
    Finish(u64, SyncSender<Result<Finished>>),
}

/// A file the encoder finished (footer written, not yet fsynced).
struct Finished {
    file: Checksummed,
    /// Its name: the `.tmp` of its first chunk's epoch.
    written: PathBuf,
    rows: u64,
    /// When digesting, the digest of its rows.
    digest: Option<TableDigest>,
}

impl std::fmt::Debug for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finished")
            .field("written", &self.written)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

/// Where the encoder writes its files.
struct Target {
    io: Arc<dyn StorageIo>,
    dir: PathBuf,
    /// The shard whose names it writes (`None`: an unsharded replay).
    shard: Option<Shard>,
}

/// The encoder thread: chunks in, one Parquet file out per `Finish`.
#[derive(Debug)]
struct Encoder {
    tx: Option<Sender<Job>>,
    backlog: Arc<Backlog>,
    thread: Option<JoinHandle<()>>,
}

impl Encoder {
    fn start(
        schema: SchemaRef,
        io: Arc<dyn StorageIo>,
        dir: PathBuf,
        shard: Option<Shard>,
    ) -> Result<Self> {
        let (tx, rx) = channel::<Job>();
        let backlog = Arc::new(Backlog::default());
        let queue = Arc::clone(&backlog);
        let target = Target { io, dir, shard };
        let thread = std::thread::Builder::new()
            .name("backfill-sink".into())
            .spawn(move || {
                let _close = CloseOnDrop(Arc::clone(&queue));
                encode_loop(&schema, &target, &rx, &queue);
            })
            .map_err(Error::from)?;
        Ok(Self {
            tx: Some(tx),
            backlog,
            thread: Some(thread),
        })
    }

    /// Queues `job`, waiting while the queue holds [`QUEUE_ROWS`] rows of chunks.
    fn send(&self, job: Job) -> Result<()> {
        let admitted = match &job {
            Job::Chunk(_, chunk) => self.backlog.admit(chunk.num_rows()),
            _ => true,
        };
        admitted
            .then_some(())
            .and_then(|()| self.tx.as_ref()?.send(job).ok())
            .ok_or_else(|| internal!("the sink's encoder thread stopped"))
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Rows the encoder takes off its queue at a time, when that many are waiting: a group is
/// encoded with one rayon task a column, so the tasks' fixed costs are paid per group, not
/// per chunk.
const GROUP_ROWS: usize = 16 * 1024;

/// Encodes chunks until the sender goes; the first error of a file is its `Finish` answer.
///
/// Chunks that wait in the queue are taken together (up to [`GROUP_ROWS`]) and encoded as
/// one group: the columns in parallel ([`ColumnParallelWriter`]), the digest beside them.
///
/// A file is created at its first chunk and written as its row groups close (see the
/// module docs); it is handed over at `Finish` with its footer written, and fsynced by
/// [`Preparing::wait`], off this thread, which goes on with the next file meanwhile. A file
/// whose encoding or writing fails, or that is left unfinished when the sender goes, is
/// removed.
fn encode_loop(schema: &SchemaRef, target: &Target, rx: &Receiver<Job>, backlog: &Backlog) {
    let mut current: Option<OpenFile> = None;
    // The epoch of the last file closed: a later file's chunks are of later epochs, so the
    // name a file is written under (its first chunk's epoch) is never an earlier file's.
    let mut closed: Option<u64> = None;
    let mut rows = 0u64;
    let mut failed: Option<Error> = None;
    let mut digest: Option<(Arc<TableDesc>, TableDigest)> = None;
    let mut encodings = EncodingChoice::default();
    let mut key_columns: Vec<String> = Vec::new();
    let mut next: Option<Job> = None;
    loop {
        let job = match next.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => break,
            },
        };
        match job {
            Job::Digest(desc) => {
                let empty = TableDigest::new(desc.vnode_count());
                digest = Some((desc, empty));
            }
            Job::KeyColumns(columns) => key_columns = columns,
            Job::Chunk(epoch, chunk) => {
                let mut group_rows = chunk.num_rows();
                let mut group = vec![(epoch, chunk)];
                while group_rows < GROUP_ROWS {
                    match rx.try_recv() {
                        Ok(Job::Chunk(epoch, chunk)) => {
                            group_rows += chunk.num_rows();
                            group.push((epoch, chunk));
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                // Off the queue: room for as many rows more.
                backlog.release(group_rows);
                if failed.is_some() {
                    continue;
                }
                let encoded = (|| -> Result<()> {
                    let batches = (group.iter())
                        .map(|(epoch, chunk)| Ok(chunk.to_changelog(Some(*epoch))?))
                        .collect::<Result<Vec<_>>>()?;
                    let open = match &mut current {
                        Some(open) => open,
                        None => {
                            if let Some(closed) = closed.filter(|&closed| epoch <= closed) {
                                return Err(internal!(
                                    "a chunk of epoch {epoch} after the file of checkpoint \
                                     {closed} was closed"
                                ));
                            }
                            let props = encodings.writer_properties(schema, &key_columns)?;
                            current.insert(OpenFile::create(target, schema, epoch, props)?)
                        }
                    };
                    for batch in &batches {
                        encodings.observe(batch, schema, &key_columns)?;
                    }
                    // The writer queues the batches on its column lanes and returns: the
                    // digest runs here while they encode.
                    open.writer.write(&batches)?;
                    if let Some((desc, digest)) = &mut digest {
                        for (_, chunk) in &group {
                            digest.apply(desc, chunk)?;
                        }
                    }
                    Ok(())
                })();
                match encoded {
                    Ok(()) => rows += group_rows as u64,
                    Err(e) => {
                        failed = Some(e);
                        if let Some(open) = current.take() {
                            open.discard(target);
                        }
                    }
                }
            }
            Job::Finish(checkpoint, reply) => {
                closed = Some(checkpoint);
                let file_digest = digest.as_mut().map(|(desc, digest)| {
                    std::mem::replace(digest, TableDigest::new(desc.vnode_count()))
                });
                let result = match (failed.take(), current.take()) {
                    (Some(e), _) => Err(e),
                    (None, Some(open)) if open.epoch > checkpoint => {
                        let first = open.epoch;
                        open.discard(target);
                        Err(internal!(
                            "checkpoint {checkpoint} closes a file whose first chunk is of \
                             epoch {first}"
                        ))
                    }
                    (None, Some(open)) => open.finish(target).map(|(file, written)| Finished {
                        file,
                        written,
                        rows,
                        digest: file_digest,
                    }),
                    (None, None) => Err(internal!("a checkpoint file was closed with no rows")),
                };
                let _ = reply.send(result);
                rows = 0;
            }
        }
    }
    // The job ended part way through a file: it will never be committed.
    if let Some(open) = current.take() {
        open.discard(target);
    }
}

/// The file the encoder is writing.
struct OpenFile {
    writer: ColumnParallelWriter<Checksummed>,
    /// The epoch of its first chunk.
    epoch: u64,
    /// The `.tmp` of that epoch.
    path: PathBuf,
}

impl OpenFile {
    /// Creates the file of a checkpoint whose first chunk was emitted in `epoch`.
    fn create(
        target: &Target,
        schema: &SchemaRef,
        epoch: u64,
        props: WriterProperties,
    ) -> Result<Self> {
        let path = target.dir.join(part_tmp_name(epoch, target.shard));
        let file = Checksummed::new(target.io.create(&path)?);
        match ColumnParallelWriter::try_new(file, Arc::clone(schema), props) {
            Ok(writer) => Ok(Self {
                writer,
                epoch,
                path,
            }),
            Err(e) => {
                let _ = target.io.remove(&path);
                Err(e)
            }
        }
    }

    /// Writes the footer; the file and its name. On error the file is removed.
    fn finish(self, target: &Target) -> Result<(Checksummed, PathBuf)> {
        match self.writer.finish() {
            Ok(file) => Ok((file, self.path)),
            Err(e) => {
                let _ = target.io.remove(&self.path);
                Err(e)
            }
        }
    }

    /// Closes and removes the file (best effort: recovery removes an uncommitted `.tmp`).
    fn discard(self, target: &Target) {
        drop(self.writer);
        let _ = target.io.remove(&self.path);
    }
}

/// A file being written that counts and checksums its bytes as they go: the record of a
/// committed file (size, CRC-32) costs no second read.
struct Checksummed {
    file: Box<dyn WriteFile>,
    written: u64,
    crc: crc32fast::Hasher,
}

impl Checksummed {
    fn new(file: Box<dyn WriteFile>) -> Self {
        Self {
            file,
            written: 0,
            crc: crc32fast::Hasher::new(),
        }
    }
}

impl std::io::Write for Checksummed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl WriteFile for Checksummed {
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync()
    }
}

/// Writes the downstream changelog as Parquet files, one per checkpoint.
#[derive(Debug)]
pub struct ParquetSink {
    io: Arc<dyn StorageIo>,
    dir: PathBuf,
    /// The part of the output it writes (`None`: the whole).
    shard: Option<Shard>,
    encoder: Encoder,
    /// Whether chunks went to the encoder since the last `prepare`.
    pending: bool,
    rows_published: Arc<std::sync::atomic::AtomicU64>,
    files_published: u64,
    /// Per checkpoint, seconds from its `prepare` (the barrier reached the sink) to its
    /// publication: the local commit's latency.
    commit_latencies: Vec<f64>,
    /// The job checkpoint the sink was opened at (its recovery is done by then).
    committed: Option<u64>,
    /// The digest of every file this sink published, when it digests (see
    /// [`ParquetSink::with_digest`]).
    published_digest: Option<TableDigest>,
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by tests; the job logs nothing")
    )]
    recovery: Recovery,
}

impl ParquetSink {
    /// A sink writing into `out/changes` (created), for a job whose store has committed
    /// `committed` (`None`: a new job, so an earlier run's output there is removed). See the
    /// module docs for what recovery does; it fails before touching anything when a file it
    /// would remove is not a regular file.
    #[cfg(test)]
    pub fn open(
        io: Arc<dyn StorageIo>,
        out: &Path,
        table_schema: &SchemaRef,
        committed: Option<u64>,
    ) -> Result<Self> {
        Self::open_part(io, out, table_schema, committed, None)
    }

    /// [`ParquetSink::open`] for the part `shard` of an output (`None`: the whole): it
    /// writes, recovers and removes only that part's names (`shard.rs`).
    pub fn open_part(
        io: Arc<dyn StorageIo>,
        out: &Path,
        table_schema: &SchemaRef,
        committed: Option<u64>,
        shard: Option<Shard>,
    ) -> Result<Self> {
        let dir = out.join("changes");
        io.create_dir_all(&dir)?;
        let mut roll = Vec::new();
        let mut remove = Vec::new();
        let mut kept = 0;
        for name in io.list(&dir)? {
            let Some(OutputName { epoch, tmp, .. }) =
                parse_output_name(&name).filter(|n| n.shard == shard)
            else {
                continue;
            };
            let path = dir.join(&name);
            let committed_epoch = committed.is_some_and(|c| epoch <= c);
            match (committed_epoch, tmp) {
                (true, true) => roll.push((epoch, path)),
                (true, false) => kept += 1,
                (false, _) => remove.push((epoch, path)),
            }
        }
        for (_, path) in roll.iter().chain(&remove) {
            let meta = std::fs::symlink_metadata(path).map_err(|e| named(path, e))?;
            if !meta.is_file() {
                return Err(Error::dataset(
                    path,
                    "",
                    "is not a regular file, so the output cannot be recovered; nothing was changed",
                ));
            }
        }
        roll.sort();
        for (epoch, tmp) in &roll {
            let path = dir.join(part_file_name(*epoch, shard));
            if io.exists(&path)? {
                // Published already (a crash after rename); the tmp is a leftover copy.
                io.remove(tmp)?;
            } else {
                io.rename(tmp, &path)?;
            }
        }
        // Newest first: a crash part way leaves a prefix of the old output.
        remove.sort_by(|a, b| b.cmp(a));
        for (_, path) in &remove {
            io.remove(path)?;
        }
        if !roll.is_empty() || !remove.is_empty() {
            io.sync_dir(&dir)?;
        }
        Ok(Self {
            encoder: Encoder::start(
                changelog_schema(table_schema, true),
                Arc::clone(&io),
                dir.clone(),
                shard,
            )?,
            io,
            dir,
            shard,
            pending: false,
            rows_published: Arc::default(),
            files_published: 0,
            commit_latencies: Vec::new(),
            committed,
            published_digest: None,
            recovery: Recovery {
                rolled_forward: roll.len() as u64,
                removed: remove.len() as u64,
                kept: kept + roll.len() as u64,
            },
        })
    }

    /// What opening did to earlier output.
    #[cfg(test)]
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// Also digests what it writes, as rows of `desc` (on the encoder thread, off the
    /// caller's path): [`ParquetSink::published_digest`] is then the completion certificate's
    /// downstream side without reading the files back. For a sink that starts the output
    /// (no earlier run's files kept), so the digest covers the whole output.
    pub fn with_digest(mut self, desc: Arc<TableDesc>) -> Result<Self> {
        self.published_digest = Some(TableDigest::new(desc.vnode_count()));
        self.encoder.send(Job::Digest(desc))?;
        Ok(self)
    }

    /// Keeps min/max statistics of the string and binary columns among `key` (the table's
    /// primary key) in every file begun from now on; the other string and binary columns
    /// have none (see the module docs). Without it, no string or binary column has them.
    pub fn with_key_statistics<S: AsRef<str>>(self, key: &[S]) -> Result<Self> {
        let columns = key.iter().map(|c| c.as_ref().to_string()).collect();
        self.encoder.send(Job::KeyColumns(columns))?;
        Ok(self)
    }

    /// The digest of every file this sink published, if it digests.
    pub fn published_digest(&self) -> Option<&TableDigest> {
        self.published_digest.as_ref()
    }

    /// Queues a downstream chunk emitted in `epoch` for encoding; blocks while the queue is
    /// full.
    pub fn push(&mut self, epoch: u64, chunk: StreamChunk) -> Result<()> {
        if !chunk.is_empty() {
            self.encoder.send(Job::Chunk(epoch, chunk))?;
            self.pending = true;
        }
        Ok(())
    }

    /// Phase one: writes and fsyncs the buffered changes as the (hidden) file of checkpoint
    /// `epoch`. `None` when there is nothing to write. On error the `.tmp` is removed.
    /// (The replay overlaps the phases with the next epoch: [`ParquetSink::start_prepare`].)
    #[cfg(test)]
    pub fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>> {
        self.start_prepare(epoch)?.map(Preparing::wait).transpose()
    }

    /// [`ParquetSink::prepare`] without waiting: the encoder finishes the file of `epoch`
    /// after the chunks already pushed, while this sink takes the chunks of the next epoch
    /// (they go to the next file). [`Preparing::wait`] waits for the file.
    pub fn start_prepare(&mut self, epoch: u64) -> Result<Option<Preparing>> {
        if !self.pending {
            return Ok(None);
        }
        self.pending = false;
        let path = self.dir.join(part_file_name(epoch, self.shard));
        let tmp = self.dir.join(part_tmp_name(epoch, self.shard));
        let (reply, answer) = sync_channel(1);
        self.encoder.send(Job::Finish(epoch, reply))?;
        Ok(Some(Preparing {
            io: Arc::clone(&self.io),
            dir: self.dir.clone(),
            tmp,
            path,
            answer,
        }))
    }

    /// Phase two, after the store committed: makes the file visible.
    #[cfg(test)]
    pub fn publish(&mut self, prepared: Prepared) -> Result<()> {
        prepared.reveal()?;
        self.published(prepared)
    }

    /// Counts in the file of `prepared`, made visible with [`Prepared::reveal`].
    pub fn published(&mut self, prepared: Prepared) -> Result<()> {
        (self.rows_published).fetch_add(prepared.rows, std::sync::atomic::Ordering::Relaxed);
        self.files_published += 1;
        if let (Some(all), Some(file)) = (&mut self.published_digest, &prepared.digest) {
            all.add(file)?;
        }
        Ok(())
    }

    /// Rows in files published by this sink.
    pub fn rows_published(&self) -> u64 {
        self.rows_published
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// [`ParquetSink::rows_published`], readable while the sink is in use (for progress).
    pub fn published_rows(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.rows_published)
    }

    /// Files published by this sink.
    pub fn files_published(&self) -> u64 {
        self.files_published
    }

    /// Per checkpoint this sink committed, seconds from its barrier to its publication.
    pub fn commit_latencies(&self) -> &[f64] {
        &self.commit_latencies
    }

    /// The directory the files go to.
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The sink of a replay's job: the two phases of [`ParquetSink`] as the library's
/// exactly-once interface. The sink recovers when it is opened (it knows the committed
/// checkpoint then, and the replay checks the committed files before); `recover` only checks
/// that the job resumes at that checkpoint.
impl ExactlyOnceSink for ParquetSink {
    type Prepared = CheckpointFile;

    fn recover(&mut self, recovery: &JobRecovery) -> EngineResult<()> {
        if recovery.committed != self.committed {
            return Err(EngineError::Internal(format!(
                "the sink was opened at checkpoint {:?}, the job resumes at {:?}",
                self.committed, recovery.committed
            )));
        }
        Ok(())
    }

    fn write(&mut self, epoch: u64, chunk: StreamChunk) -> EngineResult<()> {
        self.push(epoch, chunk).map_err(Error::into_engine)
    }

    fn prepare(&mut self, epoch: u64) -> EngineResult<CheckpointFile> {
        Ok(CheckpointFile {
            preparing: self.start_prepare(epoch).map_err(Error::into_engine)?,
            prepared: None,
            started: std::time::Instant::now(),
        })
    }

    fn committed(&mut self, _epoch: u64, file: CheckpointFile) -> EngineResult<()> {
        let published = match file.prepared {
            Some(prepared) => self.published(prepared).map_err(Error::into_engine),
            None => Ok(()),
        };
        self.commit_latencies
            .push(file.started.elapsed().as_secs_f64());
        published
    }
}

/// A checkpoint's file on its way (none when the checkpoint had no rows): encoded and
/// synced as `.tmp`, its record (rows, size, CRC) committed with the checkpoint, renamed.
#[derive(Debug)]
pub struct CheckpointFile {
    preparing: Option<Preparing>,
    prepared: Option<Prepared>,
    /// When its barrier reached the sink.
    started: std::time::Instant,
}

impl PreparedCheckpoint for CheckpointFile {
    fn make_durable(&mut self) -> EngineResult<Option<String>> {
        let Some(preparing) = self.preparing.take() else {
            return Ok(None);
        };
        let prepared = preparing.wait().map_err(Error::into_engine)?;
        let record = prepared.record().encode();
        self.prepared = Some(prepared);
        Ok(Some(record))
    }

    fn publish(&mut self) -> EngineResult<()> {
        match &self.prepared {
            Some(prepared) => prepared.reveal().map_err(Error::into_engine),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::output::{file_name, parse_name, tmp_name};

    /// The encoder's queue holds at most `QUEUE_ROWS` rows (one chunk of any size when it
    /// is empty), waits for the encoder to take rows off, and lets nobody wait for an
    /// encoder that ended.
    #[test]
    fn the_backlog_bounds_queued_rows() {
        let backlog = Arc::new(Backlog::default());
        assert!(
            backlog.admit(QUEUE_ROWS * 3),
            "an empty queue takes any chunk"
        );
        backlog.release(QUEUE_ROWS * 3);
        assert!(backlog.admit(QUEUE_ROWS - 10));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = {
            let backlog = Arc::clone(&backlog);
            std::thread::spawn(move || {
                let admitted = backlog.admit(20);
                tx.send(()).unwrap();
                admitted
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "20 more rows wait for room");
        backlog.release(100);
        assert!(waiting.join().unwrap(), "admitted once rows were taken off");
        let stuck = {
            let backlog = Arc::clone(&backlog);
            std::thread::spawn(move || backlog.admit(QUEUE_ROWS))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        backlog.close();
        assert!(!stuck.join().unwrap(), "a closed queue admits nothing");
    }
    use crate::job::encoding::SAMPLE_ROWS;
    use crate::store::io::RealIo;
    use arrow_array::cast::AsArray;
    use arrow_array::{
        BinaryArray, Date32Array, Decimal128Array, Float64Array, Int64Array, RecordBatch,
        StringArray, StringViewArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::Encoding;
    use parquet::file::metadata::ParquetMetaData;
    use std::fs::{self, File};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]))
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn a_digesting_sink_digests_exactly_what_it_publishes() {
        let out = tempfile::tempdir().unwrap();
        let desc =
            Arc::new(TableDesc::new("t", schema(), vec![crate::key::KeyColumn::asc("k")]).unwrap());
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None)
            .unwrap()
            .with_digest(desc.clone())
            .unwrap();
        let chunk = |text: &str| StreamChunk::from_text(&schema(), text).unwrap();
        sink.push(2, chunk("+ 1\n+ 2\n+ 3")).unwrap();
        let first = sink.prepare(2).unwrap().unwrap();
        sink.publish(first).unwrap();
        sink.push(3, chunk("- 2\nU- 3\nU+ 3")).unwrap();
        let second = sink.prepare(3).unwrap().unwrap();
        // Prepared, never published (a commit that failed): not in the digest.
        sink.push(4, chunk("+ 9")).unwrap();
        let _unpublished = sink.prepare(4).unwrap().unwrap();
        sink.publish(second).unwrap();
        let read_back = TableDigest::of_output(out.path(), &desc).unwrap();
        assert_eq!(sink.published_digest(), Some(&read_back));
        let mut expected = TableDigest::new(desc.vnode_count());
        expected.apply(&desc, &chunk("+ 1\n+ 3")).unwrap();
        assert_eq!(read_back, expected);
    }

    #[test]
    fn only_string_columns_are_dictionary_encoded() {
        let table = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &table, None).unwrap();
        let text: String = (0..100).map(|i| format!("+ {i} m{}\n", i % 3)).collect();
        sink.push(2, StreamChunk::from_text(&table, &text).unwrap())
            .unwrap();
        let prepared = sink.prepare(2).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        let meta = published_metadata(&sink, 2);
        let dictionary: Vec<(String, bool)> = meta
            .row_group(0)
            .columns()
            .iter()
            .map(|c| {
                (
                    c.column_path().string(),
                    c.dictionary_page_offset().is_some(),
                )
            })
            .collect();
        let expected = [("_epoch", false), ("_op", false), ("k", false), ("s", true)];
        let expected: Vec<(String, bool)> =
            expected.iter().map(|(n, d)| (n.to_string(), *d)).collect();
        assert_eq!(dictionary, expected);
    }

    /// The footer of the published file of `epoch`.
    fn published_metadata(sink: &ParquetSink, epoch: u64) -> Arc<ParquetMetaData> {
        let file = File::open(sink.dir().join(file_name(epoch))).unwrap();
        ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .metadata()
            .clone()
    }

    /// The dictionary columns of every row group of the published file of `epoch`.
    fn dictionary_columns(sink: &ParquetSink, epoch: u64) -> Vec<String> {
        let meta = published_metadata(sink, epoch);
        let mut columns: Vec<String> = meta
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .filter(|c| c.dictionary_page_offset().is_some())
            .map(|c| c.column_path().string())
            .collect();
        columns.dedup();
        columns
    }

    #[test]
    fn free_text_gets_no_dictionary_once_the_sample_shows_it() {
        let table = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("mode", DataType::Utf8View, false),
            Field::new("comment", DataType::Utf8, true),
            Field::new("blob", DataType::Binary, true),
        ]));
        let rows = |from: i64, n: i64| {
            let batch = RecordBatch::try_new(
                table.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(from..from + n)),
                    Arc::new(StringViewArray::from_iter_values(
                        (from..from + n).map(|i| ["AIR", "RAIL", "SHIP"][i as usize % 3]),
                    )),
                    // Distinct, with a few nulls (not counted as values).
                    Arc::new(StringArray::from_iter(
                        (from..from + n)
                            .map(|i| (i % 10 != 0).then(|| format!("free text number {i}"))),
                    )),
                    // A quarter distinct: a dictionary.
                    Arc::new(BinaryArray::from_iter_values(
                        (from..from + n).map(|i| (i / 4).to_le_bytes()),
                    )),
                ],
            )
            .unwrap();
            StreamChunk::inserts(batch)
        };
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &table, None).unwrap();
        // A first file too small to judge: every string column has a dictionary.
        sink.push(2, rows(0, 100)).unwrap();
        let prepared = sink.prepare(2).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        assert_eq!(dictionary_columns(&sink, 2), ["mode", "comment", "blob"]);
        // The sample fills up in this file (which keeps its dictionaries): the free text
        // goes plain in the files begun after it.
        let n = SAMPLE_ROWS as i64;
        for part in 0..4 {
            sink.push(3, rows(100 + part * n / 4, n / 4)).unwrap();
        }
        let prepared = sink.prepare(3).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        assert_eq!(dictionary_columns(&sink, 3), ["mode", "comment", "blob"]);
        for epoch in [4, 5] {
            sink.push(epoch, rows(100 + n * epoch as i64, 10)).unwrap();
            let prepared = sink.prepare(epoch).unwrap().unwrap();
            sink.publish(prepared).unwrap();
            assert_eq!(dictionary_columns(&sink, epoch), ["mode", "blob"]);
        }
    }

    /// Per leaf of the published file of `epoch`, whether its column chunks are compressed
    /// (all of them, or none: a file is written under one choice).
    fn compressed_columns(sink: &ParquetSink, epoch: u64) -> Vec<(String, bool)> {
        let meta = published_metadata(sink, epoch);
        let first = meta.row_group(0).columns();
        for group in meta.row_groups() {
            for (a, b) in group.columns().iter().zip(first) {
                assert_eq!(a.compression(), b.compression());
            }
        }
        (first.iter())
            .map(|c| {
                let zstd = c.compression() != parquet::basic::Compression::UNCOMPRESSED;
                (c.column_path().string(), zstd)
            })
            .collect()
    }

    #[test]
    fn dense_columns_go_uncompressed_once_the_sample_shows_it() {
        let table = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("price", DataType::Float64, false),
            Field::new("comment", DataType::Utf8View, true),
        ]));
        let rows = |from: i64, n: i64| {
            let batch = RecordBatch::try_new(
                table.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(from..from + n)),
                    // Well-spread bit patterns: nothing for zstd to find.
                    Arc::new(Float64Array::from_iter_values(
                        (from..from + n).map(|i| (i as f64 * 0.618_033_988_749).sin() * 1e6),
                    )),
                    Arc::new(StringViewArray::from_iter((from..from + n).map(|i| {
                        (i % 7 != 0).then(|| format!("a comment of row {i} ok"))
                    }))),
                ],
            )
            .unwrap();
            StreamChunk::inserts(batch)
        };
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &table, None).unwrap();
        let n = SAMPLE_ROWS as i64;
        // The sample fills up in the first file, which keeps zstd on every leaf.
        sink.push(2, rows(0, n + 10)).unwrap();
        let prepared = sink.prepare(2).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        let all = [
            ("_epoch", true),
            ("_op", true),
            ("k", true),
            ("price", true),
        ];
        let mut expected: Vec<(String, bool)> =
            all.iter().map(|(c, z)| (c.to_string(), *z)).collect();
        expected.push(("comment".to_string(), true));
        assert_eq!(compressed_columns(&sink, 2), expected);
        // Files begun after it leave the prices uncompressed, and read back the same.
        let later = rows(n + 10, 3 * n);
        sink.push(3, later.clone()).unwrap();
        let prepared = sink.prepare(3).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        expected[3].1 = false;
        assert_eq!(compressed_columns(&sink, 3), expected);
        let file = File::open(sink.dir().join(file_name(3))).unwrap();
        let read: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let read = arrow_select::concat::concat_batches(&read[0].schema(), &read).unwrap();
        for field in table.fields() {
            let column = read.column_by_name(field.name()).unwrap();
            let column = arrow_cast::cast(column, field.data_type()).unwrap();
            let expected = later.batch().column_by_name(field.name()).unwrap();
            assert_eq!(&column, expected, "{}", field.name());
        }
    }

    #[test]
    fn integer_columns_are_delta_packed_and_read_back_equal() {
        let table = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("day", DataType::Date32, true),
            Field::new("price", DataType::Decimal128(12, 2), false),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                false,
            ),
            Field::new("ratio", DataType::Float64, false),
            Field::new("mode", DataType::Utf8, false),
        ]));
        let n = 5000i64;
        let batch = RecordBatch::try_new(
            table.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| i * 7919 % 100_003),
                )),
                Arc::new(Date32Array::from_iter(
                    (0..n).map(|i| (i % 9 != 0).then_some(i as i32)),
                )),
                Arc::new(
                    Decimal128Array::from_iter_values((0..n).map(|i| i128::from(i) * 101 - 4000))
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    (0..n).map(|i| i64::MIN / 2 + i * 1_000_003),
                )),
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| i as f64 / 3.0),
                )),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| ["AIR", "RAIL", "SHIP"][i as usize % 3]),
                )),
            ],
        )
        .unwrap();
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &table, None).unwrap();
        sink.push(2, StreamChunk::inserts(batch.clone())).unwrap();
        let prepared = sink.prepare(2).unwrap().unwrap();
        sink.publish(prepared).unwrap();

        let file = File::open(sink.dir().join(file_name(2))).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let delta: Vec<String> = (builder.metadata().row_groups().iter())
            .flat_map(|g| g.columns())
            .filter(|c| c.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED))
            .map(|c| c.column_path().string())
            .collect();
        assert_eq!(delta, ["_epoch", "_op", "k", "day", "price", "at"]);
        let read: Vec<RecordBatch> = builder.build().unwrap().map(Result::unwrap).collect();
        let read = arrow_select::concat::concat_batches(&read[0].schema(), &read).unwrap();
        assert_eq!(read.num_rows(), n as usize);
        for (i, field) in table.fields().iter().enumerate() {
            let column = read.column_by_name(field.name()).unwrap();
            let column = arrow_cast::cast(column, field.data_type()).unwrap();
            assert_eq!(&column, batch.column(i), "{}", field.name());
        }
    }

    #[test]
    fn string_statistics_only_for_key_columns() {
        let table = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
            Field::new("note", DataType::Utf8, false),
            Field::new("raw", DataType::Binary, false),
        ]));
        let n = 3000i64;
        let batch = RecordBatch::try_new(
            table.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("key-{i:05}")),
                )),
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("note {}", i * 31 % 977)),
                )),
                Arc::new(arrow_array::BinaryArray::from_iter_values(
                    (0..n).map(|i| i.to_le_bytes()),
                )),
            ],
        )
        .unwrap();
        let statistics = |key: &[&str]| -> Vec<(String, bool)> {
            let out = tempfile::tempdir().unwrap();
            let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &table, None)
                .unwrap()
                .with_key_statistics(key)
                .unwrap();
            sink.push(2, StreamChunk::inserts(batch.clone())).unwrap();
            let prepared = sink.prepare(2).unwrap().unwrap();
            sink.publish(prepared).unwrap();
            let file = File::open(sink.dir().join(file_name(2))).unwrap();
            let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            let columns = builder.metadata().row_group(0).columns();
            let listed = columns
                .iter()
                .map(|c| (c.column_path().string(), c.statistics().is_some()))
                .collect();
            // The values are all there whatever the statistics.
            let rows: usize = builder
                .build()
                .unwrap()
                .map(|b| b.unwrap().num_rows())
                .sum();
            assert_eq!(rows, n as usize);
            listed
        };
        let with = |names: &[&str]| -> Vec<(String, bool)> {
            ["_epoch", "_op", "name", "n", "note", "raw"]
                .iter()
                .map(|c| {
                    (
                        c.to_string(),
                        !matches!(*c, "name" | "note" | "raw") || names.contains(c),
                    )
                })
                .collect()
        };
        assert_eq!(statistics(&["name"]), with(&["name"]));
        assert_eq!(statistics(&["n", "raw"]), with(&["raw"]));
        assert_eq!(statistics(&[]), with(&[]));
    }

    /// `(_epoch, k)` of every row of the published file of checkpoint `epoch`.
    fn epochs_and_keys(out: &Path, epoch: u64) -> Vec<(u64, i64)> {
        let file = File::open(sink_dir(out).join(file_name(epoch))).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        let mut rows = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            let epochs = batch
                .column(0)
                .as_primitive::<arrow_array::types::UInt64Type>();
            let keys = batch
                .column(2)
                .as_primitive::<arrow_array::types::Int64Type>();
            rows.extend(
                epochs
                    .values()
                    .iter()
                    .copied()
                    .zip(keys.values().iter().copied()),
            );
        }
        rows
    }

    fn chunk(text: &str) -> StreamChunk {
        StreamChunk::from_text(&schema(), text).unwrap()
    }

    #[test]
    fn the_next_epoch_goes_to_the_next_file_while_one_is_prepared() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        sink.push(2, chunk("+ 1\n+ 2")).unwrap();
        let first = sink.start_prepare(2).unwrap().unwrap();
        // Chunks of epoch 3 while the file of 2 is finishing (and again once written).
        sink.push(3, chunk("+ 3")).unwrap();
        let first = first.wait().unwrap();
        sink.push(3, chunk("+ 4")).unwrap();
        let second = sink.start_prepare(3).unwrap().unwrap();
        assert!(
            sink.start_prepare(4).unwrap().is_none(),
            "nothing pushed since"
        );
        let second = second.wait().unwrap();
        second.reveal().unwrap();
        first.reveal().unwrap();
        sink.published(first).unwrap();
        sink.published(second).unwrap();
        assert_eq!(sink.rows_published(), 4);
        assert_eq!(epochs_and_keys(out.path(), 2), [(2, 1), (2, 2)]);
        assert_eq!(epochs_and_keys(out.path(), 3), [(3, 3), (3, 4)]);
        assert_eq!(names(&sink_dir(out.path())), [file_name(2), file_name(3)]);
    }

    #[test]
    fn a_file_of_several_epochs_is_named_for_its_checkpoint() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        // Written from its first chunk on under the `.tmp` of epoch 3.
        sink.push(3, chunk("+ 1")).unwrap();
        sink.push(4, chunk("+ 2\n- 1")).unwrap();
        let prepared = sink.start_prepare(5).unwrap().unwrap().wait().unwrap();
        assert_eq!(names(&sink_dir(out.path())), [tmp_name(5)]);
        sink.publish(prepared).unwrap();
        assert_eq!(names(&sink_dir(out.path())), [file_name(5)]);
        assert_eq!(epochs_and_keys(out.path(), 5), [(3, 1), (4, 2), (4, 1)]);
    }

    #[test]
    fn a_file_left_unfinished_is_removed() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        sink.push(2, chunk("+ 1")).unwrap();
        let prepared = sink.prepare(2).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        sink.push(3, chunk("+ 2")).unwrap();
        // The job stops before checkpoint 3: the encoder had created its file.
        drop(sink);
        assert_eq!(names(&sink_dir(out.path())), [file_name(2)]);
    }

    #[test]
    fn chunks_out_of_checkpoint_order_are_refused_and_leave_no_file() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        sink.push(3, chunk("+ 1")).unwrap();
        let prepared = sink.prepare(3).unwrap().unwrap();
        sink.publish(prepared).unwrap();
        // A chunk of an epoch whose checkpoint was prepared already.
        sink.push(3, chunk("+ 2")).unwrap();
        let e = sink.prepare(4).unwrap_err();
        assert!(
            e.to_string().contains("after the file of checkpoint 3"),
            "{e}"
        );
        // A checkpoint before the first chunk of its file.
        sink.push(6, chunk("+ 3")).unwrap();
        let e = sink.prepare(5).unwrap_err();
        assert!(e.to_string().contains("first chunk is of epoch 6"), "{e}");
        assert_eq!(names(&sink_dir(out.path())), [file_name(3)]);
    }

    #[test]
    fn a_failed_write_or_sync_leaves_no_file_and_the_next_checkpoint_is_whole() {
        use crate::store::io::{Fault, FaultyIo};
        let attempt = |io: Arc<dyn StorageIo>, out: &Path| -> Result<()> {
            let mut sink = ParquetSink::open(io, out, &schema(), None)?;
            // A file begun in epoch 3 and closed at checkpoint 4 (so also renamed).
            let rows: String = (0..5000).map(|k| format!("+ {k}\n")).collect();
            sink.push(3, chunk(&rows))?;
            sink.push(4, chunk("+ 5000"))?;
            let prepared = sink.start_prepare(4)?.map(Preparing::wait).transpose();
            if let Err(e) = prepared {
                assert_eq!(names(&sink_dir(out)), Vec::<String>::new(), "after {e}");
                // The sink goes on: the next checkpoint's file holds its own rows only.
                sink.push(5, chunk("+ 5001"))?;
                let next = sink.start_prepare(5)?.unwrap().wait()?;
                sink.publish(next)?;
                assert_eq!(epochs_and_keys(out, 5), [(5, 5001)]);
                return Err(e);
            }
            sink.publish(prepared?.unwrap())?;
            Ok(())
        };
        let dir = tempfile::tempdir().unwrap();
        let counter = Arc::new(FaultyIo::new(RealIo::shared(), None, Fault::Fail));
        attempt(counter.clone(), &dir.path().join("clean")).unwrap();
        let total = counter.operations();
        let mut failed = 0;
        for n in 1..=total {
            let out = dir.path().join(format!("out-{n}"));
            let faulty = Arc::new(FaultyIo::new(RealIo::shared(), Some(n), Fault::Fail));
            if attempt(faulty, &out).is_err() {
                failed += 1;
            }
        }
        assert!(total >= 5, "only {total} operations");
        assert!(failed >= total - 2, "{failed} of {total} faults surfaced");
    }

    fn sink_dir(out: &Path) -> PathBuf {
        out.join("changes")
    }

    #[test]
    fn two_phases_hide_the_file_until_published() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        assert!(sink.prepare(3).unwrap().is_none(), "nothing to write");
        sink.push(2, StreamChunk::from_text(&schema(), "+ 1\n+ 2").unwrap())
            .unwrap();
        sink.push(3, StreamChunk::from_text(&schema(), "- 1").unwrap())
            .unwrap();
        let prepared = sink.prepare(3).unwrap().unwrap();
        let final_path = sink.dir().join(file_name(3));
        assert!(!final_path.exists());
        sink.publish(prepared).unwrap();
        assert!(final_path.exists());
        assert_eq!((sink.rows_published(), sink.files_published()), (3, 1));
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&final_path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
        let (chunk, epochs) = StreamChunk::from_changelog(&batches[0]).unwrap();
        assert_eq!(chunk.to_text().unwrap(), "+ 1\n+ 2\n- 1\n");
        assert_eq!(epochs.unwrap().values().as_ref(), &[2, 2, 3]);
    }

    #[test]
    fn a_new_job_removes_the_previous_output_and_only_our_names() {
        let out = tempfile::tempdir().unwrap();
        let changes = out.path().join("changes");
        fs::create_dir_all(&changes).unwrap();
        fs::write(changes.join(file_name(9)), b"old").unwrap();
        fs::write(changes.join(tmp_name(10)), b"old").unwrap();
        fs::write(changes.join("epoch-my-notes.parquet"), b"keep").unwrap();
        fs::write(changes.join("notes.txt"), b"keep").unwrap();
        ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap();
        assert_eq!(names(&changes), ["epoch-my-notes.parquet", "notes.txt"]);
    }

    #[test]
    fn recovery_rolls_committed_tmp_files_forward_and_drops_the_rest() {
        let out = tempfile::tempdir().unwrap();
        let changes = out.path().join("changes");
        fs::create_dir_all(&changes).unwrap();
        fs::write(changes.join(file_name(3)), b"3").unwrap();
        fs::write(changes.join(tmp_name(5)), b"5").unwrap();
        fs::write(changes.join(tmp_name(7)), b"7").unwrap();
        fs::write(changes.join(file_name(8)), b"8").unwrap();
        let sink = ParquetSink::open(RealIo::shared(), out.path(), &schema(), Some(5)).unwrap();
        assert_eq!(names(&changes), [file_name(3), file_name(5)]);
        assert_eq!(fs::read(changes.join(file_name(5))).unwrap(), b"5");
        assert_eq!(
            sink.recovery(),
            Recovery {
                rolled_forward: 1,
                removed: 2,
                kept: 2
            }
        );
    }

    #[test]
    fn cleanup_refuses_before_touching_anything_when_it_cannot_finish() {
        let out = tempfile::tempdir().unwrap();
        let changes = out.path().join("changes");
        fs::create_dir_all(changes.join(file_name(4))).unwrap();
        fs::write(changes.join(file_name(9)), b"9").unwrap();
        let err = ParquetSink::open(RealIo::shared(), out.path(), &schema(), None).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(changes.join(file_name(9)).exists(), "nothing removed");
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_name(&file_name(42)), Some((42, false)));
        assert_eq!(parse_name(&tmp_name(42)), Some((42, true)));
        assert_eq!(parse_name("epoch-42.parquet"), None);
        assert_eq!(parse_name("epoch-my-notes.parquet"), None);
        assert_eq!(parse_name("epoch-10.parquet"), None);
        assert_eq!(parse_name(&file_name(u64::MAX)), Some((u64::MAX, false)));
        // 20 digits, past `u64::MAX`.
        assert_eq!(parse_name("epoch-99999999999999999999.parquet"), None);
        assert_eq!(parse_name("epoch-+0000000000000000042.parquet"), None);
        assert_eq!(parse_name("epoch-00000000000000000042.parquet.bak"), None);
    }

    /// Only published names of the one rule, in epoch order; no `.tmp`, nothing else.
    #[test]
    fn output_files_follow_the_one_rule() {
        let out = tempfile::tempdir().unwrap();
        let changes = out.path().join("changes");
        fs::create_dir_all(&changes).unwrap();
        for name in [
            file_name(12),
            file_name(3),
            tmp_name(13),
            "epoch-my-notes.parquet".into(),
            "epoch-10.parquet".into(),
            "epoch-99999999999999999999.parquet".into(),
            ".lock".into(),
        ] {
            fs::write(changes.join(name), b"x").unwrap();
        }
        let files = crate::job::output::output_files(out.path()).unwrap();
        assert_eq!(
            files,
            vec![
                (3, changes.join(file_name(3))),
                (12, changes.join(file_name(12)))
            ]
        );
        let err = crate::job::output::output_files(&out.path().join("nope")).unwrap_err();
        assert!(err.to_string().contains("nope/changes"), "{err}");
    }
}
