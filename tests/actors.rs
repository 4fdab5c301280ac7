//! Oracle tests of the parallel runtime: N backfill actors behind the hash dispatcher and the
//! barrier-aligned merge, with random pauses, throttles, online rescales (N to 1, 1 to N,
//! while paused or throttled) and crashes with a resume at another parallelism, checked
//! against a `BTreeMap` replay after every barrier (I1, I3, I4) and at the end (I2).
//!
//! ```text
//!   producer (this test) ──▶ upstream table + bounded channel ──▶ ParallelBackfill ──▶ consumer task
//!     │ seeded changes, barriers,                                     ▲                  │ I3 per change, I1/I4 per
//!     │ control requests, crashes                                     └── committed(e) ◀─┤ barrier, commits checkpoints
//!     └──────────── waits for each barrier at the output (with a timeout) ◀──────────────┘
//! ```
//!
//! Every wait is wrapped in a timeout, so a deadlock fails the case (naming it) instead of
//! hanging the test. Every case is reproducible from the parameters printed on failure.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrangement_backfill::backfill::{
    BackfillConfig, BackfillStats, ProgressCodec, ProgressMap, VnodeProgress,
};
use arrangement_backfill::chunk::{Barrier, BarrierKind, EpochPair, Message, Op, StreamChunk};
use arrangement_backfill::job::{JobControl, ParallelBackfill, VnodeMap};
use arrangement_backfill::store::{MemoryStore, MemoryTable, StateStore, StateTable};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount};
use common::changes::{Changes, Mix, random_rows};
use common::{Key, PROGRESS, Shape, batch_of, rows_of, table_desc};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{oneshot, watch};

/// The longest any single wait may take before the case counts as deadlocked.
const DEADLOCK: Duration = Duration::from_secs(30);

/// The upstream's changes: inserts, deletes, updates in place and updates that move a row to
/// another key (maybe another actor); a chunk's new keys are keys it does not hold yet.
const MIX: Mix = Mix {
    insert: 35,
    delete: 20,
    update: 30,
    delete_insert: 0,
    moving_update: 15,
    at_position: 0,
    distinct_new_keys: true,
};

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    vnodes: usize,
    actors: usize,
    batch_size: usize,
    checkpoint_every: u64,
    initial_rows: usize,
    steps: usize,
    seed: u64,
    /// Per barrier: the chance of a control request (pause, resume, throttle, rescale).
    control_prob: f64,
    /// Per barrier: the chance of a crash and a resume at a random parallelism.
    crash_prob: f64,
}

impl Case {
    fn new(seed: u64) -> Self {
        Self {
            shape: Shape::Int64,
            vnodes: 64,
            actors: 2,
            batch_size: 7,
            checkpoint_every: 1,
            initial_rows: 80,
            steps: 60,
            seed,
            control_prob: 0.0,
            crash_prob: 0.0,
        }
    }
}

/// A table model.
type Model = BTreeMap<Key, i64>;

/// What the consumer shares with the producer.
#[derive(Default)]
struct Models {
    /// The downstream: every output change applied in order.
    d: BTreeMap<Key, i64>,
    /// Barriers sent and not yet seen at the output, with the upstream as of each.
    in_flight: VecDeque<(EpochPair, bool, Model)>,
    /// The last committed checkpoint: epoch, upstream, downstream.
    committed: Option<(u64, Model, Model)>,
    last_progress: Option<ProgressMap>,
}

struct Running {
    upstream_tx: mpsc::Sender<arrangement_backfill::Result<Message>>,
    control: JobControl,
    stats: watch::Receiver<BackfillStats>,
    seen: watch::Receiver<u64>,
    stop: oneshot::Sender<()>,
    consumer: tokio::task::JoinHandle<()>,
}

struct ActorHarness {
    case: Case,
    rng: StdRng,
    store: MemoryStore,
    desc: Arc<TableDesc>,
    upstream: MemoryTable,
    u: BTreeMap<Key, i64>,
    models: Arc<Mutex<Models>>,
    running: Option<Running>,
    epoch: u64,
    last_epoch_used: u64,
    barriers: u64,
    rescales: usize,
    crashes: usize,
}

