//! Inputs and drivers for the peers benchmark (`benches/peers.rs`): our k-way merge and
//! snapshot backfill, DataFusion's streaming sort-preserving merge, and a plain copy, all fed
//! the very same per-vnode sorted batches.
//!
//! ```text
//!  table (rows, fixed seed) --load--> MemoryStore --scan each vnode--> per-vnode sorted
//!                                        |                            KeyedBatches (1024 rows)
//!                                        |                              |   |   |
//!                       backfill executor (merged/per vnode)   kway   datafusion   copy
//! ```
//!
//! The inputs come from the store, so they are split and ordered exactly as the backfill sees
//! them: one input per vnode (16 or 256), rows in primary-key order, batches of at most
//! [`BATCH`] rows. Every driver returns the number of rows it produced, and
//! [`tests`](#tests) check that the mergers agree row for row.
//!
//! What each driver measures:
//! - [`datafusion_merge`]: `StreamingMergeBuilder`, the merge `SortPreservingMergeExec` runs,
//!   over one in-memory stream per vnode, output batches of [`BATCH`] rows, on a current-thread
//!   runtime (where the operator's `spawn_buffered` of each input is a pass-through, so this is
//!   what the operator does). It compares native values for a one-column key and encodes
//!   `arrow-row` rows for a composite key, inside the merge.
//! - [`kway_merge`]: our `KWayMerge` over the same batches with their encoded keys, as the store
//!   hands them out (key encoding not measured); [`kway_merge_encoding`] encodes the keys in
//!   the scan, as DataFusion has to.
//! - [`copy`]: `concat_batches` of every input batch into one batch: each byte read and
//!   written once, the memory-bandwidth floor of any merge.
//! - [`backfill`]: the whole snapshot side of a backfill (`BackfillExecutor::arrangement`) over
//!   the loaded store: per-vnode scans, merge or round robin, progress, output chunks.
//!
//! The library items used: the crate-root re-exports above, and `merge::{KWayMerge,
//! SnapshotMerger}` and `store::{KeyedBatch, SnapshotScan}`; no `testing` feature.

use std::sync::Arc;

use arrangement_backfill::merge::{KWayMerge, SnapshotMerger};
use arrangement_backfill::store::{KeyedBatch, SnapshotScan};
use arrangement_backfill::{
    BackfillConfig, BackfillExecutor, Barrier, BarrierKind, EpochPair, KeyColumn, MemoryStore,
    Message, PrimaryKey, Result, SnapshotOrder, StateStore, StateTable, StreamChunk, TableDesc,
    VirtualNode, VnodeBitmap, VnodeCount,
};
use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, SortOptions};
use arrow_select::concat::concat_batches;
use datafusion_execution::memory_pool::{MemoryConsumer, MemoryPool, UnboundedMemoryPool};
use datafusion_physical_expr::expressions::col;
use datafusion_physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion_physical_plan::SendableRecordBatchStream;
use datafusion_physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion_physical_plan::sorts::streaming_merge::StreamingMergeBuilder;
use datafusion_physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rows per input batch and per output batch, for every driver.
pub const BATCH: usize = 1024;

/// The table name in the store.
const TABLE: &str = "t";

/// The shape of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// `(k Int64)`, key `k`: the merge of a bare integer key.
    Int64,
    /// `(s Utf8, k Int64)`, key `(s, k)`: a composite key with a string, 64 distinct strings
    /// of 12 bytes, so the string often ties and the integer decides.
    Utf8Int64,
    /// `(k Int64, s Utf8, v Int64, f Float64)`, key `k`: full rows, the payload moved with the
    /// key (strings of 14 bytes).
    Full4,
}

impl Case {
    /// Every case, in bench order.
    pub const ALL: [Case; 3] = [Case::Int64, Case::Utf8Int64, Case::Full4];

