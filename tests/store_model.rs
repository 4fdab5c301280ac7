//! Model-based test of the in-memory store against a `BTreeMap` model.
//!
//! Random writes (inserts, deletes, update pairs) over several epochs, seals, commits at
//! random points, scans at older and newer visible epochs from random bounds with random batch
//! sizes, point reads, and a replicated handle with its own layers. After every step the store
//! must agree with the model.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrangement_backfill::chunk::{Op, StreamChunk};
use arrangement_backfill::key::{KeyColumn, Position};
use arrangement_backfill::store::{
    DurableOptions, DurableStore, MemoryStore, SnapshotScan, StateStore, StateTable,
};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VirtualNode, VnodeBitmap, VnodeCount};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use common::files::log_file;

type Rows = BTreeMap<i64, String>;
type Delta = BTreeMap<i64, Option<String>>;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn desc(vnodes: usize) -> TableDesc {
    TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(vnodes).unwrap())
}

/// A change: (key, kind 0 = insert/put, 1 = delete, 2 = update pair, value).
type Change = (i64, u8, u8);

fn chunk_of(changes: &[Change]) -> StreamChunk {
    let mut keys = Vec::new();
    let mut vals = Vec::new();
    let mut ops = Vec::new();
    for &(k, kind, v) in changes {
        let value = format!("v{v}");
        match kind {
            0 => {
                keys.push(k);
                vals.push(value);
                ops.push(Op::Insert);
            }
            1 => {
                keys.push(k);
                vals.push(String::from("old"));
                ops.push(Op::Delete);
            }
            _ => {
                keys.extend([k, k]);
                vals.extend([String::from("old"), value]);
                ops.extend([Op::UpdateDelete, Op::UpdateInsert]);
            }
        }
    }
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(StringArray::from(vals)),
        ],
    )
    .unwrap();
    StreamChunk::new(batch, ops).unwrap()
}

fn delta_of(changes: &[Change]) -> Delta {
    let mut d = Delta::new();
    for &(k, kind, v) in changes {
        d.insert(k, (kind != 1).then(|| format!("v{v}")));
    }
    d
}

fn apply(rows: &mut Rows, delta: &Delta) {
    for (k, v) in delta {
        match v {
            Some(v) => rows.insert(*k, v.clone()),
            None => rows.remove(k),
        };
    }
}

fn vnode_of(desc: &TableDesc, k: i64) -> VirtualNode {
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(vec![k])),
            Arc::new(StringArray::from(vec!["x"])),
        ],
    )
    .unwrap();
    desc.vnodes_of(&batch).unwrap()[0]
}

/// Everything a scan returns, checked sorted and in the right vnode.
fn scan_all(
    table: &impl StateTable,
    vnode: VirtualNode,
    after: Option<i64>,
    epoch: u64,
    batch_size: usize,
) -> Vec<(i64, String)> {
    let pk = table.desc().pk().clone();
    let after = after.map(|k| {
        let batch = RecordBatch::try_new(
            pk.key_schema().clone(),
            vec![Arc::new(Int64Array::from(vec![k]))],
        )
        .unwrap();
        Position::from_batch(&pk, &batch, 0).unwrap()
    });
    let mut scan = table
        .scan(vnode, after.as_ref(), epoch, batch_size)
        .unwrap();
    let mut out = Vec::new();
    while let Some(b) = scan.next_batch().unwrap() {
        assert!(b.num_rows() <= batch_size && b.num_rows() > 0);
        assert_eq!(b.keys.len(), b.num_rows());
        assert_eq!(b.keys, pk.encode(&b.batch).unwrap(), "keys match rows");
        let vnodes = table.desc().vnodes_of(&b.batch).unwrap();
        assert!(vnodes.iter().all(|v| *v == vnode), "rows in their vnode");
        let k = b.batch.column(0).as_primitive::<Int64Type>();
        let v = b.batch.column(1).as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push((k.value(i), v.value(i).to_string()));
        }
    }
    assert!(
        out.windows(2).all(|w| w[0].0 < w[1].0),
        "strictly increasing"
    );
    out
}

