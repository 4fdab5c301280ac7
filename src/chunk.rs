//! Change chunks, barriers and the messages that flow between operators.
//!
//! A [`StreamChunk`] is one Arrow [`RecordBatch`] plus one [`Op`] per row. It is always
//! *valid*: the ops are as many as the rows, and every [`Op::UpdateDelete`] is immediately
//! followed by its [`Op::UpdateInsert`] (and every U+ preceded by its U-), so an update pair is
//! never split across chunks.
//!
//! ```text
//!   Message::Chunk(+ 1 a, U- 2 b, U+ 2 c)   Message::Barrier(epoch 2 -> 3)   Message::Chunk(..)
//!   |------------- epoch 2 --------------|                                   |-- epoch 3 --
//! ```
//!
//! On disk (Parquet, Arrow IPC) a changelog is a batch whose first columns are `_epoch` (UInt64,
//! optional) and `_op` (Int8, codes 1 to 4), followed by the table's columns; see
//! [`StreamChunk::to_changelog`] and [`StreamChunk::from_changelog`]. Tests write chunks in a
//! compact text form, one row a line: `+ 1 a`, `- 1 a`, `U- 2 b`, `U+ 2 c` ([`StreamChunk::from_text`]).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Int8Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result, internal};
use crate::vnode::VnodeBitmap;

/// Name of the op column in changelog files.
pub const OP_COLUMN: &str = "_op";
/// Name of the epoch column in changelog files.
pub const EPOCH_COLUMN: &str = "_epoch";

/// The kind of change a row carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum Op {
    /// A new row.
    Insert = 1,
    /// A removed row (with the values it had).
    Delete = 2,
    /// The old half of an update; always immediately followed by its [`Op::UpdateInsert`].
    UpdateDelete = 3,
    /// The new half of an update.
    UpdateInsert = 4,
}

impl Op {
    /// The on-disk code (docs/DESIGN.md section 3): 1, 2, 3, 4.
    pub fn code(self) -> i8 {
        self as i8
    }

    /// Decodes an on-disk code.
    pub fn from_code(code: i8) -> Result<Self> {
        match code {
            1 => Ok(Op::Insert),
            2 => Ok(Op::Delete),
            3 => Ok(Op::UpdateDelete),
            4 => Ok(Op::UpdateInsert),
            other => Err(Error::InvalidChunk(format!(
                "unknown op code {other} (expected 1 insert, 2 delete, 3 update-delete, 4 update-insert)"
            ))),
        }
    }

    /// True for ops that add a row (`Insert`, `UpdateInsert`).
    pub fn is_insert(self) -> bool {
        matches!(self, Op::Insert | Op::UpdateInsert)
    }

    /// True for ops that remove a row (`Delete`, `UpdateDelete`).
    pub fn is_delete(self) -> bool {
        matches!(self, Op::Delete | Op::UpdateDelete)
    }

    /// The op's name in messages: `insert`, `delete`, `update-delete`, `update-insert`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Delete => "delete",
            Op::UpdateDelete => "update-delete",
            Op::UpdateInsert => "update-insert",
        }
    }

    /// The text-form token: `+`, `-`, `U-`, `U+`.
    pub fn token(self) -> &'static str {
        match self {
            Op::Insert => "+",
            Op::Delete => "-",
            Op::UpdateDelete => "U-",
            Op::UpdateInsert => "U+",
        }
    }

    fn from_token(token: &str) -> Option<Self> {
        match token {
            "+" => Some(Op::Insert),
            "-" => Some(Op::Delete),
            "U-" => Some(Op::UpdateDelete),
            "U+" => Some(Op::UpdateInsert),
            _ => None,
        }
    }
}

/// Checks that `ops` pair every U- with an immediately following U+, and nothing else.
fn check_update_pairs(ops: &[Op]) -> Result<()> {
    let mut i = 0;
    while i < ops.len() {
        match ops[i] {
            Op::UpdateDelete => {
                if ops.get(i + 1) != Some(&Op::UpdateInsert) {
                    return Err(Error::InvalidChunk(format!(
                        "row {i}: update-delete (U-) is not immediately followed by its update-insert (U+)"
                    )));
                }
                i += 2;
            }
            Op::UpdateInsert => {
                return Err(Error::InvalidChunk(format!(
                    "row {i}: update-insert (U+) without a preceding update-delete (U-)"
                )));
            }
            Op::Insert | Op::Delete => i += 1,
        }
    }
    Ok(())
}

