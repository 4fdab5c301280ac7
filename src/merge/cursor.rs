//! How the heads of two inputs compare.
//!
//! A cursor walks one input's current batch: it knows the row it is on (the *head*), makes
//! the loser tree's entry for its input, and says how two entries rank. There are two kinds:
//!
//! ```text
//!   RowCursor: encoded keys (BinaryArray)          PrimitiveCursor<Int64Type>: the key column
//!   head -> 01 80 00 00 00 | 00 01 2c | 01 ..      head -> 17              native `Ord`,
//!           01 80 00 00 00 | 00 01 2d | 01 ..              42              reversed when
//!           01 80 00 00 00 | 00 02 00 | 01 ..              99              descending
//!           `-- skip: bytes -'`- prefix: the next 8 bytes as a u64,
//!            every key shares    then memcmp only when two prefixes are equal
//! ```
//!
//! Both kinds put a [`KeyEntry`] in the tree: a `u64` key that orders like the keys (or, for
//! rows, never contradicts them), and the input index.
//! - [`PrimitiveCursor`] is the fast path for a key of one non-nullable integer column: it
//!   maps the column's native values to order-preserving `u64`s, no bytes, no length prefix.
//!   The entry's key *is* the head key, so the tree ranks two entries with one `u128`
//!   comparison and never looks at a cursor. Chosen by [`CursorKind::for_key`]; a nullable
//!   column falls back to rows, so NULL ordering is only ever decided by arrow-row.
//! - [`RowCursor`] works for every key: arrow-row bytes compare like the keys (`memcmp`). Its
//!   entry's key is a *normalized key prefix*: 8 bytes of the head as a big-endian `u64`.
//!   Different prefixes rank with one integer comparison; equal ones look both cursors'
//!   heads up and compare the bytes. Which 8 bytes matters: arrow-row puts a validity byte
//!   before each value and a small integer's high bytes are zeros, so the *first* 8 bytes of
//!   the keys 0..1M as `Int64` only tell apart `k >> 8`, and nearly every comparison of nearby
//!   heads was a tie (no faster than plain `memcmp` in `benches/merge.rs`). So the prefix
//!   starts after the leading bytes every key of the merge shares ([`RowConfig`]), learned
//!   from the batches as they arrive; when a batch narrows them, the merge recomputes every
//!   entry.
//!
//! **Why a trait, not an enum.** Every input of one merge uses the same kind, decided once
//! from the key. A generic [`Cursor`] lets the merge loop and the loser tree be compiled once
//! per kind, so the hot comparison is a direct `u128` (or prefix, then `memcmp`) compare with no per-row
//! `match` on two cursors' kinds. The merge picks the monomorphized instance once, at
//! construction.

use std::hint::select_unpredictable;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, BinaryArray};
use arrow_buffer::ScalarBuffer;
use arrow_schema::DataType;

use crate::error::{Error, Result};
use crate::key::{PrimaryKey, first_unordered};
use crate::merge::loser_tree::Entry;
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
        if !field.data_type().is_integer() || field.is_nullable() {
            return Self::Rows;
        }
        Self::Primitive {
            column,
            data_type: field.data_type().clone(),
            descending: key.descending,
        }
    }
}

