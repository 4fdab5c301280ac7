//! A cache of decoded blocks, bounded in bytes.
//!
//! A backfill reopens its per-vnode scans at every barrier, from each vnode's position: the
//! block a scan stopped in is read again at the next epoch. Keeping recently decoded blocks
//! makes those restarts cost a lookup instead of a read, a checksum, a decode and a key
//! encoding. Eviction is first-in first-out: the working set (one block per source per
//! vnode) is revisited in a cycle, which FIFO handles as well as LRU at less cost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;

use crate::store::run::Run;

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
    blocks: HashMap<Key, (Arc<Run>, usize)>,
    order: VecDeque<Key>,
    bytes: usize,
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
    pub fn get(&self, key: Key) -> Option<Arc<Run>> {
        let inner = self.inner.lock().ok()?;
        inner.blocks.get(&key).map(|(run, _)| run.clone())
    }

    /// Keeps a decoded block, evicting the oldest ones beyond the budget.
    pub fn insert(&self, key: Key, run: Arc<Run>, bytes: usize) {
        if bytes > self.budget / 4 {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.blocks.insert(key, (run, bytes)).is_some() {
            return;
        }
        inner.order.push_back(key);
        inner.bytes += bytes;
        while inner.bytes > self.budget {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, b)) = inner.blocks.remove(&old) {
                inner.bytes -= b;
            }
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

    fn run() -> Arc<Run> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        Arc::new(Run {
            data: KeyedBatch {
                batch,
                keys: BinaryArray::from_iter_values([b"a"]),
            },
            deleted: None,
        })
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