fn progress_at(store: &MemoryStore, desc: &TableDesc, epoch: u64) -> ProgressMap {
    let codec = ProgressCodec::new(PROGRESS, desc.pk(), desc.vnode_count()).unwrap();
    let owned = VnodeBitmap::full(desc.vnode_count());
    let table = store.table(PROGRESS, owned.clone()).unwrap();
    codec.restore(&table, owned, epoch).unwrap()
}

/// The consumer: applies the output to D (I3), checks I1 and I4 at every barrier, commits
/// checkpoints and reports them to the runtime.
async fn consume(
    mut job: ParallelBackfill,
    case: Case,
    store: MemoryStore,
    desc: Arc<TableDesc>,
    models: Arc<Mutex<Models>>,
    seen: watch::Sender<u64>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let message = tokio::select! {
            _ = &mut stop => break,
            message = job.next() => message,
        };
        let Some(message) = message else { break };
        let message = message.unwrap_or_else(|e| panic!("job failed: {e} ({case:?})"));
        let mut m = models.lock().unwrap();
        match message {
            Message::Chunk(chunk) => apply(&case, &mut m.d, &chunk),
            Message::Watermark(_) => {}
            Message::Barrier(barrier) => {
                let (pair, checkpoint, u_at) = m.in_flight.pop_front().unwrap();
                assert_eq!(barrier.epoch, pair, "barriers leave in order ({case:?})");
                check_prefix(&case, &store, &desc, &mut m, pair.prev, &u_at);
                if checkpoint {
                    store.commit(pair.prev).unwrap();
                    let d = m.d.clone();
                    m.committed = Some((pair.prev, u_at, d));
                    job.committed(pair.prev);
                }
                drop(m);
                seen.send_replace(pair.curr);
            }
        }
    }
    job.shutdown().await;
}

/// I3: applies output changes strictly.
fn apply(case: &Case, d: &mut BTreeMap<Key, i64>, chunk: &StreamChunk) {
    let rows = rows_of(case.shape, chunk.batch());
    let ops = chunk.ops();
    let mut i = 0;
    while i < rows.len() {
        let (key, v) = &rows[i];
        match ops[i] {
            Op::Insert => assert!(
                d.insert(key.clone(), *v).is_none(),
                "I3: insert of a held key {key:?} ({case:?})"
            ),
            Op::Delete => assert_eq!(
                d.remove(key),
                Some(*v),
                "I3: delete of a row not held as is {key:?} ({case:?})"
            ),
            Op::UpdateDelete => {
                assert_eq!(ops.get(i + 1), Some(&Op::UpdateInsert), "I3: lone U-");
                assert_eq!(d.remove(key), Some(*v), "I3: U- {key:?} ({case:?})");
                let (key2, v2) = &rows[i + 1];
                assert!(
                    d.insert(key2.clone(), *v2).is_none(),
                    "I3: U+ {key2:?} ({case:?})"
                );
                i += 1;
            }
            Op::UpdateInsert => panic!("I3: U+ without U- ({case:?})"),
        }
        i += 1;
    }
}

/// I1 and I4 after the barrier closing `epoch`.
fn check_prefix(
    case: &Case,
    store: &MemoryStore,
    desc: &TableDesc,
    m: &mut Models,
    epoch: u64,
    u_at: &BTreeMap<Key, i64>,
) {
    let progress = progress_at(store, desc, epoch);
    let rows: Vec<(Key, i64)> = u_at.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let batch = batch_of(case.shape, &rows);
    let keys = desc.pk().encode(&batch).unwrap();
    let vnodes = desc.vnodes_of(&batch).unwrap();
    let mut expected = BTreeMap::new();
    for (i, (key, v)) in rows.iter().enumerate() {
        let keep = match progress.get(vnodes[i]).unwrap() {
            VnodeProgress::NotStarted => false,
            VnodeProgress::Completed { .. } => true,
            VnodeProgress::InProgress { pos, .. } => keys.value(i) <= pos.as_bytes(),
        };
        if keep {
            expected.insert(key.clone(), *v);
        }
    }
    assert!(
        expected == m.d,
        "I1 violated after epoch {epoch}: {} expected rows, {} held ({case:?})",
        expected.len(),
        m.d.len()
    );
    if let Some(before) = &m.last_progress {
        for (vnode, was) in before.iter() {
            let now = progress.get(vnode).unwrap();
            let ok = match (was, now) {
                (VnodeProgress::NotStarted, _) => true,
                (
                    VnodeProgress::InProgress { pos: a, .. },
                    VnodeProgress::InProgress { pos: b, .. },
                ) => a <= b,
                (
                    VnodeProgress::InProgress { .. } | VnodeProgress::Completed { .. },
                    VnodeProgress::Completed { .. },
                ) => true,
                _ => false,
            };
            assert!(
                ok,
                "I4: vnode {vnode} went from {was:?} to {now:?} ({case:?})"
            );
        }
    }
    m.last_progress = Some(progress);
}

