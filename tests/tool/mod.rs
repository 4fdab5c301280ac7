//! Test helpers that run the `backfill` binary.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

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
