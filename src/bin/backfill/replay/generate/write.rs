//! The generator's files: the output directory, Parquet files written batch by batch, the
//! sample of the snapshot kept for the changelog, and the clean-up after a failure.

use super::*;
use crate::job::ColumnParallelWriter;

/// Checks that `out` does not exist or is an empty directory; returns whether it existed.
pub(super) fn prepare_out(out: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(out) {
        Ok(meta) if meta.is_dir() => {
            let mut entries = std::fs::read_dir(out).map_err(|e| Error::file(out, e))?;
            if entries.next().is_some() {
                return Err(Error::config(format!(
                    "output directory {} exists and is not empty",
                    out.display()
                )));
            }
            Ok(true)
        }
        Ok(_) => Err(Error::config(format!(
            "output {} exists and is not a directory",
            out.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::file(out, e)),
    }
}

/// Removes what a failed generation wrote: the dataset's files, or `out` itself when it did
/// not exist before. Best effort: the error being reported matters more than one about
/// cleaning up.
pub(super) fn remove_partial(out: &Path, existed: bool) {
    if existed {
        for name in [SNAPSHOT_DIR, CHANGES_DIR] {
            let _ = std::fs::remove_dir_all(out.join(name));
        }
        let _ = std::fs::remove_file(out.join(super::super::manifest::MANIFEST_FILE));
    } else {
        let _ = std::fs::remove_dir_all(out);
    }
}

/// Creates `path` for writing.
pub(super) fn create_file(path: &Path) -> Result<File> {
    File::create(path).map_err(|e| Error::file(path, e))
}

/// `e` as an error about `path`, unless it already names a file.
fn at(path: &Path, e: Error) -> Error {
    match e {
        e @ Error::Engine(crate::error::EngineError::File { .. }) => e,
        e => Error::file(path, std::io::Error::other(e.to_string())),
    }
}

/// A Parquet file (zstd) written batch by batch, its columns encoded in parallel on rayon
/// while the caller goes on ([`ColumnParallelWriter`]): memory holds the row group being
/// encoded, not the file. Every error names the path.
pub(super) struct PartWriter {
    path: PathBuf,
    writer: ColumnParallelWriter<File>,
}

impl PartWriter {
    /// Creates `path` with `create` and starts a file of `schema`.
    pub(super) fn create(
        path: PathBuf,
        schema: SchemaRef,
        create: &dyn Fn(&Path) -> Result<File>,
    ) -> Result<Self> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let file = create(&path)?;
        let writer =
            ColumnParallelWriter::try_new(file, schema, props).map_err(|e| at(&path, e))?;
        Ok(Self { path, writer })
    }

    /// Queues `batch` to be written.
    pub(super) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer
            .write(std::slice::from_ref(batch))
            .map_err(|e| at(&self.path, e))
    }

    /// Writes the rest and the footer, and syncs the file to disk.
    pub(super) fn finish(self) -> Result<()> {
        let file = self.writer.finish().map_err(|e| at(&self.path, e))?;
        file.sync_all().map_err(|e| Error::file(&self.path, e))
    }
}

/// The first rows of the snapshot, up to a limit: the values of new and updated rows are
/// drawn from them.
pub(super) struct Sample {
    limit: usize,
    rows: usize,
    batches: Vec<RecordBatch>,
}

impl Sample {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            rows: 0,
            batches: Vec::new(),
        }
    }

    /// Keeps the first rows of `batch` while the sample has room.
    pub(super) fn offer(&mut self, batch: &RecordBatch) {
        let take = batch.num_rows().min(self.limit - self.rows);
        if take > 0 {
            self.batches.push(batch.slice(0, take));
            self.rows += take;
        }
    }

    /// The sample as one batch (its own copy of the rows: the snapshot's batches are freed).
    pub(super) fn finish(self, schema: &SchemaRef) -> Result<RecordBatch> {
        Ok(arrow_select::concat::concat_batches(schema, &self.batches)?)
    }
}
