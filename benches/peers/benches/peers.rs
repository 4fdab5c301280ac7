//! Our merge and backfill against DataFusion 55's sort-preserving merge and a plain copy, in
//! one run, on the very same per-vnode sorted inputs (see the crate docs in `src/lib.rs`).
//!
//! `peers/{case}/{inputs}x{rows}`, cases `int64`, `utf8+int64` and `full4`, 16 and 256 inputs,
//! 1M rows (`PEERS_ROWS` overrides), fixed seed, throughput in rows:
//! - `datafusion`: `StreamingMergeBuilder` over one stream per vnode;
//! - `kway`: our `KWayMerge`, keys pre-encoded (as the store hands them out);
//! - `kway_encoding`: our `KWayMerge`, encoding keys in the scan (as DataFusion must);
//! - `copy`: `concat_batches` of every input batch (the memory-bandwidth floor);
//! - `full4` only: `backfill_merged` and `backfill_per_vnode`, the snapshot side of a backfill
//!   over the store the inputs were scanned from (the issue-4 kernel targets: merged at least
//!   3x `datafusion`, per vnode (unordered) at least 0.5x `copy`).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arrangement_backfill::SnapshotOrder;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use peers::{Case, Inputs, backfill, copy, datafusion_merge, kway_merge, kway_merge_encoding};

const SEED: u64 = 0x9EE2_5000_0000_0001;

fn rows() -> usize {
    std::env::var("PEERS_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000)
}

fn label(rows: usize) -> String {
    if rows.is_multiple_of(1_000_000) {
        format!("{}M", rows / 1_000_000)
    } else {
        format!("{}k", rows / 1000)
    }
}

fn peers(c: &mut Criterion) {
    let runtime = peers::runtime();
    let runs = AtomicUsize::new(0);
    let rows = rows();
    for case in Case::ALL {
        for vnodes in [16, 256] {
            let inputs = Inputs::new(case, vnodes, rows, SEED).unwrap();
            let mut group =
                c.benchmark_group(format!("peers/{}/{vnodes}x{}", case.name(), label(rows)));
            group
                .sample_size(10)
                .sampling_mode(SamplingMode::Flat)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(3))
                .throughput(Throughput::Elements(rows as u64));
            group.bench_function("datafusion", |b| {
                b.iter(|| {
                    assert_eq!(
                        datafusion_merge(&runtime, &inputs, &mut None).unwrap(),
                        rows
                    )
                })
            });
            group.bench_function("kway", |b| {
                b.iter(|| assert_eq!(kway_merge(&inputs, &mut None).unwrap(), rows))
            });
            group.bench_function("kway_encoding", |b| {
                b.iter(|| assert_eq!(kway_merge_encoding(&inputs, &mut None).unwrap(), rows))
            });
            group.bench_function("copy", |b| b.iter(|| black_box(copy(&inputs).unwrap())));
            if case == Case::Full4 {
                for (name, order) in [
                    ("backfill_merged", SnapshotOrder::Merged),
                    ("backfill_per_vnode", SnapshotOrder::PerVnode),
                ] {
                    group.bench_function(name, |b| {
                        b.iter(|| {
                            let run = runs.fetch_add(1, Ordering::Relaxed);
                            assert_eq!(backfill(&runtime, &inputs, order, run).unwrap(), rows)
                        })
                    });
                }
            }
            group.finish();
        }
    }
}

criterion_group!(benches, peers);
criterion_main!(benches);
