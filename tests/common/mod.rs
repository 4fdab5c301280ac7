//! The oracle harness: an upstream table, a seeded stream of changes, the backfill executor
//! under a seeded scheduler, and a `BTreeMap` replay that checks the contract (docs/DESIGN.md
//! section 2.1) after every barrier.
//!
//! ```text
//!   seeded scheduler ──▶ upstream model U (BTreeMap) ──▶ upstream table (store) ──┐
//!        │                    │                                                    │ replicated reads
//!        │                    └──▶ Message::Chunk / Barrier ──▶ executor ◀─────────┘
//!        │                                                         │
//!        └── poll (now_or_never) ◀──────────── output messages ◀───┘──▶ downstream model D
//! ```
//!
//! Checks: I3 while applying output to D (strict inserts, deletes of the exact row, U-/U+
//! pairs); I1 per vnode after every barrier, with positions read back from the progress
//! table; I4 between barriers; I2 at the end; I6 by requiring the run to finish within a
//! bounded number of barriers while the upstream stays busy.
//!
//! The helpers every integration test may share live in submodules:
//! - [`changes`]: the seeded change generator (this harness's, the differential and actor
//!   tests');
//! - [`cli`]: running the `backfill` binary and reading its output directory;
//! - [`dataset`]: dataset directories written by hand, Parquet files read back;
//! - [`files`]: directory trees compared byte for byte;
//! - [`s3`]: a local S3 protocol server (moto) and uploads to it.
//!
//! Every test file that says `mod common;` compiles all of it, hence `dead_code` allowed.

#![allow(dead_code)]

pub mod changes;
#[cfg(feature = "cli")]
pub mod cli;
pub mod dataset;
pub mod files;
#[cfg(feature = "cli")]
pub mod s3;

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;

use arrangement_backfill::backfill::BackfillStats;
use arrangement_backfill::backfill::{BackfillConfig, BackfillExecutor, SnapshotOrder};
use arrangement_backfill::backfill::{ProgressCodec, ProgressMap, VnodeProgress};
use arrangement_backfill::chunk::{
    Barrier, BarrierKind, EpochPair, Message, Mutation, Op, StreamChunk,
};
use arrangement_backfill::key::{KeyColumn, Position};
use arrangement_backfill::store::{MemoryStore, MemoryTable, StateStore, StateTable};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VirtualNode, VnodeBitmap, VnodeCount};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::channel::mpsc;
use futures::{FutureExt, Stream, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use changes::{Changes, Mix, random_rows};

/// The table's key shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `k Int64` key, `v Int64` value.
    Int64,
    /// `(s Utf8 asc, i Int32 desc)` key distributed by `s` only, `v Int64` value.
    Composite,
}

/// Which backfill runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Per-vnode progress.
    Arrangement,
    /// One global position.
    NoShuffle,
}

/// A key of the test table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// Int64 shape.
    Int(i64),
    /// Composite shape.
    Comp(String, i32),
}

/// One oracle case.
#[derive(Debug, Clone)]
pub struct Params {
    pub shape: Shape,
    pub kind: Kind,
    pub vnodes: usize,
    pub batch_size: usize,
    pub checkpoint_every: u64,
    pub initial_rows: usize,
    pub order: SnapshotOrder,
    pub steps: usize,
    pub seed: u64,
    /// Restart (crash and recover from the last checkpoint) with this probability per barrier.
    pub restart_prob: f64,
}

impl Params {
    pub fn new(shape: Shape, kind: Kind, seed: u64) -> Self {
        Self {
            shape,
            kind,
            vnodes: 4,
            batch_size: 7,
            checkpoint_every: 1,
            initial_rows: 60,
            order: SnapshotOrder::Merged,
            steps: 60,
            seed,
            restart_prob: 0.0,
        }
    }
}

/// The last checkpoint: its epoch, the upstream and the downstream as of it.
type Committed = (u64, BTreeMap<Key, i64>, BTreeMap<Key, i64>);

