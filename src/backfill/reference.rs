//! The row-at-a-time reference of the arrangement backfill.
//!
//! The same algorithm as [`BackfillCore`](crate::backfill::BackfillCore) with an
//! [`ArrangementTracker`](crate::backfill::ArrangementTracker) and the k-way merge
//! (docs/DESIGN.md section 7), written as plainly as possible: rows are `Vec<Value>`, each vnode's
//! replicated table is a `BTreeMap`, keys compare column by column with a comparator of its
//! own (not arrow-row), the vnode of a row comes from the per-row
//! [`vnode_of_row`](crate::vnode::vnode_of_row). No Arrow kernel runs in its hot path.
//!
//! It has two uses: a *differential* check of the vectorized executor (same events in, same
//! changes out, same positions; see `tests/differential.rs`), and the row-at-a-time baseline
//! of the benchmarks (`benches/backfill.rs`).
//!
//! ```text
//!   load(batch) ───────────────▶ per vnode: BTreeMap<key, row>  (the replicated table)
//!                                        │ range(pos..)
//!   read_snapshot() ◀── heap of per-vnode heads (global key order), pos := last row emitted
//!   on_upstream_chunk(chunk) ──▶ buffer of (op, row, vnode)
//!   on_barrier() ──▶ filter the buffer per row with the positions now current, emit;
//!                    apply the buffer (unfiltered) to the BTreeMaps; restart the read
//! ```
//!
//! Per vnode: `NotStarted -> InProgress { pos, rows } -> Completed { rows }`. A vnode is
//! Completed the moment its last row is emitted (or, when it has no rows after its position,
//! at the first read of the epoch), exactly when the k-way merge reports it exhausted.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use arrow_schema::{DataType, Field, Schema};
//! use arrangement_backfill::backfill::reference::{ReferenceBackfill, Value};
//! use arrangement_backfill::key::KeyColumn;
//! use arrangement_backfill::table::TableDesc;
//! use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount};
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
//! let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])?
//!     .with_vnode_count(VnodeCount::new(4)?);
//! let owned = VnodeBitmap::full(desc.vnode_count());
//! let mut backfill = ReferenceBackfill::new(Arc::new(desc), &owned, 2)?;
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![3, 1, 2]))])?;
//! backfill.load(&batch)?;
//! let first = backfill.read_snapshot()?.expect("rows");
//! assert_eq!(first, vec![vec![Value::Int(1)], vec![Value::Int(2)]]);
//! let second = backfill.read_snapshot()?.expect("rows");
//! assert_eq!(second, vec![vec![Value::Int(3)]]);
//! assert!(backfill.read_snapshot()?.is_none());
//! assert!(backfill.is_finished());
//! # Ok::<(), arrangement_backfill::Error>(())
//! ```

use std::cmp::{Ordering, Reverse};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float32Builder, Float64Builder, Int8Builder, Int16Builder, Int32Builder,
    Int64Builder, LargeStringBuilder, StringBuilder, UInt8Builder, UInt16Builder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};

use crate::chunk::{Op, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::table::{Distribution, TableDesc};
use crate::vnode::{self, VirtualNode, VnodeBitmap};

/// One value of a row.
///
/// `Int` holds every signed integer type, `UInt` every unsigned one, `Float` both float
/// types (in SQL order: -0.0 is 0.0, NaNs are equal and above every number), `Str` both
/// string types.
#[derive(Debug, Clone)]
pub enum Value {
    /// NULL.
    Null,
    /// Int8, Int16, Int32, Int64.
    Int(i64),
    /// UInt8, UInt16, UInt32, UInt64.
    UInt(u64),
    /// Float32, Float64.
    Float(f64),
    /// Utf8, LargeUtf8.
    Str(String),
    /// Boolean.
    Bool(bool),
}

impl Value {
    /// Compares two non-NULL values of one column, ascending.
    fn cmp_same_type(&self, other: &Value) -> Ordering {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            (Value::UInt(a), Value::UInt(b)) => a.cmp(b),
            // SQL order (docs/DESIGN.md section 5): -0.0 is 0.0, NaNs are equal and above every
            // number.
            (Value::Float(a), Value::Float(b)) => match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
            },
            (Value::Str(a), Value::Str(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            // Values of one column share a variant; order mixed ones by variant for totality.
            (a, b) => a.rank().cmp(&b.rank()),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Int(_) => 1,
            Value::UInt(_) => 2,
            Value::Float(_) => 3,
            Value::Str(_) => 4,
            Value::Bool(_) => 5,
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Null, _) | (_, Value::Null) => false,
            (a, b) => a.cmp_same_type(b) == Ordering::Equal,
        }
    }
}

