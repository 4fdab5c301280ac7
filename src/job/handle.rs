//! A backfill job for embedders: one call wires an upstream source, the store and a backfill,
//! and commits checkpoints as the embedder collects them.
//!
//! ```text
//!   source of Messages ──▶ materialize ──▶ BackfillExecutor ──▶ commit ──▶ BackfillJob
//!   (the upstream's        (write chunks   (buffer, filter,     (store.commit(prev) at     (a Stream of
//!    changes, barriers)     to the table,   k-way merge)         each checkpoint barrier    Messages, with
//!                           seal at each                         the embedder pulls)        schema())
//!                           barrier)
//! ```
//!
//! The protocol it follows is the one every embedder would otherwise write by hand:
//! - a chunk from the source is written to the upstream table, then passed to the backfill;
//! - a barrier seals the upstream table at its `prev` epoch (once above the committed
//!   epoch), then passes;
//! - a checkpoint barrier that leaves the backfill commits the store at its `prev` epoch, so
//!   the upstream data, the backfill's progress and everything the embedder collected up to
//!   that barrier become durable together (I5). A barrier is committed only once the
//!   embedder pulled it: output dropped unread is never committed.
//!
//! The job owns the upstream table's writes: the source is the upstream's change stream, not
//! yet applied to the table. (Whoever already materializes the upstream elsewhere drives a
//! [`BackfillExecutor`] directly and commits as [`BackfillJob`] does.)

use std::pin::Pin;
use std::task::{Context, Poll};

use arrow_schema::SchemaRef;
use futures::{Stream, StreamExt};
use tokio::sync::watch;

use crate::backfill::{
    BackfillConfig, BackfillExecutor, BackfillStats, BackfillStream, ChangelogStream,
};
use crate::chunk::Message;
use crate::error::Result;
use crate::store::{StateStore, StateTable};
use crate::vnode::VnodeBitmap;

/// A running backfill of one upstream table, fed by the upstream's change stream, committing
/// the store at every checkpoint barrier it hands out. See the [crate example](crate).
///
/// It is a [`Stream`] of the backfill's output [`Message`]s; [`BackfillJob::into_changelog`]
/// turns it into changelog batches (and from there into an Arrow C stream).
///
/// # Cancel safety
/// `StreamExt::next` is cancel safe: a dropped `next` future loses no message, and a
/// checkpoint is committed only as its barrier is handed out.
pub struct BackfillJob {
    output: BackfillStream,
    progress: watch::Receiver<BackfillStats>,
}

impl BackfillJob {
    /// Starts a backfill of `table` (a table of `store` holding the upstream's committed
    /// rows) over `vnodes`, fed by `source`: the upstream's changes and barriers, starting
    /// with a barrier whose `prev` is the store's committed epoch.
    ///
    /// Nothing runs until the job is polled; the job ends when the source ends, after a
    /// `Stop` barrier, or after the first error (which it yields).
    pub fn start<S, U>(
        store: &S,
        table: &str,
        vnodes: VnodeBitmap,
        config: BackfillConfig,
        source: U,
    ) -> Result<Self>
    where
        S: StateStore,
        U: Stream<Item = Result<Message>> + Send + Unpin + 'static,
    {
        let mut upstream = store.table(table, vnodes.clone())?;
        let backfill = BackfillExecutor::arrangement(store, table, vnodes, config)?;
        let progress = backfill.stats();
        let mut sealed = store.committed_epoch()?;
        let materialized = source.map(move |message| {
            match &message {
                Ok(Message::Chunk(chunk)) => upstream.write(chunk)?,
                Ok(Message::Barrier(barrier)) => {
                    let prev = barrier.epoch.prev;
                    if sealed.is_none_or(|s| prev > s) {
                        upstream.seal(prev)?;
                        sealed = Some(prev);
                    }
                }
                Ok(Message::Watermark(_)) | Err(_) => {}
            }
            message
        });
        let output = backfill.execute(materialized);
        let schema = output.schema();
        let committer = store.clone();
        let mut committed = store.committed_epoch()?;
        let committing = output.map(move |message| {
            if let Ok(Message::Barrier(barrier)) = &message {
                let prev = barrier.epoch.prev;
                if barrier.is_checkpoint() && committed.is_none_or(|c| prev > c) {
                    committer.commit(prev)?;
                    committed = Some(prev);
                }
            }
            message
        });
        Ok(Self {
            output: BackfillStream::new(schema, Box::pin(committing)),
            progress,
        })
    }

    /// The schema of the output chunks: the upstream table's.
    pub fn schema(&self) -> SchemaRef {
        self.output.schema()
    }

    /// A live view of the backfill's counters.
    pub fn stats(&self) -> watch::Receiver<BackfillStats> {
        self.progress.clone()
    }

    /// The output as a named stream of messages.
    pub fn into_stream(self) -> BackfillStream {
        self.output
    }

