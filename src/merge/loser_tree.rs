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
//! The order is a strict total order on inputs, decided by a [`Contest`]:
//! - an exhausted input loses to every live input (two exhausted inputs: lower index wins, so
//!   the order stays total);
//! - live heads compare by key; **equal keys: the lower input index wins**, so output is
//!   deterministic whatever the replay history.

use std::cmp::Ordering;

/// The inputs a [`LoserTree`] ranks.
pub(crate) trait Contest {
    /// True when input `i` has no head any more.
    fn is_exhausted(&self, i: usize) -> bool;

    /// Compares the heads of two live inputs by key.
    fn cmp_heads(&self, a: usize, b: usize) -> Ordering;
}

/// Marks a node no input reached yet, during [`LoserTree::init`].
const EMPTY: usize = usize::MAX;

/// A loser tree over `k` inputs. See the module docs.
#[derive(Debug)]
pub(crate) struct LoserTree {
    /// `nodes[0]` is the winner, `nodes[1..k]` the losers of the internal nodes.
    nodes: Vec<usize>,
}

impl LoserTree {
    /// A tree over `k` inputs; call [`LoserTree::init`] before asking for the winner.
    pub fn new(k: usize) -> Self {
        Self {
            nodes: vec![EMPTY; k],
        }
    }

    /// The number of inputs.
    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Plays every match from scratch.
    pub fn init(&mut self, contest: &impl Contest) {
        self.nodes.fill(EMPTY);
        for input in 0..self.len() {
            // Climb until a node is free: park there, or reach the top as the winner.
            let mut climber = input;
            let mut node = self.leaf_parent(input);
            while node != 0 {
                let parked = self.nodes[node];
                if parked == EMPTY {
                    self.nodes[node] = climber;
                    break;
                }
                if beats(contest, parked, climber) {
                    self.nodes[node] = climber;
                    climber = parked;
                }
                node /= 2;
            }
            if node == 0 {
                self.nodes[0] = climber;
            }
        }
    }

    /// The input with the smallest head (an exhausted one only when all are), or `None`
    /// for a tree over no inputs.
    #[inline]
    pub fn winner(&self) -> Option<usize> {
        self.nodes.first().copied()
    }

    /// Replays the winner's path after its head changed (advanced, or exhausted).
    #[inline]
    pub fn replay(&mut self, contest: &impl Contest) {
        let Some(mut winner) = self.winner() else {
            return;
        };
        let mut node = self.leaf_parent(winner);
        while node != 0 {
            let challenger = self.nodes[node];
            if beats(contest, challenger, winner) {
                self.nodes[node] = winner;
                winner = challenger;
            }
            node /= 2;
        }
        self.nodes[0] = winner;
    }

    fn leaf_parent(&self, input: usize) -> usize {
        (self.len() + input) / 2
    }
}

/// True when input `a` comes strictly before input `b`.
#[inline]
fn beats(contest: &impl Contest, a: usize, b: usize) -> bool {
    match (contest.is_exhausted(a), contest.is_exhausted(b)) {
        (false, false) => match contest.cmp_heads(a, b) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a < b,
        },
        (false, true) => true,
        (true, false) => false,
        (true, true) => a < b,
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Sorted integer lists, one per input, each with a read offset.
    struct Lists {
        lists: Vec<Vec<i32>>,
        offsets: Vec<usize>,
    }

    impl Contest for Lists {
        fn is_exhausted(&self, i: usize) -> bool {
            self.offsets[i] >= self.lists[i].len()
        }

        fn cmp_heads(&self, a: usize, b: usize) -> Ordering {
            self.lists[a][self.offsets[a]].cmp(&self.lists[b][self.offsets[b]])
        }
    }

    /// Merges the lists with a loser tree: `(value, input)` in output order.
    fn merge(lists: Vec<Vec<i32>>) -> Vec<(i32, usize)> {
        let mut lists = Lists {
            offsets: vec![0; lists.len()],
            lists,
        };
        let mut tree = LoserTree::new(lists.lists.len());
        tree.init(&lists);
        let mut out = Vec::new();
        while let Some(w) = tree.winner() {
            if lists.is_exhausted(w) {
                break;
            }
            out.push((lists.lists[w][lists.offsets[w]], w));
            lists.offsets[w] += 1;
            tree.replay(&lists);
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
        let mut tree = LoserTree::new(0);
        let lists = Lists {
            lists: vec![],
            offsets: vec![],
        };
        tree.init(&lists);
        tree.replay(&lists);
        assert_eq!(tree.winner(), None);
    }

    #[test]
    fn the_module_doc_example() {
        let lists = vec![vec![5], vec![2, 9], vec![7], vec![3]];
        let order: Vec<usize> = merge(lists).into_iter().map(|(_, i)| i).collect();
        assert_eq!(order, vec![1, 3, 0, 2, 1]);
    }

    #[test]
    fn ties_go_to_the_lower_input_and_exhausted_inputs_lose() {
        let lists = vec![vec![], vec![1, 2, 2], vec![1, 2], vec![], vec![0, 2]];
        assert_eq!(
            merge(lists),
            vec![(0, 4), (1, 1), (1, 2), (2, 1), (2, 1), (2, 2), (2, 4)]
        );
        assert_eq!(merge(vec![vec![], vec![]]), vec![]);
    }

    #[test]
    fn random_lists_merge_like_a_sort() {
        let mut rng = StdRng::seed_from_u64(7);
        for k in [1, 2, 3, 5, 8, 13, 64, 100] {
            for _ in 0..20 {
                let lists: Vec<Vec<i32>> = (0..k)
                    .map(|_| {
                        let len = rng.random_range(0..20);
                        let mut l: Vec<i32> = (0..len).map(|_| rng.random_range(0..30)).collect();
                        l.sort();
                        l
                    })
                    .collect();
                assert_eq!(merge(lists.clone()), oracle(&lists), "{lists:?}");
            }
        }
    }
}