fn expected(
    desc: &TableDesc,
    rows: &Rows,
    vnode: VirtualNode,
    after: Option<i64>,
) -> Vec<(i64, String)> {
    rows.iter()
        .filter(|(k, _)| vnode_of(desc, **k) == vnode && after.is_none_or(|a| **k > a))
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

#[derive(Debug, Clone)]
struct EpochPlan {
    changes: Vec<Change>,
    /// The changes are written as this many chunks (with a small memory budget, each
    /// spilled as a piece of the epoch).
    pieces: usize,
    replicated: Vec<Change>,
    commit_back: Option<u8>,
    scans: Vec<(u8, Option<i64>, usize)>,
    /// Durable store only: close and reopen the store after this epoch (a crash: sealed,
    /// uncommitted layers are lost), or compact it now.
    reopen: bool,
    compact: bool,
}

/// A store under test: how to make one and how to "crash and restart" it.
trait Subject {
    type Store: StateStore;
    fn store(&mut self) -> Self::Store;
    /// Drops the store and opens it again from what it persisted; `None` when the store
    /// does not persist.
    fn reopen(&mut self, _old: Self::Store) -> Option<Self::Store> {
        None
    }
    fn compact(&self, _store: &Self::Store) {}
}

struct Memory;

impl Subject for Memory {
    type Store = MemoryStore;
    fn store(&mut self) -> MemoryStore {
        MemoryStore::new()
    }
}

/// The durable store with a tiny memory budget (so layers spill to disk) and background
/// compaction: either a full one after two deltas, or delta runs merged after two (tombstones
/// kept) and a full compaction only after six.
struct Durable {
    dir: tempfile::TempDir,
    budget: usize,
    merge_deltas: bool,
}

impl Durable {
    fn new(budget: usize, merge_deltas: bool) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            budget,
            merge_deltas,
        }
    }

    fn open(&self) -> DurableStore {
        let options = DurableOptions {
            memory_budget: self.budget,
            max_deltas: if self.merge_deltas { 6 } else { 2 },
            merge_deltas: 2,
            compaction: arrangement_backfill::store::Compaction::Background,
            block_cache: 1 << 20,
            compression: Default::default(),
        };
        DurableStore::open_with(
            self.dir.path(),
            arrangement_backfill::store::io::RealIo::shared(),
            options,
        )
        .unwrap()
    }
}

impl Subject for Durable {
    type Store = DurableStore;
    fn store(&mut self) -> DurableStore {
        self.open()
    }
    fn reopen(&mut self, old: DurableStore) -> Option<DurableStore> {
        drop(old);
        Some(self.open())
    }
    fn compact(&self, store: &DurableStore) {
        store.compact().unwrap();
    }
}

fn epoch_plan() -> impl Strategy<Value = EpochPlan> {
    let change = (0i64..40, 0u8..3, 0u8..5);
    (
        prop::collection::vec(change.clone(), 0..25),
        prop::collection::vec(change, 0..8),
        prop::option::of(0u8..3),
        prop::collection::vec((0u8..4, prop::option::of(0i64..40), 1usize..9), 1..4),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        1usize..6,
        prop::bool::weighted(0.4),
    )
        .prop_map(
            |(changes, replicated, commit_back, scans, reopen, compact, pieces, load)| EpochPlan {
                // A load: distinct keys inserted in key order, as a bulk load of a sorted
                // snapshot (its pieces may become a vnode's base as they are).
                changes: if load {
                    let keys: std::collections::BTreeSet<i64> =
                        changes.iter().map(|c| c.0).collect();
                    keys.into_iter().map(|k| (k, 0, (k % 5) as u8)).collect()
                } else {
                    changes
                },
                pieces,
                replicated,
                commit_back,
                scans,
                reopen,
                compact,
            },
        )
}

