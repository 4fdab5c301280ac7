//! A running backfill's changelog through the Arrow C stream interface.
//!
//! ```text
//!   ChangelogStream (async) ──▶ ChangelogReader (blocking RecordBatchReader)
//!                                   │ into_ffi_stream()
//!                                   ▼
//!                             FFI_ArrowArrayStream ──▶ pyarrow, DuckDB, Polars, arrow-rs ...
//! ```
//!
//! The C stream interface pulls: its consumer calls `get_next` from its own thread and waits.
//! [`ChangelogReader`] bridges that to the async backfill by blocking on a tokio runtime
//! handle, so the backfill (its scans, its rate limit timer) runs on that runtime while the
//! consumer waits. Errors cross the interface as Arrow errors ([`crate::Error`] converts);
//! after the first one the stream ends.

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};
use futures::StreamExt;
use tokio::runtime::Handle;

use crate::backfill::ChangelogStream;
use crate::error::Error;

/// A [`ChangelogStream`] as a blocking [`RecordBatchReader`]: each `next` waits, on the given
/// runtime, for the next changelog batch.
///
/// Read it (or the C stream made from it) from a thread that is not running async code of
/// that runtime: inside async code `next` yields an error instead of blocking the executor.
#[derive(Debug)]
pub struct ChangelogReader {
    stream: ChangelogStream,
    runtime: Handle,
    schema: SchemaRef,
    done: bool,
}

impl ChangelogReader {
    /// A reader of `stream` that drives it on `runtime`: a multi-thread runtime with the time
    /// driver enabled (the backfill's rate limit sleeps, and a current-thread runtime runs its
    /// timers only inside its own `block_on`).
    pub fn new(stream: ChangelogStream, runtime: Handle) -> Self {
        Self {
            schema: stream.schema(),
            stream,
            runtime,
            done: false,
        }
    }

    /// Exports the reader as an Arrow C stream (`struct ArrowArrayStream` of the Arrow C
    /// stream interface), for any consumer of that interface. The stream owns the reader:
    /// releasing it drops the backfill.
    pub fn into_ffi_stream(self) -> FFI_ArrowArrayStream {
        FFI_ArrowArrayStream::new(Box::new(self))
    }
}

impl ChangelogStream {
    /// This stream as a blocking reader driven on `runtime` (see [`ChangelogReader`]).
    pub fn into_reader(self, runtime: Handle) -> ChangelogReader {
        ChangelogReader::new(self, runtime)
    }
}

impl Iterator for ChangelogReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if Handle::try_current().is_ok() {
            // Blocking inside async code would stall (or, in tokio, abort) the runtime.
            self.done = true;
            return Some(Err(Error::Protocol(
                "a ChangelogReader was read from inside a tokio runtime; \
                 read it from a plain thread (for example with spawn_blocking)"
                    .into(),
            )
            .into()));
        }
        let next = self.runtime.block_on(self.stream.next());
        match next {
            None => {
                self.done = true;
                None
            }
            Some(Ok(batch)) => Some(Ok(batch)),
            Some(Err(e)) => {
                self.done = true;
                Some(Err(e.into()))
            }
        }
    }
}

impl RecordBatchReader for ChangelogReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::ffi_stream::ArrowArrayStreamReader;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::backfill::{BackfillConfig, BackfillExecutor};
    use crate::chunk::{Barrier, BarrierKind, EpochPair, Message, StreamChunk};
    use crate::key::KeyColumn;
    use crate::store::{MemoryStore, StateStore, StateTable};
    use crate::table::TableDesc;
    use crate::vnode::VnodeBitmap;

    fn changelog(rows: i64) -> (ChangelogStream, SchemaRef) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let store = MemoryStore::new();
        let desc = store
            .create_table(TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")]).unwrap())
            .unwrap();
        let vnodes = VnodeBitmap::full(desc.vnode_count());
        let mut table = store.table("t", vnodes.clone()).unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("n{i}")),
                )),
            ],
        )
        .unwrap();
        table.write(&StreamChunk::inserts(batch)).unwrap();
        table.seal(1).unwrap();
        store.commit(1).unwrap();
        let barrier = |curr| {
            Ok(Message::Barrier(Barrier::new(
                EpochPair::new(curr, curr - 1),
                BarrierKind::Checkpoint,
            )))
        };
        // One snapshot batch holds every row: the backfill finishes in epoch 2.
        let upstream = futures::stream::iter(vec![barrier(2), barrier(3)]);
        let config = BackfillConfig {
            batch_size: 1024,
            ..BackfillConfig::default()
        };
        let exec = BackfillExecutor::arrangement(&store, "t", vnodes, config).unwrap();
        let stream = exec.execute(upstream).into_changelog();
        let schema = stream.schema();
        (stream, schema)
    }

    #[test]
    fn the_c_stream_yields_every_snapshot_row() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let (stream, schema) = changelog(500);
        let exported = stream
            .into_reader(runtime.handle().clone())
            .into_ffi_stream();
        let reader = ArrowArrayStreamReader::try_new(exported).unwrap();
        assert_eq!(reader.schema(), schema);
        let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 500);
    }

    #[test]
    fn reading_inside_the_runtime_is_an_error_not_a_hang() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let (stream, _) = changelog(3);
        let mut reader = stream.into_reader(runtime.handle().clone());
        let err = runtime.block_on(async { reader.next() });
        assert!(matches!(err, Some(Err(ArrowError::ExternalError(_)))));
        assert!(reader.next().is_none());
    }
}
