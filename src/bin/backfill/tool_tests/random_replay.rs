//! Randomized end-to-end replays (issue 8): seeded random datasets (key types, composite and
//! descending keys, NULL values, empty and one-row tables, many tiny epochs) replayed with
//! random options on both stores, each output checked by `verify`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::job::replay::{ReplayOptions, RescalePoint, StateChoice, run_replay};
use crate::replay::{Dataset, verify};
use arrangement_backfill::backfill::SnapshotOrder;
use arrangement_backfill::vnode::VnodeCount;
use arrow_array::{
    ArrayRef, Float64Array, Int8Array, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::common_dataset::write_parquet;

/// A key: (first column as i64 seed, second column seed for composite keys).
type Key = (i64, i64);

#[derive(Clone, Copy, Debug)]
enum Shape {
    Int64,
    Utf8,
    Float64,
    /// (Int32 descending, Utf8).
    Composite,
}

impl Shape {
    fn key_fields(self) -> Vec<Field> {
        match self {
            Shape::Int64 => vec![Field::new("a", DataType::Int64, false)],
            Shape::Utf8 => vec![Field::new("a", DataType::Utf8, false)],
            Shape::Float64 => vec![Field::new("a", DataType::Float64, false)],
            Shape::Composite => vec![
                Field::new("a", DataType::Int32, false),
                Field::new("b", DataType::Utf8, false),
            ],
        }
    }

    fn manifest(self) -> String {
        match self {
            Shape::Composite => r#"{"name": "random", "primary_key": ["a", "b"], "distribution_key": ["b"], "order": {"a": "desc"}}"#.into(),
            _ => r#"{"name": "random", "primary_key": ["a"]}"#.into(),
        }
    }

    fn key_columns(self, keys: &[Key]) -> Vec<ArrayRef> {
        match self {
            Shape::Int64 => vec![Arc::new(Int64Array::from_iter_values(
                keys.iter().map(|k| k.0),
            ))],
            Shape::Utf8 => vec![Arc::new(StringArray::from_iter_values(
                keys.iter().map(|k| format!("key-{}", k.0)),
            ))],
            Shape::Float64 => vec![Arc::new(Float64Array::from_iter_values(
                keys.iter().map(|k| k.0 as f64 * 0.25),
            ))],
            Shape::Composite => vec![
                Arc::new(Int32Array::from_iter_values(
                    keys.iter().map(|k| k.0 as i32),
                )),
                Arc::new(StringArray::from_iter_values(
                    keys.iter().map(|k| format!("b{}", k.1)),
                )),
            ],
        }
    }
}

fn schema(shape: Shape) -> SchemaRef {
    let mut fields = shape.key_fields();
    fields.push(Field::new("v", DataType::Int64, true));
    fields.push(Field::new("s", DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

fn batch(shape: Shape, rows: &[(Key, Option<i64>, Option<String>)]) -> RecordBatch {
    let keys: Vec<Key> = rows.iter().map(|r| r.0).collect();
    let mut columns = shape.key_columns(&keys);
    columns.push(Arc::new(Int64Array::from(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
    )));
    columns.push(Arc::new(StringArray::from(
        rows.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
    )));
    RecordBatch::try_new(schema(shape), columns).unwrap()
}

fn value(rng: &mut StdRng) -> (Option<i64>, Option<String>) {
    let v = rng.random_bool(0.8).then(|| rng.random_range(-1000..1000));
    let s = rng
        .random_bool(0.8)
        .then(|| format!("value {}", rng.random_range(0..10_000)));
    (v, s)
}

/// Writes a random dataset into `dir`; returns it opened.
fn random_dataset(rng: &mut StdRng, dir: &Path) -> Dataset {
    let shape =
        [Shape::Int64, Shape::Utf8, Shape::Float64, Shape::Composite][rng.random_range(0..4)];
    std::fs::create_dir_all(dir.join("snapshot")).unwrap();
    std::fs::create_dir_all(dir.join("changes")).unwrap();
    std::fs::write(dir.join("dataset.json"), shape.manifest()).unwrap();
    let rows = match rng.random_range(0..5) {
        0 => 0,
        1 => 1,
        _ => rng.random_range(2..400),
    };
    let mut next_key = 0i64;
    let mut fresh = |rng: &mut StdRng| -> Key {
        next_key += rng.random_range(1..4);
        (next_key, rng.random_range(0..5))
    };
    let mut live: Vec<(Key, Option<i64>, Option<String>)> = Vec::new();
    for _ in 0..rows {
        let (v, s) = value(rng);
        live.push((fresh(rng), v, s));
    }
    write_parquet(&dir.join("snapshot/part-0.parquet"), &batch(shape, &live));
    // Many tiny epochs of inserts, deletes and update pairs that apply to the live rows.
    let epochs = rng.random_range(1..30u64);
    let mut changes: Vec<(Key, Option<i64>, Option<String>)> = Vec::new();
    let mut ops: Vec<i8> = Vec::new();
    let mut epoch_of: Vec<u64> = Vec::new();
    for epoch in 1..=epochs {
        for _ in 0..rng.random_range(0..12) {
            let kind = rng.random_range(0..3);
            if kind == 0 || live.is_empty() {
                let (v, s) = value(rng);
                let row = (fresh(rng), v, s);
                changes.push(row.clone());
                ops.push(1);
                epoch_of.push(epoch);
                live.push(row);
            } else if kind == 1 {
                let i = rng.random_range(0..live.len());
                let row = live.swap_remove(i);
                changes.push(row);
                ops.push(2);
                epoch_of.push(epoch);
            } else {
                let i = rng.random_range(0..live.len());
                let (v, s) = value(rng);
                let new = (live[i].0, v, s);
                changes.push(live[i].clone());
                changes.push(new.clone());
                ops.extend([3, 4]);
                epoch_of.extend([epoch, epoch]);
                live[i] = new;
            }
        }
    }
    if !changes.is_empty() {
        let data = batch(shape, &changes);
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(epoch_of)),
            Arc::new(Int8Array::from(ops)),
        ];
        columns.extend(data.columns().iter().cloned());
        let mut fields = vec![
            Field::new("_epoch", DataType::UInt64, false),
            Field::new("_op", DataType::Int8, false),
        ];
        fields.extend(data.schema().fields().iter().map(|f| f.as_ref().clone()));
        let changelog = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        write_parquet(&dir.join("changes/part-0.parquet"), &changelog);
    }
    Dataset::open(dir).unwrap()
}

fn random_options(rng: &mut StdRng, out: &Path) -> ReplayOptions {
    let mut o = ReplayOptions::new(out);
    o.vnodes = VnodeCount::new([1, 4, 64, 256][rng.random_range(0..4)]).unwrap();
    o.batch_size = [1, 7, 64, 1024][rng.random_range(0..4)];
    o.order = if rng.random_bool(0.5) {
        SnapshotOrder::Merged
    } else {
        SnapshotOrder::PerVnode
    };
    o.checkpoint_every = rng.random_range(1..4);
    o.barrier_interval = rng.random_bool(0.3).then(|| Duration::from_millis(1));
    if rng.random_bool(0.3) {
        o.state = StateChoice::Memory;
    }
    o
}

#[test]
fn random_datasets_with_random_options_replay_exactly_once() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let tmp = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for case in 0..40 {
        let dataset = random_dataset(&mut rng, &tmp.path().join(format!("ds-{case}")));
        let out = tmp.path().join(format!("out-{case}"));
        let mut options = random_options(&mut rng, &out);
        // Actors and rescales from a generator of their own, so the cases stay as they were.
        let mut actors = StdRng::seed_from_u64(case);
        let vnodes = options.vnodes.get();
        options.parallelism = actors.random_range(1..=3).min(vnodes);
        options.rescales = (0..actors.random_range(0..3))
            .map(|_| RescalePoint {
                after_epoch: actors.random_range(1..8),
                actors: actors.random_range(1..=3).min(vnodes),
            })
            .collect();
        let summary = runtime
            .block_on(run_replay(&dataset, &options, |_| {}))
            .unwrap_or_else(|e| panic!("case {case} ({options:?}): {e}"));
        let certificate = summary
            .certificate
            .clone()
            .expect("a finished replay certifies");
        assert!(
            certificate.matches(),
            "case {case} ({options:?}): {certificate:?}"
        );
        verify(&dataset, &out)
            .unwrap_or_else(|e| panic!("case {case} ({options:?}, {summary:?}): {e}"));
    }
}
