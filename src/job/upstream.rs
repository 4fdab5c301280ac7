//! What a job takes from the upstream ([`Change`]) and the checks every change passes before
//! the job writes it into the upstream table ([`Checker`]).
//!
//! The table model the checks hold the upstream to, key by key:
//!
//! ```text
//!   + / U+   the key must be absent (no duplicate insert)
//!   - / U-   the key must be present, with the same values in every column; a delete whose
//!            non-key columns are all NULL (or a changelog batch with only the key columns)
//!            is a delete by key: the job takes the old values from the table, as CDC sources
//!            such as Debezium send deletes
//! ```
//!
//! A change is checked against the table as of the last sealed epoch and the changes of the
//! open epoch before it (kept in memory until the epoch is sealed: memory grows with an
//! epoch's changes, not with the table).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{Field, Schema};
use hashbrown::HashMap;

use crate::chunk::{Op, StreamChunk};
use crate::error::{Error, Result};
use crate::store::StateTable;
use crate::table::{TableDesc, describe_row};

/// One item of the upstream's change stream, as a [`BackfillJob`](crate::BackfillJob) takes
/// it. The job numbers epochs itself: a source says where an epoch ends, not its number.
#[derive(Debug, Clone)]
pub enum Change {
    /// Changes with their ops, of the table's schema.
    Chunk(StreamChunk),
    /// A changelog batch: `_op` (Int8: 1 insert, 2 delete, 3 update-delete, 4 update-insert),
    /// optionally `_epoch` (UInt64: the source's own epoch; a new value closes the job's open
    /// epoch, and the resume point names the last one applied), then the table's columns. A
    /// batch of deletes may carry only the key columns (see the module docs).
    Changelog(RecordBatch),
    /// Closes the open epoch here (a barrier; every `checkpoint_every`-th is a checkpoint).
    Barrier,
    /// Closes the open epoch here with a checkpoint.
    Checkpoint,
}

impl From<StreamChunk> for Change {
    fn from(chunk: StreamChunk) -> Self {
        Self::Chunk(chunk)
    }
}

impl From<RecordBatch> for Change {
    fn from(batch: RecordBatch) -> Self {
        Self::Changelog(batch)
    }
}

/// A changelog batch as a chunk of the table's schema (key-only deletes padded with NULLs,
/// resolved by the [`Checker`]), with the `_epoch` of each row when the batch has one.
pub(crate) fn changelog_chunk(
    desc: &TableDesc,
    batch: &RecordBatch,
) -> Result<(StreamChunk, Option<arrow_array::UInt64Array>)> {
    let (chunk, epochs) = StreamChunk::from_changelog(batch)?;
    let schema = desc.schema();
    if chunk.schema().fields() == schema.fields() {
        return Ok((chunk, epochs));
    }
    let mismatch = |found: String| Error::SchemaMismatch {
        context: format!("a changelog batch of table `{}`", desc.name()),
        expected: format!(
            "the table's columns {:?}",
            schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
        ),
        found,
    };
    let (batch, ops) = chunk.into_parts();
    let key = desc.pk().indices();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let mut fields: Vec<Field> = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        match batch.column_by_name(field.name()) {
            Some(column) => {
                if column.data_type() != field.data_type() {
                    return Err(mismatch(format!(
                        "column `{}` of type {}",
                        field.name(),
                        column.data_type()
                    )));
                }
                columns.push(column.clone());
            }
            None if !key.contains(&i) && ops.iter().all(|op| op.is_delete()) => {
                columns.push(new_null_array(field.data_type(), batch.num_rows()));
            }
            None => {
                return Err(mismatch(format!(
                    "no column `{}` (only a batch of deletes may leave out the columns \
                     outside the key)",
                    field.name()
                )));
            }
        }
        fields.push(field.as_ref().clone().with_nullable(true));
    }
    if let Some(extra) =
        (batch.schema().fields().iter()).find(|f| schema.field_with_name(f.name()).is_err())
    {
        return Err(mismatch(format!("a column `{}`", extra.name())));
    }
    let padded = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    Ok((StreamChunk::new(padded, ops)?, epochs))
}

/// Keeps an update's two halves together across changelog batches: a batch that ends with an
/// update-delete (U-) holds it back until the next batch brings its update-insert (U+), so a
/// source may cut its changelog anywhere (a reader's batch size, DuckDB's vectors).
#[derive(Debug, Default)]
pub(crate) struct UpdatePairs {
    /// The last row of the previous batch, a U- whose U+ has not come yet.
    held: Option<RecordBatch>,
}

