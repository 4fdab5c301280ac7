//! The arrangement backfill: progress, filtering, the I/O-free core and the async executor.

pub mod filter;
pub mod progress;
