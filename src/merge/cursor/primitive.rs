//! The cursor over the native values of one non-nullable integer key column.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType};
use arrow_buffer::ScalarBuffer;

use super::{Cursor, EXHAUSTED, KeyEntry, PREFETCH_AHEAD, gallop, prefetch};
use crate::error::{Error, Result};
use crate::runs::Run;

/// Where a [`PrimitiveCursor`] finds its values.
#[derive(Debug, Clone)]
pub(crate) struct PrimitiveConfig {
    pub column: usize,
    pub descending: bool,
}

/// An integer key mapped to a `u64` with the same order: the sign bit flipped for signed
/// types (`i64::MIN` -> 0, `-1` -> `2^63 - 1`, `0` -> `2^63`), widened for unsigned ones.
pub(crate) trait OrderBits: Copy {
    /// The order-preserving image of `self`.
    fn order_bits(self) -> u64;
}

macro_rules! order_bits {
    (signed: $($s:ty),*; unsigned: $($u:ty),*) => {
        $(impl OrderBits for $s {
            #[inline]
            fn order_bits(self) -> u64 {
                (i64::from(self) as u64) ^ (1 << 63)
            }
        })*
        $(impl OrderBits for $u {
            #[inline]
            fn order_bits(self) -> u64 {
                u64::from(self)
            }
        })*
    };
}

order_bits!(signed: i8, i16, i32, i64; unsigned: u8, u16, u32, u64);

/// A cursor over the native values of a non-nullable integer key column. Its tree entries
/// are [`KeyEntry`]s: the key travels with the entry, so the tree never looks at a cursor.
#[derive(Debug)]
pub(crate) struct PrimitiveCursor<P: ArrowPrimitiveType> {
    values: ScalarBuffer<P::Native>,
    /// XORed into the key bits: all ones when descending, so the order is reversed.
    flip: u64,
    row: usize,
}

impl<P> PrimitiveCursor<P>
where
    P: ArrowPrimitiveType,
    P::Native: OrderBits,
{
    /// The entry of `input` with head `value`.
    #[inline]
    fn pack(&self, value: P::Native, input: usize) -> KeyEntry {
        debug_assert!((input as u64) < EXHAUSTED);
        KeyEntry {
            key: value.order_bits() ^ self.flip,
            tie: input as u64,
        }
    }
}

impl<P> Cursor for PrimitiveCursor<P>
where
    P: ArrowPrimitiveType,
    P::Native: OrderBits,
{
    type Config = PrimitiveConfig;

    fn open(config: &PrimitiveConfig, run: &Run) -> Result<Self> {
        let (shared, start) = run.rows();
        let batch = &shared.data.batch;
        let column = batch
            .columns()
            .get(config.column)
            .ok_or_else(|| Error::SchemaMismatch {
                context: "a merge input".into(),
                expected: format!("a key column at index {}", config.column),
                found: format!("{} columns", batch.num_columns()),
            })?;
        let array = column
            .as_primitive_opt::<P>()
            .ok_or_else(|| Error::SchemaMismatch {
                context: "a merge input".into(),
                expected: format!("key column of type {}", P::DATA_TYPE),
                found: format!("{}", column.data_type()),
            })?;
        let nulls = (array.nulls()).map_or(0, |n| n.slice(start, run.len()).null_count());
        if nulls > 0 {
            // The key field is declared non-nullable (or this cursor would not be used): a
            // batch with NULL keys does not match the table.
            return Err(Error::SchemaMismatch {
                context: "a merge input".into(),
                expected: "a non-nullable key column".into(),
                found: format!("{nulls} NULL keys"),
            });
        }
        Ok(Self {
            values: array.values().slice(start, run.len()),
            flip: if config.descending { u64::MAX } else { 0 },
            row: 0,
        })
    }

    /// On the native values when the key column is as expected (a batch where it is not is
    /// rejected by [`Cursor::open`]; its encoded keys are checked meanwhile).
    fn first_unordered(config: &PrimitiveConfig, run: &Run) -> Option<usize> {
        let (shared, start) = run.rows();
        let column = shared.data.batch.columns().get(config.column);
        let array = column.and_then(|c| c.as_primitive_opt::<P>());
        let Some(array) = array.filter(|a| a.null_count() == 0) else {
            return run.first_unordered();
        };
        let flip = if config.descending { u64::MAX } else { 0 };
        let bits = |v: P::Native| v.order_bits() ^ flip;
        (array.values()[start..start + run.len()].windows(2))
            .position(|w| bits(w[0]) >= bits(w[1]))
            .map(|i| i + 1)
    }

    fn row(&self) -> usize {
        self.row
    }

    fn remaining(&self) -> usize {
        self.values.len().saturating_sub(self.row)
    }

    /// Also prefetches the values one cache line ahead: see [`prefetch`].
    #[inline]
    fn advance(&mut self, n: usize) {
        self.row += n;
        prefetch(self.values.as_ptr().wrapping_add(self.row + PREFETCH_AHEAD));
    }

    #[inline]
    fn entry(&self, input: usize) -> KeyEntry {
        self.pack(self.values[self.row], input)
    }

    #[inline]
    fn beats(a: KeyEntry, b: KeyEntry, _: &[Option<Self>]) -> bool {
        a.rank() < b.rank()
    }

    fn rows_before(&self, input: usize, bound: KeyEntry, max: usize, _: &[Option<Self>]) -> usize {
        let end = self.row + max.min(self.remaining());
        let bound = bound.rank();
        let values = &self.values[self.row..end];
        gallop(values.len(), |i| self.pack(values[i], input).rank() < bound)
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
