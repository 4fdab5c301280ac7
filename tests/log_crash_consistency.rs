//! Crash consistency of the durable store's manifest log (issue 41), in the manner of redb's
//! `crash_consistency` tests and SQLite's WAL checks: a real log is built by committing
//! epochs through [`DurableStore`], then damaged every way a crash or a bad disk can damage it
//! (each bit of each frame field of each record, sampled bits of each body, the header's
//! bits, a cut at every byte, zero-filled tails), and the store is reopened each time. Every
//! case must be either exactly the committed prefix the log holds (the epoch of the last
//! record kept, with that epoch's rows; records dropped only at the very end, with nothing
//! valid after them) or refused with `Error::CorruptState` naming the log file, leaving the
//! directory as it was. A committed epoch whose record is followed by a valid record is never
//! rolled back.
//!
//! The frame layout is the one `store::durable::log` documents, parsed here independently:
//! a 20-byte header, then per record `len (u32) | seq (u64) | offset (u64) | head_crc (u32) |
//! body_crc (u32) | body`, the body starting with `flags (u8) | committed_epoch (u64)`.
//!
//! Also: the log of the manifest's generation deleted or cut shorter than its header is
//! refused naming the log (it was durable before the manifest), and a newer log left by a
//! rewrite that crashed before its commit point is removed on open.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrangement_backfill::Error;
use arrangement_backfill::chunk::{Op, StreamChunk};
use arrangement_backfill::key::KeyColumn;
use arrangement_backfill::store::io::RealIo;
use arrangement_backfill::store::{
    Compaction, DurableOptions, DurableStore, SnapshotScan, StateStore, StateTable,
};
use arrangement_backfill::table::TableDesc;
use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::files::log_file;

const VNODES: usize = 4;
const HEADER_LEN: usize = 20;
const FRAME_LEN: usize = 28;

type Rows = BTreeMap<i64, String>;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn desc() -> TableDesc {
    TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(VNODES).unwrap())
}

fn options() -> DurableOptions {
    DurableOptions {
        memory_budget: 1 << 20,
        compaction: Compaction::Manual,
        block_cache: 1 << 20,
        ..DurableOptions::default()
    }
}

fn open(dir: &Path) -> arrangement_backfill::Result<DurableStore> {
    DurableStore::open_with(dir, RealIo::shared(), options())
}

/// Epoch `epoch`'s changes: epoch 1 loads 120 keys, later ones insert, update and delete a
/// few, spread over the vnodes.
fn changes(epoch: u64) -> Vec<(i64, Op, String)> {
    if epoch == 1 {
        return (0..120).map(|k| (k, Op::Insert, format!("a{k}"))).collect();
    }
    let e = epoch as i64;
    vec![
        (1000 + e, Op::Insert, format!("new{e}")),
        (e * 7, Op::Delete, format!("a{}", e * 7)),
        (e * 7 + 1, Op::UpdateDelete, format!("a{}", e * 7 + 1)),
        (e * 7 + 1, Op::UpdateInsert, format!("u{e}")),
    ]
}

fn chunk(changes: &[(i64, Op, String)]) -> StreamChunk {
    let keys = Int64Array::from(changes.iter().map(|c| c.0).collect::<Vec<_>>());
    let vals = StringArray::from(changes.iter().map(|c| c.2.as_str()).collect::<Vec<_>>());
    let batch =
        arrow_array::RecordBatch::try_new(schema(), vec![Arc::new(keys), Arc::new(vals)]).unwrap();
    StreamChunk::new(batch, changes.iter().map(|c| c.1).collect::<Vec<_>>()).unwrap()
}

/// The rows after each epoch (index = epoch).
fn models(last: u64) -> Vec<Rows> {
    let mut rows = Rows::new();
    let mut out = vec![rows.clone()];
    for epoch in 1..=last {
        for (k, op, v) in changes(epoch) {
            match op {
                Op::Insert | Op::UpdateInsert => {
                    rows.insert(k, v);
                }
                Op::Delete | Op::UpdateDelete => {
                    rows.remove(&k);
                }
            }
        }
        out.push(rows.clone());
    }
    out
}

