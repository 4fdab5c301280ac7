//! Hostile input (issue 8, input hardening): each case a hostile but realistic user (or
//! embedder) tried, with the answer the tool now gives: options out of range, keys equal only
//! by SQL's rules (-0.0, NaN payloads), duplicate and reserved column names, files a dataset
//! skips. Tool-level cases run the `backfill` binary; library cases drive [`BackfillCore`]
//! directly, including a seeded property test over random schemas and chunks that must give
//! an `Error` or the right answer, never a panic. Issue 8's column type cases (items 10 and
//! 12) are in `types_edge.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrangement_backfill::backfill::{Action, ArrangementTracker, BackfillCore, Phase};
use arrangement_backfill::backfill::{ProgressCodec, ProgressMap, VnodeProgress};
use arrangement_backfill::chunk::{
    Barrier, BarrierKind, EpochPair, Mutation, Op, StreamChunk, changelog_schema,
};
use arrangement_backfill::key::{KeyColumn, Position, PrimaryKey};
use arrangement_backfill::table::{Distribution, TableDesc};
use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount, vnode_of_row};
use arrangement_backfill::{Error, Result};
use arrow_array::{
    ArrayRef, BooleanArray, Date32Array, FixedSizeBinaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::cli::{ok, p, refused, replay_args, run, synthetic, text};
use common::dataset::{record_batch, write_dataset};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs `args`: exit status 2, every needle in stderr, no panic.
fn exits_two(args: &[&str], needles: &[&str]) {
    refused(&run(args), needles);
}

/// The changelog form of `chunk` at `epoch`.
fn log(chunk: &StreamChunk, epoch: u64) -> RecordBatch {
    chunk.to_changelog(Some(epoch)).unwrap()
}

fn small_dataset(dir: &Path) -> PathBuf {
    synthetic(dir.join("small"), &["--scale", "0.002", "--epochs", "3"])
}

// ---------------------------------------------------------------------------------------------
// Items 5 and 13: options are checked before anything is touched, exit 2
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_replay_options_exit_two_before_anything_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(tmp.path());
    let out = tmp.path().join("out");
    // A previous run's output, which a bad command must leave alone.
    let previous = out.join("changes/epoch-00000000000000000002.parquet");
    std::fs::create_dir_all(previous.parent().unwrap()).unwrap();
    std::fs::write(&previous, b"previous output").unwrap();
    let cases: [(&[&str], &[&str]); 11] = [
        (&["--batch-size", "0"], &["--batch-size", "1..=16777216"]),
        (
            &["--batch-size", "18446744073709551615"],
            &["--batch-size", "16777216"],
        ),
        (&["--batch-size", "4294967296"], &["--batch-size"]),
        (&["--vnodes", "0"], &["--vnodes", "1..=32768"]),
        (&["--vnodes", "32769"], &["--vnodes", "1..=32768"]),
        (&["--checkpoint-every", "0"], &["--checkpoint-every"]),
        (&["--rate-limit", "0"], &["--rate-limit", "never finish"]),
        (&["--upstream-rate", "0"], &["--upstream-rate"]),
        (&["--rate-limit=-1"], &["--rate-limit"]),
        (&["--vnodes", "x"], &["--vnodes"]),
        (&["--batch-size", "1e3"], &["--batch-size"]),
    ];
    for (extra, needles) in cases {
        let mut args = replay_args(&ds, &out);
        args.extend_from_slice(extra);
        exits_two(&args, needles);
        assert_eq!(
            std::fs::read(&previous).unwrap(),
            b"previous output",
            "{extra:?} touched the previous output"
        );
    }
}

#[test]
fn bad_gen_options_exit_two() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    let o = p(&out);
    let cases: [(&[&str], &[&str]); 13] = [
        (&["synthetic", "--scale", "0"], &["--scale"]),
        (&["synthetic", "--scale", "NaN"], &["--scale"]),
        (&["synthetic", "--scale", "inf"], &["--scale"]),
        (&["synthetic", "--scale=-1"], &["--scale"]),
        (&["synthetic", "--epochs", "0"], &["--epochs"]),
        // Item 14: ranges gen cannot make, refused up front.
        (&["synthetic", "--scale", "1e30"], &["at most 10000000000"]),
        (
            &["synthetic", "--scale", "100001"],
            &["at most 10000000000"],
        ),
        (&["tpch-orders", "--scale", "100000"], &["at most 1000"]),
        (&["tpch-lineitem", "--scale", "1000.5"], &["at most 1000"]),
        (&["tpch-lineitem", "--scale", "1e-6"], &["smallest"]),
        (&["tpch-orders", "--scale", "0.00001"], &["smallest"]),
        (
            &["synthetic", "--changes", "18446744073709551615"],
            &["changes"],
        ),
        (&["synthetic", "--seed=-3"], &["--seed"]),
    ];
    for (extra, needles) in cases {
        let mut args = vec!["gen"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", o]);
        exits_two(&args, needles);
        assert!(!out.exists(), "{extra:?} wrote something");
    }
    // A non-empty directory, or a file (item 15: the message names the path).
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("mine.txt"), b"keep").unwrap();
    exits_two(&["gen", "synthetic", "--out", o], &[o, "not empty"]);
    assert_eq!(std::fs::read(out.join("mine.txt")).unwrap(), b"keep");
    let file = out.join("mine.txt");
    exits_two(
        &["gen", "synthetic", "--out", p(&file)],
        &[p(&file), "not a directory"],
    );
}