async fn within<T>(what: &str, case: &Case, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLOCK, f).await {
        Ok(t) => t,
        Err(_) => panic!("deadlock: {what} took over {DEADLOCK:?} ({case:?})"),
    }
}

impl ActorHarness {
    async fn new(case: Case) -> Self {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let store = MemoryStore::new();
        let desc = store
            .create_table(table_desc(case.shape, case.vnodes))
            .unwrap();
        let mut upstream = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        let u = random_rows(case.shape, &mut rng, case.initial_rows, case.initial_rows);
        if !u.is_empty() {
            let rows: Vec<(Key, i64)> = u.iter().map(|(k, v)| (k.clone(), *v)).collect();
            upstream
                .write(&StreamChunk::inserts(batch_of(case.shape, &rows)))
                .unwrap();
        }
        upstream.seal(1).unwrap();
        store.commit(1).unwrap();
        let models = Arc::new(Mutex::new(Models {
            committed: Some((1, u.clone(), BTreeMap::new())),
            ..Models::default()
        }));
        let actors = case.actors;
        let mut h = Self {
            case,
            rng,
            store,
            desc,
            upstream,
            u,
            models,
            running: None,
            epoch: 1,
            last_epoch_used: 1,
            barriers: 0,
            rescales: 0,
            crashes: 0,
        };
        h.start(actors).await;
        h
    }

    /// Starts a runtime of `actors` actors after the committed epoch.
    async fn start(&mut self, actors: usize) {
        let (upstream_tx, rx) = mpsc::channel(8);
        let map = VnodeMap::even(self.desc.vnode_count(), actors).unwrap();
        let config = BackfillConfig {
            batch_size: self.case.batch_size,
            ..BackfillConfig::default()
        };
        let job = ParallelBackfill::start(&self.store, "t", map, config, 0, rx).unwrap();
        let control = job.control();
        let stats = job.stats();
        let (seen_tx, seen) = watch::channel(0);
        let (stop, stop_rx) = oneshot::channel();
        let consumer = tokio::spawn(consume(
            job,
            self.case.clone(),
            self.store.clone(),
            self.desc.clone(),
            self.models.clone(),
            seen_tx,
            stop_rx,
        ));
        self.running = Some(Running {
            upstream_tx,
            control,
            stats,
            seen,
            stop,
            consumer,
        });
        self.barriers = 0;
        self.send_barrier(false).await;
    }

    fn running(&mut self) -> &mut Running {
        self.running.as_mut().expect("a running job")
    }

    async fn send(&mut self, message: Message) {
        let case = self.case.clone();
        let tx = &mut self.running().upstream_tx;
        within("sending upstream", &case, tx.send(Ok(message)))
            .await
            .expect("the job reads its upstream");
    }

