//! The cursor over encoded keys (arrow-row bytes): normalized key prefixes, then `memcmp`.

use arrow_array::{Array, BinaryArray};

use super::{Cursor, EXHAUSTED, KeyEntry, PREFETCH_AHEAD, gallop, prefetch};
use crate::error::Result;
use crate::runs::Run;

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
    pub(super) skip: usize,
    /// False until a batch is admitted.
    started: bool,
}

impl RowConfig {
    /// Narrows `skip` to the bytes `batch`'s keys (in key order, not empty) share with every
    /// key admitted before. True when `skip` shrank after the first batch.
    pub(super) fn admit(&mut self, first: &[u8], last: &[u8]) -> bool {
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

    fn open(config: &RowConfig, run: &Run) -> Result<Self> {
        let (shared, start) = run.rows();
        Ok(Self {
            keys: shared.data.keys.slice(start, run.len()),
            row: 0,
            skip: config.skip,
        })
    }

    fn admit(config: &mut RowConfig, run: &Run) -> bool {
        match (run.first_key(), run.last_key()) {
            (Some(first), Some(last)) => config.admit(first, last),
            _ => false,
        }
    }

    fn refresh(&mut self, config: &RowConfig) {
        self.skip = config.skip;
    }

    fn first_unordered(_: &RowConfig, run: &Run) -> Option<usize> {
        run.first_unordered()
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
