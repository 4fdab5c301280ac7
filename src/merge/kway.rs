//! The ordered merge: rows of all vnodes in global key order, in batches of `batch_size`.
//!
//! ```text
//!   next_output():
//!
//!   Unstarted --(fetch every input's first batch, play the tree)--> Merging
//!
//!   Merging, until the output holds batch_size rows or every input is exhausted:
//!     w = tree winner            (smallest head; ties -> lowest input)
//!     n = 1, or if w also won the previous round, every row of w before the runner-up
//!     record (w's slot, w's rows) in the builder; advance w's cursor by n
//!     w's batch used up?  -> fetch w's next batch     (None: w is exhausted; report its vnode)
//!     replay w's path in the tree with w's new entry
//!   then interleave the recorded rows into one batch, with progress and exhaustion news.
//! ```
//!
//! **Runs.** When keys are clustered (an input holds a stretch of consecutive keys), the
//! same input wins many rounds in a row. Replaying the tree for each of those rows is wasted
//! work: once an input wins twice in a row, the merge asks the tree for the runner-up (the
//! best loser on the winner's path) and binary-searches the winner's batch for the rows
//! before it, recording them as one range. With spread keys a second win in a row is rare
//! (1 in `k`), so the check costs one comparison per row.
//!
//! An input's next batch is fetched the moment its cursor passes its last row, so an
//! exhausted vnode is reported in the same output as its last row; a vnode with no rows at
//! all is reported in the first output. Each input's keys are checked to strictly increase
//! when its batch arrives ([`Error::OrderViolation`]).
//!
//! The cursor is chosen once from the key ([`CursorKind::for_key`]); the merge state is
//! generic over it so that the per-row comparisons are monomorphic.

use arrow_schema::SchemaRef;
use hashbrown::HashMap;

use crate::error::{Error, Result, internal};
use crate::key::{Position, PrimaryKey};
use crate::merge::builder::{OutputBuilder, OutputKeys};
use crate::merge::cursor::{
    Cursor, CursorKind, I8Cursor, I16Cursor, I32Cursor, I64Cursor, KeyEntry, PrimitiveConfig,
    RowConfig, RowCursor, U8Cursor, U16Cursor, U32Cursor, U64Cursor,
};
use crate::merge::input::MergeInput;
use crate::merge::loser_tree::LoserTree;
use crate::merge::patch::Patch;
use crate::merge::{MergeOutput, RestartInputs, SnapshotMerger};
use crate::runs::Run;
use crate::store::SnapshotScan;
use crate::vnode::VirtualNode;

/// A k-way merge of per-vnode snapshot scans into key-ordered batches. See the module docs.
pub struct KWayMerge<S: SnapshotScan> {
    kind: CursorKind,
    engine: Engine<S>,
}

/// The merge state, monomorphized per cursor type.
enum Engine<S: SnapshotScan> {
    Rows(Merge<S, RowCursor>),
    I8(Merge<S, I8Cursor>),
    I16(Merge<S, I16Cursor>),
    I32(Merge<S, I32Cursor>),
    I64(Merge<S, I64Cursor>),
    U8(Merge<S, U8Cursor>),
    U16(Merge<S, U16Cursor>),
    U32(Merge<S, U32Cursor>),
    U64(Merge<S, U64Cursor>),
}

/// Runs `$body` with `$m` bound to the engine's merge, whatever its cursor type.
macro_rules! with_merge {
    ($engine:expr, $m:ident => $body:expr) => {
        match $engine {
            Engine::Rows($m) => $body,
            Engine::I8($m) => $body,
            Engine::I16($m) => $body,
            Engine::I32($m) => $body,
            Engine::I64($m) => $body,
            Engine::U8($m) => $body,
            Engine::U16($m) => $body,
            Engine::U32($m) => $body,
            Engine::U64($m) => $body,
        }
    };
}

impl<S: SnapshotScan> KWayMerge<S> {
    /// Merges `inputs` (one scan per vnode; input order breaks key ties) into batches of
    /// `batch_size` rows, comparing with the fastest cursor for `pk`
    /// ([`CursorKind::for_key`]).
    pub fn new(pk: &PrimaryKey, inputs: Vec<(VirtualNode, S)>, batch_size: usize) -> Result<Self> {
        let kind = CursorKind::for_key(pk);
        // Re-encoding output keys beats gathering them when every column is fixed-width.
        let fixed_width = (pk.key_schema().fields().iter()).all(|f| f.data_type().is_primitive());
        let keys = match kind {
            CursorKind::Primitive { .. } => OutputKeys::Encode(pk.clone()),
            CursorKind::Rows if fixed_width => OutputKeys::Encode(pk.clone()),
            CursorKind::Rows => OutputKeys::Gather,
        };
        Self::with_cursor(kind, keys, inputs, batch_size)
    }

