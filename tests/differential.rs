//! Differential tests: the vectorized arrangement backfill (`BackfillExecutor::arrangement`,
//! merged order) against the row-at-a-time reference (`backfill::reference`), fed the same
//! seeded events, compared exactly after every barrier.
//!
//! How the comparison is made exact: the executor decides on its own how many snapshot
//! batches it reads in an epoch (it alternates with the upstream, reads when the upstream is
//! idle, and owes one read per epoch). So per epoch the test
//! 1. sends the epoch's upstream chunks to both (polling the executor a random number of
//!    times in between, so it reads more or less of the snapshot), then the barrier, and
//!    polls the executor until the barrier comes out;
//! 2. takes `N`, the snapshot rows the executor emitted in the epoch
//!    (`BackfillStats::snapshot_rows_this_run`, published after every action), and makes the
//!    reference read exactly `N` snapshot rows (with a first, possibly empty, read whenever
//!    the reference is not finished: the executor reads at least once per epoch, I6);
//! 3. splits the executor's epoch output: its first `N` rows are the snapshot rows (they are
//!    all emitted before the barrier flushes the filtered upstream changes), the rest are the
//!    filtered upstream changes. Both parts must equal the reference's, row for row and in
//!    order (snapshot rows in global key order; changes with their ops, repaired update
//!    pairs included);
//! 4. compares every vnode's persisted progress (state, position, row count) with the
//!    reference's, and the finished flags.
//!
//! At the end the downstream (every output applied strictly) must equal the upstream (I2).