/// A batch of changes: one [`RecordBatch`] and one [`Op`] per row, always valid.
#[derive(Debug, Clone)]
pub struct StreamChunk {
    batch: RecordBatch,
    ops: Arc<[Op]>,
}

impl StreamChunk {
    /// Builds a chunk, checking that there is one op per row and that update pairs are whole.
    pub fn new(batch: RecordBatch, ops: impl Into<Arc<[Op]>>) -> Result<Self> {
        let ops = ops.into();
        if ops.len() != batch.num_rows() {
            return Err(Error::InvalidChunk(format!(
                "{} ops for {} rows",
                ops.len(),
                batch.num_rows()
            )));
        }
        check_update_pairs(&ops)?;
        Ok(Self { batch, ops })
    }

    /// A chunk of inserts only.
    pub fn inserts(batch: RecordBatch) -> Self {
        let ops: Arc<[Op]> = vec![Op::Insert; batch.num_rows()].into();
        Self { batch, ops }
    }

    /// An empty chunk of the given schema.
    pub fn empty(schema: SchemaRef) -> Self {
        Self::inserts(RecordBatch::new_empty(schema))
    }

    /// The rows.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    /// One op per row.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The rows' schema.
    pub fn schema(&self) -> SchemaRef {
        self.batch.schema()
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// True if the chunk has no rows.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }

    /// Splits the chunk into its batch and ops.
    pub fn into_parts(self) -> (RecordBatch, Arc<[Op]>) {
        (self.batch, self.ops)
    }

    /// Keeps the rows where `keep` is true. When only one half of an update pair is kept, the
    /// kept half becomes a plain change: an old row kept alone is a [`Op::Delete`], a new row
    /// kept alone an [`Op::Insert`]. The result is compact (no hidden rows).
    pub fn filter(&self, keep: &BooleanArray) -> Result<Self> {
        if keep.len() != self.num_rows() {
            return Err(internal!(
                "filter mask of {} rows for a chunk of {} rows",
                keep.len(),
                self.num_rows()
            ));
        }
        // NULL counts as "drop".
        let keep = match keep.nulls() {
            None => keep.values().clone(),
            Some(valid) => keep.values() & valid.inner(),
        };
        let kept = keep.count_set_bits();
        if kept == self.num_rows() {
            return Ok(self.clone());
        }
        // Only kept rows are visited; a kept half of an update pair looks at its partner.
        let ops: Vec<Op> = keep
            .set_indices()
            .map(|i| match self.ops[i] {
                Op::UpdateDelete if !keep.value(i + 1) => Op::Delete,
                Op::UpdateInsert if !keep.value(i - 1) => Op::Insert,
                op => op,
            })
            .collect();
        let keep = BooleanArray::new(keep, None);
        let batch = arrow_select::filter::filter_record_batch(&self.batch, &keep)?;
        Ok(Self {
            batch,
            ops: ops.into(),
        })
    }

    /// Concatenates chunks of one schema.
    pub fn concat(schema: &SchemaRef, chunks: &[StreamChunk]) -> Result<Self> {
        if chunks.len() == 1 {
            return Ok(chunks[0].clone());
        }
        let batch = crate::dictionary::concat_batches(schema, chunks.iter().map(|c| &c.batch))?;
        let ops: Vec<Op> = chunks.iter().flat_map(|c| c.ops.iter().copied()).collect();
        Ok(Self {
            batch,
            ops: ops.into(),
        })
    }

    /// The changelog form: `_epoch` (if `epoch` is given), `_op`, then the table's columns.
    pub fn to_changelog(&self, epoch: Option<u64>) -> Result<RecordBatch> {
        let schema = changelog_schema(&self.batch.schema(), epoch.is_some());
        let n = self.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        if let Some(epoch) = epoch {
            columns.push(Arc::new(UInt64Array::from(vec![epoch; n])));
        }
        columns.push(Arc::new(Int8Array::from_iter_values(
            self.ops.iter().map(|op| op.code()),
        )));
        columns.extend(self.batch.columns().iter().cloned());
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    /// Reads a changelog batch (`_op`, and optionally `_epoch`, then the table's columns).
    /// Returns the chunk and, when the batch has an `_epoch` column, the epoch of every row.
    pub fn from_changelog(batch: &RecordBatch) -> Result<(Self, Option<UInt64Array>)> {
        let schema = batch.schema();
        let op_idx = schema
            .index_of(OP_COLUMN)
            .map_err(|_| Error::UnknownColumn {
                column: OP_COLUMN.into(),
                context: "a changelog batch".into(),
            })?;
        let op_col = batch.column(op_idx);
        if op_col.data_type() != &DataType::Int8 || op_col.null_count() > 0 {
            return Err(Error::InvalidChunk(format!(
                "column `{OP_COLUMN}` must be non-null Int8, found {}",
                op_col.data_type()
            )));
        }
        let mut ops = Vec::with_capacity(batch.num_rows());
        for (row, code) in op_col
            .as_primitive::<Int8Type>()
            .values()
            .iter()
            .enumerate()
        {
            ops.push(
                Op::from_code(*code).map_err(|e| Error::InvalidChunk(format!("row {row}: {e}")))?,
            );
        }
        let epochs = match schema.index_of(EPOCH_COLUMN) {
            Ok(idx) => {
                let col = batch.column(idx);
                if col.data_type() != &DataType::UInt64 || col.null_count() > 0 {
                    return Err(Error::InvalidChunk(format!(
                        "column `{EPOCH_COLUMN}` must be non-null UInt64, found {}",
                        col.data_type()
                    )));
                }
                Some(col.as_primitive::<UInt64Type>().clone())
            }
            Err(_) => None,
        };
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|i| {
                let name = schema.field(*i).name();
                name != OP_COLUMN && name != EPOCH_COLUMN
            })
            .collect();
        let data = batch.project(&keep)?;
        Ok((Self::new(data, ops)?, epochs))
    }

    /// Parses the text form: one row a line, an op token (`+`, `-`, `U-`, `U+`) then one
    /// whitespace-separated value per column (`NULL` for null). Blank lines are skipped.
    /// Values are parsed by Arrow's cast from strings, so every castable type works.
    pub fn from_text(schema: &SchemaRef, text: &str) -> Result<Self> {
        let width = schema.fields().len();
        let mut ops = Vec::new();
        let mut cells: Vec<Vec<Option<String>>> = vec![Vec::new(); width];
        for (line_no, line) in text.lines().enumerate() {
            let mut tokens = line.split_whitespace();
            let Some(op_token) = tokens.next() else {
                continue;
            };
            let op = Op::from_token(op_token).ok_or_else(|| {
                Error::InvalidChunk(format!("line {}: unknown op `{op_token}`", line_no + 1))
            })?;
            let values: Vec<&str> = tokens.collect();
            if values.len() != width {
                return Err(Error::InvalidChunk(format!(
                    "line {}: {} values for {width} columns",
                    line_no + 1,
                    values.len()
                )));
            }
            ops.push(op);
            for (column, value) in cells.iter_mut().zip(values) {
                column.push((value != "NULL").then(|| value.to_string()));
            }
        }
        let columns = cells
            .into_iter()
            .zip(schema.fields())
            .map(|(values, field)| {
                let strings: ArrayRef = Arc::new(StringArray::from(values));
                Ok(arrow_cast::cast(&strings, field.data_type())?)
            })
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(ops.len())),
        )?;
        Self::new(batch, ops)
    }

    /// Formats the chunk in the text form of [`StreamChunk::from_text`].
    pub fn to_text(&self) -> Result<String> {
        let options = arrow_cast::display::FormatOptions::default().with_null("NULL");
        let formatters = self
            .batch
            .columns()
            .iter()
            .map(|c| arrow_cast::display::ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = String::new();
        for (row, op) in self.ops.iter().enumerate() {
            out.push_str(op.token());
            for f in &formatters {
                out.push(' ');
                out.push_str(&f.value(row).to_string());
            }
            out.push('\n');
        }
        Ok(out)
    }
}

