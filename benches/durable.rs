//! The durable store against the in-memory store, measured in the same run (issue 7, part 5).
//!
//! `durable_scan/1v_1M`: one vnode of 1M rows `(k Int64 key, v Int64, s Utf8)`, fixed seed,
//! written in one epoch, committed and compacted (`DurableStore::compact`) into one base run on
//! disk, scanned in batches of 1024 through [`StateTable::scan`]; the same rows committed in a
//! [`MemoryStore`]. Both sides touch every value they return: the sum of `k` and `v` and of the
//! string lengths of `s`, batch by batch. The run file lives in a `tempfile` directory and is
//! read through the page cache, which is warm after the first iteration.
//! `durable_store_views` scans the same rows with `s` as `Utf8View` (a replay's strings), on
//! disk and uncached like `durable_store`.
//!
//! `durable_resume/256v_1M`: a store directory holding a 256-vnode upstream table of 1M rows
//! and its backfill progress table with an InProgress row for each of the 256 vnodes (both
//! committed and compacted). `durable_open_restore` opens the directory, opens the handles a
//! `BackfillExecutor` opens (the replicated upstream, the progress table) and restores the
//! 256 vnodes' progress with [`ProgressCodec::restore`]; `durable_restore` is the restore alone
//! on an open store; `memory_restore` is the same restore on a `MemoryStore`.
//! `durable_open_restore_50deltas` opens a second directory where 50 more epochs (20k upstream
//! changes and all 256 progress rows each) were committed and never compacted (manual
//! compaction, also when reopening): 100 more files to check on open, 51 runs per vnode to
//! merge on restore. Closing the store (joining its compactor thread) is not timed.
//!
//! `durable_commit/256v_{1M,4M}_20k` (not a criterion measurement: it prints percentiles): a
//! 256-vnode table of 1M (4M) rows, loaded in one epoch and compacted, then
//! [`COMMIT_EPOCHS`] epochs back to back, each writing 20k changelog rows (5k inserts of new
//! keys, 5k deletes and 5k update pairs of live keys, spread over the 256 vnodes), `seal`,
//! `commit`, with background compaction on (the default options). Each commit's wall time is
//! recorded; p50, p99 and max are printed, with the same loop with compaction off
//! (`durable_store_no_compaction`: manual compaction, called only once after the load) and on
//! a `MemoryStore` (whose commit folds the deltas into its base). The changes are generated
//! before the loop; the live file count after each commit shows whether compaction keeps up.
//!
//! `durable_load/256v_1M/{key_order,shuffled}`: a bulk load of 1M rows (`Utf8View` strings,
//! as a replay reads them from Parquet) into a new 256-vnode table, written in one epoch
//! (chunks of 256k rows), sealed and committed, on a new store each time (its directory made
//! and removed outside the timing): the load's reorder into vnode-then-key order, its spills
//! and its commit. `key_order` writes the rows in key order (a table exported from an
//! arrangement), `shuffled` in the spread order of `key_of`.
//!
//! Run with `cargo bench --bench durable [-- FILTER]`; FILTER selects by substring (for the
//! commit-latency runs) and by criterion's rules (for the rest). In `--test` mode the commit
//! loop runs once on a small table.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrangement_backfill::backfill::{ProgressCodec, ProgressMap};
use arrangement_backfill::chunk::{Op, StreamChunk};
use arrangement_backfill::key::{KeyColumn, Position};
use arrangement_backfill::store::io::RealIo;
use arrangement_backfill::store::{
    Compaction, DurableOptions, DurableStore, MemoryStore, SnapshotScan, StateStore, StateTable,
};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VirtualNode, VnodeBitmap, VnodeCount};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::{Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SEED: u64 = 0xD0AB_1E5C_0000_0007;
const SCAN_ROWS: usize = 1_000_000;
const SCAN_BATCH: usize = 1024;
const RESUME_ROWS: usize = 1_000_000;
/// Uncompacted epochs in the second resume directory.
const RESUME_DELTAS: usize = 50;
/// Changelog rows per epoch in the commit-latency runs.
const EPOCH_CHANGES: usize = 20_000;
/// Epochs per commit-latency run.
const COMMIT_EPOCHS: usize = 100;
const PROGRESS_TABLE: &str = "t.backfill_progress";

fn schema() -> SchemaRef {
    schema_with(&DataType::Utf8)
}

/// The table's schema with `s` of type `strings` (`Utf8`, or `Utf8View` as a replay's).
fn schema_with(strings: &DataType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new("s", strings.clone(), false),
    ]))
}

