//! Jobs: what wires an upstream, the backfill and a sink together.
//!
//! Two jobs exist. [`BackfillJob`] is for embedders: it applies an upstream change stream to
//! the upstream table, runs the backfill over it and commits the store at the checkpoints
//! the embedder collects (`handle.rs`). The dataset [`replay`] is the command-line tool's: a
//! single backfill actor owning every vnode, fed by a source task that materializes the
//! changelog into the upstream table, draining into a Parquet sink (`sink.rs`) committed by
//! two-phase commit, with barriers from the barrier injector (`barrier.rs`). Parallel actors,
//! the hash dispatcher and barrier-aligned merging come with the parallelism work.

pub(crate) mod barrier;
mod handle;
pub mod replay;
pub(crate) mod sink;

pub use handle::BackfillJob;