    /// Like [`KWayMerge::new`], always comparing encoded keys (for benchmarks and tests).
    pub fn with_row_cursor(inputs: Vec<(VirtualNode, S)>, batch_size: usize) -> Result<Self> {
        Self::with_cursor(CursorKind::Rows, OutputKeys::Gather, inputs, batch_size)
    }

    fn with_cursor(
        kind: CursorKind,
        keys: OutputKeys,
        inputs: Vec<(VirtualNode, S)>,
        batch_size: usize,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::InvalidConfig(
                "merge batch size must be positive".into(),
            ));
        }
        let vnodes = inputs.iter().map(|(v, _)| *v).collect();
        let builder = OutputBuilder::new(vnodes, batch_size, keys);
        let engine = match &kind {
            CursorKind::Rows => Engine::Rows(Merge::new(
                RowConfig::default(),
                inputs,
                builder,
                batch_size,
            )),
            CursorKind::Primitive {
                column,
                data_type,
                descending,
            } => {
                let config = PrimitiveConfig {
                    column: *column,
                    descending: *descending,
                };
                use arrow_schema::DataType as T;
                match data_type {
                    T::Int8 => Engine::I8(Merge::new(config, inputs, builder, batch_size)),
                    T::Int16 => Engine::I16(Merge::new(config, inputs, builder, batch_size)),
                    T::Int32 => Engine::I32(Merge::new(config, inputs, builder, batch_size)),
                    T::Int64 => Engine::I64(Merge::new(config, inputs, builder, batch_size)),
                    T::UInt8 => Engine::U8(Merge::new(config, inputs, builder, batch_size)),
                    T::UInt16 => Engine::U16(Merge::new(config, inputs, builder, batch_size)),
                    T::UInt32 => Engine::U32(Merge::new(config, inputs, builder, batch_size)),
                    T::UInt64 => Engine::U64(Merge::new(config, inputs, builder, batch_size)),
                    other => {
                        return Err(internal!("no primitive merge cursor for {other}"));
                    }
                }
            }
        };
        Ok(Self { kind, engine })
    }

    /// Names the table in [`Error::OrderViolation`]s.
    pub fn with_table_name(mut self, table: impl Into<String>) -> Self {
        let table = table.into();
        with_merge!(&mut self.engine, m => m.table = table);
        self
    }

    /// The cursor this merge compares rows with.
    pub fn cursor_kind(&self) -> &CursorKind {
        &self.kind
    }
}

impl<S: SnapshotScan> SnapshotMerger for KWayMerge<S> {
    fn next_output(&mut self) -> Result<Option<MergeOutput>> {
        with_merge!(&mut self.engine, m => m.next_output())
    }
}

impl<S: SnapshotScan> RestartInputs<S> for KWayMerge<S> {
    fn restart(&mut self, vnode: VirtualNode, scan: S, after: Option<&Position>) -> Result<()> {
        with_merge!(&mut self.engine, m => m.restart(vnode, scan, after))
    }

    fn patch(&mut self, vnode: VirtualNode, patch: Patch, after: Option<&Position>) -> Result<()> {
        with_merge!(&mut self.engine, m => m.patch(vnode, patch, after))
    }
}

/// Where a merge is in its life.
enum Phase {
    /// No input fetched yet.
    Unstarted,
    /// Every input has a cursor or is exhausted, and the tree is played.
    Merging,
}

/// The merge over one cursor type.
struct Merge<S, C: Cursor> {
    config: C::Config,
    table: String,
    phase: Phase,
    inputs: Vec<MergeInput<S>>,
    /// Per input: its cursor, `None` once exhausted.
    cursors: Vec<Option<C>>,
    /// Empty until the merge starts.
    tree: LoserTree<KeyEntry>,
    builder: OutputBuilder,
    batch_size: usize,
    /// The schema of the first batch seen, for empty outputs.
    schema: Option<SchemaRef>,
    /// Vnodes found exhausted since the last output.
    exhausted: Vec<VirtualNode>,
    /// True when a batch was admitted that made the entries in the tree stale
    /// ([`Cursor::admit`]), or inputs were restarted or patched: the tree must be rebuilt
    /// rather than replayed.
    stale: bool,
    /// The input of each vnode.
    index: HashMap<VirtualNode, usize>,
}