    /// The name in the bench id.
    pub fn name(self) -> &'static str {
        match self {
            Case::Int64 => "int64",
            Case::Utf8Int64 => "utf8+int64",
            Case::Full4 => "full4",
        }
    }

    /// The schema of the rows.
    pub fn schema(self) -> SchemaRef {
        let fields = match self {
            Case::Int64 => vec![Field::new("k", DataType::Int64, false)],
            Case::Utf8Int64 => vec![
                Field::new("s", DataType::Utf8, false),
                Field::new("k", DataType::Int64, false),
            ],
            Case::Full4 => vec![
                Field::new("k", DataType::Int64, false),
                Field::new("s", DataType::Utf8, false),
                Field::new("v", DataType::Int64, false),
                Field::new("f", DataType::Float64, false),
            ],
        };
        Arc::new(Schema::new(fields))
    }

    /// The primary key columns, all ascending.
    pub fn key(self) -> Vec<&'static str> {
        match self {
            Case::Int64 | Case::Full4 => vec!["k"],
            Case::Utf8Int64 => vec!["s", "k"],
        }
    }

    /// `rows` rows with distinct keys in no particular order (fixed seed). Integer keys are
    /// spread over the whole `i64` range: an odd multiplier is a bijection modulo 2^64.
    pub fn rows(self, rows: usize, seed: u64) -> RecordBatch {
        let mut rng = StdRng::seed_from_u64(seed);
        let k = Arc::new(Int64Array::from_iter_values(
            (0..rows as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64),
        ));
        let columns: Vec<arrow_array::ArrayRef> = match self {
            Case::Int64 => vec![k],
            Case::Utf8Int64 => {
                let s: StringArray = (0..rows)
                    .map(|_| Some(format!("group-{:06}", rng.random_range(0..64_u32))))
                    .collect();
                vec![Arc::new(s), k]
            }
            Case::Full4 => {
                let s: StringArray = (0..rows)
                    .map(|_| Some(format!("value-{:08x}", rng.random::<u32>())))
                    .collect();
                let v = Int64Array::from_iter_values((0..rows).map(|_| rng.random::<i64>()));
                let f = Float64Array::from_iter_values((0..rows).map(|_| rng.random::<f64>()));
                vec![k, Arc::new(s), Arc::new(v), Arc::new(f)]
            }
        };
        RecordBatch::try_new(self.schema(), columns).expect("columns match the schema")
    }
}

/// One case loaded into a store, and its per-vnode sorted inputs.
pub struct Inputs {
    /// The rows' shape.
    pub case: Case,
    /// The table definition (its primary key and vnode count).
    pub desc: Arc<TableDesc>,
    /// The store holding the table, committed at epoch 1.
    pub store: MemoryStore,
    /// Per vnode, its rows in key order, in batches of at most [`BATCH`] rows.
    pub per_vnode: Vec<(VirtualNode, Vec<KeyedBatch>)>,
    /// Total rows.
    pub rows: usize,
}

impl Inputs {
    /// Loads `rows` rows of `case` (fixed seed) into a new store with `vnodes` vnodes and
    /// scans each vnode.
    pub fn new(case: Case, vnodes: usize, rows: usize, seed: u64) -> Result<Self> {
        let key = case.key().into_iter().map(KeyColumn::asc).collect();
        let desc =
            TableDesc::new(TABLE, case.schema(), key)?.with_vnode_count(VnodeCount::new(vnodes)?);
        let store = MemoryStore::new();
        let desc = store.create_table(desc)?;
        let owned = VnodeBitmap::full(desc.vnode_count());
        let mut table = store.table(TABLE, owned.clone())?;
        table.write(&StreamChunk::inserts(case.rows(rows, seed)))?;
        table.seal(1)?;
        store.commit(1)?;
        let mut per_vnode = Vec::with_capacity(vnodes);
        for vnode in owned.iter() {
            let mut scan = table.scan(vnode, None, 1, BATCH)?;
            let mut batches = Vec::new();
            while let Some(batch) = scan.next_batch()? {
                batches.push(batch);
            }
            per_vnode.push((vnode, batches));
        }
        Ok(Self {
            case,
            desc,
            store,
            per_vnode,
            rows,
        })
    }

