//! The keys a changelog touches, read before the validation reads the snapshot.
//!
//! The validation sorts rows by key to fold each key's rows in stream order (`by_key.rs`).
//! A snapshot row whose key no change touches has nothing to fold but itself: the only rule
//! it can break is a duplicate key. While the snapshot comes in strictly increasing key
//! order (as a dump of an arrangement does) no key repeats, so such rows need no sort at
//! all: the validation leaves them out and sorts only the snapshot rows the changelog may
//! touch, with the changelog (see [`super::by_key::KeyedChanges::skip_untouched_snapshot_rows`]).
//!
//! To know which rows those are before the snapshot comes in, the validation first reads
//! the key columns alone of every change file ([`changed_keys`]) into a [`KeyFilter`], in
//! memory it caps (a changelog too long for it gets no filter). That read reports nothing:
//! a file it cannot read as expected only means no rows are left out, and the validation's
//! own pass meets (and names) the problem.

use arrow_array::ArrayRef;
use parquet::arrow::ProjectionMask;

use super::changelog::check_schema;
use super::dataset::Dataset;
use super::files;
use crate::key::PrimaryKey;
use crate::vnode::mix64_rows;

/// Rows per batch of the key-column read.
const BATCH_ROWS: usize = 64 * 1024;

/// Bits of a [`KeyFilter`] per change row (at least; the size is a power of two): at most
/// one key in 64 not given is taken for one given.
const BITS_PER_KEY: u64 = 64;

/// The fewest bits per change row a filter may have when its memory is capped: below, one
/// untouched key in 8 or more would be sorted anyway.
const MIN_BITS_PER_KEY: u64 = 8;

/// A set of 64-bit key hashes ([`mix64_rows`] of the key columns) as a bitmap indexed by a
/// hash's high bits. It never misses a hash it was given; it may hold one it was not (about
/// one in [`BITS_PER_KEY`]), which costs the validation one row sorted for nothing, never a
/// check.
#[derive(Debug, Clone)]
pub(crate) struct KeyFilter {
    words: Vec<u64>,
    /// A hash's bit is `hash >> shift`.
    shift: u32,
}

impl KeyFilter {
    /// An empty filter for `keys` hashes, of [`BITS_PER_KEY`] bits a key (rounded up to a
    /// power of two) or, to stay within `max_bytes`, fewer; `None` if that would be fewer
    /// than [`MIN_BITS_PER_KEY`].
    pub fn for_keys(keys: u64, max_bytes: usize) -> Option<Self> {
        let max_bits = u64::try_from(max_bytes).ok()?.saturating_mul(8);
        let mut bits = keys
            .saturating_mul(BITS_PER_KEY)
            .max(64)
            .checked_next_power_of_two()?;
        while bits > max_bits && bits / 2 >= keys.saturating_mul(MIN_BITS_PER_KEY).max(64) {
            bits /= 2;
        }
        if bits > max_bits {
            return None;
        }
        Some(Self {
            words: vec![0; usize::try_from(bits / 64).ok()?],
            shift: 64 - bits.trailing_zeros(),
        })
    }

    fn bit(&self, hash: u64) -> usize {
        // `shift` is at least 1 (a filter has at most 2^63 bits) and the filter's bits fit a
        // usize (its words do): the result is below the filter's bit count.
        (hash >> self.shift) as usize
    }

    /// Adds `hash`.
    pub fn insert(&mut self, hash: u64) {
        let bit = self.bit(hash);
        if let Some(word) = self.words.get_mut(bit / 64) {
            *word |= 1 << (bit % 64);
        }
    }

    /// Whether `hash` may be one the filter was given (always, if it was).
    pub fn may_contain(&self, hash: u64) -> bool {
        let bit = self.bit(hash);
        (self.words.get(bit / 64)).is_some_and(|word| word >> (bit % 64) & 1 == 1)
    }
}

