//! The `backfill` command-line tool.
fn main() {}