/// Item 14: epochs at or above 2^63 give a valid, never decreasing `_epoch`.
#[test]
fn gen_with_huge_epoch_counts_replays() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, epochs) in ["9223372036854775808", "18446744073709551615"]
        .into_iter()
        .enumerate()
    {
        let ds = tmp.path().join(format!("ds{i}"));
        ok(&[
            "gen",
            "synthetic",
            "--out",
            p(&ds),
            "--scale",
            "0.002",
            "--epochs",
            epochs,
        ]);
        let out = tmp.path().join(format!("out{i}"));
        let mut args = replay_args(&ds, &out);
        args.push("--verify");
        ok(&args);
    }
}

// ---------------------------------------------------------------------------------------------
// Item 7: float keys use SQL equality
// ---------------------------------------------------------------------------------------------

fn float_table(keys: &[f64], values: &[&str]) -> RecordBatch {
    record_batch(
        vec![
            Field::new("f", DataType::Float64, false),
            Field::new("v", DataType::Utf8, false),
        ],
        vec![
            Arc::new(Float64Array::from(keys.to_vec())),
            Arc::new(StringArray::from(values.to_vec())),
        ],
    )
}

#[test]
fn float_keys_use_sql_equality() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = r#"{"name": "t", "primary_key": ["f"]}"#;

    // 0.0 and -0.0 are one key: a duplicate in the snapshot.
    let ds = tmp.path().join("zeros");
    write_dataset(
        &ds,
        Some(manifest),
        &float_table(&[0.0, 1.0, -0.0], &["a", "b", "c"]),
        None,
    );
    exits_two(
        &replay_args(&ds, &tmp.path().join("o1")),
        &["part-0.parquet", "row 2", "duplicate"],
    );
    // So are two NaNs with different payloads.
    let ds = tmp.path().join("nans");
    let odd_nan = f64::from_bits(0x7FF0_0000_0000_0042);
    write_dataset(
        &ds,
        Some(manifest),
        &float_table(&[f64::NAN, odd_nan], &["a", "b"]),
        None,
    );
    exits_two(
        &replay_args(&ds, &tmp.path().join("o2")),
        &["part-0.parquet", "row 1", "duplicate"],
    );

    // A changelog that deletes -0.0 (and an odd NaN) while 0.0 (and NaN) are stored applies.
    let ds = tmp.path().join("delete");
    let snapshot = float_table(&[0.0, f64::NAN, 2.0], &["a", "n", "b"]);
    let changes = arrow_select::concat::concat_batches(
        &changelog_schema(&snapshot.schema(), true),
        &[
            log(
                &StreamChunk::new(
                    float_table(&[-0.0, odd_nan], &["a", "n"]),
                    vec![Op::Delete; 2],
                )
                .unwrap(),
                1,
            ),
            log(&StreamChunk::inserts(float_table(&[-0.0], &["z"])), 2),
        ],
    )
    .unwrap();
    write_dataset(&ds, Some(manifest), &snapshot, Some(&changes));
    let out = tmp.path().join("o3");
    let mut args = replay_args(&ds, &out);
    args.push("--verify");
    ok(&args);
}

// ---------------------------------------------------------------------------------------------
// Item 8: duplicate and reserved column names
// ---------------------------------------------------------------------------------------------

#[test]
fn duplicate_and_reserved_column_names_exit_two() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = r#"{"name": "t", "primary_key": ["k"]}"#;
    for (name, other) in [
        ("dup", "k"),
        ("op", "_op"),
        ("epoch", "_epoch"),
        ("op-upper", "_OP"),
        ("epoch-mixed", "_Epoch"),
    ] {
        let ds = tmp.path().join(name);
        let snapshot = record_batch(
            vec![
                Field::new("k", DataType::Int64, false),
                Field::new(other, DataType::Int64, false),
            ],
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![3, 4])),
            ],
        );
        write_dataset(&ds, Some(manifest), &snapshot, None);
        exits_two(
            &replay_args(&ds, &tmp.path().join(format!("{name}.out"))),
            &["snapshot/part-0.parquet", &format!("`{other}`")],
        );
        assert!(!tmp.path().join(format!("{name}.out")).exists());
    }
}

