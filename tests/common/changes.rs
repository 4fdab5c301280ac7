//! The seeded change generator: random valid chunks of upstream changes against a model of
//! the upstream table (a `BTreeMap` kept in step), for every harness that drives a backfill
//! with a busy upstream (the oracle harness, the differential and the actor tests).
//!
//! Each harness keeps its own [`Mix`] of changes; the generator draws everything from the
//! harness's seeded `StdRng`, so a seed gives the same chunks every run.

use std::collections::BTreeMap;

use arrangement_backfill::chunk::{Op, StreamChunk};
use rand::Rng;
use rand::rngs::StdRng;

use super::{Key, Shape, batch_of, random_key};

/// A table of `rows` random rows, keys drawn from `0..domain` (a shape-dependent domain for
/// composite keys, see [`random_key`]), values from `0..1000`.
pub fn random_rows(
    shape: Shape,
    rng: &mut StdRng,
    rows: usize,
    domain: usize,
) -> BTreeMap<Key, i64> {
    let mut table = BTreeMap::new();
    while table.len() < rows {
        let key = random_key(shape, rng, domain);
        table.insert(key, rng.random_range(0..1000));
    }
    table
}

/// Which changes a chunk is made of: each kind's share out of 100, in the order of the
/// fields (the generator draws a number below 100 and takes the kind whose range holds it).
/// A kind that needs a live row is an insert while the table is empty.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// An insert of a new key.
    pub insert: u32,
    /// A delete of a live row.
    pub delete: u32,
    /// An update pair (`U-`, `U+`) of a live row, its key kept.
    pub update: u32,
    /// A delete and an insert of one live key in the same chunk.
    pub delete_insert: u32,
    /// An update pair that moves a live row to a new key (often another vnode).
    pub moving_update: u32,
    /// An update (or an insert) of the key exactly at some vnode's backfill position, which
    /// the caller names ([`Changes::chunk_at`]); no change when it names none.
    pub at_position: u32,
    /// New keys avoid every key the chunk already holds, not only the table's live keys.
    pub distinct_new_keys: bool,
}

/// One kind of change, a field of [`Mix`].
#[derive(Debug, Clone, Copy)]
enum ChangeKind {
    Insert,
    Delete,
    Update,
    DeleteInsert,
    MovingUpdate,
    AtPosition,
}

impl Mix {
    fn shares(&self) -> [(ChangeKind, u32); 6] {
        [
            (ChangeKind::Insert, self.insert),
            (ChangeKind::Delete, self.delete),
            (ChangeKind::Update, self.update),
            (ChangeKind::DeleteInsert, self.delete_insert),
            (ChangeKind::MovingUpdate, self.moving_update),
            (ChangeKind::AtPosition, self.at_position),
        ]
    }

    /// The kind of change the draw `choice` in `0..100` picks.
    fn kind(&self, choice: u32) -> ChangeKind {
        let mut end = 0;
        for (kind, share) in self.shares() {
            end += share;
            if choice < end {
                return kind;
            }
        }
        unreachable!("shares add up to 100")
    }
}

/// The generator: a key shape, the domain new keys come from, a [`Mix`].
#[derive(Debug, Clone, Copy)]
pub struct Changes {
    shape: Shape,
    domain: usize,
    mix: Mix,
}

impl Changes {
    /// Changes to a table that started with `initial_rows` rows: new keys come from twice
    /// as many keys (at least 40), so inserts and deletes both find keys.
    pub fn new(shape: Shape, initial_rows: usize, mix: Mix) -> Self {
        assert_eq!(
            mix.shares().iter().map(|s| s.1).sum::<u32>(),
            100,
            "{mix:?}"
        );
        Self {
            shape,
            domain: initial_rows.max(20) * 2,
            mix,
        }
    }

