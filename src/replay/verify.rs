//! Verifying a replay's output against its dataset: the oracle of a replay.
//!
//! The output directory holds `changes/epoch-<20 digits>.parquet` files (`_epoch`, `_op`, the
//! table's columns). [`verify`] applies them, in name order, strictly to an empty table
//! (exact row values: an all-column arrow-row encoding), so a duplicate insert, a delete of an
//! absent row or of a row with other values, or a lone update half fails with an
//! [`Error::Dataset`] naming the output file and row. It then computes the expected final table
//! (snapshot + every change, applied just as strictly) and compares the two; a difference names
//! the first differing key in primary-key order.

use std::path::{Path, PathBuf};

use super::apply::KeyedTable;
use super::changelog::ChangelogReader;
use super::dataset::{CHANGES_DIR, Dataset};
use crate::error::{Error, Result};
use crate::vnode::VnodeCount;

/// Rows per batch read during verification.
const BATCH_SIZE: usize = 8192;

/// What a successful [`verify`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    /// Output changelog files read.
    pub output_files: usize,
    /// Output changelog rows.
    pub output_rows: u64,
    /// Rows of the final table (equal in the output and the expectation).
    pub final_rows: u64,
}

/// The output changelog files of `out_dir`: `changes/epoch-*.parquet`, in name order.
fn output_files(out_dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = out_dir.join(CHANGES_DIR);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Error::dataset(&dir, "", format!("cannot list the replay output: {e}")))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::dataset(&dir, "", format!("cannot list: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("epoch-") && name.ends_with(".parquet") {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Checks that the output in `out_dir` is a consistent changelog whose result equals the
/// dataset's snapshot plus all its changes. See the module docs.
pub fn verify(dataset: &Dataset, out_dir: &Path) -> Result<VerifyReport> {
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let files = output_files(out_dir)?;
    let output_files = files.len();

    let mut output = KeyedTable::<Box<[u8]>>::new(dataset.schema(), desc.pk().clone())?;
    let mut output_rows = 0u64;
    for rows in ChangelogReader::new(files, dataset.schema().clone(), BATCH_SIZE) {
        let rows = rows?;
        apply_changes(&mut output, &rows)?;
        output_rows += rows.ops.len() as u64;
    }

    let mut expected = KeyedTable::<Box<[u8]>>::new(dataset.schema(), desc.pk().clone())?;
    for path in dataset.snapshot_files() {
        let mut first_row = 0u64;
        for batch in dataset.snapshot_file_reader(path, BATCH_SIZE)? {
            let batch = batch?;
            expected.load(&batch, |i, message| {
                Error::dataset(path, format!("row {}", first_row + i as u64), message)
            })?;
            first_row += batch.num_rows() as u64;
        }
    }
    for rows in dataset.changelog(BATCH_SIZE) {
        apply_changes(&mut expected, &rows?)?;
    }

    compare(&expected, &output, &out_dir.join(CHANGES_DIR))?;
    Ok(VerifyReport {
        output_files,
        output_rows,
        final_rows: output.len() as u64,
    })
}

fn apply_changes(
    table: &mut KeyedTable<Box<[u8]>>,
    rows: &super::changelog::ChangelogRows,
) -> Result<()> {
    table.apply(&rows.data, &rows.ops, |i, message| {
        rows.location(i).error(message)
    })
}

/// Compares the final tables; the error names the smallest differing key.
fn compare(
    expected: &KeyedTable<Box<[u8]>>,
    found: &KeyedTable<Box<[u8]>>,
    out: &Path,
) -> Result<()> {
    let missing_or_changed = expected
        .rows()
        .iter()
        .filter(|(k, v)| found.rows().get(*k) != Some(*v))
        .map(|(k, _)| k);
    let extra = found
        .rows()
        .keys()
        .filter(|k| !expected.rows().contains_key(*k));
    let differing: Vec<&Box<[u8]>> = missing_or_changed.chain(extra).collect();
    let Some(first) = differing.iter().min() else {
        return Ok(());
    };
    let show = |table: &KeyedTable<Box<[u8]>>| match table.rows().get(*first) {
        Some(row) => table.describe_value(row),
        None => "no row".into(),
    };
    let others = match differing.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} other keys)"),
    };
    Err(Error::dataset(
        out,
        "",
        format!(
            "the replay output does not match snapshot + changes: key {} expected {} found {}{others}",
            expected.describe_key(first),
            show(expected),
            show(found),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_array::RecordBatch;

    use super::*;
    use crate::replay::testing::{MANIFEST, changes, dataset, log, rows, write_batch};

    const SNAPSHOT: &str = "1 a\n2 b\n3 c";
    const CHANGES: &str = "4 + 4 d\n4 U- 1 a\n4 U+ 1 x\n7 - 2 b\n7 + 2 y\n9 - 3 c";

    fn output(files: &[(u64, RecordBatch)]) -> tempfile::TempDir {
        let out = tempfile::tempdir().unwrap();
        for (epoch, batch) in files {
            write_batch(
                &out.path()
                    .join("changes")
                    .join(format!("epoch-{epoch:020}.parquet")),
                batch,
            );
        }
        out
    }

    fn run(out_files: &[(u64, RecordBatch)]) -> Result<VerifyReport> {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[log(CHANGES)]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let out = output(out_files);
        verify(&ds, out.path())
    }

    /// The snapshot as inserts at epoch 1, then the dataset's changes by epoch.
    fn correct() -> Vec<(u64, RecordBatch)> {
        vec![
            (1, changes(&[(1, "+ 1 a\n+ 2 b\n+ 3 c")])),
            (4, log("4 + 4 d\n4 U- 1 a\n4 U+ 1 x")),
            (9, log("7 - 2 b\n7 + 2 y\n9 - 3 c")),
        ]
    }

    fn message(err: Error) -> String {
        assert!(matches!(err, Error::Dataset { .. }), "{err}");
        err.to_string()
    }

    #[test]
    fn accepts_a_correct_output() {
        let report = run(&correct()).unwrap();
        assert_eq!(
            report,
            VerifyReport {
                output_files: 3,
                output_rows: 9,
                final_rows: 3,
            }
        );
        // A different but equivalent changelog is fine too.
        let report = run(&[(2, changes(&[(2, "+ 4 d\n+ 2 y\n+ 1 x")]))]).unwrap();
        assert_eq!(report.final_rows, 3);
    }

    #[test]
    fn rejects_a_dropped_row() {
        let mut files = correct();
        files[2].1 = log("7 - 2 b\n7 + 2 y");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("does not match")
                && err.contains("key (k=3) expected no row found (k=3, v=c)"),
            "{err}"
        );
        files.remove(0);
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch-00000000000000000004.parquet: epoch 4, row 1"),
            "{err}"
        );
        assert!(
            err.contains("update-delete (U-) of key (k=1), which does not exist"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_duplicated_insert() {
        let mut files = correct();
        files[1].1 = log("4 + 4 d\n4 + 4 d");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch-00000000000000000004.parquet: epoch 4, row 1"),
            "{err}"
        );
        assert!(
            err.contains("insert of key (k=4), which already exists"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_changed_value() {
        let mut files = correct();
        files[2].1 = log("7 - 2 b\n7 + 2 z\n9 - 3 c");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("key (k=2) expected (k=2, v=y) found (k=2, v=z)"),
            "{err}"
        );
        // A delete with other values than the row held.
        files[2].1 = log("7 - 2 q\n7 + 2 y\n9 - 3 c");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch 7, row 0") && err.contains("(k=2, v=b)"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_lone_update_half() {
        let mut files = correct();
        files[1].1 = log("4 + 4 d\n4 U- 1 a\n4 + 1 x");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch 4, row 1") && err.contains("not immediately followed"),
            "{err}"
        );
    }

    #[test]
    fn missing_output_is_an_error() {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let err = verify(&ds, Path::new("/nonexistent/out")).unwrap_err();
        assert!(matches!(err, Error::Dataset { .. }), "{err}");
    }
}
