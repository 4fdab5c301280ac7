//! Virtual nodes: how rows are distributed, and which rows an executor owns.
//!
//! Every row of a table belongs to one of `vnode_count` virtual nodes (DESIGN section 4):
//!
//! ```text
//!   vnode(row) = crc32(dist-key values of the row) % vnode_count
//! ```
//!
//! The CRC is CRC-32/ISO-HDLC (the IEEE polynomial, the value [`crc32fast::hash`] returns) of
//! the concatenation of the row's key values, column after column, each encoded as:
//!
//! | type                                                          | bytes                                        |
//! |---------------------------------------------------------------|----------------------------------------------|
//! | `Int8`..`Int64`, `UInt8`..`UInt64`                            | little-endian, declared width                |
//! | `Boolean`                                                     | one byte, 0 or 1                             |
//! | `Float16`, `Float32`, `Float64`                               | little-endian IEEE-754 bits; -0.0 as 0.0, every NaN as the canonical NaN (`f32::NAN`, `f64::NAN`, `0x7E00`) |
//! | `Utf8`, `LargeUtf8`, `Utf8View`, `Binary`, `LargeBinary`, `BinaryView` | the bytes, then one `0xFF` byte     |
//! | `Date32`, `Date64`, `Time32`, `Time64`, `Timestamp`, `Duration` | the underlying integer, as above           |
//! | `Decimal128`                                                  | the little-endian `i128` (16 bytes)          |
//! | NULL of any type (and every value of `DataType::Null`)        | the four little-endian bytes of `0xFFFF_FFF0` |
//!
//! Any other type is rejected with [`Error::UnsupportedType`], at table-definition time by
//! [`check_hashable`] and again by the hashing functions; it never panics. A table with an
//! empty distribution key is a *singleton*: every row is vnode 0.
//!
//! # This is a persisted contract
//!
//! Backfill progress is keyed by vnode, so changing this function would silently mix up the
//! progress of different rows. The unit tests at the bottom pin test vectors; they must never
//! be edited to make a change pass.
//!
//! # Two implementations
//!
//! - [`hash_rows`] / [`compute_vnodes`] are the vectorized path used by the executors: one
//!   running CRC state per row, updated a whole column at a time with our own table-driven
//!   CRC-32 (slicing-by-8), with tight loops for primitive columns without nulls.
//! - [`hash_row`] / [`vnode_of_row`] are the plain per-row reference: one [`crc32fast::Hasher`]
//!   per row, fed value by value. Tests check the two are bit-identical on random batches
//!   (a differential test between independent CRC implementations), and the benchmark
//!   (`benches/vnode.rs`) uses the reference as its baseline.
//!
//! # Ownership
//!
//! A [`VnodeBitmap`] is a set of vnodes out of a universe of [`VnodeCount`] vnodes. Its
//! invariant: no bit at or beyond the count is ever set, so equality and hashing of bitmaps
//! are those of the sets they represent.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{ArrayRef, Int64Array};
//! use arrangement_backfill::vnode::{VnodeBitmap, VnodeCount, compute_vnodes, vnode_of_row};
//!
//! let key: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
//! let count = VnodeCount::DEFAULT;
//! let vnodes = compute_vnodes(&[key.clone()], 3, count).unwrap();
//! assert_eq!(vnodes[0].get(), 247);
//! assert_eq!(vnodes[2], vnode_of_row(&[key], 2, count).unwrap());
//!
//! let owners = VnodeBitmap::split(count, 3).unwrap();
//! assert_eq!(owners.iter().map(VnodeBitmap::len).sum::<usize>(), 256);
//! assert_eq!(owners.iter().filter(|o| o.contains(vnodes[0])).count(), 1);
//! ```

use std::fmt;

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

/// The `usage` of [`Error::UnsupportedType`] raised here.
const USAGE: &str = "vnode hashing";

/// The value hashed in place of a NULL: its four little-endian bytes.
const NULL_MARKER: u32 = 0xFFFF_FFF0;

/// The byte appended after every string or binary value.
const BYTES_TERMINATOR: u8 = 0xFF;

// ---------------------------------------------------------------------------------------------
// VirtualNode, VnodeCount
// ---------------------------------------------------------------------------------------------

/// A virtual node: the unit of distribution and of backfill progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualNode(u16);

impl VirtualNode {
    /// Vnode 0, the only vnode of a singleton table.
    pub const ZERO: VirtualNode = VirtualNode(0);

    /// The vnode with the raw value `v`.
    pub const fn new(v: u16) -> Self {
        VirtualNode(v)
    }

