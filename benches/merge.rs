//! Merging per-vnode snapshot scans: the k-way merge (primitive and row cursors), the
//! unordered round-robin mode, and a concat + sort baseline, side by side.
//!
//! 1M rows `(k Int64 not null, v Int64)`, keys `0..1M` dealt at random (fixed seed) to 16 or
//! 256 inputs, so every input is sorted and keys interleave across inputs. Inputs come in
//! batches of 1024 rows with their encoded keys (encoding is not measured); the mergers emit
//! batches of 1024 rows. The baseline concatenates every input batch, sorts by `k` and takes:
//! it produces no encoded keys and no per-vnode progress, so it is a lower bound on work, not
//! a replacement.
//!
//! `merge_composite/256x1M` has a TPC-H `lineitem`-like composite key
//! `(l_orderkey Int64, l_linenumber Int32)`: 250k orders of 1 to 7 lines each (about 1M rows),
//! rows dealt at random to 256 inputs, merged with the row cursor (the only one for a composite
//! key), against concatenating and sorting with `lexsort_to_indices` + `take`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::Result;
use arrangement_backfill::key::{KeyColumn, PrimaryKey};
use arrangement_backfill::merge::{KWayMerge, RoundRobin, SnapshotMerger};
use arrangement_backfill::store::{KeyedBatch, SnapshotScan};
use arrangement_backfill::vnode::VirtualNode;
use arrow_array::{Int32Array, Int64Array, RecordBatch};
use arrow_ord::sort::{SortColumn, lexsort_to_indices, sort_to_indices};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
const BATCH: usize = 1024;

/// A scan over batches kept in memory.
struct Batches(std::vec::IntoIter<KeyedBatch>);

impl SnapshotScan for Batches {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        Ok(self.0.next())
    }
}

type Inputs = Vec<(VirtualNode, Vec<KeyedBatch>)>;

fn inputs(pk: &PrimaryKey, schema: &Arc<Schema>, num_inputs: usize) -> Inputs {
    let mut rng = StdRng::seed_from_u64(42);
    let mut keys: Vec<Vec<i64>> = vec![Vec::new(); num_inputs];
    for k in 0..ROWS as i64 {
        keys[rng.random_range(0..num_inputs)].push(k);
    }
    keys.into_iter()
        .enumerate()
        .map(|(i, keys)| {
            let batches = keys
                .chunks(BATCH)
                .map(|chunk| {
                    let values: Int64Array = chunk.iter().map(|_| rng.random::<i64>()).collect();
                    let batch = RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(Int64Array::from(chunk.to_vec())), Arc::new(values)],
                    )
                    .unwrap();
                    let keys = pk.encode(&batch).unwrap();
                    KeyedBatch { batch, keys }
                })
                .collect();
            (VirtualNode::new(i as u16), batches)
        })
        .collect()
}

fn scans(inputs: &Inputs) -> Vec<(VirtualNode, Batches)> {
    inputs
        .iter()
        .map(|(v, b)| (*v, Batches(b.clone().into_iter())))
        .collect()
}

/// Drains a merger, returning the rows it emitted.
fn run(mut merger: impl SnapshotMerger) -> usize {
    let mut rows = 0;
    while let Some(output) = merger.next_output().unwrap() {
        rows += output.batch.num_rows();
        black_box(output);
    }
    assert_eq!(rows, ROWS);
    rows
}

fn concat_sort(inputs: &Inputs) -> RecordBatch {
    let batches: Vec<&RecordBatch> = inputs
        .iter()
        .flat_map(|(_, b)| b.iter().map(|b| &b.batch))
        .collect();
    let all = concat_batches(&batches[0].schema(), batches).unwrap();
    let indices = sort_to_indices(all.column(0), None, None).unwrap();
    take_record_batch(&all, &indices).unwrap()
}

