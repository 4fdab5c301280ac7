//! The vectorized vnode hash: our own table-driven CRC-32 (slicing-by-8), one running state
//! per row, fed a whole column at a time, then reduced to a vnode without a division.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType,
    DurationMillisecondType, DurationNanosecondType, DurationSecondType, Float16Type, Float32Type,
    Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, PrimitiveArray};
use arrow_schema::{DataType, TimeUnit};

use crate::error::{Error, Result};

use super::{BYTES_TERMINATOR, NULL_MARKER, VirtualNode, VnodeCount, column_name, unsupported};

// ---------------------------------------------------------------------------------------------
// Table-driven CRC-32
// ---------------------------------------------------------------------------------------------
//
// CRC-32/ISO-HDLC (the IEEE 802.3 CRC, as in zlib and crc32fast): reflected polynomial
// 0xEDB88320, initial value !0, final xor !0. The state below is the *raw* register (after the
// initial inversion, before the final one): `CRC_INIT` to start, `finalize` at the end, so that
// columns can be folded in one after another.
//
// The byte-at-a-time table is the classic reflected table-driven CRC (Sarwate, "Computation of
// Cyclic Redundancy Checks via Table Look-Up", CACM 1988). Tables 1..8 extend it to
// "slicing-by-8" from Kounavis & Berry, "A Systematic Approach to Building High Performance
// Software-based CRC Generators" (Intel, ISCC 2005): TABLES[k][b] is the register after
// feeding byte b followed by k zero bytes, so 8 input bytes are folded with 8 independent
// lookups instead of 8 dependent ones.

/// The reflected IEEE polynomial.
const POLY: u32 = 0xEDB8_8320;

/// The raw register at the start of a message.
pub(super) const CRC_INIT: u32 = !0;

/// The slicing-by-8 tables, computed at compile time.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut crc = b as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][b] = crc;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = tables[k - 1][b];
            tables[k][b] = (prev >> 8) ^ tables[0][(prev & 0xFF) as usize];
            b += 1;
        }
        k += 1;
    }
    tables
}

/// The CRC value of a raw register.
#[inline(always)]
pub(super) fn finalize(raw: u32) -> u32 {
    !raw
}

#[inline(always)]
pub(super) fn feed_u8(crc: u32, b: u8) -> u32 {
    TABLES[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
}

#[inline(always)]
pub(super) fn feed_u16(crc: u32, v: u16) -> u32 {
    let x = crc ^ u32::from(v);
    TABLES[1][(x & 0xFF) as usize] ^ TABLES[0][((x >> 8) & 0xFF) as usize] ^ (crc >> 16)
}

/// Slicing-by-4: the four little-endian bytes of `v`.
#[inline(always)]
pub(super) fn feed_u32(crc: u32, v: u32) -> u32 {
    let x = crc ^ v;
    TABLES[3][(x & 0xFF) as usize]
        ^ TABLES[2][((x >> 8) & 0xFF) as usize]
        ^ TABLES[1][((x >> 16) & 0xFF) as usize]
        ^ TABLES[0][(x >> 24) as usize]
}

/// Slicing-by-8: the eight little-endian bytes of `v`.
#[inline(always)]
pub(super) fn feed_u64(crc: u32, v: u64) -> u32 {
    let lo = crc ^ (v as u32);
    let hi = (v >> 32) as u32;
    TABLES[7][(lo & 0xFF) as usize]
        ^ TABLES[6][((lo >> 8) & 0xFF) as usize]
        ^ TABLES[5][((lo >> 16) & 0xFF) as usize]
        ^ TABLES[4][(lo >> 24) as usize]
        ^ TABLES[3][(hi & 0xFF) as usize]
        ^ TABLES[2][((hi >> 8) & 0xFF) as usize]
        ^ TABLES[1][((hi >> 16) & 0xFF) as usize]
        ^ TABLES[0][(hi >> 24) as usize]
}

/// The sixteen little-endian bytes of `v`: low half first.
#[inline(always)]
pub(super) fn feed_u128(crc: u32, v: u128) -> u32 {
    feed_u64(feed_u64(crc, v as u64), (v >> 64) as u64)
}

/// Any byte string: eight bytes at a time, then the tail byte by byte.
#[inline]
pub(super) fn feed_bytes(mut crc: u32, bytes: &[u8]) -> u32 {
    let mut blocks = bytes.chunks_exact(8);
    for block in &mut blocks {
        let mut word = [0u8; 8];
        word.copy_from_slice(block);
        crc = feed_u64(crc, u64::from_le_bytes(word));
    }
    for &b in blocks.remainder() {
        crc = feed_u8(crc, b);
    }
    crc
}

#[inline(always)]
fn feed_null(crc: u32) -> u32 {
    feed_u32(crc, NULL_MARKER)
}

#[inline(always)]
fn feed_string(crc: u32, bytes: &[u8]) -> u32 {
    feed_u8(feed_bytes(crc, bytes), BYTES_TERMINATOR)
}

/// `f16` bits with -0.0 as 0.0 and every NaN as the canonical quiet NaN `0x7E00`.
#[inline(always)]
fn canonical_f16_bits(bits: u16) -> u16 {
    if bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0 {
        0x7E00
    } else if bits == 0x8000 {
        0
    } else {
        bits
    }
}

#[inline(always)]
fn canonical_f32_bits(v: f32) -> u32 {
    // NaN != NaN, so `v == 0.0` catches exactly +0.0 and -0.0.
    if v.is_nan() {
        f32::NAN.to_bits()
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    }
}

#[inline(always)]
fn canonical_f64_bits(v: f64) -> u64 {
    if v.is_nan() {
        f64::NAN.to_bits()
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    }
}

// ---------------------------------------------------------------------------------------------
// Vectorized path
// ---------------------------------------------------------------------------------------------

/// `crc % count`, with the division replaced by a mask (power-of-two counts, the default) or by
/// a multiplication (other counts).
///
/// The multiplication is Lemire, Kaser & Kurz, "Faster Remainder by Direct Computation"
/// (Software: Practice and Experience, 2019): with `m = floor((2^64 - 1) / d) + 1`,
/// `a % d == ((m * a mod 2^64) * d) >> 64` for every 32-bit `a` and `d`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reducer {
    divisor: u64,
    /// `Some(count - 1)` when the count is a power of two.
    mask: Option<u32>,
    multiplier: u64,
}

