//! The changelog model: the live keys it can name, seeded events, valid by construction, in
//! memory bounded whatever the table's size.
//!
//! A live key is one of:
//! - *cold*: a snapshot key no change has touched; its values are the snapshot row's, made
//!   again by [`Shape::originals`]. They are not listed: [`ColdKeys`] visits the snapshot's
//!   slots in a seeded random permutation ([`Permutation`]), so the next one is a uniform
//!   pick among the cold keys left, and a count says how many are left;
//! - *hot*: inserted or changed by the changelog, with a [`Source`] for its values (sample
//!   rows, or the key's snapshot row, per column), at most [`Limits::hot_keys`] of them;
//! - *frozen*: changed while the hot keys were full; live, never touched again.
//!
//! An event on an existing key picks uniformly among the cold and hot keys: while nothing is
//! frozen that is a uniform pick among all live keys, as a model holding the table would make.

use super::*;

/// A [`Source`] column taken from the key's snapshot row.
const ORIGINAL: u32 = u32::MAX;

/// Where a live key's values come from: its snapshot row, one sample row, or per column
/// (a sample row, or [`ORIGINAL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Original,
    Row(u32),
    Columns(Box<[u32]>),
}

impl Source {
    fn column(&self, c: usize) -> u32 {
        match self {
            Source::Original => ORIGINAL,
            Source::Row(r) => *r,
            Source::Columns(cols) => cols[c],
        }
    }
}

/// A seeded permutation of `0..size`: a four-round Feistel network on the smallest even
/// number of bits that holds `size`, walking the cycle until it lands inside (at most four
/// steps on average). Nothing is stored per element.
#[derive(Debug, Clone)]
pub(super) struct Permutation {
    size: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    pub(super) fn new(size: u64, rng: &mut StdRng) -> Self {
        let bits = (64 - size.saturating_sub(1).leading_zeros()).max(2);
        Self {
            size,
            half_bits: bits.div_ceil(2),
            keys: [rng.random(), rng.random(), rng.random(), rng.random()],
        }
    }

    /// The image of `x` (`x < size`).
    pub(super) fn apply(&self, mut x: u64) -> u64 {
        loop {
            x = self.round_trip(x);
            if x < self.size {
                return x;
            }
        }
    }

