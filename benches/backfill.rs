//! The whole snapshot side of a backfill, and the upstream filter, against the row-at-a-time
//! reference (`backfill::reference`), measured in the same run.
//!
//! `backfill_snapshot/{1M,10M}`: a table `(k Int64 key, s Utf8, v Int64)` over 256 vnodes,
//! keys spread over the whole `i64` range (fixed seed), loaded once into a `MemoryStore`
//! (one write, seal, commit). Each iteration builds a new executor (a fresh progress table, so
//! runs do not see each other's progress), sends it one barrier and an upstream that stays
//! pending, and polls its output until every snapshot row came out, in batches of 1024:
//! - `merged`: the arrangement backfill, k-way merged (global key order);
//! - `unordered`: the arrangement backfill, whole per-vnode batches;
//! - `no_shuffle`: the one-position baseline (always merged);
//! - `reference`: the row-at-a-time reference reading the same snapshot to the end (loaded
//!   once into its `BTreeMap`s; each iteration resets its progress).
//!
//! `filter/{int64,utf8+int64}/1M`: one 1M-row upstream chunk (10% of rows in update pairs)
//! against a progress where a third of the 256 vnodes is NotStarted, a third InProgress at a
//! middle key and a third Completed: the prepared `UpstreamFilter` (`vectorized`: mask, Arrow
//! filter, update-pair repair) against the reference's per-row filter (`reference`: rows to
//! values, per-row vnode, per-row comparison).
//!
//! `actors_snapshot/1M/{merged,unordered}/{1,2}`: the same snapshot through the job runtime
//! (dispatcher, actors as tokio tasks on a 2-worker runtime, aligned merge) with 1 and 2
//! actors; and `actors_snapshot/1M/no_shuffle/1`, the no-shuffle baseline on the same
//! runtime: its parallelism is its upstream's (here 1, as in a replay: one source), where the
//! arrangement backfill picks its own (`merged/2`).
//!
//! `snapshot_parts/1M`: where the merged backfill's time goes (the per-vnode scans alone, and
//! the k-way merge over them, at 64-row and 1024-row reads), without the executor.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arrangement_backfill::backfill::ProgressMap;
use arrangement_backfill::backfill::UpstreamFilter;
use arrangement_backfill::backfill::reference::{
    ReferenceBackfill, ReferenceProgress, rows_from_batch,
};
use arrangement_backfill::backfill::{BackfillConfig, BackfillExecutor, SnapshotOrder};
use arrangement_backfill::chunk::{Barrier, BarrierKind, EpochPair, Message, Op, StreamChunk};
use arrangement_backfill::job::{ParallelBackfill, VnodeMap};
use arrangement_backfill::key::{KeyColumn, Position};
use arrangement_backfill::merge::{KWayMerge, SnapshotMerger};
use arrangement_backfill::store::{
    MemoryScan, MemoryStore, MemoryTable, SnapshotScan, StateStore, StateTable,
};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VirtualNode, VnodeBitmap, VnodeCount};
use arrow_array::{Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::interleave::interleave_record_batch;
use arrow_select::take::take_record_batch;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SEED: u64 = 0xBAC4_F111_0000_0001;
const BATCH: usize = 1024;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// `rows` rows with distinct keys spread over the `i64` range (an odd multiplier is a
/// bijection modulo 2^64).
fn table_batch(rows: usize, rng: &mut StdRng) -> RecordBatch {
    let keys = (0..rows as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64);
    let strings: Vec<String> = (0..rows)
        .map(|_| format!("value-{:08x}", rng.random::<u32>()))
        .collect();
    let values: Vec<i64> = (0..rows).map(|_| rng.random()).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(keys)),
            Arc::new(StringArray::from_iter_values(strings)),
            Arc::new(Int64Array::from_iter_values(values)),
        ],
    )
    .unwrap()
}

/// A memory store holding `batch` as table `t`, committed at epoch 1, with a handle on
/// every vnode.
fn loaded_table(batch: &RecordBatch) -> (MemoryStore, Arc<TableDesc>, VnodeBitmap, MemoryTable) {
    let store = MemoryStore::new();
    let desc = store
        .create_table(TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap())
        .unwrap();
    let owned = VnodeBitmap::full(desc.vnode_count());
    let mut table = store.table("t", owned.clone()).unwrap();
    table.write(&StreamChunk::inserts(batch.clone())).unwrap();
    table.seal(1).unwrap();
    store.commit(1).unwrap();
    (store, desc, owned, table)
}