impl Reducer {
    pub(super) fn new(count: VnodeCount) -> Self {
        let divisor = count.get() as u64;
        Reducer {
            divisor,
            mask: count
                .get()
                .is_power_of_two()
                .then(|| (count.get() - 1) as u32),
            multiplier: (u64::MAX / divisor).wrapping_add(1),
        }
    }

    #[inline(always)]
    pub(super) fn reduce(&self, crc: u32) -> VirtualNode {
        let r = match self.mask {
            Some(mask) => crc & mask,
            None => {
                let low = self.multiplier.wrapping_mul(u64::from(crc));
                ((u128::from(low) * u128::from(self.divisor)) >> 64) as u32
            }
        };
        // `r < count <= 32768`.
        VirtualNode(r as u16)
    }
}

/// The CRC-32 of every row's distribution-key values (vectorized: a column at a time).
///
/// `columns` are the key columns in key order, each of `num_rows` rows; with no column every
/// row hashes the empty string (CRC 0). Errors: [`Error::UnsupportedType`] for a type outside
/// the contract, [`Error::InvalidChunk`] for a column of the wrong length.
pub fn hash_rows(columns: &[ArrayRef], num_rows: usize) -> Result<Vec<u32>> {
    let mut state = vec![CRC_INIT; num_rows];
    for (i, column) in columns.iter().enumerate() {
        if column.len() != num_rows {
            return Err(Error::InvalidChunk(format!(
                "{} has {} rows, the batch has {num_rows}",
                column_name(i),
                column.len()
            )));
        }
        feed_column(&mut state, column.as_ref())
            .ok_or_else(|| unsupported(column_name(i), column.data_type()))?;
    }
    for crc in &mut state {
        *crc = finalize(*crc);
    }
    Ok(state)
}

/// The vnode of every row (vectorized). With no key column (a singleton table) every row is
/// vnode 0. Errors as [`hash_rows`].
pub fn compute_vnodes(
    columns: &[ArrayRef],
    num_rows: usize,
    count: VnodeCount,
) -> Result<Vec<VirtualNode>> {
    if columns.is_empty() {
        return Ok(vec![VirtualNode::ZERO; num_rows]);
    }
    let reducer = Reducer::new(count);
    Ok(hash_rows(columns, num_rows)?
        .into_iter()
        .map(|crc| reducer.reduce(crc))
        .collect())
}

