//! The embedder's path end to end, on the durable store: a `BackfillJob` fed by a changing
//! upstream, its output read as changelog batches, checked against a `BTreeMap` oracle, and
//! the checkpoints it committed found again after the store is reopened.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrangement_backfill::{
    BackfillConfig, BackfillJob, Barrier, BarrierKind, DurableStore, EpochPair, KeyColumn, Message,
    Mutation, StateStore, StateTable, StreamChunk, TableDesc, VnodeBitmap,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, Int64Type, UInt64Type};
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::{SinkExt, StreamExt};

const ROWS: i64 = 3_000;
const LAST_CHANGE: u64 = 5;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// Epoch `epoch`'s changes (updates, deletes, inserts on disjoint keys), applied to `model`.
fn changes(epoch: u64, model: &mut BTreeMap<i64, i64>) -> String {
    let base = epoch as i64 * 100;
    let mut text = String::new();
    for k in base..base + 10 {
        let old = model.insert(k, -k).expect("an existing key");
        text.push_str(&format!("U- {k} {old}\nU+ {k} {}\n", -k));
    }
    for k in base + 50..base + 55 {
        let old = model.remove(&k).expect("an existing key");
        text.push_str(&format!("- {k} {old}\n"));
    }
    for k in ROWS + base..ROWS + base + 7 {
        model.insert(k, k);
        text.push_str(&format!("+ {k} {k}\n"));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_the_durable_store_emits_the_table_once_and_commits_its_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = DurableStore::open(dir.path()).unwrap();
    let desc = store
        .create_table(TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap())
        .unwrap();
    let vnodes = VnodeBitmap::full(desc.vnode_count());
    let mut model: BTreeMap<i64, i64> = (0..ROWS).map(|k| (k, k)).collect();
    let mut loader = store.table("t", vnodes.clone()).unwrap();
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(model.keys().copied())),
            Arc::new(Int64Array::from_iter_values(model.values().copied())),
        ],
    )
    .unwrap();
    loader.write(&StreamChunk::inserts(batch)).unwrap();
    loader.seal(1).unwrap();
    store.commit(1).unwrap();
    drop(loader);

    let (mut tx, rx) = futures::channel::mpsc::channel(2);
    let config = BackfillConfig {
        batch_size: 256,
        ..BackfillConfig::default()
    };
    let job = BackfillJob::start(&store, "t", vnodes, config, rx).unwrap();
    let stats = job.stats();
    let mut changelog = job.into_changelog();

    // The upstream: changes for a few epochs, then barriers until the backfill finished.
    let finished = stats.clone();
    let producer = tokio::spawn(async move {
        let mut barrier = Barrier::new(EpochPair::new(2, 1), BarrierKind::Checkpoint);
        let mut epoch = 2;
        loop {
            let stop = finished.borrow().finished && epoch > LAST_CHANGE;
            if stop {
                barrier = barrier.with_mutation(Mutation::Stop);
            }
            tx.send(Ok(Message::Barrier(barrier))).await.unwrap();
            if stop {
                return model;
            }
            if epoch <= LAST_CHANGE {
                let text = changes(epoch, &mut model);
                let chunk = StreamChunk::from_text(&schema(), &text).unwrap();
                tx.send(Ok(Message::Chunk(chunk))).await.unwrap();
            }
            // Every other barrier is a checkpoint.
            let kind = if epoch % 2 == 0 {
                BarrierKind::Normal
            } else {
                BarrierKind::Checkpoint
            };
            barrier = Barrier::new(EpochPair::new(epoch + 1, epoch), kind);
            epoch += 1;
            tokio::task::yield_now().await;
        }
    });

    let mut downstream: BTreeMap<i64, i64> = BTreeMap::new();
    let mut last_epoch = 0;
    while let Some(batch) = changelog.next().await {
        let batch = batch.unwrap();
        let epochs = batch.column(0).as_primitive::<UInt64Type>();
        let ops = batch.column(1).as_primitive::<Int8Type>();
        let ks = batch.column(2).as_primitive::<Int64Type>();
        let vs = batch.column(3).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            assert!(epochs.value(row) >= last_epoch);
            last_epoch = epochs.value(row);
            let (k, v) = (ks.value(row), vs.value(row));
            match ops.value(row) {
                1 | 4 => assert_eq!(downstream.insert(k, v), None, "insert of held {k}"),
                2 | 3 => assert_eq!(downstream.remove(&k), Some(v), "delete of {k} {v}"),
                op => panic!("op {op}"),
            }
        }
    }
    let upstream = producer.await.unwrap();
    assert!(stats.borrow().finished);
    assert_eq!(downstream, upstream);

    // The job committed the checkpoints it handed out; the upstream rows it wrote are durable.
    let committed = store.committed_epoch().unwrap().expect("a committed epoch");
    assert!(committed > LAST_CHANGE, "committed {committed}");
    drop(changelog);
    drop(store);
    let reopened = DurableStore::open(dir.path()).unwrap();
    assert_eq!(reopened.committed_epoch().unwrap(), Some(committed));
    let table = reopened
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    let mut rows = 0;
    for vnode in table.vnodes().iter() {
        let mut scan = table.scan(vnode, None, committed, 1024).unwrap();
        while let Some(batch) =
            arrangement_backfill::store::SnapshotScan::next_batch(&mut scan).unwrap()
        {
            rows += batch.num_rows();
        }
    }
    assert_eq!(rows, upstream.len());
}
