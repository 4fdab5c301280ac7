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
//!
//! Files: this one holds the trait, its tree entry and the search both cursors use;
//! `primitive.rs` the integer cursor, `row.rs` the encoded-key cursor.

use std::hint::select_unpredictable;

use arrow_schema::DataType;

use crate::error::Result;
use crate::key::PrimaryKey;
use crate::merge::loser_tree::Entry;
use crate::runs::Run;

mod primitive;
mod row;

pub(crate) use primitive::{
    I8Cursor, I16Cursor, I32Cursor, I64Cursor, PrimitiveConfig, U8Cursor, U16Cursor, U32Cursor,
    U64Cursor,
};
pub(crate) use row::{RowConfig, RowCursor};

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

    /// A cursor on row 0 of `run` (not empty).
    fn open(config: &Self::Config, run: &Run) -> Result<Self>;

    /// Tells the merge's `config` about `run`, the next rows of some input (checked to be in
    /// key order, not empty), before a cursor is opened on them. True when the entries of
    /// cursors opened before are now stale: the merge then [refreshes](Cursor::refresh) every
    /// cursor and rebuilds the tree. (The row cursor narrows the bytes its prefixes skip.)
    fn admit(_config: &mut Self::Config, _run: &Run) -> bool {
        false
    }

    /// Brings a cursor opened before the last [`Cursor::admit`] up to date with `config`.
    fn refresh(&mut self, _config: &Self::Config) {}

    /// The first row of `run` whose key is not strictly above the one before it, judged the
    /// way this cursor compares (the input's order check, once per run).
    fn first_unordered(config: &Self::Config, run: &Run) -> Option<usize>;

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

#[cfg(test)]
mod tests;
