//! The backfill's output as named streams: of [`Message`]s, and of changelog `RecordBatch`es.
//!
//! ```text
//!   BackfillExecutor::execute ──▶ BackfillStream ──into_changelog──▶ ChangelogStream
//!                                 (chunks, barriers,                  (`_epoch`, `_op`, columns:
//!                                  watermarks; schema())               the replay's file layout)
//! ```
//!
//! [`BackfillStream`] yields what the backfill emits, in order. [`ChangelogStream`] turns its
//! chunks into the changelog layout the replay writes to Parquet (`_epoch` UInt64, the epoch
//! the change belongs to; `_op` Int8, codes 1 to 4; then the table's columns), drops barriers
//! and watermarks (after handing each barrier to an optional hook, where an embedder commits
//! its checkpoints), and never yields an empty batch. Both know their schema before the first
//! item, as DataFusion's `RecordBatchStream` does.
//!
//! # Cancel safety
//! `StreamExt::next` on either stream is cancel safe: the work in progress lives in the
//! stream, not in the `next` future, so dropping that future (a `select!` taking another
//! branch) loses no message.

use std::pin::Pin;
use std::task::{Context, Poll};

use arrow_array::{ArrayRef, Int8Array, RecordBatch, UInt64Array};
use arrow_schema::SchemaRef;
use futures::Stream;

use crate::chunk::{Barrier, Message, StreamChunk, changelog_schema};
use crate::error::{Error, Result};

/// The boxed stream behind the named ones.
type Inner = Pin<Box<dyn Stream<Item = Result<Message>> + Send>>;

/// The downstream of a backfill (returned by
/// [`BackfillExecutor::execute`](crate::BackfillExecutor::execute)): chunks of the upstream
/// table's schema, barriers and watermarks.
///
/// It ends after a `Stop` barrier, when the upstream ends, or after the first error (which it
/// yields). Dropping it stops the backfill; nothing is committed that was not collected.
pub struct BackfillStream {
    schema: SchemaRef,
    inner: Inner,
}

impl BackfillStream {
    pub(crate) fn new(schema: SchemaRef, inner: Inner) -> Self {
        Self { schema, inner }
    }

    /// The schema of every chunk: the upstream table's.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The same output as changelog batches (see [`ChangelogStream`]).
    pub fn into_changelog(self) -> ChangelogStream {
        ChangelogStream::new(self)
    }
}

impl std::fmt::Debug for BackfillStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackfillStream")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Stream for BackfillStream {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Called with every barrier a [`ChangelogStream`] passes (to commit checkpoints, count
/// epochs, ...). An error ends the stream with that error.
pub type BarrierHook = Box<dyn FnMut(&Barrier) -> Result<()> + Send>;

/// A backfill's output as changelog `RecordBatch`es: `_epoch` (UInt64), `_op` (Int8), then the
/// table's columns, the layout of the replay's Parquet files
/// ([`StreamChunk::to_changelog`]). Each row's `_epoch` is the epoch its change belongs to
/// (the `curr` of the barrier before it).
///
/// ```
/// # use std::sync::Arc;
/// # use arrangement_backfill::*;
/// # use arrow_array::{Int64Array, RecordBatch};
/// # use arrow_schema::{DataType, Field, Schema};
/// # use futures::StreamExt;
/// # fn main() -> Result<()> {
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
/// let store = MemoryStore::new();
/// let desc = store.create_table(TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("id")])?)?;
/// let vnodes = VnodeBitmap::full(desc.vnode_count());
/// let mut table = store.table("t", vnodes.clone())?;
/// let rows = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2, 3]))])?;
/// table.write(&StreamChunk::inserts(rows))?;
/// table.seal(1)?;
/// store.commit(1)?;
///
/// let upstream = futures::stream::iter([
///     Ok(Message::Barrier(Barrier::new(EpochPair::new(2, 1), BarrierKind::Checkpoint))),
///     Ok(Message::Barrier(Barrier::new(EpochPair::new(3, 2), BarrierKind::Checkpoint))),
/// ]);
/// let backfill = BackfillExecutor::arrangement(&store, "t", vnodes, BackfillConfig::default())?;
/// let mut changelog = backfill.execute(upstream).into_changelog();
/// assert_eq!(changelog.schema().field(1).name(), "_op");
/// let batch = changelog.next().await.expect("a batch")?;
/// assert_eq!(batch.num_rows(), 3); // inserts of 1, 2 and 3, in epoch 2
/// assert!(changelog.next().await.is_none());
/// # Ok(())
/// # })
/// # }
/// ```
pub struct ChangelogStream {
    schema: SchemaRef,
    input: BackfillStream,
    epoch: u64,
    on_barrier: Option<BarrierHook>,
    done: bool,
}

impl ChangelogStream {
    fn new(input: BackfillStream) -> Self {
        Self {
            schema: changelog_schema(&input.schema, true),
            input,
            epoch: 0,
            on_barrier: None,
            done: false,
        }
    }

