//! Column types end to end: every accepted type reads back as itself (also for pyarrow and
//! DuckDB, when installed), only distribution-key columns must be hashable (issue 8 items 10
//! and 12), dictionary key columns on the durable store, and string data too large for one
//! Arrow batch (issue 41 items 7 and 8). Each case runs the `backfill` binary on a dataset
//! made here.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow_array::builder::StringDictionaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, FixedSizeBinaryArray, Int8Array, Int64Array, RecordBatch, UInt64Array,
};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

mod common;
use common::cli::{ok, p, refused, replay_args, run, text, verified};
use common::dataset::{
    read_parquet, record_batch, write_dataset, write_parquet, write_parquet_with,
};

fn dictionary(values: impl IntoIterator<Item = String>) -> ArrayRef {
    let mut b = StringDictionaryBuilder::<Int32Type>::new();
    for v in values {
        b.append_value(v);
    }
    Arc::new(b.finish())
}

/// The columns `a` (Int64), `b` (Dictionary(Int32, Utf8)), `c` (Dictionary(Int32, Utf8)),
/// `v` (Int64) of rows `(a, b, v)`, `c` a label derived from `v`.
fn table(rows: &[(i64, String, i64)], prefix: &[&str]) -> (Vec<Field>, Vec<ArrayRef>) {
    let dict = || DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for name in prefix {
        fields.push(match *name {
            "_epoch" => Field::new("_epoch", DataType::UInt64, false),
            _ => Field::new("_op", DataType::Int8, false),
        });
    }
    fields.extend([
        Field::new("a", DataType::Int64, false),
        Field::new("b", dict(), false),
        Field::new("c", dict(), true),
        Field::new("v", DataType::Int64, true),
    ]);
    columns.extend([
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
        dictionary(rows.iter().map(|r| r.1.clone())),
        dictionary(rows.iter().map(|r| format!("label-{}", r.2 % 5))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
    ]);
    (fields, columns)
}

/// A dataset with primary key (a, b), `b` a dictionary, distributed by `distribution`: a
/// snapshot of 2,000 rows and a changelog of three epochs (inserts, updates, deletes).
fn dictionary_key_dataset(dir: &Path, distribution: &str) -> PathBuf {
    let ds = dir.join(format!("dict-{distribution}"));
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::write(
        ds.join("dataset.json"),
        format!(
            r#"{{"name": "t", "primary_key": ["a", "b"], "distribution_key": ["{distribution}"]}}"#
        ),
    )
    .unwrap();
    let snapshot: Vec<(i64, String, i64)> = (0..2000)
        .map(|i| (i / 4, format!("k{:03}", (i % 4) * 7 + i % 3), i))
        .collect();
    let (fields, columns) = table(&snapshot, &[]);
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    write_parquet(&ds.join("snapshot/part-0.parquet"), &batch);

    // Changes: epoch 1 inserts new keys, epoch 2 updates some snapshot rows, epoch 3 deletes.
    let mut rows = Vec::new();
    let mut ops = Vec::new();
    let mut epochs = Vec::new();
    for i in 0..300i64 {
        rows.push((i * 3, format!("new{i}"), -i));
        ops.push(1i8);
        epochs.push(1u64);
    }
    for r in snapshot.iter().step_by(7) {
        rows.push(r.clone());
        ops.push(3);
        epochs.push(2);
        rows.push((r.0, r.1.clone(), r.2 + 1_000_000));
        ops.push(4);
        epochs.push(2);
    }
    for (_, r) in (snapshot.iter().enumerate().skip(3).step_by(11)).filter(|(i, _)| i % 7 != 0) {
        rows.push(r.clone());
        ops.push(2);
        epochs.push(3);
    }
    let (fields, mut columns) = table(&rows, &["_epoch", "_op"]);
    columns.insert(0, Arc::new(Int8Array::from(ops)));
    columns.insert(0, Arc::new(UInt64Array::from(epochs)));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    write_parquet(&ds.join("changes/part-0.parquet"), &batch);
    ds
}

/// What the output's `epoch-*.parquet` files net to: each row (its table columns as text)
/// with its count, inserts +1 and deletes -1, rows netting to 0 left out; sorted.
fn output_net(out: &Path) -> Vec<(String, i64)> {
    let mut net = std::collections::BTreeMap::<String, i64>::new();
    for entry in std::fs::read_dir(out.join("changes")).unwrap() {
        let file = entry.unwrap().path();
        if file.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        for batch in read_parquet(&file) {
            let schema = batch.schema();
            let op = schema.index_of("_op").unwrap();
            let ops = batch
                .column(op)
                .as_primitive::<arrow_array::types::Int8Type>();
            let columns: Vec<_> = (batch.columns().iter().enumerate())
                .filter(|(i, _)| !schema.field(*i).name().starts_with('_'))
                .map(|(_, c)| ArrayFormatter::try_new(c, &FormatOptions::default()).unwrap())
                .collect();
            for row in 0..batch.num_rows() {
                let cells: Vec<String> = columns.iter().map(|c| c.value(row).to_string()).collect();
                let sign = if matches!(ops.value(row), 1 | 4) {
                    1
                } else {
                    -1
                };
                *net.entry(cells.join("|")).or_default() += sign;
            }
        }
    }
    net.into_iter().filter(|(_, n)| *n != 0).collect()
}

fn replay(ds: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = replay_args(ds, out);
    args.extend_from_slice(extra);
    run(&args)
}

/// Item 7: a dictionary key column outside the distribution key replays on the durable store
/// as on the memory store (dictionary value columns too), verifies, and a rerun reads the
/// state back and says the job finished (it said the manifest was corrupt).
#[test]
fn a_dictionary_key_column_replays_on_the_durable_store() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dictionary_key_dataset(tmp.path(), "a");
    let durable = tmp.path().join("durable");
    let memory = tmp.path().join("memory");
    let o = replay(&ds, &durable, &["--batch-size", "100"]);
    assert!(o.status.success(), "{}", text(&o));
    verified(&ds, &durable);
    let o = replay(&ds, &memory, &["--memory", "--batch-size", "100"]);
    assert!(o.status.success(), "{}", text(&o));
    verified(&ds, &memory);
    let (d, m) = (output_net(&durable), output_net(&memory));
    assert!(d.len() > 2000, "{}", d.len());
    assert_eq!(d, m);
    // The rerun reads the state back.
    let o = replay(&ds, &durable, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("already finished"),
        "{}",
        text(&o)
    );
}

