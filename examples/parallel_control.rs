//! A parallel job under control: four actors, paused, throttled, rescaled to two and then to
//! seven while the upstream changes; the output is still every row exactly once.
//!
//! `cargo run --example parallel_control` (exits 1 on any difference).

#[path = "common/mod.rs"]
mod common;

use arrangement_backfill::{BackfillJob, JobOptions, MemoryStore, Message};
use common::{Net, changes, exit_on, load};
use futures::StreamExt;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> arrangement_backfill::Result<()> {
    let store = MemoryStore::new();
    let mut model = load(&store, 20_000)?;
    let source = changes(&mut model, 3, 60);
    let options = JobOptions {
        parallelism: 4,
        rate_limit: Some(40_000),
        barrier_interval: Some(std::time::Duration::from_millis(20)),
        ..JobOptions::default()
    };
    let mut job = BackfillJob::start(
        &store,
        "view",
        "t",
        options,
        futures::stream::iter(source.into_iter().map(Ok)),
    )?;
    let control = job.control();
    let progress = job.progress();
    let mut net = Net::default();
    let mut barriers = 0;
    while let Some(message) = job.next().await {
        match message? {
            Message::Chunk(chunk) => net.add(&chunk),
            Message::Barrier(_) => {
                barriers += 1;
                match barriers {
                    3 => control.pause()?,
                    6 => control.resume()?,
                    8 => control.throttle(Some(100_000))?,
                    10 => control.rescale(2)?,
                    16 => control.rescale(7)?,
                    20 => control.throttle(None)?,
                    _ => {}
                }
                let p = progress.borrow();
                if barriers % 10 == 0 {
                    println!(
                        "barrier {barriers}: {} of {} snapshot rows, {} actors, eta {:?}",
                        p.rows_read,
                        p.rows_total,
                        p.actors.len(),
                        p.eta
                    );
                }
            }
            Message::Watermark(_) => {}
        }
    }
    let rescales = progress.borrow().rescales;
    if rescales != 2 {
        exit_on(Err(format!("{rescales} rescales, expected 2")));
    }
    exit_on(net.check(&model, "parallel view"));
    Ok(())
}
