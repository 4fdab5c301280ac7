//! The embedders' job API ([`BackfillJob`]) from the outside: job identity (two views of one
//! table, a changed definition, a resume refused after another job changed the table), resume
//! on the durable store, the upstream checks and deletes by key, changelog batches with their
//! own epochs, a parallel job under control, an own exactly-once sink across a crash. Every
//! output is checked against a `BTreeMap` model of the upstream.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrangement_backfill::{
    BackfillJob, Change, DurableStore, Error, ExactlyOnceSink, JobOptions, KeyColumn, MemoryStore,
    Message, PreparedCheckpoint, Recovery, StateStore, StreamChunk, TableDesc, load_table,
};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int8Array, Int64Array, RecordBatch, RecordBatchIterator, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS: i64 = 2_000;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn batch(rows: &BTreeMap<i64, i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.keys().copied())),
            Arc::new(Int64Array::from_iter_values(rows.values().copied())),
        ],
    )
    .unwrap()
}

/// The upstream table `t` with keys `0..ROWS`, loaded into `store`.
fn load<S: StateStore>(store: &S) -> BTreeMap<i64, i64> {
    let model: BTreeMap<i64, i64> = (0..ROWS).map(|k| (k, k * 10)).collect();
    let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap();
    let rows = batch(&model);
    let loaded = load_table(store, desc, RecordBatchIterator::new([Ok(rows)], schema())).unwrap();
    assert_eq!(loaded.rows, ROWS as u64);
    model
}

/// `epochs` epochs of seeded random changes to `model` (updates, deletes, inserts), each a
/// chunk followed by a barrier, applied to `model` as generated.
fn changes(model: &mut BTreeMap<i64, i64>, seed: u64, epochs: usize) -> Vec<Change> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for _ in 0..epochs {
        let mut text = String::new();
        let mut touched = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let k = rng.random_range(0..ROWS * 2);
            if !touched.insert(k) {
                continue;
            }
            match (model.get(&k).copied(), rng.random_range(0..3)) {
                (Some(old), 0) => {
                    model.remove(&k);
                    text.push_str(&format!("- {k} {old}\n"));
                }
                (Some(old), _) => {
                    let new = rng.random_range(0..1_000_000);
                    model.insert(k, new);
                    text.push_str(&format!("U- {k} {old}\nU+ {k} {new}\n"));
                }
                (None, _) => {
                    let new = rng.random_range(0..1_000_000);
                    model.insert(k, new);
                    text.push_str(&format!("+ {k} {new}\n"));
                }
            }
        }
        out.push(Change::Chunk(
            StreamChunk::from_text(&schema(), &text).unwrap(),
        ));
        out.push(Change::Barrier);
    }
    out
}

/// `changes` after their first `skip` rows: what a resumed job is fed.
fn after(changes: Vec<Change>, skip: u64) -> Vec<Change> {
    let mut skip = skip as usize;
    let mut out = Vec::new();
    for change in changes {
        match change {
            Change::Chunk(chunk) if skip >= chunk.num_rows() => skip -= chunk.num_rows(),
            Change::Chunk(chunk) if skip > 0 => {
                let n = chunk.num_rows() - skip;
                let (batch, ops) = chunk.into_parts();
                let cut = StreamChunk::new(batch.slice(skip, n), ops[skip..].to_vec()).unwrap();
                skip = 0;
                out.push(Change::Chunk(cut));
            }
            other => out.push(other),
        }
    }
    assert_eq!(skip, 0, "the resume point is past the changes");
    out
}

fn source(
    changes: Vec<Change>,
) -> impl futures::Stream<Item = arrangement_backfill::Result<Change>> + Unpin {
    futures::stream::iter(changes.into_iter().map(Ok))
}

/// Net count per `(k, v)` of the output.
#[derive(Debug, Default, Clone, PartialEq)]
struct Net(BTreeMap<(i64, i64), i64>);