/// The schema of a changelog: `_epoch` (when `with_epoch`), `_op`, then `table`'s fields.
pub fn changelog_schema(table: &Schema, with_epoch: bool) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = Vec::with_capacity(table.fields().len() + 2);
    if with_epoch {
        fields.push(Arc::new(Field::new(EPOCH_COLUMN, DataType::UInt64, false)));
    }
    fields.push(Arc::new(Field::new(OP_COLUMN, DataType::Int8, false)));
    fields.extend(table.fields().iter().cloned());
    Arc::new(Schema::new(fields))
}

/// Two consecutive epochs: changes after a barrier belong to `curr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpochPair {
    /// The epoch this barrier opens.
    pub curr: u64,
    /// The epoch this barrier closes.
    pub prev: u64,
}

impl EpochPair {
    /// A pair closing `prev` and opening `curr`.
    pub fn new(curr: u64, prev: u64) -> Self {
        Self { curr, prev }
    }

    /// The pair that follows this one, opening `next`.
    pub fn next(self, next: u64) -> Self {
        Self {
            curr: next,
            prev: self.curr,
        }
    }
}

/// Whether a barrier makes everything before it durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BarrierKind {
    /// Splits epochs only.
    Normal,
    /// Commits everything up to it.
    Checkpoint,
}

