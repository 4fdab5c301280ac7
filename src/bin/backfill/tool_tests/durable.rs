//! Crash consistency of the durable replay, at the library level.
//!
//! - *Fault sweep*: a small replay runs with an I/O seam that crashes at its N-th mutating
//!   operation (create, write, fsync, rename, remove, directory sync), for every N the clean
//!   run performs; unsynced bytes are then thrown away, as by a power loss. The same replay
//!   is run again on the real file system: it must resume and its output must verify
//!   (exactly once, every row). A transient-error sweep does the same with one failing
//!   operation.
//! - *Bad state*: a truncated run file, a flipped footer byte, a missing manifest, a manifest
//!   naming a missing file, a state directory of another dataset: each is refused with an
//!   error naming the file, and nothing in the state or output directory changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{EngineError, Error};
use crate::job::replay::{Interrupt, ReplayOptions, run_replay, run_replay_until};
use crate::replay::{Dataset, GenKind, GenOptions, SyntheticShape, generate, verify};
use arrangement_backfill::store::io::{Fault, FaultyIo, RealIo, StorageIo};
use arrangement_backfill::store::{Compaction, DurableOptions};
use arrangement_backfill::vnode::VnodeCount;

use super::common_files::{files_under, log_file};

fn dataset(dir: &Path, name: &str, rows_scale: f64, seed: u64) -> Dataset {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    let path = dir.join(name);
    let mut options = GenOptions::new(&kind, rows_scale);
    options.epochs = 5;
    options.seed = seed;
    generate(&kind, &path, &options).unwrap();
    Dataset::open(&path).unwrap()
}

fn options(out: &Path, io: Arc<dyn StorageIo>) -> ReplayOptions {
    let mut o = ReplayOptions::new(out);
    o.vnodes = VnodeCount::new(4).unwrap();
    o.batch_size = 40;
    o.durable = DurableOptions {
        // Small enough that the load spills, so spill files are swept too.
        memory_budget: 16 << 10,
        max_deltas: 2,
        merge_deltas: 8,
        compaction: Compaction::Inline,
        block_cache: 1 << 20,
        compression: Default::default(),
    };
    o.io = io;
    o
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// After a successful run: the output verifies and nothing temporary is left behind.
fn check_complete(dataset: &Dataset, out: &Path) {
    verify(dataset, out)
        .unwrap_or_else(|e| panic!("output of {} does not verify: {e}", out.display()));
    for entry in std::fs::read_dir(out.join("changes")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(!name.ends_with(".tmp"), "leftover {name}");
    }
}

fn sweep(fault: Fault) {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), "ds", 0.003, 11);
    let rt = runtime();
    // A clean run counts the operations.
    let counter = Arc::new(FaultyIo::new(RealIo::shared(), None, fault));
    let clean = tmp.path().join("clean");
    rt.block_on(run_replay(&data, &options(&clean, counter.clone()), |_| {}))
        .unwrap();
    check_complete(&data, &clean);
    let total = counter.operations();
    assert!(
        total > 50,
        "only {total} operations: the sweep would cover little"
    );
    let mut crashed = 0;
    for n in 1..=total {
        let out = tmp.path().join(format!("out-{n}"));
        let faulty = Arc::new(FaultyIo::new(RealIo::shared(), Some(n), fault));
        let first = rt.block_on(run_replay(&data, &options(&out, faulty.clone()), |_| {}));
        if first.is_err() {
            crashed += 1;
            if fault == Fault::Crash {
                faulty.lose_unsynced().unwrap();
            }
        }
        drop(faulty);
        // Run again on the real file system: it resumes (or restarts) and completes.
        let second = rt.block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}));
        if let Err(e) = second {
            panic!("after a {fault:?} at operation {n} ({first:?}) the rerun failed: {e}");
        }
        check_complete(&data, &out);
        std::fs::remove_dir_all(&out).unwrap();
    }
    // A crash stops everything after it; a transient failure of a best-effort removal (an
    // obsolete file, a temporary file after an error) is absorbed, and rightly so.
    let expected = match fault {
        Fault::Crash => total - 2,
        Fault::Fail => total * 3 / 4,
    };
    assert!(
        crashed as u64 >= expected,
        "most operations must have hit the fault ({crashed}/{total})"
    );
}

#[test]
fn a_crash_at_every_io_operation_resumes_to_a_verified_output() {
    sweep(Fault::Crash);
}

#[test]
fn a_failed_io_operation_anywhere_leaves_a_resumable_state() {
    sweep(Fault::Fail);
}

