//! Datasets on object storage, against a real S3 protocol server (moto, see `common::s3`):
//! a replay and a verify read the dataset from `s3://`, by ranges, and agree with the same
//! replay from a local copy; objects that are not a dataset are refused naming their URL.

use std::path::Path;
use std::process::Output;

mod common;
use common::cli::{bin, p as path, text};
use common::s3::{S3Server, list, upload_dir};

fn bundled() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/datasets/tpch-lineitem-sf0.01"
    ))
}

fn backfill(server: &S3Server, args: &[&str]) -> Output {
    let mut command = bin();
    command.args(args);
    for (key, value) in server.env() {
        command.env(key, value);
    }
    command.output().expect("the binary runs")
}

/// The certificate line of a replay's or a verify's stdout.
fn certificate(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout);
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with("certificate"))
        .unwrap_or_else(|| panic!("no certificate: {}", text(o)))
        .trim()
        .to_string()
}

#[test]
fn a_dataset_in_a_bucket_replays_and_verifies_as_its_local_copy_does() {
    let Some(server) = S3Server::start() else {
        return;
    };
    upload_dir(&server.bucket("datasets"), bundled(), "tpch/lineitem");
    let dir = tempfile::tempdir().unwrap();
    let (remote, local) = (dir.path().join("remote"), dir.path().join("local"));
    let url = "s3://datasets/tpch/lineitem";
    let args = |out: &Path, dataset: &str| {
        vec![
            "replay".to_string(),
            dataset.into(),
            "--out".into(),
            path(out).into(),
            "--progress".into(),
            "none".into(),
        ]
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = backfill(&server, &args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        o
    };
    let from_bucket = run(args(&remote, url));
    let from_disk = run(args(&local, path(bundled())));
    assert_eq!(certificate(&from_bucket), certificate(&from_disk));
    // Verify reads the dataset from the bucket too; the same command again has nothing left.
    let verified = run(vec!["verify".into(), url.into(), path(&remote).into()]);
    assert!(String::from_utf8_lossy(&verified.stdout).contains("verified"));
    let again = run(args(&remote, url));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already"),
        "{}",
        text(&again)
    );
}

