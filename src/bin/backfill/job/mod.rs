//! The replay job of the command-line tool, on the library's job API: the job itself
//! (`replay.rs`), its Parquet sink (`sink.rs`, with the column writers of `column_writer.rs`,
//! `lanes.rs` and `encoding.rs`), the completion certificate (`certificate.rs`), which state
//! and output belong together (`output.rs`), an output on object storage (`remote.rs`) and its checkpoints there (`checkpoint.rs`), and the dataset's validation beside the load
//! (`validation.rs`).

mod certificate;
pub mod checkpoint;
mod column_writer;
mod encoding;
mod lanes;
pub mod output;
pub mod remote;
pub mod replay;
pub mod shard;
pub mod sink;
mod validation;

// The library's job API, under the names the tool's modules use for it.
pub use arrangement_backfill::job::{
    BackfillJob, Change, ExactlyOnceSink, JobControl, JobOptions, JobProgress, LoadProgress,
    PreparedCheckpoint, Recovery, SealedLoad, TableLoader,
};

pub use certificate::{Certificate, TableDigest, certify_output};
/// The generator (`backfill gen`) writes its files with the sink's column-parallel writer.
pub(crate) use column_writer::ColumnParallelWriter;
