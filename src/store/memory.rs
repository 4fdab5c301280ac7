//! The in-memory columnar store: for embedding without a directory, for tests and for
//! benchmarks of the parts above the store.
//!
//! It is not the faster store on a whole replay: at `bdf9928` lineitem replayed 1.6x
//! (scale 0.2) and 2.5x (scale 1) slower on it than on the durable store, in 2 to 7 times
//! the memory; only the bundled 60k-row dataset was faster here (0.81x). The durable store
//! had the work of issues 7 and 10 (packed blocks, a block cache, the manifest log,
//! compaction off the critical path), this one did not (`BENCHMARKS.md`, "Durable against
//! the in-memory store"; `docs/benchmarks-history.md`, "The in-memory store is not the fast
//! one").
//!
//! Per table and vnode, the committed data is a list of sorted Arrow segments (about
//! [`SEGMENT_ROWS`](crate::runs::SEGMENT_ROWS) rows each, key ranges following each other).
//! Each sealed, uncommitted epoch is a layer of per-vnode delta runs (sorted, with
//! tombstones). Reads merge the base with the visible layers; `commit` folds layers into the
//! base, rewriting only the segments whose key range a delta touches.
//!
//! Nothing here is durable: the store lives as long as its last clone.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow_array::RecordBatch;
use hashbrown::HashMap;
use rayon::prelude::*;

use super::rules::{
    check_commit, check_handle, check_owned, check_read_epoch, check_seal, check_write,
    install_sealed, keep_replicated, known, meta_with_prefix, owner, replicated_visible,
};
use super::{KeyedBatch, ScanRows, SnapshotScan, StateStore, StateTable};
use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::key::Position;
use crate::runs::{MergeReader, Run, RunList, build_pending_runs, compact};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap};

/// One epoch's changes: a sorted delta run per touched vnode.
type Layer = HashMap<VirtualNode, Arc<Run>>;

/// The in-memory columnar state store. Clones share the same data.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<RwLock<Inner>>,
    writers: super::WriterClaims,
}

#[derive(Debug, Default)]
struct Inner {
    committed: Option<u64>,
    tables: HashMap<String, TableState>,
    meta: BTreeMap<String, String>,
    staged_meta: BTreeMap<String, String>,
}

#[derive(Debug)]
struct TableState {
    desc: Arc<TableDesc>,
    /// Per vnode, the committed segments.
    base: Vec<Vec<Arc<Run>>>,
    /// Sealed, uncommitted layers by epoch.
    sealed: BTreeMap<u64, Layer>,
}

impl Inner {
    fn table(&self, name: &str) -> Result<&TableState> {
        known(self.tables.get(name), name)
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> Result<RwLockReadGuard<'_, Inner>> {
        self.inner
            .read()
            .map_err(|_| internal!("memory store lock poisoned"))
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, Inner>> {
        self.inner
            .write()
            .map_err(|_| internal!("memory store lock poisoned"))
    }

    /// Drops every sealed layer above the committed epoch, as a crash would: what is left
    /// is exactly the committed state. Handles opened before must not be used afterwards.
    pub fn discard_uncommitted(&self) -> Result<()> {
        let mut inner = self.write()?;
        for table in inner.tables.values_mut() {
            table.sealed.clear();
        }
        Ok(())
    }

    fn open(&self, name: &str, vnodes: VnodeBitmap, replicated: bool) -> Result<MemoryTable> {
        let desc = self.read()?.table(name)?.desc.clone();
        check_handle(&desc, &vnodes)?;
        Ok(MemoryTable {
            store: self.clone(),
            desc,
            vnodes,
            replicated,
            pending: Vec::new(),
            last_sealed: None,
            local: BTreeMap::new(),
        })
    }
}

impl StateStore for MemoryStore {
    type Table = MemoryTable;