/// Keeps one change per key per chunk position rule: the store applies a chunk in order, and
/// so does the model, so any sequence is fine.
fn run_plan<S: Subject>(subject: &mut S, plans: &[EpochPlan], vnodes: usize) {
    let mut store = subject.store();
    let desc = store.create_table(desc(vnodes)).unwrap();
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut writer = store.table("t", all.clone()).unwrap();
    let mut repl = store.replicated_table("t", all.clone()).unwrap();

    let mut committed_rows = Rows::new();
    let mut committed: Option<u64> = None;
    let mut sealed: BTreeMap<u64, Delta> = BTreeMap::new();
    let mut repl_layers: BTreeMap<u64, Delta> = BTreeMap::new();

    for (i, plan) in plans.iter().enumerate() {
        let epoch = (i as u64 + 1) * 10;
        let per_piece = plan.changes.len().div_ceil(plan.pieces).max(1);
        for piece in plan.changes.chunks(per_piece) {
            writer.write(&chunk_of(piece)).unwrap();
        }
        writer.seal(epoch).unwrap();
        sealed.insert(epoch, delta_of(&plan.changes));
        repl.write(&chunk_of(&plan.replicated)).unwrap();
        repl.seal(epoch).unwrap();
        if committed.is_none_or(|c| epoch > c) {
            repl_layers.insert(epoch, delta_of(&plan.replicated));
        }

        if let Some(back) = plan.commit_back {
            let target = epoch.saturating_sub(u64::from(back) * 10);
            if target > 0 && committed.is_none_or(|c| target > c) {
                store.commit(target).unwrap();
                committed = Some(target);
                let rest = sealed.split_off(&(target + 1));
                for d in sealed.values() {
                    apply(&mut committed_rows, d);
                }
                sealed = rest;
                repl_layers = repl_layers.split_off(&(target + 1));
            } else if target > 0 {
                assert!(
                    store.commit(target).is_err(),
                    "commit must not go backwards"
                );
            }
        }

        for &(back, after, batch_size) in &plan.scans {
            let read_epoch = epoch.saturating_sub(u64::from(back) * 10).max(10);
            if committed.is_some_and(|c| read_epoch < c) {
                let err = writer.scan(VirtualNode::ZERO, None, read_epoch, batch_size);
                assert!(err.is_err(), "reads below the committed epoch are stale");
                continue;
            }
            let mut rows = committed_rows.clone();
            for d in sealed.range(..=read_epoch).map(|(_, d)| d) {
                apply(&mut rows, d);
            }
            let mut repl_rows = committed_rows.clone();
            for d in repl_layers.range(..=read_epoch).map(|(_, d)| d) {
                apply(&mut repl_rows, d);
            }
            for vnode in desc.vnode_count().vnodes() {
                assert_eq!(
                    scan_all(&writer, vnode, after, read_epoch, batch_size),
                    expected(&desc, &rows, vnode, after),
                    "writer scan vnode {vnode} after {after:?} at epoch {read_epoch}"
                );
                assert_eq!(
                    scan_all(&repl, vnode, after, read_epoch, batch_size),
                    expected(&desc, &repl_rows, vnode, after),
                    "replicated scan vnode {vnode} after {after:?} at epoch {read_epoch}"
                );
            }
            // Point reads agree too.
            let pk = desc.pk();
            for k in [0i64, 7, 19, 39] {
                let key_batch = RecordBatch::try_new(
                    pk.key_schema().clone(),
                    vec![Arc::new(Int64Array::from(vec![k]))],
                )
                .unwrap();
                let key = pk.encode(&key_batch).unwrap();
                let got = writer
                    .get(vnode_of(&desc, k), key.value(0), read_epoch)
                    .unwrap()
                    .map(|b| b.column(1).as_string::<i32>().value(0).to_string());
                assert_eq!(got, rows.get(&k).cloned(), "get {k} at {read_epoch}");
            }
        }
        let total: usize = desc
            .vnode_count()
            .vnodes()
            .map(|v| writer.committed_rows(v).unwrap())
            .sum();
        assert_eq!(total, committed_rows.len(), "committed row count");

        if plan.compact {
            subject.compact(&store);
        }
        if plan.reopen {
            drop((writer, repl));
            let Some(reopened) = subject.reopen(store) else {
                unreachable!("only persistent subjects are asked to reopen")
            };
            store = reopened;
            assert_eq!(store.committed_epoch().unwrap(), committed);
            // What was sealed but not committed is gone, as after a crash.
            sealed.clear();
            repl_layers.clear();
            writer = store.table("t", all.clone()).unwrap();
            repl = store.replicated_table("t", all.clone()).unwrap();
            let read_epoch = committed.unwrap_or(0);
            for vnode in desc.vnode_count().vnodes() {
                assert_eq!(
                    scan_all(&writer, vnode, None, read_epoch.max(1), 3),
                    expected(&desc, &committed_rows, vnode, None),
                    "after reopening, vnode {vnode} holds exactly the committed rows"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(Config {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x5702e),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn memory_store_matches_btreemap_model(
        plans in prop::collection::vec(epoch_plan(), 1..8),
        vnodes in prop::sample::select(vec![1usize, 4, 16]),
    ) {
        let plans: Vec<EpochPlan> = plans
            .into_iter()
            .map(|p| EpochPlan { reopen: false, ..p })
            .collect();
        run_plan(&mut Memory, &plans, vnodes);
    }
}

proptest! {
    #![proptest_config(Config {
        cases: 96,
        rng_seed: RngSeed::Fixed(0xd0_7ab1e),
        failure_persistence: None,
        ..Config::default()
    })]

    /// The same model, on the durable store: layers spill (budgets of 0 bytes to 64 KiB),
    /// compaction runs in the background and on demand, and the store is closed and reopened
    /// at random points.
    #[test]
    fn durable_store_matches_btreemap_model(
        plans in prop::collection::vec(epoch_plan(), 1..8),
        vnodes in prop::sample::select(vec![1usize, 4, 16]),
        budget in prop::sample::select(vec![0usize, 2048, 64 << 10]),
        merge_deltas in any::<bool>(),
    ) {
        run_plan(&mut Durable::new(budget, merge_deltas), &plans, vnodes);
    }
}

#[test]
fn large_vnode_compacts_segment_by_segment() {
    large_vnode(MemoryStore::new());
    let durable = Durable::new(1 << 20, false);
    let store = durable.open();
    large_vnode(store.clone());
    store.compact().unwrap();
    drop(store);
    let store = durable.open();
    let writer = store
        .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
        .unwrap();
    assert_eq!(
        scan_all(&writer, VirtualNode::ZERO, None, 2, 1000).len(),
        50_000
    );
}

fn large_vnode<S: StateStore>(store: S) {
    // 50k rows in one vnode: several segments; a few deltas touch only some of them.
    let desc = store.create_table(desc(1)).unwrap();
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut writer = store.table("t", all).unwrap();
    let n = 50_000i64;
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values((0..n).rev())),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("v{i}")),
            )),
        ],
    )
    .unwrap();
    writer.write(&StreamChunk::inserts(batch)).unwrap();
    writer.seal(1).unwrap();
    store.commit(1).unwrap();
    writer
        .write(&chunk_of(&[(5, 1, 0), (30_000, 2, 3), (60_000, 0, 1)]))
        .unwrap();
    writer.seal(2).unwrap();
    store.commit(2).unwrap();
    let rows = scan_all(&writer, VirtualNode::ZERO, None, 2, 1024);
    assert_eq!(rows.len(), n as usize);
    assert!(!rows.iter().any(|(k, _)| *k == 5));
    assert!(rows.contains(&(30_000, "v3".into())));
    assert!(rows.contains(&(60_000, "v1".into())));
}

