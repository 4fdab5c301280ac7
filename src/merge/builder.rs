//! How merged rows are materialized: indices first, one `interleave` per column at the end.
//!
//! The merge loop does not copy rows. Each input's rows (a [`Run`]: a range of rows it may
//! share with other inputs, such as the block of a run file several vnodes are packed into)
//! go into a *slot*; each winning row (or run of rows) is recorded as an index into the
//! shared rows of its slot. [`OutputBuilder::build`] turns the recorded indices into one
//! batch with `interleave` (per column; the encoded keys are interleaved too, or encoded
//! afresh, see [`OutputKeys`]) from the shared rows those rows use, each once however many
//! inputs' ranges they hold, then frees every slot that no cursor points into any more. When
//! the whole output is one stretch of one shared batch (clustered keys), it is a zero-copy
//! slice instead.
//!
//! ```text
//!   slots                        indices                       output
//!   0: in0 [a c e] (retired)     (0,0) (1,0) (0,1) (1,1)       a b c d e
//!   1: in1 [b d]   (current)     (0,2)                 --> interleave -->
//!   2: in0 [g h]   (current)
//!   after build: slot 0 is freed (in0 moved on to slot 2); slots 1 and 2 keep their numbers
//!   (here each slot's rows are their own; slots that are ranges of one shared batch are
//!   one source of the interleave, indexed by their rows' places in it)
//! ```
//!
//! A batch stays in a slot while it is its input's current batch. An input only gets a new
//! batch once its cursor passed every row of the old one, so a non-current slot is fully
//! consumed: as soon as its last row is materialized, the batch is dropped. Memory is bounded
//! by one current batch per input plus the batches consumed by one output.
//!
//! The builder also counts, per input, the rows in the output and the output row of its last
//! one: that becomes the vnode's [`VnodeAdvance`].

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, BinaryArray, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use arrow_select::interleave::interleave;

use crate::error::{Result, internal};
use crate::interleave::interleave_batches;
use crate::key::{Position, PrimaryKey};
use crate::merge::VnodeAdvance;
use crate::runs::KeyedBatch;
use crate::runs::{Rows, Run};
use crate::vnode::VirtualNode;

/// An empty batch with `schema`, or with no columns if no schema is known.
pub(crate) fn empty_batch(schema: Option<&SchemaRef>) -> KeyedBatch {
    let schema = schema.cloned().unwrap_or_else(|| Arc::new(Schema::empty()));
    KeyedBatch {
        batch: RecordBatch::new_empty(schema),
        keys: BinaryArray::from(Vec::<&[u8]>::new()),
    }
}

/// One input's rows referenced by the indices.
#[derive(Debug)]
struct Slot {
    run: Run,
}

/// What one input contributed to the output being built.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    rows: usize,
    last_out_row: usize,
}

/// How the builder produces the output's encoded keys.
#[derive(Debug)]
pub(crate) enum OutputKeys {
    /// Gathered from the input batches' keys with `interleave`: works for every key.
    Gather,
    /// Encoded afresh from the output rows with the table's key. Chosen for a key of
    /// fixed-width columns only: arrow-row encodes one integer column at about 1.5 ns a row
    /// (`benches/key.rs`), where `interleave` copies each short value with its own `memcpy`
    /// (about 9 ns a row in `benches/merge.rs`; `merge_composite/256x1M/kway`, an
    /// `(Int64, Int32)` key: +8%).
    Encode(PrimaryKey),
}

/// Collects `(slot, row)` indices and materializes them. See the module docs.
///
/// Every cost of a build is proportional to the rows and the batches of that output, never
/// to the number of inputs: slots live in a slab with stable numbers (a free list, no
/// renumbering), and a build interleaves only the slots its rows use.
#[derive(Debug)]
pub(crate) struct OutputBuilder {
    vnodes: Vec<VirtualNode>,
    /// The slab of slots; `None` is free.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Per input: the slot of its current batch.
    current: Vec<Option<usize>>,
    /// Slots that stopped being their input's current batch: rows of the output being built
    /// may still point into them, so they are freed when it is built.
    retired: Vec<usize>,
    /// The shared rows the recorded rows are ranges of, each once, in order of first use.
    sources: Vec<Arc<Rows>>,
    /// The place in `sources` of shared rows, by their address.
    source_of: hashbrown::HashMap<usize, usize>,
    /// Per input with rows in the output being built: the place in `sources` of its current
    /// slot's rows, and where its range starts in them.
    current_used: Vec<(usize, usize)>,
    /// `(place in sources, row in those rows)` of every recorded row.
    indices: Vec<(usize, usize)>,
    tallies: Vec<Tally>,
    /// Inputs with rows in the output being built, in order of their first row.
    touched: Vec<usize>,
    keys: OutputKeys,
}