type Output = Pin<Box<dyn Stream<Item = arrangement_backfill::Result<Message>> + Send>>;

/// The harness: upstream, executor, models.
pub struct Harness {
    pub p: Params,
    rng: StdRng,
    pub store: MemoryStore,
    pub desc: Arc<TableDesc>,
    upstream: MemoryTable,
    tx: mpsc::UnboundedSender<arrangement_backfill::Result<Message>>,
    out: Output,
    pub stats: watch::Receiver<BackfillStats>,
    /// The upstream table now.
    pub u: BTreeMap<Key, i64>,
    /// The downstream table: every emitted change applied in order.
    pub d: BTreeMap<Key, i64>,
    /// The open epoch.
    epoch: u64,
    last_epoch_used: u64,
    closed: u64,
    barriers: u64,
    committed: Option<Committed>,
    /// The upstream as of each barrier still in flight (sent, not yet seen at the output).
    in_flight: Vec<(EpochPair, bool, BTreeMap<Key, i64>)>,
    last_progress: Option<ProgressMap>,
    pub snapshot_rows_seen: u64,
    pub ended: bool,
    pub restarts: usize,
}

pub const PROGRESS: &str = "t.backfill_progress";

/// The harness's changes: every kind, and a few right at a vnode's position.
const MIX: Mix = Mix {
    insert: 30,
    delete: 20,
    update: 25,
    delete_insert: 10,
    moving_update: 8,
    at_position: 7,
    distinct_new_keys: false,
};

pub fn schema(shape: Shape) -> SchemaRef {
    Arc::new(Schema::new(match shape {
        Shape::Int64 => vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ],
        Shape::Composite => vec![
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, false),
            Field::new("v", DataType::Int64, false),
        ],
    }))
}

pub fn table_desc(shape: Shape, vnodes: usize) -> TableDesc {
    let count = VnodeCount::new(vnodes).unwrap();
    match shape {
        Shape::Int64 => TableDesc::new("t", schema(shape), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(count),
        Shape::Composite => TableDesc::new(
            "t",
            schema(shape),
            vec![KeyColumn::asc("s"), KeyColumn::desc("i")],
        )
        .unwrap()
        .with_distribution_key(&["s"])
        .unwrap()
        .with_vnode_count(count),
    }
}

pub fn batch_of(shape: Shape, rows: &[(Key, i64)]) -> RecordBatch {
    let values = Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1)));
    match shape {
        Shape::Int64 => RecordBatch::try_new(
            schema(shape),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(
                    |r| match &r.0 {
                        Key::Int(k) => *k,
                        Key::Comp(..) => unreachable!(),
                    },
                ))),
                values,
            ],
        )
        .unwrap(),
        Shape::Composite => {
            let (s, i): (Vec<String>, Vec<i32>) = rows
                .iter()
                .map(|r| match &r.0 {
                    Key::Comp(s, i) => (s.clone(), *i),
                    Key::Int(_) => unreachable!(),
                })
                .unzip();
            RecordBatch::try_new(
                schema(shape),
                vec![
                    Arc::new(StringArray::from(s)),
                    Arc::new(Int32Array::from(i)),
                    values,
                ],
            )
            .unwrap()
        }
    }
}

pub fn rows_of(shape: Shape, batch: &RecordBatch) -> Vec<(Key, i64)> {
    let n = batch.num_rows();
    match shape {
        Shape::Int64 => {
            let k = batch.column(0).as_primitive::<Int64Type>();
            let v = batch.column(1).as_primitive::<Int64Type>();
            (0..n).map(|i| (Key::Int(k.value(i)), v.value(i))).collect()
        }
        Shape::Composite => {
            let s = batch.column(0).as_string::<i32>();
            let i32s = batch.column(1).as_primitive::<Int32Type>();
            let v = batch.column(2).as_primitive::<Int64Type>();
            (0..n)
                .map(|i| (Key::Comp(s.value(i).to_string(), i32s.value(i)), v.value(i)))
                .collect()
        }
    }
}