    fn create_table(&self, desc: TableDesc) -> Result<Arc<TableDesc>> {
        let mut inner = self.write()?;
        if inner.tables.contains_key(desc.name()) {
            return Err(Error::TableExists(desc.name().to_string()));
        }
        let desc = Arc::new(desc);
        inner.tables.insert(
            desc.name().to_string(),
            TableState {
                desc: desc.clone(),
                base: vec![Vec::new(); desc.vnode_count().get()],
                sealed: BTreeMap::new(),
            },
        );
        Ok(desc)
    }

    fn table(&self, name: &str, vnodes: VnodeBitmap) -> Result<MemoryTable> {
        self.open(name, vnodes, false)
    }

    fn table_desc(&self, name: &str) -> Result<Arc<TableDesc>> {
        Ok(self.read()?.table(name)?.desc.clone())
    }

    fn replicated_table(&self, name: &str, vnodes: VnodeBitmap) -> Result<MemoryTable> {
        self.open(name, vnodes, true)
    }

    fn commit(&self, epoch: u64) -> Result<()> {
        let mut inner = self.write()?;
        check_commit(epoch, inner.committed)?;
        // Compute every table's new base first, then swap: a failure leaves the store as it was.
        let mut updates = Vec::with_capacity(inner.tables.len());
        for (name, table) in &inner.tables {
            let mut deltas: HashMap<VirtualNode, Vec<Arc<Run>>> = HashMap::new();
            for layer in table.sealed.range(..=epoch).map(|(_, layer)| layer) {
                for (vnode, run) in layer {
                    deltas.entry(*vnode).or_default().push(run.clone());
                }
            }
            if deltas.is_empty() {
                continue;
            }
            let new_base: Vec<(VirtualNode, Vec<Arc<Run>>)> = deltas
                .into_iter()
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|(vnode, runs): (VirtualNode, Vec<Arc<Run>>)| {
                    Ok((vnode, compact(&table.base[vnode.index()], &runs)?))
                })
                .collect::<Result<_>>()?;
            updates.push((name.clone(), new_base));
        }
        for (name, new_base) in updates {
            if let Some(table) = inner.tables.get_mut(&name) {
                for (vnode, segments) in new_base {
                    table.base[vnode.index()] = segments;
                }
            }
        }
        for table in inner.tables.values_mut() {
            table.sealed = table.sealed.split_off(&(epoch + 1));
        }
        inner.committed = Some(epoch);
        let staged = std::mem::take(&mut inner.staged_meta);
        inner.meta.extend(staged);
        Ok(())
    }

    fn writer_claims(&self) -> &super::WriterClaims {
        &self.writers
    }

    fn committed_epoch(&self) -> Result<Option<u64>> {
        Ok(self.read()?.committed)
    }

    fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self.read()?.meta.get(key).cloned())
    }

    fn discard_uncommitted_of(&self, table: &str) -> Result<()> {
        let mut inner = self.write()?;
        let table = (inner.tables.get_mut(table))
            .ok_or_else(|| Error::InvalidConfig(format!("no table `{table}` in the store")))?;
        table.sealed.clear();
        Ok(())
    }

    fn stage_meta(&self, key: &str, value: &str) -> Result<()> {
        self.write()?
            .staged_meta
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn meta_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(meta_with_prefix(&self.read()?.meta, prefix))
    }
}

/// A handle on some vnodes of a table in a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryTable {
    store: MemoryStore,
    desc: Arc<TableDesc>,
    vnodes: VnodeBitmap,
    replicated: bool,
    /// Chunks written since the last seal, with each row's vnode.
    pending: Vec<(StreamChunk, Vec<VirtualNode>)>,
    last_sealed: Option<u64>,
    /// A replicated handle's own layers (never visible to others, never committed).
    local: BTreeMap<u64, Layer>,
}

impl MemoryTable {
    /// How many private layers a replicated handle holds (layers at or below the committed
    /// epoch are dropped at its next seal): the bound on replicated buffering.
    pub fn replicated_layers(&self) -> usize {
        self.local.len()
    }

