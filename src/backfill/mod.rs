//! The arrangement backfill: progress, filtering, the I/O-free core and the async executor.

pub mod core;
pub mod executor;
pub mod filter;
pub mod no_shuffle;
pub mod progress;
pub mod reference;