fn desc(vnodes: usize) -> TableDesc {
    desc_with(&DataType::Utf8, vnodes)
}

fn desc_with(strings: &DataType, vnodes: usize) -> TableDesc {
    TableDesc::new("t", schema_with(strings), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(vnodes).unwrap())
}

/// The key of row id `id`: ids map to keys spread over the whole `i64` range (an odd
/// multiplier is a bijection modulo 2^64), so inserts land everywhere.
fn key_of(id: u64) -> i64 {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64
}

/// Rows with the given ids and random values.
fn rows(ids: impl Iterator<Item = u64>, rng: &mut StdRng) -> RecordBatch {
    let keys: Vec<i64> = ids.map(key_of).collect();
    let values: Vec<i64> = keys.iter().map(|_| rng.random()).collect();
    let strings: Vec<String> = keys
        .iter()
        .map(|_| format!("value-{:08x}", rng.random::<u32>()))
        .collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(values)),
            Arc::new(StringArray::from(strings)),
        ],
    )
    .unwrap()
}

/// Loads rows `0..n` in one epoch (chunks of 256k rows), commits it and compacts.
fn load<S: StateStore>(store: &S, table: &mut S::Table, n: usize, epoch: u64, rng: &mut StdRng) {
    load_with(&DataType::Utf8, store, table, n, epoch, rng)
}

/// [`load`] into a table whose `s` is of type `strings`.
fn load_with<S: StateStore>(
    strings: &DataType,
    store: &S,
    table: &mut S::Table,
    n: usize,
    epoch: u64,
    rng: &mut StdRng,
) {
    const CHUNK: usize = 1 << 18;
    for start in (0..n).step_by(CHUNK) {
        let end = (start + CHUNK).min(n);
        let batch = rows(start as u64..end as u64, rng);
        let mut columns = batch.columns().to_vec();
        columns[2] = arrow_cast::cast(&columns[2], strings).unwrap();
        let batch = RecordBatch::try_new(schema_with(strings), columns).unwrap();
        table.write(&StreamChunk::inserts(batch)).unwrap();
    }
    table.seal(epoch).unwrap();
    store.commit(epoch).unwrap();
}

/// What a consumer does with every value: sums `k`, `v` and the string lengths of `s`.
fn touch(batch: &RecordBatch, acc: &mut (i64, usize)) {
    let k = batch.column(0).as_primitive::<Int64Type>();
    let v = batch.column(1).as_primitive::<Int64Type>();
    for (k, v) in k.values().iter().zip(v.values().iter()) {
        acc.0 = acc.0.wrapping_add(k.wrapping_add(*v));
    }
    match batch.column(2).as_string_opt::<i32>() {
        Some(s) => acc.1 += s.iter().flatten().map(str::len).sum::<usize>(),
        None => {
            acc.1 += (batch.column(2).as_string_view().iter().flatten())
                .map(str::len)
                .sum::<usize>()
        }
    }
}

/// Scans one vnode to the end, touching every value; returns the rows.
fn scan_touch(table: &impl StateTable, epoch: u64) -> usize {
    let mut scan = table
        .scan(VirtualNode::ZERO, None, epoch, SCAN_BATCH)
        .unwrap();
    let mut rows = 0;
    let mut acc = (0i64, 0usize);
    while let Some(keyed) = scan.next_batch().unwrap() {
        touch(&keyed.batch, &mut acc);
        rows += keyed.num_rows();
    }
    black_box(acc);
    rows
}