// ---------------------------------------------------------------------------------------------
// Item 9: skipped files are named
// ---------------------------------------------------------------------------------------------

#[test]
fn skipped_files_are_named_in_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(tmp.path());
    std::fs::copy(
        ds.join("changes/part-00000.parquet"),
        ds.join("changes/_extra.parquet"),
    )
    .unwrap();
    std::fs::write(ds.join("snapshot/_SUCCESS"), b"").unwrap();
    std::fs::write(ds.join("snapshot/.part.crc"), b"").unwrap();
    let out = tmp.path().join("out");
    let mut args = replay_args(&ds, &out);
    args.push("--verify");
    let o = ok(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    for name in [
        "changes/_extra.parquet",
        "snapshot/_SUCCESS",
        "snapshot/.part.crc",
    ] {
        assert!(
            stderr.contains("warning: skipping") && stderr.contains(name),
            "{name}: {}",
            text(&o)
        );
    }
    let o = ok(&["verify", p(&ds), p(&tmp.path().join("out"))]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("_extra.parquet"));
}

// ---------------------------------------------------------------------------------------------
// Item 16: the library boundary
// ---------------------------------------------------------------------------------------------

fn core_for(desc: TableDesc, progress: ProgressMap) -> Result<BackfillCore<ArrangementTracker>> {
    let desc = Arc::new(desc);
    let codec = ProgressCodec::new("p", desc.pk(), desc.vnode_count())?;
    Ok(BackfillCore::new(
        ArrangementTracker::new(desc, progress, codec),
        None,
    ))
}

fn barrier(prev: u64) -> Barrier {
    Barrier::new(EpochPair::new(prev + 1, prev), BarrierKind::Checkpoint)
}

#[test]
fn the_core_returns_errors_for_bad_chunks_and_protocol_violations() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(4).unwrap());
    let all = VnodeBitmap::full(VnodeCount::new(4).unwrap());
    let mut core = core_for(desc.clone(), ProgressMap::new(all.clone())).unwrap();
    let good = StreamChunk::from_text(&schema, "+ 1 1").unwrap();
    assert!(matches!(
        core.on_upstream_chunk(good.clone()),
        Err(Error::Protocol(m)) if m.contains("before the first barrier")
    ));
    core.on_barrier(barrier(1)).unwrap();
    // Narrower, wrong-typed, and hashable-but-different key types: errors, nothing buffered.
    let narrow = StreamChunk::from_text(
        &Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)])),
        "+ 1",
    )
    .unwrap();
    let wrong_int = StreamChunk::from_text(
        &Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("v", DataType::Int64, false),
        ])),
        "+ 1 1",
    )
    .unwrap();
    let other_hashable = StreamChunk::from_text(
        &Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt64, false),
            Field::new("v", DataType::Int64, false),
        ])),
        "+ 1 1",
    )
    .unwrap();
    for chunk in [narrow, wrong_int, other_hashable] {
        assert!(matches!(
            core.on_upstream_chunk(chunk),
            Err(Error::SchemaMismatch { .. })
        ));
    }
    assert!(core.on_upstream_chunk(good.clone()).unwrap().is_empty());
    let actions = core
        .on_barrier(barrier(2).with_mutation(Mutation::Stop))
        .unwrap();
    assert!(matches!(actions.last(), Some(Action::Stop)));
    assert!(matches!(
        core.on_upstream_chunk(good),
        Err(Error::Protocol(m)) if m.contains("after Stop")
    ));
    assert!(matches!(
        core.on_barrier(barrier(3)),
        Err(Error::Protocol(_))
    ));

    // An empty primary key is an error, not a later panic.
    assert!(matches!(
        PrimaryKey::new(&schema, vec![]),
        Err(Error::InvalidConfig(_))
    ));
    assert!(TableDesc::new("t", schema, vec![]).is_err());
}

/// The column types of the random tables.
fn random_type(rng: &mut StdRng) -> DataType {
    match rng.random_range(0..7) {
        0 => DataType::Int64,
        1 => DataType::Int32,
        2 => DataType::Utf8,
        3 => DataType::Float64,
        4 => DataType::Boolean,
        5 => DataType::FixedSizeBinary(2),
        _ => DataType::Date32,
    }
}

