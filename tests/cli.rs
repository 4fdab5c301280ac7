//! The `backfill` command line end to end: generated datasets of both key shapes replayed and
//! verified under every mode, bad input rejected with status 2 and a message naming where,
//! tampered output caught, and the bundled dataset replayed and verified.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrangement_backfill::chunk::{StreamChunk, changelog_schema};
use arrow_array::{Int8Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

mod common;
use common::cli::run as backfill;
use common::cli::{bin, ok, p as path, published, refused, replay_args, signal, synthetic, text};
use common::dataset::{write_dataset, write_parquet};
use common::files::files_under;

/// `backfill replay DATASET --out OUT --progress none --verify EXTRA..`, which must succeed,
/// verify, and print a matching completion certificate; its output and stdout.
fn replay_verified(dataset: &Path, out: &Path, extra: &[&str]) -> (Output, String) {
    let mut args = replay_args(dataset, out);
    args.push("--verify");
    args.extend_from_slice(extra);
    let o = ok(&args);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(stdout.contains("verified"), "{}", text(&o));
    assert!(stdout.contains("downstream == upstream"), "{}", text(&o));
    (o, stdout)
}

fn generate(dir: &Path, shape: &str, seed: &str) -> PathBuf {
    synthetic(
        dir.join(format!("ds-{shape}-{seed}")),
        &[
            "--scale", "0.03", "--epochs", "12", "--seed", seed, "--shape", shape,
        ],
    )
}

#[test]
fn generated_datasets_replay_exactly_once_in_every_mode() {
    let tmp = tempfile::tempdir().unwrap();
    for shape in ["int64", "composite"] {
        let dataset = generate(tmp.path(), shape, "7");
        let modes: [&[&str]; 5] = [
            &["--order", "merged", "--checkpoint-every", "1"],
            &["--order", "vnode", "--checkpoint-every", "1"],
            &[
                "--order",
                "merged",
                "--checkpoint-every",
                "5",
                "--batch-size",
                "100",
            ],
            &[
                "--order",
                "vnode",
                "--checkpoint-every",
                "5",
                "--upstream-rate",
                "20000",
            ],
            &[
                "--order",
                "merged",
                "--upstream-rate",
                "20000",
                "--barrier-interval-ms",
                "5",
                "--vnodes",
                "16",
            ],
        ];
        for (i, mode) in modes.iter().enumerate() {
            let out = tmp.path().join(format!("out-{shape}-{i}"));
            let (o, stdout) = replay_verified(&dataset, &out, mode);
            assert!(stdout.contains("snapshot rows"), "{}", text(&o));
            ok(&["verify", path(&dataset), path(&out)]);
        }
    }
}

/// Exactly-once replays, verified, with 1 to 3 actors over 1, 64 and 256 vnodes, and online
/// rescales up and down mid-backfill.
#[test]
fn parallel_replays_and_online_rescales_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "composite", "11");
    let runs: [(&str, &str, &[&str]); 7] = [
        ("1", "1", &[]),
        ("64", "1", &[]),
        ("64", "2", &[]),
        ("256", "3", &[]),
        ("64", "3", &["--rescale", "2:1", "--rescale", "5:3"]),
        ("256", "1", &["--rescale", "1:3", "--rescale", "4:2"]),
        ("64", "2", &["--rescale", "3:2", "--checkpoint-every", "3"]),
    ];
    for (i, (vnodes, parallelism, extra)) in runs.into_iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}"));
        let mut args = vec![
            "--vnodes",
            vnodes,
            "--parallelism",
            parallelism,
            "--batch-size",
            "50",
            "--upstream-rate",
            "20000",
        ];
        args.extend_from_slice(extra);
        let (o, stdout) = replay_verified(&dataset, &out, &args);
        let rescales = extra.iter().filter(|a| **a == "--rescale").count();
        assert!(
            stdout.contains(&format!("{rescales} online rescales")),
            "{}",
            text(&o)
        );
    }
    // More actors than vnodes, and a malformed rescale, are usage errors.
    let out = tmp.path().join("out-bad");
    for bad in [
        &["--vnodes", "4", "--parallelism", "5"][..],
        &["--rescale", "3"][..],
        &["--vnodes", "4", "--rescale", "3:9"][..],
    ] {
        let mut args = vec!["replay", path(&dataset), "--out", path(&out)];
        args.extend_from_slice(bad);
        let o = backfill(&args);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
    }
}