impl Eq for Value {}

/// A row: one value per column of the table schema.
pub type Row = Vec<Value>;

/// The order of one key column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColumnOrder {
    descending: bool,
    nulls_first: bool,
}

/// How keys compare: per column, direction then null order (the storage order).
#[derive(Debug, PartialEq, Eq)]
struct KeyOrder(Vec<ColumnOrder>);

impl KeyOrder {
    fn compare(&self, a: &[Value], b: &[Value]) -> Ordering {
        for ((x, y), order) in a.iter().zip(b).zip(&self.0) {
            let ord = match (x, y) {
                (Value::Null, Value::Null) => Ordering::Equal,
                (Value::Null, _) if order.nulls_first => Ordering::Less,
                (Value::Null, _) => Ordering::Greater,
                (_, Value::Null) if order.nulls_first => Ordering::Greater,
                (_, Value::Null) => Ordering::Less,
                (x, y) if order.descending => y.cmp_same_type(x),
                (x, y) => x.cmp_same_type(y),
            };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }
}

/// A primary key with its order, usable as a `BTreeMap` key.
#[derive(Debug, Clone)]
struct OrdKey {
    values: Vec<Value>,
    order: Arc<KeyOrder>,
}

impl PartialEq for OrdKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for OrdKey {}

impl PartialOrd for OrdKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order.compare(&self.values, &other.values)
    }
}

/// The backfill state of one vnode. Positions are the key values (in pk column order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferenceProgress {
    /// No snapshot row emitted yet.
    NotStarted,
    /// Snapshot rows up to and including `pos` were emitted.
    InProgress {
        /// The key of the last snapshot row emitted.
        pos: Row,
        /// Snapshot rows emitted so far.
        rows: u64,
    },
    /// The whole snapshot of the vnode was emitted.
    Completed {
        /// Snapshot rows emitted in all.
        rows: u64,
    },
}

impl ReferenceProgress {
    fn rows(&self) -> u64 {
        match self {
            ReferenceProgress::NotStarted => 0,
            ReferenceProgress::InProgress { rows, .. } | ReferenceProgress::Completed { rows } => {
                *rows
            }
        }
    }
}

/// One owned vnode: its replicated rows and its progress.
#[derive(Debug)]
struct VnodeState {
    rows: BTreeMap<OrdKey, Row>,
    progress: ReferenceProgress,
}

/// A buffered upstream change.
#[derive(Debug, Clone)]
struct Change {
    op: Op,
    row: Row,
    key: OrdKey,
    vnode: VirtualNode,
}

/// The head of one vnode in this epoch's merge: its next unread key.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Head {
    key: OrdKey,
    vnode: VirtualNode,
}

/// The row-at-a-time arrangement backfill. See the module docs.
#[derive(Debug)]
pub struct ReferenceBackfill {
    desc: Arc<TableDesc>,
    order: Arc<KeyOrder>,
    batch_size: usize,
    vnodes: BTreeMap<VirtualNode, VnodeState>,
    buffer: Vec<Change>,
    /// This epoch's merge heads; `None` until the epoch's first read.
    read: Option<BinaryHeap<Reverse<Head>>>,
}