/// A dictionary distribution key is refused up front (vnode hashing does not support it),
/// exit 2, naming the column, and nothing is written.
#[test]
fn a_dictionary_distribution_key_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dictionary_key_dataset(tmp.path(), "b");
    let out = tmp.path().join("out");
    let o = replay(&ds, &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("`b`") && stderr.contains("Dictionary"),
        "{}",
        text(&o)
    );
    assert!(!out.join("state").exists(), "{}", text(&o));
}

/// Writes the two datasets of item 8 at full size under `$HUGE_DIR` (2.2 GB on disk, 2.2 GB
/// of memory to write): `plain` (265 KiB strings x 8,192 rows in one row group) and `dict`
/// (a 565 kB string dictionary-encoded 8,192 times: 4.6 GB decoded from a small file). Run
/// by hand: `HUGE_DIR=/tmp/huge cargo test --test types_edge -- --ignored huge`.
#[test]
#[ignore]
fn write_huge_string_datasets() {
    let Ok(dir) = std::env::var("HUGE_DIR") else {
        return;
    };
    let dir = Path::new(&dir);
    write_string_dataset(&dir.join("plain"), 8192, 265 << 10, false, 1024);
    write_string_dataset(&dir.join("dict"), 8192, 565_000, true, 1024);
}

/// A dataset of `rows` rows `(k Int64, s Utf8)`, `s` `width` bytes (one repeated value when
/// `repeated`, written dictionary-encoded; else distinct values, written plain), in one row
/// group, written `per_batch` rows at a time; no changes.
fn write_string_dataset(ds: &Path, rows: usize, width: usize, repeated: bool, per_batch: usize) {
    std::fs::create_dir_all(ds).unwrap();
    std::fs::write(
        ds.join("dataset.json"),
        r#"{"name": "s", "primary_key": ["k"], "distribution_key": ["k"]}"#,
    )
    .unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows))
        .set_dictionary_enabled(repeated)
        .set_dictionary_page_size_limit(width * 2)
        .build();
    let path = ds.join("snapshot/part-0.parquet");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w =
        ArrowWriter::try_new(File::create(&path).unwrap(), schema.clone(), Some(props)).unwrap();
    let mut start = 0;
    while start < rows {
        let n = per_batch.min(rows - start);
        let strings = arrow_array::StringArray::from_iter_values((start..start + n).map(|i| {
            let mut s = if repeated {
                String::new()
            } else {
                format!("{i:08}")
            };
            s.extend(std::iter::repeat_n('x', width - s.len()));
            s
        }));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    start as i64..(start + n) as i64,
                )),
                Arc::new(strings),
            ],
        )
        .unwrap();
        w.write(&batch).unwrap();
        start += n;
    }
    w.close().unwrap();
}