/// Runs a replay slowly and interrupts it part way: a committed but unfinished state.
fn interrupted_state(tmp: &Path, data: &Dataset, name: &str) -> PathBuf {
    let out = tmp.join(name);
    let mut o = options(&out, RealIo::shared());
    o.upstream_rate = Some(250);
    o.durable.compaction = Compaction::Background;
    let rt = runtime();
    let result = rt.block_on(run_replay_until(&data.clone(), &o, |_| {}, async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Interrupt::Terminate
    }));
    match result {
        Err(Error::Interrupted {
            committed: Some(e), ..
        }) => assert!(e > 1, "interrupted after the load"),
        other => panic!("expected an interruption, got {other:?}"),
    }
    out
}

fn run_files(state: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    files
}

#[test]
fn an_interrupted_replay_resumes_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), "ds", 0.01, 3);
    let out = interrupted_state(tmp.path(), &data, "out");
    let rt = runtime();
    let summary = rt
        .block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}))
        .unwrap();
    assert!(summary.resumed_from.is_some_and(|e| e > 1));
    assert!(summary.changes_already_applied > 0);
    check_complete(&data, &out);
    // Once finished, running it again does nothing.
    let again = rt
        .block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}))
        .unwrap();
    assert!(again.already_finished);
}

#[test]
fn bad_state_directories_are_refused_and_left_as_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), "ds", 0.01, 5);
    type Damage = fn(&Path) -> PathBuf;
    let cases: [(&str, Damage, &str); 6] = [
        (
            "truncated run file",
            |state| {
                let f = run_files(state)[0].clone();
                let bytes = std::fs::read(&f).unwrap();
                std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
                f
            },
            "truncated",
        ),
        (
            "flipped footer byte",
            |state| {
                let f = run_files(state)[0].clone();
                let mut bytes = std::fs::read(&f).unwrap();
                let at = bytes.len() - 20;
                bytes[at] ^= 0x10;
                std::fs::write(&f, &bytes).unwrap();
                f
            },
            "checksum",
        ),
        (
            "missing manifest",
            |state| {
                let f = state.join("MANIFEST");
                std::fs::remove_file(&f).unwrap();
                f
            },
            "MANIFEST",
        ),
        (
            "manifest naming a missing file",
            |state| {
                let f = run_files(state)[0].clone();
                std::fs::remove_file(&f).unwrap();
                f
            },
            "missing",
        ),
        (
            // Issue 41 item 12: reported as a missing run file, not as the log.
            "deleted manifest log",
            |state| {
                let f = log_file(state);
                std::fs::remove_file(&f).unwrap();
                f
            },
            "missing",
        ),
        (
            "manifest log cut inside its header",
            |state| {
                let f = log_file(state);
                let bytes = std::fs::read(&f).unwrap();
                std::fs::write(&f, &bytes[..10]).unwrap();
                f
            },
            "truncated",
        ),
    ];
    let rt = runtime();
    for (i, (what, damage, message)) in cases.into_iter().enumerate() {
        let out = interrupted_state(tmp.path(), &data, &format!("out-{i}"));
        let named = damage(&out.join("state"));
        let before = files_under(&out);
        let err = rt
            .block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}))
            .expect_err(what);
        assert!(err.is_bad_input(), "{what}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(&named.file_name().unwrap().to_string_lossy().to_string()),
            "{what}: the error names {}: {text}",
            named.display()
        );
        assert!(text.contains(message), "{what}: {text}");
        assert_eq!(files_under(&out), before, "{what}: nothing changed");
    }
    // A state directory of another dataset.
    let other = dataset(tmp.path(), "other", 0.01, 6);
    let out = interrupted_state(tmp.path(), &data, "out-other");
    let before = files_under(&out);
    let err = rt
        .block_on(run_replay(&other, &options(&out, RealIo::shared()), |_| {}))
        .expect_err("another dataset");
    assert!(matches!(err, Error::StateConflict { .. }), "{err}");
    assert!(err.to_string().contains("another replay"), "{err}");
    assert_eq!(files_under(&out), before, "nothing changed");
    // ... and another vnode count.
    let mut o = options(&out, RealIo::shared());
    o.vnodes = VnodeCount::new(8).unwrap();
    let err = rt.block_on(run_replay(&data, &o, |_| {})).unwrap_err();
    assert!(err.to_string().contains("vnode count"), "{err}");
    assert_eq!(files_under(&out), before, "nothing changed");
}

