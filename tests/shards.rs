//! Shards end to end (`backfill replay --shard I/N`, issue 45): the bundled dataset replayed
//! as 2 and as 3 shards into one output verifies exactly once together, and each shard alone
//! does not (verify names the missing shard); a shard restarted with another N (or given
//! another shard's state) is refused with exit 2; `--shard auto` reads each batch scheduler's
//! variables; a shard killed with SIGKILL resumes with the same command.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

mod common;
use common::cli::{bin, ok, p, refused, replay_args, run, spawn, text, tmp_files};

/// The dataset bundled with the repository.
fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/tpch-lineitem-sf0.01")
}

/// `replay DATASET --out OUT --progress none --shard SHARD EXTRA..`.
fn shard_args<'a>(dataset: &'a Path, out: &'a Path, shard: &'a str) -> Vec<&'a str> {
    let mut args = replay_args(dataset, out);
    args.extend(["--shard", shard]);
    args
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The published files of `out` named for `shard` (`shard-I-of-N`).
fn shard_files(out: &Path, tag: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out.join("changes"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(&format!(".{tag}.parquet")))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn two_and_three_shards_verify_together_and_not_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    for n in [2u32, 3] {
        let out = tmp.path().join(format!("out-{n}"));
        let mut total_output = 0u64;
        for i in 0..n {
            let shard = format!("{i}/{n}");
            let o = ok(&shard_args(&dataset, &out, &shard));
            let s = stdout(&o);
            assert!(
                s.contains(&format!("shard             {shard}")),
                "{}",
                text(&o)
            );
            assert!(s.contains("downstream == upstream"), "{}", text(&o));
            assert!(
                !shard_files(&out, &format!("shard-{i}-of-{n}")).is_empty(),
                "{}",
                text(&o)
            );
            total_output += s
                .lines()
                .find_map(|l| l.trim().strip_prefix("output rows"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap();
            if i + 1 < n {
                // Not all shards yet: verify names the missing ones.
                let o = run(&["verify", p(&dataset), p(&out)]);
                let missing = format!("shard {}/{n}", i + 1);
                refused(&o, &["missing", &missing]);
            }
        }
        let o = ok(&["verify", p(&dataset), p(&out)]);
        let s = stdout(&o);
        let all: Vec<String> = (0..n).map(|i| format!("{i}/{n}")).collect();
        assert!(s.contains(&all.join(", ")), "{}", text(&o));
        assert!(
            s.contains(&format!("{total_output} output rows")),
            "{}",
            text(&o)
        );
        assert!(s.contains("downstream == upstream"), "{}", text(&o));
        // Each shard's state apart; a shard run again has nothing to do.
        for i in 0..n {
            assert!(out.join(format!("state.shard-{i}-of-{n}")).is_dir());
        }
        let o = ok(&shard_args(&dataset, &out, &format!("0/{n}")));
        assert!(stdout(&o).contains("already finished"), "{}", text(&o));
    }
    // One shard alone in its own output: verify refuses it, naming the others.
    let out = tmp.path().join("alone");
    ok(&shard_args(&dataset, &out, "1/3"));
    let o = run(&["verify", p(&dataset), p(&out)]);
    refused(&o, &["shard 0/3, shard 2/3 is missing", "seen: 1/3"]);
}

#[test]
fn another_n_or_another_shards_state_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    let out = tmp.path().join("out");
    ok(&shard_args(&dataset, &out, "0/2"));
    // Another N into the same output: refused before anything is written.
    let before = std::fs::read_dir(out.join("changes")).unwrap().count();
    for shard in ["0/3", "2/3"] {
        let o = run(&shard_args(&dataset, &out, shard));
        refused(&o, &["2 shards'", "another N is refused"]);
    }
    let o = run(&replay_args(&dataset, &out));
    refused(&o, &["2 shards'"]);
    // --fresh does not make it mix either.
    let mut fresh = shard_args(&dataset, &out, "0/3");
    fresh.push("--fresh");
    refused(&run(&fresh), &["2 shards'"]);
    assert_eq!(
        std::fs::read_dir(out.join("changes")).unwrap().count(),
        before
    );
    // The shard's state given to another shard (or another N): the state records its shard.
    let state = out.join("state.shard-0-of-2");
    for shard in ["1/2", "1/3"] {
        let other = tmp
            .path()
            .join(format!("other-{}", shard.replace('/', "-")));
        let mut args = shard_args(&dataset, &other, shard);
        args.extend(["--state", p(&state)]);
        let o = run(&args);
        refused(&o, &["shard: the state has shard 0/2"]);
    }
    // An unsharded output takes no shard.
    let whole = tmp.path().join("whole");
    ok(&replay_args(&dataset, &whole));
    refused(&run(&shard_args(&dataset, &whole, "0/2")), &["unsharded"]);
    // Usage: more shards than vnodes, a shard beyond N, --shards disagreeing.
    let o = run(&[
        "replay",
        p(&dataset),
        "--out",
        p(&tmp.path().join("x")),
        "--vnodes",
        "4",
        "--shard",
        "0/5",
    ]);
    refused(&o, &["at most 4 shards"]);
    refused(
        &run(&shard_args(&dataset, &tmp.path().join("y"), "2/2")),
        &["0 <= I < N"],
    );
    let z = tmp.path().join("z");
    let mut args = shard_args(&dataset, &z, "0/2");
    args.extend(["--shards", "3"]);
    refused(&run(&args), &["--shards says 3"]);
}

/// `replay --shard auto` under `vars` (and no other scheduler variable).
fn auto(dataset: &Path, out: &Path, extra: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut args = shard_args(dataset, out, "auto");
    args.extend_from_slice(extra);
    let mut cmd = bin();
    cmd.args(&args);
    for name in [
        "JOB_COMPLETION_INDEX",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_ARRAY_TASK_STEP",
        "AWS_BATCH_JOB_ARRAY_INDEX",
        "BACKFILL_SHARDS",
    ] {
        cmd.env_remove(name);
    }
    cmd.envs(vars.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn shard_auto_reads_each_schedulers_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    // Kubernetes indexed Job: the index, N from --shards.
    let k8s = tmp.path().join("k8s");
    for i in ["0", "1"] {
        let o = auto(
            &dataset,
            &k8s,
            &["--shards", "2"],
            &[("JOB_COMPLETION_INDEX", i)],
        );
        assert!(o.status.success(), "{}", text(&o));
        assert!(stdout(&o).contains(&format!("shard             {i}/2")));
    }
    ok(&["verify", p(&dataset), p(&k8s)]);
    // Slurm array --array=3-5: ids from SLURM_ARRAY_TASK_MIN, N from the array.
    let slurm = tmp.path().join("slurm");
    for id in ["3", "4", "5"] {
        let o = auto(
            &dataset,
            &slurm,
            &[],
            &[
                ("SLURM_ARRAY_TASK_ID", id),
                ("SLURM_ARRAY_TASK_MIN", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = ok(&["verify", p(&dataset), p(&slurm)]);
    assert!(stdout(&o).contains("0/3, 1/3, 2/3"), "{}", text(&o));
    // AWS Batch array job: the index, N from BACKFILL_SHARDS.
    let aws = tmp.path().join("aws");
    for i in ["1", "0"] {
        let o = auto(
            &dataset,
            &aws,
            &[],
            &[("AWS_BATCH_JOB_ARRAY_INDEX", i), ("BACKFILL_SHARDS", "2")],
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    ok(&["verify", p(&dataset), p(&aws)]);
    // Nothing to go by, or no N: a clear error, exit 2, nothing written.
    let none = tmp.path().join("none");
    refused(
        &auto(&dataset, &none, &[], &[]),
        &["JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID", "--shard I/N"],
    );
    refused(
        &auto(&dataset, &none, &[], &[("JOB_COMPLETION_INDEX", "0")]),
        &["--shards N", "BACKFILL_SHARDS"],
    );
    assert!(!none.exists());
}

#[test]
fn a_shard_killed_with_sigkill_resumes_and_the_shards_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    let out = tmp.path().join("out");
    // Shard 1 slowed down so that the kill lands mid-run.
    let slow = |shard: &'static str| -> Vec<String> {
        let mut args: Vec<String> = shard_args(&dataset, &out, shard)
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--upstream-rate", "3000", "--batch-size", "256"].map(String::from));
        args
    };
    let args = slow("1/2");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Both shards at once, as a scheduler runs them; shard 1 killed twice mid-run.
    let mut other = spawn(&shard_args(&dataset, &out, "0/2"));
    for (round, delay_ms) in [0u64, 300].into_iter().enumerate() {
        let mut child = spawn(&args);
        // Once it has published more files (it is past its load and committing), kill it.
        let published = shard_files(&out, "shard-1-of-2").len();
        let started = std::time::Instant::now();
        while shard_files(&out, "shard-1-of-2").len() <= published + round {
            assert!(
                child.try_wait().unwrap().is_none(),
                "it ended before the kill"
            );
            assert!(started.elapsed() < Duration::from_secs(120));
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    let o = run(&args);
    assert!(o.status.success(), "{}", text(&o));
    let s = stdout(&o);
    assert!(
        s.contains("resumed from checkpoint") || s.contains("already finished"),
        "{}",
        text(&o)
    );
    assert!(other.wait().unwrap().success());
    let _ = other.stdout.take();
    let o = ok(&["verify", p(&dataset), p(&out)]);
    assert!(stdout(&o).contains("0/2, 1/2"), "{}", text(&o));
    assert!(tmp_files(&out).is_empty(), "{:?}", tmp_files(&out));
}

/// `backfill ARGS` with the S3 server's environment.
fn with_s3(server: &common::s3::S3Server, args: &[&str]) -> std::process::Command {
    let mut command = bin();
    command.args(args);
    for (key, value) in server.env() {
        command.env(key, value);
    }
    command
}

#[test]
fn two_shards_at_once_into_one_bucket_verify_together() {
    let Some(server) = common::s3::S3Server::start() else {
        return;
    };
    let _bucket = server.bucket("shards");
    let tmp = tempfile::tempdir().unwrap();
    let dataset = bundled();
    let url = "s3://shards/lineitem";
    let caches: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("c{i}"))).collect();
    // Both shards at once, each from its own cache, with no coordination.
    let children: Vec<std::process::Child> = (0..2)
        .map(|i| {
            let shard = format!("{i}/2");
            let args = [
                "replay",
                p(&dataset),
                "--out",
                url,
                "--cache",
                p(&caches[i]),
                "--progress",
                "none",
                "--shard",
                &shard,
            ];
            with_s3(&server, &args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(stdout(&o).contains("uploaded"), "{}", text(&o));
    }
    let o = with_s3(&server, &["verify", p(&dataset), url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(stdout(&o).contains("0/2, 1/2"), "{}", text(&o));
    assert!(
        stdout(&o).contains("downstream == upstream"),
        "{}",
        text(&o)
    );
    // Another N on that output is refused; a lone shard's output is not complete.
    let (c3, c4) = (tmp.path().join("c3"), tmp.path().join("c4"));
    let args = [
        "replay",
        p(&dataset),
        "--out",
        url,
        "--cache",
        p(&c3),
        "--progress",
        "none",
        "--shard",
        "0/3",
    ];
    refused(&with_s3(&server, &args).output().unwrap(), &["2 shards'"]);
    let lone = "s3://shards/lone";
    let args = [
        "replay",
        p(&dataset),
        "--out",
        lone,
        "--cache",
        p(&c4),
        "--progress",
        "none",
        "--shard",
        "1/2",
    ];
    let o = with_s3(&server, &args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = with_s3(&server, &["verify", p(&dataset), lone])
        .output()
        .unwrap();
    refused(&o, &["shard 0/2 is missing"]);
}
