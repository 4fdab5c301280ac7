//! Issue 8, input hardening: each case a hostile but realistic user (or embedder) tried, with
//! the answer the tool now gives. Tool-level cases run the `backfill` binary; library cases
//! drive [`BackfillCore`] directly, including a seeded property test over random schemas and
//! chunks that must give an `Error` or the right answer, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;
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
use arrow_array::cast::AsArray;
use arrow_array::{
    ArrayRef, BooleanArray, Date32Array, FixedSizeBinaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::cli::{ok, p, refused, replay_args, run, synthetic, text};
use common::dataset::{read_parquet, write_dataset, write_parquet_with};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs `args`: exit status 2, every needle in stderr, no panic.
fn exits_two(args: &[&str], needles: &[&str]) {
    refused(&run(args), needles);
}

fn batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
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
    let cases: [(&[&str], &[&str]); 12] = [
        (&["synthetic", "--scale", "0"], &["--scale"]),
        (&["synthetic", "--scale", "NaN"], &["--scale"]),
        (&["synthetic", "--scale", "inf"], &["--scale"]),
        (&["synthetic", "--scale=-1"], &["--scale"]),
        (&["synthetic", "--epochs", "0"], &["--epochs"]),
        // Item 14: ranges gen cannot make, refused up front.
        (&["synthetic", "--scale", "1e30"], &["at most 100000000"]),
        (&["synthetic", "--scale", "100000"], &["at most 100000000"]),
        (
            &["tpch-orders", "--scale", "100000"],
            &["at most 100000000"],
        ),
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
    batch(
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
        let snapshot = batch(
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
// Item 10: every accepted type reads back as itself
// ---------------------------------------------------------------------------------------------

/// A table with one column of every type the tool accepts, key `k`, and a NULL in every
/// value column.
fn all_types() -> RecordBatch {
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::*;
    use arrow_schema::{IntervalUnit, TimeUnit};
    let n = 4;
    let day = 86_400_000i64;
    let mut list = ListBuilder::new(Int32Array::builder(0));
    for i in 0..n {
        if i == 2 {
            list.append_null();
        } else {
            list.values().append_value(i);
            list.values().append_null();
            list.append(true);
        }
    }
    let mut dict =
        arrow_array::builder::StringDictionaryBuilder::<arrow_array::types::Int32Type>::new();
    for s in [Some("x"), Some("y"), None, Some("x")] {
        dict.append_option(s);
    }
    let strings = || vec![Some("a"), Some("ßé"), None, Some("")];
    let bytes = || vec![Some(&b"\x00\xff"[..]), Some(b"b"), None, Some(b"")];
    let mut sb = StringBuilder::new();
    for s in strings() {
        sb.append_option(s);
    }
    let struct_array = StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Int32, true)),
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("b", DataType::Utf8, true)),
            Arc::new(sb.finish()) as ArrayRef,
        ),
    ]);
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("k", Arc::new(Int64Array::from(vec![3, 1, 4, 2]))),
        (
            "bool",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(false),
                None,
                Some(true),
            ])),
        ),
        (
            "i8",
            Arc::new(Int8Array::from(vec![
                Some(i8::MIN),
                Some(-1),
                None,
                Some(i8::MAX),
            ])),
        ),
        (
            "i16",
            Arc::new(Int16Array::from(vec![
                Some(i16::MIN),
                Some(0),
                None,
                Some(i16::MAX),
            ])),
        ),
        (
            "i32",
            Arc::new(Int32Array::from(vec![
                Some(i32::MIN),
                Some(7),
                None,
                Some(i32::MAX),
            ])),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(vec![
                Some(i64::MIN),
                Some(7),
                None,
                Some(i64::MAX),
            ])),
        ),
        (
            "u8",
            Arc::new(UInt8Array::from(vec![
                Some(0),
                Some(1),
                None,
                Some(u8::MAX),
            ])),
        ),
        (
            "u16",
            Arc::new(UInt16Array::from(vec![
                Some(0),
                Some(1),
                None,
                Some(u16::MAX),
            ])),
        ),
        (
            "u32",
            Arc::new(UInt32Array::from(vec![
                Some(0),
                Some(1),
                None,
                Some(u32::MAX),
            ])),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(vec![
                Some(0),
                Some(1),
                None,
                Some(u64::MAX),
            ])),
        ),
        (
            "f16",
            Arc::new(Float16Array::from(vec![
                Some(half_from_f32(1.5)),
                Some(half_from_f32(-0.25)),
                None,
                Some(half_from_f32(0.0)),
            ])),
        ),
        (
            "f32",
            Arc::new(Float32Array::from(vec![
                Some(1.5),
                Some(-0.0),
                None,
                Some(f32::MAX),
            ])),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(vec![
                Some(1.5),
                Some(-1e300),
                None,
                Some(f64::MIN_POSITIVE),
            ])),
        ),
        ("utf8", Arc::new(StringArray::from(strings()))),
        ("large_utf8", Arc::new(LargeStringArray::from(strings()))),
        ("utf8_view", Arc::new(StringViewArray::from(strings()))),
        ("binary", Arc::new(BinaryArray::from(bytes()))),
        ("large_binary", Arc::new(LargeBinaryArray::from(bytes()))),
        ("binary_view", Arc::new(BinaryViewArray::from(bytes()))),
        (
            "fixed",
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![Some(b"abc"), Some(b"\x00\x01\x02"), None, Some(b"zzz")].into_iter(),
                    3,
                )
                .unwrap(),
            ),
        ),
        (
            "date32",
            Arc::new(Date32Array::from(vec![
                Some(18262),
                Some(-1),
                None,
                Some(0),
            ])),
        ),
        (
            "date64",
            Arc::new(Date64Array::from(vec![
                Some(18262 * day),
                Some(-day),
                None,
                Some(0),
            ])),
        ),
        (
            "time32_s",
            Arc::new(Time32SecondArray::from(vec![
                Some(0),
                Some(86_399),
                None,
                Some(1),
            ])),
        ),
        (
            "time32_ms",
            Arc::new(Time32MillisecondArray::from(vec![
                Some(0),
                Some(86_399_999),
                None,
                Some(1),
            ])),
        ),
        (
            "time64_us",
            Arc::new(Time64MicrosecondArray::from(vec![
                Some(0),
                Some(86_399_999_999),
                None,
                Some(1),
            ])),
        ),
        (
            "time64_ns",
            Arc::new(Time64NanosecondArray::from(vec![
                Some(0),
                Some(86_399_999_999_999),
                None,
                Some(1),
            ])),
        ),
        (
            "ts_s",
            Arc::new(TimestampSecondArray::from(vec![
                Some(0),
                Some(1_577_836_800),
                None,
                Some(-1),
            ])),
        ),
        (
            "ts_ms_utc",
            Arc::new(
                TimestampMillisecondArray::from(vec![
                    Some(0),
                    Some(1_577_836_800_123),
                    None,
                    Some(-1),
                ])
                .with_timezone("UTC"),
            ),
        ),
        (
            "ts_us_tz",
            Arc::new(
                TimestampMicrosecondArray::from(vec![
                    Some(0),
                    Some(1_577_836_800_123_456),
                    None,
                    Some(-1),
                ])
                .with_timezone("+02:00"),
            ),
        ),
        (
            "ts_ns",
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(0),
                Some(1_577_836_800_123_456_789),
                None,
                Some(-1),
            ])),
        ),
        (
            "dur_s",
            Arc::new(DurationSecondArray::from(vec![
                Some(0),
                Some(-5),
                None,
                Some(i64::MAX),
            ])),
        ),
        (
            "dur_ms",
            Arc::new(DurationMillisecondArray::from(vec![
                Some(0),
                Some(5),
                None,
                Some(1),
            ])),
        ),
        (
            "dur_us",
            Arc::new(DurationMicrosecondArray::from(vec![
                Some(0),
                Some(5),
                None,
                Some(1),
            ])),
        ),
        (
            "dur_ns",
            Arc::new(DurationNanosecondArray::from(vec![
                Some(0),
                Some(5),
                None,
                Some(1),
            ])),
        ),
        (
            "dec128",
            Arc::new(
                Decimal128Array::from(vec![Some(12_345), Some(-1), None, Some(10i128.pow(20) - 1)])
                    .with_precision_and_scale(20, 3)
                    .unwrap(),
            ),
        ),
        (
            "dec256",
            Arc::new(
                Decimal256Array::from(vec![
                    Some(arrow_buffer::i256::from_i128(12_345)),
                    Some(arrow_buffer::i256::from_i128(-1)),
                    None,
                    Some(arrow_buffer::i256::from_i128(10i128.pow(30))),
                ])
                .with_precision_and_scale(40, 5)
                .unwrap(),
            ),
        ),
        (
            "interval_ym",
            Arc::new(IntervalYearMonthArray::from(vec![
                Some(0),
                Some(13),
                None,
                Some(-2),
            ])),
        ),
        ("list_i32", Arc::new(list.finish())),
        ("struct", Arc::new(struct_array)),
        ("dict", Arc::new(dict.finish())),
    ];
    let _ = (IntervalUnit::YearMonth, TimeUnit::Second);
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, c)| Field::new(*name, c.data_type().clone(), *name != "k"))
        .collect();
    batch(fields, columns.into_iter().map(|(_, c)| c).collect())
}

