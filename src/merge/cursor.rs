//! How the heads of two inputs compare.
//!
//! A cursor walks one input's current batch: it knows the row it is on (the *head*) and how to
//! compare its head with another cursor's head. There are two kinds:
//!
//! ```text
//!   RowCursor: encoded keys (BinaryArray)          PrimitiveCursor<Int64Type>: the key column
//!   head -> 80 00 .. 01 | 61 02 ..   memcmp       head -> 17              native `Ord`,
//!           80 00 .. 01 | 62 02 ..                        42              reversed when
//!           80 00 .. 05 | 61 02 ..                        99              descending
//! ```
//!
//! - [`RowCursor`] works for every key: arrow-row bytes compare like the keys (`memcmp`).
//! - [`PrimitiveCursor`] is the fast path for a key of one non-nullable integer column: it
//!   compares the column's native values in place, no bytes, no length prefix. Chosen by
//!   [`CursorKind::for_key`]; a nullable column falls back to rows, so NULL ordering is only
//!   ever decided by arrow-row.
//!
//! **Why a trait, not an enum.** Every input of one merge uses the same kind, decided once
//! from the key. A generic [`Cursor`] lets the merge loop and the loser tree be compiled once
//! per kind, so the hot comparison is a direct `i64` (or `memcmp`) compare with no per-row
//! `match` on two cursors' kinds. The merge picks the monomorphized instance once, at
//! construction.

use std::cmp::Ordering;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, BinaryArray};
use arrow_buffer::ScalarBuffer;
use arrow_schema::DataType;

use crate::error::{Error, Result};
use crate::key::PrimaryKey;
use crate::store::KeyedBatch;

/// Which cursor a merge compares rows with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CursorKind {
    /// Encoded keys, `memcmp`: works for every key.
    Rows,
    /// The native values of a single non-nullable integer key column.
    Primitive {
        /// The column's index in the table schema.
        column: usize,
        /// Its type (an integer type).
        data_type: DataType,
        /// Descending order.
        descending: bool,
    },
}

impl CursorKind {
    /// The fastest cursor that orders `pk` exactly like its encoded keys: [`Primitive`] for one
    /// non-nullable integer column, [`Rows`] otherwise.
    ///
    /// [`Primitive`]: CursorKind::Primitive
    /// [`Rows`]: CursorKind::Rows
    pub fn for_key(pk: &PrimaryKey) -> Self {
        let (&[column], [key]) = (pk.indices(), pk.columns()) else {
            return Self::Rows;
        };
        let field = pk.key_schema().field(0);
        let integer = matches!(
            field.data_type(),
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64
        );
        if !integer || field.is_nullable() {
            return Self::Rows;
        }
        Self::Primitive {
            column,
            data_type: field.data_type().clone(),
            descending: key.descending,
        }
    }
}

/// A position in one input's current batch, comparable with the other inputs' cursors.
pub(crate) trait Cursor: Sized + Send + 'static {
    /// What is needed to open a cursor on a batch.
    type Config: Clone + Send + 'static;

    /// A cursor on row 0 of `batch` (not empty).
    fn open(config: &Self::Config, batch: &KeyedBatch) -> Result<Self>;

    /// The head row.
    fn row(&self) -> usize;

    /// True when every row was passed.
    fn is_finished(&self) -> bool;

    /// Moves past the head row.
    fn advance(&mut self);

    /// Compares the heads of two unfinished cursors.
    fn cmp_heads(&self, other: &Self) -> Ordering;
}

/// A cursor over encoded keys.
#[derive(Debug)]
pub(crate) struct RowCursor {
    keys: BinaryArray,
    row: usize,
}

impl Cursor for RowCursor {
    type Config = ();

    fn open(_: &(), batch: &KeyedBatch) -> Result<Self> {
        Ok(Self {
            keys: batch.keys.clone(),
            row: 0,
        })
    }