fn durable_scan(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    // No block cache: every scan reads, checks and decodes its blocks (page cache warm).
    let uncached = DurableOptions {
        block_cache: 0,
        ..DurableOptions::default()
    };
    let durable = DurableStore::open_with(dir.path(), RealIo::shared(), uncached).unwrap();
    let memory = MemoryStore::new();
    durable.create_table(desc(1)).unwrap();
    memory.create_table(desc(1)).unwrap();
    let full = VnodeBitmap::full(VnodeCount::new(1).unwrap());
    let mut durable_table = durable.table("t", full.clone()).unwrap();
    let mut memory_table = memory.table("t", full).unwrap();
    load(
        &durable,
        &mut durable_table,
        SCAN_ROWS,
        1,
        &mut StdRng::seed_from_u64(SEED),
    );
    durable.compact().unwrap();
    load(
        &memory,
        &mut memory_table,
        SCAN_ROWS,
        1,
        &mut StdRng::seed_from_u64(SEED),
    );
    assert_eq!(scan_touch(&durable_table, 1), SCAN_ROWS);
    assert_eq!(scan_touch(&memory_table, 1), SCAN_ROWS);

    let mut group = c.benchmark_group(scan_ids().0);
    group.throughput(Throughput::Elements(SCAN_ROWS as u64));
    group.sample_size(10);
    group.bench_function("durable_store", |b| {
        b.iter(|| scan_touch(&durable_table, 1))
    });
    // The default 64 MiB cache of decoded blocks holds this vnode after the first pass.
    drop((durable_table, durable));
    let cached = DurableStore::open(dir.path()).unwrap();
    let cached_table = cached
        .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
        .unwrap();
    group.bench_function("durable_store_cached", |b| {
        b.iter(|| scan_touch(&cached_table, 1))
    });
    group.bench_function("memory_store", |b| b.iter(|| scan_touch(&memory_table, 1)));

    // The same rows with `s` as string views (a replay's strings), uncached.
    let views_dir = tempfile::tempdir().unwrap();
    let views = DurableStore::open_with(
        views_dir.path(),
        RealIo::shared(),
        DurableOptions {
            block_cache: 0,
            ..DurableOptions::default()
        },
    )
    .unwrap();
    views
        .create_table(desc_with(&DataType::Utf8View, 1))
        .unwrap();
    let mut views_table = views
        .table("t", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
        .unwrap();
    load_with(
        &DataType::Utf8View,
        &views,
        &mut views_table,
        SCAN_ROWS,
        1,
        &mut StdRng::seed_from_u64(SEED),
    );
    views.compact().unwrap();
    assert_eq!(scan_touch(&views_table, 1), SCAN_ROWS);
    group.bench_function("durable_store_views", |b| {
        b.iter(|| scan_touch(&views_table, 1))
    });
    group.finish();
}

/// Per vnode, the keys of its first rows in the committed upstream (positions to record).
fn upstream_keys<S: StateStore>(store: &S, rows: usize) -> Vec<(VirtualNode, BinaryArray)> {
    let full = VnodeBitmap::full(VnodeCount::DEFAULT);
    let upstream = store.table("t", full.clone()).unwrap();
    let epoch = store.committed_epoch().unwrap().unwrap();
    full.iter()
        .map(|vnode| {
            let mut scan = upstream.scan(vnode, None, epoch, rows).unwrap();
            (vnode, scan.next_batch().unwrap().unwrap().keys)
        })
        .collect()
}

/// Creates the progress table and writes, for every vnode, an InProgress row at its
/// upstream row `row` (`row + 1` rows emitted), sealed as `epoch`. Returns the codec.
fn write_progress<S: StateStore>(
    store: &S,
    progress: &mut Option<S::Table>,
    keys: &[(VirtualNode, BinaryArray)],
    row: usize,
    epoch: u64,
) -> ProgressCodec {
    let desc = desc(256);
    let full = VnodeBitmap::full(desc.vnode_count());
    let codec = ProgressCodec::new(PROGRESS_TABLE, desc.pk(), desc.vnode_count()).unwrap();
    let table = progress.get_or_insert_with(|| {
        store.create_table(codec.desc().as_ref().clone()).unwrap();
        store.table(PROGRESS_TABLE, full.clone()).unwrap()
    });
    let mut map = ProgressMap::new(full);
    for (vnode, keys) in keys {
        map.advance(*vnode, Position::from_keys(keys, row), row as u64 + 1)
            .unwrap();
    }
    table
        .write(&codec.encode(map.iter()).unwrap().unwrap())
        .unwrap();
    table.seal(epoch).unwrap();
    codec
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// Restores the 256 vnodes' progress from an open store.
fn restore<S: StateStore>(store: &S, codec: &ProgressCodec) -> ProgressMap {
    let full = VnodeBitmap::full(VnodeCount::DEFAULT);
    let table = store.table(PROGRESS_TABLE, full.clone()).unwrap();
    let epoch = store.committed_epoch().unwrap().unwrap();
    codec.restore(&table, full, epoch).unwrap()
}

/// What resuming costs: open the directory, the handles a backfill opens, and restore.
fn open_restore(dir: &Path, options: &DurableOptions) -> (DurableStore, ProgressMap) {
    let store = DurableStore::open_with(dir, RealIo::shared(), options.clone()).unwrap();
    let upstream = store.table_desc("t").unwrap().unwrap();
    let full = VnodeBitmap::full(upstream.vnode_count());
    let replicated = store.replicated_table("t", full).unwrap();
    black_box(&replicated);
    let codec = ProgressCodec::new(PROGRESS_TABLE, upstream.pk(), upstream.vnode_count()).unwrap();
    let map = restore(&store, &codec);
    (store, map)
}

/// A directory with the upstream table and its progress, committed. With `deltas` > 0, that
/// many more epochs follow (20k upstream changes and all 256 progress rows each), committed
/// and never compacted (manual compaction).
fn resume_dir(deltas: usize) -> (tempfile::TempDir, DurableOptions) {
    let dir = tempfile::tempdir().unwrap();
    let options = DurableOptions {
        compaction: if deltas > 0 {
            Compaction::Manual
        } else {
            Compaction::Background
        },
        ..DurableOptions::default()
    };
    let store = DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
    store.create_table(desc(256)).unwrap();
    let full = VnodeBitmap::full(VnodeCount::DEFAULT);
    let mut upstream = store.table("t", full).unwrap();
    let mut rng = StdRng::seed_from_u64(SEED);
    load(&store, &mut upstream, RESUME_ROWS, 1, &mut rng);
    let keys = upstream_keys(&store, 1000 + deltas);
    let mut progress = None;
    write_progress(&store, &mut progress, &keys, 999, 2);
    store.commit(2).unwrap();
    if deltas == 0 {
        store.compact().unwrap();
    }
    let mut live: Vec<u64> = (0..RESUME_ROWS as u64).collect();
    let mut next_id = RESUME_ROWS as u64;
    for d in 0..deltas {
        let epoch = d as u64 + 3;
        let chunk = epoch_changes(&mut live, &mut next_id, EPOCH_CHANGES, &mut rng);
        upstream.write(&chunk).unwrap();
        upstream.seal(epoch).unwrap();
        write_progress(&store, &mut progress, &keys, 1000 + d, epoch);
        store.commit(epoch).unwrap();
    }
    println!(
        "durable_resume setup, {deltas} uncompacted epochs: {} live files, {} bytes on disk",
        store.live_files().unwrap(),
        dir_bytes(dir.path())
    );
    (dir, options)
}

fn durable_resume(c: &mut Criterion) {
    let (compacted, options) = resume_dir(0);
    let (uncompacted, manual) = resume_dir(RESUME_DELTAS);
    let memory = MemoryStore::new();
    memory.create_table(desc(256)).unwrap();
    let mut table = memory
        .table("t", VnodeBitmap::full(VnodeCount::DEFAULT))
        .unwrap();
    load(
        &memory,
        &mut table,
        RESUME_ROWS,
        1,
        &mut StdRng::seed_from_u64(SEED),
    );
    let keys = upstream_keys(&memory, 1000);
    let memory_codec = write_progress(&memory, &mut None, &keys, 999, 2);
    memory.commit(2).unwrap();
    assert_eq!(restore(&memory, &memory_codec).counts().in_progress, 256);
    for (dir, options) in [(&compacted, &options), (&uncompacted, &manual)] {
        assert_eq!(
            open_restore(dir.path(), options).1.counts().in_progress,
            256
        );
    }

    let open_restore_iters = |dir: &Path, options: &DurableOptions, iters: u64| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let start = Instant::now();
            let (store, map) = open_restore(dir, options);
            total += start.elapsed();
            black_box(map);
            drop(store); // joins the compactor thread: not part of resuming
        }
        total
    };
    let mut group = c.benchmark_group(resume_ids().0);
    group.sample_size(20);
    group.bench_function("durable_open_restore", |b| {
        b.iter_custom(|iters| open_restore_iters(compacted.path(), &options, iters))
    });
    group.bench_function(format!("durable_open_restore_{RESUME_DELTAS}deltas"), |b| {
        b.iter_custom(|iters| open_restore_iters(uncompacted.path(), &manual, iters))
    });
    let durable = DurableStore::open(compacted.path()).unwrap();
    group.bench_function("durable_restore", |b| {
        b.iter(|| restore(&durable, &memory_codec))
    });
    drop(durable);
    group.bench_function("memory_restore", |b| {
        b.iter(|| restore(&memory, &memory_codec))
    });
    group.finish();
}

