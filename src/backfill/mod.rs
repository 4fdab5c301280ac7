//! The arrangement backfill (DESIGN section 7): per-vnode progress, the upstream filter, the
//! I/O-free core, the async executor, the no-shuffle baseline and the row-at-a-time reference.
//!
//! ```text
//!                    ┌──────────────────────── executor (async, tokio) ─────────────────────────┐
//!   upstream  ──────▶│ poll upstream ─┐                                  ┌─▶ emit chunks/barriers│──▶ downstream
//!   messages         │                ├─▶ core (events in, actions out) ─┼─▶ replicate, persist,  │
//!   replicated scans▶│ poll snapshot ─┘   tracker: per vnode | global     └─▶ seal, start scans    │
//!   (merge/)         └───────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! - [`progress`]: `NotStarted -> InProgress { pos, rows } -> Completed { rows }` per vnode,
//!   with a committed copy, and the typed progress table.
//! - [`filter`]: the vectorized rule that decides which buffered upstream rows to emit.
//! - [`core`]: the algorithm as a state machine with named policies; no I/O, tested directly.
//! - [`executor`]: drives the core from a `futures::Stream` of messages and a store.
//! - [`no_shuffle`]: the baseline with one global position, as a second [`core::Tracker`].
//! - [`reference`](mod@reference): the same algorithm over `Vec` rows and `BTreeMap`s, the differential check
//!   and the benchmarks' baseline.
//!
//! Invariants (DESIGN section 2) are checked by the oracle tests in `tests/`: I1 after every
//! barrier, I3 on every output change, I4 between barriers, I2 at the end, I6 under a busy
//! upstream.

pub mod core;
pub mod executor;
pub mod filter;
pub mod no_shuffle;
pub mod progress;
pub mod reference;
