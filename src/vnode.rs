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
    // A primitive value's little-endian bytes.
    macro_rules! le {
        ($t:ty) => {
            array.as_primitive::<$t>().value(row).to_le_bytes().to_vec()
        };
    }
    let bytes = match data_type {
        Boolean => vec![u8::from(array.as_boolean().value(row))],
        Int8 => le!(Int8Type),
        Int16 => le!(Int16Type),
        Int32 => le!(Int32Type),
        Int64 => le!(Int64Type),
        UInt8 => le!(UInt8Type),
        UInt16 => le!(UInt16Type),
        UInt32 => le!(UInt32Type),
        UInt64 => le!(UInt64Type),
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
        Date32 => le!(Date32Type),
        Date64 => le!(Date64Type),
        Time32(TimeUnit::Second) => le!(Time32SecondType),
        Time32(TimeUnit::Millisecond) => le!(Time32MillisecondType),
        Time64(TimeUnit::Microsecond) => le!(Time64MicrosecondType),
        Time64(TimeUnit::Nanosecond) => le!(Time64NanosecondType),
        Timestamp(TimeUnit::Second, _) => le!(TimestampSecondType),
        Timestamp(TimeUnit::Millisecond, _) => le!(TimestampMillisecondType),
        Timestamp(TimeUnit::Microsecond, _) => le!(TimestampMicrosecondType),
        Timestamp(TimeUnit::Nanosecond, _) => le!(TimestampNanosecondType),
        Duration(TimeUnit::Second) => le!(DurationSecondType),
        Duration(TimeUnit::Millisecond) => le!(DurationMillisecondType),
        Duration(TimeUnit::Microsecond) => le!(DurationMicrosecondType),
        Duration(TimeUnit::Nanosecond) => le!(DurationNanosecondType),
        Decimal128(_, _) => le!(Decimal128Type),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{
        BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Date64Array, Decimal128Array,
        DurationMicrosecondArray, DurationMillisecondArray, DurationNanosecondArray,
        DurationSecondArray, Float32Array, Float64Array, Int8Array, Int16Array, Int32Array,
        Int64Array, LargeBinaryArray, LargeStringArray, NullArray, StringArray, StringViewArray,
        Time32MillisecondArray, Time32SecondArray, Time64MicrosecondArray, Time64NanosecondArray,
        TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
        TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array, make_array,
        new_null_array,
    };
    use arrow_buffer::{Buffer, NullBuffer};
    use arrow_data::ArrayData;
    use arrow_schema::{Field, IntervalUnit};
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;
    use proptest::strategy::Union;
    use proptest::test_runner::{Config as ProptestConfig, RngSeed};

    use super::*;

    // ----- helpers -------------------------------------------------------------------------

    fn arc(array: impl Array + 'static) -> ArrayRef {
        Arc::new(array)
    }

    /// A `Float16` array from raw bits (so NaN payloads and -0.0 are exact).
    fn f16_array(bits: &[Option<u16>]) -> ArrayRef {
        let values: Vec<u16> = bits.iter().map(|b| b.unwrap_or(0)).collect();
        let nulls = NullBuffer::from(bits.iter().map(Option::is_some).collect::<Vec<_>>());
        let data = ArrayData::builder(DataType::Float16)
            .len(bits.len())
            .add_buffer(Buffer::from_vec(values))
            .nulls(Some(nulls))
            .build()
            .unwrap();
        make_array(data)
    }

    /// The vectorized CRCs and vnodes, checked row by row against the per-row reference.
    fn check_differential(columns: &[ArrayRef], num_rows: usize, count: VnodeCount) {
        let crcs = hash_rows(columns, num_rows).unwrap();
        let vnodes = compute_vnodes(columns, num_rows, count).unwrap();
        assert_eq!(crcs.len(), num_rows);
        assert_eq!(vnodes.len(), num_rows);
        for row in 0..num_rows {
            assert_eq!(
                crcs[row],
                hash_row(columns, row).unwrap(),
                "crc of row {row}"
            );
            assert_eq!(
                vnodes[row],
                vnode_of_row(columns, row, count).unwrap(),
                "vnode of row {row}"
            );
            assert!(vnodes[row].index() < count.get());
        }
    }

    /// The CRC and vnode (of 256) of a one-row batch, after checking both paths agree.
    fn hash_one(columns: &[ArrayRef]) -> (u32, u16) {
        check_differential(columns, 1, VnodeCount::DEFAULT);
        let crc = hash_rows(columns, 1).unwrap()[0];
        let vnode = compute_vnodes(columns, 1, VnodeCount::DEFAULT).unwrap()[0];
        (crc, vnode.get())
    }

    // ----- pinned test vectors (the persisted contract: never edit these) -----------------

    #[test]
    fn pinned_int64_one() {
        assert_eq!(crc32fast::hash(&[1, 0, 0, 0, 0, 0, 0, 0]), 0xA988_DFF7);
        let key = arc(Int64Array::from(vec![1]));
        assert_eq!(hash_one(&[key]), (0xA988_DFF7, 247));
    }

    #[test]
    fn pinned_utf8_abc() {
        assert_eq!(crc32fast::hash(b"abc\xFF"), 0x8A5F_87DD);
        for key in [
            arc(StringArray::from(vec!["abc"])),
            arc(LargeStringArray::from(vec!["abc"])),
            arc(StringViewArray::from(vec!["abc"])),
            arc(BinaryArray::from(vec![b"abc".as_slice()])),
            arc(LargeBinaryArray::from(vec![b"abc".as_slice()])),
            arc(BinaryViewArray::from(vec![b"abc".as_slice()])),
        ] {
            assert_eq!(hash_one(&[key]), (0x8A5F_87DD, 221));
        }
    }

    #[test]
    fn pinned_null_of_any_type() {
        assert_eq!(crc32fast::hash(&[0xF0, 0xFF, 0xFF, 0xFF]), 0xA79C_EFA9);
        for key in [
            arc(Int64Array::from(vec![None])),
            arc(StringArray::from(vec![None::<&str>])),
            arc(BooleanArray::from(vec![None])),
            arc(NullArray::new(1)),
            f16_array(&[None]),
        ] {
            assert_eq!(hash_one(&[key]), (0xA79C_EFA9, 169));
        }
    }

    #[test]
    fn pinned_multi_column() {
        // (Int64 1, Utf8 "abc")
        let bytes = [1, 0, 0, 0, 0, 0, 0, 0, b'a', b'b', b'c', 0xFF];
        assert_eq!(crc32fast::hash(&bytes), 0x4B6B_D2C1);
        let columns = [
            arc(Int64Array::from(vec![1])),
            arc(StringArray::from(vec!["abc"])),
        ];
        assert_eq!(hash_one(&columns), (0x4B6B_D2C1, 193));

        // (Utf8 "abc", Int32 -7)
        let bytes = [b'a', b'b', b'c', 0xFF, 0xF9, 0xFF, 0xFF, 0xFF];
        assert_eq!(crc32fast::hash(&bytes), 0xDA9E_E7C7);
        let columns = [
            arc(StringArray::from(vec!["abc"])),
            arc(Int32Array::from(vec![-7])),
        ];
        assert_eq!(hash_one(&columns), (0xDA9E_E7C7, 199));

        // (Boolean true, Int32 NULL, Float64 1.5, Decimal128 12345)
        let mut bytes = vec![1, 0xF0, 0xFF, 0xFF, 0xFF];
        bytes.extend_from_slice(&1.5f64.to_le_bytes());
        bytes.extend_from_slice(&12345i128.to_le_bytes());
        assert_eq!(crc32fast::hash(&bytes), 0x719C_21D4);
        let columns = [
            arc(BooleanArray::from(vec![true])),
            arc(Int32Array::from(vec![None])),
            arc(Float64Array::from(vec![1.5])),
            arc(Decimal128Array::from(vec![12345])
                .with_precision_and_scale(10, 2)
                .unwrap()),
        ];
        assert_eq!(hash_one(&columns), (0x719C_21D4, 212));
    }

    #[test]
    fn pinned_vnode_of_a_non_power_of_two_count() {
        let key = arc(Int64Array::from(vec![1]));
        let count = VnodeCount::new(1000).unwrap();
        assert_eq!(
            compute_vnodes(std::slice::from_ref(&key), 1, count).unwrap()[0].get(),
            735
        );
        assert_eq!(vnode_of_row(&[key], 0, count).unwrap().get(), 735);
    }

    // ----- floats ----------------------------------------------------------------------------

    fn all_equal(crcs: &[u32]) -> bool {
        crcs.windows(2).all(|w| w[0] == w[1])
    }

    #[test]
    fn negative_zero_hashes_as_zero_and_every_nan_alike() {
        let nan64 = [
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7FF0_0000_0000_0001), // signalling
            f64::from_bits(0xFFF8_0000_DEAD_BEEF),
        ];
        let zeros = arc(Float64Array::from(vec![0.0, -0.0]));
        let nans = arc(Float64Array::from(nan64.to_vec()));
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
        ));
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
        ));
        check_differential(&[zeros], 2, VnodeCount::DEFAULT);
        check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
        assert_eq!(
            hash_rows(&[nans], 4).unwrap()[0],
            crc32fast::hash(&f64::NAN.to_le_bytes())
        );

        let zeros = arc(Float32Array::from(vec![0.0, -0.0]));
        let nans = arc(Float32Array::from(vec![
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFC0_1234),
        ]));
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
        ));
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
        ));
        check_differential(&[zeros], 2, VnodeCount::DEFAULT);
        check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
        assert_eq!(
            hash_rows(&[nans], 4).unwrap()[0],
            crc32fast::hash(&f32::NAN.to_le_bytes())
        );

        let zeros = f16_array(&[Some(0x0000), Some(0x8000)]);
        let nans = f16_array(&[Some(0x7E00), Some(0xFE00), Some(0x7C01), Some(0xFFFF)]);
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&zeros), 2).unwrap()
        ));
        assert!(all_equal(
            &hash_rows(std::slice::from_ref(&nans), 4).unwrap()
        ));
        check_differential(&[zeros], 2, VnodeCount::DEFAULT);
        check_differential(std::slice::from_ref(&nans), 4, VnodeCount::DEFAULT);
        assert_eq!(
            hash_rows(&[nans], 4).unwrap()[0],
            crc32fast::hash(&[0x00, 0x7E])
        );

        // Infinities and ordinary values are not canonicalized.
        let others = arc(Float64Array::from(vec![
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
        ]));
        let crcs = hash_rows(&[others], 3).unwrap();
        assert_eq!(crcs[2], crc32fast::hash(&(-1.0f64).to_le_bytes()));
        assert_ne!(crcs[0], crcs[1]);
    }

    // ----- the CRC engine and the reducer -----------------------------------------------------

    #[test]
    fn crc_engine_matches_crc32fast() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + i / 5) as u8).collect();
        for len in 0..data.len() {
            let bytes = &data[..len];
            assert_eq!(
                finalize(feed_bytes(CRC_INIT, bytes)),
                crc32fast::hash(bytes)
            );
        }
        let v = 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210u128;
        let check = |crc: u32, bytes: &[u8]| assert_eq!(finalize(crc), crc32fast::hash(bytes));
        check(feed_u8(CRC_INIT, v as u8), &(v as u8).to_le_bytes());
        check(feed_u16(CRC_INIT, v as u16), &(v as u16).to_le_bytes());
        check(feed_u32(CRC_INIT, v as u32), &(v as u32).to_le_bytes());
        check(feed_u64(CRC_INIT, v as u64), &(v as u64).to_le_bytes());
        check(feed_u128(CRC_INIT, v), &v.to_le_bytes());
    }

    // ----- the differential property test ---------------------------------------------------

    fn proptest_config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            rng_seed: RngSeed::Fixed(0x7A3E_11D0_5EED_0001),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    fn f64_value() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => any::<f64>(),
            1 => prop::sample::select(vec![
                0.0,
                -0.0,
                f64::NAN,
                -f64::NAN,
                f64::from_bits(0x7FF0_0000_0000_0001),
                f64::INFINITY,
                f64::NEG_INFINITY,
            ]),
        ]
    }

    fn f32_value() -> impl Strategy<Value = f32> {
        prop_oneof![
            4 => any::<f32>(),
            1 => prop::sample::select(vec![0.0, -0.0, f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)]),
        ]
    }

    /// One column of `len` rows of a random supported type, about one value in five NULL.
    fn column(len: usize) -> BoxedStrategy<ArrayRef> {
        fn values<T: fmt::Debug + Clone + 'static>(
            s: impl Strategy<Value = T> + 'static,
            len: usize,
        ) -> impl Strategy<Value = Vec<Option<T>>> {
            vec(option::weighted(0.8, s), len)
        }
        fn strings(v: Vec<Option<String>>) -> Vec<ArrayRef> {
            let refs: Vec<Option<&str>> = v.iter().map(Option::as_deref).collect();
            vec![
                arc(StringArray::from(refs.clone())),
                arc(LargeStringArray::from(refs.clone())),
                arc(StringViewArray::from(refs)),
            ]
        }
        fn binaries(v: Vec<Option<Vec<u8>>>) -> Vec<ArrayRef> {
            let refs: Vec<Option<&[u8]>> = v.iter().map(Option::as_deref).collect();
            vec![
                arc(BinaryArray::from(refs.clone())),
                arc(LargeBinaryArray::from(refs.clone())),
                arc(BinaryViewArray::from(refs)),
            ]
        }
        /// Picks one of several array kinds built from the same values.
        fn pick(s: impl Strategy<Value = Vec<ArrayRef>> + 'static) -> BoxedStrategy<ArrayRef> {
            (s, any::<prop::sample::Index>())
                .prop_map(|(arrays, i)| arrays[i.index(arrays.len())].clone())
                .boxed()
        }
        let arms: Vec<BoxedStrategy<ArrayRef>> = vec![
            Just(arc(NullArray::new(len))).boxed(),
            values(any::<bool>(), len)
                .prop_map(|v| arc(BooleanArray::from(v)))
                .boxed(),
            pick(values(any::<i8>(), len).prop_map(|v| {
                vec![
                    arc(Int8Array::from(v.clone())),
                    arc(UInt8Array::from(
                        v.iter().map(|x| x.map(|x| x as u8)).collect::<Vec<_>>(),
                    )),
                ]
            })),
            pick(values(any::<i16>(), len).prop_map(|v| {
                vec![
                    arc(Int16Array::from(v.clone())),
                    arc(UInt16Array::from(
                        v.iter().map(|x| x.map(|x| x as u16)).collect::<Vec<_>>(),
                    )),
                ]
            })),
            values(any::<u16>(), len)
                .prop_map(|v| f16_array(&v))
                .boxed(),
            pick(values(any::<i32>(), len).prop_map(|v| {
                vec![
                    arc(Int32Array::from(v.clone())),
                    arc(UInt32Array::from(
                        v.iter().map(|x| x.map(|x| x as u32)).collect::<Vec<_>>(),
                    )),
                    arc(Date32Array::from(v.clone())),
                    arc(Time32SecondArray::from(v.clone())),
                    arc(Time32MillisecondArray::from(v)),
                ]
            })),
            pick(values(any::<i64>(), len).prop_map(|v| {
                vec![
                    arc(Int64Array::from(v.clone())),
                    arc(UInt64Array::from(
                        v.iter().map(|x| x.map(|x| x as u64)).collect::<Vec<_>>(),
                    )),
                    arc(Date64Array::from(v.clone())),
                    arc(Time64MicrosecondArray::from(v.clone())),
                    arc(Time64NanosecondArray::from(v.clone())),
                    arc(TimestampSecondArray::from(v.clone())),
                    arc(TimestampMillisecondArray::from(v.clone()).with_timezone("+01:00")),
                    arc(TimestampMicrosecondArray::from(v.clone()).with_timezone("UTC")),
                    arc(TimestampNanosecondArray::from(v.clone())),
                    arc(DurationSecondArray::from(v.clone())),
                    arc(DurationMillisecondArray::from(v.clone())),
                    arc(DurationMicrosecondArray::from(v.clone())),
                    arc(DurationNanosecondArray::from(v)),
                ]
            })),
            values(any::<i128>(), len)
                .prop_map(|v| {
                    arc(Decimal128Array::from(v)
                        .with_precision_and_scale(38, 4)
                        .unwrap())
                })
                .boxed(),
            values(f32_value(), len)
                .prop_map(|v| arc(Float32Array::from(v)))
                .boxed(),
            values(f64_value(), len)
                .prop_map(|v| arc(Float64Array::from(v)))
                .boxed(),
            // Up to 30 bytes so that views are both inline (<= 12 bytes) and out of line.
            pick(values("\\PC{0,30}", len).prop_map(strings)),
            pick(values(vec(any::<u8>(), 0..30), len).prop_map(binaries)),
        ];
        Union::new(arms).boxed()
    }

    /// Random key columns (0 to 3), all sliced by the same random offset, and a vnode count.
    fn batch() -> impl Strategy<Value = (Vec<ArrayRef>, usize, VnodeCount)> {
        let counts = vec![1usize, 3, 7, 100, 256, 1000, 4096, 32767, 32768];
        (
            0usize..70,
            0usize..5,
            0usize..4,
            prop::sample::select(counts),
        )
            .prop_flat_map(|(len, offset, width, count)| {
                (
                    vec(column(len + offset), width),
                    Just(len),
                    Just(offset),
                    Just(count),
                )
            })
            .prop_map(|(columns, len, offset, count)| {
                let columns = columns.iter().map(|c| c.slice(offset, len)).collect();
                (columns, len, VnodeCount::new(count).unwrap())
            })
    }

    proptest! {
        #![proptest_config(proptest_config())]

        /// Differential: the vectorized path equals the crc32fast per-row reference.
        #[test]
        fn vectorized_equals_per_row((columns, num_rows, count) in batch()) {
            check_differential(&columns, num_rows, count);
        }

        /// Differential: the multiply-based remainder equals `%`.
        #[test]
        fn reducer_equals_modulo(crc in any::<u32>(), count in 1usize..=VnodeCount::MAX) {
            let count = VnodeCount::new(count).unwrap();
            let expected = crc % count.get() as u32;
            prop_assert_eq!(u32::from(Reducer::new(count).reduce(crc).get()), expected);
        }
    }

    #[test]
    fn reducer_edge_cases() {
        for count in [1, 2, 3, 255, 256, 257, 1000, 32767, 32768] {
            let reducer = Reducer::new(VnodeCount::new(count).unwrap());
            for crc in [0, 1, 2, 0x7FFF_FFFF, 0x8000_0000, u32::MAX - 1, u32::MAX] {
                assert_eq!(u32::from(reducer.reduce(crc).get()), crc % count as u32);
            }
        }
    }

    #[test]
    fn every_supported_type_with_nulls_and_offsets() {
        let ints = vec![Some(-3i64), None, Some(i64::MAX), Some(0), None, Some(42)];
        let i32s: Vec<Option<i32>> = ints.iter().map(|v| v.map(|v| v as i32)).collect();
        let columns: Vec<ArrayRef> = vec![
            arc(NullArray::new(6)),
            arc(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                Some(true),
                None,
                Some(false),
            ])),
            arc(Int8Array::from(
                ints.iter().map(|v| v.map(|v| v as i8)).collect::<Vec<_>>(),
            )),
            arc(UInt64Array::from(
                ints.iter().map(|v| v.map(|v| v as u64)).collect::<Vec<_>>(),
            )),
            f16_array(&[
                Some(0x3C00),
                None,
                Some(0x8000),
                Some(0x7E01),
                None,
                Some(0xBC00),
            ]),
            arc(Float32Array::from(vec![
                Some(1.0),
                None,
                Some(-0.0),
                Some(f32::NAN),
                None,
                Some(2.5),
            ])),
            arc(Float64Array::from(vec![
                Some(1.0),
                None,
                Some(-0.0),
                Some(f64::NAN),
                None,
                Some(2.5),
            ])),
            arc(StringArray::from(vec![
                Some(""),
                None,
                Some("a"),
                Some("longer than twelve"),
                None,
                Some("z"),
            ])),
            arc(StringViewArray::from(vec![
                Some(""),
                None,
                Some("a"),
                Some("longer than twelve"),
                None,
                Some("z"),
            ])),
            arc(BinaryViewArray::from(vec![
                Some(b"".as_slice()),
                None,
                Some(b"\xFF"),
                Some(b"0123456789abcdef"),
                None,
                Some(b"z"),
            ])),
            arc(Date32Array::from(i32s.clone())),
            arc(Time32MillisecondArray::from(i32s)),
            arc(TimestampNanosecondArray::from(ints.clone()).with_timezone("Europe/Paris")),
            arc(DurationMicrosecondArray::from(ints.clone())),
            arc(
                Decimal128Array::from(ints.iter().map(|v| v.map(i128::from)).collect::<Vec<_>>())
                    .with_precision_and_scale(20, 3)
                    .unwrap(),
            ),
        ];
        for column in &columns {
            check_hashable("c", column.data_type()).unwrap();
        }
        check_differential(&columns, 6, VnodeCount::DEFAULT);
        for column in &columns {
            check_differential(std::slice::from_ref(column), 6, VnodeCount::new(7).unwrap());
        }
        // Sliced arrays (nonzero offsets, the null bitmap sliced too).
        let sliced: Vec<ArrayRef> = columns.iter().map(|c| c.slice(1, 4)).collect();
        check_differential(&sliced, 4, VnodeCount::DEFAULT);
        let whole = hash_rows(&columns, 6).unwrap();
        assert_eq!(hash_rows(&sliced, 4).unwrap(), whole[1..5]);
    }

    #[test]
    fn singleton_table_is_vnode_zero() {
        let count = VnodeCount::new(1000).unwrap();
        assert_eq!(
            compute_vnodes(&[], 5, count).unwrap(),
            vec![VirtualNode::ZERO; 5]
        );
        assert_eq!(vnode_of_row(&[], 3, count).unwrap(), VirtualNode::ZERO);
        // The CRC of an empty key is that of the empty string.
        assert_eq!(hash_rows(&[], 2).unwrap(), vec![0, 0]);
        assert_eq!(hash_row(&[], 0).unwrap(), 0);
    }

    // ----- errors ----------------------------------------------------------------------------

    fn unsupported_columns() -> Vec<ArrayRef> {
        let mut list = ListBuilder::new(arrow_array::builder::Int32Builder::new());
        list.values().append_value(1);
        list.append(true);
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        dict.append_value("a");
        vec![
            arc(list.finish()),
            arc(dict.finish()),
            new_null_array(
                &DataType::Struct(vec![Field::new("a", DataType::Int32, true)].into()),
                1,
            ),
            new_null_array(&DataType::Interval(IntervalUnit::DayTime), 1),
            new_null_array(&DataType::FixedSizeBinary(4), 1),
            new_null_array(&DataType::Decimal256(40, 2), 1),
        ]
    }

    #[test]
    fn unsupported_types_are_errors_not_panics() {
        let good = arc(Int64Array::from(vec![1]));
        for bad in unsupported_columns() {
            let data_type = bad.data_type().clone();
            let is_unsupported = |r: Result<()>| {
                matches!(
                    r,
                    Err(Error::UnsupportedType {
                        usage: "vnode hashing",
                        ..
                    })
                )
            };
            match check_hashable("k", &data_type) {
                Err(Error::UnsupportedType {
                    column,
                    data_type: t,
                    usage,
                }) => {
                    assert_eq!(
                        (column.as_str(), &t, usage),
                        ("k", &data_type, "vnode hashing")
                    );
                }
                other => panic!("{data_type}: {other:?}"),
            }
            let columns = [good.clone(), bad];
            assert!(
                is_unsupported(hash_rows(&columns, 1).map(drop)),
                "{data_type}"
            );
            assert!(is_unsupported(
                compute_vnodes(&columns, 1, VnodeCount::DEFAULT).map(drop)
            ));
            assert!(is_unsupported(hash_row(&columns, 0).map(drop)));
            assert!(is_unsupported(
                vnode_of_row(&columns, 0, VnodeCount::DEFAULT).map(drop)
            ));
        }
    }

    #[test]
    fn check_hashable_agrees_with_hash_rows() {
        use DataType::*;
        let types = [
            Null,
            Boolean,
            Int8,
            Int16,
            Int32,
            Int64,
            UInt8,
            UInt16,
            UInt32,
            UInt64,
            Float16,
            Float32,
            Float64,
            Utf8,
            LargeUtf8,
            Utf8View,
            Binary,
            LargeBinary,
            BinaryView,
            Date32,
            Date64,
            Time32(TimeUnit::Second),
            Time32(TimeUnit::Millisecond),
            Time64(TimeUnit::Microsecond),
            Time64(TimeUnit::Nanosecond),
            Timestamp(TimeUnit::Second, None),
            Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            Duration(TimeUnit::Millisecond),
            Decimal128(38, 10),
            Decimal256(40, 0),
            Decimal64(18, 2),
            Decimal32(9, 2),
            FixedSizeBinary(3),
            Interval(IntervalUnit::MonthDayNano),
            Dictionary(Box::new(Int8), Box::new(Utf8)),
            List(Arc::new(Field::new("item", Int32, true))),
        ];
        for data_type in types {
            let column = new_null_array(&data_type, 2);
            let ok = check_hashable("k", &data_type).is_ok();
            assert_eq!(
                hash_rows(std::slice::from_ref(&column), 2).is_ok(),
                ok,
                "{data_type}"
            );
            assert_eq!(hash_row(&[column], 1).is_ok(), ok, "{data_type}");
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let columns = [
            arc(Int64Array::from(vec![1, 2, 3])),
            arc(Int64Array::from(vec![1, 2])),
        ];
        assert!(matches!(
            hash_rows(&columns, 3),
            Err(Error::InvalidChunk(_))
        ));
        assert!(matches!(
            compute_vnodes(&columns, 2, VnodeCount::DEFAULT),
            Err(Error::InvalidChunk(_))
        ));
        assert!(matches!(hash_row(&columns, 2), Err(Error::InvalidChunk(_))));
        assert!(matches!(
            vnode_of_row(&columns, 5, VnodeCount::DEFAULT),
            Err(Error::InvalidChunk(_))
        ));
    }

    // ----- VirtualNode, VnodeCount, VnodeBitmap --------------------------------------------

    #[test]
    fn virtual_node_accessors() {
        let v = VirtualNode::new(300);
        assert_eq!(
            (v.get(), v.index(), v.to_string()),
            (300, 300, "300".to_string())
        );
        assert_eq!(VirtualNode::ZERO.get(), 0);
        assert!(VirtualNode::new(2) < VirtualNode::new(10));
    }

    #[test]
    fn vnode_count_bounds() {
        assert!(matches!(VnodeCount::new(0), Err(Error::InvalidConfig(_))));
        assert!(matches!(
            VnodeCount::new(32769),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            VnodeCount::new(70000),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            VnodeCount::new(usize::MAX),
            Err(Error::InvalidConfig(_))
        ));
        assert_eq!(VnodeCount::new(1).unwrap().get(), 1);
        assert_eq!(VnodeCount::new(VnodeCount::MAX).unwrap().get(), 32768);
        assert_eq!(VnodeCount::default(), VnodeCount::DEFAULT);
        assert_eq!(VnodeCount::DEFAULT.get(), 256);
        let all: Vec<u16> = VnodeCount::new(5)
            .unwrap()
            .vnodes()
            .map(VirtualNode::get)
            .collect();
        assert_eq!(all, [0, 1, 2, 3, 4]);
        assert_eq!(VnodeCount::new(32768).unwrap().vnodes().count(), 32768);
        assert_eq!(
            VnodeCount::new(32768).unwrap().vnodes().last(),
            Some(VirtualNode::new(32767))
        );
    }

    #[test]
    fn bitmap_set_operations() {
        let count = VnodeCount::new(130).unwrap();
        let mut b = VnodeBitmap::empty(count);
        assert!(b.is_empty());
        assert_eq!(b.len(), 0);
        assert_eq!(b.count(), count);
        for v in [0, 63, 64, 129] {
            b.insert(VirtualNode::new(v)).unwrap();
        }
        assert!(matches!(
            b.insert(VirtualNode::new(130)),
            Err(Error::InvalidConfig(_))
        ));
        assert!(!b.contains(VirtualNode::new(130)));
        assert!(!b.contains(VirtualNode::new(u16::MAX)));
        assert!(b.contains(VirtualNode::new(64)) && !b.contains(VirtualNode::new(65)));
        assert_eq!(b.len(), 4);
        b.remove(VirtualNode::new(63));
        b.remove(VirtualNode::new(63));
        b.remove(VirtualNode::new(u16::MAX));
        let got: Vec<u16> = b.iter().map(VirtualNode::get).collect();
        assert_eq!(got, [0, 64, 129]);
        assert_eq!(
            b,
            VnodeBitmap::from_vnodes(count, [129, 0, 64].map(VirtualNode::new)).unwrap()
        );

        let full = VnodeBitmap::full(count);
        assert_eq!(full.len(), 130);
        assert!(full.iter().eq(count.vnodes()));
        assert_eq!(
            full,
            VnodeBitmap::from_vnodes(count, count.vnodes()).unwrap()
        );
        assert!(VnodeBitmap::full(VnodeCount::new(1).unwrap()).contains(VirtualNode::ZERO));
    }

    #[test]
    fn from_vnodes_rejects_out_of_range() {
        let count = VnodeCount::new(10).unwrap();
        let r = VnodeBitmap::from_vnodes(count, [1, 10].map(VirtualNode::new));
        assert!(matches!(r, Err(Error::InvalidConfig(_))));
        let r = VnodeBitmap::from_vnodes(VnodeCount::DEFAULT, [VirtualNode::new(256)]);
        assert!(matches!(r, Err(Error::InvalidConfig(_))));
    }

    #[test]
    fn split_covers_the_universe_once_with_balanced_contiguous_ranges() {
        for count in [1, 2, 3, 63, 64, 65, 100, 256, 1000, 32768] {
            let count = VnodeCount::new(count).unwrap();
            for n in [1, 2, 3, 5, 7, 64, 100, 255, 256, 1000, 32768] {
                if n > count.get() {
                    continue;
                }
                let owners = VnodeBitmap::split(count, n).unwrap();
                assert_eq!(owners.len(), n);
                let sizes: Vec<usize> = owners.iter().map(VnodeBitmap::len).collect();
                let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(
                    *min >= 1 && max - min <= 1,
                    "count {count} n {n}: {min}..{max}"
                );
                // Concatenated in owner order, the ranges are exactly 0..count.
                let all: Vec<VirtualNode> = owners.iter().flat_map(VnodeBitmap::iter).collect();
                assert!(
                    all.iter().copied().eq(count.vnodes()),
                    "count {count} n {n}"
                );
                assert!(owners.iter().all(|o| o.count() == count));
            }
        }
        let count = VnodeCount::new(10).unwrap();
        assert!(matches!(
            VnodeBitmap::split(count, 0),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            VnodeBitmap::split(count, 11),
            Err(Error::InvalidConfig(_))
        ));
        assert_eq!(
            VnodeBitmap::split(count, 1).unwrap(),
            vec![VnodeBitmap::full(count)]
        );
    }
}
