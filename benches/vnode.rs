//! Vnode hashing: the vectorized path (`compute_vnodes`) against the per-row crc32fast
//! reference (`vnode_of_row`), measured in the same run.
//!
//! Groups are named `vnode_hash/<key types>/<rows>`; each has the functions `vectorized` and
//! `per_row`. Data comes from a fixed seed, so every run hashes the same rows.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::vnode::{VnodeCount, compute_vnodes, vnode_of_row};
use arrow_array::{ArrayRef, Int64Array, StringArray};
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

fn vnode_hash(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let ints = int64_column(&mut rng);
    let strings = utf8_column(&mut rng);
    bench_group(c, "int64", std::slice::from_ref(&ints));
    bench_group(c, "utf8+int64", &[strings, ints]);
}

criterion_group!(benches, vnode_hash);
criterion_main!(benches);
