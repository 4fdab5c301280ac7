//! The unordered per-vnode mode: whole input batches, one input after the other.
//!
//! ```text
//!   vnode 3: [1 4] [9]         output 1: vnode 3 [1 4]
//!   vnode 7: [2 3]      -->    output 2: vnode 7 [2 3]   exhausted: [7]
//!   vnode 9: (empty)           output 3: vnode 3 [9]     exhausted: [9, 3]
//! ```
//!
//! Each [`RoundRobin::next_output`](SnapshotMerger::next_output) takes one batch from the
//! next input that is not exhausted, in turn, and hands it out as is: no comparison, no copy
//! (a slice of the rows the scan read). Rows are in key order within a vnode, not
//! across vnodes. After handing out a batch, the input fetches its next one ahead, so a
//! vnode whose last rows leave is reported exhausted in the same output, like the k-way
//! merge does: the vnode completes at once and is not scanned again at the next epoch. An
//! empty input is reported when its turn comes. Key order within each input is checked.
//!
//! With [`RoundRobin::with_output_rows`] (what the executor uses), an output gathers whole
//! batches of the following inputs in turn (one slice when they follow each other in the
//! rows they share, as successive vnodes packed into one block do; else a copy), while they
//! fit in that many rows, each input at most once per output (taking its
//! successive batches in that one turn while they fit: a vnode stored as a chain of short
//! runs is read whole, not over several rounds holding its blocks) and at most
//! [`MAX_GATHERED_INPUTS`] inputs: with many small vnodes (32768 vnodes of a few dozen rows
//! each) one read is then a batch's worth of rows, not one vnode's, so an epoch that reads
//! once (barriers that come faster than the rows) still reads a batch. The cap bounds the
//! reads one output makes (each input also fetches its next batch ahead) like the k-way
//! merge's fan-in does, so a barrier waits no longer behind it.
//!
//! [`RoundRobin::deferred`] (what the backfill executor uses) reads the inputs *one after
//! the other* instead, each opened only when the output reaches it
//! ([`RestartInputs::next_output_opening`]):
//!
//! ```text
//!   vnode 3: [1 4] [9]         output 1: vnode 3 [1 4]   (vnode 3 opened)
//!   vnode 7: [2 3]      -->    output 2: vnode 3 [9]     exhausted: [3]
//!   vnode 9: (empty)           output 3: vnode 7 [2 3]   (vnode 7 opened) exhausted: [7]
//!                              output 4: (vnode 9 opened) exhausted: [9]
//! ```
//!
//! A vnode not reached yet holds no scan, no block and no patch: at a barrier the changes
//! beyond its position need nothing (the filter dropped them, and the store has them when the
//! vnode opens, at the epoch of that read). Only the vnode being read is brought to each new
//! epoch, so a barrier's work follows the one or two vnodes in progress, not every vnode
//! still to read; in round robin every vnode is in progress after the first round and each
//! barrier patched (or, past the patch budget, reopened) most of them, holding their changes
//! and a loaded block per source per vnode meanwhile.
use std::collections::VecDeque;

use arrow_schema::SchemaRef;
use hashbrown::HashMap;

use crate::error::{Result, internal};
use crate::key::Position;
use crate::merge::builder::empty_batch;
use crate::merge::input::MergeInput;
use crate::merge::patch::Patch;
use crate::merge::{MergeOutput, OpenScan, RestartInputs, SnapshotMerger, VnodeAdvance};
use crate::runs::{Run, assemble};
use crate::store::SnapshotScan;
use crate::vnode::VirtualNode;

/// The most inputs one gathered output takes batches from.
pub const MAX_GATHERED_INPUTS: usize = 256;