    /// The delta runs of `vnode` visible at `epoch`, oldest first.
    fn visible_deltas(
        &self,
        inner: &Inner,
        vnode: VirtualNode,
        epoch: u64,
    ) -> Result<Vec<Arc<Run>>> {
        let layers: Box<dyn Iterator<Item = &Layer>> = if self.replicated {
            Box::new(replicated_visible(&self.local, inner.committed, epoch))
        } else {
            Box::new(
                inner
                    .table(self.desc.name())?
                    .sealed
                    .range(..=epoch)
                    .map(|(_, l)| l),
            )
        };
        Ok(layers
            .filter_map(|layer| layer.get(&vnode).cloned())
            .collect())
    }
}

impl StateTable for MemoryTable {
    type Scan = MemoryScan;

    fn desc(&self) -> &Arc<TableDesc> {
        &self.desc
    }

    fn vnodes(&self) -> &VnodeBitmap {
        &self.vnodes
    }

    fn write(&mut self, chunk: &StreamChunk) -> Result<()> {
        let vnodes = check_write(&self.desc, &self.vnodes, chunk, || {
            owner(&self.desc, self.replicated)
        })?;
        if !chunk.is_empty() {
            self.pending.push((chunk.clone(), vnodes));
        }
        Ok(())
    }

    fn seal(&mut self, epoch: u64) -> Result<()> {
        let committed = self.store.committed_epoch()?;
        check_seal(
            &self.desc,
            epoch,
            self.last_sealed,
            committed,
            self.replicated,
        )?;
        let layer: Layer = build_pending_runs(&self.desc, &self.pending)?
            .into_iter()
            .map(|(vnode, run)| (vnode, Arc::new(run)))
            .collect();
        if self.replicated {
            let layer = (!layer.is_empty()).then_some(layer);
            keep_replicated(&mut self.local, committed, epoch, layer);
        } else if !layer.is_empty() {
            let mut inner = self.store.write()?;
            let name = self.desc.name();
            let table = known(inner.tables.get_mut(name), name)?;
            install_sealed(
                table.sealed.entry(epoch).or_default(),
                layer,
                &self.desc,
                epoch,
            )?;
        }
        self.pending.clear();
        self.last_sealed = Some(epoch);
        Ok(())
    }

    /// Folds the pending rows into the committed segments of their vnodes and makes the
    /// staged job values visible; the committed epoch is unchanged.
    fn commit_load_step(&mut self) -> Result<()> {
        if self.replicated {
            return Err(Error::InvalidConfig(
                "a replicated handle's writes are never committed".into(),
            ));
        }
        let runs = build_pending_runs(&self.desc, &self.pending)?;
        let mut inner = self.store.write()?;
        let name = self.desc.name();
        let table = known(inner.tables.get_mut(name), name)?;
        if let Some(epoch) = table.sealed.keys().next() {
            return Err(Error::InvalidConfig(format!(
                "a load step of table `{name}`, which has epoch {epoch} sealed and not \
                 committed: a load step is for a table nothing else writes"
            )));
        }
        let new_base: Vec<(VirtualNode, Vec<Arc<Run>>)> = runs
            .into_par_iter()
            .map(|(vnode, run)| {
                Ok((
                    vnode,
                    compact(&table.base[vnode.index()], &[Arc::new(run)])?,
                ))
            })
            .collect::<Result<_>>()?;
        for (vnode, segments) in new_base {
            table.base[vnode.index()] = segments;
        }
        self.pending.clear();
        let staged = std::mem::take(&mut inner.staged_meta);
        inner.meta.extend(staged);
        Ok(())
    }

    fn scan(
        &self,
        vnode: VirtualNode,
        after: Option<&Position>,
        epoch: u64,
        batch_size: usize,
    ) -> Result<MemoryScan> {
        check_owned(&self.desc, &self.vnodes, self.replicated, vnode)?;
        let inner = self.store.read()?;
        check_read_epoch(self.desc.name(), epoch, inner.committed)?;
        let table = inner.table(self.desc.name())?;
        let mut sources: Vec<Box<dyn RunList>> = vec![Box::new(table.base[vnode.index()].clone())];
        for run in self.visible_deltas(&inner, vnode, epoch)? {
            sources.push(Box::new(vec![run]));
        }
        Ok(MemoryScan {
            reader: MergeReader::new(sources, after.map(Position::as_bytes), batch_size)?,
        })
    }