/// Options under which a vnode's deltas are merged after 3, and its base never rewritten.
fn merging_options() -> DurableOptions {
    DurableOptions {
        memory_budget: 1 << 20,
        max_deltas: 1000,
        merge_deltas: 3,
        compaction: arrangement_backfill::store::Compaction::Inline,
        block_cache: 1 << 20,
        compression: Default::default(),
    }
}

/// Epoch 1 loads `base_rows` rows; epochs 2..=`last` delete and update base rows, insert new
/// keys, and insert again a key deleted the epoch before.
fn merging_epochs(base_rows: i64, last: u64) -> Vec<Vec<Change>> {
    let mut epochs = vec![(0..base_rows).map(|k| (k * 2, 0, (k % 5) as u8)).collect()];
    for epoch in 2..=last {
        let e = epoch as i64;
        epochs.push(vec![
            (e * 10, 1, 0),
            (e * 10 + 2, 2, (e % 5) as u8),
            (e * 10 + 1, 0, 1),
            ((e - 1) * 10, 0, 4),
            (base_rows * 2 + e, 0, 2),
        ]);
    }
    epochs
}

/// The model's rows after each epoch (index 0: before epoch 1).
fn merging_models(epochs: &[Vec<Change>]) -> Vec<Vec<(i64, String)>> {
    let mut model = Rows::new();
    let mut out = vec![Vec::new()];
    for changes in epochs {
        apply(&mut model, &delta_of(changes));
        out.push(model.iter().map(|(k, v)| (*k, v.clone())).collect());
    }
    out
}

/// Writes and commits `epochs` (epoch i + 1 is `epochs[i]`) through `io`; after each commit,
/// `check(epoch, table)`. Returns the last epoch whose commit returned, or the first error
/// with the epoch being committed.
fn run_merging(
    dir: &std::path::Path,
    io: Arc<dyn arrangement_backfill::store::io::StorageIo>,
    epochs: &[Vec<Change>],
    check: impl FnMut(u64, &<DurableStore as StateStore>::Table),
) -> Result<u64, (u64, arrangement_backfill::Error)> {
    run_epochs(dir, io, merging_options(), epochs, check)
}

/// [`run_merging`] with other options.
fn run_epochs(
    dir: &std::path::Path,
    io: Arc<dyn arrangement_backfill::store::io::StorageIo>,
    options: DurableOptions,
    epochs: &[Vec<Change>],
    mut check: impl FnMut(u64, &<DurableStore as StateStore>::Table),
) -> Result<u64, (u64, arrangement_backfill::Error)> {
    let store = DurableStore::open_with(dir, io, options).map_err(|e| (0, e))?;
    let desc = store.create_table(desc(1)).map_err(|e| (0, e))?;
    let mut writer = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .map_err(|e| (0, e))?;
    for (i, changes) in epochs.iter().enumerate() {
        let epoch = i as u64 + 1;
        writer.write(&chunk_of(changes)).map_err(|e| (epoch, e))?;
        writer.seal(epoch).map_err(|e| (epoch, e))?;
        store.commit(epoch).map_err(|e| (epoch, e))?;
        check(epoch, &writer);
    }
    Ok(epochs.len() as u64)
}