impl OutputBuilder {
    /// A builder for inputs of these vnodes (input `i` is `vnodes[i]`).
    pub fn new(vnodes: Vec<VirtualNode>, batch_size: usize, keys: OutputKeys) -> Self {
        let k = vnodes.len();
        Self {
            slots: Vec::with_capacity(2 * k),
            free: Vec::new(),
            current: vec![None; k],
            retired: Vec::new(),
            sources: Vec::new(),
            source_of: hashbrown::HashMap::new(),
            current_used: vec![(0, 0); k],
            indices: Vec::with_capacity(batch_size),
            tallies: vec![Tally::default(); k],
            touched: Vec::new(),
            vnodes,
            keys,
        }
    }

    /// Makes `run` the current rows of `input`.
    pub fn push_run(&mut self, input: usize, run: Run) {
        if self.tallies[input].rows > 0 {
            // The input has rows in this output and moves on to new rows mid-build.
            self.current_used[input] = self.add_source(&run);
        }
        let slot = Slot { run };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        if let Some(old) = self.current[input].replace(id) {
            self.retired.push(old);
        }
    }

    /// Adds the shared rows of `run` to the sources (once) and returns what `current_used`
    /// holds for it: their place there and where the run starts in them.
    fn add_source(&mut self, run: &Run) -> (usize, usize) {
        let (shared, start) = run.rows();
        let address = Arc::as_ptr(shared) as usize;
        let place = *self.source_of.entry(address).or_insert_with(|| {
            self.sources.push(shared.clone());
            self.sources.len() - 1
        });
        (place, start)
    }

    /// Marks `input` as having no current batch (its scan is exhausted or restarted).
    pub fn finish_input(&mut self, input: usize) {
        if let Some(old) = self.current[input].take() {
            self.retired.push(old);
        }
    }

    /// Appends rows `start..start + n` (`n > 0`) of `input`'s current batch to the output.
    // Always: the merge loop calls this once a row, and LLVM kept it out of line
    // (`merge/256x1M/kway`: +6% inlined).
    #[inline(always)]
    pub fn push_rows(&mut self, input: usize, start: usize, n: usize) -> Result<()> {
        if self.tallies[input].rows == 0 {
            // The input's first rows in this output: its current rows join the sources (rows
            // it moves on to later join in `push_run`).
            let id = self.current[input]
                .ok_or_else(|| internal!("merge input {input} emitted a row with no batch"))?;
            let run = match &self.slots[id] {
                Some(slot) => slot.run.clone(),
                None => return Err(internal!("merge output slot {id} is free")),
            };
            self.touched.push(input);
            self.current_used[input] = self.add_source(&run);
        }
        let (source, offset) = self.current_used[input];
        let start = offset + start;
        let tally = &mut self.tallies[input];
        tally.rows += n;
        if n == 1 {
            self.indices.push((source, start));
        } else {
            self.indices
                .extend((start..start + n).map(|row| (source, row)));
        }
        tally.last_out_row = self.indices.len() - 1;
        Ok(())
    }

    /// When every recorded row is one contiguous stretch of one shared batch: its first row.
    fn single_range(&self) -> Option<usize> {
        let &(_, first) = self.indices.first()?;
        let contiguous = self.sources.len() == 1
            && (self.indices.iter().enumerate()).all(|(i, &(_, row))| row == first + i);
        contiguous.then_some(first)
    }

    /// The current rows of `input`, if it has any.
    pub fn current_run(&self, input: usize) -> Option<&Run> {
        let id = (*self.current.get(input)?)?;
        self.slots.get(id)?.as_ref().map(|slot| &slot.run)
    }