impl Harness {
    /// Loads the initial table, commits it at epoch 1 and starts the executor.
    pub fn new(p: Params) -> Self {
        let mut rng = StdRng::seed_from_u64(p.seed);
        let store = MemoryStore::new();
        let desc = store.create_table(table_desc(p.shape, p.vnodes)).unwrap();
        let mut upstream = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        let u = random_rows(p.shape, &mut rng, p.initial_rows, p.initial_rows);
        if !u.is_empty() {
            let rows: Vec<(Key, i64)> = u.iter().map(|(k, v)| (k.clone(), *v)).collect();
            upstream
                .write(&StreamChunk::inserts(batch_of(p.shape, &rows)))
                .unwrap();
        }
        upstream.seal(1).unwrap();
        store.commit(1).unwrap();
        let (tx, out, stats) = start(&store, &p);
        let mut h = Self {
            p,
            rng,
            store,
            desc,
            upstream,
            tx,
            out,
            stats,
            u: u.clone(),
            d: BTreeMap::new(),
            epoch: 1,
            last_epoch_used: 1,
            closed: 1,
            barriers: 0,
            committed: Some((1, u, BTreeMap::new())),
            in_flight: Vec::new(),
            last_progress: None,
            snapshot_rows_seen: 0,
            ended: false,
            restarts: 0,
        };
        h.send_barrier(false, None);
        h
    }

    fn next_epoch(&mut self) -> EpochPair {
        self.last_epoch_used += 1;
        let pair = EpochPair::new(self.last_epoch_used, self.epoch);
        self.epoch = pair.curr;
        self.closed = pair.prev;
        pair
    }

    /// Sends a barrier (the upstream seals its epoch first) and waits for it at the output.
    pub fn send_barrier(&mut self, checkpoint: bool, mutation: Option<Mutation>) {
        self.queue_barrier(checkpoint, mutation);
        let pair = self.in_flight.last().map(|(pair, _, _)| *pair).unwrap();
        // Poll until the barrier comes out: the executor must never stall a barrier.
        let mut polls = 0;
        while !self.in_flight.is_empty() {
            polls += 1;
            assert!(
                polls < 1_000_000,
                "barrier {pair:?} never came out ({:?})",
                self.p
            );
            if !self.poll() {
                panic!(
                    "executor pending with a barrier in flight: deadlock ({:?})",
                    self.p
                );
            }
        }
    }

    /// Polls the executor once; returns false when it is pending or ended.
    pub fn poll(&mut self) -> bool {
        match self.out.next().now_or_never() {
            None => false,
            Some(None) => {
                self.ended = true;
                false
            }
            Some(Some(Err(e))) => panic!("executor failed: {e} ({:?})", self.p),
            Some(Some(Ok(message))) => {
                self.on_output(message);
                true
            }
        }
    }

    /// Polls until the executor is pending (it has nothing more to do without input).
    pub fn drain(&mut self) {
        let mut polls = 0;
        while self.poll() {
            polls += 1;
            assert!(polls < 1_000_000, "executor never settles ({:?})", self.p);
        }
    }

    fn on_output(&mut self, message: Message) {
        match message {
            Message::Chunk(chunk) => self.apply_output(&chunk),
            Message::Watermark(_) => {}
            Message::Barrier(barrier) => {
                let (pair, checkpoint, u_at) = self.in_flight.remove(0);
                assert_eq!(barrier.epoch, pair, "barriers come out in order");
                assert_eq!(barrier.is_checkpoint(), checkpoint);
                self.check_prefix(pair.prev, &u_at);
                if checkpoint {
                    self.store.commit(pair.prev).unwrap();
                    self.committed = Some((pair.prev, u_at, self.d.clone()));
                }
            }
        }
    }