    /// Seals the open epoch upstream, sends its barrier and waits until it leaves the job.
    async fn send_barrier(&mut self, checkpoint: bool) {
        let first = self.barriers == 0;
        self.last_epoch_used += 1;
        let pair = EpochPair::new(self.last_epoch_used, self.epoch);
        self.epoch = pair.curr;
        if !first {
            self.upstream.seal(pair.prev).unwrap();
        }
        self.barriers += 1;
        let kind = if checkpoint {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Normal
        };
        self.models
            .lock()
            .unwrap()
            .in_flight
            .push_back((pair, checkpoint, self.u.clone()));
        self.send(Message::Barrier(Barrier::new(pair, kind))).await;
        let case = self.case.clone();
        let running = self.running();
        let waited = within(
            "a barrier to leave",
            &case,
            running.seen.wait_for(|s| *s >= pair.curr),
        )
        .await
        .is_err();
        if waited {
            let consumer = self.running.take().unwrap().consumer;
            match consumer.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => panic!("the consumer ended early ({case:?})"),
            }
        }
    }

    /// A random valid chunk of changes, applied upstream and sent.
    async fn push_changes(&mut self, max: usize) {
        let chunk = Changes::new(self.case.shape, self.case.initial_rows, MIX)
            .chunk(&mut self.rng, &mut self.u, max)
            .expect("a mix without position changes makes a chunk");
        self.upstream.write(&chunk).unwrap();
        self.send(Message::Chunk(chunk)).await;
    }

    /// A random control request (a rescale every few).
    fn control(&mut self) {
        let max_actors = self.case.vnodes.min(4);
        let control = self.running().control.clone();
        match self.rng.random_range(0..10) {
            0..2 => control.pause().unwrap(),
            2..4 => control.resume().unwrap(),
            4 => control.throttle(Some(0)).unwrap(),
            5 => control.throttle(Some(1_000_000)).unwrap(),
            6 => control.throttle(None).unwrap(),
            _ => {
                let actors = self.rng.random_range(1..=max_actors);
                control.rescale(actors).unwrap();
                self.rescales += 1;
            }
        }
    }

    /// A barrier (a checkpoint every `checkpoint_every`), maybe a control request before it,
    /// maybe a crash after it.
    async fn barrier(&mut self) {
        if self.rng.random_bool(self.case.control_prob) {
            self.control();
        }
        let checkpoint = self.barriers.is_multiple_of(self.case.checkpoint_every);
        self.send_barrier(checkpoint).await;
        if self.rng.random_bool(self.case.crash_prob) {
            self.crash().await;
        }
    }

    /// Stops the job, drops everything uncommitted (output included) and resumes at a random
    /// parallelism.
    async fn crash(&mut self) {
        let running = self.running.take().unwrap();
        let _ = running.stop.send(());
        drop(running.upstream_tx);
        within("the job to stop", &self.case, running.consumer)
            .await
            .unwrap();
        self.store.discard_uncommitted().unwrap();
        let (epoch, u, d) = {
            let mut m = self.models.lock().unwrap();
            m.in_flight.clear();
            m.last_progress = None;
            let committed = m.committed.clone().unwrap();
            m.d = committed.2.clone();
            committed
        };
        self.u = u;
        let _ = d;
        self.epoch = epoch;
        self.upstream = self
            .store
            .table("t", VnodeBitmap::full(self.desc.vnode_count()))
            .unwrap();
        self.crashes += 1;
        let actors = self.rng.random_range(1..=self.case.vnodes.min(4));
        self.start(actors).await;
    }

    fn finished(&mut self) -> bool {
        self.running().stats.borrow().finished
    }

    async fn run(mut self) -> Self {
        for _ in 0..self.case.steps {
            match self.rng.random_range(0..100) {
                0..55 => self.push_changes(6).await,
                55..75 => tokio::task::yield_now().await,
                _ => self.barrier().await,
            }
        }
        // Lift any pause or throttle, then barriers until finished.
        let control = self.running().control.clone();
        control.resume().unwrap();
        control.throttle(None).unwrap();
        let mut barriers = 0;
        while !self.finished() {
            self.push_changes(3).await;
            let checkpoint = self.barriers.is_multiple_of(self.case.checkpoint_every);
            self.send_barrier(checkpoint).await;
            barriers += 1;
            assert!(
                barriers < 200,
                "I6: the backfill did not finish ({:?})",
                self.case
            );
        }
        for _ in 0..3 {
            self.push_changes(4).await;
            self.send_barrier(true).await;
        }
        let d = self.models.lock().unwrap().d.clone();
        assert!(
            d == self.u,
            "I2: downstream != upstream at the end ({:?})",
            self.case
        );
        let running = self.running.take().unwrap();
        let _ = running.stop.send(());
        within("the job to stop", &self.case, running.consumer)
            .await
            .unwrap();
        self
    }
}

