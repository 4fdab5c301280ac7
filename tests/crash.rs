//! The replay tool under kills, signals and concurrent runs, end to end with the real binary.
//!
//! - SIGKILL at several moments (during validation and load, mid-backfill, around commits),
//!   then the same command again: the output must verify, every time.
//! - SIGTERM / SIGINT: exit 143 / 130, a message saying how to resume, no `.tmp` left; the
//!   rerun completes.
//! - Two replays into one output directory: the second exits 2 naming the holder.
//! - An output directory overlapping the dataset is refused with exit 2 and the dataset
//!   untouched; an untrusted dataset name never leaves `out/`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::cli::{bin, p, run, signal, spawn, synthetic, text, tmp_files, verified};

fn generate(dir: &Path, name: &str, seed: &str) -> PathBuf {
    synthetic(
        dir.join(name),
        &["--scale", "0.04", "--epochs", "16", "--seed", seed],
    )
}

/// The replay command of these tests: slow enough upstream that kills land mid-run.
fn replay_args<'a>(dataset: &'a Path, out: &'a Path) -> Vec<&'a str> {
    let mut args = common::cli::replay_args(dataset, out);
    args.extend([
        "--vnodes",
        "16",
        "--batch-size",
        "64",
        "--upstream-rate",
        "600",
    ]);
    args
}

fn no_tmp_files(out: &Path) {
    let left = tmp_files(out);
    assert!(left.is_empty(), "leftover {left:?} in {}", out.display());
}

#[test]
fn sigkill_at_any_moment_then_the_same_command_gives_a_verified_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "21");
    // One output per kill moment, killed once, then completed.
    for (i, delay_ms) in [30u64, 150, 400, 800, 1300].into_iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}"));
        let args = replay_args(&dataset, &out);
        let mut child = spawn(&args);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let o = run(&args);
        assert!(
            o.status.success(),
            "rerun after a kill at {delay_ms} ms: {}",
            text(&o)
        );
        verified(&dataset, &out);
        no_tmp_files(&out);
    }
    // One output killed again and again, each rerun resuming further.
    let out = tmp.path().join("out-chain");
    let args = replay_args(&dataset, &out);
    let started = Instant::now();
    let mut finished = false;
    for round in 0..40 {
        let mut child = spawn(&args);
        std::thread::sleep(Duration::from_millis(250 + 37 * (round % 5)));
        if child.try_wait().unwrap().is_some() {
            let o = child.wait_with_output().unwrap();
            assert!(o.status.success(), "round {round}: {}", text(&o));
            finished = true;
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let o = run(&args);
    assert!(o.status.success(), "{}", text(&o));
    if finished {
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("already finished"),
            "{}",
            text(&o)
        );
    }
    verified(&dataset, &out);
    no_tmp_files(&out);
    assert!(started.elapsed() < Duration::from_secs(600));
}

/// Killed mid-run with 3 actors and rescales pending, resumed with 1 actor and other
/// rescales: progress is per vnode, so any parallelism restores it; the output verifies.
#[test]
fn a_run_killed_with_several_actors_resumes_with_another_parallelism() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "33");
    for (i, delay_ms) in [200u64, 700].into_iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}"));
        let mut args = replay_args(&dataset, &out);
        args.extend(["--parallelism", "3", "--rescale", "3:1", "--rescale", "6:2"]);
        let mut child = spawn(&args);
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let mut args = replay_args(&dataset, &out);
        args.extend(["--parallelism", "1", "--rescale", "10:3"]);
        let o = run(&args);
        assert!(
            o.status.success(),
            "resume after {delay_ms} ms: {}",
            text(&o)
        );
        verified(&dataset, &out);
        no_tmp_files(&out);
    }
}

#[test]
fn sigterm_and_sigint_stop_cleanly_and_say_how_to_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "22");
    for (sig, code) in [("TERM", 143), ("INT", 130)] {
        let out = tmp.path().join(format!("out-{sig}"));
        let args = replay_args(&dataset, &out);
        let child = spawn(&args);
        std::thread::sleep(Duration::from_millis(500));
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{}", text(&o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(&format!("SIG{sig}")), "{}", text(&o));
        assert!(stderr.contains("resume"), "{}", text(&o));
        no_tmp_files(&out);
        let o = run(&args);
        assert!(o.status.success(), "{}", text(&o));
        verified(&dataset, &out);
    }
}

#[test]
fn a_second_replay_into_the_same_output_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "23");
    let out = tmp.path().join("out");
    let args = replay_args(&dataset, &out);
    let mut first = spawn(&args);
    // Wait until the first holds the lock.
    let lock = out.join(".lock");
    let started = Instant::now();
    while !lock.exists() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    let second = run(&args);
    let first_done = first.try_wait().unwrap().is_some();
    if !first_done {
        assert_eq!(second.status.code(), Some(2), "{}", text(&second));
        let stderr = String::from_utf8_lossy(&second.stderr);
        assert!(
            stderr.contains(&format!("process {}", first.id())),
            "names the holder: {}",
            text(&second)
        );
    }
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    verified(&dataset, &out);
}

#[test]
fn an_output_overlapping_the_dataset_is_refused_and_the_dataset_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "24");
    let listing = |dir: &Path| {
        let mut names: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        names.sort();
        names
    };
    let before = listing(&dataset);
    for out in [
        dataset.clone(),
        dataset.join("changes"),
        tmp.path().to_path_buf(),
    ] {
        let o = run(&[
            "replay",
            p(&dataset),
            "--out",
            p(&out),
            "--progress",
            "none",
        ]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "--out {}: {}",
            out.display(),
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("overlaps the dataset"),
            "{}",
            text(&o)
        );
        assert_eq!(listing(&dataset), before, "the dataset is untouched");
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn an_untrusted_dataset_name_stays_under_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "ds", "25");
    let manifest = dataset.join("dataset.json");
    let json = std::fs::read_to_string(&manifest).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::create_dir_all(victim.join("changes")).unwrap();
    std::fs::write(
        victim.join("changes/epoch-00000000000000000002.parquet"),
        b"x",
    )
    .unwrap();
    value["name"] = serde_json::Value::String(victim.display().to_string());
    std::fs::write(&manifest, value.to_string()).unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let o = bin()
        .current_dir(&cwd)
        .args(["replay", p(&dataset), "--progress", "none"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        victim
            .join("changes/epoch-00000000000000000002.parquet")
            .exists(),
        "another replay's output is left alone"
    );
    let outs: Vec<_> = std::fs::read_dir(cwd.join("out")).unwrap().collect();
    assert_eq!(outs.len(), 1, "one directory under out/");
}
