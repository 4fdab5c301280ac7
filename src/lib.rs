//! arrangement-backfill: backfill a new streaming view from a live arrangement, on Apache Arrow.
#![warn(missing_docs)]

pub mod backfill;
pub mod chunk;
pub mod error;
pub mod key;
pub mod merge;
pub mod replay;
pub mod store;
pub mod table;
pub mod vnode;

pub use error::{Error, Result};
