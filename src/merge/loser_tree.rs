//! Which input holds the smallest head: a loser tree (tournament tree) over `k` inputs.
//!
//! The inputs are the leaves of a complete binary tree; every internal node remembers the
//! *loser* of the match played there, and the overall winner sits above the root. When the
//! winner's head changes, only the matches on its path to the root are replayed:
//! `ceil(log2 k)` comparisons per row, against `2 log2 k` for a binary heap's sift-down.
//!
//! ```text
//!   k = 4, heads: in0=5 in1=2 in2=7 in3=3           node 0: winner   in1 (2)
//!                                                   node 1: loser    in3 (3)   final
//!   leaves are virtual: input i is leaf k + i,       node 2: loser    in0 (5)   in0 vs in1
//!   the parent of node n is n / 2                   node 3: loser    in2 (7)   in2 vs in3
//!
//!   in1 advances to 9: replay leaf 5 -> node 2 (vs in0: in0 wins, in1 stays as loser)
//!                      -> node 1 (in0 vs in3: in3 wins, in0 stays) -> node 0 = in3
//! ```
//!
//! **Nodes hold entries, not input numbers.** A node stores an *entry* `E`: a small `Copy`
//! value that names an input and carries its head key as well, or for the row cursor the
//! key's 8-byte prefix (see `cursor.rs`: `KeyEntry`, the rank `(key, exhausted, input)` in two
//! words that compare as one `u128`). A replay then
//! compares the climbing entry with the entry parked at each node: the node's address
//! depends only on the leaf, never on an earlier comparison, and the key is right there, so
//! the loads of the whole path can be in flight at once instead of chasing
//! node -> input -> cursor -> buffer -> value. The select after each comparison is
//! [`Entry::select`], a conditional move ([`select_unpredictable`]), because which side wins
//! is a coin toss for spread keys and a mispredicted branch per level was most of the merge's
//! time. (The row cursor's comparison still branches on whether two prefixes are equal, which
//! is predictable: rarely, with spread keys.)
//!
//! The order is a strict total order on entries, decided by a `beats(a, b)` function (`a`
//! comes strictly before `b`) that the caller passes in:
//! - an exhausted input loses to every live input (two exhausted inputs: lower index wins, so
//!   the order stays total);
//! - live heads compare by key; **equal keys: the lower input index wins**, so output is
//!   deterministic whatever the replay history.
//!
//! [`LoserTree::runner_up`] finds the second best without changing anything: the best of the
//! losers on the winner's path (each is the best of the subtree the winner did not come
//! from). The merge uses it to emit a winner's run of rows without replaying per row.
//!
//! [`select_unpredictable`]: std::hint::select_unpredictable

/// What a [`LoserTree`] node holds: a small value picked between two without a branch.
pub trait Entry: Copy {
    /// `a` if `condition`, else `b`, as a conditional move.
    fn select(condition: bool, a: Self, b: Self) -> Self;
}

/// A loser tree over `k` inputs. See the module docs.
#[derive(Debug)]
pub struct LoserTree<E> {
    /// `nodes[0]` is the winner, `nodes[1..k]` the losers of the internal nodes.
    nodes: Vec<E>,
}

impl<E: Entry> LoserTree<E> {
    /// A tree over one entry per input (input `i` is `entries[i]`), every match played.
    pub fn new(entries: &[E], beats: impl Fn(E, E) -> bool) -> Self {
        let mut tree = Self {
            nodes: entries.to_vec(),
        };
        if let Some(&first) = entries.first() {
            tree.nodes[0] = if entries.len() == 1 {
                first
            } else {
                tree.play(1, entries, &beats)
            };
        }
        tree
    }

    /// Plays the subtree under `node` from scratch, parking losers; returns its winner.
    fn play(&mut self, node: usize, entries: &[E], beats: &impl Fn(E, E) -> bool) -> E {
        let k = entries.len();
        if node >= k {
            return entries[node - k];
        }
        let left = self.play(2 * node, entries, beats);
        let right = self.play(2 * node + 1, entries, beats);
        let (winner, loser) = if beats(right, left) {
            (right, left)
        } else {
            (left, right)
        };
        self.nodes[node] = loser;
        winner
    }

    /// The best entry (an exhausted input's only when all are), or `None` for a tree over
    /// no inputs.
    #[inline]
    pub fn winner(&self) -> Option<E> {
        self.nodes.first().copied()
    }

    /// Gives the winner, input `leaf`, its new entry (its head advanced, or it is exhausted)
    /// and replays its path.
    #[inline]
    pub fn replay(&mut self, leaf: usize, entry: E, beats: impl Fn(E, E) -> bool) {
        let mut climber = entry;
        let mut node = self.leaf_parent(leaf);
        while node != 0 {
            let parked = self.nodes[node];
            let swap = beats(parked, climber);
            self.nodes[node] = E::select(swap, climber, parked);
            climber = E::select(swap, parked, climber);
            node /= 2;
        }
        if let Some(top) = self.nodes.first_mut() {
            *top = climber;
        }
    }

