//! Per-vnode backfill progress: what it is, how it moves, how it is persisted.
//!
//! ```text
//!   NotStarted ──snapshot rows emitted──▶ InProgress { pos, rows } ──scan exhausted──▶ Completed { rows }
//!        │                                    │   ▲                                      ▲
//!        │                                    └───┘ pos only grows (I4)                  │
//!        └────────────── empty vnode: scan exhausted before any row ─────────────────────┘
//! ```
//!
//! Each vnode keeps its current state and the copy last handed to the progress table, so a
//! barrier persists only the vnodes that changed. The progress table has one row per vnode
//! (an absent row means NotStarted):
//!
//! | column            | type                 | meaning                                   |
//! |-------------------|----------------------|-------------------------------------------|
//! | `vnode`           | UInt16, key          | the vnode (also the row's own vnode)      |
//! | `pos_<pk column>` | the pk column's type | the position's key values (NULL when done) |
//! | `finished`        | Boolean              | Completed                                 |
//! | `row_count`       | UInt64               | snapshot rows emitted for the vnode       |
//!
//! Positions are stored as typed values and re-encoded on load (see [`crate::key`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt16Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, RecordBatch, UInt16Array, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};

use crate::chunk::StreamChunk;
use crate::error::{Error, Result, internal};
use crate::key::{KeyColumn, Position, PrimaryKey};
use crate::store::{SnapshotScan, StateTable};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeBitmap, VnodeCount};

/// The backfill state of one vnode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VnodeProgress {
    /// No snapshot row emitted yet.
    NotStarted,
    /// Snapshot rows up to and including `pos` were emitted.
    InProgress {
        /// Key of the last snapshot row emitted.
        pos: Position,
        /// Snapshot rows emitted so far.
        rows: u64,
    },
    /// The whole snapshot of the vnode was emitted.
    Completed {
        /// Snapshot rows emitted in all.
        rows: u64,
    },
}

impl VnodeProgress {
    /// Snapshot rows emitted so far.
    pub fn rows(&self) -> u64 {
        match self {
            VnodeProgress::NotStarted => 0,
            VnodeProgress::InProgress { rows, .. } | VnodeProgress::Completed { rows } => *rows,
        }
    }

    /// True when Completed.
    pub fn is_completed(&self) -> bool {
        matches!(self, VnodeProgress::Completed { .. })
    }

    /// The position to scan after (`None` when nothing was emitted yet).
    pub fn position(&self) -> Option<&Position> {
        match self {
            VnodeProgress::InProgress { pos, .. } => Some(pos),
            _ => None,
        }
    }
}

/// How many owned vnodes are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnodeStateCounts {
    /// Not started.
    pub not_started: usize,
    /// In progress.
    pub in_progress: usize,
    /// Completed.
    pub completed: usize,
}

/// A vnode in progress, for the "slowest vnodes" of a progress report: in progress the
/// longest, that is since the earliest epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlowVnode {
    /// The epoch it has been in progress since; for a vnode restored in progress (a
    /// resumed job, or an actor started by a rescale), the epoch it was restored at.
    pub since_epoch: u64,
    /// The vnode.
    pub vnode: VirtualNode,
    /// Its snapshot rows emitted so far.
    pub rows: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    current: VnodeProgress,
    committed: VnodeProgress,
    /// Listed in [`ProgressMap::dirty`].
    dirty: bool,
    /// While InProgress: the epoch it became so (its key in [`ProgressMap::in_progress`]).
    since: u64,
}

/// The progress of every owned vnode, current and as last persisted.
///
/// Every query a barrier or a progress report makes is O(1) or proportional to the vnodes
/// that changed, never to the vnode count: the counts per state and the row total are kept
/// up to date as vnodes move, and changed vnodes are listed as they change.
#[derive(Debug, Clone)]
pub struct ProgressMap {
    /// Indexed by vnode; `None` for vnodes this backfill does not own.
    entries: Vec<Option<Entry>>,
    owned: VnodeBitmap,
    counts: VnodeStateCounts,
    total_rows: u64,
    /// Vnodes changed since the last [`ProgressMap::mark_persisted`] (each listed once).
    dirty: Vec<VirtualNode>,
    /// The open epoch (see [`ProgressMap::set_epoch`]).
    epoch: u64,
    /// The InProgress vnodes by the epoch they became so: the slowest first.
    in_progress: BTreeSet<(u64, VirtualNode)>,
}