/// A control change carried by a barrier.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Stop reading the snapshot (upstream changes keep flowing).
    Pause,
    /// Undo a `Pause`.
    Resume,
    /// Limit snapshot reading to this many rows per second; `None` removes the limit and `0`
    /// pauses the snapshot side only.
    Throttle {
        /// The new limit.
        rows_per_second: Option<u64>,
    },
    /// Move vnodes between backfill actors: after this barrier (a checkpoint) actor `i` owns
    /// `actors[i]`. The sets partition the table's vnodes. Every actor persists its progress
    /// at the barrier; once the store committed it, the job runtime restarts the actors on
    /// the new sets, each restoring its vnodes from the committed progress (`src/job/`).
    Rescale {
        /// The vnodes of each actor after the barrier.
        actors: Vec<VnodeBitmap>,
    },
    /// Stop the job after this barrier.
    Stop,
}

/// Splits the stream into epochs; see [`EpochPair`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Barrier {
    /// The epochs it closes and opens.
    pub epoch: EpochPair,
    /// Checkpoint or not.
    pub kind: BarrierKind,
    /// An optional control change, applied when the barrier passes.
    pub mutation: Option<Mutation>,
}

impl Barrier {
    /// A barrier without mutation.
    pub fn new(epoch: EpochPair, kind: BarrierKind) -> Self {
        Self {
            epoch,
            kind,
            mutation: None,
        }
    }

    /// Adds a mutation.
    pub fn with_mutation(mut self, mutation: Mutation) -> Self {
        self.mutation = Some(mutation);
        self
    }

    /// True for a checkpoint barrier.
    pub fn is_checkpoint(&self) -> bool {
        self.kind == BarrierKind::Checkpoint
    }
}

/// A watermark on one column: no later row has a smaller value there.
#[derive(Debug, Clone)]
pub struct Watermark {
    /// The column index.
    pub column: usize,
    /// The value, as a one-row array.
    pub value: ArrayRef,
}

/// What flows between operators.
#[derive(Debug, Clone)]
pub enum Message {
    /// Changes.
    Chunk(StreamChunk),
    /// An epoch boundary.
    Barrier(Barrier),
    /// A watermark (dropped during backfill, forwarded after).
    Watermark(Watermark),
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn op_codes_round_trip_and_reject_unknown() {
        for op in [Op::Insert, Op::Delete, Op::UpdateDelete, Op::UpdateInsert] {
            assert_eq!(Op::from_code(op.code()).unwrap(), op);
        }
        assert_eq!(Op::Insert.code(), 1);
        assert_eq!(Op::UpdateInsert.code(), 4);
        assert!(Op::from_code(0).is_err());
        assert!(Op::from_code(5).is_err());
    }

