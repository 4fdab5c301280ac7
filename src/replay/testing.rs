//! Test helpers: tiny datasets written by hand, rows in the chunk text form.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Int8Array, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;

use crate::chunk::{StreamChunk, changelog_schema};
use crate::error::Error;

/// `k Int64` (the key), `v Utf8` (nullable).
pub(crate) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]))
}

pub(crate) const MANIFEST: &str = r#"{"name": "t", "primary_key": ["k"]}"#;

pub(crate) fn write_batch(path: &Path, batch: &RecordBatch) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Table rows from lines of values (`1 a`, `2 NULL`).
pub(crate) fn rows(text: &str) -> RecordBatch {
    let text: String = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("+ {l}\n"))
        .collect();
    StreamChunk::from_text(&schema(), &text)
        .unwrap()
        .batch()
        .clone()
}

/// A changelog batch from `(epoch, chunk text)` pairs.
pub(crate) fn changes(epochs: &[(u64, &str)]) -> RecordBatch {
    let batches: Vec<RecordBatch> = epochs
        .iter()
        .map(|(e, text)| {
            StreamChunk::from_text(&schema(), text)
                .unwrap()
                .to_changelog(Some(*e))
                .unwrap()
        })
        .collect();
    let schema = changelog_schema(&schema(), true);
    arrow_select::concat::concat_batches(&schema, &batches).unwrap()
}

/// A changelog batch from raw rows `(epoch, op code, k, v)`, NULLs allowed everywhere.
pub(crate) type RawRow<'a> = (Option<u64>, Option<i8>, Option<i64>, Option<&'a str>);

pub(crate) fn raw_changes(rows: &[RawRow]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("_epoch", DataType::UInt64, true),
        Field::new("_op", DataType::Int8, true),
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(rows.iter().map(|r| r.0).collect::<UInt64Array>()),
            Arc::new(rows.iter().map(|r| r.1).collect::<Int8Array>()),
            Arc::new(rows.iter().map(|r| r.2).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.3).collect::<StringArray>()),
        ],
    )
    .unwrap()
}

/// A dataset directory: the manifest, one snapshot file per entry of `snapshot`, one change
/// file per entry of `changes` (named `part-00000.parquet`, ...).
pub(crate) fn dataset(
    manifest: &str,
    snapshot: &[RecordBatch],
    changes: &[RecordBatch],
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dataset.json"), manifest).unwrap();
    for (i, b) in snapshot.iter().enumerate() {
        write_batch(&part(dir.path(), "snapshot", i), b);
    }
    for (i, b) in changes.iter().enumerate() {
        write_batch(&part(dir.path(), "changes", i), b);
    }
    dir
}

pub(crate) fn part(dir: &Path, sub: &str, i: usize) -> PathBuf {
    dir.join(sub).join(format!("part-{i:05}.parquet"))
}

/// Asserts `err` is an [`Error::Dataset`] about file `file` (a name suffix) at `location`,
/// whose message contains `needle`.
#[track_caller]
pub(crate) fn assert_dataset_error(err: Error, file: &str, location: &str, needle: &str) {
    let text = err.to_string();
    match &err {
        Error::Dataset {
            path,
            location: at,
            message,
        } => {
            assert!(path.ends_with(file), "path {}: {text}", path.display());
            assert_eq!(at, location, "{text}");
            assert!(message.contains(needle), "`{needle}` not in: {text}");
            assert!(err.is_bad_input());
        }
        other => panic!("expected a dataset error, got {other:?}"),
    }
}

/// A changelog batch from lines `<epoch> <op token> <k> <v>` (`+ - U- U+`), with no checks,
/// so update pairs may be split across batches and files.
pub(crate) fn log(text: &str) -> RecordBatch {
    let rows: Vec<(u64, i8, Option<i64>, Option<String>)> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let op = match t[1] {
                "+" => 1,
                "-" => 2,
                "U-" => 3,
                "U+" => 4,
                other => panic!("bad op {other}"),
            };
            let k = (t[2] != "NULL").then(|| t[2].parse().unwrap());
            let v = (t[3] != "NULL").then(|| t[3].to_string());
            (t[0].parse().unwrap(), op, k, v)
        })
        .collect();
    let raw: Vec<RawRow> = rows
        .iter()
        .map(|(e, op, k, v)| (Some(*e), Some(*op), *k, v.as_deref()))
        .collect();
    raw_changes(&raw)
}