/// A large base and many small epochs: the deltas are merged into one delta run again and
/// again (tombstones of base rows kept) without a full compaction, and every read, before
/// and after a reopen, equals the model.
#[test]
fn merged_deltas_keep_deleting_base_rows() {
    let dir = tempfile::tempdir().unwrap();
    let epochs = merging_epochs(20_000, 20);
    let models = merging_models(&epochs);
    let files = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".arrow")
            })
            .count()
    };
    let io = arrangement_backfill::store::io::RealIo::shared();
    run_merging(dir.path(), io.clone(), &epochs, |epoch, table| {
        let want = &models[epoch as usize];
        assert_eq!(&scan_all(table, VirtualNode::ZERO, None, epoch, 4096), want);
        if epoch > 1 {
            // The base's file, at most one merged delta and fewer than three fresh ones.
            assert!(
                files(dir.path()) <= 4,
                "epoch {epoch}: {} files",
                files(dir.path())
            );
        }
    })
    .unwrap();
    let store = DurableStore::open_with(dir.path(), io, merging_options()).unwrap();
    let reader = store
        .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
        .unwrap();
    let want = &models[20];
    assert_eq!(&scan_all(&reader, VirtualNode::ZERO, None, 20, 1000), want);
    let after = want.partition_point(|(k, _)| *k <= 1000);
    assert_eq!(
        scan_all(&reader, VirtualNode::ZERO, Some(1000), 20, 7),
        want[after..]
    );
}

/// A crash (with unsynced bytes lost) at every I/O operation of the merging scenario: the
/// reopened store holds exactly the model of the last committed epoch, which is the last
/// commit that returned or the one under way.
#[test]
fn a_crash_during_delta_merges_reopens_to_a_committed_epoch() {
    use arrangement_backfill::store::io::{Fault, FaultyIo, RealIo};
    let epochs = merging_epochs(2_000, 9);
    let models = merging_models(&epochs);
    let counter = Arc::new(FaultyIo::new(RealIo::shared(), None, Fault::Crash));
    let clean = tempfile::tempdir().unwrap();
    run_merging(clean.path(), counter.clone(), &epochs, |_, _| {}).unwrap();
    let total = counter.operations();
    assert!(total > 40, "only {total} operations");
    for n in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let faulty = Arc::new(FaultyIo::new(RealIo::shared(), Some(n), Fault::Crash));
        let mut last_ok = 0;
        let attempted = match run_merging(dir.path(), faulty.clone(), &epochs, |e, _| last_ok = e) {
            // A failed removal of an obsolete file is absorbed (the next open removes it).
            Ok(last) => last,
            Err((epoch, _)) => epoch,
        };
        faulty.lose_unsynced().unwrap();
        drop(faulty);
        let store =
            DurableStore::open_with(dir.path(), RealIo::shared(), merging_options()).unwrap();
        let committed = store.committed_epoch().unwrap().unwrap_or(0);
        assert!(
            committed == last_ok || committed == attempted,
            "crash at operation {n}: committed {committed}, last returned {last_ok}, attempted {attempted}"
        );
        if committed > 0 {
            let reader = store
                .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
                .unwrap();
            assert_eq!(
                scan_all(&reader, VirtualNode::ZERO, None, committed, 512),
                models[committed as usize],
                "crash at operation {n}, epoch {committed}"
            );
        }
    }
}

/// Several handles of one table over disjoint vnode sets (the backfill actors' progress
/// tables) seal the same epochs; one commit makes all of them durable, and a reopened
/// durable store reads every handle's rows. A vnode written by two handles in one epoch is
/// refused.
fn handles_share_epochs<S: StateStore>(store: S, reopen: impl FnOnce(S) -> S) {
    let vnodes = 8;
    let desc = store.create_table(desc(vnodes)).unwrap();
    let sets = VnodeBitmap::split(desc.vnode_count(), 3).unwrap();
    let mut handles: Vec<_> = sets
        .iter()
        .map(|s| store.table("t", s.clone()).unwrap())
        .collect();
    let mut rows: Rows = BTreeMap::new();
    for epoch in 1..=3u64 {
        for k in 0..40i64 {
            let owner = sets
                .iter()
                .position(|s| s.contains(vnode_of(&desc, k)))
                .unwrap();
            let kind = if rows.contains_key(&k) { 2 } else { 0 };
            let change = [(k, kind, epoch as u8)];
            handles[owner].write(&chunk_of(&change)).unwrap();
            apply(&mut rows, &delta_of(&change));
        }
        for handle in &mut handles {
            handle.seal(epoch).unwrap();
        }
        if epoch != 2 {
            store.commit(epoch).unwrap();
        }
    }
    // Two handles on one vnode, both writing it in the same epoch: refused.
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut a = store.table("t", all.clone()).unwrap();
    let mut b = store.table("t", all.clone()).unwrap();
    a.write(&chunk_of(&[(1, 2, 9)])).unwrap();
    b.write(&chunk_of(&[(1, 2, 10)])).unwrap();
    a.seal(4).unwrap();
    assert!(
        b.seal(4).is_err(),
        "two handles wrote one vnode in one epoch"
    );
    drop((a, b, handles));
    let store = reopen(store);
    let reader = store.table("t", all).unwrap();
    let mut seen = Vec::new();
    for v in desc.vnode_count().vnodes() {
        seen.extend(scan_all(&reader, v, None, 3, 7));
    }
    seen.sort();
    let want: Vec<(i64, String)> = rows.into_iter().collect();
    assert_eq!(seen, want);
}

