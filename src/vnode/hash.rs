//! The vectorized vnode hash: our own table-driven CRC-32 (slicing-by-8), one running state
//! per row, fed a whole column at a time, then reduced to a vnode without a division.
//!
//! The column-at-a-time walk over every hashable type is shared ([`Fold`]) with a second row
//! hash, [`Mix64`]: 64 bits from a multiply-fold per word, several times faster than the
//! CRC, for checksums of whole rows (the completion certificate) where no format fixes the
//! function.

use arrow_array::cast::AsArray;
use arrow_array::types::ByteViewType;
use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType,
    DurationMillisecondType, DurationNanosecondType, DurationSecondType, Float16Type, Float32Type,
    Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, GenericByteViewArray, PrimitiveArray};
use arrow_data::{ByteView, MAX_INLINE_VIEW_LEN};
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
// Row hashes: how values fold into a row's state
// ---------------------------------------------------------------------------------------------

/// How one value after another folds into a row's hash state. The column walk
/// ([`feed_column`]) calls these with each value's canonical bits: little-endian integers of
/// the value's width, floats with one NaN and one zero, strings and binaries as bytes and a
/// terminator, a marker for NULL.
pub(crate) trait Fold {
    /// The per-row state.
    type State: Copy;
    /// The state before the first value.
    const INIT: Self::State;
    fn u8(s: Self::State, v: u8) -> Self::State;
    fn u16(s: Self::State, v: u16) -> Self::State;
    fn u32(s: Self::State, v: u32) -> Self::State;
    fn u64(s: Self::State, v: u64) -> Self::State;
    fn bytes(s: Self::State, v: &[u8]) -> Self::State;

    /// The sixteen little-endian bytes of `v`: low half first.
    #[inline(always)]
    fn u128(s: Self::State, v: u128) -> Self::State {
        Self::u64(Self::u64(s, v as u64), (v >> 64) as u64)
    }

    #[inline(always)]
    fn null(s: Self::State) -> Self::State {
        Self::u32(s, NULL_MARKER)
    }

    #[inline(always)]
    fn string(s: Self::State, v: &[u8]) -> Self::State {
        Self::u8(Self::bytes(s, v), BYTES_TERMINATOR)
    }

    /// A string or binary of at most 12 bytes held in its view (`len` bytes from the view's
    /// fifth byte on): [`Fold::string`] of those bytes.
    #[inline(always)]
    fn inline_view(s: Self::State, view: u128, len: usize) -> Self::State {
        let bytes = view.to_le_bytes();
        Self::string(s, &bytes[4..4 + len.min(12)])
    }
}

/// The vnode hash (docs/DESIGN.md section 4): the raw CRC-32 register.
pub(crate) struct Crc32;

impl Fold for Crc32 {
    type State = u32;
    const INIT: u32 = CRC_INIT;

    #[inline(always)]
    fn u8(s: u32, v: u8) -> u32 {
        feed_u8(s, v)
    }
    #[inline(always)]
    fn u16(s: u32, v: u16) -> u32 {
        feed_u16(s, v)
    }
    #[inline(always)]
    fn u32(s: u32, v: u32) -> u32 {
        feed_u32(s, v)
    }
    #[inline(always)]
    fn u64(s: u32, v: u64) -> u32 {
        feed_u64(s, v)
    }
    #[inline(always)]
    fn u128(s: u32, v: u128) -> u32 {
        feed_u128(s, v)
    }
    #[inline(always)]
    fn bytes(s: u32, v: &[u8]) -> u32 {
        feed_bytes(s, v)
    }
}

/// A 64-bit row hash: each value, widened to 64-bit words, is folded in with a 64x64->128
/// multiply whose halves are xored ("mum", as in wyhash). A 128-bit value (a decimal) and
/// each 16 bytes of a string take one multiply of both halves. A string's length tells the
/// padding, the empty string and where one column's string ends from the next: up to 12
/// bytes, the length and the zero-padded bytes are one 16-byte block (a string view's own
/// layout, so a view is folded as it is, one multiply); longer, the length is mixed into the
/// state first and the blocks follow (each 16 bytes but the last, then the last 16; see
/// [`Fold::bytes`] below). Not a format (nothing persists it); finish a row
/// with [`mix64`].
pub(crate) struct Mix64;