impl<S: SnapshotScan, C: Cursor> Merge<S, C> {
    fn new(
        config: C::Config,
        inputs: Vec<(VirtualNode, S)>,
        builder: OutputBuilder,
        batch_size: usize,
    ) -> Self {
        let k = inputs.len();
        let index = inputs
            .iter()
            .enumerate()
            .map(|(i, (v, _))| (*v, i))
            .collect();
        Self {
            index,
            config,
            table: String::new(),
            phase: Phase::Unstarted,
            inputs: inputs
                .into_iter()
                .map(|(v, s)| MergeInput::new(v, s))
                .collect(),
            cursors: (0..k).map(|_| None).collect(),
            tree: LoserTree::new(&[], |_, _| false),
            builder,
            batch_size,
            schema: None,
            exhausted: Vec::new(),
            stale: false,
        }
    }

    fn next_output(&mut self) -> Result<Option<MergeOutput>> {
        if let Phase::Unstarted = self.phase {
            self.start()?;
        }
        if self.stale {
            self.play();
        }
        self.fill()?;
        let exhausted = std::mem::take(&mut self.exhausted);
        if self.builder.len() == 0 && exhausted.is_empty() {
            return Ok(None);
        }
        let (batch, progress) = self.builder.build(self.schema.as_ref())?;
        Ok(Some(MergeOutput {
            batch,
            progress,
            exhausted,
        }))
    }

    /// Restarts the input of `vnode` on `scan` (its rows after `after`), between outputs:
    /// its loaded rows are dropped, its first batch is fetched now (or its exhaustion noted
    /// for the next output), and the tree is rebuilt before the next output.
    fn restart(&mut self, vnode: VirtualNode, scan: S, after: Option<&Position>) -> Result<()> {
        let input = self.input_between_outputs(vnode, "restart")?;
        self.inputs[input].restart(scan, after);
        self.refetch(input)
    }

    /// Merges `patch` into the rows of `vnode` after `after`, between outputs: the rows its
    /// cursor has not passed go back to its input, which hands them out again with the
    /// patch applied; the tree is rebuilt before the next output.
    fn patch(&mut self, vnode: VirtualNode, patch: Patch, after: Option<&Position>) -> Result<()> {
        let input = self.input_between_outputs(vnode, "patch")?;
        let unread = match (&self.cursors[input], self.builder.current_run(input)) {
            (Some(cursor), Some(run)) => Some(run.slice(cursor.row(), cursor.remaining())),
            _ => None,
        };
        self.inputs[input].patch(unread, patch, after)?;
        self.refetch(input)
    }

    /// The input of `vnode`, checked to be one, while no output is being built.
    fn input_between_outputs(&self, vnode: VirtualNode, what: &str) -> Result<usize> {
        let input = *self
            .index
            .get(&vnode)
            .ok_or_else(|| internal!("{what} of vnode {vnode}, which is not a merge input"))?;
        if self.builder.len() != 0 {
            return Err(internal!(
                "{what} of vnode {vnode} while an output is being built"
            ));
        }
        Ok(input)
    }

    /// Drops the cursor of a restarted or patched input and fetches its next batch now (or
    /// notes its exhaustion for the next output); the tree is rebuilt before the next output.
    fn refetch(&mut self, input: usize) -> Result<()> {
        if let Phase::Unstarted = self.phase {
            return Ok(());
        }
        self.cursors[input] = None;
        self.builder.finish_input(input);
        // Found exhausted since the last output, the input may have rows again: it is
        // reported when it is exhausted anew.
        let vnode = self.inputs[input].vnode();
        self.exhausted.retain(|v| *v != vnode);
        self.fetch(input)?;
        self.stale = true;
        Ok(())
    }

    /// Fetches every input's first batch and plays the tree.
    fn start(&mut self) -> Result<()> {
        for input in 0..self.inputs.len() {
            self.fetch(input)?;
        }
        self.play();
        self.phase = Phase::Merging;
        Ok(())
    }

    /// Builds the tree from every input's current entry.
    fn play(&mut self) {
        let entries: Vec<KeyEntry> = (0..self.inputs.len()).map(|i| self.entry(i)).collect();
        let cursors = &self.cursors;
        self.tree = LoserTree::new(&entries, |a, b| C::beats(a, b, cursors));
        self.stale = false;
    }