    fn row(&self) -> usize {
        self.row
    }

    fn is_finished(&self) -> bool {
        self.row >= self.keys.len()
    }

    fn advance(&mut self) {
        self.row += 1;
    }

    #[inline]
    fn cmp_heads(&self, other: &Self) -> Ordering {
        self.keys.value(self.row).cmp(other.keys.value(other.row))
    }
}

/// Where a [`PrimitiveCursor`] finds its values.
#[derive(Debug, Clone)]
pub(crate) struct PrimitiveConfig {
    pub column: usize,
    pub descending: bool,
}

/// A cursor over the native values of a non-nullable integer key column.
#[derive(Debug)]
pub(crate) struct PrimitiveCursor<P: ArrowPrimitiveType> {
    values: ScalarBuffer<P::Native>,
    descending: bool,
    row: usize,
}

impl<P> Cursor for PrimitiveCursor<P>
where
    P: ArrowPrimitiveType,
    P::Native: Ord,
{
    type Config = PrimitiveConfig;

    fn open(config: &PrimitiveConfig, batch: &KeyedBatch) -> Result<Self> {
        let column =
            batch
                .batch
                .columns()
                .get(config.column)
                .ok_or_else(|| Error::SchemaMismatch {
                    context: "a merge input".into(),
                    expected: format!("a key column at index {}", config.column),
                    found: format!("{} columns", batch.batch.num_columns()),
                })?;
        let array = column
            .as_primitive_opt::<P>()
            .ok_or_else(|| Error::SchemaMismatch {
                context: "a merge input".into(),
                expected: format!("key column of type {}", P::DATA_TYPE),
                found: format!("{}", column.data_type()),
            })?;
        if array.null_count() > 0 {
            // The key field is declared non-nullable (or this cursor would not be used): a
            // batch with NULL keys does not match the table.
            return Err(Error::SchemaMismatch {
                context: "a merge input".into(),
                expected: "a non-nullable key column".into(),
                found: format!("{} NULL keys", array.null_count()),
            });
        }
        Ok(Self {
            values: array.values().clone(),
            descending: config.descending,
            row: 0,
        })
    }

    fn row(&self) -> usize {
        self.row
    }

    fn is_finished(&self) -> bool {
        self.row >= self.values.len()
    }

    fn advance(&mut self) {
        self.row += 1;
    }

    #[inline]
    fn cmp_heads(&self, other: &Self) -> Ordering {
        let ord = self.values[self.row].cmp(&other.values[other.row]);
        if self.descending { ord.reverse() } else { ord }
    }
}