impl ReferenceBackfill {
    /// A backfill of `desc` over the `owned` vnodes, reading `batch_size` snapshot rows at a
    /// time, with an empty replicated table and every vnode NotStarted.
    pub fn new(desc: Arc<TableDesc>, owned: &VnodeBitmap, batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::InvalidConfig("batch size must be at least 1".into()));
        }
        for field in desc.schema().fields() {
            check_supported(field.name(), field.data_type())?;
        }
        let order = KeyOrder(
            desc.pk()
                .columns()
                .iter()
                .map(|c| ColumnOrder {
                    descending: c.descending,
                    nulls_first: c.nulls_first,
                })
                .collect(),
        );
        let vnodes = owned
            .iter()
            .map(|v| {
                let state = VnodeState {
                    rows: BTreeMap::new(),
                    progress: ReferenceProgress::NotStarted,
                };
                (v, state)
            })
            .collect();
        Ok(Self {
            desc,
            order: Arc::new(order),
            batch_size,
            vnodes,
            buffer: Vec::new(),
            read: None,
        })
    }

    /// Inserts rows into the replicated table (the upstream as of the first barrier).
    pub fn load(&mut self, batch: &RecordBatch) -> Result<()> {
        let changes = self.changes_of(&StreamChunk::inserts(batch.clone()))?;
        self.apply(changes)
    }

    /// Starts over from scratch on the same replicated table: every vnode NotStarted, the
    /// buffer empty. (Benchmarks use it to read the same snapshot again.)
    pub fn reset(&mut self) {
        for state in self.vnodes.values_mut() {
            state.progress = ReferenceProgress::NotStarted;
        }
        self.buffer.clear();
        self.read = None;
    }

    /// The progress of `vnode`, `None` if not owned.
    pub fn progress(&self, vnode: VirtualNode) -> Option<&ReferenceProgress> {
        self.vnodes.get(&vnode).map(|s| &s.progress)
    }

    /// Owned vnodes with their progress, ascending.
    pub fn progress_iter(&self) -> impl Iterator<Item = (VirtualNode, &ReferenceProgress)> {
        self.vnodes.iter().map(|(v, s)| (*v, &s.progress))
    }

    /// Sets the progress of an owned vnode, as a restored backfill would have it. The
    /// current epoch's read restarts.
    pub fn set_progress(&mut self, vnode: VirtualNode, progress: ReferenceProgress) -> Result<()> {
        if let ReferenceProgress::InProgress { pos, .. } = &progress
            && pos.len() != self.order.0.len()
        {
            return Err(Error::InvalidConfig(format!(
                "a position of {} values for a key of {} columns",
                pos.len(),
                self.order.0.len()
            )));
        }
        let state = self
            .vnodes
            .get_mut(&vnode)
            .ok_or_else(|| not_owned(vnode))?;
        state.progress = progress;
        self.read = None;
        Ok(())
    }

    /// True when every owned vnode is Completed.
    pub fn is_finished(&self) -> bool {
        self.vnodes
            .values()
            .all(|s| matches!(s.progress, ReferenceProgress::Completed { .. }))
    }

    /// Snapshot rows emitted over all owned vnodes.
    pub fn snapshot_rows(&self) -> u64 {
        self.vnodes.values().map(|s| s.progress.rows()).sum()
    }

    /// The next batch of up to `batch_size` snapshot rows in global key order, or `None` when
    /// this epoch's snapshot is all emitted.
    pub fn read_snapshot(&mut self) -> Result<Option<Vec<Row>>> {
        let rows = self.read_snapshot_rows(self.batch_size)?;
        Ok((!rows.is_empty()).then_some(rows))
    }

    /// Up to `limit` snapshot rows in global key order (fewer only when this epoch's snapshot
    /// runs out). Each vnode's position becomes its last row emitted; a vnode whose rows are
    /// all emitted is Completed. The epoch's first call (even with `limit` 0) completes the
    /// vnodes that have no rows after their positions.
    pub fn read_snapshot_rows(&mut self, limit: usize) -> Result<Vec<Row>> {
        let mut heap = match self.read.take() {
            Some(heap) => heap,
            None => self.start_read(),
        };
        let mut out = Vec::with_capacity(limit.min(self.batch_size));
        while out.len() < limit {
            let Some(Reverse(Head { key, vnode })) = heap.pop() else {
                break;
            };
            let state = self
                .vnodes
                .get_mut(&vnode)
                .ok_or_else(|| internal!("reference: vnode {vnode} vanished"))?;
            let row = state
                .rows
                .get(&key)
                .ok_or_else(|| internal!("reference: a merge head vanished"))?
                .clone();
            out.push(row);
            let next = state
                .rows
                .range((Bound::Excluded(&key), Bound::Unbounded))
                .next()
                .map(|(k, _)| k.clone());
            let rows = state.progress.rows() + 1;
            match next {
                Some(next) => {
                    state.progress = ReferenceProgress::InProgress {
                        pos: key.values,
                        rows,
                    };
                    heap.push(Reverse(Head { key: next, vnode }));
                }
                None => state.progress = ReferenceProgress::Completed { rows },
            }
        }
        self.read = Some(heap);
        Ok(out)
    }

    /// The heads of the epoch's scans, from the positions; completes empty scans.
    fn start_read(&mut self) -> BinaryHeap<Reverse<Head>> {
        let mut heap = BinaryHeap::new();
        for (&vnode, state) in &mut self.vnodes {
            let next = match &state.progress {
                ReferenceProgress::Completed { .. } => continue,
                ReferenceProgress::NotStarted => state.rows.keys().next(),
                ReferenceProgress::InProgress { pos, .. } => {
                    let pos = OrdKey {
                        values: pos.clone(),
                        order: self.order.clone(),
                    };
                    state
                        .rows
                        .range((Bound::Excluded(pos), Bound::Unbounded))
                        .next()
                        .map(|(k, _)| k)
                }
            };
            match next {
                Some(key) => heap.push(Reverse(Head {
                    key: key.clone(),
                    vnode,
                })),
                None => {
                    state.progress = ReferenceProgress::Completed {
                        rows: state.progress.rows(),
                    }
                }
            }
        }
        heap
    }

    /// Buffers an upstream chunk until the barrier.
    pub fn on_upstream_chunk(&mut self, chunk: &StreamChunk) -> Result<()> {
        let changes = self.changes_of(chunk)?;
        self.buffer.extend(changes);
        Ok(())
    }

    /// The barrier: filters the buffered changes with the positions now current and returns
    /// them, applies them (unfiltered) to the replicated table, and restarts the snapshot
    /// read for the next epoch.
    pub fn on_barrier(&mut self) -> Result<Vec<(Op, Row)>> {
        let buffer = std::mem::take(&mut self.buffer);
        let out = self.filter_changes(&buffer);
        self.apply(buffer)?;
        self.read = None;
        Ok(out)
    }

    /// The rows of `chunk` that the current progress lets through, with update pairs repaired
    /// (the per-row filter rule of docs/DESIGN.md section 7.5).
    pub fn filter(&self, chunk: &StreamChunk) -> Result<Vec<(Op, Row)>> {
        let changes = self.changes_of(chunk)?;
        Ok(self.filter_changes(&changes))
    }

    fn keeps(&self, change: &Change) -> bool {
        match self.vnodes.get(&change.vnode).map(|s| &s.progress) {
            Some(ReferenceProgress::Completed { .. }) => true,
            Some(ReferenceProgress::InProgress { pos, .. }) => {
                self.order.compare(&change.key.values, pos) != Ordering::Greater
            }
            Some(ReferenceProgress::NotStarted) | None => false,
        }
    }

    fn filter_changes(&self, changes: &[Change]) -> Vec<(Op, Row)> {
        let keep: Vec<bool> = changes.iter().map(|c| self.keeps(c)).collect();
        let mut out = Vec::new();
        for (i, change) in changes.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let op = match change.op {
                Op::UpdateDelete if !keep[i + 1] => Op::Delete,
                Op::UpdateInsert if !keep[i - 1] => Op::Insert,
                op => op,
            };
            out.push((op, change.row.clone()));
        }
        out
    }

    /// Applies changes to the replicated table, strictly (no insert of a present key, no
    /// delete of an absent one).
    fn apply(&mut self, changes: Vec<Change>) -> Result<()> {
        for Change {
            op,
            row,
            key,
            vnode,
        } in changes
        {
            let state = self
                .vnodes
                .get_mut(&vnode)
                .ok_or_else(|| not_owned(vnode))?;
            let conflict = if op.is_insert() {
                match state.rows.entry(key) {
                    Entry::Vacant(e) => {
                        e.insert(row);
                        None
                    }
                    Entry::Occupied(e) => Some(e.key().values.clone()),
                }
            } else {
                state.rows.remove(&key).is_none().then_some(key.values)
            };
            if let Some(key) = conflict {
                return Err(Error::InvalidChunk(format!(
                    "reference: {} of key {key:?} in vnode {vnode} (table `{}`): the key is {}",
                    op.token(),
                    self.desc.name(),
                    if op.is_insert() { "present" } else { "absent" }
                )));
            }
        }
        Ok(())
    }

    /// The rows of a chunk with their keys and vnodes; rows of unowned vnodes are an error.
    fn changes_of(&self, chunk: &StreamChunk) -> Result<Vec<Change>> {
        let batch = chunk.batch();
        let rows = rows_from_batch(batch)?;
        let pk = self.desc.pk().indices();
        let dist: Vec<ArrayRef> = match self.desc.distribution() {
            Distribution::Hash(columns) => {
                columns.iter().map(|&c| batch.column(c).clone()).collect()
            }
            Distribution::VnodeColumn(_) => Vec::new(),
        };
        let mut changes = Vec::with_capacity(rows.len());
        for (i, (row, &op)) in rows.into_iter().zip(chunk.ops()).enumerate() {
            let vnode = match self.desc.distribution() {
                Distribution::Hash(_) => vnode::vnode_of_row(&dist, i, self.desc.vnode_count())?,
                Distribution::VnodeColumn(c) => match &row[*c] {
                    Value::UInt(v) if (*v as usize) < self.desc.vnode_count().get() => {
                        VirtualNode::new(*v as u16)
                    }
                    other => {
                        return Err(Error::InvalidChunk(format!(
                            "row {i}: vnode column value {other:?} out of range"
                        )));
                    }
                },
            };
            if !self.vnodes.contains_key(&vnode) {
                return Err(not_owned(vnode));
            }
            let key = OrdKey {
                values: pk.iter().map(|&c| row[c].clone()).collect(),
                order: self.order.clone(),
            };
            changes.push(Change {
                op,
                row,
                key,
                vnode,
            });
        }
        Ok(changes)
    }
}

