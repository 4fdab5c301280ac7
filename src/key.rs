//! Primary keys: their order, their in-memory encoding, and positions.
//!
//! A table is stored sorted by its primary key. Each key column has a direction and a null
//! order; by default NULL counts as the largest value (last when ascending, first when
//! descending). In memory a key is an [`arrow_row`] row produced by the table's one
//! [`RowConverter`], so comparing two keys is `memcmp` of their bytes:
//!
//! ```text
//!   batch (k1: Utf8 asc, k2: Int32 desc)      encoded keys (BinaryArray)      order
//!   ("a", 7)                                   61 02 .. | 7f ff ff f8         memcmp
//!   ("a", 3)                            -->    61 02 .. | 7f ff ff fc    -->  ascending
//!   ("b", 9)                                   62 02 .. | 7f ff ff f6
//! ```
//!
//! Encoded keys are kept as a [`BinaryArray`] (zero-copy slicing, one buffer per batch).
//!
//! **arrow-row bytes are never persisted**: they depend on the arrow version. A [`Position`]
//! (the key of the last snapshot row emitted for a vnode) is persisted in its typed form, a
//! one-row batch of the key columns ([`Position::to_batch`]), and re-encoded on load
//! ([`Position::from_batch`]).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Schema, SchemaRef, SortOptions};

use crate::error::{Error, Result};

/// One primary-key column and its order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyColumn {
    /// The column name in the table schema.
    pub name: String,
    /// Descending instead of ascending.
    pub descending: bool,
    /// NULLs before non-NULLs. Defaults to "NULL is the largest value": last when
    /// ascending, first when descending.
    pub nulls_first: bool,
}

impl KeyColumn {
    /// An ascending column, NULLs last.
    pub fn asc(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            descending: false,
            nulls_first: false,
        }
    }

    /// A descending column, NULLs first (NULL is still the largest value).
    pub fn desc(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            descending: true,
            nulls_first: true,
        }
    }

    /// Overrides the null order.
    pub fn with_nulls_first(mut self, nulls_first: bool) -> Self {
        self.nulls_first = nulls_first;
        self
    }

    fn sort_options(&self) -> SortOptions {
        SortOptions {
            descending: self.descending,
            nulls_first: self.nulls_first,
        }
    }
}

/// A table's primary key: which columns, in which order, and the one converter that encodes
/// them. Cheap to clone (the converter is shared).
#[derive(Debug, Clone)]
pub struct PrimaryKey {
    columns: Vec<KeyColumn>,
    indices: Vec<usize>,
    key_schema: SchemaRef,
    converter: Arc<RowConverter>,
}

impl PrimaryKey {
    /// Resolves `columns` against `schema`. Errors on an unknown column, a repeated column, or
    /// a type that arrow-row cannot order.
    pub fn new(schema: &Schema, columns: Vec<KeyColumn>) -> Result<Self> {
        let mut indices = Vec::with_capacity(columns.len());
        let mut fields = Vec::with_capacity(columns.len());
        let mut sort_fields = Vec::with_capacity(columns.len());
        for column in &columns {
            let idx = schema
                .index_of(&column.name)
                .map_err(|_| Error::UnknownColumn {
                    column: column.name.clone(),
                    context: "the primary key's table".into(),
                })?;
            if indices.contains(&idx) {
                return Err(Error::InvalidConfig(format!(
                    "primary key column `{}` is listed twice",
                    column.name
                )));
            }
            let field = schema.field(idx);
            let sort_field =
                SortField::new_with_options(field.data_type().clone(), column.sort_options());
            if !RowConverter::supports_fields(std::slice::from_ref(&sort_field))
                || matches!(field.data_type(), DataType::Null)
            {
                return Err(Error::UnsupportedType {
                    column: column.name.clone(),
                    data_type: field.data_type().clone(),
                    usage: "a primary key",
                });
            }
            indices.push(idx);
            fields.push(field.clone());
            sort_fields.push(sort_field);
        }
        let converter = RowConverter::new(sort_fields)?;
        Ok(Self {
            columns,
            indices,
            key_schema: Arc::new(Schema::new(fields)),
            converter: Arc::new(converter),
        })
    }

