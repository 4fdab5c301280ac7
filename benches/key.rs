//! Primary-key encoding: arrow-row ([`PrimaryKey::encode`]) against a row-at-a-time baseline.
//!
//! Groups are named `key_encode/<key columns>/<rows>`; each measures, on the same batch:
//!
//! - `arrow_row`: `PrimaryKey::encode`, columnar, into one `BinaryArray`.
//! - `per_row`: the baseline. For each row it builds an owned, order-preserving
//!   (memcmp-able) `Vec<u8>` by hand, the way a row-at-a-time engine encodes a storage key:
//!   a null marker byte, then integers big-endian with the sign bit flipped, strings with
//!   `0x00` escaped as `0x00 0xff` and terminated by `0x00 0x00`, every byte of the column
//!   inverted when descending. It produces the same order as arrow-row (checked once, untimed,
//!   before measuring), so both do the same job; only the execution model differs.
//!
//! The data is generated once with a fixed seed and has no NULLs.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::key::{KeyColumn, PrimaryKey};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
const SEED: u64 = 0x6b65_7973;

/// Null marker of the baseline: NULL is the largest value, as in the crate's default order
/// for ascending columns. Unused with this data (no NULLs) but kept so the baseline pays for
/// the check like arrow-row does.
const NULL_MARKER: u8 = 0x02;
const VALUE_MARKER: u8 = 0x01;

fn int64_batch(rng: &mut StdRng) -> (RecordBatch, Vec<KeyColumn>) {
    let schema = Schema::new(vec![Field::new("i", DataType::Int64, true)]);
    let values = Int64Array::from_iter_values((0..ROWS).map(|_| rng.random::<i64>()));
    let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(values)]).unwrap();
    (batch, vec![KeyColumn::asc("i")])
}

fn utf8_int64_desc_batch(rng: &mut StdRng) -> (RecordBatch, Vec<KeyColumn>) {
    let schema = Schema::new(vec![
        Field::new("s", DataType::Utf8, true),
        Field::new("i", DataType::Int64, true),
    ]);
    let strings = StringArray::from_iter_values((0..ROWS).map(|_| {
        let len = rng.random_range(8..=16);
        (&mut *rng)
            .sample_iter(Alphanumeric)
            .take(len)
            .map(char::from)
            .collect::<String>()
    }));
    let ints = Int64Array::from_iter_values((0..ROWS).map(|_| rng.random::<i64>()));
    let batch =
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(strings), Arc::new(ints)]).unwrap();
    (batch, vec![KeyColumn::asc("s"), KeyColumn::desc("i")])
}

/// The baseline: one owned memcmp-able key per row, built value by value.
fn per_row(batch: &RecordBatch, columns: &[KeyColumn]) -> Vec<Vec<u8>> {
    let arrays: Vec<(&dyn Array, bool)> = columns
        .iter()
        .map(|c| {
            let idx = batch.schema().index_of(&c.name).unwrap();
            (batch.column(idx).as_ref(), c.descending)
        })
        .collect();
    (0..batch.num_rows())
        .map(|row| {
            // One allocation per row, sized for these keys (at most 1 + 17 + 1 + 2 + 1 + 8).
            let mut key = Vec::with_capacity(32);
            for &(array, descending) in &arrays {
                let start = key.len();
                if array.is_null(row) {
                    key.push(NULL_MARKER);
                } else {
                    key.push(VALUE_MARKER);
                    match array.data_type() {
                        DataType::Int64 => {
                            let v = array.as_primitive::<Int64Type>().value(row);
                            key.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
                        }
                        DataType::Utf8 => {
                            for &b in array.as_string::<i32>().value(row).as_bytes() {
                                key.push(b);
                                if b == 0 {
                                    key.push(0xff);
                                }
                            }
                            key.extend_from_slice(&[0, 0]);
                        }
                        other => unreachable!("no baseline encoding for {other}"),
                    }
                }
                if descending {
                    // Inverting the marker too keeps NULL the largest value.
                    key[start..].iter_mut().for_each(|b| *b = !*b);
                }
            }
            key
        })
        .collect()
}

fn bench_encode(c: &mut Criterion, name: &str, batch: &RecordBatch, columns: Vec<KeyColumn>) {
    let pk = PrimaryKey::new(&batch.schema(), columns.clone()).unwrap();

    // The baseline must order rows exactly like arrow-row, or the comparison is unfair.
    let keys = pk.encode(batch).unwrap();
    let baseline = per_row(batch, &columns);
    for i in 1..10_000 {
        assert_eq!(
            keys.value(i - 1).cmp(keys.value(i)),
            baseline[i - 1].cmp(&baseline[i]),
            "{name}: baseline and arrow-row disagree at row {i}"
        );
    }
    drop((keys, baseline));

    let mut group = c.benchmark_group(format!("key_encode/{name}/1M"));
    group
        .throughput(Throughput::Elements(ROWS as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function("arrow_row", |b| {
        b.iter(|| pk.encode(black_box(batch)).unwrap())
    });
    group.bench_function("per_row", |b| {
        b.iter(|| per_row(black_box(batch), &columns))
    });
    group.finish();
}

fn key_encode(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let (batch, columns) = int64_batch(&mut rng);
    bench_encode(c, "int64", &batch, columns);
    drop(batch);
    let (batch, columns) = utf8_int64_desc_batch(&mut rng);
    bench_encode(c, "utf8+int64_desc", &batch, columns);
}

criterion_group!(benches, key_encode);
criterion_main!(benches);
