//! The arrangement backfill (docs/DESIGN.md section 7): per-vnode progress, the upstream
//! filter, the I/O-free core, the async executor, the no-shuffle baseline and the row-at-a-time
//! reference.
//!
//! ```text
//!                    ┌──────────────────────── executor (async, tokio) ─────────────────────────┐
//!   upstream  ──────▶│ poll upstream ─┐                                  ┌─▶ emit chunks/barriers│──▶ downstream
//!   messages         │                ├─▶ core (events in, actions out) ─┼─▶ replicate, persist,  │
//!   replicated scans▶│ poll snapshot ─┘   tracker: per vnode | global     └─▶ seal, start scans    │
//!   (merge/)         └───────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The types are re-exported here (and the executor's at the crate root); the files are:
//!
//! - `progress.rs`: `NotStarted -> InProgress { pos, rows } -> Completed { rows }` per vnode,
//!   with a committed copy, and the typed progress table.
//! - `filter.rs` ([`UpstreamFilter`]): the vectorized rule that decides which buffered upstream rows to emit.
//! - `core.rs` ([`BackfillCore`]): the algorithm as a state machine with named policies; no I/O, tested directly.
//! - `executor.rs` ([`BackfillExecutor`]): drives the core from a `futures::Stream` of messages and a store.
//! - `stream.rs` ([`BackfillStream`], [`ChangelogStream`]): the named output streams.
//! - `tracker.rs` ([`Tracker`], [`ArrangementTracker`]): how progress is tracked, per vnode.
//! - `no_shuffle.rs` ([`NoShuffleTracker`]): the baseline with one global position, as a
//!   second [`Tracker`].
//! - `reference.rs` (feature `testing`): the same algorithm over `Vec` rows and `BTreeMap`s,
//!   the differential check and the benchmarks' baseline.
//!
//! Invariants (docs/DESIGN.md section 2.1) are checked by the oracle tests in `tests/`: I1
//! after every barrier, I3 on every output change, I4 between barriers, I2 at the end, I6 under
//! a busy upstream.

pub(crate) mod core;
pub(crate) mod executor;
pub(crate) mod filter;
pub(crate) mod no_shuffle;
pub(crate) mod progress;
#[cfg(any(test, feature = "testing"))]
pub mod reference;
pub(crate) mod stream;
pub(crate) mod tracker;

pub use self::core::{Action, BackfillCore, BackfillStats, Phase, SLOWEST_VNODES};
pub use executor::{BackfillConfig, BackfillExecutor, MAX_BATCH_SIZE, PATCH_BUDGET, SnapshotOrder};
pub use filter::UpstreamFilter;
pub use no_shuffle::NoShuffleTracker;
pub use progress::{ProgressCodec, ProgressMap, SlowVnode, VnodeProgress, VnodeStateCounts};
pub use stream::{BackfillStream, BarrierHook, ChangelogStream};
pub use tracker::{ArrangementTracker, Tracker};