fn not_owned(vnode: VirtualNode) -> Error {
    Error::VnodeNotOwned {
        vnode: vnode.get(),
        owner: "the reference backfill".into(),
    }
}

fn check_supported(column: &str, data_type: &DataType) -> Result<()> {
    use DataType::*;
    match data_type {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float32 | Float64
        | Utf8 | LargeUtf8 | Boolean => Ok(()),
        other => Err(Error::UnsupportedType {
            column: column.to_string(),
            data_type: other.clone(),
            usage: "the row-at-a-time reference",
        }),
    }
}

/// Value `row` of `array`.
fn value_at(array: &dyn Array, row: usize) -> Result<Value> {
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match array.data_type() {
        DataType::Int8 => Value::Int(array.as_primitive::<Int8Type>().value(row).into()),
        DataType::Int16 => Value::Int(array.as_primitive::<Int16Type>().value(row).into()),
        DataType::Int32 => Value::Int(array.as_primitive::<Int32Type>().value(row).into()),
        DataType::Int64 => Value::Int(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::UInt(array.as_primitive::<UInt8Type>().value(row).into()),
        DataType::UInt16 => Value::UInt(array.as_primitive::<UInt16Type>().value(row).into()),
        DataType::UInt32 => Value::UInt(array.as_primitive::<UInt32Type>().value(row).into()),
        DataType::UInt64 => Value::UInt(array.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => Value::Float(array.as_primitive::<Float32Type>().value(row).into()),
        DataType::Float64 => Value::Float(array.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => Value::Str(array.as_string::<i32>().value(row).to_string()),
        DataType::LargeUtf8 => Value::Str(array.as_string::<i64>().value(row).to_string()),
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        other => {
            return Err(Error::UnsupportedType {
                column: "(a column of a batch)".into(),
                data_type: other.clone(),
                usage: "the row-at-a-time reference",
            });
        }
    })
}

/// The rows of a batch, one `Value` per column.
pub fn rows_from_batch(batch: &RecordBatch) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = (0..batch.num_rows())
        .map(|_| Vec::with_capacity(batch.num_columns()))
        .collect();
    for column in batch.columns() {
        for (i, row) in rows.iter_mut().enumerate() {
            row.push(value_at(column.as_ref(), i)?);
        }
    }
    Ok(rows)
}

/// The changes of a chunk as `(op, row)` pairs.
pub fn changes_from_chunk(chunk: &StreamChunk) -> Result<Vec<(Op, Row)>> {
    let rows = rows_from_batch(chunk.batch())?;
    Ok(chunk.ops().iter().copied().zip(rows).collect())
}

/// A batch of `schema` holding `rows`. A value that does not fit its column's type is an
/// error.
pub fn batch_from_rows(schema: &SchemaRef, rows: &[Row]) -> Result<RecordBatch> {
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (c, field) in schema.fields().iter().enumerate() {
        let values = rows.iter().map(|r| r.get(c).unwrap_or(&Value::Null));
        let mismatch = |v: &Value| Error::SchemaMismatch {
            context: format!("column `{}` of reference rows", field.name()),
            expected: field.data_type().to_string(),
            found: format!("{v:?}"),
        };
        macro_rules! build {
            ($builder:ty, $variant:ident, $convert:expr) => {{
                let mut b = <$builder>::new();
                for v in values {
                    match v {
                        Value::Null => b.append_null(),
                        Value::$variant(x) => {
                            let x = ($convert)(x).map_err(|_| mismatch(v))?;
                            b.append_value(x)
                        }
                        other => return Err(mismatch(other)),
                    }
                }
                Arc::new(b.finish()) as ArrayRef
            }};
        }
        let array = match field.data_type() {
            DataType::Int8 => build!(Int8Builder, Int, |x: &i64| i8::try_from(*x)),
            DataType::Int16 => build!(Int16Builder, Int, |x: &i64| i16::try_from(*x)),
            DataType::Int32 => build!(Int32Builder, Int, |x: &i64| i32::try_from(*x)),
            DataType::Int64 => build!(Int64Builder, Int, |x: &i64| Ok::<_, ()>(*x)),
            DataType::UInt8 => build!(UInt8Builder, UInt, |x: &u64| u8::try_from(*x)),
            DataType::UInt16 => build!(UInt16Builder, UInt, |x: &u64| u16::try_from(*x)),
            DataType::UInt32 => build!(UInt32Builder, UInt, |x: &u64| u32::try_from(*x)),
            DataType::UInt64 => build!(UInt64Builder, UInt, |x: &u64| Ok::<_, ()>(*x)),
            DataType::Float32 => build!(Float32Builder, Float, |x: &f64| Ok::<_, ()>(*x as f32)),
            DataType::Float64 => build!(Float64Builder, Float, |x: &f64| Ok::<_, ()>(*x)),
            DataType::Utf8 => build!(StringBuilder, Str, |x: &String| Ok::<_, ()>(x.clone())),
            DataType::LargeUtf8 => {
                build!(LargeStringBuilder, Str, |x: &String| Ok::<_, ()>(x.clone()))
            }
            DataType::Boolean => build!(BooleanBuilder, Bool, |x: &bool| Ok::<_, ()>(*x)),
            other => return Err(check_supported(field.name(), other).unwrap_err()),
        };
        columns.push(array);
    }
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows.len()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyColumn;
    use crate::vnode::VnodeCount;
    use arrow_array::{BooleanArray, Float64Array, Int32Array, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn int_desc(vnodes: usize) -> Arc<TableDesc> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        Arc::new(
            TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
                .unwrap()
                .with_vnode_count(VnodeCount::new(vnodes).unwrap()),
        )
    }

    fn int_rows(keys: &[i64]) -> Vec<Row> {
        keys.iter()
            .map(|&k| vec![Value::Int(k), Value::Str(format!("v{k}"))])
            .collect()
    }

    #[test]
    fn comparator_agrees_with_arrow_row() {
        let mut rng = StdRng::seed_from_u64(0x0c0ffee);
        for case in 0..64 {
            let schema = Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int32, true),
                Field::new("b", DataType::Utf8, true),
                Field::new("c", DataType::Float64, true),
                Field::new("d", DataType::Boolean, true),
            ]));
            let columns: Vec<KeyColumn> = ["a", "b", "c", "d"]
                .iter()
                .map(|name| {
                    let column = if rng.random_bool(0.5) {
                        KeyColumn::desc(*name)
                    } else {
                        KeyColumn::asc(*name)
                    };
                    column.with_nulls_first(rng.random_bool(0.5))
                })
                .collect();
            let desc = TableDesc::new("t", schema.clone(), columns).unwrap();
            let n = 40;
            let some = |rng: &mut StdRng| rng.random_bool(0.8);
            let floats = [-1.5, -0.0, 0.0, 2.0, f64::NAN, f64::INFINITY];
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int32Array::from_iter(
                        (0..n).map(|_| some(&mut rng).then(|| rng.random_range(-3..3))),
                    )),
                    Arc::new(StringArray::from_iter((0..n).map(|_| {
                        some(&mut rng).then(|| ["", "a", "ab", "b"][rng.random_range(0..4)])
                    }))),
                    Arc::new(Float64Array::from_iter((0..n).map(|_| {
                        some(&mut rng).then(|| floats[rng.random_range(0..floats.len())])
                    }))),
                    Arc::new(BooleanArray::from_iter(
                        (0..n).map(|_| some(&mut rng).then(|| rng.random_bool(0.5))),
                    )),
                ],
            )
            .unwrap();
            let keys = desc.pk().encode(&batch).unwrap();
            let rows = rows_from_batch(&batch).unwrap();
            let reference =
                ReferenceBackfill::new(Arc::new(desc), &VnodeBitmap::full(VnodeCount::DEFAULT), 1)
                    .unwrap();
            for i in 0..n {
                for j in 0..n {
                    assert_eq!(
                        reference.order.compare(&rows[i], &rows[j]),
                        keys.value(i).cmp(keys.value(j)),
                        "case {case}: rows {:?} and {:?}",
                        rows[i],
                        rows[j]
                    );
                }
            }
        }
    }

    #[test]
    fn rows_round_trip_through_batches() {
        let desc = int_desc(1);
        let rows = vec![
            vec![Value::Int(1), Value::Null],
            vec![Value::Int(-7), Value::Str("x".into())],
        ];
        let batch = batch_from_rows(desc.schema(), &rows).unwrap();
        assert_eq!(rows_from_batch(&batch).unwrap(), rows);
        let bad = vec![vec![Value::Str("k".into()), Value::Null]];
        assert!(matches!(
            batch_from_rows(desc.schema(), &bad),
            Err(Error::SchemaMismatch { .. })
        ));
    }

    #[test]
    fn unsupported_types_are_an_error() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("d", DataType::Date32, false),
        ]));
        let desc = TableDesc::new("t", schema, vec![KeyColumn::asc("k")]).unwrap();
        let owned = VnodeBitmap::full(desc.vnode_count());
        assert!(matches!(
            ReferenceBackfill::new(Arc::new(desc), &owned, 4),
            Err(Error::UnsupportedType { .. })
        ));
    }

    #[test]
    fn one_vnode_epoch_by_epoch() {
        let desc = int_desc(1);
        let owned = VnodeBitmap::full(desc.vnode_count());
        let mut backfill = ReferenceBackfill::new(desc.clone(), &owned, 2).unwrap();
        backfill
            .load(&batch_from_rows(desc.schema(), &int_rows(&[1, 3, 5, 7])).unwrap())
            .unwrap();
        // Epoch 1: one batch read, position at 3.
        assert_eq!(
            backfill.read_snapshot().unwrap().unwrap(),
            int_rows(&[1, 3])
        );
        let chunk = StreamChunk::from_text(
            desc.schema(),
            "+ 2 a\n+ 4 b\nU- 3 v3\nU+ 3 c\nU- 1 v1\nU+ 6 d",
        )
        .unwrap();
        backfill.on_upstream_chunk(&chunk).unwrap();
        let out = backfill.on_barrier().unwrap();
        let expected = vec![
            (Op::Insert, vec![Value::Int(2), Value::Str("a".into())]),
            (
                Op::UpdateDelete,
                vec![Value::Int(3), Value::Str("v3".into())],
            ),
            (
                Op::UpdateInsert,
                vec![Value::Int(3), Value::Str("c".into())],
            ),
            // The U+ at 6 is above the position: the U- becomes a Delete.
            (Op::Delete, vec![Value::Int(1), Value::Str("v1".into())]),
        ];
        assert_eq!(out, expected);
        assert_eq!(
            backfill.progress(VirtualNode::ZERO),
            Some(&ReferenceProgress::InProgress {
                pos: vec![Value::Int(3)],
                rows: 2
            })
        );
        // Epoch 2 reads the new state after 3: 4, 5, 6, 7.
        let rest = backfill.read_snapshot_rows(10).unwrap();
        let keys: Vec<Value> = rest.iter().map(|r| r[0].clone()).collect();
        assert_eq!(keys, [4, 5, 6, 7].map(Value::Int));
        assert!(backfill.is_finished());
        assert_eq!(backfill.snapshot_rows(), 6);
        let chunk = StreamChunk::from_text(desc.schema(), "- 7 v7").unwrap();
        backfill.on_upstream_chunk(&chunk).unwrap();
        assert_eq!(backfill.on_barrier().unwrap().len(), 1, "Completed emits");
    }

    #[test]
    fn merged_order_and_exhaustion_over_vnodes() {
        let desc = int_desc(8);
        let owned = VnodeBitmap::full(desc.vnode_count());
        let mut backfill = ReferenceBackfill::new(desc.clone(), &owned, 5).unwrap();
        let keys: Vec<i64> = (0..40).rev().collect();
        backfill
            .load(&batch_from_rows(desc.schema(), &int_rows(&keys)).unwrap())
            .unwrap();
        let mut seen = Vec::new();
        while let Some(rows) = backfill.read_snapshot().unwrap() {
            assert!(rows.len() <= 5);
            seen.extend(rows.into_iter().map(|r| r[0].clone()));
        }
        assert_eq!(seen, (0..40).map(Value::Int).collect::<Vec<_>>());
        assert!(backfill.is_finished());
        // Rows of vnodes not owned are an error.
        let mut half = VnodeBitmap::empty(desc.vnode_count());
        half.insert(VirtualNode::ZERO).unwrap();
        let mut backfill = ReferenceBackfill::new(desc.clone(), &half, 5).unwrap();
        let all = batch_from_rows(desc.schema(), &int_rows(&keys)).unwrap();
        assert!(matches!(
            backfill.load(&all),
            Err(Error::VnodeNotOwned { .. })
        ));
    }

    #[test]
    fn per_row_filter_matches_the_vectorized_filter() {
        use crate::backfill::ProgressMap;
        use crate::backfill::UpstreamFilter;
        use crate::key::Position;
        let desc = int_desc(4);
        let owned = VnodeBitmap::full(desc.vnode_count());
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..32 {
            let keys: Vec<i64> = (0..50).map(|_| rng.random_range(-20..20)).collect();
            let batch = RecordBatch::try_new(
                desc.schema().clone(),
                vec![
                    Arc::new(Int64Array::from(keys.clone())),
                    Arc::new(StringArray::from(vec!["x"; keys.len()])),
                ],
            )
            .unwrap();
            let chunk = StreamChunk::inserts(batch.clone());
            let encoded = desc.pk().encode(&batch).unwrap();
            let mut progress = ProgressMap::new(owned.clone());
            let mut reference = ReferenceBackfill::new(desc.clone(), &owned, 4).unwrap();
            for vnode in owned.iter() {
                let row = rng.random_range(0..keys.len());
                match rng.random_range(0..3) {
                    0 => {}
                    1 => {
                        progress.complete(vnode).unwrap();
                        reference
                            .set_progress(vnode, ReferenceProgress::Completed { rows: 0 })
                            .unwrap();
                    }
                    _ => {
                        let pos = Position::from_keys(&encoded, row);
                        progress.advance(vnode, pos, 1).unwrap();
                        let pos = vec![Value::Int(keys[row])];
                        reference
                            .set_progress(vnode, ReferenceProgress::InProgress { pos, rows: 1 })
                            .unwrap();
                    }
                }
            }
            let vectorized = UpstreamFilter::for_progress(desc.clone(), &progress)
                .unwrap()
                .filter(&chunk)
                .unwrap();
            assert_eq!(
                changes_from_chunk(&vectorized).unwrap(),
                reference.filter(&chunk).unwrap()
            );
        }
    }
}