    /// Rows recorded for the output being built.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Materializes the recorded rows and each input's advance, then drops consumed batches.
    ///
    /// With no rows recorded, the batch is empty, with the schema of `fallback` (the schema
    /// of any batch seen) or no columns if no input produced a batch at all.
    pub fn build(
        &mut self,
        fallback: Option<&SchemaRef>,
    ) -> Result<(KeyedBatch, Vec<VnodeAdvance>)> {
        if self.indices.is_empty() {
            self.release();
            return Ok((empty_batch(fallback), Vec::new()));
        }
        let KeyedBatch { batch, keys } = match self.single_range() {
            Some(start) => self.sources[0].data.slice(start, self.indices.len()),
            None => self.interleave()?,
        };
        let progress = self
            .touched
            .iter()
            .map(|&input| {
                let tally = std::mem::take(&mut self.tallies[input]);
                VnodeAdvance {
                    vnode: self.vnodes[input],
                    last: Position::from_keys(&keys, tally.last_out_row),
                    rows: tally.rows,
                }
            })
            .collect();
        self.touched.clear();
        self.indices.clear();
        self.release();
        Ok((KeyedBatch { batch, keys }, progress))
    }

    /// Gathers the recorded rows from the shared rows they are in, column by column.
    fn interleave(&self) -> Result<KeyedBatch> {
        let used: Vec<&KeyedBatch> = self.sources.iter().map(|rows| &rows.data).collect();
        let batches: Vec<&RecordBatch> = used.iter().map(|b| &b.batch).collect();
        let batch = interleave_batches(&batches, &self.indices)?;
        let keys = match &self.keys {
            OutputKeys::Encode(pk) => pk.encode(&batch)?,
            OutputKeys::Gather => {
                let keys: Vec<&dyn Array> = used.iter().map(|b| &b.keys as _).collect();
                let keys = interleave(&keys, &self.indices)?;
                keys.as_binary_opt::<i32>()
                    .ok_or_else(|| internal!("interleaved keys are not binary"))?
                    .clone()
            }
        };
        Ok(KeyedBatch { batch, keys })
    }

    /// Ends a build: forgets which rows it used and frees the retired slots.
    fn release(&mut self) {
        self.sources.clear();
        self.source_of.clear();
        for id in self.retired.drain(..) {
            self.slots[id] = None;
            self.free.push(id);
        }
    }

    /// Batches held (for tests of the release rule).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use arrow_array::types::UInt64Type;

    use super::*;
    use crate::merge::testing::{ids, int_key, int_rows_with_ids};

    fn whole(batch: KeyedBatch) -> Run {
        Run::new(batch, None).unwrap()
    }