/// Per-vnode batches in turn, unmerged. See the module docs.
pub struct RoundRobin<S: SnapshotScan> {
    inputs: Vec<MergeInput<S>>,
    /// Per input, its next rows, fetched ahead.
    ahead: Vec<Option<Run>>,
    /// The inputs not yet found exhausted, in turn order: a pull costs the same however
    /// many inputs are done.
    turns: VecDeque<usize>,
    /// Per input, whether it is in `turns`.
    queued: Vec<bool>,
    /// The input of each vnode.
    index: HashMap<VirtualNode, usize>,
    table: String,
    /// The schema of the first batch seen, for empty outputs.
    schema: Option<SchemaRef>,
    /// An output gathers batches of successive inputs up to this many rows (1: one batch).
    output_rows: usize,
    /// Per input, `Some(position to scan after)` while its scan is not open yet
    /// ([`RoundRobin::deferred`]).
    deferred: Vec<Option<Option<Position>>>,
    /// Each input is read until exhausted before the next (deferred inputs), instead of
    /// one turn each in round robin.
    sequential: bool,
}

impl<S: SnapshotScan> RoundRobin<S> {
    /// Takes batches from `inputs` (one scan per vnode) in turn.
    pub fn new(inputs: Vec<(VirtualNode, S)>) -> Self {
        let (inputs, deferred) = (inputs.into_iter())
            .map(|(v, scan)| (MergeInput::new(v, scan), None))
            .unzip();
        Self::of(inputs, deferred, false)
    }

    /// Reads the vnodes of `plan` one after the other, in order, each from its position
    /// (`None`: its first row) and each opened only when an output reaches it, with the
    /// opener given to [`RestartInputs::next_output_opening`] (see the module docs).
    pub fn deferred(plan: Vec<(VirtualNode, Option<Position>)>) -> Self {
        let (inputs, deferred) = (plan.into_iter())
            .map(|(v, after)| (MergeInput::unopened(v), Some(after)))
            .unzip();
        Self::of(inputs, deferred, true)
    }

    /// Every input in turn order, none read yet.
    fn of(
        inputs: Vec<MergeInput<S>>,
        deferred: Vec<Option<Option<Position>>>,
        sequential: bool,
    ) -> Self {
        let k = inputs.len();
        Self {
            ahead: (0..k).map(|_| None).collect(),
            index: (inputs.iter().enumerate())
                .map(|(i, input)| (input.vnode(), i))
                .collect(),
            inputs,
            turns: (0..k).collect(),
            queued: vec![true; k],
            table: String::new(),
            schema: None,
            output_rows: 1,
            deferred,
            sequential,
        }
    }

    /// Gathers whole batches of successive inputs into one output while they fit in `rows`
    /// rows (an output with rows holds at least one batch, each input at most once, and at
    /// most `MAX_GATHERED_INPUTS` inputs).
    pub fn with_output_rows(mut self, rows: usize) -> Self {
        self.output_rows = rows.max(1);
        self
    }