/// The label `n` of a narrow dictionary column.
fn label(n: i64) -> String {
    format!("label {n:04}, long enough not to be inlined")
}

/// A dataset of table `t`: `a` (Int64), `b` and `c` (Dictionary(Int8, Utf8)), `v` (Int64),
/// primary key `[a, b]` when `b_in_key` (four `b` a value of `a`) else `[a]`, distributed by
/// `a`. A snapshot of 4,000 rows and 40 epochs of changes (50 inserts, 20 updates, 10
/// deletes each), written in row groups of 100 rows, so that the reads give batches with
/// dictionaries of their own. `b` takes `labels` distinct values, `c` 90.
fn narrow_dictionary_dataset(dir: &Path, name: &str, b_in_key: bool, labels: i64) -> PathBuf {
    let ds = dir.join(name);
    std::fs::create_dir_all(&ds).unwrap();
    let key = if b_in_key {
        r#"["a", "b"]"#
    } else {
        r#"["a"]"#
    };
    std::fs::write(
        ds.join("dataset.json"),
        format!(r#"{{"name": "t", "primary_key": {key}, "distribution_key": ["a"]}}"#),
    )
    .unwrap();
    // Key `k` is the row `(a, b)`.
    let row_key = |k: i64| -> (i64, String) {
        if b_in_key {
            (k / 4, label(((k % 4) * 25 + (k / 4) * 7) % labels))
        } else {
            (k, label(k % labels))
        }
    };
    let narrow = || DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
    // `b` and `c` as strings: cast to the dictionary type a row group at a time.
    let columns = |keys: &[i64], values: &[i64]| -> Vec<ArrayRef> {
        let b = arrow_array::StringArray::from_iter_values(keys.iter().map(|&k| row_key(k).1));
        let c = arrow_array::StringArray::from_iter(
            (values.iter()).map(|&v| (v % 11 != 0).then(|| format!("c {:02}", v % 90))),
        );
        vec![
            Arc::new(Int64Array::from_iter_values(
                keys.iter().map(|&k| row_key(k).0),
            )),
            Arc::new(b),
            Arc::new(c),
            Arc::new(Int64Array::from_iter_values(values.iter().copied())),
        ]
    };
    let fields = vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", narrow(), false),
        Field::new("c", narrow(), true),
        Field::new("v", DataType::Int64, false),
    ];
    // Row groups of 100 rows, each written from its own dictionaries.
    let write = |file: &Path, fields: Vec<Field>, columns: Vec<ArrayRef>| {
        let schema = Arc::new(Schema::new(fields));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let mut w =
            ArrowWriter::try_new(File::create(file).unwrap(), schema.clone(), Some(props)).unwrap();
        let rows = columns[0].len();
        for start in (0..rows).step_by(100) {
            let len = 100.min(rows - start);
            let sliced = (columns.iter().zip(schema.fields()))
                .map(|(c, f)| arrow_cast::cast(&c.slice(start, len), f.data_type()).unwrap())
                .collect();
            w.write(&RecordBatch::try_new(schema.clone(), sliced).unwrap())
                .unwrap();
        }
        w.close().unwrap();
    };
    let mut live: Vec<(i64, i64)> = (0..4000).map(|k| (k, k * 3)).collect();
    let (keys, values): (Vec<i64>, Vec<i64>) = live.iter().copied().unzip();
    write(
        &ds.join("snapshot/part-0.parquet"),
        fields.clone(),
        columns(&keys, &values),
    );

    let (mut keys, mut values, mut ops, mut epochs) = (vec![], vec![], vec![], vec![]);
    let mut next = 4000;
    let mut pick = 12345u64;
    let mut pick = |n: usize| {
        pick = pick
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (pick >> 33) as usize % n
    };
    for epoch in 1..=40u64 {
        let mut push = |k: i64, v: i64, op: i8| {
            keys.push(k);
            values.push(v);
            ops.push(op);
            epochs.push(epoch);
        };
        for _ in 0..50 {
            push(next, next * 3, 1);
            live.push((next, next * 3));
            next += 1;
        }
        for _ in 0..20 {
            let i = pick(live.len());
            let (k, v) = live[i];
            push(k, v, 3);
            push(k, v + 1, 4);
            live[i].1 = v + 1;
        }
        for _ in 0..10 {
            let (k, v) = live.swap_remove(pick(live.len()));
            push(k, v, 2);
        }
    }
    let mut change_fields = vec![
        Field::new("_epoch", DataType::UInt64, false),
        Field::new("_op", DataType::Int8, false),
    ];
    change_fields.extend(fields);
    let mut change_columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(epochs)),
        Arc::new(Int8Array::from(ops)),
    ];
    change_columns.extend(columns(&keys, &values));
    write(
        &ds.join("changes/part-0.parquet"),
        change_fields,
        change_columns,
    );
    ds
}

