//! The snapshot load of `backfill replay` killed with SIGKILL (the real binary) at several
//! moments: the next run resumes the load after the rows the killed run's load steps
//! committed (its summary says where), never loads them again, and its output verifies.
//!
//! The moments are found by reading the state's committed job values while the run goes
//! (`durable::committed_meta`, which neither locks nor changes the directory): the load's
//! record (`upstream.<table>.load`) counts its committed steps.

use std::path::Path;
use std::time::{Duration, Instant};

use arrangement_backfill::LoadProgress;
use arrangement_backfill::store::durable::committed_meta;
use arrangement_backfill::store::io::RealIo;

mod common;
use common::cli::{ok, replay_args, signal, spawn, synthetic, text, verified};

/// Snapshot rows of the dataset (synthetic, scale 3).
const ROWS: u64 = 300_000;
/// Rows per load step: the smallest the feed's batches (8192 rows) allow.
const STEP: &str = "8192";

/// The load record in the state `dir` (committed so far), if any.
fn load_record(dir: &Path) -> Option<LoadProgress> {
    let meta = committed_meta(&RealIo, dir).ok()??;
    let (_, value) = meta
        .iter()
        .find(|(k, _)| k.starts_with("upstream.") && k.ends_with(".load"))?;
    serde_json::from_str(value).ok()
}

/// `n` as the summary prints it: 196,608.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Starts a replay of `dataset` into `out`, kills it with SIGKILL once its load has committed
/// `steps` steps (0: as soon as its state directory exists), and returns what its state then
/// holds of the load.
fn kill_during_load(dataset: &Path, out: &Path, steps: u64) -> Option<LoadProgress> {
    kill_during_load_with(dataset, out, steps, &[], "state")
}

/// [`kill_during_load`] with `extra` options, the state in `OUT/<state>`.
fn kill_during_load_with(
    dataset: &Path,
    out: &Path,
    steps: u64,
    extra: &[&str],
    state: &str,
) -> Option<LoadProgress> {
    let mut args = replay_args(dataset, out);
    args.extend(["--load-step-rows", STEP]);
    args.extend_from_slice(extra);
    let mut child = spawn(&args);
    let state = out.join(state);
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the load never committed {steps} steps"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the replay ended ({status}) before its load committed {steps} steps: {}",
                text(&child.wait_with_output().unwrap())
            );
        }
        let due = match steps {
            0 => state.join("MANIFEST").exists(),
            _ => load_record(&state).is_some_and(|r| r.steps >= steps),
        };
        if due {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    signal(&child, "KILL");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), None, "killed by a signal");
    load_record(&state)
}

#[test]
fn a_replay_killed_during_its_load_resumes_the_load_where_its_last_step_left_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = synthetic(
        tmp.path().join("ds"),
        &["--scale", "3", "--epochs", "5", "--changes", "3000"],
    );
    for steps in [0, 1, 4, 12] {
        let out = tmp.path().join(format!("out-{steps}"));
        let left = kill_during_load(&dataset, &out, steps);
        let resumed = ok(&replay_args(&dataset, &out));
        let stdout = String::from_utf8_lossy(&resumed.stdout).into_owned();
        match left {
            Some(load) if !load.complete => {
                assert!(load.steps >= steps && load.rows > 0, "{load:?}");
                assert!(load.rows < ROWS, "{load:?}");
                let line = format!(
                    "load resumed at {} of {} rows",
                    thousands(load.rows),
                    thousands(ROWS)
                );
                assert!(stdout.contains(&line), "missing {line:?}: {stdout}");
            }
            // Killed before the first step: the next run loads from the start.
            None if steps == 0 => {
                assert!(!stdout.contains("load resumed"), "{stdout}");
            }
            other => panic!("after a kill at {steps} steps the state holds {other:?}"),
        }
        verified(&dataset, &out);
        // The finished job says so: nothing is loaded again.
        let again = ok(&replay_args(&dataset, &out));
        let again = String::from_utf8_lossy(&again.stdout).into_owned();
        assert!(again.contains("already finished"), "{again}");
    }
}

/// A load killed twice resumes twice, each time after the last committed step.
#[test]
fn a_load_killed_twice_resumes_after_each_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = synthetic(
        tmp.path().join("ds"),
        &["--scale", "3", "--epochs", "5", "--changes", "3000"],
    );
    let out = tmp.path().join("out");
    let first = kill_during_load(&dataset, &out, 2).expect("a load record");
    let second = kill_during_load(&dataset, &out, first.steps + 3).expect("a load record");
    assert!(
        second.rows > first.rows,
        "the second run went on from the first's steps: {first:?}, then {second:?}"
    );
    if !second.complete {
        let resumed = ok(&replay_args(&dataset, &out));
        let stdout = String::from_utf8_lossy(&resumed.stdout).into_owned();
        assert!(
            stdout.contains(&format!("load resumed at {}", thousands(second.rows))),
            "{stdout}"
        );
    } else {
        ok(&replay_args(&dataset, &out));
    }
    verified(&dataset, &out);
}

/// A shard's load holds its own rows only: killed after some steps, it resumes after them
/// (counted after the shard's filter, not as dataset rows), and the two shards' output
/// verifies together.
#[test]
fn a_shards_load_killed_resumes_after_its_own_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = synthetic(
        tmp.path().join("ds"),
        &["--scale", "3", "--epochs", "5", "--changes", "3000"],
    );
    let out = tmp.path().join("out");
    let shard = ["--shard", "1/2"];
    let left = kill_during_load_with(&dataset, &out, 3, &shard, "state.shard-1-of-2")
        .expect("a load record");
    let mut args = replay_args(&dataset, &out);
    args.extend_from_slice(&shard);
    let resumed = ok(&args);
    let stdout = String::from_utf8_lossy(&resumed.stdout).into_owned();
    if !left.complete {
        assert!(
            stdout.contains(&format!("load resumed at {}", thousands(left.rows))),
            "{stdout}"
        );
    }
    let mut args = replay_args(&dataset, &out);
    args.extend(["--shard", "0/2"]);
    ok(&args);
    verified(&dataset, &out);
}