    /// Calls `hook` with every barrier before the batches of the epoch it opens, for
    /// example to commit the store at checkpoint barriers.
    pub fn on_barrier(mut self, hook: impl FnMut(&Barrier) -> Result<()> + Send + 'static) -> Self {
        self.on_barrier = Some(Box::new(hook));
        self
    }

    /// The schema of every batch: `_epoch`, `_op`, then the table's columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The changelog batch of `chunk`, in epoch `self.epoch`, with this stream's schema.
    fn batch(&self, chunk: &StreamChunk) -> Result<RecordBatch> {
        let rows = chunk.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        columns.push(std::sync::Arc::new(UInt64Array::from(vec![
            self.epoch;
            rows
        ])));
        columns.push(std::sync::Arc::new(Int8Array::from_iter_values(
            chunk.ops().iter().map(|op| op.code()),
        )));
        columns.extend(chunk.batch().columns().iter().cloned());
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| Error::SchemaMismatch {
            context: "a backfill's changelog".into(),
            expected: self.schema.to_string(),
            found: format!("{} ({e})", chunk.schema()),
        })
    }
}

impl std::fmt::Debug for ChangelogStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangelogStream")
            .field("schema", &self.schema)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Stream for ChangelogStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let message = match Pin::new(&mut this.input).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(message))) => message,
            };
            let out = match message {
                Message::Chunk(chunk) if chunk.is_empty() => continue,
                Message::Chunk(chunk) => this.batch(&chunk),
                Message::Watermark(_) => continue,
                Message::Barrier(barrier) => {
                    this.epoch = barrier.epoch.curr;
                    match this.on_barrier.as_mut().map(|hook| hook(&barrier)) {
                        None | Some(Ok(())) => continue,
                        Some(Err(e)) => Err(e),
                    }
                }
            };
            if out.is_err() {
                this.done = true;
            }
            return Poll::Ready(Some(out));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int8Type, UInt64Type};
    use arrow_schema::{DataType, Field, Schema};
    use futures::StreamExt;

    use super::*;
    use crate::chunk::{BarrierKind, EpochPair};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    fn barrier(curr: u64) -> Message {
        Message::Barrier(Barrier::new(
            EpochPair::new(curr, curr - 1),
            BarrierKind::Checkpoint,
        ))
    }

    fn stream(messages: Vec<Result<Message>>) -> BackfillStream {
        BackfillStream::new(schema(), Box::pin(futures::stream::iter(messages)))
    }

    fn chunk(text: &str) -> Message {
        Message::Chunk(StreamChunk::from_text(&schema(), text).unwrap())
    }

    #[test]
    fn changelog_batches_carry_epoch_and_op_and_skip_the_rest() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook_seen = seen.clone();
        let input = stream(vec![
            Ok(barrier(2)),
            Ok(chunk("+ 1 a\n+ 2 b")),
            Ok(Message::Chunk(StreamChunk::empty(schema()))),
            Ok(barrier(3)),
            Ok(chunk("U- 1 a\nU+ 1 c\n- 2 b")),
        ]);
        assert_eq!(input.schema(), schema());
        let changelog = input.into_changelog().on_barrier(move |b| {
            hook_seen.lock().unwrap().push(b.epoch.curr);
            Ok(())
        });
        let expected_schema = changelog_schema(&schema(), true);
        assert_eq!(changelog.schema(), expected_schema);
        let batches: Vec<RecordBatch> = futures::executor::block_on(changelog.collect::<Vec<_>>())
            .into_iter()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(batches.len(), 2);
        let epochs: Vec<u64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(epochs, vec![2, 2, 3, 3, 3]);
        let ops: Vec<i8> = batches
            .iter()
            .flat_map(|b| b.column(1).as_primitive::<Int8Type>().values().to_vec())
            .collect();
        assert_eq!(ops, vec![1, 1, 3, 4, 2]);
        assert!(batches.iter().all(|b| b.schema() == expected_schema));
        // The same batches the replay's sink writes.
        let (chunk, _) = StreamChunk::from_changelog(&batches[1]).unwrap();
        assert_eq!(chunk.to_text().unwrap(), "U- 1 a\nU+ 1 c\n- 2 b\n");
        assert_eq!(*seen.lock().unwrap(), vec![2, 3]);
    }

    #[test]
    fn errors_end_the_changelog() {
        let input = stream(vec![
            Ok(barrier(2)),
            Err(Error::Protocol("boom".into())),
            Ok(chunk("+ 1 a")),
        ]);
        let out = futures::executor::block_on(input.into_changelog().collect::<Vec<_>>());
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0], Err(Error::Protocol(_))));

        let input = stream(vec![Ok(barrier(2)), Ok(chunk("+ 1 a"))]);
        let failing = input
            .into_changelog()
            .on_barrier(|_| Err(Error::InvalidConfig("no".into())));
        let out = futures::executor::block_on(failing.collect::<Vec<_>>());
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0], Err(Error::InvalidConfig(_))));
    }
}