/// One epoch of a changelog over live row ids: `n / 4` inserts of new ids, `n / 4` deletes
/// and `n / 4` update pairs of live ids (`n` rows in all).
fn epoch_changes(
    live: &mut Vec<u64>,
    next_id: &mut u64,
    n: usize,
    rng: &mut StdRng,
) -> StreamChunk {
    let quarter = n / 4;
    let mut ids = Vec::with_capacity(n);
    let mut ops = Vec::with_capacity(n);
    for _ in 0..quarter {
        let i = rng.random_range(0..live.len());
        ids.push(live[i]);
        ops.push(Op::UpdateDelete);
        ids.push(live[i]);
        ops.push(Op::UpdateInsert);
    }
    for _ in 0..quarter {
        let i = rng.random_range(0..live.len());
        ids.push(live.swap_remove(i));
        ops.push(Op::Delete);
    }
    for _ in 0..quarter {
        ids.push(*next_id);
        live.push(*next_id);
        ops.push(Op::Insert);
        *next_id += 1;
    }
    StreamChunk::new(rows(ids.into_iter(), rng), ops).unwrap()
}

/// The value at quantile `q` of sorted samples (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// What a commit-latency run records per epoch.
#[derive(Default)]
struct Samples {
    commits: Vec<Duration>,
    writes: Vec<Duration>,
    /// Live files after each commit (durable store only).
    files: Vec<usize>,
}