    /// I3: applies output changes strictly.
    fn apply_output(&mut self, chunk: &StreamChunk) {
        let rows = rows_of(self.p.shape, chunk.batch());
        let ops = chunk.ops();
        let mut i = 0;
        while i < rows.len() {
            let (key, v) = &rows[i];
            match ops[i] {
                Op::Insert => {
                    assert!(
                        self.d.insert(key.clone(), *v).is_none(),
                        "I3: insert of a key the downstream holds: {key:?} ({:?})",
                        self.p
                    );
                    self.snapshot_rows_seen += 1;
                }
                Op::Delete => {
                    assert_eq!(
                        self.d.remove(key),
                        Some(*v),
                        "I3: delete of a row the downstream does not hold as is: {key:?} ({:?})",
                        self.p
                    );
                }
                Op::UpdateDelete => {
                    assert_eq!(ops.get(i + 1), Some(&Op::UpdateInsert), "I3: U- without U+");
                    assert_eq!(
                        self.d.remove(key),
                        Some(*v),
                        "I3: U- of a row the downstream does not hold as is: {key:?} ({:?})",
                        self.p
                    );
                    let (key2, v2) = &rows[i + 1];
                    assert!(
                        self.d.insert(key2.clone(), *v2).is_none(),
                        "I3: U+ of a key the downstream holds: {key2:?} ({:?})",
                        self.p
                    );
                    i += 1;
                }
                Op::UpdateInsert => panic!("I3: U+ without U- ({:?})", self.p),
            }
            i += 1;
        }
    }

    /// Reads the persisted progress at `epoch`.
    pub fn progress_at(&self, epoch: u64) -> ProgressMap {
        let codec = ProgressCodec::new(PROGRESS, self.desc.pk(), self.desc.vnode_count()).unwrap();
        let owned = VnodeBitmap::full(self.desc.vnode_count());
        let table = self.store.table(PROGRESS, owned.clone()).unwrap();
        codec.restore(&table, owned, epoch).unwrap()
    }

    fn key_bytes(&self, rows: &[(Key, i64)]) -> (Vec<Vec<u8>>, Vec<VirtualNode>) {
        let batch = batch_of(self.p.shape, rows);
        let keys = self.desc.pk().encode(&batch).unwrap();
        let vnodes = self.desc.vnodes_of(&batch).unwrap();
        (
            (0..rows.len()).map(|i| keys.value(i).to_vec()).collect(),
            vnodes,
        )
    }

    /// I1 (and I4): after the barrier closing `epoch`, the downstream holds exactly the
    /// upstream rows at or below each vnode's position.
    fn check_prefix(&mut self, epoch: u64, u_at: &BTreeMap<Key, i64>) {
        let progress = self.progress_at(epoch);
        let u_rows: Vec<(Key, i64)> = u_at.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let (u_keys, u_vnodes) = self.key_bytes(&u_rows);
        let mut expected: BTreeMap<Key, i64> = BTreeMap::new();
        for (i, (key, v)) in u_rows.iter().enumerate() {
            let keep = match progress.get(u_vnodes[i]).unwrap() {
                VnodeProgress::NotStarted => false,
                VnodeProgress::Completed { .. } => true,
                VnodeProgress::InProgress { pos, .. } => u_keys[i].as_slice() <= pos.as_bytes(),
            };
            if keep {
                expected.insert(key.clone(), *v);
            }
        }
        if expected != self.d {
            let missing: Vec<_> = expected
                .iter()
                .filter(|(k, _)| !self.d.contains_key(k))
                .take(5)
                .collect();
            let extra: Vec<_> = self
                .d
                .iter()
                .filter(|(k, _)| !expected.contains_key(k))
                .take(5)
                .collect();
            panic!(
                "I1 violated after epoch {epoch}: missing {missing:?}, extra {extra:?} \
                 (sizes {} vs {}) ({:?})",
                expected.len(),
                self.d.len(),
                self.p
            );
        }
        if let Some(previous) = &self.last_progress {
            for (vnode, before) in previous.iter() {
                let after = progress.get(vnode).unwrap();
                let ok = match (before, after) {
                    (VnodeProgress::NotStarted, _) => true,
                    (
                        VnodeProgress::InProgress { pos: a, .. },
                        VnodeProgress::InProgress { pos: b, .. },
                    ) => a <= b,
                    (VnodeProgress::InProgress { .. }, VnodeProgress::Completed { .. }) => true,
                    (VnodeProgress::Completed { .. }, VnodeProgress::Completed { .. }) => true,
                    _ => false,
                };
                assert!(
                    ok,
                    "I4: vnode {vnode} went from {before:?} to {after:?} ({:?})",
                    self.p
                );
            }
        }
        self.last_progress = Some(progress);
    }