    /// The raw value.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The raw value as an index (into per-vnode tables).
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for VirtualNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The number of vnodes of a table: `1..=32768`, 256 by default.
///
/// Part of the persisted contract: a table keeps its count for life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VnodeCount(u16);

impl VnodeCount {
    /// 256 vnodes.
    pub const DEFAULT: VnodeCount = VnodeCount(256);

    /// The largest count, 32768 (vnodes are `u16` and `0..count` must fit).
    pub const MAX: usize = 32768;

    /// A count of `n` vnodes; [`Error::InvalidConfig`] unless `1 <= n <= 32768`.
    pub fn new(n: usize) -> Result<Self> {
        match u16::try_from(n) {
            Ok(v) if (1..=Self::MAX).contains(&n) => Ok(VnodeCount(v)),
            _ => Err(Error::InvalidConfig(format!(
                "vnode count {n} is out of range 1..={}",
                Self::MAX
            ))),
        }
    }

    /// The number of vnodes.
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// Every vnode, `0..count`, ascending.
    pub fn vnodes(self) -> impl Iterator<Item = VirtualNode> {
        (0..self.0).map(VirtualNode)
    }

    /// Whether `v` is one of this count's vnodes.
    fn includes(self, v: VirtualNode) -> bool {
        v.0 < self.0
    }
}

impl Default for VnodeCount {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for VnodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// VnodeBitmap
// ---------------------------------------------------------------------------------------------

/// An owned set of vnodes out of a universe of [`VnodeCount`] vnodes: a bitset of `u64` words.
///
/// Invariant: bits at positions `>= count` are always zero.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VnodeBitmap {
    count: VnodeCount,
    words: Vec<u64>,
}

impl VnodeBitmap {
    /// The set of no vnode.
    pub fn empty(count: VnodeCount) -> Self {
        VnodeBitmap {
            count,
            words: vec![0; count.get().div_ceil(64)],
        }
    }

    /// The set of every vnode of `count`.
    pub fn full(count: VnodeCount) -> Self {
        let mut bitmap = Self::empty(count);
        bitmap.insert_range(0, count.get());
        bitmap
    }

    /// The set of `vnodes`; [`Error::InvalidConfig`] if one is not below `count`.
    pub fn from_vnodes(
        count: VnodeCount,
        vnodes: impl IntoIterator<Item = VirtualNode>,
    ) -> Result<Self> {
        let mut bitmap = Self::empty(count);
        for v in vnodes {
            bitmap.insert(v)?;
        }
        Ok(bitmap)
    }

    /// The size of the universe this set is drawn from.
    pub fn count(&self) -> VnodeCount {
        self.count
    }

    /// Whether `v` is in the set (false if `v` is beyond the count).
    pub fn contains(&self, v: VirtualNode) -> bool {
        self.words
            .get(v.index() / 64)
            .is_some_and(|w| w & (1 << (v.index() % 64)) != 0)
    }

    /// Adds `v`; [`Error::InvalidConfig`] if `v` is not below the count.
    pub fn insert(&mut self, v: VirtualNode) -> Result<()> {
        if !self.count.includes(v) {
            return Err(Error::InvalidConfig(format!(
                "vnode {v} is out of range for a vnode count of {}",
                self.count
            )));
        }
        if let Some(w) = self.words.get_mut(v.index() / 64) {
            *w |= 1 << (v.index() % 64);
        }
        Ok(())
    }

    /// Removes `v` (nothing happens if it is not in the set).
    pub fn remove(&mut self, v: VirtualNode) {
        if let Some(w) = self.words.get_mut(v.index() / 64) {
            *w &= !(1 << (v.index() % 64));
        }
    }