    #[test]
    fn text_round_trip() {
        let text = "+ 1 a\n- 2 NULL\nU- 3 b\nU+ 3 c\n";
        let chunk = StreamChunk::from_text(&schema(), text).unwrap();
        assert_eq!(chunk.num_rows(), 4);
        assert_eq!(
            chunk.ops(),
            &[Op::Insert, Op::Delete, Op::UpdateDelete, Op::UpdateInsert]
        );
        assert_eq!(chunk.to_text().unwrap(), text);
    }

    #[test]
    fn rejects_split_update_pairs() {
        let lone_delete = StreamChunk::from_text(&schema(), "U- 1 a\n+ 2 b");
        assert!(matches!(lone_delete, Err(Error::InvalidChunk(m)) if m.contains("row 0")));
        let lone_insert = StreamChunk::from_text(&schema(), "+ 2 b\nU+ 1 a");
        assert!(matches!(lone_insert, Err(Error::InvalidChunk(m)) if m.contains("row 1")));
        assert!(StreamChunk::from_text(&schema(), "U- 1 a").is_err());
    }

    #[test]
    fn rejects_op_count_mismatch() {
        let batch = RecordBatch::new_empty(schema());
        assert!(StreamChunk::new(batch, vec![Op::Insert]).is_err());
    }

    #[test]
    fn filter_turns_half_pairs_into_plain_changes() {
        let chunk =
            StreamChunk::from_text(&schema(), "U- 1 a\nU+ 1 b\nU- 2 c\nU+ 2 d\nU- 3 e\nU+ 3 f")
                .unwrap();
        let keep: BooleanArray = (0..6).map(|i| Some(i != 1 && i != 2)).collect();
        let out = chunk.filter(&keep).unwrap();
        assert_eq!(out.to_text().unwrap(), "- 1 a\n+ 2 d\nU- 3 e\nU+ 3 f\n");
    }

    #[test]
    fn filter_treats_null_as_drop() {
        let chunk = StreamChunk::from_text(&schema(), "+ 1 a\nU- 2 b\nU+ 2 c").unwrap();
        let keep = BooleanArray::from(vec![Some(true), Some(true), None]);
        let out = chunk.filter(&keep).unwrap();
        assert_eq!(out.to_text().unwrap(), "+ 1 a\n- 2 b\n");
        let all = BooleanArray::from(vec![true, true, true]);
        assert_eq!(chunk.filter(&all).unwrap().num_rows(), 3);
    }

    #[test]
    fn changelog_round_trip_with_epoch() {
        let chunk = StreamChunk::from_text(&schema(), "+ 1 a\nU- 3 b\nU+ 3 c").unwrap();
        let log = chunk.to_changelog(Some(7)).unwrap();
        assert_eq!(log.schema().field(0).name(), EPOCH_COLUMN);
        assert_eq!(log.schema().field(1).name(), OP_COLUMN);
        let (back, epochs) = StreamChunk::from_changelog(&log).unwrap();
        assert_eq!(back.to_text().unwrap(), chunk.to_text().unwrap());
        assert_eq!(epochs.unwrap().values().as_ref(), &[7, 7, 7]);
    }

    #[test]
    fn changelog_rejects_unknown_op_code_with_row() {
        let chunk = StreamChunk::from_text(&schema(), "+ 1 a\n+ 2 b").unwrap();
        let log = chunk.to_changelog(None).unwrap();
        let mut columns = log.columns().to_vec();
        columns[0] = Arc::new(Int8Array::from(vec![1, 9]));
        let bad = RecordBatch::try_new(log.schema(), columns).unwrap();
        let err = StreamChunk::from_changelog(&bad).unwrap_err().to_string();
        assert!(
            err.contains("row 1") && err.contains("unknown op code 9"),
            "{err}"
        );
    }

    #[test]
    fn concat_keeps_ops_in_order() {
        let a = StreamChunk::from_text(&schema(), "+ 1 a").unwrap();
        let b = StreamChunk::from_text(&schema(), "- 1 a").unwrap();
        let c = StreamChunk::concat(&schema(), &[a, b]).unwrap();
        assert_eq!(c.to_text().unwrap(), "+ 1 a\n- 1 a\n");
    }
}
