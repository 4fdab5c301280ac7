//! The async executor on a tokio runtime: rate limiting and throttling in virtual time,
//! progress reporting, errors, and an upstream that never ends.

use std::sync::Arc;
use std::time::Duration;

use arrangement_backfill::backfill::{BackfillConfig, BackfillExecutor};
use arrangement_backfill::chunk::{
    Barrier, BarrierKind, EpochPair, Message, Mutation, StreamChunk,
};
use arrangement_backfill::key::KeyColumn;
use arrangement_backfill::store::{MemoryStore, StateStore, StateTable};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount};
use arrangement_backfill::{Error, Result};
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use futures::channel::mpsc;
use tokio::sync::Mutex;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// A store with `rows` rows committed at epoch 1 in a table of `vnodes` vnodes.
fn store_with(rows: i64, vnodes: usize) -> MemoryStore {
    let store = MemoryStore::new();
    let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(vnodes).unwrap());
    let desc = store.create_table(desc).unwrap();
    let mut t = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows)),
            Arc::new(Int64Array::from_iter_values(0..rows)),
        ],
    )
    .unwrap();
    t.write(&StreamChunk::inserts(batch)).unwrap();
    t.seal(1).unwrap();
    store.commit(1).unwrap();
    store
}

fn barrier(prev: u64) -> Message {
    Message::Barrier(Barrier::new(
        EpochPair::new(prev + 1, prev),
        BarrierKind::Checkpoint,
    ))
}

fn barrier_with(prev: u64, mutation: Mutation) -> Message {
    Message::Barrier(
        Barrier::new(EpochPair::new(prev + 1, prev), BarrierKind::Checkpoint)
            .with_mutation(mutation),
    )
}

type Sender = mpsc::UnboundedSender<Result<Message>>;

/// Starts an executor on a task; returns the upstream sender and a shared count of rows out.
fn spawn(
    store: &MemoryStore,
    config: BackfillConfig,
) -> (
    Sender,
    Arc<Mutex<u64>>,
    tokio::sync::watch::Receiver<arrangement_backfill::backfill::BackfillStats>,
) {
    let (tx, rx) = mpsc::unbounded();
    let exec = BackfillExecutor::arrangement(
        store,
        "t",
        VnodeBitmap::full(VnodeCount::new(4).unwrap()),
        config,
    )
    .unwrap();
    let stats = exec.stats();
    let rows = Arc::new(Mutex::new(0u64));
    let counter = rows.clone();
    let store = store.clone();
    tokio::spawn(async move {
        let mut out = Box::pin(exec.execute(rx));
        while let Some(message) = out.next().await {
            match message.unwrap() {
                Message::Chunk(c) => *counter.lock().await += c.num_rows() as u64,
                // The first barrier closes the epoch the store has already committed.
                Message::Barrier(b)
                    if b.is_checkpoint()
                        && store.committed_epoch().unwrap() < Some(b.epoch.prev) =>
                {
                    store.commit(b.epoch.prev).unwrap();
                }
                _ => {}
            }
        }
    });
    (tx, rows, stats)
}

#[tokio::test(start_paused = true)]
async fn rate_limit_and_online_throttle_in_virtual_time() {
    let store = store_with(10_000, 4);
    let config = BackfillConfig {
        batch_size: 10,
        rate_limit: Some(100),
        ..BackfillConfig::default()
    };
    let (tx, rows, stats) = spawn(&store, config);
    tx.unbounded_send(Ok(barrier(1))).unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after_10s = *rows.lock().await;
    assert!(
        (900..=1_200).contains(&after_10s),
        "100 rows/s for 10 s gave {after_10s} rows"
    );

    // Throttle to zero: the snapshot side stops.
    tx.unbounded_send(Ok(barrier_with(
        2,
        Mutation::Throttle {
            rows_per_second: Some(0),
        },
    )))
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let paused_at = *rows.lock().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(*rows.lock().await, paused_at, "throttled to zero");

    // Lift the limit: the rest of the snapshot flows at once.
    tx.unbounded_send(Ok(barrier_with(
        3,
        Mutation::Throttle {
            rows_per_second: None,
        },
    )))
    .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    tx.unbounded_send(Ok(barrier(4))).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(*rows.lock().await, 10_000);
    assert!(stats.borrow().finished);
    assert_eq!(stats.borrow().snapshot_rows, 10_000);
}