fn random_array(data_type: &DataType, n: usize, rng: &mut StdRng) -> ArrayRef {
    let null = |rng: &mut StdRng| rng.random_bool(0.1);
    match data_type {
        DataType::Int64 => Arc::new(Int64Array::from_iter(
            (0..n).map(|_| (!null(rng)).then(|| rng.random_range(-5..5))),
        )),
        DataType::Int32 => Arc::new(Int32Array::from_iter(
            (0..n).map(|_| (!null(rng)).then(|| rng.random_range(-5..5))),
        )),
        DataType::Utf8 => {
            Arc::new(StringArray::from_iter((0..n).map(|_| {
                (!null(rng)).then(|| ["", "a", "b", "ab"][rng.random_range(0..4)])
            })))
        }
        DataType::Float64 => Arc::new(Float64Array::from_iter((0..n).map(|_| {
            (!null(rng)).then(|| [0.0, -0.0, f64::NAN, 1.5, -2.0][rng.random_range(0..5)])
        }))),
        DataType::Boolean => Arc::new(BooleanArray::from_iter(
            (0..n).map(|_| (!null(rng)).then(|| rng.random_bool(0.5))),
        )),
        DataType::FixedSizeBinary(2) => Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                (0..n).map(|_| (!null(rng)).then(|| [rng.random_range(0..3u8), 0])),
                2,
            )
            .unwrap(),
        ),
        _ => Arc::new(Date32Array::from_iter(
            (0..n).map(|_| (!null(rng)).then(|| rng.random_range(-3..3))),
        )),
    }
}