/// Dictionary(Int8, Utf8) columns, as values and as a key column outside the distribution
/// key, with 100 distinct values: replayed on the durable store over 40 epochs (4 vnodes, so
/// each gathers many runs that compaction merges, with the reads' many dictionaries), they
/// verify and match the memory store's output. Merging the dictionaries of many batches
/// overflowed the 8-bit keys ("Dictionary key bigger than the key type").
#[test]
fn narrow_dictionary_columns_replay_through_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, b_in_key) in [("value", false), ("key", true)] {
        let ds = narrow_dictionary_dataset(tmp.path(), name, b_in_key, 100);
        let durable = tmp.path().join(format!("{name}-durable"));
        let memory = tmp.path().join(format!("{name}-memory"));
        let args = ["--batch-size", "100", "--vnodes", "4"];
        let o = replay(&ds, &durable, &args);
        assert!(o.status.success(), "{name}: {}", text(&o));
        verified(&ds, &durable);
        let o = replay(&ds, &memory, &[&args[..], &["--memory"]].concat());
        assert!(o.status.success(), "{name}: {}", text(&o));
        let (d, m) = (output_net(&durable), output_net(&memory));
        assert!(d.len() > 4000, "{name}: {}", d.len());
        assert_eq!(d, m, "{name}");
        let o = replay(&ds, &durable, &args);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("already finished"),
            "{name}: {}",
            text(&o)
        );
    }
}

/// An Int8 dictionary key column with 300 distinct values (each row group's fit, the
/// table's do not): refused with exit 2 naming the column, and a rerun says the same, never
/// that the state is corrupt.
#[test]
fn narrow_dictionary_keys_beyond_their_type_exit_2_naming_the_column() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = narrow_dictionary_dataset(tmp.path(), "wide", true, 300);
    let out = tmp.path().join("out");
    for run in 0..2 {
        let o = replay(&ds, &out, &["--batch-size", "100", "--vnodes", "4"]);
        assert_eq!(o.status.code(), Some(2), "run {run}: {}", text(&o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("column `b`") && stderr.contains("Int8") && !stderr.contains("corrupt"),
            "run {run}: {}",
            text(&o)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 8 item 10: every accepted type reads back as itself
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
    record_batch(fields, columns.into_iter().map(|(_, c)| c).collect())
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
// Issue 8 item 12: only distribution-key columns must be hashable
// ---------------------------------------------------------------------------------------------

#[test]
fn a_key_column_outside_the_distribution_key_need_not_be_hashable() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("fsb");
    let snapshot = record_batch(
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
    refused(
        &run(&replay_args(&ds, &tmp.path().join("out2"))),
        &["`b`", "FixedSizeBinary"],
    );
}