/// Folds one column into the per-row states; `None` if its type is not hashable.
fn feed_column(state: &mut [u32], array: &dyn Array) -> Option<()> {
    use DataType::*;
    debug_assert_eq!(state.len(), array.len());
    match array.data_type() {
        Null => state.iter_mut().for_each(|s| *s = feed_null(*s)),
        Boolean => {
            let array = array.as_boolean();
            let values = array.values().iter();
            match array.nulls().filter(|n| n.null_count() > 0) {
                None => {
                    for (s, v) in state.iter_mut().zip(values) {
                        *s = feed_u8(*s, u8::from(v));
                    }
                }
                Some(nulls) => {
                    for ((s, v), valid) in state.iter_mut().zip(values).zip(nulls.iter()) {
                        *s = if valid {
                            feed_u8(*s, u8::from(v))
                        } else {
                            feed_null(*s)
                        };
                    }
                }
            }
        }
        Int8 => feed_primitive::<Int8Type>(state, array, |c, v| feed_u8(c, v as u8)),
        Int16 => feed_primitive::<Int16Type>(state, array, |c, v| feed_u16(c, v as u16)),
        Int32 => feed_primitive::<Int32Type>(state, array, |c, v| feed_u32(c, v as u32)),
        Int64 => feed_primitive::<Int64Type>(state, array, |c, v| feed_u64(c, v as u64)),
        UInt8 => feed_primitive::<UInt8Type>(state, array, feed_u8),
        UInt16 => feed_primitive::<UInt16Type>(state, array, feed_u16),
        UInt32 => feed_primitive::<UInt32Type>(state, array, feed_u32),
        UInt64 => feed_primitive::<UInt64Type>(state, array, feed_u64),
        Float16 => feed_primitive::<Float16Type>(state, array, |c, v| {
            feed_u16(c, canonical_f16_bits(v.to_bits()))
        }),
        Float32 => {
            feed_primitive::<Float32Type>(state, array, |c, v| feed_u32(c, canonical_f32_bits(v)))
        }
        Float64 => {
            feed_primitive::<Float64Type>(state, array, |c, v| feed_u64(c, canonical_f64_bits(v)))
        }
        Date32 => feed_primitive::<Date32Type>(state, array, |c, v| feed_u32(c, v as u32)),
        Date64 => feed_primitive::<Date64Type>(state, array, |c, v| feed_u64(c, v as u64)),
        Time32(TimeUnit::Second) => {
            feed_primitive::<Time32SecondType>(state, array, |c, v| feed_u32(c, v as u32))
        }
        Time32(TimeUnit::Millisecond) => {
            feed_primitive::<Time32MillisecondType>(state, array, |c, v| feed_u32(c, v as u32))
        }
        Time64(TimeUnit::Microsecond) => {
            feed_primitive::<Time64MicrosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Time64(TimeUnit::Nanosecond) => {
            feed_primitive::<Time64NanosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Timestamp(TimeUnit::Second, _) => {
            feed_primitive::<TimestampSecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Timestamp(TimeUnit::Millisecond, _) => {
            feed_primitive::<TimestampMillisecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Timestamp(TimeUnit::Microsecond, _) => {
            feed_primitive::<TimestampMicrosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Timestamp(TimeUnit::Nanosecond, _) => {
            feed_primitive::<TimestampNanosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Duration(TimeUnit::Second) => {
            feed_primitive::<DurationSecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Duration(TimeUnit::Millisecond) => {
            feed_primitive::<DurationMillisecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Duration(TimeUnit::Microsecond) => {
            feed_primitive::<DurationMicrosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Duration(TimeUnit::Nanosecond) => {
            feed_primitive::<DurationNanosecondType>(state, array, |c, v| feed_u64(c, v as u64))
        }
        Decimal128(_, _) => {
            feed_primitive::<Decimal128Type>(state, array, |c, v| feed_u128(c, v as u128))
        }
        Utf8 => feed_byte_values(state, array.as_string::<i32>().iter().map(as_bytes)),
        LargeUtf8 => feed_byte_values(state, array.as_string::<i64>().iter().map(as_bytes)),
        Utf8View => feed_byte_values(state, array.as_string_view().iter().map(as_bytes)),
        Binary => feed_byte_values(state, array.as_binary::<i32>().iter()),
        LargeBinary => feed_byte_values(state, array.as_binary::<i64>().iter()),
        BinaryView => feed_byte_values(state, array.as_binary_view().iter()),
        _ => return None,
    }
    Some(())
}

/// Folds a fixed-width column in: a tight loop over the values when there is no null.
#[inline(always)]
fn feed_primitive<T: ArrowPrimitiveType>(
    state: &mut [u32],
    array: &dyn Array,
    feed: impl Fn(u32, T::Native) -> u32,
) {
    let array: &PrimitiveArray<T> = array.as_primitive::<T>();
    // `values()` already accounts for the array's offset.
    let values = array.values();
    match array.nulls().filter(|n| n.null_count() > 0) {
        None => {
            for (s, &v) in state.iter_mut().zip(values.iter()) {
                *s = feed(*s, v);
            }
        }
        Some(nulls) => {
            for ((s, &v), valid) in state.iter_mut().zip(values.iter()).zip(nulls.iter()) {
                *s = if valid { feed(*s, v) } else { feed_null(*s) };
            }
        }
    }
}

/// Folds a string or binary column in.
fn feed_byte_values<'a>(state: &mut [u32], values: impl Iterator<Item = Option<&'a [u8]>>) {
    for (s, v) in state.iter_mut().zip(values) {
        *s = match v {
            Some(bytes) => feed_string(*s, bytes),
            None => feed_null(*s),
        };
    }
}

/// A string value as bytes.
fn as_bytes(v: Option<&str>) -> Option<&[u8]> {
    v.map(str::as_bytes)
}
