//! A cache of decoded blocks, bounded in bytes.
//!
//! A backfill keeps its scans open across barriers: the changes a barrier brings to the rows
//! a vnode's scan has still to hand out are merged into that scan in memory (a patch, see
//! `merge/patch.rs`), nothing is read again. A scan is opened afresh from the store, from
//! the vnode's position, only when a barrier's patches would pass the patch budget
//! (`BackfillConfig::patch_budget`), when a resume or a throttle reopens every scan, or when
//! the snapshot starts again after a pause: then the block the old scan stopped in is read
//! again. The cache makes those reads, and the reads of the blocks of a packed batch (one
//! record batch that many vnodes' short runs share, cached as one), cost a lookup instead
//! of a read, a checksum, a decode and a key encoding. Eviction is first-in first-out: the
//! working set (one block per source per vnode) is revisited in a cycle, which FIFO handles
//! as well as LRU at less cost.
//!
//! An evicted block that a reader still holds stays findable: the cache keeps a weak
//! reference to it, which costs no memory the reader does not already hold. A k-way merge
//! over thousands of vnodes holds one block per vnode, more than the budget; when a vnode's
//! scan is opened afresh, the new scan finds the very block the old one holds (a restarted
//! merge input keeps its old scan until the new one has read) instead of reading and
//! decoding it again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use hashbrown::HashMap;

use crate::runs::Rows;

/// A block's identity: (file id, block index).
type Key = (u64, usize);

/// Decoded blocks, at most `budget` bytes of them.
#[derive(Debug)]
pub(crate) struct BlockCache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<Key, (Arc<Rows>, usize)>,
    order: VecDeque<Key>,
    bytes: usize,
    /// Evicted blocks that were still held elsewhere when evicted.
    held: HashMap<Key, Weak<Rows>>,
    /// `held` is swept of dead entries when it grows past this size.
    sweep_at: usize,
}

impl BlockCache {
    /// A cache of at most `budget` bytes (0 disables it).
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            budget,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The cached block, if any.
    pub fn get(&self, key: Key) -> Option<Arc<Rows>> {
        let mut inner = self.inner.lock().ok()?;
        if let Some((rows, _)) = inner.blocks.get(&key) {
            return Some(rows.clone());
        }
        let rows = inner.held.get(&key)?.upgrade();
        if rows.is_none() {
            inner.held.remove(&key);
        }
        rows
    }

    /// Keeps a decoded block, evicting the oldest ones beyond the budget.
    pub fn insert(&self, key: Key, rows: Arc<Rows>, bytes: usize) {
        if bytes > self.budget / 4 {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.blocks.insert(key, (rows, bytes)).is_some() {
            return;
        }
        inner.held.remove(&key);
        inner.order.push_back(key);
        inner.bytes += bytes;
        while inner.bytes > self.budget {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((rows, b)) = inner.blocks.remove(&old) {
                inner.bytes -= b;
                // `rows` is the cache's own reference: another means a reader holds it.
                if Arc::strong_count(&rows) > 1 {
                    inner.held.insert(old, Arc::downgrade(&rows));
                }
            }
        }
        if inner.held.len() > inner.sweep_at {
            inner.held.retain(|_, rows| rows.strong_count() > 0);
            // Amortized: the next sweep comes after as many insertions as entries survived.
            inner.sweep_at = (2 * inner.held.len()).max(1024);
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyedBatch;
    use arrow_array::{BinaryArray, Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    fn run() -> Arc<Rows> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        let keys = BinaryArray::from_iter_values([b"a"]);
        Rows::new(KeyedBatch { batch, keys }, None).unwrap()
    }

    #[test]
    fn an_evicted_block_a_reader_holds_is_still_found() {
        let cache = BlockCache::new(400);
        let held = run();
        cache.insert((1, 0), held.clone(), 100);
        cache.insert((1, 1), run(), 100);
        for i in 2..6 {
            cache.insert((1, i), run(), 100);
        }
        assert_eq!(cache.bytes(), 400, "the budget holds");
        let found = cache.get((1, 0)).expect("held by a reader");
        assert!(Arc::ptr_eq(&found, &held));
        assert!(cache.get((1, 1)).is_none(), "nobody held it: gone");
        drop((found, held));
        assert!(cache.get((1, 0)).is_none(), "released: gone");
    }

    #[test]
    fn evicts_the_oldest_beyond_the_budget() {
        let cache = BlockCache::new(400);
        for i in 0..5 {
            cache.insert((1, i), run(), 100);
        }
        assert_eq!(cache.bytes(), 400);
        assert!(cache.get((1, 0)).is_none());
        assert!(cache.get((1, 4)).is_some());
        cache.insert((2, 0), run(), 200);
        assert!(
            cache.get((2, 0)).is_none(),
            "too big for a quarter of the budget"
        );
    }
}