    fn get(&self, vnode: VirtualNode, key: &[u8], epoch: u64) -> Result<Option<RecordBatch>> {
        check_owned(&self.desc, &self.vnodes, self.replicated, vnode)?;
        let inner = self.store.read()?;
        check_read_epoch(self.desc.name(), epoch, inner.committed)?;
        for run in self.visible_deltas(&inner, vnode, epoch)?.iter().rev() {
            if let Some(row) = run.find(key) {
                return Ok((!run.is_deleted(row)).then(|| run.row(row)));
            }
        }
        let table = inner.table(self.desc.name())?;
        for segment in &table.base[vnode.index()] {
            if segment.last_key().is_some_and(|last| last >= key) {
                return Ok(segment.find(key).map(|row| segment.row(row)));
            }
        }
        Ok(None)
    }

    fn committed_rows(&self, vnode: VirtualNode) -> Result<usize> {
        let inner = self.store.read()?;
        let table = inner.table(self.desc.name())?;
        Ok(table
            .base
            .get(vnode.index())
            .map_or(0, |segments| segments.iter().map(|s| s.len()).sum()))
    }
}

/// A scan of one vnode of a [`MemoryTable`]; holds its own references, not the lock.
pub struct MemoryScan {
    reader: MergeReader,
}

impl SnapshotScan for MemoryScan {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        self.reader.next_batch()
    }

    /// A range of the rows the run was read into when the batch is one (no arrays sliced).
    fn next_rows(&mut self) -> Result<Option<ScanRows>> {
        Ok(self.reader.next_run()?.map(ScanRows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyColumn;
    use crate::vnode::VnodeCount;
    use arrow_schema::{DataType, Field, Schema, SchemaRef};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    fn store_with_table(vnodes: usize) -> (MemoryStore, Arc<TableDesc>) {
        let store = MemoryStore::new();
        let desc = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(vnodes).unwrap());
        let desc = store.create_table(desc).unwrap();
        (store, desc)
    }

    fn chunk(text: &str) -> StreamChunk {
        StreamChunk::from_text(&schema(), text).unwrap()
    }

    #[test]
    fn unknown_and_duplicate_tables_are_errors() {
        let (store, desc) = store_with_table(1);
        assert!(matches!(
            store.table("nope", VnodeBitmap::full(desc.vnode_count())),
            Err(Error::UnknownTable(t)) if t == "nope"
        ));
        let again = TableDesc::new("t", schema(), vec![KeyColumn::asc("k")]).unwrap();
        assert!(matches!(
            store.create_table(again),
            Err(Error::TableExists(_))
        ));
    }

    #[test]
    fn schema_mismatch_is_an_error() {
        let (store, desc) = store_with_table(1);
        let mut t = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        let other = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let bad = StreamChunk::from_text(&other, "+ 1").unwrap();
        assert!(matches!(t.write(&bad), Err(Error::SchemaMismatch { .. })));
    }

    #[test]
    fn epochs_must_go_forward() {
        let (store, desc) = store_with_table(1);
        let mut t = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        t.seal(5).unwrap();
        assert!(matches!(
            t.seal(5),
            Err(Error::EpochOrder {
                epoch: 5,
                previous: 5,
                ..
            })
        ));
        store.commit(5).unwrap();
        assert!(matches!(store.commit(4), Err(Error::EpochOrder { .. })));
        let mut late = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        assert!(matches!(late.seal(3), Err(Error::EpochOrder { .. })));
        assert!(matches!(
            t.scan(VirtualNode::ZERO, None, 4, 10),
            Err(Error::StaleRead {
                epoch: 4,
                committed: 5,
                ..
            })
        ));
    }

    #[test]
    fn writes_to_unowned_vnodes_are_rejected() {
        let (store, desc) = store_with_table(4);
        let batch = chunk("+ 1 a");
        let vnode = desc.vnodes_of(batch.batch()).unwrap()[0];
        let others = VnodeBitmap::from_vnodes(
            desc.vnode_count(),
            desc.vnode_count().vnodes().filter(|v| *v != vnode),
        )
        .unwrap();
        let mut t = store.table("t", others).unwrap();
        assert!(matches!(
            t.write(&batch),
            Err(Error::VnodeNotOwned { vnode: v, .. }) if v == vnode.get()
        ));
        assert!(matches!(
            t.scan(vnode, None, 1, 10),
            Err(Error::VnodeNotOwned { .. })
        ));
    }

    #[test]
    fn view_columns_do_not_pile_up_buffers_across_commits() {
        use arrow_array::cast::AsArray;
        use arrow_array::{Int64Array, RecordBatch, StringViewArray};
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8View, false),
        ]));
        let store = MemoryStore::new();
        let desc = TableDesc::new("views", schema.clone(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(1).unwrap());
        store.create_table(desc).unwrap();
        let mut t = store
            .table("views", VnodeBitmap::full(VnodeCount::new(1).unwrap()))
            .unwrap();
        let batch = |keys: Vec<i64>| {
            let values: Vec<String> = keys
                .iter()
                .map(|k| format!("a long string value {k:>20}"))
                .collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(keys)),
                    Arc::new(StringViewArray::from_iter_values(values)),
                ],
            )
            .unwrap()
        };
        t.write(&StreamChunk::inserts(batch(
            (0..1000).map(|k| k * 2).collect(),
        )))
        .unwrap();
        t.seal(1).unwrap();
        store.commit(1).unwrap();
        for epoch in 2..14u64 {
            // Sparse inserts between existing keys rewrite the one segment every commit.
            t.write(&StreamChunk::inserts(batch(vec![
                epoch as i64 * 20 + 1,
                epoch as i64 * 40 + 1,
            ])))
            .unwrap();
            t.seal(epoch).unwrap();
            store.commit(epoch).unwrap();
        }
        let mut scan = t.scan(VirtualNode::ZERO, None, 13, 4096).unwrap();
        while let Some(b) = scan.next_batch().unwrap() {
            let buffers = b.batch.column(1).as_string_view().data_buffers().len();
            assert!(buffers <= 2, "{buffers} data buffers after 12 rewrites");
        }
    }

    #[test]
    fn replicated_layers_are_private_and_dropped_on_commit() {
        let (store, desc) = store_with_table(1);
        let all = VnodeBitmap::full(desc.vnode_count());
        let mut upstream = store.table("t", all.clone()).unwrap();
        let mut repl = store.replicated_table("t", all.clone()).unwrap();
        let reader = store.table("t", all).unwrap();
        repl.write(&chunk("+ 1 a")).unwrap();
        repl.seal(1).unwrap();
        let rows = |t: &MemoryTable, epoch| {
            let mut scan = t.scan(VirtualNode::ZERO, None, epoch, 10).unwrap();
            let mut n = 0;
            while let Some(b) = scan.next_batch().unwrap() {
                n += b.num_rows();
            }
            n
        };
        assert_eq!(rows(&repl, 1), 1, "a replicated handle reads its own layer");
        assert_eq!(rows(&reader, 1), 0, "nobody else does");
        upstream.write(&chunk("+ 1 a\n+ 2 b")).unwrap();
        upstream.seal(1).unwrap();
        store.commit(1).unwrap();
        assert_eq!(
            rows(&repl, 1),
            2,
            "after commit the base holds the upstream's rows"
        );
        // A late replicated layer at or below the committed epoch is dropped, not applied.
        repl.write(&chunk("- 2 b")).unwrap();
        repl.seal(2).unwrap();
        assert_eq!(rows(&repl, 2), 1);
        store.commit(2).unwrap();
        assert_eq!(
            rows(&repl, 2),
            2,
            "the layer of epoch 2 is gone once 2 is committed"
        );
    }
}
