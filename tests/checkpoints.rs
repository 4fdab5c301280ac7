//! Checkpoints on object storage (issue 45 item 3), against a real S3 protocol server
//! (moto, see `common::s3`): a replay killed with SIGKILL whose local cache is then deleted
//! (a lost machine) resumes from the bucket's latest checkpoint with the same command, at
//! several kill moments, whole or as one shard of two; two workers continuing one output
//! from the same checkpoint never both commit (one stops with exit 2), and the output
//! verifies exactly once; listings taken meanwhile only ever hold whole committed files.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cli::{bin, p, text};
use common::s3::{S3Server, list};

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/tpch-lineitem-sf0.01")
}

fn command(server: &S3Server, args: &[&str]) -> std::process::Command {
    let mut command = bin();
    command.args(args);
    for (key, value) in server.env() {
        command.env(key, value);
    }
    command
}

fn run(server: &S3Server, args: &[&str]) -> Output {
    command(server, args).output().expect("the binary runs")
}

fn spawn(server: &S3Server, args: &[&str]) -> Child {
    command(server, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Waits until the bucket holds `checkpoints` checkpoints of `state` (a prefix) or the
/// child ended; panics after a minute.
fn wait_for_checkpoints(
    store: &object_store::aws::AmazonS3,
    state: &str,
    checkpoints: usize,
    child: &mut Child,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    loop {
        assert!(Instant::now() < deadline, "no checkpoint within a minute");
        let names = list(store, state);
        let numbers: Vec<&String> = names
            .iter()
            .filter(|n| n.contains("/checkpoint-"))
            .collect();
        // The latest checkpoint's number only grows.
        let latest = numbers.len();
        seen = seen.max(latest);
        if let Some(last) = numbers.last() {
            let n: usize = last
                .rsplit("checkpoint-")
                .next()
                .and_then(|s| s.strip_suffix(".json"))
                .and_then(|s| s.parse().ok())
                .unwrap();
            if n >= checkpoints {
                return;
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended before its checkpoint {checkpoints}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each output file readers see holds whole Parquet (its footer's magic at the end).
fn visible_files(store: &object_store::aws::AmazonS3, prefix: &str) -> Vec<String> {
    let names = list(store, &format!("{prefix}/changes"));
    assert!(
        names.iter().all(|n| n.ends_with(".parquet")),
        "a file readers would see is not an output file: {names:?}"
    );
    names
}

/// Kills a replay at its `kill_at`-th checkpoint, deletes its cache (a lost machine) and
/// runs the same command again: it restores the bucket's latest checkpoint and resumes;
/// the output verifies. `extra` adds options to the replay (a shard).
fn killed_and_restored(server: &S3Server, bucket: &str, kill_at: usize, extra: &[&str]) {
    let store = server.bucket(bucket);
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let dataset = bundled();
    let url = format!("s3://{bucket}/lineitem");
    let mut args = vec![
        "replay",
        p(&dataset),
        "--out",
        &url,
        "--cache",
        p(&cache),
        "--progress",
        "none",
    ];
    args.extend_from_slice(extra);
    let slow = [
        &args[..],
        &["--rate-limit", "8000", "--upstream-rate", "3000"],
    ]
    .concat();
    let state = match (
        extra.iter().position(|a| *a == "--shard"),
        extra.iter().position(|a| *a == "--checkpoint-url"),
    ) {
        (_, Some(i)) => extra[i + 1]
            .strip_prefix(&format!("s3://{bucket}/"))
            .unwrap()
            .to_string(),
        (Some(i), None) => format!(
            "lineitem/_backfill-state.shard-{}",
            extra[i + 1].replace('/', "-of-")
        ),
        (None, None) => "lineitem/_backfill-state".to_string(),
    };
    let mut child = spawn(server, &slow);
    wait_for_checkpoints(&store, &state, kill_at, &mut child);
    let before = visible_files(&store, "lineitem");
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(&cache).unwrap();
    // The same command on an empty cache.
    let o = run(server, &args);
    assert!(o.status.success(), "kill at {kill_at}: {}", text(&o));
    assert!(
        stdout(&o).contains("restored          checkpoint"),
        "kill at {kill_at}: {}",
        text(&o)
    );
    let after = visible_files(&store, "lineitem");
    assert!(
        before.iter().all(|n| after.contains(n)),
        "a published file went away: {before:?} then {after:?}"
    );
    // Nothing staged is left once every checkpoint is published.
    let staged = list(&store, &format!("{state}/changes"));
    assert!(staged.is_empty(), "{staged:?}");
}

#[test]
fn a_replay_on_an_empty_cache_restores_the_latest_checkpoint_at_any_kill_moment() {
    let Some(server) = S3Server::start() else {
        return;
    };
    for (i, kill_at) in [1, 5].into_iter().enumerate() {
        let bucket = format!("restore{i}");
        // The second with its checkpoints elsewhere (`--checkpoint-url`).
        let elsewhere = format!("s3://{bucket}/checkpoints/lineitem");
        let extra: &[&str] = match i {
            0 => &[],
            _ => &["--checkpoint-url", &elsewhere],
        };
        killed_and_restored(&server, &bucket, kill_at, extra);
        if i > 0 {
            let objects = list(&server.bucket(&bucket), "lineitem/_backfill-state");
            assert!(objects.is_empty(), "{objects:?}");
        }
        let url = format!("s3://{bucket}/lineitem");
        let v = run(&server, &["verify", p(&bundled()), &url]);
        assert!(v.status.success(), "kill at {kill_at}: {}", text(&v));
    }
}

#[test]
fn a_shard_killed_and_restored_on_an_empty_cache_verifies_with_the_other() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let bucket = "sharded";
    let url = format!("s3://{bucket}/lineitem");
    let _store = server.bucket(bucket);
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("c0");
    let dataset = bundled();
    let shard0 = [
        "replay",
        p(&dataset),
        "--out",
        &url,
        "--cache",
        p(&other),
        "--progress",
        "none",
        "--shard",
        "0/2",
    ];
    let zero = spawn(&server, &shard0);
    killed_and_restored(&server, bucket, 3, &["--shard", "1/2"]);
    let o = zero.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v = run(&server, &["verify", p(&dataset), &url]);
    assert!(v.status.success(), "{}", text(&v));
    assert!(stdout(&v).contains("0/2, 1/2"), "{}", text(&v));
}

#[test]
fn two_workers_continuing_one_checkpoint_never_both_commit() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let bucket = "fenced";
    let store = server.bucket(bucket);
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    let url = format!("s3://{bucket}/lineitem");
    let args = |cache: &Path| -> Vec<String> {
        [
            "replay",
            p(&dataset),
            "--out",
            &url,
            "--cache",
            p(cache),
            "--progress",
            "none",
            "--rate-limit",
            "6000",
            "--upstream-rate",
            "2000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args_a = args(&a);
    let args_b = args(&b);
    let mut first = spawn(&server, &refs(&args_a));
    wait_for_checkpoints(&store, "lineitem/_backfill-state", 2, &mut first);
    // A second worker, on an empty cache, takes the output over from the same checkpoint
    // while the first goes on (a machine presumed lost that was not).
    let second = spawn(&server, &refs(&args_b));
    let second = second.wait_with_output().unwrap();
    let first = first.wait_with_output().unwrap();
    let codes = [first.status.code(), second.status.code()];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(2)),
        "one finishes, one stops: {codes:?}\n{}\n{}",
        text(&first),
        text(&second)
    );
    let loser = if first.status.code() == Some(2) {
        &first
    } else {
        &second
    };
    assert!(text(loser).contains("another worker"), "{}", text(loser));
    let v = run(&server, &["verify", p(&dataset), &url]);
    assert!(v.status.success(), "{}", text(&v));
}