#[test]
fn several_handles_seal_one_epoch_in_the_memory_store() {
    handles_share_epochs(MemoryStore::new(), |s| s);
}

#[test]
fn several_handles_seal_one_epoch_in_the_durable_store() {
    let dir = tempfile::tempdir().unwrap();
    let open = |path: &std::path::Path| {
        DurableStore::open_with(
            path,
            arrangement_backfill::store::io::RealIo::shared(),
            DurableOptions::default(),
        )
        .unwrap()
    };
    let store = open(dir.path());
    handles_share_epochs(store, |s| {
        drop(s);
        open(dir.path())
    });
}

/// Options without background work: the log holds exactly one record per commit.
fn manual_options() -> DurableOptions {
    DurableOptions {
        compaction: arrangement_backfill::store::Compaction::Manual,
        ..merging_options()
    }
}

/// Where each record of a log starts (the format of `store::durable::log`: a 20-byte header,
/// then records framed by 28 bytes starting with the body's u32 length).
fn record_offsets(log: &[u8]) -> Vec<usize> {
    let mut at = 20;
    let mut out = Vec::new();
    while at + 28 <= log.len() {
        out.push(at);
        let len = u32::from_le_bytes(log[at..at + 4].try_into().unwrap()) as usize;
        at += 28 + len;
    }
    out
}