    /// The key columns, in key order.
    pub fn columns(&self) -> &[KeyColumn] {
        &self.columns
    }

    /// The key columns' indices in the table schema.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The schema of the key columns alone (the typed form of a position).
    pub fn key_schema(&self) -> &SchemaRef {
        &self.key_schema
    }

    /// The shared row converter.
    pub fn converter(&self) -> &RowConverter {
        &self.converter
    }

    /// The key columns of a table batch.
    pub fn key_columns(&self, batch: &RecordBatch) -> Vec<ArrayRef> {
        self.indices
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect()
    }

    /// Encodes the keys of a table batch as arrow-row [`Rows`].
    pub fn encode_rows(&self, batch: &RecordBatch) -> Result<Rows> {
        Ok(self.converter.convert_columns(&self.key_columns(batch))?)
    }

    /// Encodes the keys of a table batch, one binary value per row; byte order is key order.
    pub fn encode(&self, batch: &RecordBatch) -> Result<BinaryArray> {
        self.encode_key_columns(&self.key_columns(batch))
    }

    /// Encodes key columns (in key order) given directly.
    pub fn encode_key_columns(&self, columns: &[ArrayRef]) -> Result<BinaryArray> {
        let rows = self.converter.convert_columns(columns)?;
        Ok(rows.try_into_binary()?)
    }

    /// Decodes encoded keys back into typed key columns.
    ///
    /// The keys must come from this key's [`PrimaryKey::encode`] (or a [`Position`] made from
    /// it); bytes from anywhere else are rejected by construction of [`Position`].
    pub fn decode<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        let rows: Vec<_> = keys.into_iter().map(|k| parser.parse(k)).collect();
        Ok(self.converter.convert_rows(rows)?)
    }
}

/// An owned encoded key: the last snapshot row emitted for a vnode, or a scan bound.
///
/// Ordered like the keys it came from. Only valid with the [`PrimaryKey`] that made it;
/// persisted through [`Position::to_batch`], never as bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(Box<[u8]>);

impl Position {
    /// The position of row `row` of encoded keys.
    pub fn from_keys(keys: &BinaryArray, row: usize) -> Self {
        Self(keys.value(row).into())
    }

    /// The encoded bytes (compare with other keys of the same [`PrimaryKey`]).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The typed, persistable form: a one-row batch of the key columns.
    pub fn to_batch(&self, pk: &PrimaryKey) -> Result<RecordBatch> {
        let columns = pk.decode([self.as_bytes()])?;
        Ok(RecordBatch::try_new(pk.key_schema().clone(), columns)?)
    }

