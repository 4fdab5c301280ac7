//! Seeded fuzz of the job API against a `BTreeMap` model of the upstream: random tables,
//! random changes (inserts, deletes, updates, deletes by key as NULL values or as changelog
//! batches with only the key, changelog batches with their own `_epoch`s), random options
//! (parallelism, order, batch size, checkpoint spacing, barrier interval), and every run
//! interrupted at a random message in one of three ways (dropped, stopped with
//! `JobControl::stop`, shut down), then resumed from its resume point on the durable store
//! with the changes after it. The output of all runs, each run's kept up to the checkpoint the
//! next one resumes from, must be the final table: every row exactly once, never a row twice.
//!
//! `JOB_FUZZ_SEEDS=a..b` runs other seeds (default `0..12`); a failure names its seed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::{
    BackfillJob, Change, DurableStore, Error, JobOptions, KeyColumn, Message, SnapshotOrder,
    StreamChunk, TableDesc, load_table,
};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int8Array, Int64Array, RecordBatch, RecordBatchIterator, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

type Model = BTreeMap<i64, i64>;

/// A change of the model: `(op code, key, value)`; deletes carry the old value.
type Row = (i8, i64, Option<i64>);

/// Random epochs of valid changes to `model` (applied to it).
fn epochs(rng: &mut StdRng, model: &mut Model, n: usize, span: i64) -> Vec<Vec<Row>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut rows = Vec::new();
        for _ in 0..rng.random_range(0..40) {
            let k = rng.random_range(0..span);
            let v = rng.random_range(0..1000);
            match model.get(&k).copied() {
                None => {
                    model.insert(k, v);
                    rows.push((1, k, Some(v)));
                }
                Some(old) if rng.random_bool(0.4) => {
                    model.remove(&k);
                    rows.push((2, k, Some(old)));
                }
                Some(old) => {
                    model.insert(k, v);
                    rows.push((3, k, Some(old)));
                    rows.push((4, k, Some(v)));
                }
            }
        }
        out.push(rows);
    }
    out
}

/// The changes as the job takes them: per epoch, a chunk or a changelog batch (with `_epoch`
/// when `tagged`), deletes now and then by key only; a barrier after some epochs.
fn as_changes(rng: &mut StdRng, epochs: &[Vec<Row>], tagged: bool) -> Vec<Change> {
    let mut out = Vec::new();
    for (e, rows) in epochs.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let by_key = rng.random_bool(0.3);
        let rows: Vec<Row> = rows
            .iter()
            .map(|&(op, k, v)| (op, k, if op == 2 && by_key { None } else { v }))
            .collect();
        let ops = Int8Array::from_iter_values(rows.iter().map(|r| r.0));
        let keys = Int64Array::from_iter_values(rows.iter().map(|r| r.1));
        let values = Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>());
        let only_deletes = rows.iter().all(|r| r.0 == 2);
        if tagged || (only_deletes && by_key) {
            let mut fields = vec![];
            let mut columns: Vec<Arc<dyn Array>> = vec![];
            if tagged {
                fields.push(Field::new("_epoch", DataType::UInt64, false));
                columns.push(Arc::new(UInt64Array::from(vec![
                    100 + e as u64;
                    rows.len()
                ])));
            }
            fields.push(Field::new("_op", DataType::Int8, false));
            columns.push(Arc::new(ops));
            fields.push(Field::new("k", DataType::Int64, false));
            columns.push(Arc::new(keys));
            if !(only_deletes && by_key) {
                fields.push(Field::new("v", DataType::Int64, true));
                columns.push(Arc::new(values));
            }
            let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
            out.push(Change::Changelog(batch));
        } else {
            let batch =
                RecordBatch::try_new(schema(), vec![Arc::new(keys), Arc::new(values)]).unwrap();
            let ops: Vec<_> = (rows.iter())
                .map(|r| arrangement_backfill::Op::from_code(r.0).unwrap())
                .collect();
            out.push(Change::Chunk(StreamChunk::new(batch, ops).unwrap()));
        }
        if rng.random_bool(0.5) {
            out.push(if rng.random_bool(0.3) {
                Change::Checkpoint
            } else {
                Change::Barrier
            });
        }
    }
    out
}

/// `changes` without their first `skip` rows.
fn after(changes: &[Change], mut skip: usize) -> Vec<Change> {
    let mut out = Vec::new();
    for change in changes {
        let rows = match change {
            Change::Chunk(c) => c.num_rows(),
            Change::Changelog(b) => b.num_rows(),
            _ => 0,
        };
        if rows == 0 {
            if skip == 0 {
                out.push(change.clone());
            }
            continue;
        }
        if skip >= rows {
            skip -= rows;
            continue;
        }
        let cut = match change {
            Change::Chunk(c) => {
                let (batch, ops) = c.clone().into_parts();
                Change::Chunk(
                    StreamChunk::new(batch.slice(skip, rows - skip), ops[skip..].to_vec()).unwrap(),
                )
            }
            Change::Changelog(b) => Change::Changelog(b.slice(skip, rows - skip)),
            other => other.clone(),
        };
        skip = 0;
        out.push(cut);
    }
    assert_eq!(skip, 0, "the resume point is past the changes");
    out
}