/// Rates below the barrier frequency hold too: the read every epoch owes (I6) waits for the
/// rate limit's budget (issue 8: 1 and 5 rows/s gave 10 rows/s at 10 barriers a second).
#[tokio::test(start_paused = true)]
async fn low_rate_limits_hold_with_frequent_barriers() {
    for rate in [1u64, 5] {
        let store = store_with(10_000, 4);
        let config = BackfillConfig {
            batch_size: 10,
            rate_limit: Some(rate),
            ..BackfillConfig::default()
        };
        let (tx, rows, _) = spawn(&store, config);
        // Ten barriers a second for ten seconds.
        for prev in 1..=100 {
            tx.unbounded_send(Ok(barrier(prev))).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let got = *rows.lock().await;
        assert!(
            got >= 10 * rate - 2 && got <= 10 * rate + 2,
            "{rate} rows/s for 10 s gave {got} rows"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn pause_stops_the_snapshot_but_not_the_upstream() {
    let store = store_with(1_000, 4);
    let config = BackfillConfig {
        batch_size: 10,
        ..BackfillConfig::default()
    };
    let (tx, rows, stats) = spawn(&store, config);
    tx.unbounded_send(Ok(barrier_with(1, Mutation::Pause)))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*rows.lock().await, 0, "paused from the first barrier");
    assert_eq!(stats.borrow().vnodes.not_started, 4);
    tx.unbounded_send(Ok(barrier_with(2, Mutation::Resume)))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    tx.unbounded_send(Ok(barrier(3))).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(stats.borrow().finished);
    assert_eq!(*rows.lock().await, 1_000);
}

#[tokio::test]
async fn errors_end_the_stream_with_a_message() {
    let store = store_with(10, 4);
    // The first message must be a barrier.
    let exec = BackfillExecutor::arrangement(
        &store,
        "t",
        VnodeBitmap::full(VnodeCount::new(4).unwrap()),
        BackfillConfig::default(),
    )
    .unwrap();
    let chunk = StreamChunk::from_text(&schema(), "+ 1 1").unwrap();
    let upstream = futures::stream::iter(vec![Ok(Message::Chunk(chunk))]);
    let out: Vec<_> = exec.execute(upstream).collect().await;
    assert!(matches!(&out[..], [Err(Error::Protocol(m))] if m.contains("barrier")));

    // An upstream error is passed on and ends the stream.
    let exec = BackfillExecutor::arrangement(
        &store,
        "t",
        VnodeBitmap::full(VnodeCount::new(4).unwrap()),
        BackfillConfig {
            progress_table: Some("other".into()),
            ..BackfillConfig::default()
        },
    )
    .unwrap();
    let upstream = futures::stream::iter(vec![
        Ok(barrier(1)),
        Err(Error::Internal("upstream broke".into())),
        Ok(barrier(2)),
    ]);
    let out: Vec<_> = exec.execute(upstream).collect().await;
    assert!(matches!(out.last(), Some(Err(Error::Internal(m))) if m == "upstream broke"));
}

#[tokio::test]
async fn rows_of_vnodes_it_does_not_own_are_an_error() {
    let store = store_with(0, 4);
    let count = VnodeCount::new(4).unwrap();
    let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(count);
    let chunk = StreamChunk::from_text(&schema(), "+ 1 1").unwrap();
    let vnode = desc.vnodes_of(chunk.batch()).unwrap()[0];
    let owned = VnodeBitmap::from_vnodes(count, count.vnodes().filter(|v| *v != vnode)).unwrap();
    let exec =
        BackfillExecutor::arrangement(&store, "t", owned, BackfillConfig::default()).unwrap();
    let upstream = futures::stream::iter(vec![
        Ok(barrier(1)),
        Ok(Message::Chunk(chunk)),
        Ok(barrier(2)),
    ]);
    let out: Vec<_> = exec.execute(upstream).collect().await;
    assert!(
        matches!(out.last(), Some(Err(Error::VnodeNotOwned { vnode: v, .. })) if *v == vnode.get()),
        "{out:?}"
    );
}

#[tokio::test]
async fn zero_batch_size_is_rejected() {
    let store = store_with(0, 4);
    let config = BackfillConfig {
        batch_size: 0,
        ..BackfillConfig::default()
    };
    assert!(matches!(
        BackfillExecutor::arrangement(
            &store,
            "t",
            VnodeBitmap::full(VnodeCount::new(4).unwrap()),
            config
        ),
        Err(Error::InvalidConfig(_))
    ));
}

/// Issue 42: a first barrier that does not close the store's committed epoch (ahead of it, or
/// behind it) is refused, saying which epoch it must close.
#[tokio::test]
async fn the_first_barrier_must_close_the_committed_epoch() {
    for prev in [0, 2, 5] {
        let store = store_with(10, 4);
        let vnodes = VnodeBitmap::full(VnodeCount::new(4).unwrap());
        let exec =
            BackfillExecutor::arrangement(&store, "t", vnodes, BackfillConfig::default()).unwrap();
        let upstream = futures::stream::iter(vec![Ok(barrier(prev))]);
        let out: Vec<Result<Message>> = exec.execute(upstream).collect().await;
        let err = out
            .into_iter()
            .find_map(|m| m.err())
            .unwrap_or_else(|| panic!("prev {prev} accepted"));
        assert!(matches!(err, Error::Protocol(_)), "{err}");
        assert!(
            err.to_string()
                .contains("the first barrier must close epoch 1, the store's committed epoch"),
            "{err}"
        );
    }
}