/// Every file in `dir` with its bytes (the lock file aside).
fn dir_bytes(dir: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "LOCK")
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().to_string(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn reopen_and_check(dir: &std::path::Path, models: &[Vec<(i64, String)>]) -> u64 {
    let store = DurableStore::open_with(
        dir,
        arrangement_backfill::store::io::RealIo::shared(),
        manual_options(),
    )
    .unwrap();
    let committed = store.committed_epoch().unwrap().unwrap();
    let reader = store
        .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
        .unwrap();
    assert_eq!(
        scan_all(&reader, VirtualNode::ZERO, None, committed, 100),
        models[committed as usize],
        "epoch {committed}"
    );
    committed
}

/// A commit whose record was cut short by a crash (every length of a torn tail) is not
/// committed: the store reopens at the epoch before, and commits after it are durable (the
/// torn bytes are never appended to).
#[test]
fn a_torn_last_log_record_is_not_committed() {
    // The log ends with the records of the commits since the manifest was last rewritten,
    // the last two included (epochs 7 and 8).
    let epochs = merging_epochs(300, 8);
    let models = merging_models(&epochs);
    let io = arrangement_backfill::store::io::RealIo::shared();
    let clean = tempfile::tempdir().unwrap();
    run_epochs(
        clean.path(),
        io.clone(),
        manual_options(),
        &epochs,
        |_, _| {},
    )
    .unwrap();
    let log = std::fs::read(log_file(clean.path())).unwrap();
    let offsets = record_offsets(&log);
    assert!(
        offsets.len() >= 2,
        "one record per commit since the last rewrite: {offsets:?}"
    );
    let last = *offsets.last().unwrap();
    for cut in [
        last + 1,
        last + 7,
        last + 8,
        (last + log.len()) / 2,
        log.len() - 1,
    ] {
        let dir = tempfile::tempdir().unwrap();
        run_epochs(dir.path(), io.clone(), manual_options(), &epochs, |_, _| {}).unwrap();
        let path = log_file(dir.path());
        std::fs::write(&path, &log[..cut]).unwrap();
        assert_eq!(reopen_and_check(dir.path(), &models), 7, "cut at {cut}");
        // The next commit starts over, after the torn record: it and the rest stay.
        let store = DurableStore::open_with(dir.path(), io.clone(), manual_options()).unwrap();
        let mut writer = store
            .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
            .unwrap();
        writer.write(&chunk_of(&epochs[7])).unwrap();
        writer.seal(8).unwrap();
        store.commit(8).unwrap();
        drop((writer, store));
        assert_eq!(reopen_and_check(dir.path(), &models), 8, "cut at {cut}");
    }
    // A flipped byte in the last record reads as a torn write too.
    let dir = tempfile::tempdir().unwrap();
    run_epochs(dir.path(), io, manual_options(), &epochs, |_, _| {}).unwrap();
    let mut bytes = log.clone();
    let end = bytes.len() - 1;
    bytes[end] ^= 0x01;
    std::fs::write(log_file(dir.path()), &bytes).unwrap();
    assert_eq!(reopen_and_check(dir.path(), &models), 7);
}

/// A damaged record with valid ones after it, or a log newer than its manifest, is
/// corruption: the open fails naming the log and changes nothing in the directory.
#[test]
fn a_corrupt_log_is_refused_and_left_as_it_is() {
    let epochs = merging_epochs(300, 8);
    let io = arrangement_backfill::store::io::RealIo::shared();
    type Damage = fn(&std::path::Path) -> std::path::PathBuf;
    let cases: [(&str, Damage, &str); 3] = [
        (
            "a flipped byte in the first record",
            |dir| {
                let path = log_file(dir);
                let mut log = std::fs::read(&path).unwrap();
                let first = record_offsets(&log)[0];
                log[first + 10] ^= 0x04;
                std::fs::write(&path, &log).unwrap();
                path
            },
            "checksum mismatch",
        ),
        (
            "a damaged header",
            |dir| {
                let path = log_file(dir);
                let mut log = std::fs::read(&path).unwrap();
                log[2] ^= 0x04;
                std::fs::write(&path, &log).unwrap();
                path
            },
            "magic",
        ),
        (
            "a log of a newer generation",
            |dir| {
                let path = log_file(dir);
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                let generation: u64 = name["LOG-".len()..].parse().unwrap();
                let newer = dir.join(format!("LOG-{:020}", generation + 1));
                std::fs::copy(&path, &newer).unwrap();
                newer
            },
            "newer than the manifest",
        ),
    ];
    for (what, damage, message) in cases {
        let dir = tempfile::tempdir().unwrap();
        run_epochs(dir.path(), io.clone(), manual_options(), &epochs, |_, _| {}).unwrap();
        let named = damage(dir.path());
        let before = dir_bytes(dir.path());
        let err = DurableStore::open_with(dir.path(), io.clone(), manual_options())
            .expect_err(what)
            .to_string();
        let name = named.file_name().unwrap().to_string_lossy().to_string();
        assert!(err.contains(&name), "{what}: names {name}: {err}");
        assert!(err.contains(message), "{what}: {err}");
        assert_eq!(dir_bytes(dir.path()), before, "{what}: nothing changed");
    }
}

/// With 32768 vnodes, a commit that changes one vnode appends a record of a few dozen bytes
/// to the log and leaves the manifest (which lists every vnode's runs) alone; reopening
/// replays the log.
#[test]
fn a_commit_writes_what_it_changed_not_the_whole_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let io = arrangement_backfill::store::io::RealIo::shared();
    let store = DurableStore::open_with(dir.path(), io.clone(), manual_options()).unwrap();
    let desc = store.create_table(desc(32768)).unwrap();
    let all = VnodeBitmap::full(desc.vnode_count());
    let mut writer = store.table("t", all.clone()).unwrap();
    let mut model = Rows::new();
    let load: Vec<Change> = (0..60_000).map(|k| (k, 0, (k % 5) as u8)).collect();
    apply(&mut model, &delta_of(&load));
    writer.write(&chunk_of(&load)).unwrap();
    writer.seal(1).unwrap();
    store.commit(1).unwrap();
    let manifest = std::fs::read(dir.path().join("MANIFEST")).unwrap();
    let log_len = || std::fs::metadata(log_file(dir.path())).unwrap().len();
    let before = log_len();
    for epoch in 2..=21u64 {
        let change = [(epoch as i64 * 7, 2, (epoch % 5) as u8)];
        apply(&mut model, &delta_of(&change));
        writer.write(&chunk_of(&change)).unwrap();
        writer.seal(epoch).unwrap();
        store.commit(epoch).unwrap();
    }
    assert_eq!(
        std::fs::read(dir.path().join("MANIFEST")).unwrap(),
        manifest,
        "the manifest of {} bytes was rewritten",
        manifest.len()
    );
    let per_commit = (log_len() - before) / 20;
    assert!(per_commit < 200, "{per_commit} bytes of log per commit");
    drop((writer, store));
    let store = DurableStore::open_with(dir.path(), io, manual_options()).unwrap();
    assert_eq!(store.committed_epoch().unwrap(), Some(21));
    let reader = store.table("t", all).unwrap();
    // Every key's vnode at once (one batch), then a sample of vnodes read back.
    let keys: Vec<i64> = model.keys().copied().collect();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys.clone())),
            Arc::new(StringArray::from(vec!["x"; keys.len()])),
        ],
    )
    .unwrap();
    let vnodes = desc.vnodes_of(&batch).unwrap();
    let sample = |v: VirtualNode| v.get() % 97 == 3;
    let mut want: Vec<(i64, String)> = keys
        .iter()
        .zip(&vnodes)
        .filter(|(_, v)| sample(**v))
        .map(|(k, _)| (*k, model[k].clone()))
        .collect();
    let mut got = Vec::new();
    for vnode in desc.vnode_count().vnodes().filter(|v| sample(*v)) {
        got.extend(scan_all(&reader, vnode, None, 21, 50));
    }
    got.sort();
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