fn half_from_f32(
    v: f32,
) -> <arrow_array::types::Float16Type as arrow_array::ArrowPrimitiveType>::Native {
    <arrow_array::types::Float16Type as arrow_array::ArrowPrimitiveType>::Native::from_f32(v)
}

/// The rows of every output file, without `_epoch` and `_op`, sorted by `k`.
fn read_output(out: &Path, schema: &SchemaRef) -> RecordBatch {
    let mut batches = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(out.join("changes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files {
        for b in read_parquet(&file) {
            let ops = b.column(1).as_primitive::<arrow_array::types::Int8Type>();
            assert!(
                ops.values().iter().all(|&op| op == 1),
                "a snapshot replays as inserts"
            );
            let table = b
                .project(&(2..b.num_columns()).collect::<Vec<_>>())
                .unwrap();
            batches.push(table);
        }
    }
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let order = arrow_ord::sort::sort_to_indices(all.column(0), None, None).unwrap();
    let sorted = arrow_select::take::take_record_batch(&all, &order).unwrap();
    RecordBatch::try_new(schema.clone(), sorted.columns().to_vec()).unwrap()
}

/// The rows of a Parquet file, sorted by its first column.
fn read_sorted(file: &Path) -> RecordBatch {
    let batches = read_parquet(file);
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let order = arrow_ord::sort::sort_to_indices(all.column(0), None, None).unwrap();
    arrow_select::take::take_record_batch(&all, &order).unwrap()
}

/// The schema the output files read back with, without `_epoch` and `_op`.
fn output_schema(out: &Path) -> SchemaRef {
    let file = std::fs::read_dir(out.join("changes"))
        .unwrap()
        .next()
        .unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(file.unwrap().path()).unwrap(),
    )
    .unwrap();
    let fields: Vec<_> = reader.schema().fields()[2..].to_vec();
    Arc::new(Schema::new(fields))
}

