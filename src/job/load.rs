//! Loading an upstream table: its rows from any Arrow reader or from Parquet files, written,
//! sealed and committed in one call, so that a [`BackfillJob`](crate::BackfillJob) can start.
//!
//! A long load can commit in steps ([`TableLoader::commit_step`]): each step makes the rows
//! written so far durable (without committing an epoch: the table is not live yet), with a
//! [`LoadProgress`] record in the store's job values, so a crash costs only the rows written
//! since the last step. [`TableLoader::resume`] reopens such a load where it stopped; the
//! caller writes the rows after [`LoadProgress::rows`] again.
//!
//! ```text
//!  create ──write…──▶ commit_step ──write…──▶ commit_step ──write…──▶ seal ──▶ SealedLoad::commit
//!                      (rows 0..a durable,      (0..b)                 (the rest as a last step,
//!                       `upstream.<t>.load`                             then the epoch, with the
//!                       = {rows: a, ..})                                record marked complete)
//!      crash ─▶ TableLoader::resume(store, t) ─▶ (loader, progress): write rows b.. again
//! ```
//!
//! A table whose load is not complete is never backfilled: `BackfillJob::start` refuses it
//! while its record says the load is under way.

use std::path::Path;

use arrow_array::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::store::{StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VnodeBitmap;

/// What a load did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Rows written.
    pub rows: u64,
    /// The epoch the load committed.
    pub epoch: u64,
}

/// Creates table `desc` in `store`, writes every row of `batches` (for example a
/// `RecordBatchReader`) and commits them at the epoch after the store's committed one.
///
/// Memory: the durable store spills sorted runs as the rows come, so a load takes memory for
/// a few batches and the store's write budget, not for the table; the in-memory store holds
/// the table. Keys must be unique: the store keeps one row per key (the last written).
pub fn load_table<S, I, E>(store: &S, desc: TableDesc, batches: I) -> Result<Loaded>
where
    S: StateStore,
    I: IntoIterator<Item = std::result::Result<RecordBatch, E>>,
    E: Into<Error>,
{
    let mut loader = TableLoader::create(store, desc)?;
    for batch in batches {
        loader.write(batch.map_err(Into::into)?)?;
    }
    let loaded = loader.commit()?;
    store.compact()?;
    Ok(loaded)
}

/// How far a load in steps got: what its committed steps hold. Committed with each step
/// ([`TableLoader::commit_step`]) as the job value [`load_key`] of the table, and marked
/// complete by the load's final commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadProgress {
    /// Rows the committed steps hold: the first `rows` rows written, in order.
    pub rows: u64,
    /// Steps committed.
    pub steps: u64,
    /// The load's final commit was made: the table is loaded.
    pub complete: bool,
}

impl LoadProgress {
    /// The progress recorded in `store` for a load of table `table` in steps, if any.
    pub fn of<S: StateStore>(store: &S, table: &str) -> Result<Option<Self>> {
        store
            .meta(&load_key(table))?
            .map(|value| {
                serde_json::from_str(&value).map_err(|e| Error::CorruptState {
                    context: format!("the load record of table `{table}`"),
                    message: format!("unreadable ({e}): `{value}`"),
                })
            })
            .transpose()
    }

    fn encode(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| crate::error::internal!("load record: {e}"))
    }
}

/// The job value holding the [`LoadProgress`] of table `table`'s load in steps.
pub fn load_key(table: &str) -> String {
    format!("upstream.{table}.load")
}

/// A table being loaded, for a caller that commits when it decides (with values staged for
/// the same commit, after checks of its own): [`load_table`] in steps. A long load may
/// commit steps on the way ([`Self::commit_step`]) and resume after a crash
/// ([`Self::resume`]).
pub struct TableLoader<S: StateStore> {
    store: S,
    desc: std::sync::Arc<TableDesc>,
    table: S::Table,
    /// Rows written, including those of the steps committed (and resumed).
    rows: u64,
    /// What the committed steps hold.
    committed: LoadProgress,
}

impl<S: StateStore> TableLoader<S> {
    /// Creates table `desc` in `store` (its name must be new).
    pub fn create(store: &S, desc: TableDesc) -> Result<Self> {
        let name = desc.name().to_string();
        let desc = store.create_table(desc)?;
        let table = store.table(&name, VnodeBitmap::full(desc.vnode_count()))?;
        Ok(Self {
            store: store.clone(),
            desc,
            table,
            rows: 0,
            committed: LoadProgress::default(),
        })
    }