/// Writes `keys` (inserts, value `v{k % 5}`) as chunks of `per_chunk` rows in one epoch and
/// commits it: with a small memory budget, each chunk is spilled as a piece of the epoch.
fn load_in_pieces(store: &DurableStore, keys: &[i64], per_chunk: usize, epoch: u64) -> Rows {
    let all = VnodeBitmap::full(store.table_desc("t").unwrap().unwrap().vnode_count());
    let mut writer = store.table("t", all).unwrap();
    for piece in keys.chunks(per_chunk) {
        let changes: Vec<Change> = piece.iter().map(|&k| (k, 0, (k % 5) as u8)).collect();
        writer.write(&chunk_of(&changes)).unwrap();
    }
    writer.seal(epoch).unwrap();
    store.commit(epoch).unwrap();
    keys.iter().map(|&k| (k, format!("v{}", k % 5))).collect()
}

fn check_rows(store: &DurableStore, rows: &Rows, epoch: u64, what: &str) {
    let desc = store.table_desc("t").unwrap().unwrap();
    let table = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    for vnode in desc.vnode_count().vnodes() {
        assert_eq!(
            scan_all(&table, vnode, None, epoch, 7),
            expected(&desc, rows, vnode, None),
            "{what}: vnode {vnode}"
        );
    }
}

/// A bulk load of distinct keys in key order, spilled in pieces, becomes each vnode's base as
/// it is: a compaction finds nothing to rewrite, and the rows survive reopening and a later
/// compaction with deltas. So does a load in pieces that give each vnode less than a block,
/// while the chain is no longer than `max_deltas` runs. The same load out of order, or in
/// more pieces than that, is compacted as before.
#[test]
fn an_ordered_bulk_load_becomes_the_base_without_compaction() {
    let options = DurableOptions {
        memory_budget: 4 << 10,
        compaction: arrangement_backfill::store::Compaction::Manual,
        ..DurableOptions::default()
    };
    let open = |dir: &std::path::Path| {
        DurableStore::open_with(
            dir,
            arrangement_backfill::store::io::RealIo::shared(),
            options.clone(),
        )
        .unwrap()
    };
    let ordered: Vec<i64> = (0..12_000).map(|k| k * 3).collect();
    let mut reversed = ordered.clone();
    reversed.reverse();
    let fewer = ordered[..2000].to_vec();
    // Chunks of 1200 rows, each spilled as a piece, give each of 4 vnodes about 300 rows a
    // piece, whole blocks. Chunks of 200 give it about 50, short runs packed with other
    // vnodes': 10 pieces, a chain short enough to keep. Chunks of 40 give it about 10 in
    // 300 pieces, which are compacted.
    for (keys, per_piece, rewritten) in [
        (&ordered, 1200, false),
        (&reversed, 1200, true),
        (&fewer, 200, false),
        (&ordered, 40, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.create_table(desc(4)).unwrap();
        let mut rows = load_in_pieces(&store, keys, per_piece, 1);
        let pieces = store.live_files().unwrap();
        assert!(
            pieces >= 5,
            "the load was spilled in pieces ({pieces} files)"
        );
        check_rows(&store, &rows, 1, "after the load");
        store.compact().unwrap();
        let after = store.live_files().unwrap();
        assert_eq!(
            after != pieces,
            rewritten,
            "{pieces} files before compaction, {after} after"
        );
        check_rows(&store, &rows, 1, "after compaction");
        drop(store);
        let store = open(dir.path());
        check_rows(&store, &rows, 1, "after reopening");
        // Deltas over the base (a delete, an update, new keys between the pieces' ranges),
        // then everything compacted into one base per vnode.
        let table = store
            .table("t", VnodeBitmap::full(VnodeCount::new(4).unwrap()))
            .unwrap();
        let mut writer = table;
        let changes: Vec<Change> = vec![(0, 1, 0), (900, 2, 4), (901, 0, 1), (35_999, 0, 2)];
        writer.write(&chunk_of(&changes)).unwrap();
        writer.seal(2).unwrap();
        store.commit(2).unwrap();
        apply(&mut rows, &delta_of(&changes));
        check_rows(&store, &rows, 2, "with a delta");
        store.compact().unwrap();
        check_rows(&store, &rows, 2, "compacted with a delta");
        drop((writer, store));
        check_rows(&open(dir.path()), &rows, 2, "reopened after compaction");
    }
}