impl ProgressMap {
    /// Every owned vnode NotStarted.
    pub fn new(owned: VnodeBitmap) -> Self {
        let mut entries = vec![None; owned.count().get()];
        let mut not_started = 0;
        for v in owned.iter() {
            entries[v.index()] = Some(Entry {
                current: VnodeProgress::NotStarted,
                committed: VnodeProgress::NotStarted,
                dirty: false,
                since: 0,
            });
            not_started += 1;
        }
        Self {
            entries,
            owned,
            counts: VnodeStateCounts {
                not_started,
                ..VnodeStateCounts::default()
            },
            total_rows: 0,
            dirty: Vec::new(),
            epoch: 0,
            in_progress: BTreeSet::new(),
        }
    }

    /// The epoch now open: a vnode that starts from now on is in progress since it.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Up to `n` InProgress vnodes, the longest in progress first (ties by vnode).
    pub fn slowest(&self, n: usize) -> Vec<SlowVnode> {
        self.in_progress
            .iter()
            .take(n)
            .map(|&(since_epoch, vnode)| SlowVnode {
                since_epoch,
                vnode,
                rows: self.get(vnode).map_or(0, VnodeProgress::rows),
            })
            .collect()
    }

    /// The owned vnodes.
    pub fn owned(&self) -> &VnodeBitmap {
        &self.owned
    }

    /// The state of `vnode`, `None` if not owned.
    pub fn get(&self, vnode: VirtualNode) -> Option<&VnodeProgress> {
        self.entries
            .get(vnode.index())
            .and_then(|e| e.as_ref())
            .map(|e| &e.current)
    }

    /// Owned vnodes with their states, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (VirtualNode, &VnodeProgress)> {
        self.owned
            .iter()
            .filter_map(|v| self.get(v).map(|p| (v, p)))
    }

    /// Replaces the current state of `vnode`, keeping the counters and the dirty list.
    fn set(&mut self, vnode: VirtualNode, state: VnodeProgress) -> Result<()> {
        let entry = self
            .entries
            .get_mut(vnode.index())
            .and_then(|e| e.as_mut())
            .ok_or(Error::VnodeNotOwned {
                vnode: vnode.get(),
                owner: "this backfill".into(),
            })?;
        *self.counts.of_mut(&entry.current) -= 1;
        *self.counts.of_mut(&state) += 1;
        self.total_rows = self.total_rows - entry.current.rows() + state.rows();
        let in_progress = |p: &VnodeProgress| matches!(p, VnodeProgress::InProgress { .. });
        match (in_progress(&entry.current), in_progress(&state)) {
            (false, true) => {
                entry.since = self.epoch;
                self.in_progress.insert((self.epoch, vnode));
            }
            (true, false) => {
                self.in_progress.remove(&(entry.since, vnode));
            }
            _ => {}
        }
        entry.current = state;
        if !entry.dirty {
            entry.dirty = true;
            self.dirty.push(vnode);
        }
        Ok(())
    }

    /// `rows` more snapshot rows of `vnode` were emitted, the last one at `pos`.
    /// Positions only grow (I4); a Completed vnode cannot advance.
    pub fn advance(&mut self, vnode: VirtualNode, pos: Position, rows: u64) -> Result<()> {
        let next = match self.get(vnode) {
            None => {
                return Err(Error::VnodeNotOwned {
                    vnode: vnode.get(),
                    owner: "this backfill".into(),
                });
            }
            Some(VnodeProgress::NotStarted) => VnodeProgress::InProgress { pos, rows },
            Some(VnodeProgress::InProgress { pos: old, rows: n }) => {
                if pos <= *old {
                    return Err(internal!("vnode {vnode}: position would move backwards"));
                }
                VnodeProgress::InProgress {
                    pos,
                    rows: n + rows,
                }
            }
            Some(VnodeProgress::Completed { .. }) => {
                return Err(internal!("vnode {vnode}: snapshot rows after completion"));
            }
        };
        self.set(vnode, next)
    }

    /// The snapshot of `vnode` is exhausted: Completed (idempotent).
    pub fn complete(&mut self, vnode: VirtualNode) -> Result<()> {
        let rows = self
            .get(vnode)
            .ok_or(Error::VnodeNotOwned {
                vnode: vnode.get(),
                owner: "this backfill".into(),
            })?
            .rows();
        self.set(vnode, VnodeProgress::Completed { rows })
    }

    /// True when every owned vnode is Completed.
    pub fn is_finished(&self) -> bool {
        self.counts.not_started == 0 && self.counts.in_progress == 0
    }

    /// Vnodes per state.
    pub fn counts(&self) -> VnodeStateCounts {
        self.counts
    }

    /// Snapshot rows emitted over all owned vnodes.
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }

    /// Vnodes whose state changed since the last [`ProgressMap::mark_persisted`], ascending.
    pub fn changed(&self) -> impl Iterator<Item = (VirtualNode, &VnodeProgress)> {
        let mut dirty = self.dirty.clone();
        dirty.sort_unstable();
        dirty.into_iter().filter_map(|v| {
            let e = self.entries[v.index()].as_ref()?;
            (e.current != e.committed).then_some((v, &e.current))
        })
    }

    /// Records that the current states were handed to the progress table.
    pub fn mark_persisted(&mut self) {
        for v in std::mem::take(&mut self.dirty) {
            if let Some(e) = self.entries[v.index()].as_mut() {
                e.committed = e.current.clone();
                e.dirty = false;
            }
        }
    }

    /// Sets a vnode's state without marking it changed (used when restoring).
    fn restore_entry(&mut self, vnode: VirtualNode, state: VnodeProgress) -> Result<()> {
        let was_dirty = self.entries[vnode.index()]
            .as_ref()
            .is_some_and(|e| e.dirty);
        self.set(vnode, state.clone())?;
        if let Some(e) = self.entries[vnode.index()].as_mut() {
            e.committed = state;
            e.dirty = was_dirty;
        }
        if !was_dirty {
            // `set` listed it last.
            self.dirty.pop();
        }
        Ok(())
    }
}