/// A position in one input's current batch, and how the loser tree ranks inputs.
///
/// The tree stores one [`KeyEntry`] per input and orders them with [`Cursor::beats`]
/// (the order of `loser_tree.rs`: by head key, ties and exhausted inputs by input index).
/// The associated functions take every input's cursor (`None`: exhausted) for entries that
/// only name an input and must look its head up.
pub(crate) trait Cursor: Sized + Send + 'static {
    /// What is needed to open a cursor on a batch.
    type Config: Clone + Send + 'static;

    /// A cursor on row 0 of `batch` (not empty).
    fn open(config: &Self::Config, batch: &KeyedBatch) -> Result<Self>;

    /// Tells the merge's `config` about `batch`, the next batch of some input (checked to be
    /// in key order, not empty), before a cursor is opened on it. True when the entries of
    /// cursors opened before are now stale: the merge then [refreshes](Cursor::refresh) every
    /// cursor and rebuilds the tree. (The row cursor narrows the bytes its prefixes skip.)
    fn admit(_config: &mut Self::Config, _batch: &KeyedBatch) -> bool {
        false
    }

    /// Brings a cursor opened before the last [`Cursor::admit`] up to date with `config`.
    fn refresh(&mut self, _config: &Self::Config) {}

    /// The first row of `batch` whose key is not strictly above the one before it, judged
    /// the way this cursor compares (the input's order check, once per batch).
    fn first_unordered(config: &Self::Config, batch: &KeyedBatch) -> Option<usize>;

    /// The head row.
    fn row(&self) -> usize;

    /// Rows from the head to the end of the batch; 0 when every row was passed.
    fn remaining(&self) -> usize;

    /// Moves past `n` rows (at most [`Cursor::remaining`]).
    fn advance(&mut self, n: usize);

    /// The entry of `input`, whose cursor this is, for its head (not finished).
    fn entry(&self, input: usize) -> KeyEntry;

    /// True when entry `a` comes strictly before entry `b`.
    fn beats(a: KeyEntry, b: KeyEntry, cursors: &[Option<Self>]) -> bool;

    /// How many rows from the head on (at most `max`, at most [`Cursor::remaining`]) come
    /// before `bound`, the entry of another input that the head comes before (so the answer
    /// is at least 1 when `max` is). The keys strictly increase, so this is a search
    /// (galloping: short runs are cheap).
    fn rows_before(
        &self,
        input: usize,
        bound: KeyEntry,
        max: usize,
        cursors: &[Option<Self>],
    ) -> usize;
}

/// What every row cursor of one merge shares: how many leading bytes all keys have in
/// common, so that a [`KeyEntry`]'s prefix holds the 8 bytes after them.
///
/// Every key admitted to the merge starts with `reference[..skip]`. A batch is in key order
/// (checked before it is admitted), so all its keys share the common prefix of its first and
/// last key: admitting a batch is two prefix comparisons, not one per row. `skip` only
/// shrinks; when it does, the prefixes of the entries already in the tree are stale and the
/// merge recomputes them ([`Cursor::admit`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct RowConfig {
    /// The first key admitted; empty before.
    reference: Vec<u8>,
    /// Leading bytes every admitted key shares with `reference`.
    skip: usize,
    /// False until a batch is admitted.
    started: bool,
}

impl RowConfig {
    /// Narrows `skip` to the bytes `batch`'s keys (in key order, not empty) share with every
    /// key admitted before. True when `skip` shrank after the first batch.
    fn admit(&mut self, keys: &BinaryArray) -> bool {
        let (first, last) = (keys.value(0), keys.value(keys.len() - 1));
        let shared = common_prefix(first, last);
        if !self.started {
            self.started = true;
            self.reference = first[..shared].to_vec();
            self.skip = shared;
            return false;
        }
        let skip = self
            .skip
            .min(shared)
            .min(common_prefix(&self.reference, first));
        let shrank = skip < self.skip;
        self.skip = skip;
        shrank
    }
}

/// The length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The 8 bytes of `key` from `skip` on (at most `key.len()`) as a big-endian `u64`,
/// zero-padded when fewer remain.
///
/// Comparing prefixes never contradicts comparing the bytes: if `a < b` then
/// `prefix(a) <= prefix(b)`. Either they differ at a byte before `skip + 8`, where the prefixes
/// differ the same way, or later, where the prefixes are equal, or `a` is a proper prefix of
/// `b`, where `a`'s padding zeros are at most `b`'s bytes. So different prefixes decide, and
/// equal prefixes (a short key and a longer one with zeros there included) compare the bytes.
/// This holds for any bytes; arrow-row keys of one schema are moreover prefix-free.
#[inline]
fn prefix(key: &[u8], skip: usize) -> u64 {
    let tail = key.get(skip..).unwrap_or_default();
    match tail.first_chunk::<8>() {
        Some(bytes) => u64::from_be_bytes(*bytes),
        None => {
            let mut bytes = [0; 8];
            bytes[..tail.len()].copy_from_slice(tail);
            u64::from_be_bytes(bytes)
        }
    }
}