    /// Reopens the load in steps of table `name` where its last committed step left it (in
    /// a store reopened after a crash): the loader, and what the committed steps hold. The
    /// caller writes the rows after the first [`LoadProgress::rows`] again, in the same
    /// order. An error if the table has no load in steps under way (none recorded, or one
    /// already complete).
    pub fn resume(store: &S, name: &str) -> Result<(Self, LoadProgress)> {
        let progress = match LoadProgress::of(store, name)? {
            Some(p) if !p.complete => p,
            Some(_) => {
                return Err(Error::InvalidConfig(format!(
                    "table `{name}` is loaded already: there is no load of it to resume"
                )));
            }
            None => {
                return Err(Error::InvalidConfig(format!(
                    "table `{name}` has no load in steps to resume (no step was committed)"
                )));
            }
        };
        let desc = store.table_desc(name)?;
        let table = store.table(name, VnodeBitmap::full(desc.vnode_count()))?;
        let loader = Self {
            store: store.clone(),
            desc,
            table,
            rows: progress.rows,
            committed: progress,
        };
        Ok((loader, progress))
    }

    /// Writes rows (of the table's schema).
    pub fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.desc
            .check_schema(batch.schema_ref(), "a loaded batch")?;
        self.rows += batch.num_rows() as u64;
        self.table.write(&StreamChunk::inserts(batch))
    }

    /// Rows written so far (including those of the steps a resumed load committed before).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// What the committed steps hold (all zero before the first).
    pub fn committed(&self) -> LoadProgress {
        self.committed
    }

    /// Commits the rows written so far (without an epoch: the table is not live until the
    /// load's final commit), with the values staged so far and the load's [`LoadProgress`],
    /// which it returns: after a crash, [`Self::resume`] starts after these rows. See
    /// `StateTable::commit_load_step`; in the durable store, the rows of a load in key
    /// order are appended to each vnode's base (never rewritten), others become deltas that
    /// compaction merges.
    pub fn commit_step(&mut self) -> Result<LoadProgress> {
        let progress = LoadProgress {
            rows: self.rows,
            steps: self.committed.steps + 1,
            complete: false,
        };
        self.store
            .stage_meta(&load_key(self.desc.name()), &progress.encode()?)?;
        self.table.commit_load_step()?;
        self.committed = progress;
        Ok(progress)
    }

    /// Seals the rows at the epoch after the store's committed one (the durable store
    /// writes what it still buffers): the load's last step before its commit, which
    /// [`SealedLoad::commit`] makes when the caller decides. A load that committed steps
    /// commits its remaining rows as one more step first, and stages its record marked
    /// complete for the final commit.
    pub fn seal(mut self) -> Result<SealedLoad<S>> {
        let epoch = self.store.committed_epoch()?.map_or(1, |e| e + 1);
        if self.committed.steps > 0 {
            if self.rows > self.committed.rows {
                self.commit_step()?;
            }
            let done = LoadProgress {
                complete: true,
                ..self.committed
            };
            self.store
                .stage_meta(&load_key(self.desc.name()), &done.encode()?)?;
        }
        self.table.seal(epoch)?;
        Ok(SealedLoad {
            store: self.store,
            loaded: Loaded {
                rows: self.rows,
                epoch,
            },
        })
    }

    /// Seals and commits the rows (with whatever values were staged with
    /// `StateStore::stage_meta`). The store may then be compacted (`StateStore::compact`)
    /// before a backfill reads it.
    pub fn commit(self) -> Result<Loaded> {
        self.seal()?.commit()
    }
}

/// A load sealed and not yet committed ([`TableLoader::seal`]).
#[derive(Debug)]
pub struct SealedLoad<S: StateStore> {
    store: S,
    loaded: Loaded,
}

impl<S: StateStore> SealedLoad<S> {
    /// Commits the load (with whatever values were staged with `StateStore::stage_meta`).
    pub fn commit(self) -> Result<Loaded> {
        self.store.commit(self.loaded.epoch)?;
        Ok(self.loaded)
    }
}

impl<S: StateStore> std::fmt::Debug for TableLoader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLoader")
            .field("table", &self.desc.name())
            .field("rows", &self.rows)
            .field("committed", &self.committed)
            .finish_non_exhaustive()
    }
}

