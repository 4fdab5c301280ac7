//! The Rust side of the Python package's throughput benchmark (`python/bench/throughput.py`):
//! the job `arrangement_backfill.backfill(...)` runs, through the Rust API, on the same rows.
//!
//! ```text
//!   cargo bench --bench embed -- DIR [--parallelism N] [--order merged|vnode]
//! ```
//!
//! `DIR` holds `snapshot.parquet` (key `id`, Int64) and `changes.parquet` (`_epoch`, `_op`,
//! the table's columns), written by the Python script. Both files are read into memory first
//! (untimed, as the Python side reads them into a pyarrow Table); then, timed: the snapshot
//! loaded into a `MemoryStore` (`load_table`), a `BackfillJob` started over the changes
//! (`Change::Changelog` batches, from a thread of their own as the Python package reads them)
//! with the package's defaults (256 vnodes, batch size 8192, a checkpoint at every barrier,
//! a barrier a second), and its changelog read to the end through the blocking
//! `ChangelogReader`, every batch touched. Prints one line of JSON: seconds, rows out, and the net rows
//! (inserts less deletes: the final table's size, the same whatever the timing).
//!
//! Run without `DIR` (as `cargo bench` does for every bench) it prints its usage and exits.

use std::time::Instant;

use arrangement_backfill::{
    BackfillJob, Change, JobOptions, KeyColumn, MemoryStore, SnapshotOrder, TableDesc, load_table,
};
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use futures::SinkExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// The same allocator as the `backfill` binary and the Python module.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn read(path: &std::path::Path) -> Vec<RecordBatch> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(65536).build())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader.map(|b| b.unwrap()).collect()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(dir) = args.first().map(std::path::PathBuf::from) else {
        eprintln!(
            "usage: cargo bench --bench embed -- DIR [--parallelism N] [--order merged|vnode]"
        );
        return;
    };
    let option =
        |name: &str| (args.iter().position(|a| a == name)).and_then(|i| args.get(i + 1).cloned());
    let parallelism: usize = option("--parallelism").map_or(1, |p| p.parse().unwrap());
    let order = match option("--order").as_deref() {
        None | Some("merged") => SnapshotOrder::Merged,
        Some("vnode") => SnapshotOrder::PerVnode,
        Some(other) => panic!("--order merged|vnode, not {other}"),
    };
    let snapshot = read(&dir.join("snapshot.parquet"));
    let changes = read(&dir.join("changes.parquet"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let started = Instant::now();
    let store = MemoryStore::new();
    let desc =
        TableDesc::new("upstream", snapshot[0].schema(), vec![KeyColumn::asc("id")]).unwrap();
    load_table(
        &store,
        desc,
        snapshot
            .into_iter()
            .map(Ok::<_, arrangement_backfill::Error>),
    )
    .unwrap();
    let (mut tx, rx) = futures::channel::mpsc::channel(2);
    let feeder = std::thread::spawn(move || {
        for batch in changes {
            let item = Ok::<_, arrangement_backfill::Error>(Change::Changelog(batch));
            if futures::executor::block_on(tx.send(item)).is_err() {
                return;
            }
        }
    });
    let options = JobOptions {
        parallelism,
        order,
        batch_size: 8192,
        ..JobOptions::default()
    };
    let job = {
        let _entered = runtime.enter();
        BackfillJob::start(&store, "view", "upstream", options, rx).unwrap()
    };
    let (mut rows, mut net) = (0usize, 0i64);
    for batch in job.into_changelog().into_reader(runtime.handle().clone()) {
        let batch = batch.unwrap();
        rows += batch.num_rows();
        let ops = batch.column(1).as_primitive::<Int8Type>();
        net += ops
            .values()
            .iter()
            .map(|&op| if op == 1 || op == 4 { 1 } else { -1 })
            .sum::<i64>();
    }
    let seconds = started.elapsed().as_secs_f64();
    feeder.join().unwrap();
    println!("{{\"seconds\": {seconds:.4}, \"rows\": {rows}, \"net\": {net}}}");
}