    /// Applies a chunk written in the text form (`+ k v`, `U- k v`, ...) upstream and sends it.
    /// Int64 shape only; the changes must be valid against the upstream model.
    pub fn push_text(&mut self, text: &str) {
        let chunk = StreamChunk::from_text(&schema(self.p.shape), text).unwrap();
        for ((key, v), op) in rows_of(self.p.shape, chunk.batch())
            .into_iter()
            .zip(chunk.ops())
        {
            if op.is_insert() {
                assert!(
                    self.u.insert(key, v).is_none(),
                    "test bug: insert of an existing key"
                );
            } else {
                assert_eq!(
                    self.u.remove(&key),
                    Some(v),
                    "test bug: delete of another row"
                );
            }
        }
        self.upstream.write(&chunk).unwrap();
        self.tx.unbounded_send(Ok(Message::Chunk(chunk))).unwrap();
    }

    /// Queues a barrier without waiting for it (the upstream stays ready).
    /// The first barrier of an executor closes the committed epoch, which is sealed already.
    pub fn queue_barrier(&mut self, checkpoint: bool, mutation: Option<Mutation>) {
        let first = self.barriers == 0;
        let pair = self.next_epoch();
        if !first {
            self.upstream.seal(pair.prev).unwrap();
        }
        let kind = if checkpoint {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Normal
        };
        let mut barrier = Barrier::new(pair, kind);
        barrier.mutation = mutation;
        self.barriers += 1;
        self.in_flight.push((pair, checkpoint, self.u.clone()));
        self.tx
            .unbounded_send(Ok(Message::Barrier(barrier)))
            .unwrap();
    }

    /// The open epoch's predecessor: the epoch the last barrier closed.
    pub fn last_closed_epoch(&self) -> u64 {
        self.closed
    }

    /// Applies a random valid chunk of changes upstream and sends it to the executor.
    pub fn push_changes(&mut self, max: usize) {
        let changes = Changes::new(self.p.shape, self.p.initial_rows, MIX);
        let (shape, desc, progress) = (self.p.shape, &self.desc, self.last_progress.as_ref());
        let at_position = |rng: &mut StdRng| key_at_a_position(shape, desc, progress?, rng);
        let Some(chunk) = changes.chunk_at(&mut self.rng, &mut self.u, max, at_position) else {
            return;
        };
        self.upstream.write(&chunk).unwrap();
        self.tx.unbounded_send(Ok(Message::Chunk(chunk))).unwrap();
    }

    /// A barrier, a checkpoint every `checkpoint_every`.
    pub fn barrier(&mut self) {
        let checkpoint = self.barriers.is_multiple_of(self.p.checkpoint_every);
        self.send_barrier(checkpoint, None);
        if self.p.restart_prob > 0.0 && self.rng.random_bool(self.p.restart_prob) {
            self.restart();
        }
    }

    /// Crashes and recovers: drops everything after the last checkpoint, including the
    /// downstream output of uncommitted epochs, and starts a new executor.
    pub fn restart(&mut self) {
        let (epoch, u, d) = self.committed.clone().unwrap();
        self.store.discard_uncommitted().unwrap();
        self.u = u;
        self.d = d;
        self.epoch = epoch;
        self.upstream = self
            .store
            .table("t", VnodeBitmap::full(self.desc.vnode_count()))
            .unwrap();
        let (tx, out, stats) = start(&self.store, &self.p);
        self.tx = tx;
        self.out = out;
        self.stats = stats;
        self.barriers = 0;
        self.last_progress = None;
        self.restarts += 1;
        self.send_barrier(false, None);
    }