    /// The tree entry of `input`: its head, or its exhaustion.
    fn entry(&self, input: usize) -> KeyEntry {
        match &self.cursors[input] {
            Some(cursor) => cursor.entry(input),
            None => KeyEntry::exhausted(input),
        }
    }

    /// Records winners until the output is full or every input is exhausted.
    fn fill(&mut self) -> Result<()> {
        let mut previous = None;
        while self.builder.len() < self.batch_size {
            let Some(winner) = self.tree.winner() else {
                return Ok(());
            };
            // The winner is exhausted only when every input is.
            if winner.is_exhausted() {
                return Ok(());
            }
            let input = winner.input();
            let cursors = &self.cursors;
            let cursor = cursors[input]
                .as_ref()
                .ok_or_else(|| internal!("merge input {input} won with no cursor"))?;
            let room = self.batch_size - self.builder.len();
            let rows = if previous == Some(input) {
                // A second win in a row: take every row before the runner-up at once.
                let runner_up = self.tree.runner_up(input, |a, b| C::beats(a, b, cursors));
                match runner_up {
                    Some(bound) => cursor.rows_before(input, bound, room, cursors),
                    None => room.min(cursor.remaining()),
                }
            } else {
                1
            };
            debug_assert!(rows >= 1, "the winner's head comes before the runner-up");
            self.builder.push_rows(input, cursor.row(), rows)?;
            if let Some(cursor) = self.cursors[input].as_mut() {
                cursor.advance(rows);
                if cursor.remaining() == 0 {
                    self.fetch(input)?;
                }
            }
            if self.stale {
                // Rare: every entry changed, not only the winner's.
                self.play();
            } else {
                let entry = self.entry(input);
                let cursors = &self.cursors;
                self.tree
                    .replay(input, entry, |a, b| C::beats(a, b, cursors));
            }
            previous = Some(input);
        }
        Ok(())
    }