/// Loads `rows`, then commits one epoch per chunk; records each commit's wall time, each
/// epoch's write + seal time and `observe()` after each commit.
fn commit_loop<S: StateStore>(
    store: &S,
    rows: usize,
    epochs: &[StreamChunk],
    compact: impl Fn(),
    observe: impl Fn() -> usize,
) -> Samples {
    store.create_table(desc(256)).unwrap();
    let mut table = store
        .table("t", VnodeBitmap::full(VnodeCount::DEFAULT))
        .unwrap();
    let mut rng = StdRng::seed_from_u64(SEED);
    load(store, &mut table, rows, 1, &mut rng);
    compact();
    let mut samples = Samples::default();
    for (i, chunk) in epochs.iter().enumerate() {
        let epoch = i as u64 + 2;
        let start = Instant::now();
        table.write(chunk).unwrap();
        table.seal(epoch).unwrap();
        samples.writes.push(start.elapsed());
        let start = Instant::now();
        store.commit(epoch).unwrap();
        samples.commits.push(start.elapsed());
        samples.files.push(observe());
    }
    samples
}

fn report(name: &str, store: &str, samples: Samples) {
    let Samples {
        mut commits,
        mut writes,
        files,
    } = samples;
    if !files.is_empty() {
        // A compaction install lowers the live file count; a commit adds one file.
        let installs = files.windows(2).filter(|w| w[1] < w[0]).count();
        println!(
            "{name}/{store}: live files after each commit: max {}, last {}, {installs} drops (compaction installs)",
            files.iter().max().unwrap(),
            files.last().unwrap(),
        );
    }
    commits.sort_unstable();
    writes.sort_unstable();
    println!(
        "{name}/{store}: {} commits: p50 {}, p99 {}, max {}, mean {}; write+seal p50 {}, max {}",
        commits.len(),
        ms(quantile(&commits, 0.5)),
        ms(quantile(&commits, 0.99)),
        ms(*commits.last().unwrap()),
        ms(commits.iter().sum::<Duration>() / commits.len() as u32),
        ms(quantile(&writes, 0.5)),
        ms(*writes.last().unwrap()),
    );
}

