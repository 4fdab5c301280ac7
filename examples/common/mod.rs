//! What the job examples share: a table `t (k Int64, v Int64)`, a seeded generator of
//! consistent changes kept in a model of the upstream, and the check of an output against it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use arrangement_backfill::{Change, KeyColumn, StateStore, StreamChunk, TableDesc, load_table};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, RecordBatchIterator};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

/// The table's schema.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

/// The upstream as a model: key to value.
pub type Model = BTreeMap<i64, i64>;

/// The table `t` as loaded: keys `0..rows`, values `10 * key`.
pub fn initial_model(rows: i64) -> Model {
    (0..rows).map(|k| (k, k * 10)).collect()
}

/// Loads table `t` with `rows` rows into `store`; returns its model.
pub fn load<S: StateStore>(store: &S, rows: i64) -> arrangement_backfill::Result<Model> {
    let model = initial_model(rows);
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(model.keys().copied())),
            Arc::new(Int64Array::from_iter_values(model.values().copied())),
        ],
    )?;
    let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])?;
    load_table(store, desc, RecordBatchIterator::new([Ok(batch)], schema()))?;
    Ok(model)
}

/// `epochs` epochs of changes (updates, deletes, inserts; a small linear congruential
/// generator seeded by `seed`), each a chunk then a barrier, applied to `model`.
pub fn changes(model: &mut Model, seed: u64, epochs: usize) -> Vec<Change> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move |n: i64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n as u64) as i64
    };
    let span = model.keys().next_back().map_or(1000, |k| k * 2 + 2);
    let mut out = Vec::new();
    for _ in 0..epochs {
        let mut text = String::new();
        let mut touched = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let k = next(span);
            if !touched.insert(k) {
                continue;
            }
            match (model.get(&k).copied(), next(3)) {
                (Some(old), 0) => {
                    model.remove(&k);
                    text.push_str(&format!("- {k} {old}\n"));
                }
                (Some(old), _) => {
                    let new = next(1_000_000);
                    model.insert(k, new);
                    text.push_str(&format!("U- {k} {old}\nU+ {k} {new}\n"));
                }
                (None, _) => {
                    let new = next(1_000_000);
                    model.insert(k, new);
                    text.push_str(&format!("+ {k} {new}\n"));
                }
            }
        }
        let chunk = StreamChunk::from_text(&schema(), &text).expect("generated text is valid");
        out.push(Change::Chunk(chunk));
        out.push(Change::Barrier);
    }
    out
}

/// `changes` without the first `skip` change rows (a resumed job's source).
pub fn after(changes: Vec<Change>, mut skip: u64) -> Vec<Change> {
    let mut out = Vec::new();
    for change in changes {
        match change {
            Change::Chunk(chunk) if skip >= chunk.num_rows() as u64 => {
                skip -= chunk.num_rows() as u64;
            }
            Change::Chunk(chunk) if skip > 0 => {
                let from = skip as usize;
                let (batch, ops) = chunk.into_parts();
                let rest = StreamChunk::new(
                    batch.slice(from, batch.num_rows() - from),
                    ops[from..].to_vec(),
                )
                .expect("checkpoints end between update pairs");
                out.push(Change::Chunk(rest));
                skip = 0;
            }
            other => out.push(other),
        }
    }
    out
}

/// An output, netted: rows with their count (+1 insert, -1 delete).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Net(pub BTreeMap<(i64, i64), i64>);

impl Net {
    /// Adds a chunk of output.
    pub fn add(&mut self, chunk: &StreamChunk) {
        let k = chunk.batch().column(0).as_primitive::<Int64Type>();
        let v = chunk.batch().column(1).as_primitive::<Int64Type>();
        for (i, op) in chunk.ops().iter().enumerate() {
            *self.0.entry((k.value(i), v.value(i))).or_default() +=
                if op.is_insert() { 1 } else { -1 };
        }
        self.0.retain(|_, n| *n != 0);
    }

    /// Compares with the model: every row exactly once, nothing else.
    pub fn check(&self, model: &Model, what: &str) -> Result<(), String> {
        let expected: BTreeMap<(i64, i64), i64> =
            model.iter().map(|(&k, &v)| ((k, v), 1)).collect();
        if self.0 == expected {
            println!("{what}: {} rows, every one exactly once", model.len());
            return Ok(());
        }
        let missing = expected
            .keys()
            .filter(|r| self.0.get(r) != Some(&1))
            .count();
        let extra = self
            .0
            .iter()
            .filter(|(r, n)| expected.get(r) != Some(n))
            .count();
        Err(format!(
            "{what}: {missing} rows missing or miscounted, {extra} unexpected"
        ))
    }
}

