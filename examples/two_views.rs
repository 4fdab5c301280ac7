//! Two views of one table: each job identity backfills the whole table, the second one after
//! the first has moved the table on; the first cannot resume once it missed changes.
//!
//! `cargo run --example two_views` (exits 1 if a view's output is not the table).

#[path = "common/mod.rs"]
mod common;

use arrangement_backfill::{BackfillJob, JobOptions, MemoryStore, Message};
use common::{Net, changes, exit_on, load};
use futures::StreamExt;

async fn view(
    store: &MemoryStore,
    name: &str,
    source: Vec<arrangement_backfill::Change>,
) -> arrangement_backfill::Result<Net> {
    let source = futures::stream::iter(source.into_iter().map(Ok));
    let mut job = BackfillJob::start(store, name, "t", JobOptions::default(), source)?;
    let mut net = Net::default();
    while let Some(message) = job.next().await {
        if let Message::Chunk(chunk) = message? {
            net.add(&chunk);
        }
    }
    Ok(net)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> arrangement_backfill::Result<()> {
    let store = MemoryStore::new();
    let mut model = load(&store, 20_000)?;
    let first = changes(&mut model, 1, 10);
    exit_on(
        view(&store, "orders_by_region", first)
            .await?
            .check(&model, "view orders_by_region"),
    );
    let second = changes(&mut model, 2, 10);
    exit_on(
        view(&store, "orders_by_day", second)
            .await?
            .check(&model, "view orders_by_day"),
    );
    match BackfillJob::resume_point_in(&store, "orders_by_region", "t") {
        Err(e) => println!("resuming the first view is refused: {e}"),
        Ok(point) => exit_on(Err(format!("the first view would resume at {point:?}"))),
    }
    Ok(())
}