#[derive(Clone, Copy)]
enum Kind {
    Arrangement(SnapshotOrder),
    NoShuffle,
}

/// Runs one backfill of the loaded table until `rows` snapshot rows came out.
fn run_executor(
    runtime: &tokio::runtime::Runtime,
    store: &MemoryStore,
    kind: Kind,
    rows: usize,
    run: usize,
) -> usize {
    let config = BackfillConfig {
        batch_size: BATCH,
        order: match kind {
            Kind::Arrangement(order) => order,
            Kind::NoShuffle => SnapshotOrder::Merged,
        },
        progress_table: Some(format!("t.progress.{run}")),
        ..BackfillConfig::default()
    };
    let owned = VnodeBitmap::full(VnodeCount::DEFAULT);
    let barrier = Barrier::new(EpochPair::new(2, 1), BarrierKind::Normal);
    let upstream =
        futures::stream::iter([Ok(Message::Barrier(barrier))]).chain(futures::stream::pending());
    let out = match kind {
        Kind::Arrangement(_) => BackfillExecutor::arrangement(store, "t", owned, config)
            .unwrap()
            .execute(upstream)
            .boxed(),
        Kind::NoShuffle => BackfillExecutor::no_shuffle(store, "t", owned, config)
            .unwrap()
            .execute(upstream)
            .boxed(),
    };
    runtime.block_on(async move {
        let mut out = out;
        let mut seen = 0;
        while seen < rows {
            match out.next().await {
                Some(Ok(Message::Chunk(chunk))) => seen += black_box(chunk).num_rows(),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("backfill failed: {e}"),
                None => panic!("backfill ended after {seen} of {rows} rows"),
            }
        }
        seen
    })
}

fn backfill_snapshot(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    for (label, rows) in [("1M", 1_000_000), ("10M", 10_000_000)] {
        let mut rng = StdRng::seed_from_u64(SEED);
        let batch = table_batch(rows, &mut rng);
        let (store, desc, owned, _) = loaded_table(&batch);
        let mut reference = ReferenceBackfill::new(desc.clone(), &owned, BATCH).unwrap();
        reference.load(&batch).unwrap();
        drop(batch);

        let mut group = c.benchmark_group(format!("backfill_snapshot/{label}"));
        group.throughput(Throughput::Elements(rows as u64));
        group.sample_size(10);
        group.sampling_mode(SamplingMode::Flat);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(if rows > 1_000_000 { 20 } else { 5 }));
        for (name, kind) in [
            ("merged", Kind::Arrangement(SnapshotOrder::Merged)),
            ("unordered", Kind::Arrangement(SnapshotOrder::PerVnode)),
            ("no_shuffle", Kind::NoShuffle),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let run = runs.fetch_add(1, Ordering::Relaxed);
                    run_executor(&runtime, &store, kind, rows, run)
                })
            });
        }
        group.bench_function("reference", |b| {
            b.iter(|| {
                reference.reset();
                let mut seen = 0;
                while let Some(batch) = reference.read_snapshot().unwrap() {
                    seen += black_box(batch).len();
                }
                assert_eq!(seen, rows);
                seen
            })
        });
        group.finish();
    }
}

/// A 1M-row chunk of `schema` (10% of rows in update pairs) and a progress over 256 vnodes:
/// NotStarted, InProgress at `middle`, Completed, by vnode modulo 3.
fn filter_case(
    desc: &Arc<TableDesc>,
    batch: RecordBatch,
    middle: &RecordBatch,
) -> (StreamChunk, ProgressMap, ReferenceBackfill) {
    let ops: Vec<Op> = (0..batch.num_rows())
        .map(|i| match i % 10 {
            8 => Op::UpdateDelete,
            9 => Op::UpdateInsert,
            _ => Op::Insert,
        })
        .collect();
    let chunk = StreamChunk::new(batch, ops).unwrap();
    let owned = VnodeBitmap::full(desc.vnode_count());
    let pos = Position::from_batch(desc.pk(), middle, 0).unwrap();
    let pos_values = rows_from_batch(middle).unwrap().remove(0);
    let mut progress = ProgressMap::new(owned.clone());
    let mut reference = ReferenceBackfill::new(desc.clone(), &owned, BATCH).unwrap();
    for vnode in owned.iter() {
        match vnode.get() % 3 {
            0 => {}
            1 => {
                progress.advance(vnode, pos.clone(), 1).unwrap();
                let state = ReferenceProgress::InProgress {
                    pos: pos_values.clone(),
                    rows: 1,
                };
                reference.set_progress(vnode, state).unwrap();
            }
            _ => {
                progress.complete(vnode).unwrap();
                let state = ReferenceProgress::Completed { rows: 0 };
                reference.set_progress(vnode, state).unwrap();
            }
        }
    }
    (chunk, progress, reference)
}