fn commit_epochs(store: &DurableStore, epochs: std::ops::RangeInclusive<u64>) {
    let all = VnodeBitmap::full(VnodeCount::new(VNODES).unwrap());
    let mut writer = store.table("t", all).unwrap();
    for epoch in epochs {
        writer.write(&chunk(&changes(epoch))).unwrap();
        writer.seal(epoch).unwrap();
        store.commit(epoch).unwrap();
    }
}

/// The epoch the manifest holds when the log starts, and the last committed epoch.
const MANIFEST_EPOCH: u64 = 2;
const LAST_EPOCH: u64 = 8;

/// A store whose manifest holds epoch 2 and whose log holds one record per epoch 3..=8:
/// epoch 1 in a first session, then a second session whose first commit (epoch 2) rewrites
/// the manifest and whose later commits append to the new log.
fn build(dir: &Path) {
    let store = open(dir).unwrap();
    store.create_table(desc()).unwrap();
    commit_epochs(&store, 1..=1);
    drop(store);
    let store = open(dir).unwrap();
    commit_epochs(&store, MANIFEST_EPOCH..=LAST_EPOCH);
}

/// A record of the log, located by this test's own reading of the documented format.
#[derive(Debug, Clone, Copy)]
struct Record {
    start: usize,
    body_len: usize,
    epoch: u64,
}

