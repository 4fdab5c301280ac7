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
//! - [`chunk`]: change chunks (`RecordBatch` + ops), barriers, messages.
//! - [`vnode`]: vnodes and the persisted, vectorized vnode hash.
//! - [`key`]: primary-key order, arrow-row encoding, positions.
//! - [`table`]: table definitions (schema, key, distribution).
//! - [`store`]: the versioned state store: the in-memory columnar store, and the durable
//!   embedded store (Arrow IPC run files, an atomic manifest, crash-safe resume), with the
//!   file I/O seam that tests inject faults through.
//! - [`merge`]: the k-way merge of per-vnode snapshot streams.
//! - [`backfill`]: progress, the upstream filter, the I/O-free core, the async executor, the
//!   no-shuffle baseline and the row-at-a-time reference.
//! - [`replay`]: datasets (manifest, Parquet snapshot and changelog), validation, generators
//!   and output verification.
//! - [`job`]: the replay job: source and materialize task, barrier injector, two-phase
//!   Parquet sink.
//!
//! ## Example: a backfill inside an Arrow pipeline
//!
//! Define a table, load batches into the store, start a backfill, push upstream changes and
//! barriers through a channel, collect the downstream batches.
//!
//! ```
//! use std::sync::Arc;
//!
//! use arrangement_backfill::backfill::executor::{BackfillConfig, BackfillExecutor};
//! use arrangement_backfill::chunk::{Barrier, BarrierKind, EpochPair, Message, Op, StreamChunk};
//! use arrangement_backfill::key::KeyColumn;
//! use arrangement_backfill::store::{MemoryStore, StateStore, StateTable};
//! use arrangement_backfill::table::TableDesc;
//! use arrangement_backfill::vnode::VnodeBitmap;
//! use arrow_array::{Int64Array, RecordBatch, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use futures::StreamExt;
//!
//! # fn main() -> arrangement_backfill::Result<()> {
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
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
//! let mut upstream = store.table("users", all_vnodes.clone())?;
//! let rows = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Int64Array::from_iter_values(0..1000)),
//!         Arc::new(StringArray::from_iter_values((0..1000).map(|i| format!("user-{i}")))),
//!     ],
//! )?;
//! upstream.write(&StreamChunk::inserts(rows))?;
//! upstream.seal(1)?;
//! store.commit(1)?;
//!
//! // 3. A backfill reading the upstream's messages from a channel.
//! let (mut tx, rx) = futures::channel::mpsc::channel::<arrangement_backfill::Result<Message>>(16);
//! let backfill = BackfillExecutor::arrangement(&store, "users", all_vnodes, BackfillConfig::default())?;
//! let progress = backfill.progress();
//! let mut downstream = Box::pin(backfill.execute(rx));
//!
//! // 4. The upstream keeps changing while the backfill runs: epoch 2 updates a row and adds one.
//! let mut send = |m| tx.try_send(Ok(m)).expect("channel has room");
//! send(Message::Barrier(Barrier::new(EpochPair::new(2, 1), BarrierKind::Checkpoint)));
//! let changes = StreamChunk::from_text(&schema, "U- 7 user-7\nU+ 7 renamed\n+ 5000 newcomer")?;
//! upstream.write(&changes)?;
//! send(Message::Chunk(changes));
//! upstream.seal(2)?;
//! send(Message::Barrier(Barrier::new(EpochPair::new(3, 2), BarrierKind::Checkpoint)));
//! upstream.seal(3)?;
//! send(Message::Barrier(Barrier::new(EpochPair::new(4, 3), BarrierKind::Checkpoint)));
//!
//! // 5. Collect downstream batches until the last barrier; commit each checkpoint.
//! let mut inserted = 0;
//! while let Some(message) = downstream.next().await {
//!     match message? {
//!         Message::Chunk(chunk) => {
//!             inserted += chunk.ops().iter().filter(|op| **op == Op::Insert).count()
//!         }
//!         Message::Barrier(barrier) => {
//!             if barrier.epoch.prev > 1 {
//!                 store.commit(barrier.epoch.prev)?;
//!             }
//!             if barrier.epoch.curr == 4 {
//!                 break;
//!             }
//!         }
//!         Message::Watermark(_) => {}
//!     }
//! }
//! assert_eq!(inserted, 1001, "every row exactly once, plus the newcomer");
//! assert!(progress.borrow().finished);
//! # Ok::<(), arrangement_backfill::Error>(())
//! # })
//! # }
//! ```
#![warn(missing_docs)]

pub mod backfill;
pub mod chunk;
pub mod error;
pub mod job;
pub mod key;
pub mod merge;
pub mod replay;
pub mod store;
pub mod table;
pub mod vnode;

pub use error::{Error, Result};