fn commit_latency(args: &Args) {
    let runs: &[(usize, usize, usize)] = if args.test {
        &[(20_000, 2_000, 3)]
    } else {
        &[
            (1_000_000, EPOCH_CHANGES, COMMIT_EPOCHS),
            (4_000_000, EPOCH_CHANGES, COMMIT_EPOCHS),
        ]
    };
    for &(rows, changes, epochs) in runs {
        let name = format!(
            "durable_commit/256v_{}_{}k",
            if rows >= 1_000_000 {
                format!("{}M", rows / 1_000_000)
            } else {
                format!("{}k", rows / 1000)
            },
            changes / 1000
        );
        if args.list {
            println!("{name}: benchmark");
            continue;
        }
        if !args.selects(&name) {
            continue;
        }
        let mut rng = StdRng::seed_from_u64(SEED ^ 0xC0);
        let mut live: Vec<u64> = (0..rows as u64).collect();
        let mut next_id = rows as u64;
        let chunks: Vec<StreamChunk> = (0..epochs)
            .map(|_| epoch_changes(&mut live, &mut next_id, changes, &mut rng))
            .collect();

        // Background compaction (the default), then none at all, to see what it costs.
        for (store_name, compaction) in [
            ("durable_store", Compaction::Background),
            ("durable_store_no_compaction", Compaction::Manual),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let options = DurableOptions {
                compaction,
                ..DurableOptions::default()
            };
            let durable = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
            let start = Instant::now();
            let samples = commit_loop(
                &durable,
                rows,
                &chunks,
                || durable.compact().unwrap(),
                || durable.live_files().unwrap(),
            );
            println!(
                "{name}/{store_name}: {:.1?} in all (load, compaction, {epochs} epochs), manifest {} bytes at the end",
                start.elapsed(),
                std::fs::metadata(dir.path().join("MANIFEST"))
                    .unwrap()
                    .len()
            );
            report(&name, store_name, samples);
        }
        let memory = MemoryStore::new();
        let samples = commit_loop(&memory, rows, &chunks, || {}, || 0);
        report(
            &name,
            "memory_store",
            Samples {
                files: Vec::new(),
                ..samples
            },
        );
    }
}

/// The command line, as far as this file needs it (criterion parses it again).
struct Args {
    filter: Option<String>,
    test: bool,
    list: bool,
}

impl Args {
    fn parse() -> Self {
        // criterion's switches that take no value; every other `--flag` takes one.
        const SWITCHES: &[&str] = &[
            "--verbose",
            "-v",
            "--quiet",
            "--noplot",
            "-n",
            "--discard-baseline",
            "--list",
            "--ignored",
            "--exact",
            "--quick",
            "--test",
            "--bench",
            "--nocapture",
            "--show-output",
            "--include-ignored",
            "--version",
            "-V",
        ];
        let mut args = Self {
            filter: None,
            test: false,
            list: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--test" => args.test = true,
                "--list" => args.list = true,
                a if SWITCHES.contains(&a) || (a.starts_with('-') && a.contains('=')) => {}
                a if a.starts_with('-') => {
                    it.next();
                }
                _ => args.filter = Some(arg),
            }
        }
        args
    }

    fn selects(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    /// Whether any of these benchmark ids may run (their data is built only then).
    fn selects_any(&self, ids: &[String]) -> bool {
        ids.iter().any(|id| self.selects(id))
    }
}

const LOAD_ROWS: usize = 1_000_000;