    /// One random scheduling step.
    pub fn random_step(&mut self) {
        match self.rng.random_range(0..100) {
            0..35 => self.push_changes(6),
            35..80 => {
                self.poll();
            }
            _ => self.barrier(),
        }
    }

    pub fn finished(&self) -> bool {
        self.stats.borrow().finished
    }

    /// Random steps, then barriers until finished, then I2.
    pub fn run(mut self) -> Self {
        for _ in 0..self.p.steps {
            self.random_step();
        }
        let mut barriers = 0;
        while !self.finished() {
            self.push_changes(3);
            self.drain();
            self.barrier();
            barriers += 1;
            assert!(barriers < 50, "I6: backfill did not finish ({:?})", self.p);
        }
        // A few more epochs as a pass-through.
        for _ in 0..3 {
            self.push_changes(4);
            self.drain();
            self.send_barrier(true, None);
        }
        self.check_finish();
        self
    }

    /// I2: the downstream equals the upstream.
    pub fn check_finish(&self) {
        assert_eq!(
            self.d, self.u,
            "I2: downstream != upstream after finishing ({:?})",
            self.p
        );
    }
}

pub fn random_key(shape: Shape, rng: &mut StdRng, domain: usize) -> Key {
    match shape {
        Shape::Int64 => Key::Int(rng.random_range(0..domain as i64)),
        Shape::Composite => {
            let letters = (domain as f64).sqrt().ceil() as u8 + 1;
            let s: String = (0..rng.random_range(1..=2))
                .map(|_| char::from(b'a' + rng.random_range(0..letters.min(26))))
                .collect();
            Key::Comp(s, rng.random_range(-(domain as i32)..domain as i32))
        }
    }
}

/// The key at a random vnode's position in `progress`, if any vnode has one.
fn key_at_a_position(
    shape: Shape,
    desc: &TableDesc,
    progress: &ProgressMap,
    rng: &mut StdRng,
) -> Option<Key> {
    let positions: Vec<&Position> = progress.iter().filter_map(|(_, p)| p.position()).collect();
    if positions.is_empty() {
        return None;
    }
    let pos = positions[rng.random_range(0..positions.len())];
    let key_batch = pos.to_batch(desc.pk()).unwrap();
    Some(match shape {
        Shape::Int64 => Key::Int(key_batch.column(0).as_primitive::<Int64Type>().value(0)),
        Shape::Composite => Key::Comp(
            key_batch.column(0).as_string::<i32>().value(0).to_string(),
            key_batch.column(1).as_primitive::<Int32Type>().value(0),
        ),
    })
}

fn start(
    store: &MemoryStore,
    p: &Params,
) -> (
    mpsc::UnboundedSender<arrangement_backfill::Result<Message>>,
    Output,
    watch::Receiver<BackfillStats>,
) {
    let (tx, rx) = mpsc::unbounded();
    let config = BackfillConfig {
        batch_size: p.batch_size,
        order: p.order,
        ..BackfillConfig::default()
    };
    let owned = VnodeBitmap::full(VnodeCount::new(p.vnodes).unwrap());
    let (out, stats): (Output, _) = match p.kind {
        Kind::Arrangement => {
            let exec = BackfillExecutor::arrangement(store, "t", owned, config).unwrap();
            let stats = exec.stats();
            (Box::pin(exec.execute(rx)), stats)
        }
        Kind::NoShuffle => {
            let exec = BackfillExecutor::no_shuffle(store, "t", owned, config).unwrap();
            let stats = exec.stats();
            (Box::pin(exec.execute(rx)), stats)
        }
    };
    (tx, out, stats)
}

/// Per-vnode snapshot row counts (for pitfall tests).
pub fn vnode_rows(h: &Harness, epoch: u64) -> HashMap<VirtualNode, u64> {
    h.progress_at(epoch)
        .iter()
        .map(|(v, p)| (v, p.rows()))
        .collect()
}