/// Every accepted type reads back from the replay's output as the type and values it reads
/// from the input, whether the input was written for other readers (`coerce_types`: Date64
/// as a Parquet DATE, lists with `element` fields, as pyarrow writes) or as arrow-rs writes
/// by default.
#[test]
fn every_accepted_type_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    for coerce in [true, false] {
        let ds = tmp.path().join(format!("types-{coerce}"));
        std::fs::create_dir_all(&ds).unwrap();
        std::fs::write(
            ds.join("dataset.json"),
            r#"{"name": "types", "primary_key": ["k"]}"#,
        )
        .unwrap();
        let props = WriterProperties::builder().set_coerce_types(coerce).build();
        let snapshot = ds.join("snapshot/part-0.parquet");
        write_parquet_with(&snapshot, &all_types(), Some(props));
        let out = tmp.path().join(format!("out-{coerce}"));
        let mut args = replay_args(&ds, &out);
        args.push("--verify");
        ok(&args);

        let expected = read_sorted(&snapshot);
        let got_schema = output_schema(&out);
        let got = read_output(&out, &got_schema);
        for (i, field) in expected.schema().fields().iter().enumerate() {
            // Nested field names (a list's `item` or `element`) are not part of the type,
            // for pyarrow as here: the output uses Parquet's `element`.
            assert!(
                got_schema
                    .field(i)
                    .data_type()
                    .equals_datatype(field.data_type()),
                "coerce {coerce}: column {} reads back as {}, not {}",
                field.name(),
                got_schema.field(i).data_type(),
                field.data_type()
            );
            let got_column = arrow_cast::cast(got.column(i), field.data_type()).unwrap();
            assert_eq!(
                got_column.as_ref(),
                expected.column(i).as_ref(),
                "coerce {coerce}: column {} reads back with other values",
                field.name()
            );
        }
        if coerce {
            check_with_other_readers(&snapshot, &out);
        }
    }
}