    /// Gives `input` a cursor on its next batch, or marks it exhausted.
    fn fetch(&mut self, input: usize) -> Result<()> {
        let config = &self.config;
        let unordered = |run: &Run| C::first_unordered(config, run);
        let next = self.inputs[input].next_run_with(&self.table, &mut self.schema, unordered)?;
        match next {
            Some(run) => {
                if C::admit(&mut self.config, &run) {
                    self.stale = true;
                    for cursor in self.cursors.iter_mut().flatten() {
                        cursor.refresh(&self.config);
                    }
                }
                self.cursors[input] = Some(C::open(&self.config, &run)?);
                self.builder.push_run(input, run);
            }
            None => {
                self.cursors[input] = None;
                self.builder.finish_input(input);
                self.exhausted.push(self.inputs[input].vnode());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::merge::RestartInputs;
    use crate::merge::testing::{
        Case, KeyShape, VecScan, check_outputs, check_restarts, clustered_case, drain, ids,
        int_key, int_rows, int_rows_with_ids, random_case,
    };
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    fn kway(case: &Case, batch_size: usize) -> KWayMerge<VecScan> {
        KWayMerge::new(&case.pk, case.scans(), batch_size).unwrap()
    }

    /// The ordered merge's own promises, on top of [`check_outputs`].
    fn check_kway(case: &Case, batch_size: usize) {
        let mut merge = kway(case, batch_size);
        let outputs = drain(&mut merge, case.owner.len() + case.inputs.len() + 2).unwrap();
        check_outputs(case, &outputs);
        // Global order: the sorted union, ties (none here) by input.
        let got: Vec<u64> = outputs.iter().flat_map(|o| ids(&o.batch.batch)).collect();
        assert_eq!(got, case.oracle());
        // Exactly batch_size rows per output but the last; one empty output iff no rows.
        let sizes: Vec<usize> = outputs.iter().map(|o| o.batch.num_rows()).collect();
        if case.owner.is_empty() {
            let expected: &[usize] = if case.inputs.is_empty() { &[] } else { &[0] };
            assert_eq!(sizes, expected);
        } else if let Some((last, full)) = sizes.split_last() {
            assert!(full.iter().all(|&n| n == batch_size), "{sizes:?}");
            assert!((1..=batch_size).contains(last), "{sizes:?}");
        }
        // Exhaustion is prompt: in the output with the vnode's last row, or the first one.
        for (i, (vnode, _)) in case.inputs.iter().enumerate() {
            let mine = case.input_ids(i);
            let reported = outputs
                .iter()
                .position(|o| o.exhausted.contains(vnode))
                .unwrap();
            let expected = match mine.last() {
                None => 0,
                Some(last) => outputs
                    .iter()
                    .position(|o| ids(&o.batch.batch).contains(last))
                    .unwrap(),
            };
            assert_eq!(reported, expected, "vnode {vnode}");
        }
    }

    #[test]
    fn fuzz_against_a_sort_oracle() {
        let mut seed = 0;
        let shapes = [
            KeyShape::Int,
            KeyShape::NullableInt,
            KeyShape::Composite,
            KeyShape::FewPrefixes,
        ];
        for shape in shapes {
            for num_inputs in [1, 16, 256] {
                for batch_size in [1, 2, 7, 1024] {
                    for _ in 0..2 {
                        seed += 1;
                        let mut rng = StdRng::seed_from_u64(seed);
                        let case = random_case(&mut rng, shape, num_inputs, 3000);
                        let expected_kind = match shape {
                            KeyShape::Int => "Primitive",
                            _ => "Rows",
                        };
                        let kind = format!("{:?}", kway(&case, batch_size).cursor_kind());
                        assert!(kind.starts_with(expected_kind), "{kind}");
                        check_kway(&case, batch_size);
                    }
                }
            }
        }
    }

    #[test]
    fn clustered_keys_merge_in_runs_like_a_sort() {
        let mut seed = 1000;
        for shape in [KeyShape::Int, KeyShape::Composite, KeyShape::FewPrefixes] {
            for num_inputs in [1, 2, 16] {
                for batch_size in [1, 7, 64, 1024] {
                    seed += 1;
                    let mut rng = StdRng::seed_from_u64(seed);
                    check_kway(
                        &clustered_case(&mut rng, shape, num_inputs, 3000),
                        batch_size,
                    );
                }
            }
        }
    }

    #[test]
    fn the_row_cursor_gives_the_same_output_as_the_primitive_one() {
        let mut rng = StdRng::seed_from_u64(99);
        let spread = random_case(&mut rng, KeyShape::Int, 16, 3000);
        let clustered = clustered_case(&mut rng, KeyShape::Int, 16, 3000);
        for case in [spread, clustered] {
            let primitive = drain(&mut kway(&case, 7), usize::MAX).unwrap();
            let mut rows = KWayMerge::with_row_cursor(case.scans(), 7).unwrap();
            assert_eq!(rows.cursor_kind(), &CursorKind::Rows);
            let rows = drain(&mut rows, usize::MAX).unwrap();
            assert_eq!(primitive.len(), rows.len());
            for (p, r) in primitive.iter().zip(&rows) {
                assert_eq!(p.batch.batch, r.batch.batch);
                assert_eq!(p.progress, r.progress);
                assert_eq!(p.exhausted, r.exhausted);
            }
        }
    }

    #[test]
    fn restarted_inputs_merge_like_a_fresh_merge() {
        for seed in 0..60 {
            check_restarts(seed, true, |inputs, batch_size| {
                KWayMerge::new(&int_key(false), inputs, batch_size).unwrap()
            });
        }
    }

    /// Between two outputs a patch deletes the rest of a vnode (found exhausted), then a
    /// second one gives it a row again: it is not reported exhausted before that row.
    #[test]
    fn a_vnode_patched_empty_then_given_a_row_is_not_reported_exhausted_early() {
        let pk = int_key(false);
        let inputs = vec![
            (
                VirtualNode::new(1),
                VecScan::new(vec![int_rows(&pk, &[1, 5])]),
            ),
            (
                VirtualNode::new(2),
                VecScan::new(vec![int_rows(&pk, &[2, 9])]),
            ),
        ];
        let mut merge = KWayMerge::new(&pk, inputs, 1).unwrap();
        let first = merge.next_output().unwrap().unwrap();
        assert_eq!(first.batch.num_rows(), 1);
        let after = first.batch.last_position();
        let delete = Patch::new(int_rows(&pk, &[5]), Some(vec![true].into())).unwrap();
        merge
            .patch(VirtualNode::new(1), delete, after.as_ref())
            .unwrap();
        let insert = Patch::new(int_rows(&pk, &[7]), None).unwrap();
        merge
            .patch(VirtualNode::new(1), insert, after.as_ref())
            .unwrap();
        let outputs = drain(&mut merge, 10).unwrap();
        let mut seen = Vec::new();
        for output in &outputs {
            let keys = output.batch.batch.column(0).as_primitive::<Int64Type>();
            seen.extend(keys.values().iter().copied());
            if output.exhausted.contains(&VirtualNode::new(1)) {
                assert!(
                    seen.contains(&7),
                    "vnode 1 reported before its row 7: {seen:?}"
                );
            }
        }
        assert_eq!(seen, [2, 7, 9]);
        let reported = outputs
            .iter()
            .filter(|o| o.exhausted.contains(&VirtualNode::new(1)))
            .count();
        assert_eq!(reported, 1);
    }

    #[test]
    fn a_restart_of_an_unknown_vnode_is_an_internal_error() {
        let pk = int_key(false);
        let mut merge =
            KWayMerge::new(&pk, vec![(VirtualNode::new(1), VecScan::new(vec![]))], 4).unwrap();
        let err = merge
            .restart(VirtualNode::new(2), VecScan::new(vec![]), None)
            .unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
    }

    #[test]
    fn equal_keys_break_ties_by_input_index() {
        let pk = int_key(false);
        let inputs = |pk: &PrimaryKey| {
            vec![
                (
                    VirtualNode::new(5),
                    VecScan::new(vec![int_rows_with_ids(pk, &[1, 2], 10)]),
                ),
                (
                    VirtualNode::new(1),
                    VecScan::new(vec![
                        int_rows_with_ids(pk, &[1], 20),
                        int_rows_with_ids(pk, &[2, 3], 21),
                    ]),
                ),
                (
                    VirtualNode::new(3),
                    VecScan::new(vec![int_rows_with_ids(pk, &[0, 2], 30)]),
                ),
            ]
        };
        let expected = vec![30, 10, 20, 11, 21, 31, 22];
        for batch_size in [1, 3, 100] {
            let primitive = KWayMerge::new(&pk, inputs(&pk), batch_size).unwrap();
            let rows = KWayMerge::with_row_cursor(inputs(&pk), batch_size).unwrap();
            for mut merge in [primitive, rows] {
                let outputs = drain(&mut merge, 100).unwrap();
                let got: Vec<u64> = outputs.iter().flat_map(|o| ids(&o.batch.batch)).collect();
                assert_eq!(got, expected, "batch size {batch_size}");
            }
        }
    }

    #[test]
    fn keys_going_backwards_are_an_order_violation() {
        let pk = int_key(false);
        let inputs = vec![
            (
                VirtualNode::new(0),
                VecScan::new(vec![int_rows(&pk, &[1, 2, 3])]),
            ),
            (
                VirtualNode::new(8),
                VecScan::new(vec![int_rows(&pk, &[4, 6]), int_rows(&pk, &[5])]),
            ),
        ];
        let mut merge = KWayMerge::new(&pk, inputs, 2).unwrap().with_table_name("t");
        let err = drain(&mut merge, 10).unwrap_err();
        match err {
            Error::OrderViolation { table, vnode, row } => {
                assert_eq!((table.as_str(), vnode, row), ("t", 8, 0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_vnodes_are_reported_in_the_first_output() {
        let pk = int_key(false);
        let empty = || VecScan::new(vec![int_rows(&pk, &[]), int_rows(&pk, &[])]);
        let inputs = vec![
            (VirtualNode::new(1), empty()),
            (VirtualNode::new(2), VecScan::new(vec![])),
        ];
        let mut merge = KWayMerge::new(&pk, inputs, 4).unwrap();
        let first = merge.next_output().unwrap().unwrap();
        assert!(first.batch.is_empty() && first.progress.is_empty());
        assert_eq!(
            first.batch.batch.schema(),
            int_rows(&pk, &[]).batch.schema()
        );
        assert_eq!(
            first.exhausted,
            vec![VirtualNode::new(1), VirtualNode::new(2)]
        );
        assert!(merge.next_output().unwrap().is_none());
        assert!(merge.next_output().unwrap().is_none());
    }

    #[test]
    fn no_inputs_give_no_output_and_a_zero_batch_size_is_rejected() {
        let pk = int_key(false);
        let mut merge = KWayMerge::<VecScan>::new(&pk, vec![], 4).unwrap();
        assert!(merge.next_output().unwrap().is_none());
        assert!(matches!(
            KWayMerge::<VecScan>::new(&pk, vec![], 0),
            Err(Error::InvalidConfig(_))
        ));
    }
}
