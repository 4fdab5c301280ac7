//! Vnode hashing: the vectorized path (`compute_vnodes`) against the per-row crc32fast
//! reference (`vnode_of_row`), measured in the same run.
//!
//! Groups are named `vnode_hash/<key types>/<rows>`; each has the functions `vectorized` and
//! `per_row`. Data comes from a fixed seed, so every run hashes the same rows.
//!
//! `row_hash/lineitem_shaped/1M`: the completion certificate's row hash (`mix64_rows`, every
//! column of a row) against the vnode hash's CRC-32 walk over the same 16 columns
//! (`hash_rows`): lineitem's integers, decimals, dates, four flag-like strings and a free-text
//! comment of 10 to 43 bytes, strings as `Utf8View` (as the store hands them out).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::vnode::{
    VnodeCount, compute_vnodes, hash_rows, mix64_rows, vnode_of_row,
};
use arrow_array::{
    ArrayRef, Date32Array, Decimal128Array, Int32Array, Int64Array, StringArray, StringViewArray,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
const SEED: u64 = 0x5EED_0000_BACF_1111;

fn int64_column(rng: &mut StdRng) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(
        (0..ROWS).map(|_| rng.random::<i64>()),
    ))
}

/// Strings of 4 to 24 ASCII letters, so that a few fit a view inline and most do not.
fn utf8_column(rng: &mut StdRng) -> ArrayRef {
    let values = (0..ROWS).map(|_| {
        let len = rng.random_range(4..=24);
        (0..len)
            .map(|_| char::from(rng.random_range(b'a'..=b'z')))
            .collect::<String>()
    });
    Arc::new(StringArray::from_iter_values(values))
}

fn bench_group(c: &mut Criterion, name: &str, columns: &[ArrayRef]) {
    let count = VnodeCount::DEFAULT;
    let mut group = c.benchmark_group(format!("vnode_hash/{name}/1M"));
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("vectorized", |b| {
        b.iter(|| compute_vnodes(black_box(columns), ROWS, count).unwrap())
    });
    group.bench_function("per_row", |b| {
        b.iter(|| {
            let columns = black_box(columns);
            (0..ROWS)
                .map(|row| vnode_of_row(columns, row, count).unwrap())
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

/// Lineitem's 16 columns, 1M rows: keys, integers, decimals, dates, flags and free text.
fn lineitem_shaped(rng: &mut StdRng) -> Vec<ArrayRef> {
    let mut columns: Vec<ArrayRef> = Vec::new();
    for _ in 0..3 {
        columns.push(Arc::new(Int64Array::from_iter_values(
            (0..ROWS).map(|_| rng.random_range(0..6_000_000)),
        )));
    }
    columns.push(Arc::new(Int32Array::from_iter_values(
        (0..ROWS).map(|_| rng.random_range(1..=7)),
    )));
    for _ in 0..4 {
        let values = (0..ROWS).map(|_| rng.random_range(0..10_000_000i128));
        let array = Decimal128Array::from_iter_values(values).with_precision_and_scale(15, 2);
        columns.push(Arc::new(array.unwrap()));
    }
    for _ in 0..3 {
        columns.push(Arc::new(Date32Array::from_iter_values(
            (0..ROWS).map(|_| rng.random_range(8000..10_500)),
        )));
    }
    let flags: [&[&str]; 4] = [
        &["A", "N", "R"],
        &["F", "O"],
        &[
            "DELIVER IN PERSON",
            "COLLECT COD",
            "NONE",
            "TAKE BACK RETURN",
        ],
        &["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"],
    ];
    for values in flags {
        columns.push(Arc::new(StringViewArray::from_iter_values(
            (0..ROWS).map(|_| values[rng.random_range(0..values.len())]),
        )));
    }
    let comments = (0..ROWS).map(|_| {
        let len = rng.random_range(10..=43);
        (0..len)
            .map(|_| char::from(rng.random_range(b'a'..=b'z')))
            .collect::<String>()
    });
    columns.push(Arc::new(StringViewArray::from_iter_values(comments)));
    columns
}

fn row_hash(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let columns = lineitem_shaped(&mut rng);
    let mut group = c.benchmark_group("row_hash/lineitem_shaped/1M");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("mix64", |b| {
        b.iter(|| mix64_rows(black_box(&columns), ROWS).unwrap())
    });
    group.bench_function("crc32", |b| {
        b.iter(|| hash_rows(black_box(&columns), ROWS).unwrap())
    });
    group.finish();
}

fn vnode_hash(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let ints = int64_column(&mut rng);
    let strings = utf8_column(&mut rng);
    bench_group(c, "int64", std::slice::from_ref(&ints));
    bench_group(c, "utf8+int64", &[strings, ints]);
}

criterion_group!(benches, vnode_hash, row_hash);
criterion_main!(benches);
