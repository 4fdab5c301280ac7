//! Running the `backfill` binary, and reading what it leaves in an output directory.
//!
//! Every helper that must succeed panics with [`text`] of the run: the exit status and both
//! streams, so a failure shows what the tool said.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The binary, ready for arguments.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_backfill"))
}

/// Runs the binary with `args` to its end.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

/// Runs the binary, which must succeed.
pub fn ok(args: &[&str]) -> Output {
    let o = run(args);
    assert!(o.status.success(), "backfill {args:?} failed: {}", text(&o));
    o
}

/// Starts the binary with `args`, both streams piped.
pub fn spawn(args: &[&str]) -> Child {
    bin()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// Sends the signal `name` (`TERM`, `INT`, `HUP`, `KILL`) to a started run.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// Exit status and both streams, for a failure message.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A path as an argument.
pub fn p(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A refusal: exit status 2, every needle in stderr, no panic.
pub fn refused(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("panicked"), "{}", text(o));
    for needle in needles {
        assert!(stderr.contains(needle), "missing {needle:?}: {}", text(o));
    }
}

/// `backfill gen synthetic --out OUT EXTRA..`, which must succeed; `out`.
pub fn synthetic(out: PathBuf, extra: &[&str]) -> PathBuf {
    let mut args = vec!["gen", "synthetic", "--out", p(&out)];
    args.extend_from_slice(extra);
    ok(&args);
    out
}

/// `replay DATASET --out OUT --progress none`: the start of every replay command here.
pub fn replay_args<'a>(dataset: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec!["replay", p(dataset), "--out", p(out), "--progress", "none"]
}

/// `backfill verify DATASET OUT`, which must succeed.
pub fn verified(dataset: &Path, out: &Path) {
    let o = run(&["verify", p(dataset), p(out)]);
    assert!(o.status.success(), "verify {}: {}", out.display(), text(&o));
}

/// Whether `name` is an output file by the tool's rule: `epoch-<20 digits>.parquet` of an
/// epoch that fits in 64 bits.
pub fn is_output_name(name: &str) -> bool {
    name.strip_prefix("epoch-")
        .and_then(|rest| rest.strip_suffix(".parquet"))
        .is_some_and(|digits| {
            digits.len() == 20
                && digits.bytes().all(|b| b.is_ascii_digit())
                && digits.parse::<u64>().is_ok()
        })
}

/// The published output files of `out`, in epoch order (none when `out/changes` is absent).
pub fn published(out: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(out.join("changes")) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| is_output_name(&p.file_name().unwrap().to_string_lossy()))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// The `.tmp` files left in `out/changes` (a run that ended by itself, or by its signal
/// handler, leaves none).
pub fn tmp_files(out: &Path) -> Vec<String> {
    match std::fs::read_dir(out.join("changes")) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".tmp"))
            .collect(),
        Err(_) => Vec::new(),
    }
}
