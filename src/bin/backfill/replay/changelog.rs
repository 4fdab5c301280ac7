//! Reading changelog Parquet files (`_epoch`, `_op`, then the table's columns) as one stream.
//!
//! [`ChangelogReader`] reads a list of files in order and checks everything that can be
//! checked without a table model, naming the file, epoch and row of the first violation:
//!
//! - `_epoch` and `_op` are never NULL, every op code is 1..=4;
//! - `_epoch` never decreases, also across files;
//! - every U- is immediately followed by a U+ of the same epoch (possibly in the next batch
//!   or the next file), and every U+ immediately follows a U-.
//!
//! The rows it yields are therefore a valid changelog *shape*; whether the changes apply to
//! the table (no duplicate insert, no delete of an absent key) is [`super::apply`]'s job.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema, SchemaRef};

use super::files;
use crate::chunk::{EPOCH_COLUMN, OP_COLUMN, Op};
use crate::error::{Error, Result};
use crate::table::describe;

/// Where a changelog row is: its file, its row in that file (from 0) and its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowLocation {
    pub path: PathBuf,
    pub row: u64,
    pub epoch: u64,
}

impl RowLocation {
    /// The `location` of an [`Error::Dataset`].
    pub fn describe(&self) -> String {
        format!("epoch {}, row {}", self.epoch, self.row)
    }

    /// An [`Error::Dataset`] at this row.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::dataset(&self.path, self.describe(), message)
    }
}

/// Checks that a changelog file's schema is `_epoch: UInt64`, `_op: Int8`, then exactly the
/// table's columns (names and types; nullability may differ).
pub(crate) fn check_schema(path: &Path, found: &Schema, table: &Schema) -> Result<()> {
    let fields = found.fields();
    let mismatch = |what: String| {
        Error::dataset(
            path,
            "",
            format!(
                "{what}; a changelog file must have the columns ({EPOCH_COLUMN}: UInt64, {OP_COLUMN}: Int8) then the table's {}, found {}",
                describe(table),
                describe(found)
            ),
        )
    };
    for (i, (name, data_type)) in [
        (EPOCH_COLUMN, DataType::UInt64),
        (OP_COLUMN, DataType::Int8),
    ]
    .into_iter()
    .enumerate()
    {
        match fields.get(i) {
            Some(f) if f.name() == name && f.data_type() == &data_type => {}
            Some(f) if f.name() == name => {
                return Err(mismatch(format!(
                    "column `{name}` has type {}, expected {data_type}",
                    f.data_type()
                )));
            }
            _ => {
                return Err(mismatch(format!(
                    "column {} must be `{name}` ({data_type})",
                    i + 1
                )));
            }
        }
    }
    if !files::same_columns(&fields[2..], table.fields()) {
        return Err(mismatch(
            "the table columns differ from the snapshot's".into(),
        ));
    }
    Ok(())
}

/// One batch of changelog rows, checked (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ChangelogRows {
    /// The file the rows come from.
    pub path: PathBuf,
    /// The row index within the file of the first row.
    pub first_row: u64,
    /// The epoch of every row.
    pub epochs: Vec<u64>,
    /// The op of every row.
    pub ops: Vec<Op>,
    /// The table columns, labelled with the dataset schema.
    pub data: RecordBatch,
}

impl ChangelogRows {
    /// The location of row `i` of this batch.
    pub fn location(&self, i: usize) -> RowLocation {
        RowLocation {
            path: self.path.clone(),
            row: self.first_row + i as u64,
            epoch: self.epochs[i],
        }
    }
}

struct OpenFile {
    path: PathBuf,
    reader: files::BatchReader,
    rows_read: u64,
}

/// Reads changelog files in order as one checked stream of [`ChangelogRows`]. `Send +
/// 'static`: it owns its file handles. Stops after the first error.
pub(crate) struct ChangelogReader {
    files: VecDeque<PathBuf>,
    table: SchemaRef,
    batch_size: usize,
    current: Option<OpenFile>,
    last_epoch: Option<u64>,
    /// A U- whose U+ must be the next row.
    open_update: Option<RowLocation>,
    /// Table columns read in canonical float form (the dataset's float key columns).
    canonical_floats: Vec<usize>,
    failed: bool,
}

impl ChangelogReader {
    /// A reader of `files`, whose table columns are `table` (the dataset schema).
    pub fn new(files: Vec<PathBuf>, table: SchemaRef, batch_size: usize) -> Self {
        Self {
            files: files.into(),
            table,
            batch_size: batch_size.max(1),
            current: None,
            last_epoch: None,
            open_update: None,
            canonical_floats: Vec::new(),
            failed: false,
        }
    }

    /// Reads the table columns `columns` (float key columns) in canonical form: `-0.0` as
    /// `0.0`, every NaN as one NaN.
    pub fn with_canonical_floats(mut self, columns: Vec<usize>) -> Self {
        self.canonical_floats = columns;
        self
    }