    /// The output as changelog batches (`_epoch`, `_op`, then the table's columns); the
    /// store is still committed at every checkpoint barrier the changelog passes.
    pub fn into_changelog(self) -> ChangelogStream {
        self.output.into_changelog()
    }
}

impl std::fmt::Debug for BackfillJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackfillJob")
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl Stream for BackfillJob {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.output).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::chunk::{Barrier, BarrierKind, EpochPair, Mutation, Op, StreamChunk};
    use crate::key::KeyColumn;
    use crate::store::MemoryStore;
    use crate::table::TableDesc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    fn store_with(rows: i64) -> (MemoryStore, VnodeBitmap) {
        let store = MemoryStore::new();
        let desc = store
            .create_table(TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap())
            .unwrap();
        let vnodes = VnodeBitmap::full(desc.vnode_count());
        let mut table = store.table("t", vnodes.clone()).unwrap();
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(Int64Array::from_iter_values(0..rows)),
            ],
        )
        .unwrap();
        table.write(&StreamChunk::inserts(batch)).unwrap();
        table.seal(1).unwrap();
        store.commit(1).unwrap();
        (store, vnodes)
    }

    fn barrier(curr: u64, kind: BarrierKind) -> Barrier {
        Barrier::new(EpochPair::new(curr, curr - 1), kind)
    }

    #[tokio::test]
    async fn the_job_materializes_the_source_and_commits_collected_checkpoints() {
        let (store, vnodes) = store_with(100);
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let config = BackfillConfig {
            batch_size: 16,
            ..BackfillConfig::default()
        };
        let mut job = BackfillJob::start(&store, "t", vnodes, config, rx).unwrap();
        assert_eq!(job.schema(), schema());
        let send = |m| tx.unbounded_send(Ok(m)).unwrap();
        send(Message::Barrier(barrier(2, BarrierKind::Checkpoint)));
        send(Message::Chunk(
            StreamChunk::from_text(&schema(), "U- 5 5\nU+ 5 50\n+ 1000 1").unwrap(),
        ));
        send(Message::Barrier(barrier(3, BarrierKind::Normal)));
        let mut epoch = 3;
        let mut inserted = 0;
        let mut finished_at = None;
        let mut last_checkpoint = None;
        while let Some(message) = job.next().await {
            match message.unwrap() {
                Message::Chunk(chunk) => {
                    inserted += chunk.ops().iter().filter(|op| **op == Op::Insert).count();
                }
                Message::Barrier(b) => {
                    // Commits follow the checkpoints the job handed out, not the normal ones.
                    let committed = store.committed_epoch().unwrap();
                    if b.is_checkpoint() {
                        assert_eq!(committed, Some(b.epoch.prev.max(1)));
                        last_checkpoint = committed;
                    }
                    if b.mutation == Some(Mutation::Stop) {
                        break;
                    }
                    if job.stats().borrow().finished && finished_at.is_none() {
                        finished_at = Some(epoch + 1);
                    }
                    epoch += 1;
                    let mut next = barrier(epoch, BarrierKind::Checkpoint);
                    if finished_at.is_some_and(|f| epoch > f) {
                        next = next.with_mutation(Mutation::Stop);
                    }
                    send(Message::Barrier(next));
                }
                Message::Watermark(_) => {}
            }
        }
        assert_eq!(inserted, 101, "every row once, plus the newcomer");
        assert!(finished_at.is_some());
        assert_eq!(store.committed_epoch().unwrap(), last_checkpoint);
        assert!(
            last_checkpoint.is_some_and(|c| c + 2 >= epoch),
            "{last_checkpoint:?} {epoch}"
        );
        // The job wrote the source's changes to the upstream table and committed them.
        let table = store
            .table("t", VnodeBitmap::full(crate::vnode::VnodeCount::DEFAULT))
            .unwrap();
        let mut rows = 0;
        for vnode in table.vnodes().iter() {
            let at = last_checkpoint.unwrap();
            let mut scan = table.scan(vnode, None, at, 1024).unwrap();
            while let Some(batch) = crate::store::SnapshotScan::next_batch(&mut scan).unwrap() {
                rows += batch.num_rows();
            }
        }
        assert_eq!(rows, 101);
    }

    #[tokio::test]
    async fn a_failing_write_ends_the_job_with_its_error() {
        let (store, vnodes) = store_with(3);
        let other = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let source = futures::stream::iter(vec![
            Ok(Message::Barrier(barrier(2, BarrierKind::Checkpoint))),
            Ok(Message::Chunk(
                StreamChunk::from_text(&other, "+ 1").unwrap(),
            )),
        ]);
        let job =
            BackfillJob::start(&store, "t", vnodes, BackfillConfig::default(), source).unwrap();
        let out: Vec<_> = job.collect().await;
        let last = out.last().expect("output");
        assert!(
            matches!(last, Err(crate::Error::SchemaMismatch { .. })),
            "{last:?}"
        );
    }
}