async fn run_case(case: Case) -> ActorHarness {
    ActorHarness::new(case).await.run().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_match_the_oracle_for_1_2_3_actors_and_1_64_256_vnodes() {
    let mut cases = 0;
    for vnodes in [1, 64, 256] {
        for actors in [1, 2, 3] {
            if actors > vnodes {
                continue;
            }
            for seed in 0..4u64 {
                let mut case = Case::new(seed * 31 + vnodes as u64 * 7 + actors as u64);
                case.vnodes = vnodes;
                case.actors = actors;
                case.shape = if seed % 2 == 0 {
                    Shape::Int64
                } else {
                    Shape::Composite
                };
                case.batch_size = [1, 7, 64, 1024][seed as usize % 4];
                case.checkpoint_every = 1 + seed % 3;
                case.initial_rows = [0, 40, 120, 300][seed as usize % 4];
                run_case(case).await;
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 28);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_rescales_pauses_and_throttles_match_the_oracle() {
    let mut rescales = 0;
    for seed in 0..24u64 {
        let mut case = Case::new(10_000 + seed);
        case.vnodes = [64, 256, 4][seed as usize % 3];
        case.actors = 1 + seed as usize % 3;
        case.shape = if seed % 2 == 0 {
            Shape::Composite
        } else {
            Shape::Int64
        };
        case.checkpoint_every = 1 + seed % 2;
        case.control_prob = 0.5;
        case.initial_rows = 200;
        case.steps = 80;
        rescales += run_case(case).await.rescales;
    }
    assert!(rescales > 20, "the cases rescale ({rescales})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescales_then_crashes_resume_at_any_parallelism() {
    let (mut rescales, mut crashes) = (0, 0);
    for seed in 0..24u64 {
        let mut case = Case::new(20_000 + seed);
        case.vnodes = [64, 256, 4][seed as usize % 3];
        case.actors = 1 + seed as usize % 3;
        case.checkpoint_every = 1 + seed % 3;
        case.control_prob = 0.4;
        case.crash_prob = 0.15;
        case.initial_rows = 150;
        case.steps = 80;
        let h = run_case(case).await;
        rescales += h.rescales;
        crashes += h.crashes;
    }
    assert!(
        rescales > 10 && crashes > 10,
        "{rescales} rescales, {crashes} crashes"
    );
}

/// N to 1 and 1 to N mid-backfill, by hand: the rescale barrier is the first checkpoint after
/// the request, every vnode resumes from its committed progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescale_down_to_one_and_up_again_mid_backfill() {
    let mut case = Case::new(7);
    case.vnodes = 64;
    case.actors = 3;
    case.batch_size = 5;
    case.initial_rows = 400;
    let mut h = ActorHarness::new(case).await;
    for (actors, paused) in [(1, false), (3, true), (2, false), (1, true), (4, false)] {
        h.push_changes(5).await;
        h.send_barrier(true).await;
        let control = h.running().control.clone();
        if paused {
            control.pause().unwrap();
            h.send_barrier(true).await;
        }
        control.rescale(actors).unwrap();
        h.send_barrier(false).await; // a normal barrier does not carry it
        h.send_barrier(true).await;
        let progress = h.running().stats.borrow().clone();
        assert!(!progress.finished || paused || progress.vnodes.completed == 64);
        if paused {
            control.resume().unwrap();
        }
    }
    h.run().await;
}

/// An upstream that never sends anything: nothing leaves the job, the wait times out instead
/// of hanging, and the job still shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_ready_upstream_times_out_instead_of_hanging() {
    let store = MemoryStore::new();
    let desc = store.create_table(table_desc(Shape::Int64, 16)).unwrap();
    let mut t = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    t.seal(1).unwrap();
    store.commit(1).unwrap();
    let map = VnodeMap::even(VnodeCount::new(16).unwrap(), 2).unwrap();
    let upstream = futures::stream::pending::<arrangement_backfill::Result<Message>>();
    let mut job =
        ParallelBackfill::start(&store, "t", map, BackfillConfig::default(), 0, upstream).unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(200), job.next()).await;
    assert!(
        waited.is_err(),
        "nothing can leave before the first barrier"
    );
    tokio::time::timeout(DEADLOCK, job.shutdown())
        .await
        .expect("shutdown does not hang");
}