fn filter(c: &mut Criterion) {
    const ROWS: usize = 1_000_000;
    let mut rng = StdRng::seed_from_u64(SEED ^ 0xF11);
    let batch = table_batch(ROWS, &mut rng);
    let int_desc = Arc::new(TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap());
    let comp_desc = Arc::new(
        TableDesc::new(
            "c",
            schema(),
            vec![KeyColumn::asc("s"), KeyColumn::asc("k")],
        )
        .unwrap(),
    );
    let middle = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(vec![0])),
            Arc::new(StringArray::from(vec!["value-80000000"])),
            Arc::new(Int64Array::from(vec![0])),
        ],
    )
    .unwrap();
    for (label, desc) in [("int64", int_desc), ("utf8+int64", comp_desc)] {
        let key_middle = RecordBatch::try_new(
            desc.pk().key_schema().clone(),
            desc.pk().key_columns(&middle),
        )
        .unwrap();
        let (chunk, progress, reference) = filter_case(&desc, batch.clone(), &key_middle);
        let prepared = UpstreamFilter::for_progress(desc.clone(), &progress).unwrap();
        // Both sides keep the same rows.
        let kept = prepared.filter(&chunk).unwrap().num_rows();
        assert_eq!(kept, reference.filter(&chunk).unwrap().len());

        let mut group = c.benchmark_group(format!("filter/{label}/1M"));
        group.throughput(Throughput::Elements(ROWS as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        group.bench_function("vectorized", |b| {
            b.iter(|| prepared.filter(black_box(&chunk)).unwrap())
        });
        group.bench_function("vectorized_mask", |b| {
            b.iter(|| prepared.mask(black_box(&chunk)).unwrap())
        });
        group.bench_function("reference", |b| {
            b.iter(|| reference.filter(black_box(&chunk)).unwrap())
        });
        group.finish();
    }
}

/// Where the merged backfill's time goes: the same 1M-row table, scanned per vnode at 256
/// vnodes with reads of 64 rows (the smallest merged read), 512 (the executor's read with
/// 128 inputs a actor) and 1024 (a whole batch), with and without the k-way merge on top.
/// No executor, no progress. `1M` reads the table as loaded (a read is a slice of one
/// segment); `1M_with_delta` after an epoch that updated every fifth row, so every read
/// assembles its rows from the base and the delta (the store's gather, then the merge's).
fn snapshot_parts(c: &mut Criterion) {
    const ROWS: usize = 1_000_000;
    let mut rng = StdRng::seed_from_u64(SEED);
    let batch = table_batch(ROWS, &mut rng);
    for (label, with_delta) in [("1M", false), ("1M_with_delta", true)] {
        let (_store, desc, owned, mut table) = loaded_table(&batch);
        let mut epoch = 1;
        if with_delta {
            // Every fifth row gets a new value: U- old, U+ new.
            let rows: Vec<u32> = (0..ROWS as u32).step_by(5).collect();
            let old = take_record_batch(&batch, &UInt32Array::from(rows)).unwrap();
            let mut columns = old.columns().to_vec();
            let n = old.num_rows();
            columns[2] = Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| -i)));
            let new = RecordBatch::try_new(old.schema(), columns).unwrap();
            let pairs: Vec<(usize, usize)> = (0..n).flat_map(|i| [(0, i), (1, i)]).collect();
            let rows = interleave_record_batch(&[&old, &new], &pairs).unwrap();
            let ops: Vec<Op> = (0..n)
                .flat_map(|_| [Op::UpdateDelete, Op::UpdateInsert])
                .collect();
            table.write(&StreamChunk::new(rows, ops).unwrap()).unwrap();
            table.seal(2).unwrap();
            epoch = 2;
        }
        let scans = |read: usize| -> Vec<(VirtualNode, MemoryScan)> {
            owned
                .iter()
                .map(|v| (v, table.scan(v, None, epoch, read).unwrap()))
                .collect()
        };
        let mut group = c.benchmark_group(format!("snapshot_parts/{label}"));
        group.throughput(Throughput::Elements(ROWS as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        for read in [64, 512, 1024] {
            group.bench_function(format!("scan_only/read{read}"), |b| {
                b.iter(|| {
                    let mut rows = 0;
                    for (_, mut scan) in scans(read) {
                        while let Some(batch) = scan.next_batch().unwrap() {
                            rows += black_box(batch).num_rows();
                        }
                    }
                    assert_eq!(rows, ROWS);
                })
            });
            group.bench_function(format!("kway/read{read}"), |b| {
                b.iter(|| {
                    let mut merge = KWayMerge::new(desc.pk(), scans(read), BATCH).unwrap();
                    let mut rows = 0;
                    while let Some(out) = merge.next_output().unwrap() {
                        rows += black_box(out).batch.num_rows();
                    }
                    assert_eq!(rows, ROWS);
                })
            });
        }
        group.finish();
    }
}