    /// Names the table in [`Error::OrderViolation`](crate::Error::OrderViolation)s.
    pub fn with_table_name(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
}

impl<S: SnapshotScan> SnapshotMerger for RoundRobin<S> {
    fn next_output(&mut self) -> Result<Option<MergeOutput>> {
        self.next_output_opening(&mut |vnode, _| {
            Err(internal!(
                "vnode {vnode} is deferred and no opener was given"
            ))
        })
    }
}

impl<S: SnapshotScan> RoundRobin<S> {
    /// The next output; `open` opens each deferred input it reaches.
    fn gather(&mut self, open: &mut OpenScan<'_, S>) -> Result<Option<MergeOutput>> {
        let mut exhausted = Vec::new();
        let mut pieces: Vec<Run> = Vec::new();
        let mut progress = Vec::new();
        let mut rows = 0;
        let mut inputs = 0;
        // The first input of this output that went back to the end of the turns: meeting
        // it again means every live input has had its turn.
        let mut requeued_first = None;
        // Every input in turn either yields a batch or is found exhausted (and leaves).
        while let Some(turn) = self.turns.pop_front() {
            if requeued_first == Some(turn) {
                self.turns.push_front(turn);
                break;
            }
            if let Some(after) = self.deferred[turn].take() {
                let scan = open(self.inputs[turn].vnode(), after.as_ref())?;
                self.inputs[turn].restart(scan, after.as_ref());
            }
            let input = &mut self.inputs[turn];
            let batch = match self.ahead[turn].take() {
                Some(batch) => batch,
                None => match input.next_run(&self.table, &mut self.schema)? {
                    Some(batch) => batch,
                    None => {
                        self.queued[turn] = false;
                        exhausted.push(input.vnode());
                        continue;
                    }
                },
            };
            if rows > 0 && rows + batch.len() > self.output_rows {
                // It does not fit: it starts the next output.
                self.ahead[turn] = Some(batch);
                self.turns.push_front(turn);
                break;
            }
            // The input's batches while they fit (a vnode stored as a chain of short runs
            // comes as several small batches: read in one turn, it is done in one turn).
            let (mut batch, mut taken) = (batch, 0);
            let last = loop {
                let last = batch
                    .last_key()
                    .map(Position::from_bytes)
                    .ok_or_else(|| internal!("a merge input yielded an empty batch"))?;
                taken += batch.len();
                rows += batch.len();
                pieces.push(batch);
                // Look ahead, so the vnode's exhaustion travels with its last rows.
                match input.next_run(&self.table, &mut self.schema)? {
                    Some(next) if rows + next.len() <= self.output_rows => batch = next,
                    Some(next) => {
                        self.ahead[turn] = Some(next);
                        if self.sequential {
                            self.turns.push_front(turn);
                        } else {
                            self.turns.push_back(turn);
                        }
                        requeued_first.get_or_insert(turn);
                        break last;
                    }
                    None => {
                        self.queued[turn] = false;
                        exhausted.push(input.vnode());
                        break last;
                    }
                }
            };
            progress.push(VnodeAdvance {
                vnode: input.vnode(),
                last,
                rows: taken,
            });
            inputs += 1;
            if rows >= self.output_rows || inputs >= MAX_GATHERED_INPUTS {
                break;
            }
        }
        // One piece, or ranges that follow each other in the rows they share (successive
        // vnodes packed into one block): a slice; else a copy.
        let Some(batch) = assemble(&pieces)? else {
            return Ok((!exhausted.is_empty()).then(|| MergeOutput {
                batch: empty_batch(self.schema.as_ref()),
                progress,
                exhausted,
            }));
        };
        Ok(Some(MergeOutput {
            batch,
            progress,
            exhausted,
        }))
    }
}

impl<S: SnapshotScan> RestartInputs<S> for RoundRobin<S> {
    fn restart(&mut self, vnode: VirtualNode, scan: S, after: Option<&Position>) -> Result<()> {
        let input = self.input(vnode, "restart")?;
        self.deferred[input] = None;
        self.inputs[input].restart(scan, after);
        self.ahead[input] = None;
        self.requeue(input);
        Ok(())
    }

    fn patch(&mut self, vnode: VirtualNode, patch: Patch, after: Option<&Position>) -> Result<()> {
        let input = self.input(vnode, "patch")?;
        if self.deferred[input].is_some() {
            // Its scan opens at a later epoch, which has these changes.
            return Err(internal!(
                "patch of vnode {vnode}, whose scan is not open yet"
            ));
        }
        // The batch fetched ahead goes back to the input, to be handed out patched.
        let unread = self.ahead[input].take();
        self.inputs[input].patch(unread, patch, after)?;
        self.requeue(input);
        Ok(())
    }

    fn is_deferred(&self, vnode: VirtualNode) -> bool {
        (self.index.get(&vnode)).is_some_and(|&input| self.deferred[input].is_some())
    }