#[test]
fn objects_that_are_not_a_dataset_are_refused_naming_their_url() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let bucket = server.bucket("broken");
    upload_dir(&bucket, bundled(), "good");
    let dir = tempfile::tempdir().unwrap();
    // A prefix with nothing under it.
    let o = backfill(
        &server,
        &[
            "replay",
            "s3://broken/nothing",
            "--out",
            path(&dir.path().join("a")),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("s3://broken/nothing/dataset.json"),
        "{}",
        text(&o)
    );
    // A snapshot object that is not Parquet.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("snapshot")).unwrap();
    std::fs::copy(
        bundled().join("dataset.json"),
        copy.path().join("dataset.json"),
    )
    .unwrap();
    std::fs::write(copy.path().join("snapshot/part-0.parquet"), b"not parquet").unwrap();
    upload_dir(&bucket, copy.path(), "bad");
    let o = backfill(
        &server,
        &[
            "replay",
            "s3://broken/bad",
            "--out",
            path(&dir.path().join("b")),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("s3://broken/bad/snapshot/part-0.parquet"),
        "{}",
        text(&o)
    );
    // A bucket that does not exist.
    let o = backfill(
        &server,
        &[
            "replay",
            "s3://no-such-bucket/ds",
            "--out",
            path(&dir.path().join("c")),
        ],
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("s3://no-such-bucket/ds"), "{}", text(&o));
}

/// `replay DATASET --out URL --cache CACHE --progress none EXTRA..` with the server's env.
fn replay_to_bucket(
    server: &S3Server,
    dataset: &str,
    url: &str,
    cache: &Path,
    extra: &[&str],
) -> Output {
    let mut args = vec![
        "replay",
        dataset,
        "--out",
        url,
        "--cache",
        path(cache),
        "--progress",
        "none",
    ];
    args.extend_from_slice(extra);
    backfill(server, &args)
}

#[test]
fn an_output_in_a_bucket_verifies_and_has_one_writer() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let out = server.bucket("outputs");
    let dir = tempfile::tempdir().unwrap();
    let (cache, other) = (dir.path().join("cache"), dir.path().join("other"));
    let url = "s3://outputs/lineitem";
    let o = replay_to_bucket(&server, path(bundled()), url, &cache, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("uploaded"),
        "{}",
        text(&o)
    );
    let v = backfill(&server, &["verify", path(bundled()), url]);
    assert!(v.status.success(), "{}", text(&v));
    // An object of a committed file's name and size but other bytes (an earlier output's):
    // the next run of the writer puts the committed bytes back, so exit 0 stays exactly once.
    let names = list(&out, "lineitem/changes");
    replace_with_same_size_garbage(&out, &names[names.len() / 2]);
    let bad = backfill(&server, &["verify", path(bundled()), url]);
    assert!(!bad.status.success(), "{}", text(&bad));
    let o = replay_to_bucket(&server, path(bundled()), url, &cache, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let v = backfill(&server, &["verify", path(bundled()), url]);
    assert!(v.status.success(), "{}", text(&v));
    // The bucket holds the epoch files, the claim and the checkpoints (the last two, their
    // manifests and the run files they name; no staged output left), nothing else.
    let names = list(&out, "lineitem");
    assert!(
        names.iter().any(|n| n == "lineitem/_backfill-writer.json"),
        "{names:?}"
    );
    assert!(
        names.iter().all(|n| n == "lineitem/_backfill-writer.json"
            || (n.starts_with("lineitem/changes/epoch-") && n.ends_with(".parquet"))
            || n.starts_with("lineitem/_backfill-state/checkpoint-")
            || n.starts_with("lineitem/_backfill-state/manifest-")
            || n.starts_with("lineitem/_backfill-state/files/run-")),
        "{names:?}"
    );
    let checkpoints = names.iter().filter(|n| n.contains("/checkpoint-")).count();
    assert!((1..=2).contains(&checkpoints), "{names:?}");
    // A second writer (another cache) is refused before it writes anything.
    let o = replay_to_bucket(&server, path(bundled()), url, &other, &["--fresh"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("another replay"), "{}", text(&o));
    assert_eq!(list(&out, "lineitem"), names);
    // The first writer runs it again from the start: the old objects are replaced.
    let o = replay_to_bucket(
        &server,
        path(bundled()),
        url,
        &cache,
        &["--fresh", "--vnodes", "64"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = backfill(&server, &["verify", path(bundled()), url]);
    assert!(v.status.success(), "{}", text(&v));
}

/// Every object under `prefix/changes`, read whole: each must be a complete Parquet file.
fn whole_parquet_files(store: &object_store::aws::AmazonS3, prefix: &str) -> usize {
    use object_store::ObjectStoreExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let names = list(store, &format!("{prefix}/changes"));
    for name in &names {
        let bytes = runtime
            .block_on(async {
                store
                    .get(&object_store::path::Path::from(name.as_str()))
                    .await?
                    .bytes()
                    .await
            })
            .unwrap();
        assert!(
            bytes.len() > 8 && bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"),
            "{name} is not a whole Parquet file ({} bytes)",
            bytes.len()
        );
    }
    names.len()
}

#[test]
fn a_replay_killed_while_it_uploads_resumes_from_its_cache_and_readers_see_whole_files() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let out = server.bucket("killed");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = "s3://killed/lineitem";
    let args = [
        "replay",
        path(bundled()),
        "--out",
        url,
        "--cache",
        path(&cache),
        "--progress",
        "none",
        "--rate-limit",
        "20000",
        "--upstream-rate",
        "4000",
    ];
    let mut command = bin();
    command
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for (key, value) in server.env() {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    // Listings taken while it writes: whole files only, never fewer than before.
    let mut seen = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while seen < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "no uploads within a minute"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended before it was killed"
        );
        let now = whole_parquet_files(&out, "lineitem");
        assert!(now >= seen, "a listing lost files: {now} after {seen}");
        seen = now;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    whole_parquet_files(&out, "lineitem");
    // The same command resumes from the cache, uploads what the killed run committed and
    // did not upload, and the output verifies.
    let o = backfill(&server, &args[..8]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("resumed from checkpoint"),
        "{}",
        text(&o)
    );
    let v = backfill(&server, &["verify", path(bundled()), url]);
    assert!(v.status.success(), "{}", text(&v));
}

/// Overwrites the object `name` with as many bytes, of which the middle ones differ.
fn replace_with_same_size_garbage(store: &object_store::aws::AmazonS3, name: &str) {
    use object_store::ObjectStoreExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let key = object_store::path::Path::from(name);
    let mut bytes = runtime
        .block_on(async { store.get(&key).await?.bytes().await })
        .unwrap()
        .to_vec();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle - 8..middle + 8] {
        *b ^= 0xff;
    }
    runtime.block_on(store.put(&key, bytes.into())).unwrap();
}