    /// One pass of the network: a bijection of `0..2^(2 * half_bits)`.
    fn round_trip(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let f = mix(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

/// The cold keys: the snapshot's slots in a random order, the empty ones skipped.
struct ColdKeys {
    permutation: Permutation,
    /// The next position of the permutation to visit.
    next: u64,
    /// Keys found ahead, in permutation order.
    ready: VecDeque<u64>,
}

impl ColdKeys {
    /// Permutation positions looked up at a time.
    const BLOCK: u64 = 256;

    /// The next cold key. The caller knows one is left.
    fn next(&mut self, shape: &dyn Shape) -> Result<u64> {
        let mut slots = Vec::with_capacity(Self::BLOCK as usize);
        loop {
            if let Some(id) = self.ready.pop_front() {
                return Ok(id);
            }
            let size = self.permutation.size;
            if self.next >= size {
                return Err(internal!(
                    "gen: the snapshot's {size} slots hold fewer keys than it wrote"
                ));
            }
            let end = size.min(self.next + Self::BLOCK);
            slots.clear();
            slots.extend((self.next..end).map(|p| self.permutation.apply(p)));
            self.next = end;
            shape.slot_keys(&slots, &mut self.ready)?;
        }
    }
}

/// The hot keys, in slots `0..len` for uniform picks: each slot's id and its values' sources
/// per column (flat, `width` a slot: no allocation per key), and a map from id to slot.
/// About `8 + 4 * width + 30` bytes a key.
struct HotKeys {
    ids: Vec<u64>,
    columns: Vec<u32>,
    width: usize,
    slot_of: HashMap<u64, u32>,
    capacity: usize,
    /// Keys changed while full: live, never touched again.
    frozen: u64,
}

impl HotKeys {
    /// Room for `capacity` keys, reserved at once: growing by doubling would copy (and, with
    /// an allocator that keeps what is freed, hold) the smaller tables too. Pages not yet
    /// used are not touched.
    fn new(width: usize, capacity: usize) -> Self {
        // Slots are `u32`.
        let capacity = capacity.min(u32::MAX as usize);
        Self {
            ids: Vec::with_capacity(capacity),
            columns: Vec::with_capacity(capacity * width),
            width,
            slot_of: HashMap::with_capacity(capacity),
            capacity,
            frozen: 0,
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn slot_columns(&self, slot: usize) -> &[u32] {
        &self.columns[slot * self.width..(slot + 1) * self.width]
    }

    /// The values of `id`.
    fn source(&self, id: u64) -> Result<Source> {
        let slot = *self
            .slot_of
            .get(&id)
            .ok_or_else(|| internal!("gen: hot key {id} has no values"))?;
        Ok(Source::Columns(self.slot_columns(slot as usize).into()))
    }

    /// Sets the values of `id`: a hot key keeps its slot; another becomes hot if there is
    /// room, frozen otherwise.
    fn set(&mut self, id: u64, source: &Source) {
        let slot = match self.slot_of.get(&id) {
            Some(&slot) => slot as usize,
            None if self.ids.len() < self.capacity => {
                self.slot_of.insert(id, self.ids.len() as u32);
                self.ids.push(id);
                self.columns
                    .resize(self.columns.len() + self.width, ORIGINAL);
                self.ids.len() - 1
            }
            None => {
                self.frozen += 1;
                return;
            }
        };
        let width = self.width;
        for (c, to) in self.columns[slot * width..(slot + 1) * width]
            .iter_mut()
            .enumerate()
        {
            *to = source.column(c);
        }
    }

    /// Forgets `id` (deleted): the last slot moves into its place.
    fn remove(&mut self, id: u64) {
        let Some(slot) = self.slot_of.remove(&id) else {
            return;
        };
        let (slot, last) = (slot as usize, self.ids.len() - 1);
        self.ids.swap_remove(slot);
        if slot != last {
            let width = self.width;
            self.columns
                .copy_within(last * width..(last + 1) * width, slot * width);
            if let Some(moved) = self.slot_of.get_mut(&self.ids[slot]) {
                *moved = slot as u32;
            }
        }
        self.columns.truncate(last * self.width);
    }
}

/// The live keys the changelog can touch.
struct LiveKeys {
    cold: ColdKeys,
    /// Cold keys left.
    cold_left: u64,
    hot: HotKeys,
}

impl LiveKeys {
    /// A uniform pick among the cold and hot keys, with its values; `None` if there is none.
    fn pick(&mut self, shape: &dyn Shape, rng: &mut StdRng) -> Result<Option<(u64, Source)>> {
        let hot = self.hot.len() as u64;
        let total = hot + self.cold_left;
        if total == 0 {
            return Ok(None);
        }
        let u = rng.random_range(0..total);
        if u < hot {
            let id = self.hot.ids[u as usize];
            Ok(Some((id, self.hot.source(id)?)))
        } else {
            // Taken out of the cold keys now: whatever the event does, the key is no longer
            // the snapshot's untouched row (deleted, or hot/frozen with new values).
            self.cold_left -= 1;
            Ok(Some((self.cold.next(shape)?, Source::Original)))
        }
    }
}

/// The counts of a generated changelog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ChangeCounts {
    pub(super) rows: u64,
    pub(super) epochs: u64,
    pub(super) first_epoch: Option<u64>,
    pub(super) last_epoch: Option<u64>,
    /// Keys frozen (changed while the hot keys were full).
    pub(super) frozen: u64,
}

/// Change rows being gathered, as key ids and per-column value sources.
struct Chunk {
    epochs: Vec<u64>,
    ops: Vec<Op>,
    ids: Vec<u64>,
    /// `sources[c][row]`: where column `c` of change row `row` comes from.
    sources: Vec<Vec<u32>>,
}

impl Chunk {
    fn new(width: usize) -> Self {
        Self {
            epochs: Vec::new(),
            ops: Vec::new(),
            ids: Vec::new(),
            sources: vec![Vec::new(); width],
        }
    }

    fn push(&mut self, epoch: u64, op: Op, id: u64, source: &Source) {
        self.epochs.push(epoch);
        self.ops.push(op);
        self.ids.push(id);
        for (c, column) in self.sources.iter_mut().enumerate() {
            column.push(source.column(c));
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    /// The chunk's rows as a changelog batch, emptying it: key columns from the shape, value
    /// columns from the sample and from the snapshot rows made again.
    fn take_batch(&mut self, shape: &dyn Shape, sample: &RecordBatch) -> Result<RecordBatch> {
        let table = shape.schema();
        let keys = shape.key_indices();
        // The snapshot rows needed, each made once.
        let mut original_of: HashMap<u64, usize> = HashMap::new();
        let mut needed = Vec::new();
        for (row, &id) in self.ids.iter().enumerate() {
            let wants = self
                .sources
                .iter()
                .enumerate()
                .any(|(c, s)| s[row] == ORIGINAL && !keys.contains(&c));
            if wants {
                original_of.entry(id).or_insert_with(|| {
                    needed.push(id);
                    needed.len() - 1
                });
            }
        }
        let originals = if needed.is_empty() {
            None
        } else {
            Some(shape.originals(&needed)?)
        };
        let mut columns: Vec<Option<ArrayRef>> = vec![None; table.fields().len()];
        for (&c, column) in keys.iter().zip(shape.key_columns(&self.ids)?) {
            columns[c] = Some(column);
        }
        for (c, slot) in columns.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let mut indices = Vec::with_capacity(self.ids.len());
            for (row, &source) in self.sources[c].iter().enumerate() {
                if source == ORIGINAL {
                    let at = original_of.get(&self.ids[row]).copied().ok_or_else(|| {
                        internal!("gen: no snapshot row made for key {}", self.ids[row])
                    })?;
                    indices.push((1, at));
                } else {
                    indices.push((0, source as usize));
                }
            }
            let mut arrays: Vec<&dyn arrow_array::Array> = vec![sample.column(c).as_ref()];
            if let Some(originals) = &originals {
                arrays.push(originals.column(c).as_ref());
            }
            *slot = Some(arrow_select::interleave::interleave(&arrays, &indices)?);
        }
        let mut all: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(std::mem::take(&mut self.epochs))),
            Arc::new(Int8Array::from_iter_values(
                self.ops.drain(..).map(|op| op.code()),
            )),
        ];
        for column in columns {
            all.push(column.ok_or_else(|| internal!("gen: a changelog column is missing"))?);
        }
        self.ids.clear();
        for s in &mut self.sources {
            s.clear();
        }
        Ok(RecordBatch::try_new(changelog_schema(&table, true), all)?)
    }
}

/// Generates `opts.changes` change rows over the snapshot of `shape` (already streamed,
/// `snapshot_rows` rows), values drawn from `sample`, handing each chunk to `write`.
pub(super) fn generate(
    shape: &mut dyn Shape,
    sample: &RecordBatch,
    snapshot_rows: u64,
    opts: &GenOptions,
    limits: &Limits,
    rng: &mut StdRng,
    write: &mut dyn FnMut(RecordBatch) -> Result<()>,
) -> Result<ChangeCounts> {
    let width = shape.schema().fields().len();
    let value_columns: Vec<usize> = (0..width)
        .filter(|c| !shape.key_indices().contains(c))
        .collect();
    let mut live = LiveKeys {
        cold: ColdKeys {
            permutation: Permutation::new(shape.slots(), rng),
            next: 0,
            ready: VecDeque::new(),
        },
        cold_left: snapshot_rows,
        // No more hot keys than events.
        hot: HotKeys::new(
            width,
            limits
                .hot_keys
                .min(usize::try_from(opts.changes).unwrap_or(usize::MAX)),
        ),
    };
    let sample_rows = sample.num_rows() as u32;
    let random_row = |rng: &mut StdRng| -> Result<u32> {
        if sample_rows == 0 {
            return Err(Error::config(
                "cannot generate changes for an empty table".into(),
            ));
        }
        Ok(rng.random_range(0..sample_rows))
    };
    let total = opts.changes;
    let mut counts = ChangeCounts::default();
    let mut chunk = Chunk::new(width);
    let mut done = 0u64;
    while done < total {
        // In u128: `done * epochs` overflows u64 for epochs near 2^64, and the epochs must
        // never decrease.
        let epoch = 1 + (u128::from(done) * u128::from(opts.epochs) / u128::from(total)) as u64;
        if counts.last_epoch != Some(epoch) {
            counts.epochs += 1;
            counts.first_epoch.get_or_insert(epoch);
            counts.last_epoch = Some(epoch);
        }
        let room_for_pair = total - done >= 2;
        let roll: f64 = rng.random();
        let existing = if roll < 0.3 {
            None
        } else {
            live.pick(shape, rng)?
        };
        match existing {
            // Insert a new key, values of a random sample row.
            None => {
                let id = shape.new_key(rng)?;
                let source = Source::Row(random_row(rng)?);
                chunk.push(epoch, Op::Insert, id, &source);
                live.hot.set(id, &source);
            }
            Some((id, old)) if roll < 0.5 || !room_for_pair => {
                chunk.push(epoch, Op::Delete, id, &old);
                live.hot.remove(id);
            }
            // Update: one or two value columns take another sample row's values.
            Some((id, old)) if roll < 0.9 => {
                let mut new: Box<[u32]> = (0..width).map(|c| old.column(c)).collect();
                let from = random_row(rng)?;
                for _ in 0..rng.random_range(1..=2) {
                    if !value_columns.is_empty() {
                        new[value_columns[rng.random_range(0..value_columns.len())]] = from;
                    }
                }
                let new = Source::Columns(new);
                chunk.push(epoch, Op::UpdateDelete, id, &old);
                chunk.push(epoch, Op::UpdateInsert, id, &new);
                live.hot.set(id, &new);
            }
            // Delete and reinsert the same key, with other values, in one epoch.
            Some((id, old)) => {
                let new = Source::Row(random_row(rng)?);
                chunk.push(epoch, Op::Delete, id, &old);
                chunk.push(epoch, Op::Insert, id, &new);
                live.hot.set(id, &new);
            }
        }
        done = counts.rows + chunk.len() as u64;
        if chunk.len() >= limits.chunk_rows {
            counts.rows += chunk.len() as u64;
            write(chunk.take_batch(shape, sample)?)?;
        }
    }
    if chunk.len() > 0 {
        counts.rows += chunk.len() as u64;
        write(chunk.take_batch(shape, sample)?)?;
    }
    counts.frozen = live.hot.frozen;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections() {
        let mut rng = StdRng::seed_from_u64(11);
        for size in (0..300).chain([1000, 1023, 1024, 1025, 4097]) {
            let p = Permutation::new(size, &mut rng);
            let mut seen = vec![false; size as usize];
            for x in 0..size {
                let y = p.apply(x);
                assert!(y < size && !seen[y as usize], "size {size}: {x} -> {y}");
                seen[y as usize] = true;
            }
        }
        // Large sizes stay in range, and look shuffled.
        let p = Permutation::new(6_000_000_000, &mut rng);
        let images: Vec<u64> = (0..1000).map(|x| p.apply(x)).collect();
        assert!(images.iter().all(|&y| y < 6_000_000_000));
        let big = images.iter().filter(|&&y| y > 3_000_000_000).count();
        assert!((350..650).contains(&big), "{big} of 1000 in the upper half");
    }

    #[test]
    fn the_same_seed_gives_the_same_permutation() {
        let a = Permutation::new(12345, &mut StdRng::seed_from_u64(3));
        let b = Permutation::new(12345, &mut StdRng::seed_from_u64(3));
        let c = Permutation::new(12345, &mut StdRng::seed_from_u64(4));
        let (va, vb, vc): (Vec<u64>, Vec<u64>, Vec<u64>) = (
            (0..100).map(|x| a.apply(x)).collect(),
            (0..100).map(|x| b.apply(x)).collect(),
            (0..100).map(|x| c.apply(x)).collect(),
        );
        assert_eq!(va, vb);
        assert_ne!(va, vc);
    }

    #[test]
    fn hot_keys_are_bounded_and_freeze_the_rest() {
        let mut hot = HotKeys::new(2, 3);
        for id in 0..5 {
            hot.set(id, &Source::Row(id as u32));
        }
        assert_eq!((hot.len(), hot.frozen), (3, 2));
        assert!(hot.source(3).is_err(), "frozen");
        // A hot key keeps its slot when changed again; a removed one makes room, the last
        // slot moving into its place.
        hot.set(1, &Source::Columns([9, ORIGINAL].into()));
        assert_eq!(
            hot.source(1).unwrap(),
            Source::Columns([9, ORIGINAL].into())
        );
        hot.remove(0);
        hot.remove(0);
        assert_eq!(hot.len(), 2);
        assert!(hot.source(0).is_err());
        assert_eq!(hot.source(2).unwrap(), Source::Columns([2, 2].into()));
        for (slot, &id) in hot.ids.iter().enumerate() {
            assert_eq!(hot.slot_of[&id] as usize, slot);
        }
        assert_eq!(hot.columns.len(), 4);
        hot.set(7, &Source::Original);
        assert_eq!(
            hot.source(7).unwrap(),
            Source::Columns([ORIGINAL; 2].into())
        );
        hot.set(8, &Source::Original);
        assert_eq!((hot.len(), hot.frozen), (3, 3));
    }
}