/// Runs the snapshot of the loaded table through `actors` parallel backfill actors (the
/// job runtime: dispatcher, actors as tokio tasks, aligned merge) until `rows` rows came out.
fn run_actors(
    runtime: &tokio::runtime::Runtime,
    store: &MemoryStore,
    order: SnapshotOrder,
    actors: usize,
    rows: usize,
    run: usize,
) -> usize {
    let config = BackfillConfig {
        batch_size: BATCH,
        order,
        progress_table: Some(format!("t.actors.{run}")),
        ..BackfillConfig::default()
    };
    runtime.block_on(async move {
        let barrier = Barrier::new(EpochPair::new(2, 1), BarrierKind::Normal);
        let upstream = futures::stream::iter([Ok(Message::Barrier(barrier))])
            .chain(futures::stream::pending());
        let map = VnodeMap::even(VnodeCount::DEFAULT, actors).unwrap();
        let mut job =
            ParallelBackfill::start(store, "t", map, config, rows as u64, upstream).unwrap();
        let mut seen = 0;
        while seen < rows {
            match job.next().await {
                Some(Ok(Message::Chunk(chunk))) => seen += black_box(chunk).num_rows(),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("backfill failed: {e}"),
                None => panic!("backfill ended after {seen} of {rows} rows"),
            }
        }
        job.shutdown().await;
        seen
    })
}

/// `actors_snapshot/1M/{order}/{n}`: the snapshot side of the job runtime with 1 and 2
/// actors on a 2-worker runtime, side by side (issue 11's 1.7x target).
fn actors_snapshot(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let rows = 1_000_000;
    let mut rng = StdRng::seed_from_u64(SEED);
    let (store, _, _, _) = loaded_table(&table_batch(rows, &mut rng));
    let runs = AtomicUsize::new(0);
    let mut group = c.benchmark_group("actors_snapshot/1M");
    group.throughput(Throughput::Elements(rows as u64));
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for (name, order) in [
        ("merged", SnapshotOrder::Merged),
        ("unordered", SnapshotOrder::PerVnode),
    ] {
        for actors in [1, 2] {
            group.bench_function(format!("{name}/{actors}"), |b| {
                b.iter(|| {
                    let run = runs.fetch_add(1, Ordering::Relaxed);
                    run_actors(&runtime, &store, order, actors, rows, run)
                })
            });
        }
    }
    // One position over all vnodes: it cannot be split across actors, so it runs at the
    // upstream's parallelism whatever the cores.
    group.bench_function("no_shuffle/1", |b| {
        b.iter(|| {
            let run = runs.fetch_add(1, Ordering::Relaxed);
            run_executor(&runtime, &store, Kind::NoShuffle, rows, run)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    filter,
    backfill_snapshot,
    snapshot_parts,
    actors_snapshot
);
criterion_main!(benches);
