//! Dataset directories written by hand, and Parquet files read back: the layout the tool
//! reads (`dataset.json`, `snapshot/*.parquet`, `changes/*.parquet`) and writes
//! (`OUT/changes/epoch-*.parquet`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

/// A batch of `columns` named and typed by `fields`.
pub fn record_batch(fields: Vec<Field>, columns: Vec<ArrayRef>) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Writes `batch` as the Parquet file `path` (its directory created), with `props`.
pub fn write_parquet_with(path: &Path, batch: &RecordBatch, props: Option<WriterProperties>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), props).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Writes `batch` as the Parquet file `path` (its directory created).
pub fn write_parquet(path: &Path, batch: &RecordBatch) {
    write_parquet_with(path, batch, None)
}

/// A dataset directory: the manifest text (none: no `dataset.json`), one snapshot file and
/// optionally one changelog file.
pub fn write_dataset(
    dir: &Path,
    manifest: Option<&str>,
    snapshot: &RecordBatch,
    changes: Option<&RecordBatch>,
) {
    std::fs::create_dir_all(dir).unwrap();
    if let Some(manifest) = manifest {
        std::fs::write(dir.join("dataset.json"), manifest).unwrap();
    }
    write_parquet(&dir.join("snapshot/part-0.parquet"), snapshot);
    if let Some(changes) = changes {
        write_parquet(&dir.join("changes/part-0.parquet"), changes);
    }
}

/// Every batch of the Parquet file `file`, in order.
pub fn read_parquet(file: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(file).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}