    /// Between 1 and `max` random changes to `table`, applied to it, as one chunk; `None`
    /// when none was made (every draw an `at_position` change with no position). The mix
    /// must have no `at_position` share: see [`Changes::chunk_at`].
    pub fn chunk(
        &self,
        rng: &mut StdRng,
        table: &mut BTreeMap<Key, i64>,
        max: usize,
    ) -> Option<StreamChunk> {
        assert_eq!(self.mix.at_position, 0, "at_position changes need chunk_at");
        self.chunk_at(rng, table, max, |_| None)
    }

    /// [`Changes::chunk`], with `position` naming the key at a vnode's backfill position for
    /// an `at_position` change (it may draw from the generator's `rng`).
    pub fn chunk_at(
        &self,
        rng: &mut StdRng,
        table: &mut BTreeMap<Key, i64>,
        max: usize,
        mut position: impl FnMut(&mut StdRng) -> Option<Key>,
    ) -> Option<StreamChunk> {
        let n = rng.random_range(1..=max);
        let mut rows: Vec<(Key, i64)> = Vec::new();
        let mut ops = Vec::new();
        for _ in 0..n {
            let choice = rng.random_range(0..100);
            let live = (!table.is_empty()).then(|| {
                let i = rng.random_range(0..table.len());
                let (k, v) = table.iter().nth(i).unwrap();
                (k.clone(), *v)
            });
            let Some((key, v)) = live else {
                self.insert(rng, table, &mut rows, &mut ops);
                continue;
            };
            match self.mix.kind(choice) {
                ChangeKind::Insert => self.insert(rng, table, &mut rows, &mut ops),
                ChangeKind::Delete => {
                    table.remove(&key);
                    rows.push((key, v));
                    ops.push(Op::Delete);
                }
                ChangeKind::Update => {
                    let nv = rng.random_range(0..1000);
                    table.insert(key.clone(), nv);
                    rows.extend([(key.clone(), v), (key, nv)]);
                    ops.extend([Op::UpdateDelete, Op::UpdateInsert]);
                }
                ChangeKind::DeleteInsert => {
                    let nv = rng.random_range(0..1000);
                    table.insert(key.clone(), nv);
                    rows.extend([(key.clone(), v), (key, nv)]);
                    ops.extend([Op::Delete, Op::Insert]);
                }
                ChangeKind::MovingUpdate => {
                    let new_key = self.new_key(rng, table, &rows);
                    let nv = rng.random_range(0..1000);
                    table.remove(&key);
                    table.insert(new_key.clone(), nv);
                    rows.extend([(key, v), (new_key, nv)]);
                    ops.extend([Op::UpdateDelete, Op::UpdateInsert]);
                }
                ChangeKind::AtPosition => {
                    let Some(key) = position(rng) else {
                        continue;
                    };
                    let nv = rng.random_range(0..1000);
                    match table.insert(key.clone(), nv) {
                        Some(old) => {
                            rows.extend([(key.clone(), old), (key, nv)]);
                            ops.extend([Op::UpdateDelete, Op::UpdateInsert]);
                        }
                        None => {
                            rows.push((key, nv));
                            ops.push(Op::Insert);
                        }
                    }
                }
            }
        }
        if ops.is_empty() {
            return None;
        }
        Some(StreamChunk::new(batch_of(self.shape, &rows), ops).unwrap())
    }

    /// An insert of a new key.
    fn insert(
        &self,
        rng: &mut StdRng,
        table: &mut BTreeMap<Key, i64>,
        rows: &mut Vec<(Key, i64)>,
        ops: &mut Vec<Op>,
    ) {
        let key = self.new_key(rng, table, rows);
        let v = rng.random_range(0..1000);
        table.insert(key.clone(), v);
        rows.push((key, v));
        ops.push(Op::Insert);
    }

    /// A key no live row has (nor, with `distinct_new_keys`, any row of the chunk so far).
    fn new_key(&self, rng: &mut StdRng, table: &BTreeMap<Key, i64>, rows: &[(Key, i64)]) -> Key {
        loop {
            let key = random_key(self.shape, rng, self.domain);
            let in_chunk = self.mix.distinct_new_keys && rows.iter().any(|(k, _)| *k == key);
            if !table.contains_key(&key) && !in_chunk {
                return key;
            }
        }
    }
}
