//! The tool's tests that drive it as a library (the binary's unit tests): crash consistency
//! of the durable replay under injected I/O faults, and randomized replays. The command-line
//! tests in `tests/` run the binary itself.

mod durable;
mod random_replay;

// The integration tests' helpers these share.
#[path = "../../../../tests/common/dataset.rs"]
#[allow(dead_code)]
mod common_dataset;
#[path = "../../../../tests/common/files.rs"]
#[allow(dead_code)]
mod common_files;
