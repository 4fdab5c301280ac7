//! arrangement-backfill: backfill a new streaming view from a live arrangement, on Apache Arrow.
#![warn(missing_docs)]

pub mod chunk;
pub mod error;
pub mod vnode;

pub use error::{Error, Result};