    /// Re-encodes row `row` of a typed key batch (as made by [`Position::to_batch`]).
    pub fn from_batch(pk: &PrimaryKey, batch: &RecordBatch, row: usize) -> Result<Self> {
        if row >= batch.num_rows() {
            return Err(Error::CorruptState {
                context: "a persisted position".into(),
                message: format!("row {row} of a {}-row key batch", batch.num_rows()),
            });
        }
        let expected = pk.key_schema();
        let found = batch.schema();
        let same_types = found.fields().len() == expected.fields().len()
            && found
                .fields()
                .iter()
                .zip(expected.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if !same_types {
            return Err(Error::SchemaMismatch {
                context: "a persisted position".into(),
                expected: format!("{expected:?}"),
                found: format!("{found:?}"),
            });
        }
        let columns: Vec<ArrayRef> = batch.columns().iter().map(|c| c.slice(row, 1)).collect();
        let keys = pk.encode_key_columns(&columns)?;
        Ok(Self::from_keys(&keys, 0))
    }

    /// Compares an encoded key with this position.
    pub fn cmp_key(&self, key: &[u8]) -> Ordering {
        key.cmp(self.as_bytes())
    }
}

/// The first row `i` whose key is not strictly greater than the key before it, if any.
///
/// A cheap runtime check on every snapshot batch: storage order and comparator order must
/// agree, or the backfill would silently skip or duplicate rows.
pub fn first_unordered(keys: &BinaryArray) -> Option<usize> {
    (1..keys.len()).find(|&i| keys.value(i - 1) >= keys.value(i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int32Array, Int64Array, StringArray};
    use arrow_schema::Field;

    fn table() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int32, true),
            Field::new("v", DataType::Float64, true),
        ]))
    }

    fn batch(s: Vec<Option<&str>>, i: Vec<Option<i32>>) -> RecordBatch {
        let n = s.len();
        RecordBatch::try_new(
            table(),
            vec![
                Arc::new(StringArray::from(s)),
                Arc::new(Int32Array::from(i)),
                Arc::new(Float64Array::from(vec![0.0; n])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn unknown_repeated_and_unsupported_columns_are_errors() {
        let schema = table();
        assert!(matches!(
            PrimaryKey::new(&schema, vec![KeyColumn::asc("nope")]),
            Err(Error::UnknownColumn { .. })
        ));
        assert!(matches!(
            PrimaryKey::new(&schema, vec![KeyColumn::asc("s"), KeyColumn::desc("s")]),
            Err(Error::InvalidConfig(_))
        ));
        let null_schema = Schema::new(vec![Field::new("n", DataType::Null, true)]);
        assert!(matches!(
            PrimaryKey::new(&null_schema, vec![KeyColumn::asc("n")]),
            Err(Error::UnsupportedType { .. })
        ));
    }

    #[test]
    fn nulls_are_largest_in_both_directions() {
        let schema = table();
        let asc = PrimaryKey::new(&schema, vec![KeyColumn::asc("i")]).unwrap();
        let desc = PrimaryKey::new(&schema, vec![KeyColumn::desc("i")]).unwrap();
        let b = batch(vec![None, None, None], vec![Some(1), None, Some(2)]);
        let ka = asc.encode(&b).unwrap();
        assert!(ka.value(0) < ka.value(2) && ka.value(2) < ka.value(1));
        let kd = desc.encode(&b).unwrap();
        assert!(kd.value(1) < kd.value(2) && kd.value(2) < kd.value(0));
    }

    #[test]
    fn position_round_trips_through_typed_batch() {
        let schema = table();
        let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("s"), KeyColumn::desc("i")]).unwrap();
        let b = batch(vec![Some("x"), None], vec![None, Some(-4)]);
        let keys = pk.encode(&b).unwrap();
        for row in 0..2 {
            let pos = Position::from_keys(&keys, row);
            let typed = pos.to_batch(&pk).unwrap();
            assert_eq!(typed.num_rows(), 1);
            assert_eq!(typed.schema(), *pk.key_schema());
            assert_eq!(Position::from_batch(&pk, &typed, 0).unwrap(), pos);
        }
    }

    #[test]
    fn position_from_wrong_batch_is_an_error() {
        let schema = table();
        let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("i")]).unwrap();
        let wrong = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("i", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        assert!(matches!(
            Position::from_batch(&pk, &wrong, 0),
            Err(Error::SchemaMismatch { .. })
        ));
        let right = Position::from_keys(&pk.encode(&batch(vec![None], vec![Some(1)])).unwrap(), 0)
            .to_batch(&pk)
            .unwrap();
        assert!(matches!(
            Position::from_batch(&pk, &right, 3),
            Err(Error::CorruptState { .. })
        ));
    }

    #[test]
    fn first_unordered_finds_ties_and_inversions() {
        let schema = table();
        let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("i")]).unwrap();
        let sorted = pk
            .encode(&batch(vec![None; 3], vec![Some(1), Some(2), None]))
            .unwrap();
        assert_eq!(first_unordered(&sorted), None);
        let tie = pk
            .encode(&batch(vec![None; 3], vec![Some(1), Some(2), Some(2)]))
            .unwrap();
        assert_eq!(first_unordered(&tie), Some(2));
        let inverted = pk
            .encode(&batch(vec![None; 2], vec![Some(3), Some(2)]))
            .unwrap();
        assert_eq!(first_unordered(&inverted), Some(1));
    }
}
