//! Embeds a backfill and reads its changelog back through the Arrow C stream interface.
//!
//! An upstream table of 20,000 rows keeps changing (updates, deletes, inserts over five
//! epochs) while a backfill of it runs. The backfill's changelog (`_epoch`, `_op`, `id`,
//! `name`) is exported as an `FFI_ArrowArrayStream`, the struct pyarrow, DuckDB and Polars
//! import, and read back here through arrow-rs's consumer of that interface, from its raw
//! pointer as a C program would. The rows read back are checked against what the backfill
//! reports it emitted and against the upstream table: applied in order, they must rebuild it
//! exactly, with no duplicate insert and no delete of a row not held. Any difference exits
//! with status 1.
//!
//! Run with `cargo run --example c_stream`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use arrangement_backfill::{
    BackfillConfig, BackfillExecutor, Barrier, BarrierKind, EpochPair, KeyColumn, MemoryStore,
    Message, Mutation, StateStore, StateTable, StreamChunk, TableDesc, VnodeBitmap,
};
use arrow_array::cast::AsArray;
use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::types::{Int8Type, Int64Type, UInt64Type};
use arrow_array::{Int64Array, RecordBatch, RecordBatchReader, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::SinkExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Rows of the upstream table before the backfill starts.
const ROWS: i64 = 20_000;
/// Epochs 2 to `LAST_CHANGE` carry upstream changes.
const LAST_CHANGE: u64 = 6;

fn main() -> ExitCode {
    match run() {
        Ok(rows) => {
            println!("c_stream: read back {rows} changelog rows through the C stream: all match");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("c_stream: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The changes of `epoch` to `table` (a model of the upstream), in the text form of
/// `StreamChunk::from_text`; `table` is updated.
fn changes(epoch: u64, table: &mut BTreeMap<i64, String>) -> String {
    let base = epoch as i64 * 1000;
    let mut text = String::new();
    for id in base..base + 20 {
        let old = table
            .insert(id, format!("renamed-{epoch}-{id}"))
            .unwrap_or_default();
        text.push_str(&format!("U- {id} {old}\nU+ {id} renamed-{epoch}-{id}\n"));
    }
    for id in base + 500..base + 510 {
        let old = table.remove(&id).unwrap_or_default();
        text.push_str(&format!("- {id} {old}\n"));
    }
    for id in ROWS + base..ROWS + base + 30 {
        table.insert(id, format!("new-{id}"));
        text.push_str(&format!("+ {id} new-{id}\n"));
    }
    text
}

fn run() -> Result<usize, BoxError> {
    // The backfill runs on this runtime; the C stream's consumer (this thread) blocks on it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()?;

    // 1. The upstream table, committed at epoch 1.
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let store = MemoryStore::new();
    let desc = store.create_table(TableDesc::new(
        "users",
        schema.clone(),
        vec![KeyColumn::asc("id")],
    )?)?;
    let vnodes = VnodeBitmap::full(desc.vnode_count());
    let mut upstream = store.table("users", vnodes.clone())?;
    let mut model: BTreeMap<i64, String> = (0..ROWS).map(|i| (i, format!("user-{i}"))).collect();
    let rows = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(model.keys().copied())),
            Arc::new(StringArray::from_iter_values(model.values())),
        ],
    )?;
    upstream.write(&StreamChunk::inserts(rows))?;
    upstream.seal(1)?;
    store.commit(1)?;

    // 2. The backfill, its changelog committed at every checkpoint it passes.
    let (mut tx, rx) = futures::channel::mpsc::channel(4);
    let config = BackfillConfig {
        batch_size: 1000,
        ..BackfillConfig::default()
    };
    let backfill = BackfillExecutor::arrangement(&store, "users", vnodes, config)?;
    let progress = backfill.stats();
    let committer = store.clone();
    let changelog = backfill
        .execute(rx)
        .into_changelog()
        .on_barrier(move |barrier| {
            if barrier.is_checkpoint() && barrier.epoch.prev > 1 {
                committer.commit(barrier.epoch.prev)?;
            }
            Ok(())
        });

    // 3. The upstream keeps changing: a task writes each epoch's changes to the table and
    // sends them to the backfill, then barriers until the backfill finished, then `Stop`.
    let finished = progress.clone();
    let producer = runtime.spawn(async move {
        let mut epoch = 2;
        let mut barrier = Barrier::new(EpochPair::new(2, 1), BarrierKind::Checkpoint);
        loop {
            let stop = finished.borrow().finished && epoch > LAST_CHANGE;
            if stop {
                barrier = barrier.with_mutation(Mutation::Stop);
            }
            tx.send(Ok(Message::Barrier(barrier))).await?;
            if stop {
                return Ok::<_, BoxError>(model);
            }
            if epoch <= LAST_CHANGE {
                let chunk = StreamChunk::from_text(&schema, &changes(epoch, &mut model))?;
                upstream.write(&chunk)?;
                tx.send(Ok(Message::Chunk(chunk))).await?;
            }
            upstream.seal(epoch)?;
            barrier = Barrier::new(EpochPair::new(epoch + 1, epoch), BarrierKind::Checkpoint);
            epoch += 1;
            // Let the backfill read a little snapshot between barriers.
            tokio::task::yield_now().await;
        }
    });

    // 4. Export the changelog as a C stream and import it again from the raw pointer.
    let expected_schema = changelog.schema();
    let mut exported: FFI_ArrowArrayStream = changelog
        .into_reader(runtime.handle().clone())
        .into_ffi_stream();
    // SAFETY: `exported` is a valid, initialized C stream that this function owns; `from_raw`
    // moves it out (leaving a released stream behind) and nothing reads `exported` after.
    #[allow(unsafe_code, reason = "importing a C stream from its raw pointer")]
    let reader = unsafe { ArrowArrayStreamReader::from_raw(&mut exported) }?;
    if reader.schema() != expected_schema {
        return Err(format!(
            "schema through the C stream: {:?}, expected {expected_schema:?}",
            reader.schema()
        )
        .into());
    }

    // 5. Apply what came through to an empty table, checking every change.
    let mut downstream: BTreeMap<i64, String> = BTreeMap::new();
    let mut read = 0;
    let mut last_epoch = 0;
    for batch in reader {
        let batch = batch?;
        read += batch.num_rows();
        let epochs = batch.column(0).as_primitive::<UInt64Type>();
        let ops = batch.column(1).as_primitive::<Int8Type>();
        let ids = batch.column(2).as_primitive::<Int64Type>();
        let names = batch.column(3).as_string::<i32>();
        for row in 0..batch.num_rows() {
            let (epoch, op, id, name) = (
                epochs.value(row),
                ops.value(row),
                ids.value(row),
                names.value(row),
            );
            if epoch < last_epoch {
                return Err(format!("epoch {epoch} after {last_epoch}").into());
            }
            last_epoch = epoch;
            match op {
                1 | 4 => {
                    if downstream.insert(id, name.to_string()).is_some() {
                        return Err(format!("epoch {epoch}: insert of {id}, already held").into());
                    }
                }
                2 | 3 => {
                    if downstream.remove(&id).as_deref() != Some(name) {
                        return Err(
                            format!("epoch {epoch}: delete of {id} {name}, not held").into()
                        );
                    }
                }
                _ => return Err(format!("epoch {epoch}: unknown op {op}").into()),
            }
        }
    }

    // 6. Exactly what the backfill emitted, and exactly the upstream table.
    let upstream_model = runtime.block_on(producer)??;
    let stats = progress.borrow().clone();
    let emitted = stats.snapshot_rows + stats.upstream_rows_emitted;
    if !stats.finished {
        return Err("the backfill did not finish".into());
    }
    if read as u64 != emitted {
        return Err(format!("read {read} rows, the backfill emitted {emitted}").into());
    }
    if downstream != upstream_model {
        return Err(format!(
            "the changelog rebuilds {} rows, the upstream holds {}",
            downstream.len(),
            upstream_model.len()
        )
        .into());
    }
    Ok(read)
}
