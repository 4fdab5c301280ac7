//! The in-memory table model: changes applied one row at a time to a map from encoded key
//! to row. Test only: the reference that the bounded, key-by-key checks of [`super::by_key`]
//! (validation, verification) must agree with, error for error.
//!
//! Keys are [`PrimaryKey::encode`] bytes. What is kept per row is a type parameter: a 64-bit
//! hash of the row (as validation keeps) or the exact row bytes of an all-column
//! [`RowConverter`] (as verification compares). Memory is O(table).

use std::hash::BuildHasher;

use arrow_array::{Array, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SchemaRef;
use hashbrown::HashMap;

use super::apply::describe_row;
use crate::chunk::Op;
use crate::error::{Error, Result};
use crate::key::PrimaryKey;

/// What a [`KeyedTable`] keeps per row, derived from the row's all-column encoding.
pub(crate) trait RowValue: PartialEq + Sized {
    /// The value of a row whose all-column encoding is `row`.
    fn from_row(row: &[u8], hasher: &hashbrown::DefaultHashBuilder) -> Self;

    /// Whether a stored value can be shown in messages.
    const PRINTABLE: bool;

    /// The all-column encoding, when kept.
    fn row_bytes(&self) -> &[u8];
}

impl RowValue for u64 {
    fn from_row(row: &[u8], hasher: &hashbrown::DefaultHashBuilder) -> Self {
        hasher.hash_one(row)
    }

    const PRINTABLE: bool = false;

    fn row_bytes(&self) -> &[u8] {
        &[]
    }
}

impl RowValue for Box<[u8]> {
    fn from_row(row: &[u8], _: &hashbrown::DefaultHashBuilder) -> Self {
        row.into()
    }

    const PRINTABLE: bool = true;

    fn row_bytes(&self) -> &[u8] {
        self
    }
}

/// A table model keyed by encoded primary key. See the module docs.
pub(crate) struct KeyedTable<V> {
    schema: SchemaRef,
    pk: PrimaryKey,
    names: Vec<String>,
    all_columns: RowConverter,
    hasher: hashbrown::DefaultHashBuilder,
    rows: HashMap<Box<[u8]>, V>,
}

impl<V: RowValue> KeyedTable<V> {
    /// An empty table of `schema` keyed by `pk`.
    pub fn new(schema: &SchemaRef, pk: PrimaryKey) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            schema: schema.clone(),
            pk,
            names: schema.fields().iter().map(|f| f.name().clone()).collect(),
            all_columns: RowConverter::new(fields)?,
            hasher: Default::default(),
            rows: HashMap::new(),
        })
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// The rows, in no particular order.
    pub fn rows(&self) -> &HashMap<Box<[u8]>, V> {
        &self.rows
    }

    /// `(key=value, ...)` of an encoded key, for messages.
    pub fn describe_key(&self, key: &[u8]) -> String {
        let decoded = self.pk.decode([key]).and_then(|columns| {
            Ok(RecordBatch::try_new(
                self.pk.decoded_schema().clone(),
                columns,
            )?)
        });
        match decoded {
            Ok(batch) => describe_row(&batch, &(0..batch.num_columns()).collect::<Vec<_>>(), 0),
            Err(_) => "(?)".into(),
        }
    }

    /// Inserts the rows of a snapshot batch; a key already present is a duplicate.
    pub fn load(
        &mut self,
        batch: &RecordBatch,
        error: impl Fn(usize, String) -> Error,
    ) -> Result<()> {
        self.apply_rows(batch, None, error)
    }

    /// Applies `ops[i]` to row `i` of `batch`, in order. `error(i, message)` makes the error
    /// for row `i`.
    pub fn apply(
        &mut self,
        batch: &RecordBatch,
        ops: &[Op],
        error: impl Fn(usize, String) -> Error,
    ) -> Result<()> {
        self.apply_rows(batch, Some(ops), error)
    }

    fn apply_rows(
        &mut self,
        batch: &RecordBatch,
        ops: Option<&[Op]>,
        error: impl Fn(usize, String) -> Error,
    ) -> Result<()> {
        let key_indices = self.pk.indices().to_vec();
        for &c in &key_indices {
            let column = batch.column(c);
            if let Some(i) = (0..batch.num_rows()).find(|&i| column.is_null(i)) {
                return Err(error(
                    i,
                    format!("NULL in primary key column `{}`", self.names[c]),
                ));
            }
        }
        let keys = self.pk.encode(batch)?;
        let rows: Rows = self.all_columns.convert_columns(batch.columns())?;
        for i in 0..batch.num_rows() {
            let op = ops.map_or(&Op::Insert, |ops| &ops[i]);
            let key = keys.value(i);
            let value = V::from_row(rows.row(i).as_ref(), &self.hasher);
            let describe_key = || describe_row(batch, &key_indices, i);
            match op {
                Op::Insert | Op::UpdateInsert => {
                    if self.rows.contains_key(key) {
                        if ops.is_none() {
                            return Err(error(
                                i,
                                format!("duplicate primary key {} in the snapshot", describe_key()),
                            ));
                        }
                        let what = if *op == Op::Insert {
                            "insert"
                        } else {
                            "update-insert (U+)"
                        };
                        return Err(error(
                            i,
                            format!("{what} of key {}, which already exists", describe_key()),
                        ));
                    }
                    self.rows.insert(key.into(), value);
                }
                Op::Delete | Op::UpdateDelete => {
                    let what = if *op == Op::Delete {
                        "delete"
                    } else {
                        "update-delete (U-)"
                    };
                    match self.rows.get(key) {
                        None => {
                            return Err(error(
                                i,
                                format!("{what} of key {}, which does not exist", describe_key()),
                            ));
                        }
                        Some(v) if *v != value => {
                            let held = if V::PRINTABLE {
                                format!(" {}", self.describe_value(v.row_bytes()))
                            } else {
                                String::new()
                            };
                            return Err(error(
                                i,
                                format!(
                                    "{what} of key {} with values {} that differ from the stored row{held}",
                                    describe_key(),
                                    describe_row(
                                        batch,
                                        &(0..batch.num_columns()).collect::<Vec<_>>(),
                                        i
                                    )
                                ),
                            ));
                        }
                        Some(_) => {
                            self.rows.remove(key);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl<V> KeyedTable<V> {
    /// `(name=value, ...)` of a stored row's all-column encoding, for messages.
    pub fn describe_value(&self, row: &[u8]) -> String {
        let parser = self.all_columns.parser();
        let decoded = self
            .all_columns
            .convert_rows([parser.parse(row)])
            .map_err(Error::from)
            .and_then(|columns| Ok(RecordBatch::try_new(self.schema.clone(), columns)?));
        match decoded {
            Ok(batch) => describe_row(&batch, &(0..batch.num_columns()).collect::<Vec<_>>(), 0),
            Err(_) => "(?)".into(),
        }
    }
}
