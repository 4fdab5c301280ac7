//! Virtual nodes: how rows are distributed, and which rows an executor owns.
//!
//! Every row of a table belongs to one of `vnode_count` virtual nodes (docs/DESIGN.md section 4):
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
//! progress of different rows. The unit tests (`tests.rs`) pin test vectors; they must never
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

mod hash;
mod row;

pub use hash::{compute_vnodes, hash_rows, mix64_rows};
pub use row::{hash_row, vnode_of_row};

#[cfg(test)]
mod tests;