    fn next_raw(&mut self) -> Result<Option<(PathBuf, u64, RecordBatch)>> {
        loop {
            if let Some(file) = &mut self.current {
                match file.reader.next_batch() {
                    Some(batch) => {
                        let batch = batch?;
                        let first_row = file.rows_read;
                        file.rows_read += batch.num_rows() as u64;
                        return Ok(Some((file.path.clone(), first_row, batch)));
                    }
                    None => self.current = None,
                }
            }
            let Some(path) = self.files.pop_front() else {
                return Ok(None);
            };
            let reader = files::open_reader(&path, self.batch_size)?;
            check_schema(&path, &reader.schema(), &self.table)?;
            self.current = Some(OpenFile {
                path,
                reader,
                rows_read: 0,
            });
        }
    }

    fn decode(
        &mut self,
        path: PathBuf,
        first_row: u64,
        batch: RecordBatch,
    ) -> Result<ChangelogRows> {
        let n = batch.num_rows();
        let epoch_col = batch.column(0);
        let op_col = batch.column(1);
        if let Some(i) = (0..n).find(|&i| epoch_col.is_null(i)) {
            return Err(Error::dataset(
                &path,
                format!("row {}", first_row + i as u64),
                format!("NULL `{EPOCH_COLUMN}`"),
            ));
        }
        let epochs: Vec<u64> = epoch_col.as_primitive::<UInt64Type>().values().to_vec();
        let codes = op_col.as_primitive::<Int8Type>();
        let mut ops = Vec::with_capacity(n);
        for (i, &epoch) in epochs.iter().enumerate() {
            let here = || RowLocation {
                path: path.clone(),
                row: first_row + i as u64,
                epoch,
            };
            if codes.is_null(i) {
                return Err(here().error(format!("NULL `{OP_COLUMN}`")));
            }
            let code = codes.value(i);
            let op = Op::from_code(code).map_err(|_| {
                here().error(format!(
                    "unknown op code {code} (expected 1 insert, 2 delete, 3 update-delete, 4 update-insert)"
                ))
            })?;
            if let Some(last) = self.last_epoch
                && epoch < last
            {
                return Err(here().error(format!(
                    "epoch {epoch} after epoch {last}: `{EPOCH_COLUMN}` must never decrease"
                )));
            }
            self.last_epoch = Some(epoch);
            match self.open_update.take() {
                Some(open) if op != Op::UpdateInsert || open.epoch != epoch => {
                    return Err(open.error(format!(
                        "update-delete (U-) is not immediately followed by its update-insert (U+) in the same epoch (the next row, {} in {}, is {})",
                        here().describe(),
                        path.display(),
                        op.token()
                    )));
                }
                Some(_) => {}
                None if op == Op::UpdateInsert => {
                    return Err(here().error(
                        "update-insert (U+) without an immediately preceding update-delete (U-)",
                    ));
                }
                None => {}
            }
            if op == Op::UpdateDelete {
                self.open_update = Some(here());
            }
            ops.push(op);
        }
        let columns = files::conform(&batch.columns()[2..], &self.table).map_err(|e| {
            Error::dataset(
                &path,
                "",
                format!("rows do not fit the dataset schema: {e}"),
            )
        })?;
        let data = RecordBatch::try_new_with_options(
            self.table.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(|e| {
            Error::dataset(
                &path,
                "",
                format!("rows do not fit the dataset schema: {e}"),
            )
        })?;
        let data = canonical_key_floats(data, &self.canonical_floats);
        Ok(ChangelogRows {
            path,
            first_row,
            epochs,
            ops,
            data,
        })
    }

    fn step(&mut self) -> Result<Option<ChangelogRows>> {
        loop {
            let Some((path, first_row, batch)) = self.next_raw()? else {
                if let Some(open) = self.open_update.take() {
                    return Err(open.error(
                        "update-delete (U-) at the end of the changelog without its update-insert (U+)",
                    ));
                }
                return Ok(None);
            };
            if batch.num_rows() > 0 {
                return self.decode(path, first_row, batch).map(Some);
            }
        }
    }
}

impl Iterator for ChangelogReader {
    type Item = Result<ChangelogRows>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(rows) => rows.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
/// `batch` with its float key columns (`float_keys`) in canonical form.
pub(crate) fn canonical_key_floats(batch: RecordBatch, float_keys: &[usize]) -> RecordBatch {
    if float_keys.is_empty() {
        return batch;
    }
    let mut columns = batch.columns().to_vec();
    for &i in float_keys {
        if let Some(column) = columns.get_mut(i) {
            *column = crate::key::canonical_floats(column);
        }
    }
    // Same schema, same lengths and types: cannot fail; keep the original if it does.
    RecordBatch::try_new(batch.schema(), columns).unwrap_or(batch)
}