impl VnodeStateCounts {
    /// The counter of `state`'s kind.
    fn of_mut(&mut self, state: &VnodeProgress) -> &mut usize {
        match state {
            VnodeProgress::NotStarted => &mut self.not_started,
            VnodeProgress::InProgress { .. } => &mut self.in_progress,
            VnodeProgress::Completed { .. } => &mut self.completed,
        }
    }
}

/// The codec between progress states and rows of the progress table.
#[derive(Debug, Clone)]
pub struct ProgressCodec {
    pk: PrimaryKey,
    desc: Arc<TableDesc>,
}

impl ProgressCodec {
    /// The progress table `name` for a backfill of a table with key `pk` over `vnode_count`
    /// vnodes.
    pub fn new(name: &str, pk: &PrimaryKey, vnode_count: VnodeCount) -> Result<Self> {
        let mut fields = vec![Field::new("vnode", DataType::UInt16, false)];
        // Positions are kept in their decoded types (dictionaries as their values).
        for field in pk.decoded_schema().fields() {
            fields.push(Field::new(
                format!("pos_{}", field.name()),
                field.data_type().clone(),
                true,
            ));
        }
        fields.push(Field::new("finished", DataType::Boolean, false));
        fields.push(Field::new("row_count", DataType::UInt64, false));
        let schema = Arc::new(Schema::new(fields));
        let desc = TableDesc::new(name, schema, vec![KeyColumn::asc("vnode")])?
            .with_vnode_count(vnode_count)
            .with_vnode_column("vnode")?;
        Ok(Self {
            pk: pk.clone(),
            desc: Arc::new(desc),
        })
    }

    /// The progress table's definition (create it in the store once).
    pub fn desc(&self) -> &Arc<TableDesc> {
        &self.desc
    }