    /// The second best entry, when the winner is input `leaf`: the best loser on its path.
    /// `None` with a single input.
    pub fn runner_up(&self, leaf: usize, beats: impl Fn(E, E) -> bool) -> Option<E> {
        let mut best: Option<E> = None;
        let mut node = self.leaf_parent(leaf);
        while node != 0 {
            let parked = self.nodes[node];
            best = Some(match best {
                Some(b) if beats(b, parked) => b,
                _ => parked,
            });
            node /= 2;
        }
        best
    }

    fn leaf_parent(&self, input: usize) -> usize {
        (self.nodes.len() + input) / 2
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// An entry as the primitive cursors build it, unpacked: `(exhausted, key, input)`.
    type Entry = (bool, i32, usize);

    impl super::Entry for Entry {
        fn select(condition: bool, a: Self, b: Self) -> Self {
            if condition { a } else { b }
        }
    }

    fn beats(a: Entry, b: Entry) -> bool {
        a < b
    }

    /// The entry of input `i` whose list is read up to `offset`.
    fn entry(lists: &[Vec<i32>], i: usize, offset: usize) -> Entry {
        match lists[i].get(offset) {
            Some(&key) => (false, key, i),
            None => (true, 0, i),
        }
    }

    /// Merges sorted lists with a loser tree: `(value, input)` in output order. With `runs`,
    /// a winner emits every value before the runner-up at once, as the merge does.
    fn merge(lists: &[Vec<i32>], runs: bool) -> Vec<(i32, usize)> {
        let mut offsets = vec![0; lists.len()];
        let entries: Vec<Entry> = (0..lists.len()).map(|i| entry(lists, i, 0)).collect();
        let mut tree = LoserTree::new(&entries, beats);
        let mut out = Vec::new();
        while let Some((false, _, w)) = tree.winner() {
            let bound = tree.runner_up(w, beats).filter(|_| runs);
            loop {
                out.push((lists[w][offsets[w]], w));
                offsets[w] += 1;
                let next = entry(lists, w, offsets[w]);
                match bound {
                    Some(bound) if !next.0 && beats(next, bound) => {}
                    _ => break,
                }
            }
            tree.replay(w, entry(lists, w, offsets[w]), beats);
        }
        out
    }

    /// The same by sorting: by value, then input.
    fn oracle(lists: &[Vec<i32>]) -> Vec<(i32, usize)> {
        let mut all: Vec<(i32, usize)> = lists
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.iter().map(move |&v| (v, i)))
            .collect();
        all.sort();
        all
    }

    #[test]
    fn no_inputs_have_no_winner() {
        let tree = LoserTree::<Entry>::new(&[], beats);
        assert_eq!(tree.winner(), None);
        assert_eq!(merge(&[], false), vec![]);
        let one = LoserTree::new(&[(false, 3, 0)], beats);
        assert_eq!(one.winner(), Some((false, 3, 0)));
        assert_eq!(one.runner_up(0, beats), None);
    }

    #[test]
    fn the_module_doc_example() {
        let lists = vec![vec![5], vec![2, 9], vec![7], vec![3]];
        let entries: Vec<Entry> = (0..4).map(|i| entry(&lists, i, 0)).collect();
        let tree = LoserTree::new(&entries, beats);
        assert_eq!(tree.winner(), Some((false, 2, 1)));
        assert_eq!(tree.runner_up(1, beats), Some((false, 3, 3)));
        let order: Vec<usize> = merge(&lists, false).into_iter().map(|(_, i)| i).collect();
        assert_eq!(order, vec![1, 3, 0, 2, 1]);
    }

    #[test]
    fn ties_go_to_the_lower_input_and_exhausted_inputs_lose() {
        let lists = vec![vec![], vec![1, 2, 2], vec![1, 2], vec![], vec![0, 2]];
        for runs in [false, true] {
            assert_eq!(
                merge(&lists, runs),
                vec![(0, 4), (1, 1), (1, 2), (2, 1), (2, 1), (2, 2), (2, 4)]
            );
        }
        assert_eq!(merge(&[vec![], vec![]], false), vec![]);
    }

    #[test]
    fn random_lists_merge_like_a_sort_with_and_without_runs() {
        let mut rng = StdRng::seed_from_u64(7);
        for k in [1, 2, 3, 5, 8, 13, 64, 100] {
            for clustered in [false, true] {
                let lists: Vec<Vec<i32>> = (0..k)
                    .map(|i| {
                        let len = rng.random_range(0..20);
                        // Clustered: input i mostly holds keys near 10 * i, so runs are long.
                        let base = if clustered { 10 * i } else { 0 };
                        let mut l: Vec<i32> =
                            (0..len).map(|_| base + rng.random_range(0..30)).collect();
                        l.sort();
                        l
                    })
                    .collect();
                for runs in [false, true] {
                    assert_eq!(merge(&lists, runs), oracle(&lists), "{lists:?}");
                }
            }
        }
    }
}