    #[test]
    fn rows_interleave_and_consumed_batches_are_dropped() {
        let pk = int_key(false);
        let vnodes = vec![VirtualNode::new(10), VirtualNode::new(20)];
        let mut builder = OutputBuilder::new(vnodes, 4, OutputKeys::Gather);
        builder.push_run(0, whole(int_rows_with_ids(&pk, &[1, 3, 5], 100)));
        builder.push_run(1, whole(int_rows_with_ids(&pk, &[2, 4], 200)));
        for (input, row) in [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)] {
            builder.push_rows(input, row, 1).unwrap();
        }
        // Input 0 moves on; input 1 is exhausted.
        builder.push_run(0, whole(int_rows_with_ids(&pk, &[7, 8], 300)));
        builder.finish_input(1);
        builder.push_rows(0, 0, 1).unwrap();
        assert_eq!(builder.held(), 3);
        let (out, progress) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![100, 200, 101, 201, 102, 300]);
        assert_eq!(out.keys, pk.encode(&out.batch).unwrap());
        assert_eq!(builder.held(), 1, "only input 0's current batch is kept");
        assert_eq!(
            progress,
            vec![
                VnodeAdvance {
                    vnode: VirtualNode::new(10),
                    last: Position::from_keys(&out.keys, 5),
                    rows: 4
                },
                VnodeAdvance {
                    vnode: VirtualNode::new(20),
                    last: Position::from_keys(&out.keys, 3),
                    rows: 2
                },
            ]
        );
        // The kept batch is still addressable after renumbering.
        builder.push_rows(0, 1, 1).unwrap();
        let (out, progress) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![301]);
        assert_eq!(progress.len(), 1);
        assert_eq!(progress[0].rows, 1);
    }

    #[test]
    fn runs_are_recorded_at_once_and_one_stretch_of_one_batch_is_sliced() {
        let pk = int_key(false);
        let vnodes = vec![VirtualNode::new(10), VirtualNode::new(20)];
        let mut builder = OutputBuilder::new(vnodes, 8, OutputKeys::Encode(pk.clone()));
        builder.push_run(0, whole(int_rows_with_ids(&pk, &[1, 2, 3, 4, 5, 6], 100)));
        builder.push_run(1, whole(int_rows_with_ids(&pk, &[7, 8], 200)));
        // Interleaved runs: gathered.
        builder.push_rows(0, 0, 2).unwrap();
        builder.push_rows(1, 0, 1).unwrap();
        builder.push_rows(0, 2, 1).unwrap();
        let (out, progress) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![100, 101, 200, 102]);
        assert_eq!(out.keys, pk.encode(&out.batch).unwrap());
        let rows: Vec<(u16, usize)> = progress.iter().map(|a| (a.vnode.get(), a.rows)).collect();
        assert_eq!(rows, vec![(10, 3), (20, 1)]);
        assert_eq!(progress[0].last, Position::from_keys(&out.keys, 3));
        // One input, one batch, in two pushes: a slice of that batch.
        builder.push_rows(0, 3, 1).unwrap();
        builder.push_rows(0, 4, 2).unwrap();
        let (out, progress) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![103, 104, 105]);
        assert_eq!(out.keys, pk.encode(&out.batch).unwrap());
        let ids_of = |b: &RecordBatch| b.column(1).as_primitive::<UInt64Type>().values().clone();
        let source = &builder.current_run(0).unwrap().rows().0.data.batch;
        assert_eq!(
            ids_of(&out.batch).as_ptr(),
            ids_of(source)[3..].as_ptr(),
            "not copied"
        );
        assert_eq!(progress.len(), 1);
        assert_eq!(
            (progress[0].rows, &progress[0].last),
            (3, &Position::from_keys(&out.keys, 2))
        );
    }

    #[test]
    fn ranges_of_one_shared_batch_are_one_source_and_adjacent_ones_a_slice() {
        let pk = int_key(false);
        let vnodes = vec![
            VirtualNode::new(1),
            VirtualNode::new(2),
            VirtualNode::new(3),
        ];
        let mut builder = OutputBuilder::new(vnodes, 8, OutputKeys::Gather);
        // One block holding three inputs' rows, as a run file packs short runs.
        let block =
            Rows::new(int_rows_with_ids(&pk, &[1, 3, 5, 2, 4, 6, 7, 8], 100), None).unwrap();
        builder.push_run(0, Run::range(&block, 0, 3).unwrap());
        builder.push_run(1, Run::range(&block, 3, 3).unwrap());
        builder.push_run(2, Run::range(&block, 6, 2).unwrap());
        for (input, row) in [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)] {
            builder.push_rows(input, row, 1).unwrap();
        }
        assert_eq!(builder.sources.len(), 1, "one block, one source");
        let (out, progress) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![100, 103, 101, 104, 102, 105]);
        assert_eq!(out.keys, pk.encode(&out.batch).unwrap());
        assert_eq!(progress[1].last, Position::from_keys(&out.keys, 5));
        // Input 2's rows alone: a slice of the block, at its range's place in it.
        builder.push_rows(2, 0, 2).unwrap();
        let (out, _) = builder.build(None).unwrap();
        assert_eq!(ids(&out.batch), vec![106, 107]);
        let ids_of = |b: &RecordBatch| b.column(1).as_primitive::<UInt64Type>().values().clone();
        assert_eq!(
            ids_of(&out.batch).as_ptr(),
            ids_of(&block.data.batch)[6..].as_ptr(),
            "not copied"
        );
    }

    #[test]
    fn an_empty_output_has_the_fallback_schema() {
        let pk = int_key(false);
        let schema = int_rows_with_ids(&pk, &[], 0).batch.schema();
        let mut builder = OutputBuilder::new(vec![VirtualNode::new(1)], 4, OutputKeys::Gather);
        let (out, progress) = builder.build(Some(&schema)).unwrap();
        assert!(out.is_empty() && progress.is_empty());
        assert_eq!(out.batch.schema(), schema);
        assert_eq!(out.keys.len(), 0);
        assert!(matches!(
            builder.push_rows(0, 0, 1),
            Err(Error::Internal(_))
        ));
    }
}