fn random_batch(schema: &SchemaRef, n: usize, rng: &mut StdRng) -> RecordBatch {
    let columns = schema
        .fields()
        .iter()
        .map(|f| random_array(f.data_type(), n, rng))
        .collect();
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

/// The rows a barrier must emit of a buffered chunk, by the filter rule computed row by row.
fn expected_mask(desc: &TableDesc, progress: &ProgressMap, batch: &RecordBatch) -> BooleanArray {
    let Distribution::Hash(dist) = desc.distribution() else {
        unreachable!("hash-distributed tables only")
    };
    let dist: Vec<ArrayRef> = dist.iter().map(|&i| batch.column(i).clone()).collect();
    let keys = desc.pk().encode(batch).unwrap();
    (0..batch.num_rows())
        .map(|i| {
            let vnode = if dist.is_empty() {
                arrangement_backfill::vnode::VirtualNode::ZERO
            } else {
                vnode_of_row(&dist, i, desc.vnode_count()).unwrap()
            };
            Some(match progress.get(vnode).unwrap() {
                VnodeProgress::NotStarted => false,
                VnodeProgress::Completed { .. } => true,
                VnodeProgress::InProgress { pos, .. } => keys.value(i) <= pos.as_bytes(),
            })
        })
        .collect()
}

/// One random case: a table (possibly not definable: an `Error`), a progress map, and
/// a sequence of events, some with other schemas and some out of protocol order.
fn run_random_case(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let width = rng.random_range(1..=4);
    let fields: Vec<Field> = (0..width)
        .map(|i| Field::new(format!("c{i}"), random_type(&mut rng), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let key_len = rng.random_range(0..=width.min(2));
    let mut key: Vec<KeyColumn> = Vec::new();
    for _ in 0..key_len {
        let name = format!("c{}", rng.random_range(0..width));
        if !key.iter().any(|k| k.name == name) {
            key.push(if rng.random_bool(0.5) {
                KeyColumn::asc(name)
            } else {
                KeyColumn::desc(name)
            });
        }
    }
    let dist: Vec<String> = key
        .iter()
        .filter(|_| rng.random_bool(0.7))
        .map(|k| k.name.clone())
        .collect();
    let count = VnodeCount::new(rng.random_range(1..=8)).unwrap();
    let desc = match TableDesc::with_distribution("t", schema.clone(), key.clone(), &dist) {
        Ok(desc) => desc.with_vnode_count(count),
        Err(e) => {
            // Refused definitions: an empty key, or an unhashable distribution column.
            let unhashable = dist.iter().any(|c| {
                matches!(
                    schema.field_with_name(c).unwrap().data_type(),
                    DataType::FixedSizeBinary(_)
                )
            });
            assert!(key.is_empty() || unhashable, "{e}");
            return;
        }
    };
    // Random progress: positions from random rows.
    let mut progress = ProgressMap::new(VnodeBitmap::full(count));
    let sample = random_batch(&schema, 8, &mut rng);
    let sample_keys = desc.pk().encode(&sample).unwrap();
    for v in count.vnodes() {
        match rng.random_range(0..3) {
            0 => {}
            1 => progress.complete(v).unwrap(),
            _ => progress
                .advance(
                    v,
                    Position::from_keys(&sample_keys, rng.random_range(0..8)),
                    1,
                )
                .unwrap(),
        }
    }
    let mut core = core_for(desc.clone(), progress.clone()).unwrap();
    let mut epoch = 1u64;
    let mut buffered: Vec<RecordBatch> = Vec::new();
    for _ in 0..rng.random_range(1..12) {
        let phase = core.phase();
        match rng.random_range(0..10) {
            // A chunk of the table's schema.
            0..=3 => {
                let batch = random_batch(&schema, rng.random_range(0..6), &mut rng);
                let n = batch.num_rows();
                let result = core.on_upstream_chunk(
                    StreamChunk::new(batch.clone(), vec![Op::Insert; n]).unwrap(),
                );
                match phase {
                    Phase::AwaitingFirstBarrier | Phase::Stopped => {
                        assert!(matches!(result, Err(Error::Protocol(_))), "{result:?}")
                    }
                    Phase::Backfilling => {
                        assert!(result.unwrap().is_empty());
                        if n > 0 {
                            buffered.push(batch);
                        }
                    }
                    Phase::Done => {
                        assert!(result.is_ok());
                    }
                }
            }
            // A chunk of another schema: a column dropped, or another type.
            4..=5 => {
                let mut fields: Vec<Field> =
                    schema.fields().iter().map(|f| f.as_ref().clone()).collect();
                if fields.len() > 1 && rng.random_bool(0.5) {
                    fields.remove(rng.random_range(0..fields.len()));
                } else {
                    let i = rng.random_range(0..fields.len());
                    let mut t = random_type(&mut rng);
                    while &t == fields[i].data_type() {
                        t = random_type(&mut rng);
                    }
                    fields[i] = Field::new(fields[i].name(), t, true);
                }
                let other = Arc::new(Schema::new(fields));
                let batch = random_batch(&other, rng.random_range(1..6), &mut rng);
                let result = core.on_upstream_chunk(StreamChunk::inserts(batch));
                assert!(
                    matches!(
                        result,
                        Err(Error::SchemaMismatch { .. } | Error::Protocol(_))
                    ),
                    "{result:?}"
                );
            }
            // A barrier; sometimes with an out-of-order epoch, sometimes a Stop.
            6..=8 => {
                let mut b = if rng.random_bool(0.1) {
                    Barrier::new(EpochPair::new(epoch, epoch + 5), BarrierKind::Normal)
                } else {
                    barrier(epoch)
                };
                if rng.random_bool(0.15) {
                    b = b.with_mutation(Mutation::Stop);
                }
                let in_order = b.epoch.prev == epoch && b.epoch.curr > b.epoch.prev;
                let result = core.on_barrier(b);
                match (phase, in_order) {
                    (Phase::Stopped, _) => {
                        assert!(matches!(result, Err(Error::Protocol(_))), "{result:?}")
                    }
                    (Phase::AwaitingFirstBarrier, _) => {
                        result.unwrap();
                        epoch += 1;
                        if !in_order {
                            // The first barrier sets the epoch, whatever it is.
                            return;
                        }
                    }
                    (_, false) => assert!(matches!(result, Err(Error::EpochOrder { .. }))),
                    (Phase::Backfilling, true) => {
                        let actions = result.unwrap();
                        epoch += 1;
                        let emitted: Vec<RecordBatch> = actions
                            .iter()
                            .filter_map(|a| match a {
                                Action::Emit(c) => Some(c.batch().clone()),
                                _ => None,
                            })
                            .collect();
                        let expected: Vec<RecordBatch> = buffered
                            .drain(..)
                            .map(|b| {
                                let mask = expected_mask(&desc, &progress, &b);
                                arrow_select::filter::filter_record_batch(&b, &mask).unwrap()
                            })
                            .filter(|b| b.num_rows() > 0)
                            .collect();
                        assert_eq!(emitted, expected, "seed {seed}");
                    }
                    (Phase::Done, true) => {
                        result.unwrap();
                        epoch += 1;
                    }
                }
            }
            // A random snapshot end or output in a wrong phase: an error, not a panic.
            _ => {
                if core.phase() != Phase::Backfilling {
                    assert!(core.on_snapshot_end().is_err());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x8a2d),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random schemas, keys, progress and event sequences: the core answers with an
    /// `Error` or the right output, and never panics.
    #[test]
    fn random_schemas_and_chunks_never_panic(seed in any::<u64>()) {
        run_random_case(seed);
    }
}