    /// The primary key.
    pub fn pk(&self) -> &PrimaryKey {
        self.desc.pk()
    }

    /// Every input batch, vnode after vnode.
    pub fn batches(&self) -> impl Iterator<Item = &RecordBatch> {
        self.per_vnode
            .iter()
            .flat_map(|(_, batches)| batches.iter().map(|b| &b.batch))
    }
}

/// A scan over batches kept in memory, with their encoded keys.
pub struct Batches(std::vec::IntoIter<KeyedBatch>);

impl SnapshotScan for Batches {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        Ok(self.0.next())
    }
}

/// A scan over batches kept in memory that encodes their keys as it hands them out.
pub struct EncodingBatches {
    pk: PrimaryKey,
    batches: std::vec::IntoIter<RecordBatch>,
}

impl SnapshotScan for EncodingBatches {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        let Some(batch) = self.batches.next() else {
            return Ok(None);
        };
        let keys = self.pk.encode(&batch)?;
        Ok(Some(KeyedBatch { batch, keys }))
    }
}

/// Drains a merger; returns the rows and, if `keep`, the output batches.
fn drain(mut merger: impl SnapshotMerger, keep: &mut Option<Vec<RecordBatch>>) -> Result<usize> {
    let mut rows = 0;
    while let Some(output) = merger.next_output()? {
        rows += output.batch.num_rows();
        match keep {
            Some(kept) => kept.push(output.batch.batch),
            None => drop(std::hint::black_box(output)),
        }
    }
    Ok(rows)
}

/// Our k-way merge over the inputs with their encoded keys (as the store hands them out).
pub fn kway_merge(inputs: &Inputs, keep: &mut Option<Vec<RecordBatch>>) -> Result<usize> {
    let scans = inputs
        .per_vnode
        .iter()
        .map(|(vnode, batches)| (*vnode, Batches(batches.clone().into_iter())))
        .collect();
    drain(KWayMerge::new(inputs.pk(), scans, BATCH)?, keep)
}

/// Our k-way merge over the inputs' rows, encoding each batch's keys in the scan.
pub fn kway_merge_encoding(inputs: &Inputs, keep: &mut Option<Vec<RecordBatch>>) -> Result<usize> {
    let scans = inputs
        .per_vnode
        .iter()
        .map(|(vnode, batches)| {
            let batches: Vec<RecordBatch> = batches.iter().map(|b| b.batch.clone()).collect();
            let scan = EncodingBatches {
                pk: inputs.pk().clone(),
                batches: batches.into_iter(),
            };
            (*vnode, scan)
        })
        .collect();
    drain(KWayMerge::new(inputs.pk(), scans, BATCH)?, keep)
}

/// DataFusion's streaming sort-preserving merge of the inputs, one stream per vnode, on
/// `runtime` (current-thread). Returns the rows and, if `keep`, the output batches.
pub fn datafusion_merge(
    runtime: &tokio::runtime::Runtime,
    inputs: &Inputs,
    keep: &mut Option<Vec<RecordBatch>>,
) -> datafusion_common::Result<usize> {
    let schema = inputs.case.schema();
    let options = SortOptions {
        descending: false,
        nulls_first: false,
    };
    let exprs = inputs
        .case
        .key()
        .into_iter()
        .map(|name| Ok(PhysicalSortExpr::new(col(name, &schema)?, options)))
        .collect::<datafusion_common::Result<Vec<_>>>()?;
    let ordering = LexOrdering::new(exprs).expect("a non-empty key");
    let streams: Vec<SendableRecordBatchStream> = inputs
        .per_vnode
        .iter()
        .map(|(_, batches)| {
            let batches: Vec<_> = batches.iter().map(|b| Ok(b.batch.clone())).collect();
            let stream =
                RecordBatchStreamAdapter::new(schema.clone(), futures::stream::iter(batches));
            Box::pin(stream) as SendableRecordBatchStream
        })
        .collect();
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let metrics = ExecutionPlanMetricsSet::new();
    let mut merged = StreamingMergeBuilder::new()
        .with_streams(streams)
        .with_schema(schema)
        .with_expressions(&ordering)
        .with_metrics(BaselineMetrics::new(&metrics, 0))
        .with_batch_size(BATCH)
        .with_reservation(MemoryConsumer::new("peers merge").register(&pool))
        .build()?;
    runtime.block_on(async move {
        let mut rows = 0;
        while let Some(batch) = merged.next().await {
            let batch = batch?;
            rows += batch.num_rows();
            match keep {
                Some(kept) => kept.push(batch),
                None => drop(std::hint::black_box(batch)),
            }
        }
        Ok(rows)
    })
}

