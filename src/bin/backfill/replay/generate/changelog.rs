//! The changelog model: live rows, seeded events, valid by construction.

use super::*;

/// Where a live row's values come from: all from one pool row, or per column.
#[derive(Debug, Clone)]
pub(super) enum Source {
    Row(u32),
    Columns(Box<[u32]>),
}

impl Source {
    fn column(&self, c: usize) -> u32 {
        match self {
            Source::Row(r) => *r,
            Source::Columns(cols) => cols[c],
        }
    }
}

/// The live keys: a vector for uniform picks, a map from id to its slot and values.
pub(super) struct LiveRows {
    ids: Vec<u64>,
    rows: HashMap<u64, (usize, Source)>,
}

impl LiveRows {
    fn pick(&self, rng: &mut StdRng) -> Option<u64> {
        (!self.ids.is_empty()).then(|| self.ids[rng.random_range(0..self.ids.len())])
    }

    fn source(&self, id: u64) -> &Source {
        &self.rows[&id].1
    }

    fn insert(&mut self, id: u64, source: Source) {
        self.rows.insert(id, (self.ids.len(), source));
        self.ids.push(id);
    }

    fn remove(&mut self, id: u64) {
        if let Some((slot, _)) = self.rows.remove(&id) {
            self.ids.swap_remove(slot);
            if let Some(&moved) = self.ids.get(slot) {
                self.rows.get_mut(&moved).expect("live id has a row").0 = slot;
            }
        }
    }

    fn set(&mut self, id: u64, source: Source) {
        self.rows.get_mut(&id).expect("live id has a row").1 = source;
    }
}

/// The generated changelog, as key ids and per-column pool row sources.
pub(super) struct Changelog {
    pub(super) epochs: Vec<u64>,
    pub(super) ops: Vec<Op>,
    ids: Vec<u64>,
    /// `sources[c][row]`: the pool row column `c` of change row `row` comes from.
    sources: Vec<Vec<u32>>,
}

impl Changelog {
    fn push(&mut self, epoch: u64, op: Op, id: u64, source: &Source) {
        self.epochs.push(epoch);
        self.ops.push(op);
        self.ids.push(id);
        for (c, column) in self.sources.iter_mut().enumerate() {
            column.push(source.column(c));
        }
    }

    pub(super) fn generate(
        pool: &RecordBatch,
        ids: &[u64],
        keys: &mut dyn KeySpace,
        opts: &GenOptions,
        rng: &mut StdRng,
    ) -> Result<Self> {
        let width = pool.num_columns();
        let value_columns: Vec<usize> = (0..width)
            .filter(|c| !keys.key_indices().contains(c))
            .collect();
        let mut live = LiveRows {
            ids: Vec::with_capacity(ids.len()),
            rows: HashMap::with_capacity(ids.len()),
        };
        for (row, &id) in ids.iter().enumerate() {
            live.insert(id, Source::Row(row as u32));
        }
        let total = opts.changes;
        let mut log = Changelog {
            epochs: Vec::with_capacity(total as usize),
            ops: Vec::with_capacity(total as usize),
            ids: Vec::with_capacity(total as usize),
            sources: vec![Vec::with_capacity(total as usize); width],
        };
        let pool_rows = pool.num_rows() as u32;
        let random_row = |rng: &mut StdRng| -> Result<u32> {
            if pool_rows == 0 {
                return Err(Error::config(
                    "cannot generate changes for an empty table".into(),
                ));
            }
            Ok(rng.random_range(0..pool_rows))
        };
        while (log.ops.len() as u64) < total {
            let done = log.ops.len() as u64;
            // In u128: `done * epochs` overflows u64 for epochs near 2^64, and the epochs
            // must never decrease.
            let epoch = 1 + (u128::from(done) * u128::from(opts.epochs) / u128::from(total)) as u64;
            let room_for_pair = total - done >= 2;
            let roll: f64 = rng.random();
            let existing = live.pick(rng);
            match existing {
                // Insert a new key, values like a random pool row.
                None => {
                    let id = keys.new_key(rng);
                    let source = Source::Row(random_row(rng)?);
                    log.push(epoch, Op::Insert, id, &source);
                    live.insert(id, source);
                }
                Some(_) if roll < 0.3 => {
                    let id = keys.new_key(rng);
                    let source = Source::Row(random_row(rng)?);
                    log.push(epoch, Op::Insert, id, &source);
                    live.insert(id, source);
                }
                Some(id) if roll < 0.5 || !room_for_pair => {
                    log.push(epoch, Op::Delete, id, live.source(id));
                    live.remove(id);
                }
                // Update: one or two value columns take another pool row's values.
                Some(id) if roll < 0.9 => {
                    let old = live.source(id).clone();
                    let mut new: Box<[u32]> = (0..width).map(|c| old.column(c)).collect();
                    let from = random_row(rng)?;
                    for _ in 0..rng.random_range(1..=2) {
                        if !value_columns.is_empty() {
                            new[value_columns[rng.random_range(0..value_columns.len())]] = from;
                        }
                    }
                    let new = Source::Columns(new);
                    log.push(epoch, Op::UpdateDelete, id, &old);
                    log.push(epoch, Op::UpdateInsert, id, &new);
                    live.set(id, new);
                }
                // Delete and reinsert the same key, with other values, in one epoch.
                Some(id) => {
                    let old = live.source(id).clone();
                    let new = Source::Row(random_row(rng)?);
                    log.push(epoch, Op::Delete, id, &old);
                    log.push(epoch, Op::Insert, id, &new);
                    live.set(id, new);
                }
            }
        }
        Ok(log)
    }

    pub(super) fn into_batch(
        mut self,
        pool: &RecordBatch,
        keys: &dyn KeySpace,
    ) -> Result<RecordBatch> {
        let table = pool.schema();
        let mut columns: Vec<Option<ArrayRef>> = vec![None; pool.num_columns()];
        for (&c, column) in keys.key_indices().iter().zip(keys.key_columns(&self.ids)) {
            columns[c] = Some(column);
        }
        for (c, slot) in columns.iter_mut().enumerate() {
            if slot.is_none() {
                let indices = UInt32Array::from(std::mem::take(&mut self.sources[c]));
                *slot = Some(arrow_select::take::take(pool.column(c), &indices, None)?);
            }
        }
        let schema = changelog_schema(&table, true);
        let mut all: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(std::mem::take(&mut self.epochs))),
            Arc::new(Int8Array::from_iter_values(
                self.ops.iter().map(|op| op.code()),
            )),
        ];
        all.extend(
            columns
                .into_iter()
                .map(|c| c.expect("every column is filled")),
        );
        Ok(RecordBatch::try_new(schema, all)?)
    }
}
