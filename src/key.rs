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
//! **Key equality is SQL equality** (docs/DESIGN.md section 5): float key columns are normalised
//! before encoding ([`canonical_floats`]): `-0.0` is `0.0` and every NaN is one NaN, which
//! orders above every number (as in PostgreSQL). The vnode hash folds floats the same way
//! ([`crate::vnode`]), so the hash, the order and the duplicate check agree.
//!
//! **arrow-row bytes are never persisted**: they depend on the arrow version. A [`Position`]
//! (the key of the last snapshot row emitted for a vnode) is persisted in its typed form, a
//! one-row batch of the key columns ([`Position::to_batch`]), and re-encoded on load
//! ([`Position::from_batch`]).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Float64Type};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, BinaryArray, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Field, Schema, SchemaRef, SortOptions};

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
    /// The key columns as [`PrimaryKey::decode`] returns them (see
    /// [`PrimaryKey::decoded_schema`]).
    decoded_schema: SchemaRef,
    /// A converter of the decoded types, when they differ from the key's: it encodes decoded
    /// columns to the same bytes as the key's converter encodes the key's columns.
    decoded_converter: Option<Arc<RowConverter>>,
}

impl PrimaryKey {
    /// Resolves `columns` against `schema`. Errors on an empty key, an unknown column, a
    /// repeated column, or a type that arrow-row cannot order.
    pub fn new(schema: &Schema, columns: Vec<KeyColumn>) -> Result<Self> {
        if columns.is_empty() {
            return Err(Error::InvalidConfig(
                "a primary key needs at least one column".into(),
            ));
        }
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
        // arrow-row decodes a dictionary as its values (also inside structs and lists); an
        // empty decode gives those types.
        let decoded = converter.convert_rows(std::iter::empty())?;
        let decoded_fields: Vec<Field> = (fields.iter().zip(&decoded))
            .map(|(f, c)| f.clone().with_data_type(c.data_type().clone()))
            .collect();
        let decoded_converter = if (fields.iter().zip(&decoded_fields))
            .all(|(f, d)| f.data_type() == d.data_type())
        {
            None
        } else {
            let decoded_sorts = (columns.iter().zip(&decoded_fields))
                .map(|(c, d)| SortField::new_with_options(d.data_type().clone(), c.sort_options()))
                .collect();
            Some(Arc::new(RowConverter::new(decoded_sorts)?))
        };
        Ok(Self {
            columns,
            indices,
            key_schema: Arc::new(Schema::new(fields)),
            converter: Arc::new(converter),
            decoded_schema: Arc::new(Schema::new(decoded_fields)),
            decoded_converter,
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

    /// The key columns as [`PrimaryKey::decode`] returns them, the typed form keys are
    /// persisted in ([`Position::to_batch`], a run file's block index): the key's types, except
    /// that dictionaries are their values (arrow-row does not keep dictionaries, and a
    /// dictionary with narrow keys could not hold the many values of an index).
    /// [`PrimaryKey::encode_key_columns`] takes columns of these types too.
    pub fn decoded_schema(&self) -> &SchemaRef {
        &self.decoded_schema
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

    /// The key columns of a table batch, checked: a batch too narrow for the key is an
    /// [`Error::SchemaMismatch`] (types are checked by the encoder).
    fn checked_key_columns(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        self.indices
            .iter()
            .map(|&i| {
                batch
                    .columns()
                    .get(i)
                    .cloned()
                    .ok_or_else(|| Error::SchemaMismatch {
                        context: "the primary key's columns".into(),
                        expected: format!("{:?}", self.key_schema),
                        found: format!("a batch of {} columns", batch.num_columns()),
                    })
            })
            .collect()
    }

    /// Encodes the keys of a table batch as arrow-row [`Rows`].
    pub fn encode_rows(&self, batch: &RecordBatch) -> Result<Rows> {
        let columns = canonical_float_columns(&self.checked_key_columns(batch)?);
        Ok(self.converter.convert_columns(&columns)?)
    }

    /// Encodes the keys of a table batch, one binary value per row; byte order is key order.
    pub fn encode(&self, batch: &RecordBatch) -> Result<BinaryArray> {
        self.encode_key_columns(&self.checked_key_columns(batch)?)
    }

    /// Encodes the keys of several table batches, one after another, into one array.
    pub fn encode_all(&self, batches: &[&RecordBatch]) -> Result<BinaryArray> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let mut encoded = self.converter.empty_rows(rows, rows * 16);
        for batch in batches {
            let columns = canonical_float_columns(&self.checked_key_columns(batch)?);
            self.converter.append(&mut encoded, &columns)?;
        }
        Ok(encoded.try_into_binary()?)
    }

    /// Encodes key columns (in key order) given directly, of the key's types or of the
    /// [`PrimaryKey::decoded_schema`]'s (dictionaries as their values: the same bytes). Float
    /// columns are normalised first ([`canonical_floats`]).
    pub fn encode_key_columns(&self, columns: &[ArrayRef]) -> Result<BinaryArray> {
        let converter = match &self.decoded_converter {
            Some(decoded) if !same_types(columns, &self.key_schema) => {
                if !same_types(columns, &self.decoded_schema) {
                    return Err(Error::SchemaMismatch {
                        context: "key columns to encode".into(),
                        expected: format!("{:?} or {:?}", self.key_schema, self.decoded_schema),
                        found: format!(
                            "{:?}",
                            columns.iter().map(|c| c.data_type()).collect::<Vec<_>>()
                        ),
                    });
                }
                decoded
            }
            _ => &self.converter,
        };
        let rows = converter.convert_columns(&canonical_float_columns(columns))?;
        Ok(rows.try_into_binary()?)
    }

    /// Decodes encoded keys back into typed key columns, of the types of
    /// [`PrimaryKey::decoded_schema`] (dictionaries as their values).
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
        Self::from_bytes(keys.value(row))
    }

    /// The position of an encoded key.
    pub(crate) fn from_bytes(key: &[u8]) -> Self {
        Self(key.into())
    }

    /// The encoded bytes (compare with other keys of the same [`PrimaryKey`]).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The typed, persistable form: a one-row batch of the key columns, of the types of
    /// [`PrimaryKey::decoded_schema`].
    pub fn to_batch(&self, pk: &PrimaryKey) -> Result<RecordBatch> {
        let columns = pk.decode([self.as_bytes()])?;
        Ok(RecordBatch::try_new(pk.decoded_schema().clone(), columns)?)
    }

    /// Re-encodes row `row` of a typed key batch (as made by [`Position::to_batch`], or of
    /// the key's own types).
    pub fn from_batch(pk: &PrimaryKey, batch: &RecordBatch, row: usize) -> Result<Self> {
        if row >= batch.num_rows() {
            return Err(Error::CorruptState {
                context: "a persisted position".into(),
                message: format!("row {row} of a {}-row key batch", batch.num_rows()),
            });
        }
        let expected = pk.key_schema();
        let found = batch.schema();
        if !same_types(batch.columns(), expected)
            && !same_types(batch.columns(), pk.decoded_schema())
        {
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
}

/// Whether `columns` have the types of `schema`'s fields, in order.
fn same_types(columns: &[ArrayRef], schema: &Schema) -> bool {
    columns.len() == schema.fields().len()
        && (columns.iter().zip(schema.fields())).all(|(c, f)| c.data_type() == f.data_type())
}

/// `array` with SQL float equality made bitwise: for `Float16`, `Float32` and `Float64`
/// arrays, `-0.0` becomes `0.0` and every NaN the canonical quiet NaN (`0x7E00`, `f32::NAN`,
/// `f64::NAN`, which order above every number). Other arrays are returned as they are.
pub fn canonical_floats(array: &ArrayRef) -> ArrayRef {
    fn map<T: ArrowPrimitiveType>(
        array: &ArrayRef,
        canonical: impl Fn(T::Native) -> T::Native,
        is_canonical: impl Fn(T::Native) -> bool,
    ) -> ArrayRef {
        let values = array.as_primitive::<T>();
        if values.values().iter().all(|&v| is_canonical(v)) {
            return array.clone();
        }
        Arc::new(values.unary::<_, T>(canonical))
    }
    match array.data_type() {
        DataType::Float16 => {
            type F16 = <Float16Type as ArrowPrimitiveType>::Native;
            // The bits of f16: sign 0x8000, exponent 0x7C00, mantissa 0x03FF.
            let canonical_bits = |bits: u16| {
                if bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0 {
                    0x7E00
                } else if bits == 0x8000 {
                    0
                } else {
                    bits
                }
            };
            map::<Float16Type>(
                array,
                |v| F16::from_bits(canonical_bits(v.to_bits())),
                |v| canonical_bits(v.to_bits()) == v.to_bits(),
            )
        }
        DataType::Float32 => map::<Float32Type>(
            array,
            |v| {
                if v.is_nan() {
                    f32::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                }
            },
            |v| {
                if v.is_nan() {
                    v.to_bits() == f32::NAN.to_bits()
                } else {
                    v.to_bits() != (-0.0f32).to_bits()
                }
            },
        ),
        DataType::Float64 => map::<Float64Type>(
            array,
            |v| {
                if v.is_nan() {
                    f64::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                }
            },
            |v| {
                if v.is_nan() {
                    v.to_bits() == f64::NAN.to_bits()
                } else {
                    v.to_bits() != (-0.0f64).to_bits()
                }
            },
        ),
        _ => array.clone(),
    }
}

/// [`canonical_floats`] of every column.
pub(crate) fn canonical_float_columns(columns: &[ArrayRef]) -> Vec<ArrayRef> {
    columns.iter().map(canonical_floats).collect()
}

/// [`first_unordered_in`] of all of `keys`.
#[cfg(test)]
pub(crate) fn first_unordered(keys: &BinaryArray) -> Option<usize> {
    first_unordered_in(keys, 0, keys.len())
}

/// The first row `i` of the keys `start..start + len` of `keys` whose key is not strictly
/// greater than the key before it, if any, as a row of that range.
///
/// A cheap runtime check on every snapshot batch: storage order and comparator order must
/// agree, or the backfill would silently skip or duplicate rows.
pub fn first_unordered_in(keys: &BinaryArray, start: usize, len: usize) -> Option<usize> {
    (start + 1..start + len)
        .find(|&i| keys.value(i - 1) >= keys.value(i))
        .map(|i| i - start)
}

/// The first 16 bytes of an encoded key as two big-endian integers, zero-padded: sorting
/// by prefix, then by the whole key where prefixes tie, is sorting by key, with most
/// comparisons one integer compare held in the sorted array instead of a `memcmp` through
/// two indirections (a key of a few integer columns fits whole: lineitem's is 14 bytes).
///
/// `a < b` for two prefixes means the same for their keys; equal prefixes say nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyPrefix([u64; 2]);

impl KeyPrefix {
    /// The prefix of the encoded key `key`.
    pub fn of(key: &[u8]) -> Self {
        let mut bytes = [0u8; 16];
        let n = key.len().min(16);
        bytes[..n].copy_from_slice(&key[..n]);
        let (high, low) = bytes.split_at(8);
        let word = |bytes: &[u8]| {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            u64::from_be_bytes(word)
        };
        Self([word(high), word(low)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int32Array, Int64Array, StringArray};
    use arrow_schema::Field;
    use std::cmp::Ordering;

    /// Issue 41 item 7: a dictionary key column decodes as its values, which encode to the
    /// same bytes, so positions and a run file's index persist and read back; a dictionary
    /// with 8-bit keys could not hold the 300 values decoded here.
    #[test]
    fn dictionary_keys_decode_as_their_values_and_encode_alike() {
        use arrow_array::DictionaryArray;
        use arrow_array::types::Int8Type;
        let dictionary = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8));
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", dictionary.clone(), true),
        ]);
        let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("a"), KeyColumn::desc("b")]).unwrap();
        assert_eq!(pk.key_schema().field(1).data_type(), &dictionary);
        assert_eq!(pk.decoded_schema().field(1).data_type(), &DataType::Utf8);
        let mut encoded: Vec<Vec<u8>> = Vec::new();
        for part in 0..3 {
            let values: Vec<Option<String>> = (0..100)
                .map(|i| (i % 9 != 0).then(|| format!("v{}", part * 100 + i)))
                .collect();
            let b = DictionaryArray::<Int8Type>::new(
                arrow_array::Int8Array::from_iter_values(0..100),
                Arc::new(StringArray::from(values)),
            );
            let batch = RecordBatch::try_new(
                Arc::new(schema.clone()),
                vec![Arc::new(Int64Array::from(vec![part; 100])), Arc::new(b)],
            )
            .unwrap();
            encoded.extend(
                pk.encode(&batch)
                    .unwrap()
                    .iter()
                    .map(|k| k.unwrap().to_vec()),
            );
        }
        let decoded = pk.decode(encoded.iter().map(|k| k.as_slice())).unwrap();
        assert_eq!(decoded[1].data_type(), &DataType::Utf8);
        assert_eq!(decoded[1].len(), 300);
        let again = pk.encode_key_columns(&decoded).unwrap();
        let again: Vec<&[u8]> = again.iter().map(|k| k.unwrap()).collect();
        assert_eq!(
            again,
            encoded.iter().map(|k| k.as_slice()).collect::<Vec<_>>()
        );
        for key in &encoded {
            let pos = Position::from_bytes(key);
            let batch = pos.to_batch(&pk).unwrap();
            assert_eq!(batch.schema(), *pk.decoded_schema());
            assert_eq!(Position::from_batch(&pk, &batch, 0).unwrap(), pos);
        }
        // Columns of neither type are an error, not a panic.
        let wrong: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1])),
            Arc::new(Int32Array::from(vec![1])),
        ];
        assert!(matches!(
            pk.encode_key_columns(&wrong),
            Err(Error::SchemaMismatch { .. })
        ));
    }

    #[test]
    fn key_prefixes_order_like_their_keys() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let keys: Vec<Vec<u8>> = (0..400)
            .map(|_| {
                let len = rng.random_range(0..20);
                (0..len)
                    .map(|_| [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)])
                    .collect()
            })
            .collect();
        for a in &keys {
            for b in &keys {
                let (pa, pb) = (KeyPrefix::of(a), KeyPrefix::of(b));
                if pa != pb {
                    assert_eq!(pa.cmp(&pb), a.cmp(b), "{a:?} {b:?}");
                }
            }
        }
    }

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
    fn an_empty_key_is_an_error() {
        assert!(matches!(
            PrimaryKey::new(&table(), vec![]),
            Err(Error::InvalidConfig(m)) if m.contains("at least one column")
        ));
    }

    #[test]
    fn a_batch_too_narrow_for_the_key_is_an_error() {
        let pk = PrimaryKey::new(&table(), vec![KeyColumn::asc("v")]).unwrap();
        let narrow = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(vec!["a"]))],
        )
        .unwrap();
        assert!(matches!(
            pk.encode(&narrow),
            Err(Error::SchemaMismatch { .. })
        ));
        assert!(matches!(
            pk.encode_rows(&narrow),
            Err(Error::SchemaMismatch { .. })
        ));
        // A column of another type is an error of the encoder, not a panic.
        let pk = PrimaryKey::new(&table(), vec![KeyColumn::asc("s")]).unwrap();
        assert!(pk.encode(&batch(vec![Some("a")], vec![Some(1)])).is_ok());
        let wrong = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("s", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        assert!(pk.encode(&wrong).is_err());
    }

    /// Key equality is SQL equality: -0.0 is 0.0, every NaN is one NaN above every number;
    /// the vnode hash agrees.
    #[test]
    fn float_keys_are_normalised_before_encoding() {
        use crate::vnode::{VnodeCount, compute_vnodes};
        use arrow_array::{Float16Array, Float32Array};
        let payload_nan = f64::from_bits(0x7FF0_0000_0000_0001);
        let negative_nan = -f64::NAN;
        let f64s: ArrayRef = Arc::new(Float64Array::from(vec![
            0.0,
            -0.0,
            f64::NAN,
            payload_nan,
            negative_nan,
            f64::INFINITY,
            -1.0,
        ]));
        let f32s: ArrayRef = Arc::new(Float32Array::from(vec![
            0.0,
            -0.0,
            f32::NAN,
            f32::from_bits(0x7F80_0001),
            -f32::NAN,
            f32::INFINITY,
            -1.0,
        ]));
        let f16s: ArrayRef = Arc::new(Float16Array::from_iter_values(
            [0x0000u16, 0x8000, 0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xBC00]
                .into_iter()
                .map(<Float16Type as ArrowPrimitiveType>::Native::from_bits),
        ));
        for (column, descending) in [f64s, f32s, f16s]
            .into_iter()
            .flat_map(|c| [(c.clone(), false), (c, true)])
        {
            let schema = Schema::new(vec![Field::new("f", column.data_type().clone(), true)]);
            let key = if descending {
                KeyColumn::desc("f")
            } else {
                KeyColumn::asc("f")
            };
            let pk = PrimaryKey::new(&schema, vec![key]).unwrap();
            let keys = pk
                .encode_key_columns(std::slice::from_ref(&column))
                .unwrap();
            let what = format!("{} descending={descending}", column.data_type());
            assert_eq!(keys.value(0), keys.value(1), "{what}: -0.0 is 0.0");
            assert_eq!(keys.value(2), keys.value(3), "{what}: NaN payloads");
            assert_eq!(keys.value(2), keys.value(4), "{what}: negative NaN");
            let (inf, nan) = (keys.value(5), keys.value(2));
            assert_eq!(descending, nan < inf, "{what}: NaN is above every number");
            assert_eq!(descending, keys.value(0) < keys.value(6), "{what}: 0 > -1");
            let vnodes =
                compute_vnodes(std::slice::from_ref(&column), 7, VnodeCount::DEFAULT).unwrap();
            assert_eq!(vnodes[0], vnodes[1], "{what}");
            assert_eq!(vnodes[2], vnodes[3], "{what}");
            assert_eq!(vnodes[2], vnodes[4], "{what}");
            // The decoded position holds the canonical value.
            let typed = Position::from_keys(&keys, 1).to_batch(&pk).unwrap();
            let again = pk.encode_key_columns(typed.columns()).unwrap();
            assert_eq!(again.value(0), keys.value(0), "{what}");
        }
        let canonical =
            canonical_floats(&(Arc::new(Float64Array::from(vec![-0.0, payload_nan])) as ArrayRef));
        let canonical = canonical.as_primitive::<Float64Type>();
        assert_eq!(canonical.value(0).to_bits(), 0);
        assert_eq!(canonical.value(1).to_bits(), f64::NAN.to_bits());
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

    #[test]
    fn default_nulls_are_largest_for_strings_and_floats() {
        let schema = table();
        let b = RecordBatch::try_new(
            table(),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("b"),
                    None,
                    Some(""),
                    Some("a"),
                ])),
                Arc::new(Int32Array::from(vec![None::<i32>; 4])),
                Arc::new(Float64Array::from(vec![
                    Some(1.0),
                    None,
                    Some(f64::NAN),
                    Some(f64::NEG_INFINITY),
                ])),
            ],
        )
        .unwrap();
        // Rows listed from smallest to largest key.
        let cases: [(KeyColumn, [usize; 4]); 4] = [
            (KeyColumn::asc("s"), [2, 3, 0, 1]),
            (KeyColumn::desc("s"), [1, 0, 3, 2]),
            // NULL sorts after NaN, itself the largest float.
            (KeyColumn::asc("v"), [3, 0, 2, 1]),
            (KeyColumn::desc("v"), [1, 2, 0, 3]),
        ];
        for (column, order) in cases {
            let pk = PrimaryKey::new(&schema, vec![column.clone()]).unwrap();
            let keys = pk.encode(&b).unwrap();
            for pair in order.windows(2) {
                assert!(
                    keys.value(pair[0]) < keys.value(pair[1]),
                    "{column:?}: row {} should sort before row {}",
                    pair[0],
                    pair[1]
                );
            }
        }
    }

    /// Oracle tests: arrow-row's byte order against a comparator over plain Rust values.
    mod oracle {
        use super::*;
        use arrow_array::BooleanArray;
        use proptest::prelude::*;
        use proptest::test_runner::RngSeed;

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Kind {
            Int64,
            Int32,
            Float64,
            Utf8,
            Bool,
        }

        impl Kind {
            fn data_type(self) -> DataType {
                match self {
                    Kind::Int64 => DataType::Int64,
                    Kind::Int32 => DataType::Int32,
                    Kind::Float64 => DataType::Float64,
                    Kind::Utf8 => DataType::Utf8,
                    Kind::Bool => DataType::Boolean,
                }
            }
        }

        #[derive(Debug, Clone)]
        enum Value {
            Null,
            Int(i64),
            Float(f64),
            Str(String),
            Bool(bool),
        }

        /// Compares two non-null values of one column, ascending.
        ///
        /// Floats: SQL order (docs/DESIGN.md section 5), written independently of the encoder: -0.0
        /// equals 0.0, every NaN equals every NaN and is above every number (+inf included).
        fn cmp_values(a: &Value, b: &Value) -> Ordering {
            match (a, b) {
                (Value::Int(a), Value::Int(b)) => a.cmp(b),
                (Value::Float(a), Value::Float(b)) => match (a.is_nan(), b.is_nan()) {
                    (true, true) => Ordering::Equal,
                    (true, false) => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    (false, false) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
                },
                (Value::Str(a), Value::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
                (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
                _ => panic!("values of different kinds: {a:?} and {b:?}"),
            }
        }

        /// One column of the key order. `nulls_first` is about the output order, whatever
        /// the direction: descending reverses values, never the place of NULL.
        fn cmp_column(a: &Value, b: &Value, column: &KeyColumn) -> Ordering {
            match (a, b) {
                (Value::Null, Value::Null) => Ordering::Equal,
                (Value::Null, _) if column.nulls_first => Ordering::Less,
                (Value::Null, _) => Ordering::Greater,
                (_, Value::Null) if column.nulls_first => Ordering::Greater,
                (_, Value::Null) => Ordering::Less,
                _ if column.descending => cmp_values(a, b).reverse(),
                _ => cmp_values(a, b),
            }
        }

        /// The key order: lexicographic over the key columns.
        fn cmp_rows(a: &[Value], b: &[Value], columns: &[KeyColumn]) -> Ordering {
            a.iter()
                .zip(b)
                .zip(columns)
                .map(|((a, b), column)| cmp_column(a, b, column))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        }

        fn to_array(kind: Kind, values: &[Value]) -> ArrayRef {
            fn non_null<T>(v: &Value, f: impl Fn(&Value) -> Option<T>) -> Option<T> {
                match v {
                    Value::Null => None,
                    v => Some(f(v).unwrap_or_else(|| panic!("unexpected value {v:?}"))),
                }
            }
            let int = |v: &Value| match v {
                Value::Int(i) => Some(*i),
                _ => None,
            };
            match kind {
                Kind::Int64 => Arc::new(Int64Array::from_iter(
                    values.iter().map(|v| non_null(v, int)),
                )),
                Kind::Int32 => {
                    Arc::new(Int32Array::from_iter(values.iter().map(|v| {
                        non_null(v, |v| int(v).map(|i| i32::try_from(i).unwrap()))
                    })))
                }
                Kind::Float64 => Arc::new(Float64Array::from_iter(values.iter().map(|v| {
                    non_null(v, |v| match v {
                        Value::Float(f) => Some(*f),
                        _ => None,
                    })
                }))),
                Kind::Utf8 => Arc::new(StringArray::from_iter(values.iter().map(|v| {
                    non_null(v, |v| match v {
                        Value::Str(s) => Some(s.clone()),
                        _ => None,
                    })
                }))),
                Kind::Bool => Arc::new(BooleanArray::from_iter(values.iter().map(|v| {
                    non_null(v, |v| match v {
                        Value::Bool(b) => Some(*b),
                        _ => None,
                    })
                }))),
            }
        }

        fn from_array(kind: Kind, array: &dyn Array, row: usize) -> Value {
            use arrow_array::cast::AsArray;
            use arrow_array::types::{Float64Type, Int32Type, Int64Type};
            if array.is_null(row) {
                return Value::Null;
            }
            match kind {
                Kind::Int64 => Value::Int(array.as_primitive::<Int64Type>().value(row)),
                Kind::Int32 => Value::Int(array.as_primitive::<Int32Type>().value(row).into()),
                Kind::Float64 => Value::Float(array.as_primitive::<Float64Type>().value(row)),
                Kind::Utf8 => Value::Str(array.as_string::<i32>().value(row).to_owned()),
                Kind::Bool => Value::Bool(array.as_boolean().value(row)),
            }
        }

        fn kind() -> impl Strategy<Value = Kind> {
            prop_oneof![
                Just(Kind::Int64),
                Just(Kind::Int32),
                Just(Kind::Float64),
                Just(Kind::Utf8),
                Just(Kind::Bool),
            ]
        }

        /// Values with many ties and edge cases, NULL about one time in five.
        fn value(kind: Kind) -> BoxedStrategy<Value> {
            let non_null = match kind {
                Kind::Int64 => prop_oneof![
                    3 => (-3i64..3).prop_map(Value::Int),
                    1 => prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()]
                        .prop_map(Value::Int),
                ]
                .boxed(),
                Kind::Int32 => prop_oneof![
                    3 => (-3i64..3).prop_map(Value::Int),
                    1 => prop_oneof![Just(i32::MIN), Just(i32::MAX), any::<i32>()]
                        .prop_map(|i| Value::Int(i.into())),
                ]
                .boxed(),
                Kind::Float64 => prop_oneof![
                    2 => (-2i32..2).prop_map(|i| Value::Float(i.into())),
                    1 => prop_oneof![
                        Just(0.0),
                        Just(-0.0),
                        Just(f64::NAN),
                        Just(-f64::NAN),
                        Just(f64::INFINITY),
                        Just(f64::NEG_INFINITY),
                        Just(f64::MIN_POSITIVE),
                        any::<f64>(),
                    ]
                    .prop_map(Value::Float),
                ]
                .boxed(),
                // Short strings over a small alphabet (ties, prefixes, the empty string), plus
                // lengths around arrow-row's 8-byte mini-block and 32-byte block boundaries.
                Kind::Utf8 => prop_oneof![
                    4 => "[ab]{0,3}",
                    1 => "[ab\u{e9}]{7,9}",
                    1 => "a{31,33}[ab]?",
                ]
                .prop_map(Value::Str)
                .boxed(),
                Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
            };
            prop_oneof![1 => Just(Value::Null), 4 => non_null].boxed()
        }

        /// A key column: its direction, and the default null order or an explicit one.
        fn order() -> impl Strategy<Value = (bool, Option<bool>)> {
            (
                any::<bool>(),
                prop_oneof![2 => Just(None), 1 => any::<bool>().prop_map(Some)],
            )
        }

        #[derive(Debug)]
        struct Case {
            kinds: Vec<Kind>,
            columns: Vec<KeyColumn>,
            rows: Vec<Vec<Value>>,
        }

        impl Case {
            fn schema(&self) -> Schema {
                Schema::new(
                    self.columns
                        .iter()
                        .zip(&self.kinds)
                        .map(|(c, k)| Field::new(&c.name, k.data_type(), true))
                        .collect::<Vec<_>>(),
                )
            }

            fn batch(&self, rows: &[Vec<Value>]) -> RecordBatch {
                let arrays = self
                    .kinds
                    .iter()
                    .enumerate()
                    .map(|(c, &kind)| {
                        let values: Vec<Value> = rows.iter().map(|r| r[c].clone()).collect();
                        to_array(kind, &values)
                    })
                    .collect();
                RecordBatch::try_new(Arc::new(self.schema()), arrays).unwrap()
            }

            /// The first row not strictly greater than the row before it, by the oracle.
            fn first_unordered(&self, rows: &[Vec<Value>]) -> Option<usize> {
                (1..rows.len()).find(|&i| cmp_rows(&rows[i - 1], &rows[i], &self.columns).is_ge())
            }
        }

        fn case() -> impl Strategy<Value = Case> {
            proptest::collection::vec((kind(), order()), 1..=3).prop_flat_map(|spec| {
                let kinds: Vec<Kind> = spec.iter().map(|(k, _)| *k).collect();
                // Key columns are named in reverse of the schema order, so that key order and
                // schema order differ.
                let n = spec.len();
                let columns: Vec<KeyColumn> = spec
                    .iter()
                    .enumerate()
                    .map(|(i, (_, (descending, nulls_first)))| {
                        let name = format!("k{}", n - i);
                        let column = if *descending {
                            KeyColumn::desc(name)
                        } else {
                            KeyColumn::asc(name)
                        };
                        match nulls_first {
                            Some(nulls_first) => column.with_nulls_first(*nulls_first),
                            None => column,
                        }
                    })
                    .collect();
                let row: Vec<_> = kinds.iter().map(|&k| value(k)).collect();
                proptest::collection::vec(row, 0..60).prop_map(move |rows| Case {
                    kinds: kinds.clone(),
                    columns: columns.clone(),
                    rows,
                })
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                rng_seed: RngSeed::Fixed(0x5eed),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn row_order_equals_lexicographic_oracle(case in case()) {
                let pk = PrimaryKey::new(&case.schema(), case.columns.clone()).unwrap();
                let batch = case.batch(&case.rows);
                let keys = pk.encode(&batch).unwrap();
                prop_assert_eq!(keys.len(), case.rows.len());
                for (i, a) in case.rows.iter().enumerate() {
                    for (j, b) in case.rows.iter().enumerate() {
                        prop_assert_eq!(
                            keys.value(i).cmp(keys.value(j)),
                            cmp_rows(a, b, &case.columns),
                            "rows {} {:?} and {} {:?}", i, a, j, b
                        );
                    }
                }

                // Positions: typed form holds the row's values and re-encodes to the same key.
                let key_batch =
                    RecordBatch::try_new(pk.key_schema().clone(), pk.key_columns(&batch)).unwrap();
                for (i, row) in case.rows.iter().enumerate() {
                    let pos = Position::from_keys(&keys, i);
                    prop_assert_eq!(pos.as_bytes(), keys.value(i));
                    let typed = pos.to_batch(&pk).unwrap();
                    prop_assert_eq!(typed.num_rows(), 1);
                    for (c, (kind, value)) in case.kinds.iter().zip(row).enumerate() {
                        let decoded = from_array(*kind, typed.column(c), 0);
                        prop_assert!(
                            cmp_column(&decoded, value, &case.columns[c]).is_eq(),
                            "row {} column {}: decoded {:?}, expected {:?}", i, c, decoded, value
                        );
                    }
                    prop_assert_eq!(&Position::from_batch(&pk, &typed, 0).unwrap(), &pos);
                    prop_assert_eq!(&Position::from_batch(&pk, &key_batch, i).unwrap(), &pos);
                }

                // first_unordered, on the rows as generated and sorted by the oracle.
                prop_assert_eq!(first_unordered(&keys), case.first_unordered(&case.rows));
                let mut sorted = case.rows.clone();
                sorted.sort_by(|a, b| cmp_rows(a, b, &case.columns));
                let sorted_keys = pk.encode(&case.batch(&sorted)).unwrap();
                prop_assert_eq!(first_unordered(&sorted_keys), case.first_unordered(&sorted));
                sorted.dedup_by(|a, b| cmp_rows(a, b, &case.columns).is_eq());
                let strict_keys = pk.encode(&case.batch(&sorted)).unwrap();
                prop_assert_eq!(first_unordered(&strict_keys), None);
            }
        }
    }
}
