//! Scanning a committed vnode of the in-memory store against a row-at-a-time baseline.
//!
//! `store_scan/1M/memory_store` scans one committed vnode of 1M rows (Int64 key + Utf8
//! value) in batches of 1024 through [`StateTable::scan`]; `btreemap_rows` walks the same
//! rows kept as a `BTreeMap<i64, (i64, String)>`, the layout of a row-at-a-time engine.
//! Both sides touch every value they return, like for like: the sum of the keys and of the
//! string lengths (batch by batch on our side, row by row, by reference, on the `BTreeMap`).
//! `store_scan/1M_with_delta/memory_store` reads the same vnode with one uncommitted epoch of
//! 1% changes merged on read.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::chunk::StreamChunk;
use arrangement_backfill::key::KeyColumn;
use arrangement_backfill::store::{MemoryStore, SnapshotScan, StateStore, StateTable};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VirtualNode, VnodeBitmap, VnodeCount};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
const SEED: u64 = 0x5EED_5708_E000_0001;

/// Scans the vnode, touching every value: sums the keys and the string lengths.
fn scan_rows(table: &impl StateTable, epoch: u64) -> usize {
    let mut scan = table.scan(VirtualNode::ZERO, None, epoch, 1024).unwrap();
    let mut rows = 0;
    let (mut keys, mut bytes) = (0i64, 0usize);
    while let Some(keyed) = scan.next_batch().unwrap() {
        let k = keyed.batch.column(0).as_primitive::<Int64Type>();
        let v = keyed.batch.column(1).as_string::<i32>();
        keys = k.values().iter().fold(keys, |a, k| a.wrapping_add(*k));
        bytes += v.iter().flatten().map(str::len).sum::<usize>();
        rows += keyed.num_rows();
    }
    black_box((keys, bytes));
    rows
}

fn store_scan(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, false),
    ]));
    let keys: Vec<i64> = (0..ROWS as i64).map(|i| i * 3).collect();
    let values: Vec<String> = (0..ROWS)
        .map(|_| format!("value-{}", rng.random::<u32>()))
        .collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(keys.clone())),
            Arc::new(StringArray::from(values.clone())),
        ],
    )
    .unwrap();

    let store = MemoryStore::new();
    let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(1).unwrap());
    let desc = store.create_table(desc).unwrap();
    let mut table = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    table.write(&StreamChunk::inserts(batch)).unwrap();
    table.seal(1).unwrap();
    store.commit(1).unwrap();
    assert_eq!(scan_rows(&table, 1), ROWS);

    let model: BTreeMap<i64, (i64, String)> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (*k, (*k, v.clone())))
        .collect();

    let mut group = c.benchmark_group("store_scan/1M");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("memory_store", |b| b.iter(|| scan_rows(&table, 1)));
    group.bench_function("btreemap_rows", |b| {
        b.iter(|| {
            let mut rows = 0;
            let (mut keys, mut bytes) = (0i64, 0usize);
            for (k, v) in model.values() {
                keys = keys.wrapping_add(*k);
                bytes += v.len();
                rows += 1;
            }
            black_box((keys, bytes));
            rows
        })
    });
    group.finish();

    // One uncommitted epoch of changes to 1% of the keys (updates and new keys between).
    let changed: Vec<i64> = (0..ROWS / 100)
        .map(|_| rng.random_range(0..ROWS as i64 * 3))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let delta = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(changed.clone())),
            Arc::new(StringArray::from_iter_values(
                changed.iter().map(|k| format!("new-{k}")),
            )),
        ],
    )
    .unwrap();
    table.write(&StreamChunk::inserts(delta)).unwrap();
    table.seal(2).unwrap();
    let merged_rows = scan_rows(&table, 2);
    let mut group = c.benchmark_group("store_scan/1M_with_delta");
    group.throughput(Throughput::Elements(merged_rows as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("memory_store", |b| b.iter(|| scan_rows(&table, 2)));
    group.finish();
}

criterion_group!(benches, store_scan);
criterion_main!(benches);