#[test]
fn plain_progress_reports_on_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "int64", "3");
    let out = tmp.path().join("out");
    let started = std::time::Instant::now();
    let o = ok(&[
        "replay",
        path(&dataset),
        "--out",
        path(&out),
        "--progress",
        "plain",
        "--rate-limit",
        "1000",
    ]);
    // 3000 snapshot rows at 1000 rows/s: the twelve epochs' owed reads take at most 100 rows
    // each, so the rest needs well over a second.
    assert!(
        started.elapsed().as_secs_f64() > 1.0,
        "the rate limit was not honoured"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("vnodes done"), "{}", text(&o));
    // Rows read never pass the total (upstream inserts read by the snapshot raise the total).
    for line in stderr.lines().filter(|l| l.starts_with("snapshot ")) {
        let fraction = line["snapshot ".len()..].split(' ').next().unwrap();
        let (read, total) = fraction.split_once('/').unwrap();
        let (read, total): (u64, u64) = (read.parse().unwrap(), total.parse().unwrap());
        assert!(read <= total, "past 100%: {line}");
    }
}

#[test]
fn verify_catches_tampered_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "int64", "11");
    let out = tmp.path().join("out");
    ok(&[
        "replay",
        path(&dataset),
        "--out",
        path(&out),
        "--progress",
        "none",
    ]);
    let o = ok(&["verify", path(&dataset), path(&out)]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("certificate") && stdout.contains("downstream == upstream per vnode"),
        "verify prints the completion certificate: {}",
        text(&o)
    );
    // Drop the last output file: the changes of the last checkpoint are missing.
    std::fs::remove_file(published(&out).last().unwrap()).unwrap();
    let o = backfill(&["verify", path(&dataset), path(&out)]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("error"),
        "{}",
        text(&o)
    );
}

#[test]
fn the_bundled_dataset_replays_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let dataset = Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/tpch-lineitem-sf0.01");
    let o = ok(&[
        "replay",
        path(&dataset),
        "--out",
        path(&out),
        "--progress",
        "none",
        "--verify",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("60175"), "{}", text(&o));
    assert!(stdout.contains("verified"), "{}", text(&o));
}

#[test]
fn usage_errors_exit_two() {
    assert_eq!(backfill(&["replay"]).status.code(), Some(2));
    assert_eq!(
        backfill(&["replay", "x", "--order", "sideways"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(backfill(&["frobnicate"]).status.code(), Some(2));
}

// ---- bad input: tiny datasets written by hand ----

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]))
}

fn snapshot(text: &str) -> RecordBatch {
    let chunk: String = text.lines().map(|l| format!("+ {l}\n")).collect();
    StreamChunk::from_text(&schema(), &chunk)
        .unwrap()
        .batch()
        .clone()
}

fn changes(epochs: &[(u64, &str)]) -> RecordBatch {
    let batches: Vec<RecordBatch> = epochs
        .iter()
        .map(|(e, t)| {
            StreamChunk::from_text(&schema(), t)
                .unwrap()
                .to_changelog(Some(*e))
                .unwrap()
        })
        .collect();
    arrow_select::concat::concat_batches(&changelog_schema(&schema(), true), &batches).unwrap()
}

const MANIFEST: &str = r#"{"name": "t", "primary_key": ["k"]}"#;

