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
            ..
        } => {
            assert!(path.ends_with(file), "path {}: {text}", path.display());
            assert_eq!(at, location, "{text}");
            assert!(
                message.contains(needle) || text.contains(needle),
                "`{needle}` not in: {text}"
            );
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

/// A random dataset from a live table model: snapshot files (row texts) and change files
/// (`log` texts), most changes applying cleanly. With `faults`, a few rows break a rule
/// (duplicate or NULL key, insert of a present key, delete of an absent one or with other
/// values, lone update half, decreasing epoch). Files split anywhere, update pairs included.
pub(crate) fn random_dataset(
    rng: &mut rand::rngs::StdRng,
    faults: bool,
) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
    let (snapshot, changes) = random_dataset_text(rng, faults);
    let mut snapshot: Vec<RecordBatch> = snapshot.iter().map(|t| rows(t)).collect();
    if snapshot.is_empty() {
        snapshot.push(rows(""));
    }
    (snapshot, changes.iter().map(|t| log(t)).collect())
}

/// [`random_dataset`] as texts: snapshot files of `rows` lines, change files of `log` lines.
pub(crate) fn random_dataset_text(
    rng: &mut rand::rngs::StdRng,
    faults: bool,
) -> (Vec<String>, Vec<String>) {
    use rand::Rng;
    use std::collections::BTreeMap;

    let fault = |rng: &mut rand::rngs::StdRng| faults && rng.random_bool(0.03);
    let value =
        |rng: &mut rand::rngs::StdRng| ["a", "b", "c", "NULL"][rng.random_range(0..4)].to_string();
    let mut table = BTreeMap::new();
    let mut lines = Vec::new();
    for _ in 0..rng.random_range(0..25) {
        let k: i64 = rng.random_range(0..40);
        let v = value(rng);
        if fault(rng) {
            lines.push(format!("NULL {v}"));
        } else if table.insert(k, v.clone()).is_none() || fault(rng) {
            lines.push(format!("{k} {v}"));
        }
    }
    let snapshot = split(rng, &lines, 3);

    let mut lines = Vec::new();
    let mut epoch = 1u64;
    for _ in 0..rng.random_range(0..15) {
        epoch += rng.random_range(0..3);
        for _ in 0..rng.random_range(1..6) {
            let k: i64 = rng.random_range(0..40);
            let e = if fault(rng) { epoch - 1 } else { epoch };
            let held = table.get(&k).cloned();
            match (held, rng.random_range(0..3)) {
                (None, _) => {
                    let v = value(rng);
                    if fault(rng) {
                        lines.push(format!("{e} - {k} {v}"));
                    } else {
                        lines.push(format!("{e} + {k} {v}"));
                        table.insert(k, v);
                    }
                }
                (Some(old), 0) => {
                    let old = if fault(rng) { "zz".to_string() } else { old };
                    lines.push(format!("{e} - {k} {old}"));
                    table.remove(&k);
                }
                (Some(old), 1) if fault(rng) => lines.push(format!("{e} + {k} {old}")),
                (Some(old), _) => {
                    // An update, usually of the same key, sometimes moving the row.
                    let to = if rng.random_bool(0.8) {
                        k
                    } else {
                        rng.random_range(0..40)
                    };
                    let v = value(rng);
                    lines.push(format!("{e} U- {k} {old}"));
                    table.remove(&k);
                    if fault(rng) {
                        lines.push(format!("{e} + {to} {v}"));
                    } else {
                        lines.push(format!("{e} U+ {to} {v}"));
                    }
                    table.insert(to, v);
                }
            }
            if fault(rng) {
                lines.push(format!("{e} + NULL x"));
            }
        }
    }
    let changes = split(rng, &lines, 4);
    (snapshot, changes)
}

/// `lines` cut into 1..=`most` non-empty texts at random points (no text when no lines).
pub(crate) fn split(rng: &mut rand::rngs::StdRng, lines: &[String], most: usize) -> Vec<String> {
    use rand::Rng;
    let parts = rng.random_range(1..=most).min(lines.len());
    let mut cuts: Vec<usize> = (0..parts.saturating_sub(1))
        .map(|_| rng.random_range(1..lines.len()))
        .collect();
    cuts.sort();
    cuts.dedup();
    let mut texts = Vec::new();
    let mut start = 0;
    for end in cuts.into_iter().chain([lines.len()]) {
        if start < end {
            texts.push(lines[start..end].join("\n"));
        }
        start = end;
    }
    texts
}