    fn next_output_opening(&mut self, open: &mut OpenScan<'_, S>) -> Result<Option<MergeOutput>> {
        self.gather(open)
    }
}

impl<S: SnapshotScan> RoundRobin<S> {
    /// The input of `vnode`, checked to be one.
    fn input(&self, vnode: VirtualNode, what: &str) -> Result<usize> {
        self.index
            .get(&vnode)
            .copied()
            .ok_or_else(|| internal!("{what} of vnode {vnode}, which is not a merge input"))
    }

    /// Puts an input found exhausted back in turn (its restarted or patched scan may have
    /// rows again).
    fn requeue(&mut self, input: usize) {
        if !self.queued[input] {
            self.queued[input] = true;
            self.turns.push_back(input);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use arrow_array::Array;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::merge::testing::{
        KeyShape, VecScan, check_outputs, check_restarts, drain, ids, int_key, int_rows,
        int_rows_with_ids, random_case,
    };

    #[test]
    fn restarted_inputs_continue_after_their_positions() {
        for seed in 100..160 {
            check_restarts(seed, false, |inputs, _| RoundRobin::new(inputs));
        }
    }

    #[test]
    fn deferred_inputs_continue_after_their_positions() {
        for seed in 300..360 {
            check_restarts(seed, false, |inputs, batch_size| {
                let plan = inputs.into_iter().map(|(vnode, _)| (vnode, None)).collect();
                RoundRobin::deferred(plan).with_output_rows(batch_size)
            });
        }
    }

    /// Drains `merger`, opening deferred inputs from `scans`; returns the outputs and, per
    /// output, the vnodes opened while making it.
    fn drain_opening(
        merger: &mut RoundRobin<VecScan>,
        mut scans: HashMap<VirtualNode, VecScan>,
    ) -> (Vec<MergeOutput>, Vec<Vec<VirtualNode>>) {
        let (mut outputs, mut opened) = (Vec::new(), Vec::new());
        loop {
            let mut now = Vec::new();
            let mut open = |vnode: VirtualNode, after: Option<&Position>| {
                assert!(after.is_none());
                now.push(vnode);
                scans
                    .remove(&vnode)
                    .ok_or_else(|| internal!("vnode {vnode} opened twice"))
            };
            let Some(output) = merger.next_output_opening(&mut open).unwrap() else {
                return (outputs, opened);
            };
            outputs.push(output);
            opened.push(now);
        }
    }

    #[test]
    fn fuzz_deferred_every_row_once_one_vnode_at_a_time() {
        let mut seed = 3000;
        for shape in [KeyShape::Int, KeyShape::Composite] {
            for num_inputs in [1, 16, 300] {
                for output_rows in [1, 5, 1024] {
                    seed += 1;
                    let mut rng = StdRng::seed_from_u64(seed);
                    let case = random_case(&mut rng, shape, num_inputs, 3000);
                    let plan = case.inputs.iter().map(|(v, _)| (*v, None)).collect();
                    let mut merger = RoundRobin::deferred(plan).with_output_rows(output_rows);
                    let scans = case.scans().into_iter().collect();
                    let (outputs, opened) = drain_opening(&mut merger, scans);
                    check_outputs(&case, &outputs);
                    // In order, each opened once, and none before the one before it is done.
                    let order: Vec<VirtualNode> = opened.iter().flatten().copied().collect();
                    let plan_order: Vec<VirtualNode> =
                        case.inputs.iter().map(|(v, _)| *v).collect();
                    assert_eq!(order, plan_order, "seed {seed}");
                    let mut open = std::collections::BTreeSet::new();
                    for (output, opened) in outputs.iter().zip(&opened) {
                        open.extend(opened.iter().copied());
                        for vnode in &output.exhausted {
                            open.remove(vnode);
                        }
                        assert!(open.len() <= 1, "seed {seed}: {open:?} open at once");
                    }
                }
            }
        }
    }

    /// The vnodes of the module docs' example.
    const DOCS_VNODES: [VirtualNode; 3] = [
        VirtualNode::new(3),
        VirtualNode::new(7),
        VirtualNode::new(9),
    ];

    /// The module docs' inputs: vnode 3 `[1 4] [9]` (row ids 0, 1, 2), vnode 7 `[2 3]` (ids
    /// 10, 11) and vnode 9, empty.
    fn docs_example() -> Vec<(VirtualNode, VecScan)> {
        let pk = int_key(false);
        let [v3, v7, v9] = DOCS_VNODES;
        vec![
            (
                v3,
                VecScan::new(vec![
                    int_rows_with_ids(&pk, &[1, 4], 0),
                    int_rows_with_ids(&pk, &[9], 2),
                ]),
            ),
            (v7, VecScan::new(vec![int_rows_with_ids(&pk, &[2, 3], 10)])),
            (v9, VecScan::new(vec![int_rows(&pk, &[])])),
        ]
    }

    #[test]
    fn deferred_inputs_open_one_after_the_other_when_reached() {
        let [v3, v7, v9] = DOCS_VNODES;
        let scans: HashMap<VirtualNode, VecScan> = docs_example().into_iter().collect();
        let mut merger = RoundRobin::deferred(vec![(v3, None), (v7, None), (v9, None)]);
        assert!(merger.is_deferred(v3) && merger.is_deferred(v7));
        let (outputs, opened) = drain_opening(&mut merger, scans);
        let shape: Vec<(Vec<u64>, Vec<VirtualNode>, Vec<VirtualNode>)> = outputs
            .iter()
            .zip(opened)
            .map(|(o, opened)| (ids(&o.batch.batch), o.exhausted.clone(), opened))
            .collect();
        // The module docs' example.
        assert_eq!(
            shape,
            vec![
                (vec![0, 1], vec![], vec![v3]),
                (vec![2], vec![v3], vec![]),
                (vec![10, 11], vec![v7], vec![v7]),
                (vec![], vec![v9], vec![v9]),
            ]
        );
    }

    #[test]
    fn a_deferred_input_restarted_opens_with_its_scan_and_cannot_be_patched() {
        let pk = int_key(false);
        let (v0, v1) = (VirtualNode::new(0), VirtualNode::new(1));
        let mut merger = RoundRobin::deferred(vec![(v0, None), (v1, None)]);
        let patch = Patch::new(int_rows(&pk, &[5]), None).unwrap();
        assert!(merger.patch(v1, patch, None).is_err());
        // Given a scan, it is open: read in its turn without the opener.
        merger
            .restart(
                v1,
                VecScan::new(vec![int_rows_with_ids(&pk, &[3], 7)]),
                None,
            )
            .unwrap();
        assert!(!merger.is_deferred(v1) && merger.is_deferred(v0));
        let scans = HashMap::from([(v0, VecScan::new(vec![int_rows_with_ids(&pk, &[2], 1)]))]);
        let (outputs, opened) = drain_opening(&mut merger, scans);
        let ids: Vec<Vec<u64>> = outputs.iter().map(|o| ids(&o.batch.batch)).collect();
        assert_eq!(ids, vec![vec![1], vec![7]]);
        assert_eq!(opened, vec![vec![v0], vec![]]);
        // Without an opener, a deferred input is an error, not a panic.
        let mut merger = RoundRobin::<VecScan>::deferred(vec![(v0, None)]);
        assert!(merger.next_output().is_err());
    }

    #[test]
    fn fuzz_every_row_once_in_vnode_order() {
        let mut seed = 1000;
        for shape in [KeyShape::Int, KeyShape::NullableInt, KeyShape::Composite] {
            for num_inputs in [1, 16, 256] {
                for _ in 0..4 {
                    seed += 1;
                    let mut rng = StdRng::seed_from_u64(seed);
                    let case = random_case(&mut rng, shape, num_inputs, 3000);
                    let mut merger = RoundRobin::new(case.scans());
                    let outputs = drain(&mut merger, case.owner.len() + num_inputs + 2).unwrap();
                    check_outputs(&case, &outputs);
                    for output in &outputs {
                        assert!(output.progress.len() <= 1, "one vnode per output");
                    }
                }
            }
        }
    }

    #[test]
    fn restarted_inputs_continue_after_their_positions_when_gathering() {
        for seed in 200..260 {
            check_restarts(seed, false, |inputs, batch_size| {
                RoundRobin::new(inputs).with_output_rows(batch_size)
            });
        }
    }

    #[test]
    fn fuzz_gathered_outputs_every_row_once_within_the_size() {
        let mut seed = 2000;
        for shape in [KeyShape::Int, KeyShape::NullableInt, KeyShape::Composite] {
            for num_inputs in [1, 16, 300] {
                for output_rows in [1, 5, 100, 1024] {
                    seed += 1;
                    let mut rng = StdRng::seed_from_u64(seed);
                    let case = random_case(&mut rng, shape, num_inputs, 3000);
                    let mut merger = RoundRobin::new(case.scans()).with_output_rows(output_rows);
                    let outputs = drain(&mut merger, case.owner.len() + num_inputs + 2).unwrap();
                    check_outputs(&case, &outputs);
                    for output in &outputs {
                        assert!(output.progress.len() <= MAX_GATHERED_INPUTS);
                        // Whole batches: more rows than asked only as a single batch.
                        assert!(
                            output.batch.num_rows() <= output_rows || output.progress.len() == 1,
                            "seed {seed}: {} rows from {} vnodes",
                            output.batch.num_rows(),
                            output.progress.len()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn small_vnodes_are_gathered_into_one_output_in_turn() {
        let pk = int_key(false);
        let vnodes: Vec<VirtualNode> = (0..4).map(VirtualNode::new).collect();
        let inputs = vec![
            (
                vnodes[0],
                VecScan::new(vec![int_rows_with_ids(&pk, &[1, 2], 0)]),
            ),
            (
                vnodes[1],
                VecScan::new(vec![int_rows_with_ids(&pk, &[3], 10)]),
            ),
            (
                vnodes[2],
                VecScan::new(vec![
                    int_rows_with_ids(&pk, &[4, 5], 20),
                    int_rows_with_ids(&pk, &[6], 22),
                ]),
            ),
            (
                vnodes[3],
                VecScan::new(vec![int_rows_with_ids(&pk, &[7, 8], 30)]),
            ),
        ];
        let outputs = drain(&mut RoundRobin::new(inputs).with_output_rows(5), 10).unwrap();
        let shape: Vec<(Vec<u64>, Vec<VirtualNode>, Vec<VirtualNode>)> = outputs
            .iter()
            .map(|o| {
                (
                    ids(&o.batch.batch),
                    o.progress.iter().map(|p| p.vnode).collect(),
                    o.exhausted.clone(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                // Vnode 3's two rows would make six: they start the next output.
                (
                    vec![0, 1, 10, 20, 21],
                    vnodes[..3].to_vec(),
                    vec![vnodes[0], vnodes[1]]
                ),
                // Each input once per output: vnode 2 comes back after vnode 3.
                (
                    vec![30, 31, 22],
                    vec![vnodes[3], vnodes[2]],
                    vec![vnodes[3], vnodes[2]]
                ),
            ]
        );
    }

    /// A vnode whose rows come as several small batches (a base stored as a chain of short
    /// runs) is read whole in its turn while they fit: one advance with all its rows, and its
    /// exhaustion in the same output.
    #[test]
    fn an_input_of_small_batches_is_read_whole_in_its_turn() {
        let pk = int_key(false);
        let (v0, v1) = (VirtualNode::new(0), VirtualNode::new(1));
        let inputs = || {
            vec![
                (
                    v0,
                    VecScan::new(vec![
                        int_rows_with_ids(&pk, &[1], 0),
                        int_rows_with_ids(&pk, &[2], 1),
                        int_rows_with_ids(&pk, &[3], 2),
                    ]),
                ),
                (v1, VecScan::new(vec![int_rows_with_ids(&pk, &[4, 5], 10)])),
            ]
        };
        // Per output: its row ids, `(vnode, rows)` advances and exhausted vnodes.
        type Shape = (Vec<u64>, Vec<(VirtualNode, usize)>, Vec<VirtualNode>);
        let shape = |output_rows: usize| -> Vec<Shape> {
            let outputs = drain(
                &mut RoundRobin::new(inputs()).with_output_rows(output_rows),
                10,
            )
            .unwrap();
            outputs
                .iter()
                .map(|o| {
                    (
                        ids(&o.batch.batch),
                        o.progress.iter().map(|p| (p.vnode, p.rows)).collect(),
                        o.exhausted.clone(),
                    )
                })
                .collect()
        };
        assert_eq!(
            shape(10),
            vec![(vec![0, 1, 2, 10, 11], vec![(v0, 3), (v1, 2)], vec![v0, v1])]
        );
        // Vnode 1's two rows would make five: they start the next output.
        assert_eq!(
            shape(4),
            vec![
                (vec![0, 1, 2], vec![(v0, 3)], vec![v0]),
                (vec![10, 11], vec![(v1, 2)], vec![v1]),
            ]
        );
        // An output of two rows takes vnode 0's first two, the third comes in its next turn.
        assert_eq!(
            shape(2),
            vec![
                (vec![0, 1], vec![(v0, 2)], vec![]),
                (vec![10, 11], vec![(v1, 2)], vec![v1]),
                (vec![2], vec![(v0, 1)], vec![v0]),
            ]
        );
    }

    #[test]
    fn inputs_take_turns_and_exhaustion_is_reported_on_the_way() {
        let [v0, v1, v2] = DOCS_VNODES;
        let outputs = drain(&mut RoundRobin::new(docs_example()), 10).unwrap();
        let shape: Vec<(Vec<u64>, Vec<VirtualNode>)> = outputs
            .iter()
            .map(|o| (ids(&o.batch.batch), o.exhausted.clone()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (vec![0, 1], vec![]),
                (vec![10, 11], vec![v1]),
                (vec![2], vec![v2, v0]),
            ]
        );
    }

    #[test]
    fn batches_are_handed_out_zero_copy() {
        let pk = int_key(false);
        let input = int_rows(&pk, &[1, 2, 3]);
        let pointer = |b: &arrow_array::RecordBatch| b.column(0).to_data().buffers()[0].as_ptr();
        let mut merger =
            RoundRobin::new(vec![(VirtualNode::ZERO, VecScan::new(vec![input.clone()]))]);
        let output = merger.next_output().unwrap().unwrap();
        assert_eq!(pointer(&output.batch.batch), pointer(&input.batch));
        assert_eq!(
            output.batch.keys.values().as_ptr(),
            input.keys.values().as_ptr()
        );
    }

    #[test]
    fn keys_going_backwards_are_an_order_violation() {
        let pk = int_key(false);
        let scan = VecScan::new(vec![int_rows(&pk, &[1, 5]), int_rows(&pk, &[5, 6])]);
        let mut merger = RoundRobin::new(vec![(VirtualNode::new(4), scan)]).with_table_name("t");
        // The look-ahead fetch of the second batch finds the violation.
        assert!(matches!(
            merger.next_output(),
            Err(Error::OrderViolation {
                vnode: 4,
                row: 0,
                ..
            })
        ));
    }

    #[test]
    fn no_inputs_give_no_output() {
        assert!(
            RoundRobin::<VecScan>::new(vec![])
                .next_output()
                .unwrap()
                .is_none()
        );
    }
}