/// Runs a replay of a bad dataset: exit 2, a message with every `needle`, no output written.
fn rejects(dir: &Path, needles: &[&str]) {
    let out = dir.with_extension("out");
    refused(&backfill(&replay_args(dir, &out)), needles);
    assert!(!out.exists(), "nothing may be written on bad input");
}

#[test]
fn bad_datasets_exit_two_with_file_row_and_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let good = snapshot("1 a\n2 b\n3 c");
    let d = |name: &str| tmp.path().join(name);

    write_dataset(&d("no-manifest"), None, &good, None);
    rejects(&d("no-manifest"), &["dataset.json"]);

    write_dataset(&d("bad-json"), Some("{\"name\": "), &good, None);
    rejects(&d("bad-json"), &["dataset.json"]);

    write_dataset(
        &d("unknown-key"),
        Some(r#"{"name": "t", "primary_key": ["nope"]}"#),
        &good,
        None,
    );
    rejects(&d("unknown-key"), &["nope"]);

    write_dataset(
        &d("dup-key"),
        Some(MANIFEST),
        &snapshot("1 a\n2 b\n2 c"),
        None,
    );
    rejects(&d("dup-key"), &["part-0.parquet", "row 2"]);

    write_dataset(
        &d("null-key"),
        Some(MANIFEST),
        &snapshot("1 a\nNULL b"),
        None,
    );
    rejects(&d("null-key"), &["part-0.parquet", "row 1"]);

    let log = changes(&[(1, "+ 4 d"), (2, "- 1 a")]);
    let mut columns = log.columns().to_vec();
    columns[1] = Arc::new(Int8Array::from(vec![1, 9]));
    let unknown_op = RecordBatch::try_new(log.schema(), columns).unwrap();
    write_dataset(&d("unknown-op"), Some(MANIFEST), &good, Some(&unknown_op));
    rejects(&d("unknown-op"), &["changes", "row 1", "9"]);

    let decreasing = changes(&[(5, "+ 4 d"), (3, "+ 5 e")]);
    write_dataset(&d("decreasing"), Some(MANIFEST), &good, Some(&decreasing));
    rejects(&d("decreasing"), &["changes", "row 1", "epoch"]);

    let absent = changes(&[(1, "+ 4 d"), (2, "- 9 z")]);
    write_dataset(&d("absent"), Some(MANIFEST), &good, Some(&absent));
    rejects(&d("absent"), &["changes", "epoch 2", "row 1"]);

    let existing = changes(&[(1, "+ 2 b")]);
    write_dataset(&d("existing"), Some(MANIFEST), &good, Some(&existing));
    rejects(&d("existing"), &["changes", "row 0"]);

    let lone = changes(&[(1, "- 1 a")]);
    let mut columns = lone.columns().to_vec();
    columns[1] = Arc::new(Int8Array::from(vec![3]));
    let lone = RecordBatch::try_new(lone.schema(), columns).unwrap();
    write_dataset(&d("lone-update"), Some(MANIFEST), &good, Some(&lone));
    rejects(&d("lone-update"), &["changes", "row 0"]);

    write_dataset(&d("not-parquet"), Some(MANIFEST), &good, None);
    std::fs::write(d("not-parquet").join("changes.parquet"), b"x").ok();
    std::fs::create_dir_all(d("not-parquet").join("changes")).unwrap();
    std::fs::write(
        d("not-parquet").join("changes/part-0.parquet"),
        b"not parquet at all",
    )
    .unwrap();
    rejects(&d("not-parquet"), &["changes/part-0.parquet"]);

    let other = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("w", DataType::Int32, true),
    ]));
    let mismatched = StreamChunk::from_text(&other, "+ 4 7")
        .unwrap()
        .to_changelog(Some(1))
        .unwrap();
    write_dataset(&d("schema"), Some(MANIFEST), &good, Some(&mismatched));
    rejects(&d("schema"), &["changes"]);

    let no_epoch = StreamChunk::from_text(&schema(), "+ 4 d")
        .unwrap()
        .to_changelog(None)
        .unwrap();
    write_dataset(&d("no-epoch"), Some(MANIFEST), &good, Some(&no_epoch));
    rejects(&d("no-epoch"), &["_epoch"]);
}