    /// The number of vnodes in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set has no vnode.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The vnodes of the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = VirtualNode> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                // `i * 64 + bit < count <= 32768` by the invariant, so the cast is lossless.
                Some(VirtualNode((i * 64 + bit) as u16))
            })
        })
    }

    /// Splits the universe of `count` vnodes among `n` owners, in contiguous ranges whose sizes
    /// differ by at most one (the first `count % n` owners get one more).
    ///
    /// [`Error::InvalidConfig`] if `n` is 0 or more than the count (an owner would get nothing).
    pub fn split(count: VnodeCount, n: usize) -> Result<Vec<VnodeBitmap>> {
        if n == 0 || n > count.get() {
            return Err(Error::InvalidConfig(format!(
                "cannot split {count} vnodes among {n} owners (need 1..={count})"
            )));
        }
        let (base, extra) = (count.get() / n, count.get() % n);
        let mut start = 0;
        let owners = (0..n)
            .map(|i| {
                let len = base + usize::from(i < extra);
                let mut bitmap = Self::empty(count);
                bitmap.insert_range(start, start + len);
                start += len;
                bitmap
            })
            .collect();
        Ok(owners)
    }

    /// Sets bits `start..end`; callers keep `end <= count`.
    fn insert_range(&mut self, start: usize, end: usize) {
        debug_assert!(start <= end && end <= self.count.get());
        for (i, w) in self.words.iter_mut().enumerate() {
            let (lo, hi) = (i * 64, i * 64 + 64);
            let (from, to) = (start.max(lo), end.min(hi));
            if from < to {
                let width = to - from;
                let ones = if width == 64 {
                    u64::MAX
                } else {
                    (1u64 << width) - 1
                };
                *w |= ones << (from - lo);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Type checks
// ---------------------------------------------------------------------------------------------

/// Checks, at table-definition time, that a distribution-key column of type `data_type` can be
/// hashed; [`Error::UnsupportedType`] (usage "vnode hashing") otherwise.
pub fn check_hashable(column: &str, data_type: &DataType) -> Result<()> {
    if is_hashable(data_type) {
        Ok(())
    } else {
        Err(unsupported(column.to_string(), data_type))
    }
}

/// The types of the contract table in the module docs.
fn is_hashable(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Null | Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float16
            | Float32
            | Float64
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
            | Date32
            | Date64
            | Time32(TimeUnit::Second | TimeUnit::Millisecond)
            | Time64(TimeUnit::Microsecond | TimeUnit::Nanosecond)
            | Timestamp(_, _)
            | Duration(_)
            | Decimal128(_, _)
    )
}

fn unsupported(column: String, data_type: &DataType) -> Error {
    Error::UnsupportedType {
        column,
        data_type: data_type.clone(),
        usage: USAGE,
    }
}

/// The name used in errors for the `i`-th key column of a batch (the hashing functions only see
/// arrays; [`check_hashable`] reports the real name at definition time).
fn column_name(i: usize) -> String {
    format!("distribution key #{i}")
}

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
const CRC_INIT: u32 = !0;

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
fn finalize(raw: u32) -> u32 {
    !raw
}

#[inline(always)]
fn feed_u8(crc: u32, b: u8) -> u32 {
    TABLES[0][((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
}

#[inline(always)]
fn feed_u16(crc: u32, v: u16) -> u32 {
    let x = crc ^ u32::from(v);
    TABLES[1][(x & 0xFF) as usize] ^ TABLES[0][((x >> 8) & 0xFF) as usize] ^ (crc >> 16)
}

/// Slicing-by-4: the four little-endian bytes of `v`.
#[inline(always)]
fn feed_u32(crc: u32, v: u32) -> u32 {
    let x = crc ^ v;
    TABLES[3][(x & 0xFF) as usize]
        ^ TABLES[2][((x >> 8) & 0xFF) as usize]
        ^ TABLES[1][((x >> 16) & 0xFF) as usize]
        ^ TABLES[0][(x >> 24) as usize]
}

/// Slicing-by-8: the eight little-endian bytes of `v`.
#[inline(always)]
fn feed_u64(crc: u32, v: u64) -> u32 {
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
fn feed_u128(crc: u32, v: u128) -> u32 {
    feed_u64(feed_u64(crc, v as u64), (v >> 64) as u64)
}

/// Any byte string: eight bytes at a time, then the tail byte by byte.
#[inline]
fn feed_bytes(mut crc: u32, bytes: &[u8]) -> u32 {
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
struct Reducer {
    divisor: u64,
    /// `Some(count - 1)` when the count is a power of two.
    mask: Option<u32>,
    multiplier: u64,
}

impl Reducer {
    fn new(count: VnodeCount) -> Self {
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
    fn reduce(&self, crc: u32) -> VirtualNode {
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

fn as_bytes(v: Option<&str>) -> Option<&[u8]> {
    v.map(str::as_bytes)
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

// ---------------------------------------------------------------------------------------------
// Per-row reference
// ---------------------------------------------------------------------------------------------

/// The CRC-32 of one row's distribution-key values: the plain reference, one
/// [`crc32fast::Hasher`] fed value by value. Bit-identical to [`hash_rows`], much slower.
///
/// Errors: [`Error::UnsupportedType`] for a type outside the contract, [`Error::InvalidChunk`]
/// if `row` is beyond a column.
pub fn hash_row(columns: &[ArrayRef], row: usize) -> Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    for (i, column) in columns.iter().enumerate() {
        if row >= column.len() {
            return Err(Error::InvalidChunk(format!(
                "row {row} is beyond {}, which has {} rows",
                column_name(i),
                column.len()
            )));
        }
        let bytes = value_bytes(column.as_ref(), row)
            .ok_or_else(|| unsupported(column_name(i), column.data_type()))?;
        hasher.update(&bytes);
    }
    Ok(hasher.finalize())
}

/// The vnode of one row: the per-row reference of [`compute_vnodes`].
pub fn vnode_of_row(columns: &[ArrayRef], row: usize, count: VnodeCount) -> Result<VirtualNode> {
    if columns.is_empty() {
        return Ok(VirtualNode::ZERO);
    }
    let crc = hash_row(columns, row)?;
    let vnode = crc % count.0 as u32;
    // `vnode < count <= 32768`.
    Ok(VirtualNode(vnode as u16))
}

/// The bytes one value contributes to its row's CRC, written straight from the contract table;
/// `None` for an unsupported type. `row` is in bounds.
fn value_bytes(array: &dyn Array, row: usize) -> Option<Vec<u8>> {
    use DataType::*;
    let data_type = array.data_type();
    if !is_hashable(data_type) {
        return None;
    }
    if *data_type == Null || array.is_null(row) {
        return Some(NULL_MARKER.to_le_bytes().to_vec());
    }
    fn terminated(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out.push(BYTES_TERMINATOR);
        out
    }
    let bytes = match data_type {
        Boolean => vec![u8::from(array.as_boolean().value(row))],
        Int8 => array.as_primitive::<Int8Type>().value(row).to_le_bytes().to_vec(),
        Int16 => array.as_primitive::<Int16Type>().value(row).to_le_bytes().to_vec(),
        Int32 => array.as_primitive::<Int32Type>().value(row).to_le_bytes().to_vec(),
        Int64 => array.as_primitive::<Int64Type>().value(row).to_le_bytes().to_vec(),
        UInt8 => array.as_primitive::<UInt8Type>().value(row).to_le_bytes().to_vec(),
        UInt16 => array.as_primitive::<UInt16Type>().value(row).to_le_bytes().to_vec(),
        UInt32 => array.as_primitive::<UInt32Type>().value(row).to_le_bytes().to_vec(),
        UInt64 => array.as_primitive::<UInt64Type>().value(row).to_le_bytes().to_vec(),
        Float16 => {
            let v = array.as_primitive::<Float16Type>().value(row);
            let wide = v.to_f32();
            let bits: u16 = if wide.is_nan() {
                0x7E00
            } else if wide == 0.0 {
                0
            } else {
                v.to_bits()
            };
            bits.to_le_bytes().to_vec()
        }
        Float32 => {
            let v = array.as_primitive::<Float32Type>().value(row);
            let v = if v.is_nan() {
                f32::NAN
            } else if v == 0.0 {
                0.0
            } else {
                v
            };
            v.to_le_bytes().to_vec()
        }
        Float64 => {
            let v = array.as_primitive::<Float64Type>().value(row);
            let v = if v.is_nan() {
                f64::NAN
            } else if v == 0.0 {
                0.0
            } else {
                v
            };
            v.to_le_bytes().to_vec()
        }
        Date32 => array.as_primitive::<Date32Type>().value(row).to_le_bytes().to_vec(),
        Date64 => array.as_primitive::<Date64Type>().value(row).to_le_bytes().to_vec(),
        Time32(TimeUnit::Second) => array
            .as_primitive::<Time32SecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Time32(TimeUnit::Millisecond) => array
            .as_primitive::<Time32MillisecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Time64(TimeUnit::Microsecond) => array
            .as_primitive::<Time64MicrosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Time64(TimeUnit::Nanosecond) => array
            .as_primitive::<Time64NanosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Timestamp(TimeUnit::Second, _) => array
            .as_primitive::<TimestampSecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Timestamp(TimeUnit::Millisecond, _) => array
            .as_primitive::<TimestampMillisecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Timestamp(TimeUnit::Microsecond, _) => array
            .as_primitive::<TimestampMicrosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Timestamp(TimeUnit::Nanosecond, _) => array
            .as_primitive::<TimestampNanosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Duration(TimeUnit::Second) => array
            .as_primitive::<DurationSecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Duration(TimeUnit::Millisecond) => array
            .as_primitive::<DurationMillisecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Duration(TimeUnit::Microsecond) => array
            .as_primitive::<DurationMicrosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Duration(TimeUnit::Nanosecond) => array
            .as_primitive::<DurationNanosecondType>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Decimal128(_, _) => array
            .as_primitive::<Decimal128Type>()
            .value(row)
            .to_le_bytes()
            .to_vec(),
        Utf8 => terminated(array.as_string::<i32>().value(row).as_bytes()),
        LargeUtf8 => terminated(array.as_string::<i64>().value(row).as_bytes()),
        Utf8View => terminated(array.as_string_view().value(row).as_bytes()),
        Binary => terminated(array.as_binary::<i32>().value(row)),
        LargeBinary => terminated(array.as_binary::<i64>().value(row)),
        BinaryView => terminated(array.as_binary_view().value(row)),
        _ => return None,
    };
    Some(bytes)
}
