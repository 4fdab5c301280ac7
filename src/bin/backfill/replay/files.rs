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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::ParquetMetaData;

use super::storage::{self, DataFile};
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
    if storage::is_url(dir) {
        return list_objects(dir, required);
    }
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

/// [`list_parquet_files`] of a directory on object storage.
fn list_objects(dir: &Path, required: bool) -> Result<Listing> {
    let Some(mut entries) = storage::list(dir)? else {
        if required {
            return Err(Error::dataset(
                dir,
                "",
                "no such directory (no object under it)",
            ));
        }
        return Ok(Listing::default());
    };
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut listing = Listing::default();
    for entry in entries {
        if entry.name.starts_with('.') || entry.name.starts_with('_') {
            listing.skipped.push(entry.path);
        } else if !entry.is_file {
            return Err(Error::dataset(
                &entry.path,
                "",
                "not a Parquet file (a directory)",
            ));
        } else if !entry.name.ends_with(".parquet") {
            return Err(Error::dataset(
                &entry.path,
                "",
                "not a Parquet file (expected a `.parquet` name)",
            ));
        } else {
            listing.files.push(entry.path);
        }
    }
    Ok(listing)
}

fn unreadable(path: &Path, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::dataset_caused_by(path, "", "unreadable Parquet file", e)
}

pub(crate) fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<DataFile>> {
    let file = storage::open(path)?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(path, e))
}

/// A builder of readers of `path` that read narrow dictionary columns (8 or 16-bit keys)
/// with 32-bit keys, and the file's own Arrow schema, which [`BatchReader`] converts them
/// back to (see [`crate::dictionary::widened_schema`]).
fn wide_builder(path: &Path) -> Result<(ParquetRecordBatchReaderBuilder<DataFile>, SchemaRef)> {
    let builder = builder(path)?;
    let schema = builder.schema().clone();
    let Some(wide) = crate::dictionary::widened_schema(&schema) else {
        return Ok((builder, schema));
    };
    let options = ArrowReaderOptions::new().with_schema(wide);
    let metadata = ArrowReaderMetadata::try_new(builder.metadata().clone(), options)
        .map_err(|e| unreadable(path, e))?;
    let file = storage::open(path)?;
    Ok((
        ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata),
        schema,
    ))
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
/// [`batch_rows`] and [`BatchReader`]).
pub(crate) fn open_reader(path: &Path, batch_size: usize) -> Result<BatchReader> {
    BatchReader::open(path, batch_size, BATCH_BYTES_PER_COLUMN)
}

/// A Parquet file's batches, bounded by rows and by bytes.
///
/// The batch size comes from the footer ([`batch_rows`]), whose sizes can be far below what
/// a column decodes to: a dictionary-encoded column stores each distinct value once (a
/// 100 kB file can decode to gigabytes). When a batch's strings overflow the 2 GiB an
/// `i32`-offset array holds anyway, the same rows are read again in batches an eighth the
/// size, and so on down to one row (the rest of the file keeps the smaller size); a single
/// row that still overflows is an [`Error::Dataset`] naming the file, the row and the column.
pub(crate) struct BatchReader {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    schema: SchemaRef,
    /// Whether it reads narrow dictionaries with wider keys ([`wide_builder`]).
    wide: bool,
    /// Rows per batch now.
    rows: usize,
    /// The file's row the next batch starts at.
    next_row: u64,
    /// Rows in the file.
    total_rows: u64,
    /// Tests: a batch with more than this many bytes in a byte-array column fails as an
    /// overflow would (a real one needs 2 GiB).
    #[cfg(test)]
    limit: Option<usize>,
}

/// How much smaller a batch is read again after an overflow.
const SHRINK: usize = 8;

impl BatchReader {
    /// A reader of `path` in batches of at most `batch_size` rows and, by the footer's sizes,
    /// `budget` bytes of each byte-array column.
    pub(crate) fn open(path: &Path, batch_size: usize, budget: u64) -> Result<Self> {
        let (builder, schema) = wide_builder(path)?;
        let wide = builder.schema() != &schema;
        let rows = batch_rows(builder.metadata(), batch_size, budget);
        let total_rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
        let reader = (builder.with_batch_size(rows).build()).map_err(|e| unreadable(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            schema,
            wide,
            rows,
            next_row: 0,
            total_rows,
            #[cfg(test)]
            limit: None,
        })
    }