/// Bad input never costs an earlier output: into existing directories (even with `--fresh`)
/// the dataset is validated before anything is touched; into new ones the validation runs
/// beside the snapshot load, and the directories the replay created are removed again.
#[test]
fn bad_input_keeps_an_earlier_output_and_leaves_no_new_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = |name: &str| tmp.path().join(name);
    let log = changes(&[(1, "+ 4 d"), (2, "- 1 a")]);
    write_dataset(
        &d("good"),
        Some(MANIFEST),
        &snapshot("1 a\n2 b\n3 c"),
        Some(&log),
    );
    write_dataset(&d("bad"), Some(MANIFEST), &snapshot("1 a\n2 b\n2 c"), None);
    let bad = d("bad");
    let replay_bad = |out: &Path, extra: &[&str]| {
        let mut args = replay_args(&bad, out);
        args.extend_from_slice(extra);
        refused(&backfill(&args), &["row 2"]);
    };
    let out = d("out");
    replay_verified(&d("good"), &out, &[]);
    let before = files_under(&out.join("changes"));
    for extra in [&[][..], &["--fresh"][..], &["--memory"][..]] {
        replay_bad(&out, extra);
        assert_eq!(files_under(&out.join("changes")), before, "{extra:?}");
    }
    ok(&["verify", path(&d("good")), path(&out)]);
    replay_bad(&d("new/deeper/out"), &[]);
    assert!(
        !d("new").exists(),
        "a new output directory is removed again"
    );
    let elsewhere = d("elsewhere/state");
    replay_bad(&d("out2"), &["--state", path(&elsewhere)]);
    assert!(!d("out2").exists() && !d("elsewhere").exists());
    replay_bad(&d("out3"), &["--memory"]);
    assert!(!d("out3").exists());
}

#[test]
fn a_reader_that_goes_away_is_not_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "int64", "5");
    let out = tmp.path().join("out");
    // Like `backfill replay ... | head -0`: stdout is a pipe whose reader is already gone,
    // so every write to it fails with a broken pipe.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bin()
        .args([
            "replay",
            path(&dataset),
            "--out",
            path(&out),
            "--progress",
            "none",
            "--verify",
        ])
        .stdout(writer)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("panicked"),
        "{}",
        text(&o)
    );
}

// ---- scratch space, the output rule, the output lock ----

/// A generated dataset and its replayed output, big enough that `verify` with a 64 KiB sort
/// budget spills for a few seconds (debug build).
fn spilling_output(dir: &Path) -> (PathBuf, PathBuf) {
    let dataset = dir.join("ds");
    ok(&[
        "gen",
        "synthetic",
        "--out",
        path(&dataset),
        "--scale",
        "0.5",
        "--epochs",
        "12",
    ]);
    let out = dir.join("out");
    ok(&[
        "replay",
        path(&dataset),
        "--out",
        path(&out),
        "--progress",
        "none",
    ]);
    (dataset, out)
}

/// `backfill verify` with its scratch in `scratch` (`TMPDIR`) and a 64 KiB sort budget,
/// started.
fn verify_spilling(dataset: &Path, out: &Path, scratch: &Path) -> std::process::Child {
    bin()
        .args(["verify", path(dataset), path(out)])
        .env("TMPDIR", scratch)
        .env("BACKFILL_TEST_SORT_MEMORY", "65536")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs")
}

/// The sort scratch directories in `scratch`, once one holds a spilled run (waits for it).
fn spilled_scratch(scratch: &Path, child: &mut std::process::Child) -> Vec<PathBuf> {
    let started = std::time::Instant::now();
    loop {
        let dirs = scratch_dirs(scratch);
        let spilled = dirs.iter().any(|d| {
            std::fs::read_dir(d).is_ok_and(|mut e| {
                e.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".arrow")))
            })
        });
        if spilled {
            return dirs;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("verify ended ({status}) before it spilled");
        }
        assert!(started.elapsed().as_secs() < 120, "no spill in 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The `backfill-sort-*` entries in `scratch`.
fn scratch_dirs(scratch: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scratch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("backfill-sort-")
        })
        .collect();
    dirs.sort();
    dirs
}