impl Net {
    fn add(&mut self, chunk: &StreamChunk) {
        let k = chunk.batch().column(0).as_primitive::<Int64Type>();
        let v = chunk.batch().column(1).as_primitive::<Int64Type>();
        for (i, op) in chunk.ops().iter().enumerate() {
            let n = self.0.entry((k.value(i), v.value(i))).or_default();
            *n += if op.is_insert() { 1 } else { -1 };
            assert!(
                *n == 0 || *n == 1,
                "row ({}, {}) counted {n}",
                k.value(i),
                v.value(i)
            );
        }
        self.0.retain(|_, n| *n != 0);
    }

    fn of(model: &BTreeMap<i64, i64>) -> Self {
        Self(model.iter().map(|(&k, &v)| ((k, v), 1)).collect())
    }
}

fn options() -> JobOptions {
    JobOptions {
        batch_size: 128,
        barrier_interval: Some(Duration::from_millis(20)),
        ..JobOptions::default()
    }
}

/// Runs `job` to its end; its output as net counts.
async fn collect(job: BackfillJob) -> (Net, BackfillJob) {
    collect_into(Net::default(), job).await
}

/// Runs `job` to its end; its output added to `net`.
async fn collect_into(mut net: Net, mut job: BackfillJob) -> (Net, BackfillJob) {
    while let Some(message) = job.next().await {
        if let Message::Chunk(chunk) = message.unwrap() {
            net.add(&chunk);
        }
    }
    (net, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_views_of_one_table_each_get_every_row() {
    let store = MemoryStore::new();
    let mut model = load(&store);
    let first = changes(&mut model, 1, 5);
    let job = BackfillJob::start(&store, "a", "t", options(), source(first)).unwrap();
    let (net, job) = collect(job).await;
    assert_eq!(net, Net::of(&model));
    assert!(job.summary().finished && job.summary().ended);
    let applied = store.meta("upstream.t.changes").unwrap();
    drop(job);

    // A second view of the same table: every row again, with the changes after the first's.
    let second = changes(&mut model, 2, 5);
    let job = BackfillJob::start(&store, "b", "t", options(), source(second)).unwrap();
    assert_eq!(job.resume_point().checkpoint, None);
    assert_eq!(
        Some(job.resume_point().changes.to_string()),
        applied,
        "the second view starts where the table is"
    );
    let (net, job) = collect(job).await;
    assert_eq!(net, Net::of(&model), "the second view gets every row");
    drop(job);

    // View `a` missed `b`'s changes: it cannot resume.
    let err = BackfillJob::start(&store, "a", "t", options(), source(vec![])).unwrap_err();
    assert!(
        err.to_string().contains("cannot resume") && err.to_string().contains("another job"),
        "{err}"
    );
    // View `b` resumes (finished, it passes changes through).
    let job = BackfillJob::start(&store, "b", "t", options(), source(vec![])).unwrap();
    assert!(job.resume_point().finished);
    let (net, _) = collect(job).await;
    assert_eq!(
        net,
        Net::default(),
        "a finished view resumed emits no snapshot again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_with_another_definition_is_refused_saying_what_differs() {
    let store = MemoryStore::new();
    let model = load(&store);
    let job = BackfillJob::start(&store, "view", "t", options(), source(vec![])).unwrap();
    let (net, job) = collect(job).await;
    assert_eq!(net, Net::of(&model));
    drop(job);
    let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let desc = TableDesc::new("u", other.clone(), vec![KeyColumn::asc("id")]).unwrap();
    load_table(&store, desc, RecordBatchIterator::new([], other)).unwrap();
    let err = BackfillJob::start(&store, "view", "u", options(), source(vec![])).unwrap_err();
    assert!(matches!(err, Error::JobDefinition { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("the table was t, is u"), "{text}");
    assert!(text.contains("the columns was k Int64"), "{text}");
    assert!(text.contains("the key was"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_resumes_on_the_durable_store_from_its_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, all);
    {
        let store = DurableStore::open(dir.path()).unwrap();
        model = load(&store);
        all = changes(&mut model, 3, 40);
    }
    let slow = JobOptions {
        rate_limit: Some(4_000),
        ..options()
    };
    // Run 1: taken down after a few checkpoints (dropped: nothing more is committed).
    let mut kept: BTreeMap<u64, Vec<StreamChunk>> = BTreeMap::new();
    {
        let store = DurableStore::open(dir.path()).unwrap();
        let mut job =
            BackfillJob::start(&store, "view", "t", slow.clone(), source(all.clone())).unwrap();
        let mut epoch = 0;
        let mut barriers = 0;
        while let Some(message) = job.next().await {
            match message.unwrap() {
                Message::Chunk(chunk) => kept.entry(epoch).or_default().push(chunk),
                Message::Barrier(b) => {
                    epoch = b.epoch.curr;
                    barriers += 1;
                    if barriers == 12 {
                        job.shutdown().await;
                        break;
                    }
                }
                Message::Watermark(_) => {}
            }
        }
    }
    let store = DurableStore::open(dir.path()).unwrap();
    let checkpoint = store.committed_epoch().unwrap().unwrap();
    // Run 2: told where to resume, fed the changes after it.
    let resume = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
    assert_eq!(resume.checkpoint, Some(checkpoint));
    assert!(!resume.finished);
    assert!(resume.changes > 0, "{resume:?}");
    // The changes after the first `resume.changes` rows.
    let rest = after(all, resume.changes);
    // The first run's output up to the committed checkpoint, then the second's.
    let mut net = Net::default();
    for (_, chunks) in kept.range(..=checkpoint) {
        for chunk in chunks {
            net.add(chunk);
        }
    }
    let job = BackfillJob::start(&store, "view", "t", options(), source(rest)).unwrap();
    let (net, job) = collect_into(net, job).await;
    assert!(job.summary().finished);
    assert_eq!(
        net,
        Net::of(&model),
        "every row exactly once across the resume"
    );
}

/// One store object, two jobs of the same name in turn (an embedding that restarts a job in
/// its own process): what the first left sealed and uncommitted when it was dropped or shut
/// down mid-epoch is not committed by the second, which resumes exactly.
async fn restarted_in_process<S: StateStore>(store: S, stop_after: usize, drop_it: bool) {
    let mut model = load(&store);
    let all = changes(&mut model, 5, 40);
    let slow = JobOptions {
        rate_limit: Some(4_000),
        ..options()
    };
    let mut kept: BTreeMap<u64, Vec<StreamChunk>> = BTreeMap::new();
    let mut job = BackfillJob::start(&store, "view", "t", slow, source(all.clone())).unwrap();
    let (mut epoch, mut barriers) = (0, 0);
    while let Some(message) = job.next().await {
        match message.unwrap() {
            Message::Chunk(chunk) => kept.entry(epoch).or_default().push(chunk),
            Message::Barrier(b) => {
                epoch = b.epoch.curr;
                barriers += 1;
                if barriers == stop_after {
                    break;
                }
            }
            Message::Watermark(_) => {}
        }
    }
    if drop_it {
        drop(job);
        // Its tasks let go of the table a moment later.
        let mut tries = 0;
        while store.writer_claims().claim("t", "probe").is_err() {
            tries += 1;
            assert!(tries < 500, "the dropped job never let go of its table");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    } else {
        job.shutdown().await;
    }
    let resume = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
    let checkpoint = resume.checkpoint.unwrap_or(0);
    let mut net = Net::default();
    for (_, chunks) in kept.range(..=checkpoint) {
        for chunk in chunks {
            net.add(chunk);
        }
    }
    let rest = after(all, resume.changes);
    let job = BackfillJob::start(&store, "view", "t", options(), source(rest)).unwrap();
    let (net, _) = collect_into(net, job).await;
    assert_eq!(net, Net::of(&model), "stopped after {stop_after} barriers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_restarted_on_the_same_store_object_resumes_exactly() {
    for (stop_after, drop_it) in [(3, true), (9, false), (14, true), (20, false)] {
        let dir = tempfile::tempdir().unwrap();
        restarted_in_process(DurableStore::open(dir.path()).unwrap(), stop_after, drop_it).await;
        restarted_in_process(MemoryStore::new(), stop_after, drop_it).await;
    }
}

async fn first_error(store: &MemoryStore, name: &str, text: &str, check: bool) -> Option<Error> {
    let chunk = StreamChunk::from_text(&schema(), text).unwrap();
    let options = JobOptions {
        check_changes: check,
        ..options()
    };
    let job = BackfillJob::start(
        store,
        name,
        "t",
        options,
        source(vec![Change::Chunk(chunk)]),
    )
    .unwrap();
    let out: Vec<_> = job.collect().await;
    out.into_iter().find_map(|m| m.err())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_changes_are_refused_naming_epoch_and_key() {
    for (text, problem) in [
        ("+ 5 1", "insert of a key the table holds already"),
        ("- 99999 1", "delete of a key the table does not hold"),
        (
            "- 5 51",
            "delete whose old values (v=51) differ from the table's (v=50)",
        ),
        (
            "U- 6 1\nU+ 6 2",
            "update-delete whose old values (v=1) differ",
        ),
        (
            "U- 77777 1\nU+ 77777 2",
            "update-delete of a key the table does not hold",
        ),
        (
            "+ 5000 1\n+ 5000 2",
            "insert of a key the table holds already",
        ),
    ] {
        let store = MemoryStore::new();
        load(&store);
        let err = first_error(&store, "view", text, true).await.expect(text);
        assert!(matches!(err, Error::BadChange { .. }), "{text}: {err}");
        let message = err.to_string();
        assert!(message.contains(problem), "{text}: {message}");
        assert!(
            message.contains("in epoch 2 at key (k="),
            "{text}: {message}"
        );
        // Nothing of the bad epoch was committed.
        assert_eq!(store.meta("upstream.t.changes").unwrap(), None, "{text}");
    }
    // With the checks off, a trusted source's changes go in as they are.
    let store = MemoryStore::new();
    load(&store);
    assert!(
        first_error(&store, "view", "+ 5000 1", false)
            .await
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_by_key_take_the_old_values_from_the_table() {
    let store = MemoryStore::new();
    let mut model = load(&store);
    // A changelog batch of deletes with only `_op` and the key.
    let keys = Arc::new(Schema::new(vec![
        Field::new("_op", DataType::Int8, false),
        Field::new("k", DataType::Int64, false),
    ]));
    let deletes = RecordBatch::try_new(
        keys,
        vec![
            Arc::new(Int8Array::from(vec![2, 2, 2])),
            Arc::new(Int64Array::from(vec![3, 30, 300])),
        ],
    )
    .unwrap();
    for k in [3, 30, 300] {
        model.remove(&k);
    }
    // A delete with NULL values in a chunk of the table's schema, after an update of it in
    // the same epoch.
    let chunk = StreamChunk::from_text(&schema(), "U- 4 40\nU+ 4 41\n- 4 NULL").unwrap();
    model.remove(&4);
    let job = BackfillJob::start(
        &store,
        "view",
        "t",
        options(),
        source(vec![Change::Changelog(deletes), Change::Chunk(chunk)]),
    )
    .unwrap();
    let (net, _) = collect(job).await;
    assert_eq!(net, Net::of(&model));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelog_epochs_close_epochs_and_name_the_resume_point() {
    let store = MemoryStore::new();
    let mut model = load(&store);
    let text = changes(&mut model, 4, 3);
    let mut batches = Vec::new();
    for (upstream_epoch, change) in (100u64..).zip(text.iter().step_by(2)) {
        let Change::Chunk(chunk) = change else {
            unreachable!()
        };
        let n = chunk.num_rows();
        let log = chunk.to_changelog(None).unwrap();
        let mut columns = vec![Arc::new(UInt64Array::from(vec![upstream_epoch; n])) as _];
        columns.extend(log.columns().iter().cloned());
        let mut fields = vec![Field::new("_epoch", DataType::UInt64, false)];
        fields.extend(log.schema().fields().iter().map(|f| f.as_ref().clone()));
        batches.push(Change::Changelog(
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap(),
        ));
    }
    let no_interval = JobOptions {
        barrier_interval: None,
        ..options()
    };
    let job =
        BackfillJob::start(&store, "view", "t", no_interval.clone(), source(batches)).unwrap();
    let (net, job) = collect(job).await;
    assert_eq!(net, Net::of(&model));
    assert!(job.summary().epochs >= 4, "{:?}", job.summary());
    drop(job);
    let job = BackfillJob::start(&store, "view", "t", no_interval, source(vec![])).unwrap();
    assert_eq!(job.resume_point().upstream_epoch, Some(102));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallel_job_paused_throttled_and_rescaled_emits_every_row_once() {
    let store = MemoryStore::new();
    let mut model = load(&store);
    let all = changes(&mut model, 5, 30);
    let parallel = JobOptions {
        parallelism: 4,
        rate_limit: Some(5_000),
        ..options()
    };
    let mut job = BackfillJob::start(&store, "view", "t", parallel, source(all)).unwrap();
    let control = job.control();
    let progress = job.progress();
    let mut net = Net::default();
    let mut barriers = 0;
    while let Some(message) = job.next().await {
        match message.unwrap() {
            Message::Chunk(chunk) => net.add(&chunk),
            Message::Barrier(_) => {
                barriers += 1;
                match barriers {
                    3 => control.pause().unwrap(),
                    5 => control.resume().unwrap(),
                    6 => control.throttle(Some(20_000)).unwrap(),
                    8 => control.rescale(2).unwrap(),
                    12 => control.rescale(7).unwrap(),
                    14 => control.throttle(None).unwrap(),
                    _ => {}
                }
            }
            Message::Watermark(_) => {}
        }
    }
    assert_eq!(net, Net::of(&model));
    assert!(job.summary().finished);
    assert_eq!(progress.borrow().rescales, 2);
    assert!(control.rescale(257).is_err(), "more actors than vnodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_refuse_what_cannot_work_before_they_start() {
    let store = MemoryStore::new();
    load(&store);
    let start = |name: &str, table: &str, options: JobOptions| {
        BackfillJob::start(&store, name, table, options, source(vec![])).map(|_| ())
    };
    let too_many = JobOptions {
        parallelism: 257,
        ..options()
    };
    let errors = [
        start("view", "nope", options()).unwrap_err(),
        start("view", "t", too_many).unwrap_err(),
        start("a view", "t", options()).unwrap_err(),
    ];
    assert!(
        errors[0]
            .to_string()
            .contains("table `nope` is not in the store"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1]
            .to_string()
            .contains("parallelism 257 is outside 1..=256"),
        "{}",
        errors[1]
    );
    assert!(errors[2].to_string().contains("job name"), "{}", errors[2]);
    // One writer per table at a time.
    let running = BackfillJob::start(&store, "a", "t", options(), source(vec![])).unwrap();
    let err = BackfillJob::start(&store, "b", "t", options(), source(vec![])).unwrap_err();
    assert!(
        err.to_string().contains("being written by job `a`"),
        "{err}"
    );
    drop(running);
    tokio::time::sleep(Duration::from_millis(50)).await;
    BackfillJob::start(&store, "b", "t", options(), source(vec![])).unwrap();
}

/// A sink of "files" in memory: each checkpoint's rows, made durable as a pending file and
/// published by moving it among the visible ones (a reader sees only those).
#[derive(Default, Clone)]
struct Files(Arc<Mutex<FilesInner>>);

#[derive(Default)]
struct FilesInner {
    pending: BTreeMap<u64, Vec<StreamChunk>>,
    visible: BTreeMap<u64, Vec<StreamChunk>>,
}

struct FileSink {
    files: Files,
    open: Vec<StreamChunk>,
    recovered: Option<Recovery>,
}

struct PendingFile {
    files: Files,
    epoch: u64,
    rows: Vec<StreamChunk>,
}

impl ExactlyOnceSink for FileSink {
    type Prepared = PendingFile;

    fn recover(&mut self, recovery: &Recovery) -> arrangement_backfill::Result<()> {
        let mut files = self.files.0.lock().unwrap();
        let committed = recovery.committed.unwrap_or(0);
        // Never committed: gone. Committed but not yet visible: published now.
        let pending = std::mem::take(&mut files.pending);
        for (epoch, rows) in pending {
            if epoch <= committed {
                files.visible.insert(epoch, rows);
            }
        }
        files.visible.retain(|&epoch, _| epoch <= committed);
        for (epoch, record) in &recovery.records {
            assert_eq!(record, &format!("file-{epoch}"));
        }
        self.recovered = Some(recovery.clone());
        Ok(())
    }

    fn write(&mut self, _epoch: u64, chunk: StreamChunk) -> arrangement_backfill::Result<()> {
        self.open.push(chunk);
        Ok(())
    }

    fn prepare(&mut self, epoch: u64) -> arrangement_backfill::Result<PendingFile> {
        Ok(PendingFile {
            files: self.files.clone(),
            epoch,
            rows: std::mem::take(&mut self.open),
        })
    }
}

impl PreparedCheckpoint for PendingFile {
    fn make_durable(&mut self) -> arrangement_backfill::Result<Option<String>> {
        let mut files = self.files.0.lock().unwrap();
        files.pending.insert(self.epoch, self.rows.clone());
        Ok(Some(format!("file-{}", self.epoch)))
    }

    fn publish(&mut self) -> arrangement_backfill::Result<()> {
        let mut files = self.files.0.lock().unwrap();
        if let Some(rows) = files.pending.remove(&self.epoch) {
            files.visible.insert(self.epoch, rows);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_sink_publishes_every_row_once_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::default();
    let (mut model, all);
    {
        let store = DurableStore::open(dir.path()).unwrap();
        model = load(&store);
        all = changes(&mut model, 6, 30);
    }
    let slow = JobOptions {
        rate_limit: Some(5_000),
        ..options()
    };
    {
        // Run 1, crashed part way: its future dropped while it runs.
        let store = DurableStore::open(dir.path()).unwrap();
        let job =
            BackfillJob::start(&store, "view", "t", slow.clone(), source(all.clone())).unwrap();
        let mut sink = FileSink {
            files: files.clone(),
            open: Vec::new(),
            recovered: None,
        };
        let run = tokio::time::timeout(Duration::from_millis(300), job.run(&mut sink)).await;
        assert!(run.is_err(), "the job ended before the crash");
    }
    // The crashed run's tasks let go of the store a moment after.
    let store = loop {
        match DurableStore::open(dir.path()) {
            Ok(store) => break store,
            Err(Error::Locked { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("{e}"),
        }
    };
    let resume = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
    assert!(resume.checkpoint.is_some(), "no checkpoint in 300 ms");
    let rest = after(all, resume.changes);
    let job = BackfillJob::start(&store, "view", "t", options(), source(rest)).unwrap();
    let mut sink = FileSink {
        files: files.clone(),
        open: Vec::new(),
        recovered: None,
    };
    let summary = job.run(&mut sink).await.unwrap();
    assert!(summary.finished);
    let files = files.0.lock().unwrap();
    assert!(files.pending.is_empty());
    let mut net = Net::default();
    for chunks in files.visible.values() {
        for chunk in chunks {
            net.add(chunk);
        }
    }
    assert_eq!(
        net,
        Net::of(&model),
        "the visible files hold every row exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_resumes_where_its_stop_checkpoint_left_it() {
    for parallelism in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let (mut model, all);
        {
            let store = DurableStore::open(dir.path()).unwrap();
            model = load(&store);
            all = changes(&mut model, 8, 40);
        }
        let slow = JobOptions {
            rate_limit: Some(4_000),
            parallelism,
            ..options()
        };
        let mut net = Net::default();
        {
            let store = DurableStore::open(dir.path()).unwrap();
            let mut job =
                BackfillJob::start(&store, "view", "t", slow.clone(), source(all.clone())).unwrap();
            let control = job.control();
            let mut barriers = 0;
            while let Some(message) = job.next().await {
                match message.unwrap() {
                    Message::Chunk(chunk) => net.add(&chunk),
                    Message::Barrier(_) => {
                        barriers += 1;
                        if barriers == 10 {
                            control.stop().unwrap();
                        }
                    }
                    Message::Watermark(_) => {}
                }
            }
            assert!(!job.summary().finished, "stopped before the end");
            job.shutdown().await;
        }
        let store = DurableStore::open(dir.path()).unwrap();
        let resume = BackfillJob::resume_point_in(&store, "view", "t").unwrap();
        assert!(!resume.ended, "a stop on request is not the job's end");
        let rest = after(all, resume.changes);
        let job = BackfillJob::start(&store, "view", "t", slow, source(rest)).unwrap();
        let (net, _) = collect_into(net, job).await;
        assert_eq!(net, Net::of(&model), "parallelism {parallelism}");
    }
}

#[test]
fn a_job_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let store = MemoryStore::new();
    load(&store);
    let err = BackfillJob::start(&store, "view", "t", options(), source(vec![])).unwrap_err();
    assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
}

/// The path a Python binding takes: the job's changelog as a blocking `RecordBatchReader`
/// read from a plain thread, then as an Arrow C stream read back.
#[test]
fn the_changelog_reads_as_a_blocking_reader_and_a_c_stream() {
    use arrow_array::RecordBatchReader;
    use arrow_array::ffi_stream::ArrowArrayStreamReader;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for c_stream in [false, true] {
        let store = MemoryStore::new();
        let mut model = load(&store);
        let all = changes(&mut model, 9, 10);
        let job = {
            let _entered = runtime.enter();
            BackfillJob::start(&store, "view", "t", options(), source(all)).unwrap()
        };
        let reader = job.into_changelog().into_reader(runtime.handle().clone());
        let batches: Box<dyn Iterator<Item = Result<RecordBatch, arrow_schema::ArrowError>>> =
            if c_stream {
                let ffi = reader.into_ffi_stream();
                let back = ArrowArrayStreamReader::try_new(ffi).unwrap();
                assert_eq!(back.schema().field(0).name(), "_epoch");
                Box::new(back)
            } else {
                Box::new(reader)
            };
        let mut net = Net::default();
        for batch in batches {
            let (chunk, epochs) = StreamChunk::from_changelog(&batch.unwrap()).unwrap();
            assert!(epochs.is_some(), "the changelog carries `_epoch`");
            net.add(&chunk);
        }
        assert_eq!(net, Net::of(&model), "c_stream {c_stream}");
    }
}

/// Found by `job_fuzz`: a chunk whose deletes by key are filled from the table left the keys
/// it inserted and then deleted marked as present for the rest of the epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_inserted_then_deleted_beside_a_delete_by_key_is_absent_after() {
    let store = MemoryStore::new();
    let mut model = load(&store);
    let first = StreamChunk::from_text(&schema(), "- 3 NULL\n+ 5000 1\n- 5000 1").unwrap();
    let second = StreamChunk::from_text(&schema(), "+ 5000 2").unwrap();
    model.remove(&3);
    model.insert(5000, 2);
    let no_interval = JobOptions {
        barrier_interval: None,
        ..options()
    };
    let source = source(vec![Change::Chunk(first), Change::Chunk(second)]);
    let job = BackfillJob::start(&store, "view", "t", no_interval, source).unwrap();
    let (net, _) = collect(job).await;
    assert_eq!(net, Net::of(&model));
}

/// Other key shapes: a composite key (Utf8 ascending, Int32 descending) distributed by its
/// first column, a Float64 value, deletes by key as a changelog batch of the key columns only
/// and as NULL values, all checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_descending_key_with_deletes_by_key() {
    use arrow_array::{Array, Float64Array, Int32Array, StringArray};
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, false),
        Field::new("i", DataType::Int32, false),
        Field::new("x", DataType::Float64, true),
    ]));
    let store = MemoryStore::new();
    let desc = TableDesc::new(
        "c",
        schema.clone(),
        vec![KeyColumn::asc("s"), KeyColumn::desc("i")],
    )
    .unwrap()
    .with_distribution_key(&["s"])
    .unwrap();
    let mut model: BTreeMap<(String, i32), f64> = BTreeMap::new();
    for n in 0..500 {
        model.insert((format!("k{}", n % 37), n), n as f64 / 3.0);
    }
    let rows = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(
                model.keys().map(|k| k.0.clone()),
            )),
            Arc::new(Int32Array::from_iter_values(model.keys().map(|k| k.1))),
            Arc::new(Float64Array::from_iter_values(model.values().copied())),
        ],
    )
    .unwrap();
    load_table(
        &store,
        desc,
        RecordBatchIterator::new([Ok(rows)], schema.clone()),
    )
    .unwrap();
    // Deletes by key only: `_op` and the key columns.
    let gone = [("k3".to_string(), 3), ("k5".to_string(), 42)];
    let keys_only = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("_op", DataType::Int8, false),
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, false),
        ])),
        vec![
            Arc::new(Int8Array::from(vec![2, 2])),
            Arc::new(StringArray::from_iter_values(
                gone.iter().map(|k| k.0.clone()),
            )),
            Arc::new(Int32Array::from_iter_values(gone.iter().map(|k| k.1))),
        ],
    )
    .unwrap();
    for key in &gone {
        model.remove(key).expect("a loaded key");
    }
    // An update, an insert, a delete with NULL values, in one chunk.
    let old = model[&("k1".to_string(), 1)];
    let text = format!("U- k1 1 {old}\nU+ k1 1 2.5\n+ new 7 NULL\n- k2 2 NULL");
    let chunk = StreamChunk::from_text(&schema, &text).unwrap();
    model.insert(("k1".to_string(), 1), 2.5);
    model.remove(&("k2".to_string(), 2));
    let source = source(vec![Change::Changelog(keys_only), Change::Chunk(chunk)]);
    let mut job = BackfillJob::start(&store, "view", "c", options(), source).unwrap();
    let mut net: BTreeMap<(String, i32, Option<u64>), i64> = BTreeMap::new();
    while let Some(message) = job.next().await {
        if let Message::Chunk(chunk) = message.unwrap() {
            let b = chunk.batch();
            let (s, i, x) = (
                b.column(0).as_string::<i32>(),
                b.column(1).as_primitive::<arrow_array::types::Int32Type>(),
                b.column(2)
                    .as_primitive::<arrow_array::types::Float64Type>(),
            );
            for (r, op) in chunk.ops().iter().enumerate() {
                let value = x.is_valid(r).then(|| x.value(r).to_bits());
                *net.entry((s.value(r).to_string(), i.value(r), value))
                    .or_default() += if op.is_insert() { 1 } else { -1 };
            }
        }
    }
    net.retain(|_, n| *n != 0);
    let mut expected: BTreeMap<(String, i32, Option<u64>), i64> = (model.iter())
        .map(|((s, i), x)| ((s.clone(), *i, Some(x.to_bits())), 1))
        .collect();
    expected.insert(("new".to_string(), 7, None), 1);
    assert_eq!(net, expected);
}