fn bench_merge(c: &mut Criterion) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("k")]).unwrap();
    for num_inputs in [16, 256] {
        let inputs = inputs(&pk, &schema, num_inputs);
        let mut group = c.benchmark_group(format!("merge/{num_inputs}x1M"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4))
            .throughput(Throughput::Elements(ROWS as u64));
        group.bench_function("kway", |b| {
            b.iter_batched(
                || scans(&inputs),
                |scans| run(KWayMerge::new(&pk, scans, BATCH).unwrap()),
                BatchSize::LargeInput,
            )
        });
        group.bench_function("kway_rows", |b| {
            b.iter_batched(
                || scans(&inputs),
                |scans| run(KWayMerge::with_row_cursor(scans, BATCH).unwrap()),
                BatchSize::LargeInput,
            )
        });
        group.bench_function("round_robin", |b| {
            b.iter_batched(
                || scans(&inputs),
                |scans| run(RoundRobin::new(scans)),
                BatchSize::LargeInput,
            )
        });
        group.bench_function("concat_sort", |b| {
            b.iter(|| black_box(concat_sort(&inputs)))
        });
        group.finish();
    }
}

/// Rows of `(l_orderkey, l_linenumber, v)`, dealt at random to `num_inputs` inputs, each input
/// in key order. Returns the inputs and the number of rows.
fn composite_inputs(pk: &PrimaryKey, schema: &Arc<Schema>, num_inputs: usize) -> (Inputs, usize) {
    let mut rng = StdRng::seed_from_u64(43);
    let mut keys: Vec<Vec<(i64, i32)>> = vec![Vec::new(); num_inputs];
    let mut rows = 0;
    for order in 1..=250_000_i64 {
        for line in 1..=rng.random_range(1..=7_i32) {
            keys[rng.random_range(0..num_inputs)].push((order, line));
            rows += 1;
        }
    }
    let inputs = keys
        .into_iter()
        .enumerate()
        .map(|(i, keys)| {
            let batches = keys
                .chunks(BATCH)
                .map(|chunk| {
                    let orders: Int64Array = chunk.iter().map(|&(o, _)| o).collect();
                    let lines: Int32Array = chunk.iter().map(|&(_, l)| l).collect();
                    let values: Int64Array = chunk.iter().map(|_| rng.random::<i64>()).collect();
                    let batch = RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(orders), Arc::new(lines), Arc::new(values)],
                    )
                    .unwrap();
                    let keys = pk.encode(&batch).unwrap();
                    KeyedBatch { batch, keys }
                })
                .collect();
            (VirtualNode::new(i as u16), batches)
        })
        .collect();
    (inputs, rows)
}

fn concat_lexsort(inputs: &Inputs) -> RecordBatch {
    let batches: Vec<&RecordBatch> = inputs
        .iter()
        .flat_map(|(_, b)| b.iter().map(|b| &b.batch))
        .collect();
    let all = concat_batches(&batches[0].schema(), batches).unwrap();
    let columns: Vec<SortColumn> = (0..2)
        .map(|c| SortColumn {
            values: all.column(c).clone(),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&columns, None).unwrap();
    take_record_batch(&all, &indices).unwrap()
}

fn bench_composite(c: &mut Criterion) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("l_orderkey", DataType::Int64, false),
        Field::new("l_linenumber", DataType::Int32, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let key = vec![KeyColumn::asc("l_orderkey"), KeyColumn::asc("l_linenumber")];
    let pk = PrimaryKey::new(&schema, key).unwrap();
    let num_inputs = 256;
    let (inputs, rows) = composite_inputs(&pk, &schema, num_inputs);
    let mut group = c.benchmark_group(format!("merge_composite/{num_inputs}x1M"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(rows as u64));
    group.bench_function("kway", |b| {
        b.iter_batched(
            || scans(&inputs),
            |scans| {
                let mut merge = KWayMerge::new(&pk, scans, BATCH).unwrap();
                let mut emitted = 0;
                while let Some(output) = merge.next_output().unwrap() {
                    emitted += output.batch.num_rows();
                    black_box(output);
                }
                assert_eq!(emitted, rows);
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("concat_sort", |b| {
        b.iter(|| black_box(concat_lexsort(&inputs)))
    });
    group.finish();
}

criterion_group!(benches, bench_merge, bench_composite);
criterion_main!(benches);
