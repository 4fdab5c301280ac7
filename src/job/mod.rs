//! Jobs: what wires an upstream, the backfill and a sink together.
//!
//! Today one job exists, the dataset [`replay`]: a single backfill actor owning every vnode,
//! fed by a source task that materializes the changelog into the upstream table, draining
//! into a Parquet [`sink`] committed by two-phase commit, with barriers from the
//! [`barrier`] injector. Parallel actors, the hash dispatcher and barrier-aligned merging
//! come with the parallelism work.

pub mod barrier;
pub mod replay;
pub mod sink;