/// A cursor over encoded keys. Its tree entries are [`KeyEntry`]s whose key is the head's
/// [`prefix`]: two entries with different prefixes rank by one integer comparison, and only
/// equal prefixes look the heads up for a `memcmp`.
#[derive(Debug)]
pub(crate) struct RowCursor {
    keys: BinaryArray,
    row: usize,
    /// [`RowConfig::skip`] when the cursor was opened or last refreshed.
    skip: usize,
}

impl RowCursor {
    fn head(&self) -> &[u8] {
        self.keys.value(self.row)
    }

    /// The entry of `input` whose head is `key`.
    #[inline]
    fn pack(&self, key: &[u8], input: usize) -> KeyEntry {
        debug_assert!((input as u64) < EXHAUSTED);
        KeyEntry {
            key: prefix(key, self.skip),
            tie: input as u64,
        }
    }

    /// Whether `a` comes before `b` when their prefixes are equal: by the full key bytes,
    /// then by input. Exhausted entries (see [`KeyEntry`]) rank by `tie` alone.
    #[inline]
    fn beats_on_bytes(a: KeyEntry, b: KeyEntry, cursors: &[Option<Self>]) -> bool {
        if (a.tie | b.tie) & EXHAUSTED == 0
            && let (Some(ca), Some(cb)) = (&cursors[a.input()], &cursors[b.input()])
        {
            return (ca.head(), a.tie) < (cb.head(), b.tie);
        }
        a.tie < b.tie
    }
}

impl Cursor for RowCursor {
    type Config = RowConfig;

    fn open(config: &RowConfig, batch: &KeyedBatch) -> Result<Self> {
        Ok(Self {
            keys: batch.keys.clone(),
            row: 0,
            skip: config.skip,
        })
    }

    fn admit(config: &mut RowConfig, batch: &KeyedBatch) -> bool {
        config.admit(&batch.keys)
    }

    fn refresh(&mut self, config: &RowConfig) {
        self.skip = config.skip;
    }

    fn first_unordered(_: &RowConfig, batch: &KeyedBatch) -> Option<usize> {
        first_unordered(&batch.keys)
    }

    fn row(&self) -> usize {
        self.row
    }

    fn remaining(&self) -> usize {
        self.keys.len().saturating_sub(self.row)
    }

    /// Also prefetches the offsets and the key bytes a cache line ahead, as
    /// [`PrimitiveCursor::advance`] does.
    #[inline]
    fn advance(&mut self, n: usize) {
        self.row += n;
        let offsets = self.keys.value_offsets();
        let ahead = offsets.get(self.row + PREFETCH_AHEAD).or(offsets.last());
        if let Some(&start) = ahead {
            prefetch(self.keys.values().as_ptr().wrapping_add(start as usize));
        }
        prefetch(offsets.as_ptr().wrapping_add(self.row + 2 * PREFETCH_AHEAD));
    }

    #[inline]
    fn entry(&self, input: usize) -> KeyEntry {
        self.pack(self.head(), input)
    }

    /// Different prefixes decide (see [`prefix`]); equal ones compare the heads' bytes.
    #[inline]
    fn beats(a: KeyEntry, b: KeyEntry, cursors: &[Option<Self>]) -> bool {
        if a.key != b.key {
            return a.key < b.key;
        }
        Self::beats_on_bytes(a, b, cursors)
    }