/// A plain copy of every input batch into one batch (each byte read and written once).
pub fn copy(inputs: &Inputs) -> Result<RecordBatch> {
    Ok(concat_batches(&inputs.case.schema(), inputs.batches())?)
}

/// Runs the snapshot side of one backfill over the loaded store, in `order`, until every row
/// came out. `run` names a fresh progress table, so runs do not see each other's progress.
pub fn backfill(
    runtime: &tokio::runtime::Runtime,
    inputs: &Inputs,
    order: SnapshotOrder,
    run: usize,
) -> Result<usize> {
    let config = BackfillConfig {
        batch_size: BATCH,
        order,
        progress_table: Some(format!("{TABLE}.progress.{run}")),
        ..BackfillConfig::default()
    };
    let owned = VnodeBitmap::full(inputs.desc.vnode_count());
    let barrier = Barrier::new(EpochPair::new(2, 1), BarrierKind::Normal);
    let upstream =
        futures::stream::iter([Ok(Message::Barrier(barrier))]).chain(futures::stream::pending());
    let mut out = BackfillExecutor::arrangement(&inputs.store, TABLE, owned, config)?
        .execute(upstream)
        .boxed();
    let rows = inputs.rows;
    runtime.block_on(async move {
        let mut seen = 0;
        while seen < rows {
            match out.next().await {
                Some(Ok(Message::Chunk(chunk))) => seen += std::hint::black_box(chunk).num_rows(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        Ok(seen)
    })
}

/// A current-thread runtime for the async drivers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Differential: DataFusion's merge and ours (both key paths) emit the same rows in the
    /// same order, and the copy holds as many rows, for every case and vnode count.
    #[test]
    fn mergers_agree() {
        let runtime = runtime();
        for case in Case::ALL {
            for vnodes in [16, 256] {
                let inputs = Inputs::new(case, vnodes, 20_000, 7).unwrap();
                let total: usize = inputs.batches().map(|b| b.num_rows()).sum();
                assert_eq!(total, 20_000);
                let schema = case.schema();
                let mut ours = Some(Vec::new());
                assert_eq!(kway_merge(&inputs, &mut ours).unwrap(), 20_000);
                let mut encoding = Some(Vec::new());
                assert_eq!(kway_merge_encoding(&inputs, &mut encoding).unwrap(), 20_000);
                let mut theirs = Some(Vec::new());
                assert_eq!(
                    datafusion_merge(&runtime, &inputs, &mut theirs).unwrap(),
                    20_000
                );
                let ours = concat_batches(&schema, &ours.unwrap()).unwrap();
                let encoding = concat_batches(&schema, &encoding.unwrap()).unwrap();
                let theirs = concat_batches(&schema, &theirs.unwrap()).unwrap();
                assert_eq!(ours, theirs, "{} x{vnodes}", case.name());
                assert_eq!(ours, encoding, "{} x{vnodes}", case.name());
                assert_eq!(copy(&inputs).unwrap().num_rows(), 20_000);
            }
        }
    }

    /// Both backfill orders emit every row of the store.
    #[test]
    fn backfill_emits_every_row() {
        let runtime = runtime();
        let inputs = Inputs::new(Case::Full4, 256, 20_000, 7).unwrap();
        for (run, order) in [SnapshotOrder::Merged, SnapshotOrder::PerVnode]
            .into_iter()
            .enumerate()
        {
            assert_eq!(backfill(&runtime, &inputs, order, run).unwrap(), 20_000);
        }
    }
}