mod common;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use arrangement_backfill::backfill::BackfillStats;
use arrangement_backfill::backfill::reference::{
    ReferenceBackfill, ReferenceProgress, Row, changes_from_chunk, rows_from_batch,
};
use arrangement_backfill::backfill::{
    BackfillConfig, BackfillExecutor, PATCH_BUDGET, SnapshotOrder,
};
use arrangement_backfill::backfill::{ProgressCodec, VnodeProgress};
use arrangement_backfill::chunk::{Barrier, BarrierKind, EpochPair, Message, Op, StreamChunk};
use arrangement_backfill::store::{MemoryStore, MemoryTable, StateStore, StateTable};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::VnodeBitmap;
use common::changes::{Changes, Mix, random_rows};
use common::{Key, Shape, batch_of, rows_of, table_desc};
use futures::channel::mpsc;
use futures::{FutureExt, Stream, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

type Output = Pin<Box<dyn Stream<Item = arrangement_backfill::Result<Message>> + Send>>;

const PROGRESS: &str = "t.backfill_progress";

/// The upstream's changes: every kind but changes at a vnode's position.
const MIX: Mix = Mix {
    insert: 35,
    delete: 20,
    update: 25,
    delete_insert: 10,
    moving_update: 10,
    at_position: 0,
    distinct_new_keys: false,
};

/// One differential case.
#[derive(Debug, Clone, Copy)]
struct Case {
    shape: Shape,
    vnodes: usize,
    batch_size: usize,
    initial_rows: usize,
    seed: u64,
    /// The executor's [`BackfillConfig::patch_budget`].
    patch_budget: usize,
}

/// Both backfills over one upstream, driven in step.
struct Run {
    case: Case,
    rng: StdRng,
    store: MemoryStore,
    desc: Arc<TableDesc>,
    upstream: MemoryTable,
    tx: mpsc::UnboundedSender<arrangement_backfill::Result<Message>>,
    out: Output,
    stats: watch::Receiver<BackfillStats>,
    reference: ReferenceBackfill,
    /// The upstream table now.
    u: BTreeMap<Key, i64>,
    /// The executor's downstream table.
    d: BTreeMap<Key, i64>,
    /// The last barrier sent.
    epoch: EpochPair,
    /// Snapshot rows the executor had emitted at the last barrier.
    snapshot_seen: u64,
}

impl Run {
    fn new(case: Case) -> Self {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let store = MemoryStore::new();
        let desc = store
            .create_table(table_desc(case.shape, case.vnodes))
            .unwrap();
        let owned = VnodeBitmap::full(desc.vnode_count());
        let mut upstream = store.table("t", owned.clone()).unwrap();
        let mut reference = ReferenceBackfill::new(desc.clone(), &owned, case.batch_size).unwrap();
        let u = random_rows(
            case.shape,
            &mut rng,
            case.initial_rows,
            case.initial_rows.max(20) * 2,
        );
        if !u.is_empty() {
            let rows: Vec<(Key, i64)> = u.iter().map(|(k, v)| (k.clone(), *v)).collect();
            let batch = batch_of(case.shape, &rows);
            upstream
                .write(&StreamChunk::inserts(batch.clone()))
                .unwrap();
            reference.load(&batch).unwrap();
        }
        upstream.seal(1).unwrap();
        store.commit(1).unwrap();

        let (tx, rx) = mpsc::unbounded();
        let config = BackfillConfig {
            batch_size: case.batch_size,
            order: SnapshotOrder::Merged,
            patch_budget: case.patch_budget,
            ..BackfillConfig::default()
        };
        let exec = BackfillExecutor::arrangement(&store, "t", owned, config).unwrap();
        let stats = exec.stats();
        let out: Output = Box::pin(exec.execute(rx));
        let mut run = Self {
            case,
            rng,
            store,
            desc,
            upstream,
            tx,
            out,
            stats,
            reference,
            u,
            d: BTreeMap::new(),
            epoch: EpochPair::new(1, 0),
            snapshot_seen: 0,
        };
        // The first barrier: nothing is read or emitted before it.
        let first = run.barrier(false);
        assert!(first.is_empty(), "output before the first barrier");
        run
    }

    /// Sends a barrier (the upstream seals its epoch first), polls until it comes out and
    /// returns the chunks emitted meanwhile. A checkpoint barrier is committed.
    fn barrier(&mut self, checkpoint: bool) -> Vec<StreamChunk> {
        let pair = self.epoch.next(self.epoch.curr + 1);
        if pair.prev > 1 {
            self.upstream.seal(pair.prev).unwrap();
        }
        let kind = if checkpoint {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Normal
        };
        self.tx
            .unbounded_send(Ok(Message::Barrier(Barrier::new(pair, kind))))
            .unwrap();
        let mut chunks = Vec::new();
        for _ in 0..1_000_000 {
            match self.poll() {
                Some(Message::Barrier(b)) => {
                    assert_eq!(b.epoch, pair, "{:?}", self.case);
                    self.epoch = pair;
                    if checkpoint {
                        self.store.commit(pair.prev).unwrap();
                    }
                    return chunks;
                }
                Some(Message::Chunk(c)) => chunks.push(c),
                Some(Message::Watermark(_)) => {}
                None => panic!(
                    "executor pending with a barrier in flight ({:?})",
                    self.case
                ),
            }
        }
        panic!("barrier {pair:?} never came out ({:?})", self.case);
    }

    /// Polls the executor once; `None` when it is pending.
    fn poll(&mut self) -> Option<Message> {
        match self.out.next().now_or_never()? {
            None => panic!("executor ended ({:?})", self.case),
            Some(Err(e)) => panic!("executor failed: {e} ({:?})", self.case),
            Some(Ok(message)) => Some(message),
        }
    }

    /// One epoch: chunks, random polls, a checkpoint barrier, and the comparison.
    fn epoch(&mut self) {
        let mut chunks = Vec::new();
        for _ in 0..self.rng.random_range(0..4) {
            let chunk = self.random_chunk();
            self.upstream.write(&chunk).unwrap();
            self.reference.on_upstream_chunk(&chunk).unwrap();
            self.tx.unbounded_send(Ok(Message::Chunk(chunk))).unwrap();
            for _ in 0..self.rng.random_range(0..3) {
                match self.poll() {
                    Some(Message::Chunk(c)) => chunks.push(c),
                    Some(m) => panic!("unexpected {m:?} before the barrier"),
                    None => break,
                }
            }
        }
        let was_finished = self.reference.is_finished();
        chunks.extend(self.barrier(true));
        let stats = self.stats.borrow().clone();
        let n = (stats.snapshot_rows_this_run - self.snapshot_seen) as usize;
        self.snapshot_seen = stats.snapshot_rows_this_run;

        // Executor output: the first `n` rows are the snapshot rows, then the changes.
        let mut output: Vec<(Op, Row)> = Vec::new();
        for chunk in &chunks {
            self.apply(chunk);
            output.extend(changes_from_chunk(chunk).unwrap());
        }
        assert!(output.len() >= n, "{:?}", self.case);
        let changes = output.split_off(n);
        let snapshot = output;
        assert!(snapshot.iter().all(|(op, _)| *op == Op::Insert));

        let expected_snapshot = if was_finished {
            Vec::new()
        } else {
            self.reference.read_snapshot_rows(n).unwrap()
        };
        let got_snapshot: Vec<Row> = snapshot.into_iter().map(|(_, r)| r).collect();
        assert_eq!(
            got_snapshot, expected_snapshot,
            "snapshot rows of epoch {} ({:?})",
            self.epoch.prev, self.case
        );
        let expected_changes = self.reference.on_barrier().unwrap();
        assert_eq!(
            changes, expected_changes,
            "filtered changes of epoch {} ({:?})",
            self.epoch.prev, self.case
        );
        self.check_progress();
        assert_eq!(
            stats.finished,
            self.reference.is_finished(),
            "finished flag after epoch {} ({:?})",
            self.epoch.prev,
            self.case
        );
    }

    /// The executor's persisted progress equals the reference's, vnode by vnode.
    fn check_progress(&self) {
        let codec = ProgressCodec::new(PROGRESS, self.desc.pk(), self.desc.vnode_count()).unwrap();
        let owned = VnodeBitmap::full(self.desc.vnode_count());
        let table = self.store.table(PROGRESS, owned.clone()).unwrap();
        let persisted = codec.restore(&table, owned, self.epoch.prev).unwrap();
        for (vnode, expected) in self.reference.progress_iter() {
            let got = match persisted.get(vnode).unwrap() {
                VnodeProgress::NotStarted => ReferenceProgress::NotStarted,
                VnodeProgress::InProgress { pos, rows } => {
                    let key = pos.to_batch(self.desc.pk()).unwrap();
                    ReferenceProgress::InProgress {
                        pos: rows_from_batch(&key).unwrap().remove(0),
                        rows: *rows,
                    }
                }
                VnodeProgress::Completed { rows } => ReferenceProgress::Completed { rows: *rows },
            };
            assert_eq!(
                &got, expected,
                "progress of vnode {vnode} after epoch {} ({:?})",
                self.epoch.prev, self.case
            );
        }
    }

    /// Applies an output chunk to the downstream table, strictly (I3).
    fn apply(&mut self, chunk: &StreamChunk) {
        for ((key, v), op) in rows_of(self.case.shape, chunk.batch())
            .into_iter()
            .zip(chunk.ops())
        {
            if op.is_insert() {
                assert!(self.d.insert(key, v).is_none(), "{:?}", self.case);
            } else {
                assert_eq!(self.d.remove(&key), Some(v), "{:?}", self.case);
            }
        }
    }

    /// A random valid chunk of upstream changes, applied to the model.
    fn random_chunk(&mut self) -> StreamChunk {
        Changes::new(self.case.shape, self.case.initial_rows, MIX)
            .chunk(&mut self.rng, &mut self.u, 6)
            .expect("a mix without position changes makes a chunk")
    }

    /// Epochs until both are finished, then a few pass-through epochs; then I2.
    fn run(mut self) {
        let mut epochs = 0;
        while !self.reference.is_finished() || !self.stats.borrow().finished {
            self.epoch();
            epochs += 1;
            assert!(epochs < 2_000, "did not finish ({:?})", self.case);
        }
        for _ in 0..3 {
            self.epoch();
        }
        assert_eq!(self.d, self.u, "I2 ({:?})", self.case);
    }
}

fn matrix(shape: Shape, patch_budget: usize) -> usize {
    let mut cases = 0;
    for vnodes in [1, 4, 256] {
        for batch_size in [1, 7, 1024] {
            for seed in 0..4u64 {
                let case = Case {
                    shape,
                    vnodes,
                    batch_size,
                    // Tables of several batches, so that most epochs end InProgress.
                    initial_rows: [0, 25, 150, 40][seed as usize]
                        + [0, 4, 12, 2][seed as usize] * batch_size,
                    seed: 0xD1FF + seed * 101 + vnodes as u64 * 7 + batch_size as u64,
                    patch_budget,
                };
                Run::new(case).run();
                cases += 1;
            }
        }
    }
    cases
}

#[test]
fn arrangement_backfill_matches_reference_int64_key() {
    assert_eq!(matrix(Shape::Int64, PATCH_BUDGET), 36);
}

#[test]
fn arrangement_backfill_matches_reference_composite_key() {
    assert_eq!(matrix(Shape::Composite, PATCH_BUDGET), 36);
}

/// Every touched scan opened afresh from the store (no patch fits a budget of 0).
#[test]
fn arrangement_backfill_matches_reference_when_scans_restart_from_the_store() {
    assert_eq!(matrix(Shape::Int64, 0), 36);
}

/// A budget of a few rows' changes: touched scans are patched until the patches held pass
/// it, then opened afresh, so both ways (and patches dropped by a restart) meet.
#[test]
fn arrangement_backfill_matches_reference_with_a_small_patch_budget() {
    assert_eq!(matrix(Shape::Composite, 2048), 36);
}