/// The hashes of every key the changelog of `dataset` holds (see the module docs), keyed
/// by `pk`, in at most `max_bytes`; `None` when a change file cannot be read so, or does
/// not have the dataset's columns after `_epoch` and `_op`, or the changelog has too many
/// rows for `max_bytes` ([`KeyFilter::for_keys`]): the validation then leaves no row out.
pub(crate) fn changed_keys(
    dataset: &Dataset,
    pk: &PrimaryKey,
    max_bytes: usize,
) -> Option<KeyFilter> {
    let table = dataset.schema();
    // Key types the hash does not take (dictionaries): no filter, and no read of them.
    if (pk.indices().iter()).any(|&i| {
        let field = table.field(i);
        crate::vnode::check_hashable(field.name(), field.data_type()).is_err()
    }) {
        return None;
    }
    // The table's columns follow `_epoch` and `_op` in a change file.
    let roots: Vec<usize> = pk.indices().iter().map(|&i| i + 2).collect();
    let mut in_file_order = roots.clone();
    in_file_order.sort_unstable();
    // The projection keeps the file's column order; the hash takes the key's.
    let order = (roots.iter())
        .map(|root| in_file_order.binary_search(root).ok())
        .collect::<Option<Vec<usize>>>()?;
    // The filter's size from the files' row counts (their footers), then their keys, one
    // file open at a time.
    let mut rows = 0u64;
    for path in dataset.change_files() {
        let builder = files::builder(path).ok()?;
        check_schema(path, builder.schema(), table).ok()?;
        rows += u64::try_from(builder.metadata().file_metadata().num_rows()).ok()?;
    }
    let mut filter = KeyFilter::for_keys(rows, max_bytes)?;
    for path in dataset.change_files() {
        let builder = files::builder(path).ok()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let batch_rows = files::batch_rows(
            builder.metadata(),
            BATCH_ROWS,
            files::BATCH_BYTES_PER_COLUMN,
        );
        let reader = (builder.with_projection(mask))
            .with_batch_size(batch_rows)
            .build()
            .ok()?;
        for batch in reader {
            let batch = batch.ok()?;
            let columns = (order.iter())
                .map(|&i| batch.columns().get(i).cloned())
                .collect::<Option<Vec<ArrayRef>>>()?;
            for hash in mix64_rows(&columns, batch.num_rows()).ok()? {
                filter.insert(hash);
            }
        }
    }
    Some(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::testing::{MANIFEST, changes, dataset, rows};
    use crate::vnode::VnodeCount;
    use arrow_array::Int64Array;
    use std::sync::Arc;

    fn key_hash(k: i64) -> u64 {
        let column: ArrayRef = Arc::new(Int64Array::from(vec![k]));
        mix64_rows(&[column], 1).unwrap()[0]
    }

    fn filter_of(keys: std::ops::Range<i64>, max_bytes: usize) -> Option<KeyFilter> {
        let mut filter = KeyFilter::for_keys(keys.end.abs_diff(keys.start), max_bytes)?;
        keys.for_each(|k| filter.insert(key_hash(k)));
        Some(filter)
    }

    #[test]
    fn a_filter_holds_every_hash_it_was_given_and_few_others() {
        let filter = filter_of(0..10_000, 1 << 20).unwrap();
        assert!((0..10_000).all(|k| filter.may_contain(key_hash(k))));
        let others = (10_000..110_000)
            .filter(|&k| filter.may_contain(key_hash(k)))
            .count();
        // One in 64 expected (at most: the size rounds up); a broken index would hold all.
        assert!(others < 100_000 / 32, "{others} of 100000 keys not given");
        let empty = KeyFilter::for_keys(0, 1 << 20).unwrap();
        assert!((0..1000).all(|k| !empty.may_contain(key_hash(k))));
    }

    /// A filter kept under a memory cap has fewer bits a key (more keys taken for given
    /// ones), down to a floor under which there is none.
    #[test]
    fn a_capped_filter_is_smaller_or_none() {
        // 10000 keys: 2^20 bits at 64 a key; capped at 2^17 bits (16 KiB), 13 a key.
        let capped = filter_of(0..10_000, 16 << 10).unwrap();
        assert_eq!(capped.words.len() * 64, 1 << 17);
        assert!((0..10_000).all(|k| capped.may_contain(key_hash(k))));
        let others = (10_000..110_000)
            .filter(|&k| capped.may_contain(key_hash(k)))
            .count();
        assert!(others < 100_000 / 5, "{others} of 100000 keys not given");
        // Fewer than 8 bits a key would not fit 8 KiB.
        assert!(KeyFilter::for_keys(10_000, 8 << 10).is_none());
    }

    #[test]
    fn the_changed_keys_are_those_of_every_change_file() {
        let dir = dataset(
            MANIFEST,
            &[rows("1 a\n2 b\n3 c")],
            &[
                changes(&[(7, "+ 4 d\nU- 1 a\nU+ 1 x")]),
                changes(&[(9, "- 2 b")]),
            ],
        );
        let data = Dataset::open(dir.path()).unwrap();
        let desc = data.table_desc(VnodeCount::DEFAULT).unwrap();
        let filter = changed_keys(&data, desc.pk(), 1 << 20).unwrap();
        for k in [1, 2, 4] {
            assert!(filter.may_contain(key_hash(k)), "key {k}");
        }
        // Key 3 is touched by no change (a false positive is possible, not with these).
        assert!(!filter.may_contain(key_hash(3)));
    }

    #[test]
    fn a_change_file_that_cannot_be_read_leaves_no_filter() {
        let dir = dataset(MANIFEST, &[rows("1 a")], &[changes(&[(1, "+ 2 b")])]);
        let data = Dataset::open(dir.path()).unwrap();
        let desc = data.table_desc(VnodeCount::DEFAULT).unwrap();
        assert!(changed_keys(&data, desc.pk(), 1 << 20).is_some());
        std::fs::remove_file(&data.change_files()[0]).unwrap();
        assert!(changed_keys(&data, desc.pk(), 1 << 20).is_none());
    }
}