/// An odd constant of mixed bits (the 64-bit golden ratio).
const MIX_K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mum(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Mix64 {
    /// Folds in two words at once. The state goes into both factors and is added back, so
    /// that no pair of words cancels it.
    #[inline(always)]
    fn pair(s: u64, lo: u64, hi: u64) -> u64 {
        mum(s ^ lo, MIX_K ^ hi ^ s.rotate_left(29)).wrapping_add(s)
    }

    /// The little-endian word of the 8 bytes from `at` (callers keep `at + 8 <= v.len()`).
    #[inline(always)]
    fn word_at(v: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        if let Some(bytes) = v.get(at..at + 8) {
            w.copy_from_slice(bytes);
        }
        u64::from_le_bytes(w)
    }
}

impl Fold for Mix64 {
    type State = u64;
    // The first 64 bits of pi's fraction.
    const INIT: u64 = 0x243F_6A88_85A3_08D3;

    #[inline(always)]
    fn u8(s: u64, v: u8) -> u64 {
        Self::u64(s, u64::from(v))
    }
    #[inline(always)]
    fn u16(s: u64, v: u16) -> u64 {
        Self::u64(s, u64::from(v))
    }
    #[inline(always)]
    fn u32(s: u64, v: u32) -> u64 {
        Self::u64(s, u64::from(v))
    }
    #[inline(always)]
    fn u64(s: u64, v: u64) -> u64 {
        // The state goes in twice, so that a value cancelling it (v == s) still leaves it.
        mum(s ^ v, MIX_K ^ s.rotate_left(29)).wrapping_add(s)
    }
    #[inline(always)]
    fn u128(s: u64, v: u128) -> u64 {
        Self::pair(s, v as u64, (v >> 64) as u64)
    }
    /// Up to 12 bytes (what a view holds inline): one block of the length (4 bytes) and
    /// the zero-padded bytes, the view's layout, as [`Fold::inline_view`] reads it from the
    /// view. Longer: the length mixed into the state (an odd multiple of it xored in, so
    /// every length starts from its own state), then each block of 16 but the last, then
    /// the last 16 bytes, overlapping the block before: every read a whole word, no copy of
    /// a tail of any length. Both cover every byte and the length.
    #[inline(always)]
    fn bytes(mut s: u64, v: &[u8]) -> u64 {
        let n = v.len();
        if n > MAX_INLINE_VIEW_LEN as usize {
            s ^= (n as u64).wrapping_mul(MIX_K);
            let mut at = 0;
            while at + 16 < n {
                s = Self::pair(s, Self::word_at(v, at), Self::word_at(v, at + 8));
                at += 16;
            }
            // Under 16 bytes: the first 8 and the last 8.
            let last = n.saturating_sub(16);
            s = Self::pair(s, Self::word_at(v, last), Self::word_at(v, n - 8));
        } else {
            // The view of these bytes: length, then the bytes, zero-padded.
            let mut block = [0u8; 16];
            block[..4].copy_from_slice(&(n as u32).to_le_bytes());
            block[4..4 + n].copy_from_slice(v);
            let view = u128::from_le_bytes(block);
            s = Self::pair(s, view as u64, (view >> 64) as u64);
        }
        s
    }
    /// The length already ends the bytes: no terminator.
    #[inline(always)]
    fn string(s: u64, v: &[u8]) -> u64 {
        Self::bytes(s, v)
    }
    /// [`Fold::string`] of the view's bytes, read from the view itself: the view is the
    /// block, its bytes past `len` masked to zeros (as the CRC's path reads only `len`
    /// bytes: arrow validates the padding as zeros, but an array built unchecked may not
    /// have it).
    #[inline(always)]
    fn inline_view(s: u64, view: u128, len: usize) -> u64 {
        let kept = 32 + 8 * len.min(12) as u32;
        let view = view & (u128::MAX >> (128 - kept));
        Self::pair(s, view as u64, (view >> 64) as u64)
    }
}

/// The finalizer of SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", 2014): spreads a [`Mix64`] state over all 64 bits.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A 64-bit hash of every row's values in `columns`: the completion certificate's row hash,
/// order-independent checksums of whole rows summed per vnode. Equal values hash equal
/// whatever their layout (`Utf8`, `LargeUtf8`, `Utf8View`; offsets and slices). It is not a
/// format (nothing persists it) and may change between versions. Errors as [`hash_rows`].
pub fn mix64_rows(columns: &[ArrayRef], num_rows: usize) -> Result<Vec<u64>> {
    let mut state = fold_rows::<Mix64>(columns, num_rows)?;
    for h in &mut state {
        *h = mix64(*h);
    }
    Ok(state)
}

/// Every row's state after folding in `columns` in order.
fn fold_rows<F: Fold>(columns: &[ArrayRef], num_rows: usize) -> Result<Vec<F::State>> {
    let mut state = vec![F::INIT; num_rows];
    for (i, column) in columns.iter().enumerate() {
        if column.len() != num_rows {
            return Err(Error::InvalidChunk(format!(
                "{} has {} rows, the batch has {num_rows}",
                column_name(i),
                column.len()
            )));
        }
        feed_column::<F>(&mut state, column.as_ref())
            .ok_or_else(|| unsupported(column_name(i), column.data_type()))?;
    }
    Ok(state)
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
    let mut state = fold_rows::<Crc32>(columns, num_rows)?;
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
fn feed_column<F: Fold>(state: &mut [F::State], array: &dyn Array) -> Option<()> {
    use DataType::*;
    debug_assert_eq!(state.len(), array.len());
    match array.data_type() {
        Null => state.iter_mut().for_each(|s| *s = F::null(*s)),
        Boolean => {
            let array = array.as_boolean();
            let values = array.values().iter();
            match array.nulls().filter(|n| n.null_count() > 0) {
                None => {
                    for (s, v) in state.iter_mut().zip(values) {
                        *s = F::u8(*s, u8::from(v));
                    }
                }
                Some(nulls) => {
                    for ((s, v), valid) in state.iter_mut().zip(values).zip(nulls.iter()) {
                        *s = if valid {
                            F::u8(*s, u8::from(v))
                        } else {
                            F::null(*s)
                        };
                    }
                }
            }
        }
        Int8 => feed_primitive::<F, Int8Type>(state, array, |c, v| F::u8(c, v as u8)),
        Int16 => feed_primitive::<F, Int16Type>(state, array, |c, v| F::u16(c, v as u16)),
        Int32 => feed_primitive::<F, Int32Type>(state, array, |c, v| F::u32(c, v as u32)),
        Int64 => feed_primitive::<F, Int64Type>(state, array, |c, v| F::u64(c, v as u64)),
        UInt8 => feed_primitive::<F, UInt8Type>(state, array, F::u8),
        UInt16 => feed_primitive::<F, UInt16Type>(state, array, F::u16),
        UInt32 => feed_primitive::<F, UInt32Type>(state, array, F::u32),
        UInt64 => feed_primitive::<F, UInt64Type>(state, array, F::u64),
        Float16 => feed_primitive::<F, Float16Type>(state, array, |c, v| {
            F::u16(c, canonical_f16_bits(v.to_bits()))
        }),
        Float32 => {
            feed_primitive::<F, Float32Type>(state, array, |c, v| F::u32(c, canonical_f32_bits(v)))
        }
        Float64 => {
            feed_primitive::<F, Float64Type>(state, array, |c, v| F::u64(c, canonical_f64_bits(v)))
        }
        Date32 => feed_primitive::<F, Date32Type>(state, array, |c, v| F::u32(c, v as u32)),
        Date64 => feed_primitive::<F, Date64Type>(state, array, |c, v| F::u64(c, v as u64)),
        Time32(TimeUnit::Second) => {
            feed_primitive::<F, Time32SecondType>(state, array, |c, v| F::u32(c, v as u32))
        }
        Time32(TimeUnit::Millisecond) => {
            feed_primitive::<F, Time32MillisecondType>(state, array, |c, v| F::u32(c, v as u32))
        }
        Time64(TimeUnit::Microsecond) => {
            feed_primitive::<F, Time64MicrosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Time64(TimeUnit::Nanosecond) => {
            feed_primitive::<F, Time64NanosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Timestamp(TimeUnit::Second, _) => {
            feed_primitive::<F, TimestampSecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Timestamp(TimeUnit::Millisecond, _) => {
            feed_primitive::<F, TimestampMillisecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Timestamp(TimeUnit::Microsecond, _) => {
            feed_primitive::<F, TimestampMicrosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Timestamp(TimeUnit::Nanosecond, _) => {
            feed_primitive::<F, TimestampNanosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Duration(TimeUnit::Second) => {
            feed_primitive::<F, DurationSecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Duration(TimeUnit::Millisecond) => {
            feed_primitive::<F, DurationMillisecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Duration(TimeUnit::Microsecond) => {
            feed_primitive::<F, DurationMicrosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Duration(TimeUnit::Nanosecond) => {
            feed_primitive::<F, DurationNanosecondType>(state, array, |c, v| F::u64(c, v as u64))
        }
        Decimal128(_, _) => {
            feed_primitive::<F, Decimal128Type>(state, array, |c, v| F::u128(c, v as u128))
        }
        Utf8 => feed_byte_values::<F>(state, array.as_string::<i32>().iter().map(as_bytes)),
        LargeUtf8 => feed_byte_values::<F>(state, array.as_string::<i64>().iter().map(as_bytes)),
        Utf8View => feed_views::<F, _>(state, array.as_string_view()),
        Binary => feed_byte_values::<F>(state, array.as_binary::<i32>().iter()),
        LargeBinary => feed_byte_values::<F>(state, array.as_binary::<i64>().iter()),
        BinaryView => feed_views::<F, _>(state, array.as_binary_view()),
        _ => return None,
    }
    Some(())
}

/// Folds a fixed-width column in: a tight loop over the values when there is no null.
#[inline(always)]
fn feed_primitive<F: Fold, T: ArrowPrimitiveType>(
    state: &mut [F::State],
    array: &dyn Array,
    feed: impl Fn(F::State, T::Native) -> F::State,
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
                *s = if valid { feed(*s, v) } else { F::null(*s) };
            }
        }
    }
}

/// Folds a string or binary column in.
fn feed_byte_values<'a, F: Fold>(
    state: &mut [F::State],
    values: impl Iterator<Item = Option<&'a [u8]>>,
) {
    for (s, v) in state.iter_mut().zip(values) {
        *s = match v {
            Some(bytes) => F::string(*s, bytes),
            None => F::null(*s),
        };
    }
}

/// Folds a string or binary view column in, straight from its views: a value of up to 12
/// bytes from the view itself ([`Fold::inline_view`]), a longer one from its data buffer.
fn feed_views<F: Fold, T: ByteViewType + ?Sized>(
    state: &mut [F::State],
    array: &GenericByteViewArray<T>,
) {
    let buffers = array.data_buffers();
    let nulls = array.nulls().filter(|n| n.null_count() > 0);
    for (i, (s, &view)) in state.iter_mut().zip(array.views().iter()).enumerate() {
        if nulls.is_some_and(|n| n.is_null(i)) {
            *s = F::null(*s);
            continue;
        }
        let len = view as u32 as usize;
        *s = if len <= 12 {
            F::inline_view(*s, view, len)
        } else {
            let view = ByteView::from(view);
            let start = view.offset as usize;
            // A valid array's views point into its buffers.
            let bytes = &buffers[view.buffer_index as usize][start..start + len];
            F::string(*s, bytes)
        };
    }
}

/// A string value as bytes.
fn as_bytes(v: Option<&str>) -> Option<&[u8]> {
    v.map(str::as_bytes)
}