/// pyarrow and DuckDB, when installed, see the output as they see the input.
fn check_with_other_readers(snapshot: &Path, out: &Path) {
    let have_pyarrow = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_pyarrow {
        eprintln!("pyarrow is not installed: the pyarrow and DuckDB checks are skipped");
        return;
    }
    let script = r#"
import glob, sys
import pyarrow as pa, pyarrow.parquet as pq
snapshot, out = sys.argv[1], sys.argv[2]
inp = pq.read_table(snapshot)
outp = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(out + "/changes/*.parquet"))])
outp = outp.drop_columns(["_epoch", "_op"])
import pyarrow.compute as pc
def sorted_values(table, name):
    column = table.column(name).combine_chunks()
    # pyarrow has no take kernel for views: compare their plain forms.
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.string())
    elif pa.types.is_binary_view(column.type):
        column = column.cast(pa.binary())
    return column.take(pc.sort_indices(table.column("k")))
bad = []
if inp.column_names != outp.column_names:
    bad.append(f"pyarrow columns: {inp.column_names} vs {outp.column_names}")
for name in inp.column_names:
    a, b = inp.column(name), outp.column(name)
    va, vb = sorted_values(inp, name), sorted_values(outp, name)
    if a.type != b.type or not va.equals(vb):
        bad.append(f"pyarrow {name}: {a.type} {va.to_string()} vs {b.type} {vb.to_string()}")
try:
    import duckdb
except ImportError:
    duckdb = None
if duckdb is not None:
    con = duckdb.connect()
    def described(q):
        return [(r[0], r[1]) for r in con.execute("DESCRIBE " + q).fetchall()]
    i = described(f"SELECT * FROM read_parquet('{snapshot}')")
    o = described(f"SELECT * EXCLUDE (_epoch, _op) FROM read_parquet('{out}/changes/*.parquet')")
    if i != o:
        bad.append(f"duckdb types: {i} vs {o}")
    q = "SELECT * {} FROM read_parquet('{}') ORDER BY k"
    ri = con.execute(q.format("", snapshot)).fetchall()
    ro = con.execute(q.format("EXCLUDE (_epoch, _op)", out + "/changes/*.parquet")).fetchall()
    if ri != ro:
        bad.append(f"duckdb values: {ri} vs {ro}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#;
    let o = Command::new("python3")
        .args(["-c", script, p(snapshot), p(out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

// ---------------------------------------------------------------------------------------------
// Item 12: only distribution-key columns must be hashable
// ---------------------------------------------------------------------------------------------

#[test]
fn a_key_column_outside_the_distribution_key_need_not_be_hashable() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("fsb");
    let snapshot = batch(
        vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::FixedSizeBinary(2), false),
        ],
        vec![
            Arc::new(Int64Array::from(vec![1, 1, 2])),
            Arc::new(
                FixedSizeBinaryArray::try_from_iter(vec![b"xy", b"zz", b"xy"].into_iter()).unwrap(),
            ),
        ],
    );
    write_dataset(
        &ds,
        Some(r#"{"name": "t", "primary_key": ["a", "b"], "distribution_key": ["a"]}"#),
        &snapshot,
        None,
    );
    let out = tmp.path().join("out");
    let mut args = replay_args(&ds, &out);
    args.push("--verify");
    ok(&args);
    // Distributed by the unhashable column: refused, exit 2, naming it.
    std::fs::write(
        ds.join("dataset.json"),
        r#"{"name": "t", "primary_key": ["a", "b"], "distribution_key": ["b"]}"#,
    )
    .unwrap();
    exits_two(
        &replay_args(&ds, &tmp.path().join("out2")),
        &["`b`", "FixedSizeBinary"],
    );
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
