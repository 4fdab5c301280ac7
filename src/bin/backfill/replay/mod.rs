//! Datasets and replays (docs/DESIGN.md sections 9 and 10.1): reading, validating, generating
//! and verifying.
//!
//! A dataset is a directory: `dataset.json` (the [`Manifest`]), `snapshot/*.parquet` (the
//! upstream table at the start) and `changes/*.parquet` (the upstream changelog: `_epoch`,
//! `_op`, then the table's columns). A replay loads the snapshot, backfills an identity
//! downstream while feeding the changelog, and writes the downstream changelog to
//! `out/changes/epoch-<20 digits>.parquet`.
//!
//! ```text
//!   generate ──> dataset dir ──> Dataset::open ──> validate ──> read_snapshot / read_changes
//!                                                                  │ (the job)
//!                          verify(dataset, out) <── out/changes/epoch-*.parquet
//! ```
//!
//! Invariants:
//! - every error about the data is an [`crate::Error::Dataset`] naming the file, the row within
//!   it (from 0) and the epoch where one applies; [`crate::Error::is_bad_input`] is true for it;
//! - [`Dataset::read_changes`] never splits a U-/U+ pair and never mixes two epochs in a chunk;
//! - a dataset that passes [`Dataset::validate`] applies cleanly, row by row, to its snapshot.

mod apply;
mod by_key;
mod changelog;
mod dataset;
mod extsort;
pub(crate) mod files;
mod generate;
mod manifest;
#[cfg(test)]
mod model;
mod ordered_run;
pub(crate) mod prefetch;
mod scratch;
pub(crate) mod storage;
#[cfg(test)]
pub(crate) mod testing;
mod touched;
mod validate;
mod verify;

pub(crate) use by_key::RunPlace;
pub use dataset::{Dataset, DatasetSummary};
pub use extsort::ExternalSortOptions;
pub use generate::{GenKind, GenOptions, SyntheticShape, generate};
pub use scratch::remove_all_scratch;
pub(crate) use validate::{
    Checkpoints, Observed, SNAPSHOT_CHUNK_ROWS, SnapshotFeed, ValidationCheckpoint,
};
#[cfg(test)]
pub use verify::verify;
pub use verify::{VerifyReport, verify_with};