    /// Rows in the file (from its footer).
    pub(crate) fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Goes on from row `from` of the file (skipping the rows before it without decoding
    /// them where the file allows).
    pub(crate) fn skip_to(&mut self, from: u64) -> Result<()> {
        self.reader = self.reader_from(from, None)?;
        self.next_row = from;
        Ok(())
    }

    /// The file's Arrow schema.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The next batch, or `None` after the last; read errors name the file.
    pub(crate) fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            let result = self.reader.next()?;
            #[cfg(test)]
            let result = result.and_then(|b| over_limit(b, self.limit));
            match result {
                Ok(batch) => {
                    let batch = self.narrowed(batch);
                    if let Ok(batch) = &batch {
                        self.next_row += batch.num_rows() as u64;
                    }
                    return Some(batch);
                }
                Err(e) if is_overflow(&e) && self.rows > 1 => {
                    self.rows = (self.rows / SHRINK).max(1);
                    match self.reader_from(self.next_row, None) {
                        Ok(reader) => self.reader = reader,
                        Err(e) => return Some(Err(e)),
                    }
                }
                Err(e) if is_overflow(&e) => return Some(Err(self.overflow(e))),
                Err(e) => return Some(Err(unreadable(&self.path, e))),
            }
        }
    }

    /// A reader of the file from row `from` on, in batches of `self.rows`, of the leaf
    /// column `leaf` alone if given.
    fn reader_from(&self, from: u64, leaf: Option<usize>) -> Result<ParquetRecordBatchReader> {
        let rest = self.total_rows.saturating_sub(from);
        let count = |n: u64| usize::try_from(n).map_err(|e| unreadable(&self.path, e));
        let selection = RowSelection::from(vec![
            RowSelector::skip(count(from)?),
            RowSelector::select(count(rest)?),
        ]);
        let mut builder = wide_builder(&self.path)?.0.with_row_selection(selection);
        if let Some(leaf) = leaf {
            let mask = ProjectionMask::leaves(builder.parquet_schema(), [leaf]);
            builder = builder.with_projection(mask);
        }
        (builder.with_batch_size(self.rows).build()).map_err(|e| unreadable(&self.path, e))
    }

    /// `batch`, read with wider dictionary keys ([`wide_builder`]), in the file's schema; a
    /// batch whose distinct values do not fit a column's keys is an error naming the file,
    /// its rows and the column.
    fn narrowed(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if !self.wide {
            return Ok(batch);
        }
        let rows = batch.num_rows();
        let columns = (batch.columns().iter().zip(self.schema.fields()))
            .map(|(column, field)| {
                crate::dictionary::narrowed(field, column).map_err(|e| {
                    Error::dataset(
                        &self.path,
                        format!("rows {} to {}", self.next_row, self.next_row + rows as u64),
                        e.to_string(),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
            .map_err(|e| unreadable(&self.path, e))
    }

    /// The error for a batch of one row (`self.next_row`) that still overflows, naming the
    /// column whose read alone overflows.
    fn overflow(&self, e: ArrowError) -> Error {
        let column = self.culprit().map_or_else(
            || "a string or binary column".to_string(),
            |c| format!("column `{c}`"),
        );
        Error::dataset_caused_by(
            &self.path,
            format!("row {}", self.next_row),
            format!(
                "{column} holds more than 2 GiB in one row, more than an Arrow array of it \
                 can hold; split the value, or store the column as large_string or \
                 large_binary"
            ),
            e,
        )
    }

    /// The first byte-array leaf column whose read alone, at the current row, overflows.
    fn culprit(&self) -> Option<String> {
        let metadata = builder(&self.path).ok()?.metadata().clone();
        let descr = metadata.file_metadata().schema_descr();
        (0..descr.num_columns())
            .filter(|&i| {
                matches!(
                    descr.column(i).physical_type(),
                    PhysicalType::BYTE_ARRAY | PhysicalType::FIXED_LEN_BYTE_ARRAY
                )
            })
            .find(|&i| {
                let Ok(mut reader) = self.reader_from(self.next_row, Some(i)) else {
                    return false;
                };
                let result = reader.next();
                #[cfg(test)]
                let result = result.map(|r| r.and_then(|b| over_limit(b, self.limit)));
                matches!(result, Some(Err(e)) if is_overflow(&e))
            })
            .map(|i| descr.column(i).path().string())
    }
}

/// Whether a read error is a byte-array column overflowing its offsets (the Parquet decoder
/// says "index overflow decoding byte array"; Arrow kernels "Offset overflow").
fn is_overflow(e: &ArrowError) -> bool {
    let message = e.to_string();
    message.contains("index overflow decoding byte array") || message.contains("Offset overflow")
}

/// Tests: `batch`, or the decoder's overflow error when a column of it holds more than
/// `limit` bytes of values.
#[cfg(test)]
fn over_limit(
    batch: RecordBatch,
    limit: Option<usize>,
) -> std::result::Result<RecordBatch, ArrowError> {
    let over = |c: &ArrayRef| limit.is_some_and(|l| offset_bytes(c.as_ref(), 0, c.len()) > l);
    if batch.columns().iter().any(over) {
        Err(ArrowError::ParquetError(
            "Parquet error: index overflow decoding byte array".into(),
        ))
    } else {
        Ok(batch)
    }
}

/// The bytes of values of rows `start..start + len` of a column whose values have 32-bit
/// offsets (`Utf8`, `Binary`: at most 2 GiB in one array); 0 for any other column.
pub(crate) fn offset_bytes(column: &dyn Array, start: usize, len: usize) -> usize {
    fn span<O: OffsetSizeTrait>(offsets: &[O], start: usize, end: usize) -> usize {
        match (offsets.get(start), offsets.get(end)) {
            (Some(a), Some(b)) => (*b - *a).as_usize(),
            _ => 0,
        }
    }
    match column.data_type() {
        DataType::Utf8 => span(
            column.as_string::<i32>().value_offsets(),
            start,
            start + len,
        ),
        DataType::Binary => span(
            column.as_binary::<i32>().value_offsets(),
            start,
            start + len,
        ),
        _ => 0,
    }
}

/// The bytes of values of rows `start..start + len` of `batch` in its columns with 32-bit
/// offsets ([`offset_bytes`]), summed: O(columns).
pub(crate) fn batch_offset_bytes(batch: &RecordBatch, start: usize, len: usize) -> usize {
    (batch.columns().iter())
        .map(|c| offset_bytes(c.as_ref(), start, len))
        .sum()
}

/// The most bytes of values in 32-bit-offset columns that rows gathered into one batch may
/// hold; more are handed on in pieces (1 GiB: half of what such an array holds).
pub(crate) const GATHER_BYTES: usize = 1 << 30;

/// Row `row` (from 0) of the Parquet file `path`, alone in a batch with the file's schema.
pub(crate) fn read_row(path: &Path, row: u64) -> Result<RecordBatch> {
    let mut reader = BatchReader::open(path, 1, BATCH_BYTES_PER_COLUMN)?;
    reader.reader = reader.reader_from(row, None)?;
    reader.next_row = row;
    match reader.next_batch() {
        Some(batch) => batch,
        None => Err(Error::dataset(
            path,
            format!("row {row}"),
            "the file has fewer rows than when it was read",
        )),
    }
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
    use std::fs::File;

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

    /// Issue 41 item 8: a batch whose strings overflow (here: more than a lowered limit) is
    /// read again, the same rows, in batches an eighth the size; every row comes once, in
    /// order.
    #[test]
    fn an_overflowing_batch_is_read_again_in_smaller_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 100, 1000, 100);
        let mut reader = BatchReader::open(&path, 64, BATCH_BYTES_PER_COLUMN).unwrap();
        reader.limit = Some(20_000);
        let mut sizes = Vec::new();
        let mut keys = Vec::new();
        while let Some(batch) = reader.next_batch() {
            let batch = batch.unwrap();
            sizes.push(batch.num_rows());
            let k = batch
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            keys.extend(k.values().iter().copied());
        }
        assert_eq!(keys, (0..100).collect::<Vec<i64>>());
        assert!(
            sizes.iter().all(|&n| n == 8) || sizes[..12] == [8; 12],
            "{sizes:?}"
        );
    }

    /// A single row that still overflows is an `Error::Dataset` naming the file, the row and
    /// the column (found by reading each byte-array column alone).
    #[test]
    fn a_row_that_overflows_alone_names_the_file_row_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("small", DataType::Utf8, false),
            Field::new("big", DataType::Binary, false),
        ]));
        let big: Vec<Vec<u8>> = (0..50)
            .map(|i| vec![b'x'; if i == 37 { 5000 } else { 10 }])
            .collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..50)),
                Arc::new(StringArray::from_iter_values(
                    (0..50).map(|i| format!("s{i}")),
                )),
                Arc::new(arrow_array::BinaryArray::from_iter_values(big.iter())),
            ],
        )
        .unwrap();
        let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let mut reader = BatchReader::open(&path, 16, BATCH_BYTES_PER_COLUMN).unwrap();
        reader.limit = Some(2000);
        let mut rows = 0;
        let err = loop {
            match reader.next_batch() {
                Some(Ok(batch)) => rows += batch.num_rows(),
                Some(Err(e)) => break e,
                None => panic!("no error"),
            }
        };
        // Rows before the bad one were all handed out.
        assert_eq!(rows, 37);
        assert!(matches!(err, Error::Dataset { .. }), "{err:?}");
        let message = err.to_string();
        for needle in [
            "wide.parquet",
            "row 37",
            "column `big`",
            "2 GiB",
            "large_binary",
        ] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
        // The decoder's own message, unmapped, is an overflow too.
        assert!(is_overflow(&ArrowError::ParquetError(
            "General: index overflow decoding byte array".into()
        )));
        assert!(is_overflow(&ArrowError::InvalidArgumentError(
            "Offset overflow error: 2222981120".into()
        )));
    }

    /// A real file (`$HUGE_FILE`, such as the `dict` dataset `tests/types_edge.rs` writes)
    /// read whole, batch sizes printed. By hand: `HUGE_FILE=... cargo test --lib -- --ignored
    /// reads_a_huge_file`.
    #[test]
    #[ignore]
    fn reads_a_huge_file() {
        let Ok(path) = std::env::var("HUGE_FILE") else {
            return;
        };
        let mut reader = open_reader(Path::new(&path), 8192).unwrap();
        let mut sizes = Vec::new();
        while let Some(batch) = reader.next_batch() {
            sizes.push(batch.unwrap().num_rows());
        }
        eprintln!("batches of {sizes:?} rows");
    }

    #[test]
    fn open_reader_uses_the_bounded_batch_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 100, 8, 100);
        let mut reader = open_reader(&path, 30).unwrap();
        let sizes: Vec<usize> = std::iter::from_fn(|| reader.next_batch())
            .map(|b| b.unwrap().num_rows())
            .collect();
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
