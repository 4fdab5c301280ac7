//! Jobs: what wires an upstream, the backfill and a sink together.
//!
//! ```text
//!   upstream source ──▶ dispatcher ──▶ N backfill actors ──▶ aligned merge ──▶ sink / consumer
//!   (materialize)       (by vnode)     (tokio tasks)         (barriers align)   (commit)
//! ```
//!
//! Two jobs exist. [`BackfillJob`] is for embedders who want one executor over some vnodes:
//! it applies an upstream change stream to the upstream table, runs the backfill over it and
//! commits the store at the checkpoints the embedder collects (`handle.rs`).
//! [`ParallelBackfill`] is the parallel runtime (`runtime.rs`): the hash dispatcher
//! (`dispatcher.rs`, [`VnodeMap`]), N backfill actors each a tokio task (`actors.rs`), the
//! barrier-aligned merge (`aligned_merge.rs`), online rescale, a control handle
//! (`control.rs`, [`JobControl`]) and job-level progress (`progress.rs`, [`JobProgress`]).
//! When a replay finishes, `certificate.rs` compares per vnode what the downstream received
//! with the upstream table ([`Certificate`]).
//! The dataset [`replay`] is the command-line tool's: a source task that materializes the
//! changelog into the upstream table, the parallel runtime, and a Parquet sink (`sink.rs`)
//! committed by two-phase commit, with barriers from the barrier injector (`barrier.rs`).

mod actors;
mod aligned_merge;
pub(crate) mod barrier;
mod certificate;
mod column_writer;
mod control;
mod dispatcher;
mod encoding;
mod exactly_once;
mod feeder;
mod handle;
mod lanes;
mod load;
pub mod output;
mod progress;
pub mod replay;
mod runtime;
pub(crate) mod sink;
mod upstream;
mod validation;

pub use certificate::{Certificate, TableDigest, certify_output};
pub use column_writer::ColumnParallelWriter;
pub use control::{CONTROL_CAPACITY, JobControl};
pub use dispatcher::VnodeMap;
pub use exactly_once::{ExactlyOnceSink, PreparedCheckpoint, Recovery};
pub use handle::{BackfillJob, JobOptions, JobSummary, ResumePoint};
pub use load::{Loaded, SealedLoad, TableLoader, load_parquet, load_table};
pub use progress::{ActorProgress, JobProgress};
pub use runtime::ParallelBackfill;
pub use sink::output_files;
pub use upstream::Change;