/// Rows with ids `ids` whose keys are the ids themselves (in key order when the ids are),
/// with random values and `Utf8View` strings.
fn ordered_rows(ids: std::ops::Range<u64>, rng: &mut StdRng) -> RecordBatch {
    let batch = rows(ids.clone(), rng);
    let mut columns = batch.columns().to_vec();
    columns[0] = Arc::new(Int64Array::from_iter_values(ids.map(|id| id as i64)));
    columns[2] = arrow_cast::cast(&columns[2], &DataType::Utf8View).unwrap();
    RecordBatch::try_new(schema_with(&DataType::Utf8View), columns).unwrap()
}

/// Writes `chunks` into a new 256-vnode store in `dir` in one epoch, seals and commits it.
fn bulk_load(dir: &Path, chunks: &[RecordBatch]) -> usize {
    let store = DurableStore::open(dir).unwrap();
    store
        .create_table(desc_with(&DataType::Utf8View, 256))
        .unwrap();
    let full = VnodeBitmap::full(VnodeCount::new(256).unwrap());
    let mut table = store.table("t", full).unwrap();
    for chunk in chunks {
        table.write(&StreamChunk::inserts(chunk.clone())).unwrap();
    }
    table.seal(1).unwrap();
    store.commit(1).unwrap();
    chunks.iter().map(RecordBatch::num_rows).sum()
}

fn durable_load(c: &mut Criterion) {
    const CHUNK: usize = 1 << 18;
    let mut rng = StdRng::seed_from_u64(SEED);
    let key_order: Vec<RecordBatch> = (0..LOAD_ROWS)
        .step_by(CHUNK)
        .map(|start| {
            ordered_rows(
                start as u64..(start + CHUNK).min(LOAD_ROWS) as u64,
                &mut rng,
            )
        })
        .collect();
    // The same rows with spread keys: `key_of` of each id.
    let shuffled: Vec<RecordBatch> = (key_order.iter())
        .map(|batch| {
            let mut columns = batch.columns().to_vec();
            let ids = batch.column(0).as_primitive::<Int64Type>();
            columns[0] = Arc::new(Int64Array::from_iter_values(
                ids.values().iter().map(|&id| key_of(id as u64)),
            ));
            RecordBatch::try_new(batch.schema(), columns).unwrap()
        })
        .collect();
    let mut group = c.benchmark_group(load_ids().0);
    group
        .throughput(Throughput::Elements(LOAD_ROWS as u64))
        .sample_size(10);
    for (name, chunks) in [("key_order", &key_order), ("shuffled", &shuffled)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || tempfile::tempdir().unwrap(),
                |dir| {
                    assert_eq!(bulk_load(dir.path(), chunks), LOAD_ROWS);
                    dir
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn load_ids() -> (String, Vec<String>) {
    let group = format!("durable_load/256v_{}M", LOAD_ROWS / 1_000_000);
    let ids = ["key_order", "shuffled"]
        .iter()
        .map(|f| format!("{group}/{f}"))
        .collect();
    (group, ids)
}

fn scan_ids() -> (String, Vec<String>) {
    let group = format!("durable_scan/1v_{}M", SCAN_ROWS / 1_000_000);
    let ids = [
        "durable_store",
        "durable_store_cached",
        "memory_store",
        "durable_store_views",
    ]
    .iter()
    .map(|f| format!("{group}/{f}"))
    .collect();
    (group, ids)
}

fn resume_ids() -> (String, Vec<String>) {
    let group = format!("durable_resume/256v_{}M", RESUME_ROWS / 1_000_000);
    let ids = [
        "durable_open_restore".to_string(),
        format!("durable_open_restore_{RESUME_DELTAS}deltas"),
        "durable_restore".to_string(),
        "memory_restore".to_string(),
    ]
    .iter()
    .map(|f| format!("{group}/{f}"))
    .collect();
    (group, ids)
}

fn main() {
    let args = Args::parse();
    if args.list {
        for id in (scan_ids().1.into_iter())
            .chain(resume_ids().1)
            .chain(load_ids().1)
        {
            println!("{id}: benchmark");
        }
        commit_latency(&args);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    if args.selects_any(&scan_ids().1) {
        durable_scan(&mut c);
    }
    if args.selects_any(&resume_ids().1) {
        durable_resume(&mut c);
    }
    if args.selects_any(&load_ids().1) {
        durable_load(&mut c);
    }
    commit_latency(&args);
    c.final_summary();
}
