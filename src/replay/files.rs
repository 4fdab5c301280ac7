//! Parquet files of a dataset directory: listing, opening, schemas.
//!
//! Every failure here is an [`Error::Dataset`] naming the file, so a user can find the one
//! bad file among many. Files are taken in lexicographic name order. Files whose names start
//! with `.` or `_` (hidden files, Hive/Spark markers such as `_SUCCESS`) are skipped, and
//! listed as skipped so that the tool can warn about each; any other file that is not
//! `*.parquet`, or a subdirectory, is an error rather than silently ignored data.
//!
//! Reads are bounded by bytes as well as rows: a batch of a `Utf8`/`Binary` column holds at
//! most 2 GiB (its offsets are `i32`), so [`open_reader`] shrinks the batch size of a file
//! whose byte-array columns are large ([`batch_rows`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::{Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::ParquetMetaData;

use crate::error::{Error, Result};

/// The files of a dataset directory: the Parquet files to read and the skipped ones.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The Parquet files, in name order.
    pub files: Vec<PathBuf>,
    /// Files skipped by the `.`/`_` convention, in name order.
    pub skipped: Vec<PathBuf>,
}

/// The Parquet files of `dir`, in name order. A missing directory is an empty list when
/// `required` is false and an error otherwise.
pub(crate) fn list_parquet_files(dir: &Path, required: bool) -> Result<Listing> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(Listing::default());
        }
        Err(e) => {
            return Err(Error::dataset(
                dir,
                "",
                format!("cannot list the directory: {e}"),
            ));
        }
    };
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::dataset(dir, "", format!("cannot list: {e}")))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            skipped.push(path);
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
    skipped.sort();
    Ok(Listing { files, skipped })
}

fn unreadable(path: &Path, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::dataset_caused_by(path, "", "unreadable Parquet file", e)
}

pub(crate) fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file =
        File::open(path).map_err(|e| Error::dataset(path, "", format!("cannot open: {e}")))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(path, e))
}

/// The Arrow schema of a Parquet file (reads the footer only).
pub(crate) fn read_schema(path: &Path) -> Result<SchemaRef> {
    Ok(builder(path)?.schema().clone())
}

/// The bytes of one byte-array column a batch may hold on average (256 MiB): an eighth of
/// the 2 GiB an `i32`-offset array can address, so rows eight times larger than the average
/// of their row group still fit.
pub(crate) const BATCH_BYTES_PER_COLUMN: u64 = 256 << 20;

/// The rows per batch to read a file with: at most `requested`, and few enough that no
/// byte-array column (strings, binary) of any row group holds more than `budget` bytes in one
/// batch, by the row group's average bytes per row. At least 1.
pub(crate) fn batch_rows(metadata: &ParquetMetaData, requested: usize, budget: u64) -> usize {
    let mut rows = requested.max(1);
    for group in metadata.row_groups() {
        let group_rows = u64::try_from(group.num_rows()).unwrap_or(0).max(1);
        for column in group.columns() {
            if matches!(
                column.column_type(),
                PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY
            ) {
                let bytes = u64::try_from(column.uncompressed_size()).unwrap_or(0);
                let per_row = bytes.div_ceil(group_rows).max(1);
                let fit = usize::try_from(budget / per_row).unwrap_or(usize::MAX);
                rows = rows.min(fit.max(1));
            }
        }
    }
    rows
}

/// A reader of `path` in batches of at most `batch_size` rows (fewer for large strings, see
/// [`batch_rows`]).
pub(crate) fn open_reader(path: &Path, batch_size: usize) -> Result<ParquetRecordBatchReader> {
    let builder = builder(path)?;
    let rows = batch_rows(builder.metadata(), batch_size, BATCH_BYTES_PER_COLUMN);
    builder
        .with_batch_size(rows)
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

/// True when `a` and `b` have the same field names and types, in order (nullability,
/// metadata and the names of nested fields, such as a list's `item` or `element`, may
/// differ: writers disagree on them, and the replay's output uses Parquet's `element`).
pub(crate) fn same_columns(a: &[Arc<Field>], b: &[Arc<Field>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.name() == y.name() && x.data_type().equals_datatype(y.data_type()))
}

/// `columns` with the exact types of `schema`'s fields: a column whose type differs only in
/// nested field names (see [`same_columns`]) is relabelled by a cast.
pub(crate) fn conform(columns: &[ArrayRef], schema: &Schema) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(column.clone())
            } else {
                Ok(arrow_cast::cast(column, field.data_type())?)
            }
        })
        .collect()
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
    let columns = conform(batch.columns(), schema).map_err(|e| {
        Error::dataset(
            path,
            "",
            format!("batch does not fit the dataset schema: {e}"),
        )
    })?;
    RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::DataType;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    /// `rows` rows of an Int64 column and a string column of `width` bytes per row, in row
    /// groups of `group` rows.
    fn file(dir: &Path, rows: usize, width: usize, group: usize) -> PathBuf {
        let path = dir.join(format!("f-{rows}-{width}-{group}.parquet"));
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("{i:0width$}")),
                )),
            ],
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .set_dictionary_enabled(false)
            .build();
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    }

    #[test]
    fn batch_rows_are_bounded_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let wide = builder(&file(dir.path(), 1000, 1000, 250)).unwrap();
        let metadata = wide.metadata();
        // 1000 bytes a row (plus a length prefix): a 100 kB budget holds about 96 rows.
        let rows = batch_rows(metadata, 8192, 100_000);
        assert!((90..=100).contains(&rows), "{rows}");
        // The requested size still bounds, and the result is never 0.
        assert_eq!(batch_rows(metadata, 10, 100_000), 10);
        assert_eq!(batch_rows(metadata, 8192, 1), 1);
        assert_eq!(batch_rows(metadata, 0, 1 << 30), 1);
        // At the real budget, 2 GiB of strings per 8192 rows (262 kB a row) are read in
        // batches of at most 1024 rows: 256 MiB.
        let per_row = (2u64 << 30) / 8192;
        assert!(BATCH_BYTES_PER_COLUMN / per_row <= 1024);
        // Narrow strings do not shrink the batch.
        let narrow = builder(&file(dir.path(), 1000, 8, 1000)).unwrap();
        assert_eq!(
            batch_rows(narrow.metadata(), 8192, BATCH_BYTES_PER_COLUMN),
            8192
        );
    }

    #[test]
    fn open_reader_uses_the_bounded_batch_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 100, 8, 100);
        let reader = open_reader(&path, 30).unwrap();
        let sizes: Vec<usize> = reader.map(|b| b.unwrap().num_rows()).collect();
        assert_eq!(sizes, [30, 30, 30, 10]);
    }

    #[test]
    fn skipped_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        file(dir.path(), 1, 1, 1);
        std::fs::write(dir.path().join("_extra.parquet"), b"x").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"x").unwrap();
        std::fs::write(dir.path().join("_SUCCESS"), b"").unwrap();
        let listing = list_parquet_files(dir.path(), true).unwrap();
        assert_eq!(listing.files.len(), 1);
        let names: Vec<_> = listing
            .skipped
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [".hidden", "_SUCCESS", "_extra.parquet"]);
    }
}
