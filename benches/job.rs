//! The job's upstream checks: what checking every change against the table costs.
//!
//! `job_checks/{memory,durable}/{checked,trusted}`: a table `(k Int64 key, v Int64)` of 1M rows
//! over 256 vnodes, loaded once (`load_table`; the durable store in a temporary directory).
//! Each iteration runs a new job (a new name, so a fresh backfill of the whole table) fed
//! 200k change rows (40 epochs of 5,000: updates, deletes and inserts of keys spread over the
//! table, each epoch's changes against the table as the previous epochs left it) to its end.
//! `checked` is `JobOptions::default()`; `trusted` turns the checks off
//! (`check_changes: false`). The ratio is what the checks cost a job whose changes are a
//! fifth of its table; the checks look up every changed key (one store read each, the open
//! epoch's changes in a hash map).
//!
//! The same changes go to both, in turn, on the same store: each job applies them to the
//! table, so every iteration first restores the table by applying their inverse (untimed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrangement_backfill::{
    BackfillJob, Change, DurableStore, JobOptions, KeyColumn, MemoryStore, StateStore, StreamChunk,
    TableDesc, load_table,
};
use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: i64 = 1_000_000;
const EPOCHS: usize = 40;
const PER_EPOCH: usize = 5_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// Each epoch's changes as text, and the inverse that restores the table.
fn changes() -> (Vec<String>, Vec<String>) {
    let mut rng = StdRng::seed_from_u64(42);
    let mut table: std::collections::BTreeMap<i64, i64> = (0..ROWS).map(|k| (k, k)).collect();
    let (mut forward, mut backward) = (Vec::new(), Vec::new());
    for _ in 0..EPOCHS {
        let (mut text, mut undo) = (String::new(), Vec::new());
        let mut touched = std::collections::BTreeSet::new();
        while touched.len() < PER_EPOCH {
            let k = rng.random_range(0..ROWS * 11 / 10);
            if !touched.insert(k) {
                continue;
            }
            match table.get(&k).copied() {
                Some(old) if rng.random_bool(0.25) => {
                    table.remove(&k);
                    text.push_str(&format!("- {k} {old}\n"));
                    undo.push(format!("+ {k} {old}\n"));
                }
                Some(old) => {
                    let new = old + 1;
                    table.insert(k, new);
                    text.push_str(&format!("U- {k} {old}\nU+ {k} {new}\n"));
                    undo.push(format!("U- {k} {new}\nU+ {k} {old}\n"));
                }
                None => {
                    table.insert(k, k);
                    text.push_str(&format!("+ {k} {k}\n"));
                    undo.push(format!("- {k} {k}\n"));
                }
            }
        }
        undo.reverse();
        forward.push(text);
        backward.push(undo.concat());
    }
    backward.reverse();
    (forward, backward)
}

fn source(epochs: &[String]) -> Vec<arrangement_backfill::Result<Change>> {
    let mut out = Vec::new();
    for text in epochs {
        let chunk = StreamChunk::from_text(&schema(), text).expect("valid changes");
        out.push(Ok(Change::Chunk(chunk)));
        out.push(Ok(Change::Barrier));
    }
    out
}

/// Runs job `name` over `changes` to its end.
async fn run<S: StateStore>(
    store: &S,
    name: &str,
    changes: Vec<arrangement_backfill::Result<Change>>,
    check: bool,
) {
    let options = JobOptions {
        check_changes: check,
        batch_size: 8192,
        barrier_interval: None,
        ..JobOptions::default()
    };
    let mut job = BackfillJob::start(store, name, "t", options, futures::stream::iter(changes))
        .expect("job starts");
    while let Some(message) = job.next().await {
        message.expect("the job runs");
    }
    job.shutdown().await;
}

fn bench_store<S: StateStore>(c: &mut Criterion, label: &str, store: S) {
    let rows = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS)),
            Arc::new(Int64Array::from_iter_values(0..ROWS)),
        ],
    )
    .expect("rows");
    let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).expect("table");
    load_table(&store, desc, RecordBatchIterator::new([Ok(rows)], schema())).expect("load");
    let (forward, backward) = changes();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group(format!("job_checks/{label}"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let mut n = 0u64;
    for (name, check) in [("checked", true), ("trusted", false)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let started = Instant::now();
                    runtime.block_on(run(&store, &format!("view{n}"), source(&forward), check));
                    total += started.elapsed();
                    // Untimed: the table back as loaded, for the next iteration.
                    n += 1;
                    runtime.block_on(run(&store, &format!("undo{n}"), source(&backward), false));
                }
                total
            })
        });
    }
    group.finish();
}

fn checks(c: &mut Criterion) {
    bench_store(c, "memory", MemoryStore::new());
    let dir = tempfile::tempdir().expect("temporary directory");
    bench_store(
        c,
        "durable",
        DurableStore::open(dir.path()).expect("durable store"),
    );
}

criterion_group!(benches, checks);
criterion_main!(benches);
