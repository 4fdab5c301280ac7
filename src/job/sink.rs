//! The Parquet changelog sink, exactly once by two-phase commit.
//!
//! The downstream changes of each checkpoint go to one file,
//! `changes/epoch-<checkpoint epoch, 20 digits>.parquet` (columns `_epoch`, `_op`, then the
//! table's). A checkpoint is written in two phases around the store's commit:
//!
//! ```text
//!   prepare(e): write epoch-e.parquet.tmp, fsync      (nothing visible yet)
//!   store.commit(e)                                    (progress and data durable)
//!   publish(e): rename .tmp -> .parquet, fsync dir     (the output of e is visible)
//! ```
//!
//! A crash before the commit leaves a `.tmp` file that is garbage; a crash between commit and
//! rename leaves a `.tmp` of a committed epoch, which recovery renames (rolls forward).
//! Checkpoints without changes write no file.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::chunk::{StreamChunk, changelog_schema};
use crate::error::{Error, Result};

/// The output file name of a checkpoint epoch.
pub fn file_name(epoch: u64) -> String {
    format!("epoch-{epoch:020}.parquet")
}

/// A prepared, not yet published, checkpoint file.
#[derive(Debug)]
#[must_use = "a prepared file is published after the store commits"]
pub struct Prepared {
    tmp: PathBuf,
    path: PathBuf,
    rows: u64,
}

/// Writes the downstream changelog as Parquet files, one per checkpoint.
#[derive(Debug)]
pub struct ParquetSink {
    dir: PathBuf,
    schema: SchemaRef,
    pending: Vec<(u64, StreamChunk)>,
    rows_published: u64,
    files_published: u64,
}

impl ParquetSink {
    /// A sink writing into `out/changes`, which is created. Output of an earlier run there
    /// (`epoch-*.parquet` and leftover `.tmp` files) is removed: a replay starts from scratch.
    pub fn create(out: &Path, table_schema: &SchemaRef) -> Result<Self> {
        let dir = out.join("changes");
        fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        for entry in fs::read_dir(&dir).map_err(|e| io_error(&dir, e))? {
            let path = entry.map_err(|e| io_error(&dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("epoch-")
                && (name.ends_with(".parquet") || name.ends_with(".parquet.tmp"))
            {
                fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
            }
        }
        Ok(Self {
            dir,
            schema: changelog_schema(table_schema, true),
            pending: Vec::new(),
            rows_published: 0,
            files_published: 0,
        })
    }

    /// Buffers a downstream chunk emitted in `epoch`.
    pub fn push(&mut self, epoch: u64, chunk: StreamChunk) {
        if !chunk.is_empty() {
            self.pending.push((epoch, chunk));
        }
    }

    /// Phase one: writes and fsyncs the buffered changes as the (hidden) file of checkpoint
    /// `epoch`. `None` when there is nothing to write.
    pub fn prepare(&mut self, epoch: u64) -> Result<Option<Prepared>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        let path = self.dir.join(file_name(epoch));
        let tmp = path.with_extension("parquet.tmp");
        let file = File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_coerce_types(true) // Date64 as a Parquet DATE, so every reader sees a date.
            .build();
        let mut writer = ArrowWriter::try_new(file, Arc::clone(&self.schema), Some(props))?;
        let mut rows = 0;
        for (chunk_epoch, chunk) in self.pending.drain(..) {
            rows += chunk.num_rows() as u64;
            writer.write(&chunk.to_changelog(Some(chunk_epoch))?)?;
        }
        let file = writer.into_inner()?;
        file.sync_all().map_err(|e| io_error(&tmp, e))?;
        Ok(Some(Prepared { tmp, path, rows }))
    }

    /// Phase two, after the store committed: makes the file visible.
    pub fn publish(&mut self, prepared: Prepared) -> Result<()> {
        fs::rename(&prepared.tmp, &prepared.path).map_err(|e| io_error(&prepared.path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error(&self.dir, e))?;
        self.rows_published += prepared.rows;
        self.files_published += 1;
        Ok(())
    }

    /// Rows in published files.
    pub fn rows_published(&self) -> u64 {
        self.rows_published
    }

    /// Files published.
    pub fn files_published(&self) -> u64 {
        self.files_published
    }

    /// The directory the files go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(
        e.kind(),
        format!("{}: {e}", path.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]))
    }

    #[test]
    fn two_phases_hide_the_file_until_published() {
        let out = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::create(out.path(), &schema()).unwrap();
        assert!(sink.prepare(3).unwrap().is_none(), "nothing to write");
        sink.push(2, StreamChunk::from_text(&schema(), "+ 1\n+ 2").unwrap());
        sink.push(3, StreamChunk::from_text(&schema(), "- 1").unwrap());
        let prepared = sink.prepare(3).unwrap().unwrap();
        let final_path = sink.dir().join(file_name(3));
        assert!(!final_path.exists());
        sink.publish(prepared).unwrap();
        assert!(final_path.exists());
        assert_eq!((sink.rows_published(), sink.files_published()), (3, 1));
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&final_path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
        let (chunk, epochs) = StreamChunk::from_changelog(&batches[0]).unwrap();
        assert_eq!(chunk.to_text().unwrap(), "+ 1\n+ 2\n- 1\n");
        assert_eq!(epochs.unwrap().values().as_ref(), &[2, 2, 3]);
    }

    #[test]
    fn a_new_sink_removes_the_previous_runs_output() {
        let out = tempfile::tempdir().unwrap();
        let changes = out.path().join("changes");
        fs::create_dir_all(&changes).unwrap();
        fs::write(changes.join(file_name(9)), b"old").unwrap();
        fs::write(changes.join("epoch-x.parquet.tmp"), b"old").unwrap();
        fs::write(changes.join("notes.txt"), b"keep").unwrap();
        ParquetSink::create(out.path(), &schema()).unwrap();
        let left: Vec<_> = fs::read_dir(&changes)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["notes.txt"]);
    }
}