/// The output, netted per `(k, v)`, each count 0 or 1 at every step.
#[derive(Debug, Default, PartialEq)]
struct Net(BTreeMap<(i64, i64), i64>);

impl Net {
    fn add(&mut self, chunk: &StreamChunk, seed: u64) {
        let k = chunk.batch().column(0).as_primitive::<Int64Type>();
        let v = chunk.batch().column(1).as_primitive::<Int64Type>();
        for (i, op) in chunk.ops().iter().enumerate() {
            assert!(v.is_valid(i), "seed {seed}: a NULL value in the output");
            let n = self.0.entry((k.value(i), v.value(i))).or_default();
            *n += if op.is_insert() { 1 } else { -1 };
            assert!(
                *n == 0 || *n == 1,
                "seed {seed}: row ({}, {}) counted {n}",
                k.value(i),
                v.value(i)
            );
        }
        self.0.retain(|_, n| *n != 0);
    }
}

fn open(dir: &std::path::Path) -> DurableStore {
    for _ in 0..500 {
        match DurableStore::open(dir) {
            Ok(store) => return store,
            // A dropped job's tasks let go of the store a moment later.
            Err(Error::Locked { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the store stayed locked");
}

async fn fuzz(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let span = rng.random_range(10..600);
    let mut model = Model::new();
    for k in 0..span {
        if rng.random_bool(0.6) {
            model.insert(k, rng.random_range(0..1000));
        }
    }
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(model.keys().copied())),
            Arc::new(Int64Array::from(
                model.values().map(|&v| Some(v)).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap();
    {
        let store = DurableStore::open(dir.path()).unwrap();
        let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap();
        load_table(
            &store,
            desc,
            RecordBatchIterator::new([Ok(batch)], schema()),
        )
        .unwrap();
    }
    let n_epochs = rng.random_range(0..25);
    let plan = epochs(&mut rng, &mut model, n_epochs, span * 2);
    let tagged = rng.random_bool(0.4);
    let all = as_changes(&mut rng, &plan, tagged);
    let options = JobOptions {
        parallelism: rng.random_range(1..5),
        order: if rng.random_bool(0.5) {
            SnapshotOrder::Merged
        } else {
            SnapshotOrder::PerVnode
        },
        batch_size: rng.random_range(1..200),
        checkpoint_every: rng.random_range(1..4),
        barrier_interval: if rng.random_bool(0.5) {
            Some(Duration::from_millis(rng.random_range(1..20)))
        } else {
            None
        },
        rate_limit: Some(rng.random_range(2_000..50_000)),
        ..JobOptions::default()
    };
    let mut net = Net::default();
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 40, "seed {seed}: no end after 40 runs");
        let store = open(dir.path());
        let resume = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
        if resume.ended {
            break;
        }
        if std::env::var("JOB_FUZZ_DEBUG").is_ok() {
            eprintln!("seed {seed} run {runs}: {resume:?} tagged {tagged} options {options:?}");
        }
        let source =
            futures::stream::iter(after(&all, resume.changes as usize).into_iter().map(Ok));
        let mut job = BackfillJob::start(&store, "view", "t", options.clone(), source)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        drop(store);
        // This run's output by epoch; kept up to the checkpoint the next run resumes from.
        let mut output: BTreeMap<u64, Vec<StreamChunk>> = BTreeMap::new();
        let mut epoch = resume.epoch;
        let interrupt_at = rng.random_range(0..60);
        let how = rng.random_range(0..4);
        let mut messages = 0;
        let mut stopped = false;
        let mut interrupted = false;
        while let Some(message) = job.next().await {
            match message.unwrap_or_else(|e| panic!("seed {seed}: {e}")) {
                Message::Chunk(chunk) => output.entry(epoch).or_default().push(chunk),
                Message::Barrier(b) => epoch = b.epoch.curr,
                Message::Watermark(_) => {}
            }
            messages += 1;
            if messages == interrupt_at && how < 3 {
                match how {
                    0 => {
                        interrupted = true;
                        break;
                    }
                    1 => {
                        let _ = job.control().stop();
                        stopped = true;
                    }
                    _ => {
                        interrupted = true;
                        break;
                    }
                }
            }
        }
        if interrupted && how == 2 {
            job.shutdown().await;
        } else {
            drop(job);
        }
        let _ = stopped;
        let store = open(dir.path());
        let next = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
        drop(store);
        let kept = next.checkpoint.unwrap_or(0);
        for (_, chunks) in output.range(..=kept) {
            for chunk in chunks {
                net.add(chunk, seed);
            }
        }
    }
    let expected: BTreeMap<(i64, i64), i64> = model.iter().map(|(&k, &v)| ((k, v), 1)).collect();
    assert_eq!(
        net.0, expected,
        "seed {seed}: the output is not the table ({runs} runs)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_interrupted_and_resumed_emit_every_row_exactly_once() {
    let seeds = std::env::var("JOB_FUZZ_SEEDS").unwrap_or_else(|_| "0..12".into());
    let (a, b) = seeds.split_once("..").expect("JOB_FUZZ_SEEDS=a..b");
    for seed in a.parse::<u64>().unwrap()..b.parse::<u64>().unwrap() {
        fuzz(seed).await;
    }
}
