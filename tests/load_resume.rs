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

/// What the state `dir` (committed so far) holds of the validation beside the load: the
/// snapshot row its last checkpoint is at, and whether it passed.
fn validation_record(dir: &Path) -> (Option<u64>, bool) {
    let Some(meta) = committed_meta(&RealIo, dir).ok().flatten() else {
        return (None, false);
    };
    let checkpoint = meta
        .get("replay.validation_checkpoint")
        .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
        .and_then(|v| v["checkpoint"]["snapshot_rows"].as_u64());
    (checkpoint, meta.contains_key("replay.validated"))
}

/// Asserts that a resumed run's summary `stdout` says how its validation began, given
/// what the killed run's state held of it ([`validation_record`]).
fn assert_validation_line(stdout: &str, (checkpoint, validated): (Option<u64>, bool)) {
    match (validated, checkpoint) {
        (true, _) => assert!(!stdout.contains("validation "), "{stdout}"),
        (false, Some(rows)) => {
            let line = format!(
                "validation resumed at {} of {} snapshot rows",
                thousands(rows),
                thousands(ROWS)
            );
            assert!(stdout.contains(&line), "missing {line:?}: {stdout}");
        }
        (false, None) => assert!(stdout.contains("validation started over"), "{stdout}"),
    }
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
    let mut validations_resumed = 0;
    for steps in [0, 1, 4, 12, 20] {
        let out = tmp.path().join(format!("out-{steps}"));
        let left = kill_during_load(&dataset, &out, steps);
        let validation = validation_record(&out.join("state"));
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
                // The validation beside the load resumed from the checkpoint that the
                // load's last step committed.
                assert_validation_line(&stdout, validation);
                validations_resumed += usize::from(validation.0.is_some() && !validation.1);
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
        // Its checkpoints are gone once the validation's outcome is committed.
        assert!(!out.join("state/validation").exists(), "checkpoints left");
    }
    assert!(
        validations_resumed > 0,
        "no kill left a validation checkpoint"
    );
}

/// A validation checkpoint whose files are not as it recorded them (here one byte of one
/// changed) is not resumed from: the validation starts over, and the output is exact.
#[test]
fn a_damaged_validation_checkpoint_is_not_resumed_from() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = synthetic(
        tmp.path().join("ds"),
        &["--scale", "3", "--epochs", "5", "--changes", "3000"],
    );
    let out = tmp.path().join("out");
    let state = out.join("state");
    let mut args = replay_args(&dataset, &out);
    args.extend(["--load-step-rows", STEP]);
    let mut child = spawn(&args);
    let started = Instant::now();
    // Until a checkpoint naming a file is committed, the load still under way.
    let file = loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended first"
        );
        let named = committed_meta(&RealIo, &state)
            .ok()
            .flatten()
            .and_then(|m| m.get("replay.validation_checkpoint").cloned())
            .and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok())
            .and_then(|v| {
                let segments = v["checkpoint"]["sort"]["segments"].as_array()?.clone();
                segments
                    .iter()
                    .filter_map(|p| p.as_array()?.first()?["name"].as_str().map(String::from))
                    .next()
            });
        if let Some(name) = named {
            break name;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    signal(&child, "KILL");
    child.wait().unwrap();
    let (checkpoint, validated) = validation_record(&state);
    assert!(checkpoint.is_some() && !validated);
    let path = state.join("validation").join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let resumed = ok(&replay_args(&dataset, &out));
    let stdout = String::from_utf8_lossy(&resumed.stdout).into_owned();
    assert!(stdout.contains("validation started over"), "{stdout}");
    verified(&dataset, &out);
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