/// A `kill -9` during `verify`'s sort leaves its scratch behind; the next run removes it
/// (its owner is dead: its lock is free) and nothing else.
#[test]
fn a_killed_verifys_scratch_is_removed_by_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (dataset, out) = spilling_output(tmp.path());
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let others = [
        scratch.join("backfill-sort-mine"),
        scratch.join("unrelated"),
    ];
    for dir in &others {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("LOCK"), b"").unwrap();
    }
    let mut child = verify_spilling(&dataset, &out, &scratch);
    let spilled = spilled_scratch(&scratch, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    let left = scratch_dirs(&scratch);
    assert_eq!(left.len(), 2, "the killed run's scratch stays: {left:?}");
    assert!(spilled.iter().all(|d| left.contains(d)));

    let o = backfill_in(&["verify", path(&dataset), path(&out)], &scratch);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        scratch_dirs(&scratch),
        vec![others[0].clone()],
        "the dead run's scratch is removed, nothing else"
    );
    assert!(others.iter().all(|d| d.join("LOCK").exists()));
}

/// `backfill ARGS` with `TMPDIR=scratch`.
fn backfill_in(args: &[&str], scratch: &Path) -> Output {
    bin()
        .args(args)
        .env("TMPDIR", scratch)
        .output()
        .expect("the binary runs")
}

/// SIGTERM, SIGHUP or SIGINT during `verify`'s sort: it removes its scratch and exits with
/// 128 + the signal.
#[test]
fn a_signal_during_verify_removes_its_scratch() {
    let tmp = tempfile::tempdir().unwrap();
    let (dataset, out) = spilling_output(tmp.path());
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    for (name, code) in [("TERM", 143), ("HUP", 129), ("INT", 130)] {
        let mut child = verify_spilling(&dataset, &out, &scratch);
        spilled_scratch(&scratch, &mut child);
        signal(&child, name);
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(code), "SIG{name}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(&format!("SIG{name}")),
            "{}",
            text(&o)
        );
        assert_eq!(scratch_dirs(&scratch), Vec::<PathBuf>::new(), "SIG{name}");
    }
}

/// A spill that fails part way (a file size limit: `EFBIG`, as a full disk gives `ENOSPC`)
/// ends `verify` with an error and removes its scratch.
#[test]
fn a_failed_spill_leaves_no_scratch() {
    let tmp = tempfile::tempdir().unwrap();
    let (dataset, out) = spilling_output(tmp.path());
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    // SIGXFSZ ignored: a write past the limit fails instead of killing the process.
    let o = Command::new("sh")
        .args([
            "-c",
            "trap '' XFSZ; ulimit -f 64; exec \"$0\" \"$@\"",
            env!("CARGO_BIN_EXE_backfill"),
            "verify",
            path(&dataset),
            path(&out),
        ])
        .env("TMPDIR", &scratch)
        .env("BACKFILL_TEST_SORT_MEMORY", "4194304")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("backfill-sort-"), "{}", text(&o));
    assert_eq!(scratch_dirs(&scratch), Vec::<PathBuf>::new());
}

