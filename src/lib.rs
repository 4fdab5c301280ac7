//! # arrangement-backfill
//!
//! Backfill a new streaming view from a live, continuously updated table, on Apache Arrow.
//!
//! A streaming system keeps an upstream table (its *arrangement*: rows sorted by primary key,
//! hash-partitioned into *vnodes*). When a new downstream view is created, the backfill scans
//! a consistent snapshot of that table per vnode **and** consumes the upstream's live changes
//! at the same time, so that the downstream receives every row exactly once:
//!
//! ```text
//!   upstream changes ──▶ materialize ──▶ upstream table (store) ─ snapshot scans per vnode ─┐
//!          │                                                                                 ▼
//!          └──────────────── chunks and barriers ──────────────────────────────▶ backfill ──▶ downstream
//!                                                       (buffer, filter by position, k-way merge,
//!                                                        progress per vnode saved at every barrier)
//! ```
//!
//! ## The API
//!
//! Everything an embedder needs is re-exported here, at the crate root:
//!
//! | What | Types |
//! |------|-------|
//! | the job | [`BackfillJob`] (a named view of a table, over 1 to N actors), [`JobOptions`], [`Change`] (what it takes), [`ResumePoint`], [`JobControl`] (pause, resume, throttle, rescale, barrier, stop), [`JobProgress`], [`JobSummary`] |
//! | loading a table | [`load_table`] (any Arrow reader), [`load_parquet`] |
//! | exactly-once sinks | [`ExactlyOnceSink`], [`PreparedCheckpoint`], [`Recovery`] |
//! | parallel actors, by hand | [`ParallelBackfill`], [`VnodeMap`] |
//! | the backfill | [`BackfillExecutor`], [`BackfillConfig`], [`SnapshotOrder`], [`BackfillStats`] |
//! | its output | [`BackfillStream`] (messages), [`ChangelogStream`] (changelog batches), [`ChangelogReader`] (a blocking `RecordBatchReader`, exported as an Arrow C stream by [`ChangelogReader::into_ffi_stream`]) |
//! | changes and messages | [`StreamChunk`], [`Op`], [`Message`], [`Barrier`], [`BarrierKind`], [`EpochPair`], [`Mutation`], [`Watermark`] |
//! | tables and keys | [`TableDesc`], [`Distribution`], [`KeyColumn`], [`PrimaryKey`], [`Position`] |
//! | vnodes | [`VirtualNode`], [`VnodeBitmap`], [`VnodeCount`] |
//! | the state store | [`StateStore`], [`StateTable`], [`MemoryStore`], [`DurableStore`], [`DurableOptions`] |
//! | errors | [`Error`], [`Result`] |
//!
//! ## Example: a backfill inside an Arrow pipeline
//!
//! Load the upstream table, start a [`BackfillJob`] (a view of it, named) fed by the
//! upstream's changes, collect the downstream. The job checks every change against the table,
//! writes it, closes epochs, and commits a checkpoint as the consumer moves past its barrier;
//! it ends once the source has ended and the backfill has finished.
//!
//! ```
//! use std::sync::Arc;
//!
//! use arrangement_backfill::{
//!     BackfillJob, Change, JobOptions, KeyColumn, MemoryStore, Message, StreamChunk, TableDesc,
//!     load_table,
//! };
//! use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use futures::StreamExt;
//!
//! # fn main() -> arrangement_backfill::Result<()> {
//! # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
//! // 1. An upstream table keyed by `id` (over the default 256 vnodes), loaded and committed.
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("id", DataType::Int64, false),
//!     Field::new("name", DataType::Utf8, true),
//! ]));
//! let rows = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Int64Array::from_iter_values(0..1000)),
//!         Arc::new(StringArray::from_iter_values((0..1000).map(|i| format!("user-{i}")))),
//!     ],
//! )?;
//! let store = MemoryStore::new();
//! let desc = TableDesc::new("users", schema.clone(), vec![KeyColumn::asc("id")])?;
//! load_table(&store, desc, RecordBatchIterator::new([Ok(rows)], schema.clone()))?;
//!
//! // 2. A view of it, fed by the upstream's change stream (here, a channel).
//! let (changes, source) = futures::channel::mpsc::unbounded();
//! let mut job = BackfillJob::start(&store, "users_view", "users", JobOptions::default(), source)?;
//!
//! // 3. The upstream keeps changing while the backfill runs: an update, an insert, a delete
//! //    by key (its other columns NULL), then the source ends.
//! let text = "U- 7 user-7\nU+ 7 renamed\n+ 5000 newcomer\n- 9 NULL";
//! changes.unbounded_send(Ok(Change::Chunk(StreamChunk::from_text(&schema, text)?))).expect("running");
//! drop(changes);
//!
//! // 4. Collect the downstream: every row once, as the table ends.
//! let mut net = 0i64;
//! while let Some(message) = job.next().await {
//!     if let Message::Chunk(chunk) = message? {
//!         net += chunk.ops().iter().map(|op| if op.is_insert() { 1 } else { -1 }).sum::<i64>();
//!     }
//! }
//! assert_eq!(net, 1000);
//! assert!(job.summary().finished);
//! # Ok::<(), arrangement_backfill::Error>(())
//! # })
//! # }
//! ```
//!
//! The contract (identity, epochs, checkpoints, resume, checks) is on [`BackfillJob`]; an
//! exactly-once sink implements [`ExactlyOnceSink`] and runs the job with
//! [`BackfillJob::run`].
//!
//! The same output as changelog batches, for Arrow pipelines: [`BackfillJob::into_changelog`]
//! (a [`ChangelogStream`]); as an Arrow C stream for pyarrow, DuckDB or Polars:
//! [`ChangelogStream::into_reader`] then [`ChangelogReader::into_ffi_stream`] (see
//! `examples/c_stream.rs`). To drive the parts by hand, [`BackfillExecutor::execute`] returns
//! the backfill's output ([`BackfillStream`]) and leaves writing, sealing and committing to the
//! caller.
//!
//! ## The contract
//! After every barrier `e`, for every vnode `v` the backfill owns, the downstream holds
//! exactly the upstream rows of `v` whose key is at or below `v`'s position (I1); once
//! finished, the downstream equals the upstream (I2); the changelog is consistent: no
//! duplicate insert, no delete of a row it does not hold, update pairs whole (I3); positions
//! only grow (I4); progress commits with the data (I5); every active epoch reads snapshot
//! (I6); memory is bounded by batches in flight, not by table size (I7). The oracle tests in
//! `tests/` check I1-I4 against a `BTreeMap` replay after every barrier.
//!
//! ## Modules
//!
//! The design as built (contract, data path, formats, module map): `docs/DESIGN.md`.
//!
//! The modules hold the rest, for those who build on the parts:
//! - [`chunk`]: change chunks (`RecordBatch` + ops), barriers, messages, the changelog layout.
//! - [`vnode`]: vnodes and the persisted, vectorized vnode hash.
//! - [`key`]: primary-key order, arrow-row encoding, positions.
//! - [`table`]: table definitions (schema, key, distribution).
//! - [`store`]: the versioned state store: the in-memory columnar store, and the durable
//!   embedded store (Arrow IPC run files, a manifest and a log of changes, crash-safe
//!   resume), with the file I/O seam that tests inject faults through.
//! - [`merge`]: the k-way merge of per-vnode snapshot streams.
//! - [`backfill`]: progress, the upstream filter, the I/O-free core, the async executor and
//!   the no-shuffle baseline (and, with the `testing` feature, the row-at-a-time reference).
//! - [`job`]: the job ([`BackfillJob`]), its upstream checks, loading a table, the exactly-once
//!   sink interface, and the parallel runtime underneath.
//! - [`dictionary`], [`interleave`]: gathers of rows that keep narrow dictionary keys working.
//!
//! The command-line tool (`backfill`: datasets, replay, verify, gen, its Parquet sink and
//! completion certificate) is the binary target (`src/bin/backfill/`), built on this public
//! API only.
//!
//! ## Cargo features
//! - `cli` (default): the `backfill` command-line tool (the binary target) and its dataset
//!   generators (`clap`, `indicatif`, `tpchgen`, `rand`). `default-features = false` builds the
//!   engine alone.
//! - `testing`: the row-at-a-time reference backfill and test helpers, for tests and
//!   benchmarks; not a stable API.

pub mod backfill;
pub mod chunk;
pub mod dictionary;
mod error;
mod ffi;
pub mod interleave;
pub mod job;
pub mod key;
pub mod merge;
mod runs;
pub mod store;
pub mod table;
pub mod vnode;

pub use backfill::{
    BackfillConfig, BackfillExecutor, BackfillStats, BackfillStream, ChangelogStream,
    MAX_BATCH_SIZE, SnapshotOrder,
};
pub use chunk::{Barrier, BarrierKind, EpochPair, Message, Mutation, Op, StreamChunk, Watermark};
pub use error::{Error, Result};
pub use ffi::ChangelogReader;
pub use job::{
    BackfillJob, Change, ExactlyOnceSink, JobControl, JobOptions, JobProgress, JobSummary,
    LoadProgress, Loaded, ParallelBackfill, PreparedCheckpoint, Recovery, ResumePoint, TableLoader,
    VnodeMap, load_parquet, load_table,
};
pub use key::{KeyColumn, Position, PrimaryKey};
pub use store::{DurableOptions, DurableStore, MemoryStore, StateStore, StateTable};
pub use table::{Distribution, TableDesc};
pub use vnode::{VirtualNode, VnodeBitmap, VnodeCount};
