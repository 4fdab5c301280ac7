//! Kill and resume on the durable store: a job reading its output as a stream is killed
//! (`SIGKILL`, a child process) part way; the next run asks where to resume, drops the output
//! of epochs that were never committed, feeds the changes after the resume point, and the
//! output of both runs is every row exactly once.
//!
//! The stream contract: a checkpoint barrier is committed when the consumer asks for the
//! next message, so the consumer makes an epoch's output durable when its barrier arrives.
//!
//! `cargo run --example durable_resume` (exits 1 on any difference).

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use arrangement_backfill::{BackfillJob, Message, StreamChunk};
use common::{exit_on, net_of_files, write_durable};
use futures::StreamExt;

const ROWS: i64 = 50_000;
const SEED: u64 = 7;
const EPOCHS: usize = 200;

/// Runs the job on the store in `dir` until its end (or a kill), its output into `dir/out`.
async fn run(dir: &Path) -> arrangement_backfill::Result<()> {
    let (store, resume, rest, options) = common::resumed(dir, ROWS, SEED, EPOCHS)?;
    // Output of epochs after the last checkpoint was never committed: gone.
    let out = dir.join("out");
    for (epoch, path) in common::epoch_files(&out)? {
        if resume.checkpoint.is_none_or(|c| epoch > c) {
            std::fs::remove_file(path)?;
        }
    }
    let source = futures::stream::iter(rest.into_iter().map(Ok));
    let mut job = BackfillJob::start(&store, "view", "t", options, source)?;
    let (mut epoch, mut rows) = (resume.epoch, Vec::<StreamChunk>::new());
    while let Some(message) = job.next().await {
        match message? {
            Message::Chunk(chunk) => rows.push(chunk),
            // The first barrier closes the committed epoch: nothing of it is new.
            Message::Barrier(barrier) if barrier.epoch.prev <= resume.epoch => {
                epoch = barrier.epoch.curr;
            }
            Message::Barrier(barrier) => {
                // The epoch's output, durable before the next pull commits it.
                let mut text = String::new();
                for chunk in rows.drain(..) {
                    text.push_str(&chunk.to_text()?);
                }
                write_durable(&out.join(format!("epoch-{epoch}.txt")), &text)?;
                epoch = barrier.epoch.curr;
            }
            Message::Watermark(_) => {}
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> arrangement_backfill::Result<()> {
    if let Some(dir) = common::child_dir() {
        return run(&dir).await;
    }
    let (dir, model) = common::loaded_and_killed(ROWS, SEED, EPOCHS, Duration::from_millis(700))?;
    run(dir.path()).await?;
    exit_on(net_of_files(&dir.path().join("out"))?.check(&model, "killed and resumed view"));
    Ok(())
}