/// A [`StorageIo`] that tells when the first run file is created (the snapshot load has
/// spilled its first piece) and slows every later run file's creation a little, so the load
/// is surely still going when a signal comes.
#[derive(Debug)]
struct LoadGate {
    started: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl StorageIo for LoadGate {
    fn create(
        &self,
        path: &Path,
    ) -> std::io::Result<Box<dyn arrangement_backfill::store::io::WriteFile>> {
        if path.extension().is_some_and(|e| e == "arrow") {
            if let Some(tx) = self.started.lock().unwrap().take() {
                let _ = tx.send(());
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        RealIo.create(path)
    }
    fn open(
        &self,
        path: &Path,
    ) -> std::io::Result<Box<dyn arrangement_backfill::store::io::ReadFile>> {
        RealIo.open(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        RealIo.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        RealIo.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        RealIo.sync_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        RealIo.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        RealIo.list(dir)
    }
    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        RealIo.exists(path)
    }
}

/// A signal during the snapshot load stops it between batches: nothing is committed (the
/// load is not run to its commit first), nothing half-written is left, and the same replay
/// then runs to a verified end.
#[test]
fn a_signal_during_the_load_stops_it_before_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    // Over 64k rows: several load batches, and with a small budget many spilled pieces.
    let data = dataset(tmp.path(), "ds", 2.0, 21);
    let out = tmp.path().join("out");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let gate = Arc::new(LoadGate {
        started: std::sync::Mutex::new(Some(tx)),
    });
    let mut o = options(&out, gate);
    o.batch_size = 1024;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(run_replay_until(&data, &o, |_| {}, async move {
        let _ = rx.await;
        Interrupt::Interrupt
    }));
    match result {
        Err(Error::Interrupted {
            committed: None,
            code: 130,
            ..
        }) => {}
        other => panic!("expected an interruption before the load's commit, got {other:?}"),
    }
    let rerun = rt.block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}));
    let summary = rerun.unwrap();
    assert_eq!(
        summary.resumed_from, None,
        "nothing was committed to resume from"
    );
    check_complete(&data, &out);
}

/// Copies the files of `from` into `to` (created), directories included.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// A durable job taking over an in-memory run's output, crashed at every one of its first
/// operations (while it removes that output and names itself in the output's record): the
/// same command again always runs to a verified end, never refusing an output that no
/// committed job owns.
#[test]
fn a_takeover_crashed_part_way_is_taken_over_again() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), "ds", 0.003, 12);
    let rt = runtime();
    let template = tmp.path().join("memory-output");
    let mut memory = options(&template, RealIo::shared());
    memory.state = crate::job::replay::StateChoice::Memory;
    rt.block_on(run_replay(&data, &memory, |_| {})).unwrap();
    let files = std::fs::read_dir(template.join("changes")).unwrap().count();
    assert!(files > 3, "a few files to remove: {files}");
    for n in 1..=files as u64 + 30 {
        let out = tmp.path().join(format!("out-{n}"));
        copy_tree(&template, &out);
        let faulty = Arc::new(FaultyIo::new(RealIo::shared(), Some(n), Fault::Crash));
        let first = rt.block_on(run_replay(&data, &options(&out, faulty.clone()), |_| {}));
        assert!(first.is_err(), "crash at operation {n} did not fire");
        faulty.lose_unsynced().unwrap();
        drop(faulty);
        let second = rt.block_on(run_replay(&data, &options(&out, RealIo::shared()), |_| {}));
        if let Err(e) = second {
            panic!("after a crash at operation {n} the rerun failed: {e}");
        }
        check_complete(&data, &out);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// Issue 42 item 8: a rescale to more actors than vnodes is refused before anything is
/// loaded, also when it asks for as many actors as the (capped) initial parallelism.
#[test]
fn a_rescale_beyond_the_vnodes_is_refused_before_the_load() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), "ds", 0.003, 5);
    let out = tmp.path().join("out");
    let mut o = options(&out, RealIo::shared());
    o.parallelism = 8;
    o.rescales = vec!["2:8".parse().unwrap()];
    let err = runtime()
        .block_on(run_replay(&data, &o, |_| {}))
        .unwrap_err();
    assert!(
        matches!(err, Error::Engine(EngineError::InvalidConfig(_))),
        "{err}"
    );
    assert!(
        err.to_string().contains("8 backfill actors for 4 vnodes"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is created");
    // The capped initial parallelism alone is fine.
    o.rescales.clear();
    runtime().block_on(run_replay(&data, &o, |_| {})).unwrap();
    check_complete(&data, &out);
}