/// `verify` and the certificate read the names the replay writes and nothing else, and an
/// output a replay holds is refused (exit 2, naming the holder) instead of read.
#[test]
fn verify_reads_the_replays_output_only_and_respects_its_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let log = changes(&[(1, "+ 4 d"), (2, "- 1 a")]);
    write_dataset(&ds, Some(MANIFEST), &snapshot("1 a\n2 b\n3 c"), Some(&log));
    let out = tmp.path().join("out");
    replay_verified(&ds, &out, &[]);
    for name in [
        "epoch-my-notes.parquet",
        "epoch-10.parquet",
        "epoch-99999999999999999999.parquet",
    ] {
        write_parquet(&out.join("changes").join(name), &log);
    }
    let o = ok(&["verify", path(&ds), path(&out)]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("downstream == upstream"),
        "{}",
        text(&o)
    );

    let lock =
        arrangement_backfill::store::durable::DirLock::acquire_file(&out.join(".lock")).unwrap();
    let o = backfill(&["verify", path(&ds), path(&out)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(".lock") && stderr.contains(&format!("process {}", std::process::id())),
        "{}",
        text(&o)
    );
    drop(lock);
    ok(&["verify", path(&ds), path(&out)]);
}

/// SIGHUP stops a replay like SIGINT and SIGTERM (exit 129, resumable), and leaves no sort
/// scratch behind.
#[test]
fn sighup_stops_a_replay_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = generate(tmp.path(), "int64", "3");
    let out = tmp.path().join("out");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let args = [
        "replay",
        path(&dataset),
        "--out",
        path(&out),
        "--progress",
        "none",
        "--upstream-rate",
        "500",
    ];
    let child = bin()
        .args(args)
        .env("TMPDIR", &scratch)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !std::fs::read_dir(out.join("changes")).is_ok_and(|mut e| e.next().is_some()) {
        assert!(started.elapsed().as_secs() < 120, "no output in 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    signal(&child, "HUP");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(129), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("interrupted by SIGHUP"),
        "{}",
        text(&o)
    );
    assert_eq!(scratch_dirs(&scratch), Vec::<PathBuf>::new());
    let mut rerun = args[..6].to_vec();
    rerun.push("--verify");
    let o = backfill_in(&rerun, &scratch);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("resumed from checkpoint"),
        "{}",
        text(&o)
    );
    assert_eq!(scratch_dirs(&scratch), Vec::<PathBuf>::new());
}

/// Issue 43: `--tmp DIR` points the sorts' scratch (the replay's validation, `verify`) at DIR,
/// whatever `TMPDIR` says; a scratch that cannot be made names its path; a full scratch disk
/// says how to point the scratch elsewhere (on a 256 KiB tmpfs, where this process may mount
/// one).
#[test]
fn tmp_points_the_scratch_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let (dataset, out) = spilling_output(tmp.path());
    let nowhere = tmp.path().join("a-file");
    std::fs::write(&nowhere, b"").unwrap();
    let bad = nowhere.join("scratch");
    // The validation of a new replay (a finished one's state keeps its validation: a rerun
    // sorts nothing).
    let o = backfill(&[
        "replay",
        path(&dataset),
        "--out",
        path(&tmp.path().join("another-out")),
        "--progress",
        "none",
        "--tmp",
        path(&bad),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains(path(&bad)), "{}", text(&o));
    let o = backfill(&["verify", path(&dataset), path(&out), "--tmp", path(&bad)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains(path(&bad)), "{}", text(&o));
    // A scratch of our own, while TMPDIR points at the unusable one: used, and removed.
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let o = bin()
        .args([
            "verify",
            path(&dataset),
            path(&out),
            "--tmp",
            path(&scratch),
        ])
        .env("TMPDIR", &bad)
        .env("BACKFILL_TEST_SORT_MEMORY", "65536")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(scratch_dirs(&scratch), Vec::<PathBuf>::new());
    // A full scratch disk.
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs", path(&small)])
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("skipped the full-disk case: cannot mount a tmpfs here");
        return;
    }
    let o = bin()
        .args(["verify", path(&dataset), path(&out), "--tmp", path(&small)])
        .env("BACKFILL_TEST_SORT_MEMORY", "65536")
        .output()
        .unwrap();
    let _ = Command::new("umount").arg(path(&small)).status();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(path(&small)) && text(&o).contains("--tmp DIR"),
        "{}",
        text(&o)
    );
}