/// Exits with status 1 on a failed check.
pub fn exit_on(result: Result<(), String>) {
    if let Err(message) = result {
        eprintln!("FAILED: {message}");
        std::process::exit(1);
    }
}

/// Writes `text` to `path` and makes it durable (the file, then its directory).
pub fn write_durable(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The files of `dir` named `epoch-<number>.txt`, by epoch.
pub fn epoch_files(dir: &std::path::Path) -> std::io::Result<BTreeMap<u64, std::path::PathBuf>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let epoch = (name.strip_prefix("epoch-"))
            .and_then(|n| n.strip_suffix(".txt"))
            .and_then(|n| n.parse().ok());
        if let Some(epoch) = epoch {
            out.insert(epoch, path);
        }
    }
    Ok(out)
}

/// The net of the output files of `dir` (text form, one change a line).
pub fn net_of_files(dir: &std::path::Path) -> arrangement_backfill::Result<Net> {
    let mut net = Net::default();
    for path in epoch_files(dir)?.values() {
        let text = std::fs::read_to_string(path)?;
        net.add(&StreamChunk::from_text(&schema(), &text)?);
    }
    Ok(net)
}

/// Runs this example again as a child process with `args`, and kills it (SIGKILL) after
/// `after`: a crash at a moment nobody chose.
pub fn run_child_and_kill(args: &[&str], after: std::time::Duration) -> std::io::Result<()> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .spawn()?;
    std::thread::sleep(after);
    match child.try_wait()? {
        Some(status) => println!("the child ended by itself ({status}) before the kill"),
        None => {
            child.kill()?;
            child.wait()?;
            println!("killed the child after {after:?}");
        }
    }
    Ok(())
}

/// The examples that kill a job: `DIR` given as `--child DIR` when this process is the child.
pub fn child_dir() -> Option<std::path::PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    match args.as_slice() {
        [_, flag, dir] if flag == "--child" => Some(dir.into()),
        _ => None,
    }
}

/// A new directory with the table `t` of `rows` rows loaded into its durable store
/// (`DIR/state`) and an empty `DIR/out`; the model of the table after `epochs` epochs of the
/// changes of `seed`; and this example run again as a child in that directory, killed
/// (`SIGKILL`) after `after`.
pub fn loaded_and_killed(
    rows: i64,
    seed: u64,
    epochs: usize,
    after: std::time::Duration,
) -> arrangement_backfill::Result<(tempfile::TempDir, Model)> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("out"))?;
    let mut model = {
        let store = arrangement_backfill::DurableStore::open(dir.path().join("state"))?;
        load(&store, rows)?
    };
    let _ = changes(&mut model, seed, epochs);
    let path = dir.path().to_str().unwrap_or_default().to_string();
    run_child_and_kill(&["--child", &path], after)?;
    Ok((dir, model))
}

/// The kill examples' job, run or rerun in `dir`: its durable store (`DIR/state`), where job
/// `view` resumes, the changes after that point (of `rows` rows and `epochs` epochs of the
/// changes of `seed`), and the options both examples run it with (slowed, so that the kill
/// lands mid-backfill).
pub fn resumed(
    dir: &std::path::Path,
    rows: i64,
    seed: u64,
    epochs: usize,
) -> arrangement_backfill::Result<(
    arrangement_backfill::DurableStore,
    arrangement_backfill::ResumePoint,
    Vec<Change>,
    arrangement_backfill::JobOptions,
)> {
    let store = arrangement_backfill::DurableStore::open(dir.join("state"))?;
    let mut model = initial_model(rows);
    let all = changes(&mut model, seed, epochs);
    let resume = arrangement_backfill::BackfillJob::resume_point_in(&store, "view", "t")?;
    println!("starting at {resume:?}");
    let rest = after(all, resume.changes);
    let options = arrangement_backfill::JobOptions {
        rate_limit: Some(30_000),
        barrier_interval: Some(std::time::Duration::from_millis(20)),
        ..arrangement_backfill::JobOptions::default()
    };
    Ok((store, resume, rest, options))
}
