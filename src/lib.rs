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
//! | a job for embedders | [`BackfillJob`]: upstream changes in, the backfill's output out, checkpoints committed |
//! | parallel actors | [`ParallelBackfill`]: a hash dispatcher, N backfill actors (tokio tasks), a barrier-aligned merge, online rescale; [`VnodeMap`], [`JobControl`] (pause, resume, throttle, rescale at the next barrier), [`JobProgress`] |
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
//! Define a table and load its rows, start a [`BackfillJob`] fed by the upstream's changes
//! and barriers, collect the downstream. The job writes the changes to the upstream table,
//! seals it at every barrier and commits the store at every checkpoint collected.
//!
//! ```
//! use std::sync::Arc;
//!
//! use arrangement_backfill::{
//!     BackfillConfig, BackfillJob, Barrier, BarrierKind, EpochPair, KeyColumn, MemoryStore,
//!     Message, Op, StateStore, StateTable, StreamChunk, TableDesc, VnodeBitmap,
//! };
//! use arrow_array::{Int64Array, RecordBatch, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use futures::StreamExt;
//!
//! # fn main() -> arrangement_backfill::Result<()> {
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! // 1. An upstream table keyed by `id`, over the default 256 vnodes.
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("id", DataType::Int64, false),
//!     Field::new("name", DataType::Utf8, true),
//! ]));
//! let store = MemoryStore::new();
//! let desc = store.create_table(TableDesc::new("users", schema.clone(), vec![KeyColumn::asc("id")])?)?;
//! let all_vnodes = VnodeBitmap::full(desc.vnode_count());
//!
//! // 2. Its existing rows, committed at epoch 1.
//! let mut loader = store.table("users", all_vnodes.clone())?;
//! let rows = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Int64Array::from_iter_values(0..1000)),
//!         Arc::new(StringArray::from_iter_values((0..1000).map(|i| format!("user-{i}")))),
//!     ],
//! )?;
//! loader.write(&StreamChunk::inserts(rows))?;
//! loader.seal(1)?;
//! store.commit(1)?;
//!
//! // 3. A backfill job fed by the upstream's change stream (here, a channel).
//! let (mut tx, rx) = futures::channel::mpsc::channel::<arrangement_backfill::Result<Message>>(16);
//! let mut job = BackfillJob::start(&store, "users", all_vnodes, BackfillConfig::default(), rx)?;
//! let progress = job.stats();
//!
//! // 4. The upstream keeps changing while the backfill runs: epoch 2 updates a row and adds one.
//! let mut send = |m| tx.try_send(Ok(m)).expect("channel has room");
//! send(Message::Barrier(Barrier::new(EpochPair::new(2, 1), BarrierKind::Checkpoint)));
//! send(Message::Chunk(StreamChunk::from_text(&schema, "U- 7 user-7\nU+ 7 renamed\n+ 5000 newcomer")?));
//! send(Message::Barrier(Barrier::new(EpochPair::new(3, 2), BarrierKind::Checkpoint)));
//! send(Message::Barrier(Barrier::new(EpochPair::new(4, 3), BarrierKind::Checkpoint)));
//!
//! // 5. Collect downstream batches until the last barrier.
//! let mut inserted = 0;
//! while let Some(message) = job.next().await {
//!     match message? {
//!         Message::Chunk(chunk) => {
//!             inserted += chunk.ops().iter().filter(|op| **op == Op::Insert).count()
//!         }
//!         Message::Barrier(barrier) if barrier.epoch.curr == 4 => break,
//!         _ => {}
//!     }
//! }
//! assert_eq!(inserted, 1001, "every row exactly once, plus the newcomer");
//! assert!(progress.borrow().finished);
//! assert_eq!(store.committed_epoch()?, Some(3));
//! # Ok::<(), arrangement_backfill::Error>(())
//! # })
//! # }
//! ```
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
//! - [`replay`]: datasets (manifest, Parquet snapshot and changelog), validation, generators
//!   (feature `cli`) and output verification.
//! - [`job`]: the embedders' [`BackfillJob`] and the replay job of the command-line tool.
//!
//! ## Cargo features
//! - `cli` (default): the `backfill` command-line tool and the dataset generators (`clap`,
//!   `indicatif`, `tpchgen`, `rand`). `default-features = false` builds the engine alone.
//! - `testing`: the row-at-a-time reference backfill and test helpers, for tests and
//!   benchmarks; not a stable API.

pub mod backfill;
pub mod chunk;
mod dictionary;
mod error;
mod ffi;
mod interleave;
pub mod job;
pub mod key;
pub mod merge;
pub mod replay;
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
pub use job::{BackfillJob, JobControl, JobProgress, ParallelBackfill, VnodeMap};
pub use key::{KeyColumn, Position, PrimaryKey};
pub use store::{DurableOptions, DurableStore, MemoryStore, StateStore, StateTable};
pub use table::{Distribution, TableDesc};
pub use vnode::{VirtualNode, VnodeBitmap, VnodeCount};
