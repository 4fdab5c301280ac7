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
//! the key columns alone of every change file ([`changed_keys`]) into a [`KeyFilter`]. That
//! read reports nothing: a file it cannot read as expected only means no rows are left out,
//! and the validation's own pass meets (and names) the problem.

use arrow_array::ArrayRef;
use parquet::arrow::ProjectionMask;

use super::dataset::Dataset;
use super::files;
use crate::key::PrimaryKey;
use crate::vnode::mix64_rows;

/// Rows per batch of the key-column read.
const BATCH_ROWS: usize = 64 * 1024;

/// Bits of a [`KeyFilter`] per key hash it is given (at least; the size is a power of two):
/// at most one key in 64 not given is taken for one given.
const BITS_PER_KEY: usize = 64;

/// A set of 64-bit key hashes ([`mix64_rows`] of the key columns) as a bitmap indexed by a
/// hash's high bits. It never misses a hash it was given; it may hold one it was not (at
/// most about one in [`BITS_PER_KEY`]), which costs the validation one row sorted for
/// nothing, never a check.
#[derive(Debug, Clone)]
pub(crate) struct KeyFilter {
    words: Vec<u64>,
    /// A hash's bit is `hash >> shift`.
    shift: u32,
}

impl KeyFilter {
    /// A filter holding `hashes`.
    pub fn new(hashes: &[u64]) -> Self {
        let bits = hashes
            .len()
            .saturating_mul(BITS_PER_KEY)
            .max(64)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
        let mut filter = Self {
            words: vec![0; bits / 64],
            shift: 64 - bits.trailing_zeros(),
        };
        for &hash in hashes {
            let bit = filter.bit(hash);
            if let Some(word) = filter.words.get_mut(bit / 64) {
                *word |= 1 << (bit % 64);
            }
        }
        filter
    }

    fn bit(&self, hash: u64) -> usize {
        // `shift` is at least 1 (a filter has at most 2^63 bits): the result fits a usize
        // of 64 bits, and is below the filter's bit count.
        (hash >> self.shift) as usize
    }

    /// Whether `hash` may be one the filter was given (always, if it was).
    pub fn may_contain(&self, hash: u64) -> bool {
        let bit = self.bit(hash);
        (self.words.get(bit / 64)).is_some_and(|word| word >> (bit % 64) & 1 == 1)
    }
}

/// The hashes of every key the changelog of `dataset` holds (see the module docs), keyed
/// by `pk`; `None` when a change file cannot be read so, or does not have the dataset's
/// columns after `_epoch` and `_op`: the validation then leaves no row out.
pub(crate) fn changed_keys(dataset: &Dataset, pk: &PrimaryKey) -> Option<KeyFilter> {
    let table = dataset.schema();
    // The table's columns follow `_epoch` and `_op` in a change file.
    let roots: Vec<usize> = pk.indices().iter().map(|&i| i + 2).collect();
    let mut in_file_order = roots.clone();
    in_file_order.sort_unstable();
    // The projection keeps the file's column order; the hash takes the key's.
    let order = (roots.iter())
        .map(|root| in_file_order.binary_search(root).ok())
        .collect::<Option<Vec<usize>>>()?;
    let mut hashes = Vec::new();
    for path in dataset.change_files() {
        let builder = files::builder(path).ok()?;
        let fields = builder.schema().fields();
        if fields.len() != table.fields().len() + 2
            || !files::same_columns(&fields[2..], table.fields())
        {
            return None;
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let rows = files::batch_rows(
            builder.metadata(),
            BATCH_ROWS,
            files::BATCH_BYTES_PER_COLUMN,
        );
        let reader = builder
            .with_projection(mask)
            .with_batch_size(rows)
            .build()
            .ok()?;
        for batch in reader {
            let batch = batch.ok()?;
            let columns = (order.iter())
                .map(|&i| batch.columns().get(i).cloned())
                .collect::<Option<Vec<ArrayRef>>>()?;
            hashes.extend(mix64_rows(&columns, batch.num_rows()).ok()?);
        }
    }
    Some(KeyFilter::new(&hashes))
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

    #[test]
    fn a_filter_holds_every_hash_it_was_given_and_few_others() {
        let given: Vec<u64> = (0..10_000).map(key_hash).collect();
        let filter = KeyFilter::new(&given);
        assert!(given.iter().all(|&h| filter.may_contain(h)));
        let others = (10_000..110_000)
            .filter(|&k| filter.may_contain(key_hash(k)))
            .count();
        // One in 64 expected (at most: the size rounds up); a broken index would hold all.
        assert!(others < 100_000 / 32, "{others} of 100000 keys not given");
        let empty = KeyFilter::new(&[]);
        assert!((0..1000).all(|k| !empty.may_contain(key_hash(k))));
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
        let filter = changed_keys(&data, desc.pk()).unwrap();
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
        assert!(changed_keys(&data, desc.pk()).is_some());
        std::fs::remove_file(&data.change_files()[0]).unwrap();
        assert!(changed_keys(&data, desc.pk()).is_none());
    }
}