    fn rows_before(
        &self,
        input: usize,
        bound: KeyEntry,
        max: usize,
        cursors: &[Option<Self>],
    ) -> usize {
        let max = max.min(self.remaining());
        let Some(other) = cursors[bound.input()]
            .as_ref()
            .filter(|_| !bound.is_exhausted())
        else {
            return max;
        };
        // Not `beats`: on equal prefixes that would look up this input's head, not row `i`.
        let bound_key = (other.head(), bound.tie);
        gallop(max, |i| {
            let key = self.keys.value(self.row + i);
            let prefix = prefix(key, self.skip);
            prefix < bound.key || (prefix == bound.key && (key, input as u64) < bound_key)
        })
    }
}

/// The first `i` in `0..n` for which `before(i)` is false, `before` being true on a prefix
/// that includes index 0 (not probed: the caller's head, known to come first).
///
/// Galloping: probes 1, 3, 7, 15, .. then bisects the last gap, so a run of `r` rows costs
/// about `2 log2 r` comparisons, and a run of one row (the common case with spread keys) one
/// comparison, which matters when a comparison is a `memcmp`.
fn gallop(n: usize, before: impl Fn(usize) -> bool) -> usize {
    // `before(lo - 1)` is true; the answer is in `lo..=hi`.
    let (mut lo, mut hi, mut step) = (n.min(1), n, 1);
    while lo < hi {
        let probe = (lo - 1 + step).min(hi - 1);
        if !before(probe) {
            hi = probe;
            break;
        }
        lo = probe + 1;
        step *= 2;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

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

/// A [`PrimitiveCursor`]'s tree entry: its whole rank in two words, compared as one `u128`
/// (`key` high, `tie` low) with a plain `<` (for [`RowCursor`], whose key is a prefix, only
/// when the keys differ: see [`RowCursor::beats`]):
///
/// ```text
///   key: the head's OrderBits, inverted when descending      u64::MAX once exhausted
///        (RowCursor: the head's prefix)
///   tie: the input index                                      with bit 63 set once exhausted
/// ```
///
/// Live entries order by key, then input index (the tie rule). An exhausted entry has the
/// largest key and a `tie` above every live input's, so it comes after every live entry
/// (even one with key `u64::MAX`); exhausted entries order by input index. An input index
/// fits in 63 bits because a `Vec` holds at most `isize::MAX` elements.
///
/// Two `u64` fields rather than one `u128`: the loser tree picks each word with a `cmov`,
/// where LLVM lowers a select of a `u128` to branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    key: u64,
    tie: u64,
}

/// The bit of [`KeyEntry::tie`] that marks an exhausted input.
const EXHAUSTED: u64 = 1 << 63;

impl KeyEntry {
    /// The rank as one number: smaller comes first.
    #[inline]
    fn rank(self) -> u128 {
        (u128::from(self.key) << 64) | u128::from(self.tie)
    }

    /// The entry of `input` once it is exhausted.
    pub(crate) fn exhausted(input: usize) -> Self {
        Self {
            key: u64::MAX,
            tie: EXHAUSTED | input as u64,
        }
    }

    /// The input the entry belongs to.
    #[inline]
    pub(crate) fn input(self) -> usize {
        (self.tie & !EXHAUSTED) as usize
    }

    /// True for an exhausted input's entry.
    #[inline]
    pub(crate) fn is_exhausted(self) -> bool {
        self.tie & EXHAUSTED != 0
    }
}

impl Entry for KeyEntry {
    #[inline]
    fn select(condition: bool, a: Self, b: Self) -> Self {
        Self {
            key: select_unpredictable(condition, a.key, b.key),
            tie: select_unpredictable(condition, a.tie, b.tie),
        }
    }
}

/// How many values past the head [`PrimitiveCursor::advance`] prefetches: one 64-byte cache
/// line of `i64`s.
const PREFETCH_AHEAD: usize = 8;

/// Asks the CPU to start loading the cache line holding `address` into L1.
///
/// Each input's key column is read as a separate stream; with hundreds of inputs the
/// hardware prefetcher does not follow them, and the winner's next key is the load every
/// replay waits for. An input wins again only after the others had their turns, so a line
/// requested when it advances has arrived by then (`merge/256x1M/kway`: +17%).
#[inline]
#[allow(unsafe_code, reason = "a prefetch hint; see SAFETY")]
fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const { assert!(cfg!(target_feature = "sse"), "SSE is x86_64 baseline") };
        // SAFETY: `_mm_prefetch` is a hint that never dereferences its argument (any address
        // is allowed, out of bounds included), and it only requires SSE, which every x86_64
        // CPU has (checked at compile time above).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address.cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

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
            flip: if config.descending { u64::MAX } else { 0 },
            row: 0,
        })
    }

    /// On the native values when the key column is as expected (a batch where it is not is
    /// rejected by [`Cursor::open`]; its encoded keys are checked meanwhile).
    fn first_unordered(config: &PrimitiveConfig, batch: &KeyedBatch) -> Option<usize> {
        let column = batch.batch.columns().get(config.column);
        let array = column.and_then(|c| c.as_primitive_opt::<P>());
        let Some(array) = array.filter(|a| a.null_count() == 0) else {
            return first_unordered(&batch.keys);
        };
        let flip = if config.descending { u64::MAX } else { 0 };
        let bits = |v: P::Native| v.order_bits() ^ flip;
        (array.values().windows(2))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int32Array, RecordBatch, StringArray, UInt8Array};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::key::KeyColumn;
    use crate::merge::testing::{int_key, int_rows, keyed};

    /// A cursor of type `C` on `batch`, moved to `row`.
    fn at<C: Cursor>(config: &C::Config, batch: &KeyedBatch, row: usize) -> C {
        let mut cursor = C::open(config, batch).unwrap();
        cursor.advance(row);
        cursor
    }

    /// With `a` as input 0 and `b` as input 1, for every pair of heads: `C` ranks them like
    /// `(encoded key, input)`, and counts the rows of `a` before `b`'s head likewise; an
    /// exhausted input loses to a live one. Both batches are admitted to `config` first.
    fn agrees_with_keys<C: Cursor>(config: &C::Config, a: &KeyedBatch, b: &KeyedBatch) {
        let mut config = config.clone();
        C::admit(&mut config, a);
        C::admit(&mut config, b);
        let config = &config;
        for ra in 0..a.num_rows() {
            for rb in 0..b.num_rows() {
                let cursors = [Some(at::<C>(config, a, ra)), Some(at::<C>(config, b, rb))];
                let [Some(ca), Some(cb)] = &cursors else {
                    unreachable!()
                };
                let (ea, eb) = (ca.entry(0), cb.entry(1));
                let bound = (b.keys.value(rb), 1);
                let expected = (a.keys.value(ra), 0) < bound;
                assert_eq!(C::beats(ea, eb, &cursors), expected, "rows {ra} {rb}");
                assert_eq!(C::beats(eb, ea, &cursors), !expected, "rows {ra} {rb}");
                assert_eq!((ea.input(), eb.input()), (0, 1));
                assert!(!ea.is_exhausted());
                for max in [1, 2, 3, 100] {
                    let before = (ra..a.num_rows())
                        .take(max)
                        .take_while(|&r| (a.keys.value(r), 0) < bound)
                        .count();
                    if expected {
                        assert_eq!(ca.rows_before(0, eb, max, &cursors), before);
                    }
                }
            }
        }
        let cursors = [Some(C::open(config, a).unwrap()), None];
        let (live, done) = (
            cursors[0].as_ref().unwrap().entry(0),
            KeyEntry::exhausted(1),
        );
        assert!(C::beats(live, done, &cursors) && !C::beats(done, live, &cursors));
        assert!(done.is_exhausted() && done.input() == 1);
        let rows = a.num_rows();
        assert_eq!(
            cursors[0]
                .as_ref()
                .unwrap()
                .rows_before(0, done, 100, &cursors),
            rows
        );
    }

    #[test]
    fn primitive_entries_rank_by_exhaustion_then_key_then_input() {
        let config = |descending| PrimitiveConfig {
            column: 0,
            descending,
        };
        let pk = int_key(false);
        let keys = [i64::MIN, -1, 0, 1, i64::MAX];
        let batch = int_rows(&pk, &keys);
        let last = (1 << 63) - 1;
        for descending in [false, true] {
            let mut entries = Vec::new();
            for input in [0, 1, last] {
                for (row, &key) in keys.iter().enumerate() {
                    let cursor = at::<I64Cursor>(&config(descending), &batch, row);
                    entries.push((cursor.entry(input), (false, key, input)));
                }
                entries.push((KeyEntry::exhausted(input), (true, 0, input)));
            }
            // Sorting the entries sorts by (exhausted, key in key order, input).
            entries.sort_by_key(|&(entry, _)| entry.rank());
            let got: Vec<_> = entries.iter().map(|&(_, unpacked)| unpacked).collect();
            let mut expected = got.clone();
            expected.sort_by(|a, b| {
                let key = if descending {
                    b.1.cmp(&a.1)
                } else {
                    a.1.cmp(&b.1)
                };
                a.0.cmp(&b.0).then(key).then(a.2.cmp(&b.2))
            });
            assert_eq!(got, expected, "descending {descending}");
            for (entry, (exhausted, _, input)) in entries {
                assert_eq!(entry.input(), input);
                assert_eq!(entry.is_exhausted(), exhausted);
            }
        }
        // Narrow types map through the same bits: the order of every i8 and u8.
        let i8s: Vec<u64> = (i8::MIN..=i8::MAX).map(OrderBits::order_bits).collect();
        let u8s: Vec<u64> = (u8::MIN..=u8::MAX).map(OrderBits::order_bits).collect();
        for bits in [i8s, u8s] {
            assert!(bits.windows(2).all(|w| w[0] < w[1]));
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
        // Each batch in key order, as inputs are: the values reversed when descending.
        let batch = |mut i: Vec<i32>, descending: bool| {
            if descending {
                i.reverse();
            }
            let s = StringArray::from(vec!["x"; i.len()]);
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(s), Arc::new(Int32Array::from(i))],
            )
            .unwrap()
        };
        for descending in [false, true] {
            let column = if descending {
                KeyColumn::desc("i")
            } else {
                KeyColumn::asc("i")
            };
            let pk = PrimaryKey::new(&schema, vec![column]).unwrap();
            let a = keyed(&pk, batch(vec![i32::MIN, -3, 0, 7], descending));
            let b = keyed(&pk, batch(vec![-3, 1, 7, i32::MAX], descending));
            let config = PrimitiveConfig {
                column: 1,
                descending,
            };
            agrees_with_keys::<I32Cursor>(&config, &a, &b);
            agrees_with_keys::<RowCursor>(&RowConfig::default(), &a, &b);
        }
    }

    /// Keys as raw bytes, for the row cursor (which never looks at the table rows).
    fn raw_keys(keys: &[&[u8]]) -> KeyedBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("i", DataType::Int32, false)]));
        let rows = Int32Array::from_iter_values(0..keys.len() as i32);
        KeyedBatch {
            batch: RecordBatch::try_new(schema, vec![Arc::new(rows)]).unwrap(),
            keys: BinaryArray::from(keys.to_vec()),
        }
    }

    /// Every pair of heads of inputs `0..n` (one per batch, all admitted to one config),
    /// exhausted inputs `n..n + 2` included, ranks like `(exhausted, key bytes, input)`;
    /// and `rows_before` counts like the bytes do.
    fn row_entries_agree_with_bytes(batches: &[KeyedBatch]) {
        let mut config = RowConfig::default();
        for batch in batches {
            RowCursor::admit(&mut config, batch);
        }
        // (cursors, the unpacked rank of each input's head)
        let heads = |rows: &[usize]| {
            let mut cursors: Vec<Option<RowCursor>> = (batches.iter().zip(rows))
                .map(|(b, &r)| Some(at::<RowCursor>(&config, b, r)))
                .collect();
            cursors.extend([None, None]);
            cursors
        };
        let rank = |batch: Option<&KeyedBatch>, row: usize, input: usize| match batch {
            Some(b) => (false, b.keys.value(row).to_vec(), input),
            None => (true, Vec::new(), input),
        };
        let n = batches.len();
        for first in 0..n {
            for row in 0..batches[first].num_rows() {
                // Input `first` at `row`, every other input at each of its rows in turn.
                for other in 0..n + 2 {
                    let other_rows = batches.get(other).map_or(1, KeyedBatch::num_rows);
                    for other_row in 0..other_rows {
                        if other == first {
                            continue;
                        }
                        let mut rows = vec![0; n];
                        rows[first] = row;
                        if other < n {
                            rows[other] = other_row;
                        }
                        let cursors = heads(&rows);
                        let entry = |i: usize| match &cursors[i] {
                            Some(c) => c.entry(i),
                            None => KeyEntry::exhausted(i),
                        };
                        let (a, b) = (entry(first), entry(other));
                        let ra = rank(Some(&batches[first]), row, first);
                        let rb = rank(batches.get(other), other_row, other);
                        let what = format!("{ra:?} vs {rb:?}, skip {}", config.skip);
                        assert_eq!(RowCursor::beats(a, b, &cursors), ra < rb, "{what}");
                        assert_eq!(RowCursor::beats(b, a, &cursors), rb < ra, "{what}");
                        assert_eq!(b.is_exhausted(), other >= n);
                        assert_eq!((a.input(), b.input()), (first, other));
                        if ra < rb {
                            let head = cursors[first].as_ref().unwrap();
                            let before = (row..batches[first].num_rows())
                                .take_while(|&r| rank(Some(&batches[first]), r, first) < rb)
                                .count();
                            assert_eq!(head.rows_before(first, b, 100, &cursors), before, "{what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_prefix_entries_rank_like_the_bytes() {
        // Shorter than 8 bytes, prefixes of each other, zero tails that pad like the
        // padding, equal 8-byte prefixes with different tails, all-0xFF prefixes.
        let a: &[&[u8]] = &[
            b"",
            b"\0",
            b"\0\0\0\0\0\0\0\0",
            b"\0\0\0\0\0\0\0\0\0",
            b"\x01",
        ];
        let b: &[&[u8]] = &[
            b"\0\0",
            b"\x01\x02\x03\x04\x05\x06\x07\x08",
            b"\x01\x02\x03\x04\x05\x06\x07\x08\x00",
            b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
            b"\x01\x02\x03\x04\x05\x06\x07\x08\x0a\x00",
        ];
        let c: &[&[u8]] = &[
            b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
            b"\x01\x02\x03\x04\x05\x06\x07\x09",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\x00",
        ];
        row_entries_agree_with_bytes(&[raw_keys(a), raw_keys(b), raw_keys(c)]);
        // Keys sharing leading bytes, so the prefixes skip them: with and without a batch
        // that narrows the skip.
        let d: &[&[u8]] = &[
            b"\x07\x07\x07\x00",
            b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08\x09",
        ];
        let e: &[&[u8]] = &[
            b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08",
            b"\x07\x07\x07\x02",
        ];
        let f: &[&[u8]] = &[
            b"\x07\x07\x06",
            b"\x07\x07\x07\x01\x02\x03\x04\x05\x06\x07\x08\x08",
        ];
        row_entries_agree_with_bytes(&[raw_keys(d), raw_keys(e)]);
        row_entries_agree_with_bytes(&[raw_keys(d), raw_keys(e), raw_keys(f)]);
    }

    #[test]
    fn row_prefix_entries_rank_composite_keys_with_nulls_and_descending_columns() {
        // (s Utf8 asc, i Int32 desc, nulls largest), and (i Int32 desc nulls first, s asc):
        // many heads share their first 8 bytes.
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int32, true),
        ]));
        let rows = |s: Vec<Option<&str>>, i: Vec<Option<i32>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(s)),
                    Arc::new(Int32Array::from(i)),
                ],
            )
            .unwrap()
        };
        let orders = [
            vec![KeyColumn::asc("s"), KeyColumn::desc("i")],
            vec![
                KeyColumn::desc("i").with_nulls_first(true),
                KeyColumn::asc("s"),
            ],
        ];
        for columns in orders {
            let pk = PrimaryKey::new(&schema, columns).unwrap();
            let sorted = |batch: RecordBatch| {
                let keys = pk.encode(&batch).unwrap();
                let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
                order.sort_by_key(|&r| keys.value(r as usize).to_vec());
                let batch = arrow_select::take::take_record_batch(
                    &batch,
                    &arrow_array::UInt32Array::from(order),
                );
                keyed(&pk, batch.unwrap())
            };
            let long = "a long string past eight bytes";
            let a = sorted(rows(
                vec![None, Some(""), Some("a"), Some(long), Some("a"), None],
                vec![Some(1), Some(1), None, Some(2), Some(-7), None],
            ));
            let b = sorted(rows(
                vec![Some("a"), Some(long), Some("b"), None, Some("")],
                vec![Some(1), None, Some(3), Some(1), None],
            ));
            row_entries_agree_with_bytes(&[a, b]);
        }
    }

    #[test]
    fn the_skip_shrinks_to_the_bytes_every_admitted_key_shares() {
        let mut config = RowConfig::default();
        assert!(!config.admit(&BinaryArray::from(vec![&b"abcx"[..], b"abcy"])));
        assert_eq!(config.skip, 3);
        // Inside the shared bytes: nothing changes. A single key keeps them too.
        assert!(!config.admit(&BinaryArray::from(vec![&b"abca"[..], b"abcz"])));
        assert!(!config.admit(&BinaryArray::from(vec![&b"abc"[..]])));
        assert_eq!(config.skip, 3);
        // A batch whose own keys share less, or that starts elsewhere: entries are stale.
        assert!(config.admit(&BinaryArray::from(vec![&b"abd"[..], b"abz"])));
        assert_eq!(config.skip, 2);
        assert!(config.admit(&BinaryArray::from(vec![&b"b"[..]])));
        assert_eq!(config.skip, 0);
        assert!(!config.admit(&BinaryArray::from(vec![&b""[..], b"c"])));
    }

    #[test]
    fn gallop_finds_the_end_of_every_prefix() {
        for n in 1..40 {
            for end in 1..=n {
                assert_eq!(gallop(n, |i| i < end), end, "n {n} end {end}");
            }
        }
        assert_eq!(gallop(0, |_| unreachable!()), 0);
    }

    #[test]
    fn the_primitive_order_check_agrees_with_the_encoded_keys() {
        let schema = Arc::new(Schema::new(vec![Field::new("i", DataType::Int32, false)]));
        let cases: [&[i32]; 6] = [
            &[],
            &[5],
            &[i32::MIN, -1, 0, 1, i32::MAX],
            &[1, 2, 2, 3],
            &[3, 2, 1, 0, -1],
            &[-4, 7, 9, -2, 10],
        ];
        for values in cases {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int32Array::from(values.to_vec()))],
            )
            .unwrap();
            for descending in [false, true] {
                let column = if descending {
                    KeyColumn::desc("i")
                } else {
                    KeyColumn::asc("i")
                };
                let pk = PrimaryKey::new(&schema, vec![column]).unwrap();
                let batch = keyed(&pk, batch.clone());
                let config = PrimitiveConfig {
                    column: 0,
                    descending,
                };
                let expected = first_unordered(&batch.keys);
                assert_eq!(I32Cursor::first_unordered(&config, &batch), expected);
                // Not the expected column type: falls back to the encoded keys.
                assert_eq!(I64Cursor::first_unordered(&config, &batch), expected);
            }
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