impl Record {
    fn end(&self) -> usize {
        self.start + FRAME_LEN + self.body_len
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn records(log: &[u8]) -> Vec<Record> {
    assert_eq!(&log[..8], b"ABMLOG02");
    let mut at = HEADER_LEN;
    let mut out = Vec::new();
    while at < log.len() {
        let body_len = u32_at(log, at) as usize;
        assert_eq!(u64_at(log, at + 4), out.len() as u64, "seq");
        assert_eq!(u64_at(log, at + 12), at as u64, "offset");
        let body = at + FRAME_LEN;
        assert_eq!(log[body], 1, "a committed epoch follows");
        out.push(Record {
            start: at,
            body_len,
            epoch: u64_at(log, body + 1),
        });
        at = body + body_len;
    }
    assert_eq!(at, log.len());
    out
}

/// What reopening must give.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// The manifest's state plus the log's first `n` records.
    Prefix(usize),
    /// `Error::CorruptState` naming the log file.
    Refused,
}

/// Every file of a directory with its bytes, the lock aside.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "LOCK")
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// Puts the directory back to `pristine` (an open that kept a prefix removes the files of
/// the records it dropped).
fn restore(dir: &Path, pristine: &BTreeMap<String, Vec<u8>>) {
    let now: BTreeMap<String, u64> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "LOCK")
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            (name, e.metadata().unwrap().len())
        })
        .collect();
    for name in now.keys() {
        if !pristine.contains_key(name) {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
    }
    for (name, bytes) in pristine {
        if now.get(name) != Some(&(bytes.len() as u64)) {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

/// Every committed row of the table at `epoch`.
fn rows_of(store: &DurableStore, epoch: u64) -> Rows {
    let count = VnodeCount::new(VNODES).unwrap();
    let table = store.table("t", VnodeBitmap::full(count)).unwrap();
    let mut out = Rows::new();
    for vnode in count.vnodes() {
        let mut scan = table.scan(vnode, None, epoch, 64).unwrap();
        while let Some(b) = scan.next_batch().unwrap() {
            let keys = b.batch.column(0).as_primitive::<Int64Type>();
            let vals = b.batch.column(1).as_string::<i32>();
            for i in 0..b.num_rows() {
                out.insert(keys.value(i), vals.value(i).to_string());
            }
        }
    }
    out
}

struct Harness {
    dir: tempfile::TempDir,
    log_path: PathBuf,
    log_name: String,
    log: Vec<u8>,
    records: Vec<Record>,
    pristine: BTreeMap<String, Vec<u8>>,
    models: Vec<Rows>,
    cases: usize,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        let log_path = log_file(dir.path());
        let log = std::fs::read(&log_path).unwrap();
        let records = records(&log);
        let epochs: Vec<u64> = records.iter().map(|r| r.epoch).collect();
        assert_eq!(
            epochs,
            (MANIFEST_EPOCH + 1..=LAST_EPOCH).collect::<Vec<_>>(),
            "one record per commit after the manifest's"
        );
        Self {
            log_name: log_path.file_name().unwrap().to_string_lossy().to_string(),
            pristine: snapshot(dir.path()),
            models: models(LAST_EPOCH),
            dir,
            log_path,
            log,
            records,
            cases: 0,
        }
    }

    /// The epoch the manifest and the log's first `n` records commit.
    fn epoch_of_prefix(&self, n: usize) -> u64 {
        n.checked_sub(1)
            .map_or(MANIFEST_EPOCH, |last| self.records[last].epoch)
    }

    /// Writes `bytes` as the log, reopens the store and checks the outcome is `expect`.
    fn check(&mut self, bytes: &[u8], expect: Expect, what: &str) {
        self.cases += 1;
        std::fs::write(&self.log_path, bytes).unwrap();
        let before = snapshot(self.dir.path());
        match (open(self.dir.path()), expect) {
            (Ok(store), Expect::Prefix(n)) => {
                let epoch = self.epoch_of_prefix(n);
                assert_eq!(
                    store.committed_epoch().unwrap(),
                    Some(epoch),
                    "{what}: the prefix of {n} records"
                );
                assert_eq!(
                    rows_of(&store, epoch),
                    self.models[epoch as usize],
                    "{what}: the rows of epoch {epoch}"
                );
            }
            (Ok(store), Expect::Refused) => panic!(
                "{what}: opened at epoch {:?} instead of being refused (a rollback of \
                 committed epochs followed by valid records)",
                store.committed_epoch().unwrap()
            ),
            (Err(err), Expect::Refused) => {
                assert!(
                    matches!(err, Error::CorruptState { .. }),
                    "{what}: not CorruptState: {err}"
                );
                let text = err.to_string();
                assert!(
                    text.contains(&self.log_name),
                    "{what}: names the log: {text}"
                );
                assert_eq!(
                    snapshot(self.dir.path()),
                    before,
                    "{what}: a refusal changes nothing"
                );
            }
            (Err(err), Expect::Prefix(n)) => {
                panic!("{what}: refused instead of the prefix of {n} records: {err}")
            }
        }
        restore(self.dir.path(), &self.pristine);
    }

    /// Flips bit `bit` of byte `at` and checks that the record holding it is dropped as a
    /// torn tail when it is the last, and that the log is refused otherwise.
    fn flip(&mut self, at: usize, bit: u32, field: &str) {
        let mut bytes = self.log.clone();
        bytes[at] ^= 1 << bit;
        let last = self.records.len() - 1;
        let (index, expect) = match self.records.iter().position(|r| at < r.end()) {
            Some(i) if i == last => (i, Expect::Prefix(last)),
            Some(i) => (i, Expect::Refused),
            None => unreachable!("byte {at} is in no record"),
        };
        self.check(
            &bytes,
            expect,
            &format!("record {index}, {field}: byte {at} bit {bit}"),
        );
    }
}

#[test]
fn every_damage_to_a_real_log_is_its_committed_prefix_or_refused() {
    let start = std::time::Instant::now();
    let mut h = Harness::new();
    let mut rng = StdRng::seed_from_u64(0x41_06);
    // The intact log: everything.
    let log = h.log.clone();
    h.check(&log, Expect::Prefix(h.records.len()), "the intact log");
    // Each bit of each frame field of each record, and sampled bits of each body.
    let fields = [
        ("len", 0, 4),
        ("seq", 4, 12),
        ("offset", 12, 20),
        ("head_crc", 20, 24),
        ("body_crc", 24, 28),
    ];
    for r in h.records.clone() {
        for (field, from, to) in fields {
            for at in r.start + from..r.start + to {
                for bit in 0..8 {
                    h.flip(at, bit, field);
                }
            }
        }
        let body = r.start + FRAME_LEN;
        let mut sampled = vec![body, body + 1, r.end() - 1];
        sampled.extend((0..20).map(|_| rng.random_range(body..r.end())));
        for at in sampled {
            let bit = rng.random_range(0..8);
            h.flip(at, bit, "body");
        }
    }
    // The header: magic, generation, checksum.
    for at in 0..HEADER_LEN {
        for bit in 0..8 {
            let mut bytes = log.clone();
            bytes[at] ^= 1 << bit;
            h.check(
                &bytes,
                Expect::Refused,
                &format!("header byte {at} bit {bit}"),
            );
        }
    }
    // A cut at every byte: the records wholly kept (a log shorter than its header is refused:
    // it was durable before the manifest that names it).
    for cut in 0..log.len() {
        let expect = if cut < HEADER_LEN {
            Expect::Refused
        } else {
            Expect::Prefix(h.records.iter().filter(|r| r.end() <= cut).count())
        };
        h.check(&log[..cut], expect, &format!("cut at byte {cut}"));
    }
    // Zero-filled tails: after the log, after a cut, over the last record.
    let last = *h.records.last().unwrap();
    let n = h.records.len();
    for (keep, zeros) in [
        (log.len(), 1),
        (log.len(), FRAME_LEN),
        (log.len(), 8192),
        (last.start, 8192),
        (last.start + 5, 100),
        (last.start + FRAME_LEN + 3, 4096),
    ] {
        let mut bytes = log[..keep].to_vec();
        bytes.resize(keep + zeros, 0);
        let expect = Expect::Prefix(if keep == log.len() { n } else { n - 1 });
        h.check(&bytes, expect, &format!("{zeros} zeros after byte {keep}"));
    }
    let mut bytes = log.clone();
    bytes[last.start..].fill(0);
    h.check(&bytes, Expect::Prefix(n - 1), "the last record zeroed");
    // Zeros over a middle record, a valid record after them: refused.
    let mut bytes = log.clone();
    let middle = h.records[n / 2];
    bytes[middle.start..middle.end()].fill(0);
    h.check(&bytes, Expect::Refused, "a middle record zeroed");
    // Bytes lost from a middle record: the records after it are moved, still found.
    let mut bytes = log.clone();
    bytes.drain(middle.start + 3..middle.start + 10);
    h.check(&bytes, Expect::Refused, "bytes lost in a middle record");
    // A copy of the first record appended: not where it says it starts, and nothing valid
    // after it: a torn tail.
    let mut bytes = log.clone();
    let first = h.records[0];
    bytes.extend_from_slice(&log[first.start..first.end()]);
    h.check(&bytes, Expect::Prefix(n), "the first record appended again");
    eprintln!(
        "{} cases over a log of {} records ({} bytes) in {:?}",
        h.cases,
        n,
        log.len(),
        start.elapsed()
    );
}

#[test]
fn a_missing_or_headerless_log_of_the_manifest_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let path = log_file(dir.path());
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let pristine = snapshot(dir.path());
    let log = pristine[&name].clone();
    type Damage = fn(&Path, &[u8]);
    let cases: [(&str, Damage, &str); 3] = [
        (
            "deleted",
            |p, _| std::fs::remove_file(p).unwrap(),
            "missing",
        ),
        (
            "emptied",
            |p, _| std::fs::write(p, b"").unwrap(),
            "truncated",
        ),
        (
            "cut inside its header",
            |p, log| std::fs::write(p, &log[..HEADER_LEN - 1]).unwrap(),
            "truncated",
        ),
    ];
    for (what, damage, message) in cases {
        damage(&path, &log);
        let before = snapshot(dir.path());
        let err = open(dir.path()).expect_err(what);
        assert!(matches!(err, Error::CorruptState { .. }), "{what}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(&name) && text.contains(message),
            "{what}: names {name}: {text}"
        );
        assert!(
            !text.contains(".arrow"),
            "{what}: names the log, not a run file: {text}"
        );
        assert_eq!(snapshot(dir.path()), before, "{what}: nothing changed");
        restore(dir.path(), &pristine);
    }
    assert_eq!(
        open(dir.path()).unwrap().committed_epoch().unwrap(),
        Some(LAST_EPOCH)
    );
}

#[test]
fn a_newer_log_is_removed_when_it_holds_only_a_header_and_refused_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let path = log_file(dir.path());
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let generation: u64 = name["LOG-".len()..].parse().unwrap();
    let newer = dir.path().join(format!("LOG-{:020}", generation + 1));
    let log = std::fs::read(&path).unwrap();
    // A rewrite that crashed between creating the next log and renaming its manifest: the
    // next log holds its header, or less.
    for len in [0, 7, HEADER_LEN] {
        std::fs::write(&newer, &log[..len]).unwrap();
        let store = open(dir.path()).unwrap();
        assert_eq!(store.committed_epoch().unwrap(), Some(LAST_EPOCH));
        assert!(
            !newer.exists(),
            "the unfinished rewrite's log of {len} bytes is removed"
        );
        // The next commit's rewrite creates it again.
        drop(store);
    }
    // A newer log with records: the manifest was replaced by an older one.
    std::fs::write(&newer, &log).unwrap();
    let err = open(dir.path()).expect_err("a newer log with records");
    let text = err.to_string();
    assert!(
        text.contains(&format!("LOG-{:020}", generation + 1)) && text.contains("newer"),
        "{text}"
    );
    std::fs::remove_file(&newer).unwrap();
    // Commits after the reopen rewrite the manifest: the new generation's log is there.
    let store = open(dir.path()).unwrap();
    commit_epochs(&store, LAST_EPOCH + 1..=LAST_EPOCH + 1);
    drop(store);
    let after = log_file(dir.path());
    assert_ne!(after, path);
    std::fs::remove_file(&after).unwrap();
    let err = open(dir.path()).expect_err("the new log deleted");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_destroyed_store_keeps_its_log_before_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    arrangement_backfill::store::durable::destroy(RealIo::shared().as_ref(), dir.path()).unwrap();
    let names: Vec<String> = snapshot(dir.path()).into_keys().collect();
    let log = log_file(dir.path());
    assert_eq!(
        names,
        [
            log.file_name().unwrap().to_string_lossy().to_string(),
            "MANIFEST".to_string()
        ],
        "only the empty manifest and its log"
    );
    assert_eq!(open(dir.path()).unwrap().committed_epoch().unwrap(), None);
    std::fs::remove_file(&log).unwrap();
    let err = open(dir.path()).expect_err("the empty manifest's log deleted");
    let text = err.to_string();
    assert!(text.contains("LOG-") && text.contains("missing"), "{text}");
}

/// A new store whose first rewrite (table creation) crashed after creating its log, before
/// its manifest: the log is a leftover, and the directory opens as a new store.
#[test]
fn a_first_rewrite_that_crashed_before_its_manifest_leaves_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    let header_only = {
        let other = tempfile::tempdir().unwrap();
        open(other.path()).unwrap().create_table(desc()).unwrap();
        let log = log_file(other.path());
        (
            log.file_name().unwrap().to_owned(),
            std::fs::read(&log).unwrap(),
        )
    };
    assert_eq!(header_only.1.len(), HEADER_LEN);
    std::fs::write(dir.path().join(&header_only.0), &header_only.1).unwrap();
    let store = open(dir.path()).unwrap();
    assert_eq!(store.committed_epoch().unwrap(), None);
    assert!(store.table_desc("t").unwrap().is_none());
    assert!(!dir.path().join(&header_only.0).exists());
}
