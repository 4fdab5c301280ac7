//! Parquet files of a dataset directory: listing, opening, schemas.
//!
//! Every failure here is an [`Error::Dataset`] naming the file, so a user can find the one
//! bad file among many. Files are taken in lexicographic name order. Hidden files (`.x`) and
//! marker files (`_SUCCESS`) are skipped; any other file that is not `*.parquet`, or a
//! subdirectory, is an error rather than silently ignored data.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};

use crate::error::{Error, Result};

/// The Parquet files of `dir`, in name order. A missing directory is an empty list when
/// `required` is false and an error otherwise.
pub(crate) fn list_parquet_files(dir: &Path, required: bool) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::dataset(
                dir,
                "",
                format!("cannot list the directory: {e}"),
            ));
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::dataset(dir, "", format!("cannot list: {e}")))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if !path.is_file() {
            return Err(Error::dataset(
                &path,
                "",
                "not a Parquet file (a directory or special file)",
            ));
        }
        if !name.ends_with(".parquet") {
            return Err(Error::dataset(
                &path,
                "",
                "not a Parquet file (expected a `.parquet` name)",
            ));
        }
        files.push(path);
    }
    files.sort();
    Ok(files)
}

fn unreadable(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::dataset(path, "", format!("unreadable Parquet file: {e}"))
}

fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file =
        File::open(path).map_err(|e| Error::dataset(path, "", format!("cannot open: {e}")))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(path, e))
}

/// The Arrow schema of a Parquet file (reads the footer only).
pub(crate) fn read_schema(path: &Path) -> Result<SchemaRef> {
    Ok(builder(path)?.schema().clone())
}

/// A reader of `path` in batches of at most `batch_size` rows.
pub(crate) fn open_reader(path: &Path, batch_size: usize) -> Result<ParquetRecordBatchReader> {
    builder(path)?
        .with_batch_size(batch_size.max(1))
        .build()
        .map_err(|e| unreadable(path, e))
}

/// Row `row` (from 0) of the Parquet file `path`, alone in a batch with the file's schema.
pub(crate) fn read_row(path: &Path, row: u64) -> Result<RecordBatch> {
    let skip = usize::try_from(row).map_err(|e| unreadable(path, e))?;
    let selection = RowSelection::from(vec![RowSelector::skip(skip), RowSelector::select(1)]);
    let mut reader = builder(path)?
        .with_row_selection(selection)
        .with_batch_size(1)
        .build()
        .map_err(|e| unreadable(path, e))?;
    match next_batch(&mut reader, path) {
        Some(batch) => batch,
        None => Err(Error::dataset(
            path,
            format!("row {row}"),
            "the file has fewer rows than when it was read",
        )),
    }
}

/// The next batch of `reader`, with read errors naming `path`.
pub(crate) fn next_batch(
    reader: &mut ParquetRecordBatchReader,
    path: &Path,
) -> Option<Result<RecordBatch>> {
    reader.next().map(|r| r.map_err(|e| unreadable(path, e)))
}

/// True when `a` and `b` have the same field names and types, in order (nullability and
/// metadata may differ).
pub(crate) fn same_columns(a: &[Arc<Field>], b: &[Arc<Field>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

/// `fields` without metadata, each nullable if it is nullable in `fields` or in `other`.
pub(crate) fn widen_nullability(fields: &[Arc<Field>], other: &[Arc<Field>]) -> Vec<Arc<Field>> {
    fields
        .iter()
        .zip(other)
        .map(|(f, o)| {
            Arc::new(Field::new(
                f.name(),
                f.data_type().clone(),
                f.is_nullable() || o.is_nullable(),
            ))
        })
        .collect()
}

/// Re-labels `batch` (whose columns have `schema`'s names and types) with `schema`.
pub(crate) fn with_schema(
    batch: &RecordBatch,
    schema: &SchemaRef,
    path: &Path,
) -> Result<RecordBatch> {
    if batch.schema_ref() == schema {
        return Ok(batch.clone());
    }
    RecordBatch::try_new_with_options(
        schema.clone(),
        batch.columns().to_vec(),
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(|e| {
        Error::dataset(
            path,
            "",
            format!("batch does not fit the dataset schema: {e}"),
        )
    })
}

/// A schema of `fields` without metadata.
pub(crate) fn plain_schema(fields: Vec<Arc<Field>>) -> SchemaRef {
    Arc::new(Schema::new(fields))
}