/// [`load_table`] from Parquet files, read in batches of `batch_size` rows. The files'
/// columns must be the table's (the same names and types, in the same order).
pub fn load_parquet<S: StateStore>(
    store: &S,
    desc: TableDesc,
    files: &[impl AsRef<Path>],
    batch_size: usize,
) -> Result<Loaded> {
    let mut readers = Vec::with_capacity(files.len());
    for file in files {
        let path = file.as_ref();
        let opened = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(opened)
            .map_err(|e| {
                Error::InvalidConfig(format!(
                    "{}: not a readable Parquet file: {e}",
                    path.display()
                ))
            })?
            .with_batch_size(batch_size.max(1))
            .build()?;
        readers.push(reader);
    }
    load_table(store, desc, readers.into_iter().flatten())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema, SchemaRef};

    use super::*;
    use crate::key::KeyColumn;
    use crate::store::io::{Fault, FaultyIo, RealIo, StorageIo};
    use crate::store::{Compaction, DurableOptions, DurableStore, MemoryStore, SnapshotScan};
    use crate::vnode::{VirtualNode, VnodeCount};

    const VNODES: usize = 8;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    fn desc() -> TableDesc {
        TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(VNODES).unwrap())
    }

    /// Rows `k` in `keys`, `v = 10 k`.
    fn batch(keys: impl IntoIterator<Item = i64>) -> RecordBatch {
        let k: Vec<i64> = keys.into_iter().collect();
        let v: Vec<i64> = k.iter().map(|k| k * 10).collect();
        RecordBatch::try_new(
            schema(),
            vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
        )
        .unwrap()
    }

    /// Every committed row of table `t`, by key.
    fn table_rows<S: StateStore>(store: &S) -> BTreeMap<i64, i64> {
        let epoch = store.committed_epoch().unwrap().unwrap();
        let table = store
            .table("t", VnodeBitmap::full(VnodeCount::new(VNODES).unwrap()))
            .unwrap();
        let mut rows = BTreeMap::new();
        for v in 0..VNODES {
            let mut scan = table
                .scan(VirtualNode::new(v as u16), None, epoch, 1000)
                .unwrap();
            while let Some(b) = scan.next_batch().unwrap() {
                let (k, val) = (b.batch.column(0), b.batch.column(1));
                let (k, val) = (
                    k.as_primitive::<Int64Type>(),
                    val.as_primitive::<Int64Type>(),
                );
                for i in 0..k.len() {
                    assert!(rows.insert(k.value(i), val.value(i)).is_none());
                }
            }
        }
        rows
    }

    fn expected(keys: impl IntoIterator<Item = i64>) -> BTreeMap<i64, i64> {
        keys.into_iter().map(|k| (k, k * 10)).collect()
    }

    fn options() -> DurableOptions {
        DurableOptions {
            memory_budget: 64 << 10,
            compaction: Compaction::Manual,
            block_cache: 1 << 20,
            ..DurableOptions::default()
        }
    }

    fn open(dir: &Path, io: Arc<dyn StorageIo>) -> crate::Result<DurableStore> {
        DurableStore::open_with(dir, io, options())
    }

    /// Loads keys `0..n` in batches of 100 (keys in order when `ordered`, else reversed per
    /// batch), a step every `every` batches.
    fn load_in_steps<S: StateStore>(store: &S, n: i64, every: usize, ordered: bool) -> Loaded {
        let mut loader = TableLoader::create(store, desc()).unwrap();
        for (i, start) in (0..n).step_by(100).enumerate() {
            let end = (start + 100).min(n);
            match ordered {
                true => loader.write(batch(start..end)).unwrap(),
                false => loader.write(batch((start..end).rev())).unwrap(),
            }
            if (i + 1) % every == 0 {
                let p = loader.commit_step().unwrap();
                assert_eq!((p.rows, p.complete), (end as u64, false));
            }
        }
        loader.commit().unwrap()
    }

    #[test]
    fn a_load_in_steps_holds_what_a_load_in_one_commit_holds() {
        for ordered in [true, false] {
            let memory = MemoryStore::new();
            let loaded = load_in_steps(&memory, 2000, 3, ordered);
            assert_eq!((loaded.rows, loaded.epoch), (2000, 1));
            assert_eq!(table_rows(&memory), expected(0..2000));
            let done = LoadProgress::of(&memory, "t").unwrap().unwrap();
            assert!(
                done.complete && done.rows == 2000 && done.steps == 7,
                "{done:?}"
            );

            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path(), RealIo::shared()).unwrap();
            load_in_steps(&store, 2000, 3, ordered);
            assert_eq!(table_rows(&store), expected(0..2000));
            drop(store);
            let store = open(dir.path(), RealIo::shared()).unwrap();
            assert_eq!(table_rows(&store), expected(0..2000), "reopened");
            store.compact().unwrap();
            assert_eq!(table_rows(&store), expected(0..2000), "compacted");
        }
    }

    #[test]
    fn a_resumed_load_starts_after_its_last_committed_step() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path(), RealIo::shared()).unwrap();
            let mut loader = TableLoader::create(&store, desc()).unwrap();
            loader.write(batch(0..300)).unwrap();
            loader.commit_step().unwrap();
            loader.write(batch(300..500)).unwrap();
            assert_eq!(loader.commit_step().unwrap().rows, 500);
            // Written, never committed: lost with the process.
            loader.write(batch(500..700)).unwrap();
        }
        let store = open(dir.path(), RealIo::shared()).unwrap();
        assert_eq!(store.committed_epoch().unwrap(), None, "no epoch yet");
        let (mut loader, progress) = TableLoader::resume(&store, "t").unwrap();
        assert_eq!(
            progress,
            LoadProgress {
                rows: 500,
                steps: 2,
                complete: false
            }
        );
        loader.write(batch(500..1000)).unwrap();
        let loaded = loader.commit().unwrap();
        assert_eq!((loaded.rows, loaded.epoch), (1000, 1));
        assert_eq!(table_rows(&store), expected(0..1000));
        let err = TableLoader::resume(&store, "t").unwrap_err();
        assert!(err.to_string().contains("loaded already"), "{err}");
    }

    #[test]
    fn a_table_with_no_step_has_no_load_to_resume() {
        let store = MemoryStore::new();
        let loader = TableLoader::create(&store, desc()).unwrap();
        drop(loader);
        let err = TableLoader::resume(&store, "t").unwrap_err();
        assert!(err.to_string().contains("no load in steps"), "{err}");
    }

    #[tokio::test]
    async fn a_half_loaded_table_is_never_backfilled() {
        let store = MemoryStore::new();
        // Another table committed an epoch: the store alone does not tell the load is not done.
        load_table(
            &store,
            TableDesc::new("other", schema(), vec![KeyColumn::asc("k")]).unwrap(),
            [Ok::<_, Error>(batch(0..10))],
        )
        .unwrap();
        let mut loader = TableLoader::create(&store, desc()).unwrap();
        loader.write(batch(0..100)).unwrap();
        loader.commit_step().unwrap();
        let (_tx, rx) = futures::channel::mpsc::channel::<crate::Result<crate::Change>>(1);
        let err = crate::BackfillJob::start(&store, "j", "t", crate::JobOptions::default(), rx)
            .unwrap_err();
        assert!(err.to_string().contains("half loaded"), "{err}");
    }

    /// A crash at every mutating I/O operation of a step's commit (and of the final commit):
    /// the reopened store holds the state before the step or after it, never another, and
    /// the load resumed from there ends with exactly the rows written.
    #[test]
    fn a_crash_while_a_step_commits_leaves_the_step_or_nothing() {
        let run = |io: Arc<dyn StorageIo>, dir: &Path| -> crate::Result<()> {
            let store = open(dir, io)?;
            let mut loader = TableLoader::create(&store, desc())?;
            loader.write(batch(0..400))?;
            loader.commit_step()?;
            loader.write(batch(400..800))?;
            loader.commit_step()?;
            loader.write(batch(800..1000))?;
            loader.commit()?;
            Ok(())
        };
        let counter = Arc::new(FaultyIo::new(RealIo::shared(), None, Fault::Crash));
        let dir = tempfile::tempdir().unwrap();
        run(counter.clone(), dir.path()).unwrap();
        let total = counter.operations();
        assert!(total > 10, "{total} operations");
        let mut outcomes = BTreeMap::new();
        for at in 1..=total {
            let dir = tempfile::tempdir().unwrap();
            let io = Arc::new(FaultyIo::new(RealIo::shared(), Some(at), Fault::Crash));
            assert!(run(io.clone(), dir.path()).is_err(), "operation {at}");
            io.lose_unsynced().unwrap();
            let store = open(dir.path(), RealIo::shared())
                .unwrap_or_else(|e| panic!("operation {at}: the reopen failed: {e}"));
            let outcome = if store.committed_epoch().unwrap().is_some() {
                assert_eq!(table_rows(&store), expected(0..1000), "operation {at}");
                "complete".to_string()
            } else {
                match TableLoader::resume(&store, "t") {
                    Ok((mut loader, progress)) => {
                        assert!([400, 800, 1000].contains(&progress.rows), "{progress:?}");
                        let from = progress.rows as i64;
                        loader.write(batch(from..1000)).unwrap();
                        loader.commit().unwrap();
                        assert_eq!(table_rows(&store), expected(0..1000), "operation {at}");
                        format!("resumed at {from}")
                    }
                    Err(e) => {
                        assert!(e.to_string().contains("no load"), "operation {at}: {e}");
                        "nothing".to_string()
                    }
                }
            };
            *outcomes.entry(outcome).or_insert(0) += 1;
        }
        // (The last operation is the final commit's fsync: a crash there loses that commit.)
        for seen in [
            "nothing",
            "resumed at 400",
            "resumed at 800",
            "resumed at 1000",
        ] {
            assert!(
                outcomes.contains_key(seen),
                "{seen} never seen: {outcomes:?}"
            );
        }
    }
}
