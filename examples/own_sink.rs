//! An own exactly-once sink: each checkpoint's rows become one file, written and synced as
//! `.pending-epoch-E.txt` beside the next epoch's work (`make_durable`), committed with the
//! store's checkpoint, then renamed to `epoch-E.txt` (`publish`). A reader that lists
//! `epoch-*.txt` never sees a partial or uncommitted file. The job is killed (`SIGKILL`, a
//! child process) part way and run again: `recover` removes what was never committed and
//! publishes what was; the published files hold every row exactly once.
//!
//! `cargo run --example own_sink` (exits 1 on any difference).

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use arrangement_backfill::{
    BackfillJob, ExactlyOnceSink, PreparedCheckpoint, Recovery, StreamChunk,
};
use common::{exit_on, net_of_files, write_durable};

const ROWS: i64 = 50_000;
const SEED: u64 = 11;
const EPOCHS: usize = 200;

/// The sink: a directory of epoch files.
struct FileSink {
    dir: PathBuf,
    open: String,
}

/// A checkpoint's file on its way.
struct PendingFile {
    dir: PathBuf,
    epoch: u64,
    text: String,
}

impl PendingFile {
    fn pending(&self) -> PathBuf {
        self.dir.join(format!(".pending-epoch-{}.txt", self.epoch))
    }

    fn published(&self) -> PathBuf {
        self.dir.join(format!("epoch-{}.txt", self.epoch))
    }
}

impl ExactlyOnceSink for FileSink {
    type Prepared = PendingFile;

    fn recover(&mut self, recovery: &Recovery) -> arrangement_backfill::Result<()> {
        let committed = recovery.committed.unwrap_or(0);
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let epoch = |prefix: &str| {
                name.strip_prefix(prefix)?
                    .strip_suffix(".txt")?
                    .parse::<u64>()
                    .ok()
            };
            if let Some(epoch) = epoch(".pending-epoch-") {
                let file = PendingFile {
                    dir: self.dir.clone(),
                    epoch,
                    text: String::new(),
                };
                if epoch <= committed {
                    std::fs::rename(&path, file.published())?; // committed, not yet published
                } else {
                    std::fs::remove_file(&path)?; // never committed
                }
            } else if epoch("epoch-").is_some_and(|e| e > committed) {
                std::fs::remove_file(&path)?;
            }
        }
        // Every committed checkpoint's file is there, as its record says.
        for (epoch, record) in &recovery.records {
            let path = self.dir.join(format!("epoch-{epoch}.txt"));
            let bytes = std::fs::metadata(&path)
                .map(|m| m.len().to_string())
                .unwrap_or_default();
            if &bytes != record {
                return Err(arrangement_backfill::Error::InvalidConfig(format!(
                    "{}: {bytes} bytes, the checkpoint committed {record}",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    fn write(&mut self, _epoch: u64, chunk: StreamChunk) -> arrangement_backfill::Result<()> {
        self.open.push_str(&chunk.to_text()?);
        Ok(())
    }

    fn prepare(&mut self, epoch: u64) -> arrangement_backfill::Result<PendingFile> {
        Ok(PendingFile {
            dir: self.dir.clone(),
            epoch,
            text: std::mem::take(&mut self.open),
        })
    }
}

impl PreparedCheckpoint for PendingFile {
    fn make_durable(&mut self) -> arrangement_backfill::Result<Option<String>> {
        write_durable(&self.pending(), &self.text)?;
        Ok(Some(self.text.len().to_string()))
    }

    fn publish(&mut self) -> arrangement_backfill::Result<()> {
        std::fs::rename(self.pending(), self.published())?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }
}

/// Runs the job on the store in `dir` until its end (or a kill), into the sink in `dir/out`.
async fn run(dir: &Path) -> arrangement_backfill::Result<()> {
    let (store, _, rest, options) = common::resumed(dir, ROWS, SEED, EPOCHS)?;
    let source = futures::stream::iter(rest.into_iter().map(Ok));
    let job = BackfillJob::start(&store, "view", "t", options, source)?;
    let mut sink = FileSink {
        dir: dir.join("out"),
        open: String::new(),
    };
    let summary = job.run(&mut sink).await?;
    println!("ended: {summary:?}");
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> arrangement_backfill::Result<()> {
    if let Some(dir) = common::child_dir() {
        return run(&dir).await;
    }
    let (dir, model) = common::loaded_and_killed(ROWS, SEED, EPOCHS, Duration::from_millis(700))?;
    run(dir.path()).await?;
    exit_on(net_of_files(&dir.path().join("out"))?.check(&model, "the sink's published files"));
    Ok(())
}
