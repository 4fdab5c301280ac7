//! Jobs: what wires an upstream, the backfill and a sink together.
//!
//! ```text
//!   upstream source ──▶ dispatcher ──▶ N backfill actors ──▶ aligned merge ──▶ sink / consumer
//!   (materialize)       (by vnode)     (tokio tasks)         (barriers align)   (commit)
//! ```
//!
//! [`BackfillJob`] is the job every embedding uses (`handle.rs`): a named view of one table,
//! fed by [`Change`]s (`upstream.rs` checks them, `feeder.rs` writes them and closes epochs),
//! over the parallel runtime, committing its checkpoints itself, read as a stream or run into
//! an [`ExactlyOnceSink`] (`exactly_once.rs`). `load.rs` loads its table ([`load_table`]).
//! [`ParallelBackfill`] is the parallel runtime underneath (`runtime.rs`): the hash
//! dispatcher (`dispatcher.rs`, [`VnodeMap`]), N backfill actors each a tokio task
//! (`actors.rs`), the barrier-aligned merge (`aligned_merge.rs`), online rescale, a control
//! handle (`control.rs`, [`JobControl`]) and job-level progress (`progress.rs`,
//! [`JobProgress`]), with barriers from the barrier injector (`barrier.rs`). The command-line
//! tool's replay is built on [`BackfillJob`], in the binary target.

mod actors;
mod aligned_merge;
pub(crate) mod barrier;
mod control;
mod dispatcher;
mod exactly_once;
mod feeder;
mod handle;
mod load;
mod progress;
mod runtime;
mod upstream;

pub use control::{CONTROL_CAPACITY, JobControl};
pub use dispatcher::VnodeMap;
pub use exactly_once::{ExactlyOnceSink, PreparedCheckpoint, Recovery};
pub use handle::{BackfillJob, JobOptions, JobSummary, ResumePoint};
pub use load::{LoadProgress, Loaded, SealedLoad, TableLoader, load_key, load_parquet, load_table};
pub use progress::{ActorProgress, JobProgress};
pub use runtime::ParallelBackfill;
pub use upstream::Change;