/// The primitive cursor types [`CursorKind::Primitive`] can name, for dispatch.
pub(crate) type I8Cursor = PrimitiveCursor<Int8Type>;
/// See [`I8Cursor`].
pub(crate) type I16Cursor = PrimitiveCursor<Int16Type>;
/// See [`I8Cursor`].
pub(crate) type I32Cursor = PrimitiveCursor<Int32Type>;
/// See [`I8Cursor`].
pub(crate) type I64Cursor = PrimitiveCursor<Int64Type>;
/// See [`I8Cursor`].
pub(crate) type U8Cursor = PrimitiveCursor<UInt8Type>;
/// See [`I8Cursor`].
pub(crate) type U16Cursor = PrimitiveCursor<UInt16Type>;
/// See [`I8Cursor`].
pub(crate) type U32Cursor = PrimitiveCursor<UInt32Type>;
/// See [`I8Cursor`].
pub(crate) type U64Cursor = PrimitiveCursor<UInt64Type>;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int32Array, RecordBatch, StringArray, UInt8Array};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::key::KeyColumn;
    use crate::merge::testing::{int_key, int_rows, keyed};

    /// Every pair of heads of `a` and `b`, compared by `C`, agrees with `memcmp` of the keys.
    fn agrees_with_keys<C: Cursor>(config: &C::Config, a: &KeyedBatch, b: &KeyedBatch) {
        let mut ca = C::open(config, a).unwrap();
        while !ca.is_finished() {
            let mut cb = C::open(config, b).unwrap();
            while !cb.is_finished() {
                let expected = a.keys.value(ca.row()).cmp(b.keys.value(cb.row()));
                assert_eq!(
                    ca.cmp_heads(&cb),
                    expected,
                    "rows {} {}",
                    ca.row(),
                    cb.row()
                );
                cb.advance();
            }
            ca.advance();
        }
    }

    #[test]
    fn kind_is_primitive_only_for_one_non_null_integer_column() {
        assert!(matches!(
            CursorKind::for_key(&int_key(false)),
            CursorKind::Primitive {
                column: 0,
                descending: false,
                ..
            }
        ));
        assert_eq!(CursorKind::for_key(&int_key(true)), CursorKind::Rows);
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, false),
        ]);
        let by_s = PrimaryKey::new(&schema, vec![KeyColumn::asc("s")]).unwrap();
        assert_eq!(CursorKind::for_key(&by_s), CursorKind::Rows);
        let both = PrimaryKey::new(&schema, vec![KeyColumn::asc("i"), KeyColumn::asc("s")]);
        assert_eq!(CursorKind::for_key(&both.unwrap()), CursorKind::Rows);
        let i_desc = PrimaryKey::new(&schema, vec![KeyColumn::desc("i")]).unwrap();
        assert_eq!(
            CursorKind::for_key(&i_desc),
            CursorKind::Primitive {
                column: 1,
                data_type: DataType::Int32,
                descending: true
            }
        );
    }

    #[test]
    fn primitive_and_row_cursors_agree_with_encoded_keys() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, false),
        ]));
        let batch = |i: Vec<i32>| {
            let s = StringArray::from(vec!["x"; i.len()]);
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(s), Arc::new(Int32Array::from(i))],
            )
            .unwrap()
        };
        let (a, b) = (
            batch(vec![i32::MIN, -3, 0, 7]),
            batch(vec![-3, 1, 7, i32::MAX]),
        );
        for descending in [false, true] {
            let column = KeyColumn::asc("i");
            let column = if descending {
                KeyColumn::desc("i")
            } else {
                column
            };
            let pk = PrimaryKey::new(&schema, vec![column]).unwrap();
            let (a, b) = (keyed(&pk, a.clone()), keyed(&pk, b.clone()));
            let config = PrimitiveConfig {
                column: 1,
                descending,
            };
            agrees_with_keys::<I32Cursor>(&config, &a, &b);
            agrees_with_keys::<RowCursor>(&(), &a, &b);
        }
    }

    #[test]
    fn a_primitive_cursor_rejects_a_wrong_type_or_nulls() {
        let pk = int_key(false);
        let rows = int_rows(&pk, &[1, 2]);
        let wrong_type = PrimitiveConfig {
            column: 1,
            descending: false,
        };
        assert!(matches!(
            I64Cursor::open(&wrong_type, &rows),
            Err(Error::SchemaMismatch { .. })
        ));
        let out_of_range = PrimitiveConfig {
            column: 5,
            descending: false,
        };
        assert!(I64Cursor::open(&out_of_range, &rows).is_err());
        let nullable = int_key(true);
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::UInt8, true)]));
        let with_null = RecordBatch::try_new(
            schema,
            vec![Arc::new(UInt8Array::from(vec![Some(1), None]))],
        )
        .unwrap();
        let with_null = KeyedBatch {
            keys: nullable
                .encode(&int_rows(&nullable, &[1, 2]).batch)
                .unwrap(),
            batch: with_null,
        };
        let config = PrimitiveConfig {
            column: 0,
            descending: false,
        };
        assert!(matches!(
            U8Cursor::open(&config, &with_null),
            Err(Error::SchemaMismatch { .. })
        ));
    }
}