impl UpdatePairs {
    /// `batch` with the row held back before it, less its own trailing U- (held back in
    /// turn); `None` when nothing is left to apply.
    pub fn join(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let batch = match self.held.take() {
            None => batch,
            Some(held) => {
                if held.schema().fields() != batch.schema().fields() {
                    return Err(Error::SchemaMismatch {
                        context: "a changelog batch after one that ended with an update-delete \
                                  (U-)"
                            .into(),
                        expected: held.schema().to_string(),
                        found: batch.schema().to_string(),
                    });
                }
                arrow_select::concat::concat_batches(&held.schema(), [&held, &batch])?
            }
        };
        let rows = batch.num_rows();
        let ops = batch
            .column_by_name("_op")
            .and_then(|ops| ops.as_primitive_opt::<Int8Type>());
        let ends_with_update_delete = (ops.filter(|ops| rows > 0 && ops.is_valid(rows - 1)))
            .is_some_and(|ops| ops.value(rows - 1) == Op::UpdateDelete.code());
        if !ends_with_update_delete {
            return Ok(Some(batch));
        }
        self.held = Some(batch.slice(rows - 1, 1));
        Ok((rows > 1).then(|| batch.slice(0, rows - 1)))
    }

    /// Before a barrier the source asked for, or at the source's end: no update may be left
    /// half-sent.
    pub fn check_complete(&self, at: &str) -> Result<()> {
        match self.held {
            None => Ok(()),
            Some(_) => Err(Error::InvalidChunk(format!(
                "an update-delete (U-) was not followed by its update-insert (U+) before {at}"
            ))),
        }
    }
}

/// Checks changes against the table (see the module docs) and resolves deletes by key.
pub(crate) struct Checker {
    desc: Arc<TableDesc>,
    all_columns: RowConverter,
    /// Changes since the last seal: encoded key to the row it holds now (`None`: deleted).
    open: HashMap<Box<[u8]>, Option<(RecordBatch, usize)>>,
    /// The epoch the table is read at: the last sealed one.
    sealed: u64,
}

