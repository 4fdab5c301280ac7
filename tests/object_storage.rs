//! Datasets on object storage, against a real S3 protocol server (moto, see `common::s3`):
//! a replay and a verify read the dataset from `s3://`, by ranges, and agree with the same
//! replay from a local copy; objects that are not a dataset are refused naming their URL.

use std::path::Path;
use std::process::Output;

mod common;
use common::cli::{bin, p as path, text};
use common::s3::{S3Server, upload_dir};

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