    /// The rows for some vnode states, as upserts (`Insert` replaces the vnode's row).
    pub fn encode<'a>(
        &self,
        states: impl IntoIterator<Item = (VirtualNode, &'a VnodeProgress)>,
    ) -> Result<Option<StreamChunk>> {
        let mut vnodes = Vec::new();
        let mut finished = Vec::new();
        let mut counts = Vec::new();
        let mut positions: Vec<&[u8]> = Vec::new();
        let mut take: Vec<Option<u32>> = Vec::new();
        for (vnode, state) in states {
            vnodes.push(vnode.get());
            finished.push(state.is_completed());
            counts.push(state.rows());
            match state.position() {
                Some(pos) => {
                    take.push(Some(positions.len() as u32));
                    positions.push(pos.as_bytes());
                }
                None => take.push(None),
            }
        }
        if vnodes.is_empty() {
            return Ok(None);
        }
        let decoded = if positions.is_empty() {
            self.pk
                .decoded_schema()
                .fields()
                .iter()
                .map(|f| arrow_array::new_empty_array(f.data_type()))
                .collect()
        } else {
            self.pk.decode(positions)?
        };
        let take = UInt32Array::from(take);
        let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt16Array::from(vnodes))];
        for column in decoded {
            columns.push(arrow_select::take::take(&column, &take, None)?);
        }
        columns.push(Arc::new(BooleanArray::from(finished)));
        columns.push(Arc::new(UInt64Array::from(counts)));
        let batch = RecordBatch::try_new(self.desc.schema().clone(), columns)?;
        Ok(Some(StreamChunk::inserts(batch)))
    }

    /// Decodes one progress row.
    fn decode_row(&self, batch: &RecordBatch, row: usize) -> Result<(VirtualNode, VnodeProgress)> {
        let corrupt = |message: String| Error::CorruptState {
            context: format!("progress table `{}`", self.desc.name()),
            message,
        };
        let width = batch.num_columns();
        let key_width = self.pk.key_schema().fields().len();
        if width != key_width + 3 {
            return Err(corrupt(format!(
                "{width} columns, expected {}",
                key_width + 3
            )));
        }
        let vnode = batch.column(0).as_primitive::<UInt16Type>().value(row);
        let finished = batch.column(width - 2).as_boolean();
        let rows = batch.column(width - 1).as_primitive::<UInt64Type>();
        if finished.is_null(row) || rows.is_null(row) {
            return Err(corrupt(format!("NULL flag or row count for vnode {vnode}")));
        }
        let rows = rows.value(row);
        let state = if finished.value(row) {
            VnodeProgress::Completed { rows }
        } else {
            let key = RecordBatch::try_new(
                self.pk.decoded_schema().clone(),
                batch.columns()[1..=key_width].to_vec(),
            )
            .map_err(|e| corrupt(format!("position of vnode {vnode}: {e}")))?;
            VnodeProgress::InProgress {
                pos: Position::from_batch(&self.pk, &key, row)?,
                rows,
            }
        };
        Ok((VirtualNode::new(vnode), state))
    }

    /// Restores the progress of `owned` vnodes from the progress table at `epoch`
    /// (an absent row means NotStarted).
    pub fn restore(
        &self,
        table: &impl StateTable,
        owned: VnodeBitmap,
        epoch: u64,
    ) -> Result<ProgressMap> {
        let mut map = ProgressMap::new(owned.clone());
        // Vnodes restored in progress are so since (at least) the restored epoch.
        map.set_epoch(epoch);
        for vnode in owned.iter() {
            let mut scan = table.scan(vnode, None, epoch, 16)?;
            while let Some(keyed) = scan.next_batch()? {
                for row in 0..keyed.num_rows() {
                    let (v, state) = self.decode_row(&keyed.batch, row)?;
                    if v != vnode {
                        return Err(Error::CorruptState {
                            context: format!("progress table `{}`", self.desc.name()),
                            message: format!("row of vnode {v} stored in vnode {vnode}"),
                        });
                    }
                    map.restore_entry(vnode, state)?;
                }
            }
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, StateStore};
    use arrow_array::{Int32Array, StringArray};

    fn pk() -> PrimaryKey {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int32, false),
        ]);
        PrimaryKey::new(&schema, vec![KeyColumn::asc("s"), KeyColumn::desc("i")]).unwrap()
    }

    fn pos(pk: &PrimaryKey, s: Option<&str>, i: i32) -> Position {
        let batch = RecordBatch::try_new(
            pk.key_schema().clone(),
            vec![
                Arc::new(StringArray::from(vec![s])),
                Arc::new(Int32Array::from(vec![i])),
            ],
        )
        .unwrap();
        Position::from_batch(pk, &batch, 0).unwrap()
    }

    fn v(n: u16) -> VirtualNode {
        VirtualNode::new(n)
    }

    #[test]
    fn positions_only_grow_and_completed_is_final() {
        let pk = pk();
        let mut map = ProgressMap::new(VnodeBitmap::full(VnodeCount::new(4).unwrap()));
        map.advance(v(1), pos(&pk, Some("b"), 1), 3).unwrap();
        assert!(map.advance(v(1), pos(&pk, Some("a"), 9), 1).is_err());
        assert!(map.advance(v(1), pos(&pk, Some("b"), 1), 1).is_err());
        map.advance(v(1), pos(&pk, Some("b"), 0), 2).unwrap();
        assert_eq!(map.get(v(1)).unwrap().rows(), 5);
        map.complete(v(1)).unwrap();
        assert_eq!(map.get(v(1)), Some(&VnodeProgress::Completed { rows: 5 }));
        assert!(map.advance(v(1), pos(&pk, Some("c"), 0), 1).is_err());
        let c = map.counts();
        assert_eq!((c.not_started, c.in_progress, c.completed), (3, 0, 1));
        assert!(!map.is_finished());
    }

    #[test]
    fn unowned_vnodes_are_errors() {
        let count = VnodeCount::new(4).unwrap();
        let mut map = ProgressMap::new(VnodeBitmap::from_vnodes(count, [v(0)]).unwrap());
        assert!(matches!(
            map.complete(v(2)),
            Err(Error::VnodeNotOwned { vnode: 2, .. })
        ));
        assert_eq!(map.get(v(2)), None);
    }

    #[test]
    fn only_changed_vnodes_are_persisted() {
        let pk = pk();
        let mut map = ProgressMap::new(VnodeBitmap::full(VnodeCount::new(4).unwrap()));
        assert_eq!(map.changed().count(), 0);
        map.advance(v(2), pos(&pk, None, 1), 1).unwrap();
        map.complete(v(3)).unwrap();
        let changed: Vec<_> = map.changed().map(|(v, _)| v).collect();
        assert_eq!(changed, vec![v(2), v(3)]);
        map.mark_persisted();
        assert_eq!(map.changed().count(), 0);
    }

    #[test]
    fn progress_round_trips_through_the_store() {
        let pk = pk();
        let count = VnodeCount::new(8).unwrap();
        let codec = ProgressCodec::new("progress", &pk, count).unwrap();
        let store = MemoryStore::new();
        store.create_table(codec.desc().as_ref().clone()).unwrap();
        let owned = VnodeBitmap::from_vnodes(count, [v(1), v(2), v(5), v(7)]).unwrap();
        let mut table = store.table("progress", owned.clone()).unwrap();

        let mut map = ProgressMap::new(owned.clone());
        map.advance(v(1), pos(&pk, Some("x"), -3), 10).unwrap();
        map.advance(v(2), pos(&pk, None, 7), 4).unwrap(); // a NULL key value in the position
        map.complete(v(5)).unwrap();
        let chunk = codec.encode(map.changed()).unwrap().unwrap();
        assert_eq!(chunk.num_rows(), 3);
        table.write(&chunk).unwrap();
        table.seal(1).unwrap();
        store.commit(1).unwrap();
        map.mark_persisted();

        let restored = codec.restore(&table, owned.clone(), 1).unwrap();
        for (vnode, state) in map.iter() {
            assert_eq!(restored.get(vnode), Some(state), "vnode {vnode}");
        }
        assert_eq!(restored.get(v(7)), Some(&VnodeProgress::NotStarted));
        assert_eq!(
            restored.changed().count(),
            0,
            "restored state is the committed state"
        );
        // Restored in progress: since the restored epoch.
        assert_eq!(
            restored.slowest(5),
            vec![
                SlowVnode {
                    since_epoch: 1,
                    vnode: v(1),
                    rows: 10
                },
                SlowVnode {
                    since_epoch: 1,
                    vnode: v(2),
                    rows: 4
                },
            ]
        );

        // A later upsert replaces the row.
        map.complete(v(1)).unwrap();
        table
            .write(&codec.encode(map.changed()).unwrap().unwrap())
            .unwrap();
        table.seal(2).unwrap();
        let restored = codec.restore(&table, owned, 2).unwrap();
        assert_eq!(
            restored.get(v(1)),
            Some(&VnodeProgress::Completed { rows: 10 })
        );
    }

    #[test]
    fn nothing_to_encode_is_none() {
        let codec = ProgressCodec::new("p", &pk(), VnodeCount::new(4).unwrap()).unwrap();
        assert!(codec.encode(std::iter::empty()).unwrap().is_none());
    }

    #[test]
    fn the_slowest_vnodes_are_those_in_progress_since_the_earliest_epoch() {
        let pk = pk();
        let count = VnodeCount::new(8).unwrap();
        let owned = VnodeBitmap::full(count);
        let at = |i: i32| pos(&pk, Some(&i.to_string()), 0);
        let mut map = ProgressMap::new(owned);
        map.set_epoch(2);
        map.advance(v(6), at(1), 1).unwrap();
        map.set_epoch(3);
        map.advance(v(4), at(1), 2).unwrap();
        map.advance(v(0), at(1), 3).unwrap();
        map.advance(v(6), at(2), 4).unwrap(); // moving on keeps its start
        map.set_epoch(5);
        map.advance(v(2), at(1), 1).unwrap();
        let slowest = |map: &ProgressMap| -> Vec<(u64, u16, u64)> {
            map.slowest(3)
                .iter()
                .map(|s| (s.since_epoch, s.vnode.get(), s.rows))
                .collect()
        };
        assert_eq!(slowest(&map), vec![(2, 6, 5), (3, 0, 3), (3, 4, 2)]);
        map.complete(v(6)).unwrap();
        map.complete(v(0)).unwrap();
        assert_eq!(slowest(&map), vec![(3, 4, 2), (5, 2, 1)]);
        map.complete(v(5)).unwrap(); // an empty vnode never was in progress
        map.complete(v(4)).unwrap();
        map.complete(v(2)).unwrap();
        assert!(map.slowest(3).is_empty());
    }
}