impl Checker {
    /// Checks changes to `desc`'s table, sealed up to `sealed`.
    pub fn new(desc: Arc<TableDesc>, sealed: u64) -> Result<Self> {
        let fields = (desc.schema().fields().iter())
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            all_columns: RowConverter::new(fields)?,
            desc,
            open: HashMap::new(),
            sealed,
        })
    }

    /// The table was sealed at `epoch`: the open changes are now the table's.
    pub fn sealed(&mut self, epoch: u64) {
        self.sealed = epoch;
        self.open.clear();
    }

    /// Checks `chunk` (the open epoch `epoch`'s next changes) against `table` and returns it
    /// with deletes by key filled in from the table, as the table's schema.
    pub fn check<T: StateTable>(
        &mut self,
        table: &T,
        chunk: StreamChunk,
        epoch: u64,
    ) -> Result<StreamChunk> {
        let schema = self.desc.schema().clone();
        let batch = chunk.batch();
        let keys = self.desc.pk().encode(batch)?;
        let vnodes = self.desc.vnodes_of(batch)?;
        let rows = self.all_columns.convert_columns(batch.columns())?;
        let key_columns = self.desc.pk().indices();
        let others: Vec<usize> = (0..schema.fields().len())
            .filter(|c| !key_columns.contains(c))
            .collect();
        // Rows filled from the table: (row, the stored one-row batch).
        let mut fills: Vec<(usize, RecordBatch)> = Vec::new();
        for (i, op) in chunk.ops().iter().enumerate() {
            let key = keys.value(i);
            let current = match self.open.get(key) {
                Some(row) => row.clone(),
                None => table
                    .get(vnodes[i], key, self.sealed)?
                    .map(|stored| (stored, 0)),
            };
            let bad = |problem: String| Error::BadChange {
                epoch,
                key: describe_row(batch, key_columns, i),
                problem,
            };
            if op.is_delete() {
                let Some((stored, row)) = current else {
                    return Err(bad(format!(
                        "{} of a key the table does not hold",
                        op.name()
                    )));
                };
                let by_key =
                    !others.is_empty() && others.iter().all(|&c| batch.column(c).is_null(i));
                if by_key {
                    fills.push((i, stored.slice(row, 1)));
                } else {
                    let held = self.all_columns.convert_columns(stored.columns())?;
                    if held.row(row) != rows.row(i) {
                        return Err(bad(format!(
                            "{} whose old values {} differ from the table's {}",
                            op.name(),
                            describe_row(batch, &others, i),
                            describe_row(&stored, &others, row)
                        )));
                    }
                }
                self.open.insert(key.into(), None);
            } else {
                if current.is_some() {
                    return Err(bad(format!(
                        "{} of a key the table holds already",
                        op.name()
                    )));
                }
                self.open.insert(key.into(), Some((batch.clone(), i)));
            }
        }
        if fills.is_empty() && batch.schema().fields() == schema.fields() {
            return Ok(chunk);
        }
        // The deletes by key get the table's values; the result has the table's schema.
        let (batch, ops) = chunk.into_parts();
        let mut sources: Vec<&RecordBatch> = vec![&batch];
        sources.extend(fills.iter().map(|(_, stored)| stored));
        let mut indices: Vec<(usize, usize)> = (0..batch.num_rows()).map(|i| (0, i)).collect();
        for (n, (row, _)) in fills.iter().enumerate() {
            indices[*row] = (n + 1, 0);
        }
        let columns = (schema.fields().iter().enumerate())
            .map(|(c, field)| {
                let arrays: Vec<&dyn Array> =
                    sources.iter().map(|b| b.column(c).as_ref()).collect();
                crate::dictionary::interleave(field, &arrays, &indices)
            })
            .collect::<Result<Vec<_>>>()?;
        let resolved = RecordBatch::try_new(schema, columns).map_err(|e| {
            Error::InvalidChunk(format!("the changes do not fit the table's schema: {e}"))
        })?;
        // The open map pointed at the unresolved rows: replayed in order over the resolved
        // ones, so that each key ends as the chunk leaves it (a key inserted, then deleted,
        // in this chunk is absent).
        for (i, key) in keys.iter().enumerate() {
            if let Some(key) = key {
                let row = (!ops[i].is_delete()).then(|| (resolved.clone(), i));
                self.open.insert(key.into(), row);
            }
        }
        StreamChunk::new(resolved, ops)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int8Array, Int64Array};
    use arrow_schema::DataType;

    use super::*;

    fn batch(rows: &[(i8, i64)]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("_op", DataType::Int8, false),
            Field::new("k", DataType::Int64, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn rows(batch: &RecordBatch) -> Vec<(i8, i64)> {
        let ops = batch.column(0).as_primitive::<Int8Type>();
        let keys = batch
            .column(1)
            .as_primitive::<arrow_array::types::Int64Type>();
        (0..batch.num_rows())
            .map(|i| (ops.value(i), keys.value(i)))
            .collect()
    }

    #[test]
    fn an_update_cut_between_batches_is_joined() {
        let mut pairs = UpdatePairs::default();
        let first = pairs.join(batch(&[(1, 1), (3, 2)])).unwrap().unwrap();
        assert_eq!(rows(&first), [(1, 1)]);
        assert!(pairs.check_complete("a barrier").is_err());
        // A batch of only the held-back half's partner, then one of only a U-.
        let second = pairs.join(batch(&[(4, 2)])).unwrap().unwrap();
        assert_eq!(rows(&second), [(3, 2), (4, 2)]);
        assert!(pairs.join(batch(&[(3, 5)])).unwrap().is_none());
        let third = pairs.join(batch(&[(4, 5), (2, 7)])).unwrap().unwrap();
        assert_eq!(rows(&third), [(3, 5), (4, 5), (2, 7)]);
        pairs.check_complete("the end").unwrap();
        // An empty batch passes through; a whole batch without a trailing U- is untouched.
        assert_eq!(pairs.join(batch(&[])).unwrap().unwrap().num_rows(), 0);
    }

    #[test]
    fn a_held_update_and_a_batch_of_another_schema_is_an_error() {
        let mut pairs = UpdatePairs::default();
        pairs.join(batch(&[(3, 2)])).unwrap();
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("_op", DataType::Int8, false)])),
            vec![Arc::new(Int8Array::from(vec![4]))],
        )
        .unwrap();
        assert!(matches!(
            pairs.join(other),
            Err(Error::SchemaMismatch { .. })
        ));
    }
}
