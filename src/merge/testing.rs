//! Test helpers: an in-memory scan, small data builders and the random case generator shared
//! by the merger tests.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::take::take_record_batch;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

use crate::error::Result;
use crate::key::{KeyColumn, Position, PrimaryKey};
use crate::merge::{MergeOutput, Patch, SnapshotMerger};
use crate::runs::KeyedBatch;
use crate::store::SnapshotScan;
use crate::vnode::VirtualNode;

/// A scan over batches kept in memory.
#[derive(Debug)]
pub(crate) struct VecScan(VecDeque<KeyedBatch>);

impl VecScan {
    pub fn new(batches: Vec<KeyedBatch>) -> Self {
        Self(batches.into())
    }
}

impl SnapshotScan for VecScan {
    fn next_batch(&mut self) -> Result<Option<KeyedBatch>> {
        Ok(self.0.pop_front())
    }
}

/// A table batch with its encoded keys.
pub(crate) fn keyed(pk: &PrimaryKey, batch: RecordBatch) -> KeyedBatch {
    let keys = pk.encode(&batch).unwrap();
    KeyedBatch { batch, keys }
}

/// The table `(k Int64, id UInt64)` keyed by `k` ascending.
pub(crate) fn int_key(nullable: bool) -> PrimaryKey {
    let schema = Schema::new(vec![
        Field::new("k", DataType::Int64, nullable),
        Field::new("id", DataType::UInt64, false),
    ]);
    PrimaryKey::new(&schema, vec![KeyColumn::asc("k")]).unwrap()
}

/// Rows of [`int_key`]'s table with these keys; `id` numbers them from 0.
pub(crate) fn int_rows(pk: &PrimaryKey, keys: &[i64]) -> KeyedBatch {
    int_rows_with_ids(pk, keys, 0)
}

/// Like [`int_rows`], ids counting from `first_id`.
pub(crate) fn int_rows_with_ids(pk: &PrimaryKey, keys: &[i64], first_id: u64) -> KeyedBatch {
    let nullable = pk.key_schema().field(0).is_nullable();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, nullable),
        Field::new("id", DataType::UInt64, false),
    ]));
    let ids: Vec<u64> = (first_id..).take(keys.len()).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(keys.to_vec())),
            Arc::new(UInt64Array::from(ids)),
        ],
    )
    .unwrap();
    keyed(pk, batch)
}

/// The `id` column of a batch.
pub(crate) fn ids(batch: &RecordBatch) -> Vec<u64> {
    if batch.num_rows() == 0 {
        return Vec::new();
    }
    let column = batch.column_by_name("id").unwrap();
    column.as_primitive::<UInt64Type>().values().to_vec()
}

/// The key shapes the random cases cover.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyShape {
    /// Non-null `Int64`: the primitive cursor.
    Int,
    /// Nullable `Int64` (one NULL key sometimes): the row cursor fallback.
    NullableInt,
    /// `(Utf8 asc, Int32 desc)`: the row cursor.
    Composite,
    /// `(Int64 asc, nullable, 7 values from MIN to MAX; Int32 asc)`, as TPC-H `lineitem`'s
    /// `(l_orderkey, l_linenumber)` but with few order keys: the row cursor, where most heads
    /// share their 8-byte prefix, and where the bytes all keys share shrink as batches arrive.
    FewPrefixes,
}

/// A random merge input set: rows with unique `id`s `0..total`, keys unique across inputs.
pub(crate) struct Case {
    pub pk: PrimaryKey,
    pub inputs: Vec<(VirtualNode, Vec<KeyedBatch>)>,
    /// For each `id`: the input that holds it.
    pub owner: Vec<usize>,
    /// For each `id`: its encoded key.
    pub keys: Vec<Vec<u8>>,
}

impl Case {
    /// The scans, ready for a merger.
    pub fn scans(&self) -> Vec<(VirtualNode, VecScan)> {
        self.inputs
            .iter()
            .map(|(v, batches)| (*v, VecScan::new(batches.clone())))
            .collect()
    }

    /// All ids in merge order: by key, then by input.
    pub fn oracle(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = (0..self.owner.len() as u64).collect();
        ids.sort_by(|&a, &b| {
            let (a, b) = (a as usize, b as usize);
            (&self.keys[a], self.owner[a]).cmp(&(&self.keys[b], self.owner[b]))
        });
        ids
    }

    /// The ids of input `i`, in its order.
    pub fn input_ids(&self, i: usize) -> Vec<u64> {
        self.inputs[i]
            .1
            .iter()
            .flat_map(|b| ids(&b.batch))
            .collect()
    }
}

/// Batch sizes the inputs are cut into.
const INPUT_BATCH_SIZES: [usize; 4] = [1, 2, 7, 1024];

/// A random case of `num_inputs` inputs holding up to `max_rows` rows. About one input in ten
/// is empty; about one batch in seven is followed by an empty batch.
pub(crate) fn random_case(
    rng: &mut StdRng,
    shape: KeyShape,
    num_inputs: usize,
    max_rows: usize,
) -> Case {
    let rows = rng.random_range(0..=max_rows);
    let (table, pk) = random_table(rng, shape, rows);
    let non_empty: Vec<usize> = (0..num_inputs).filter(|_| rng.random_bool(0.9)).collect();
    let owner: Vec<usize> = match non_empty.is_empty() {
        true => vec![0; 0],
        false => (0..rows).map(|_| *non_empty.choose(rng).unwrap()).collect(),
    };
    split(rng, table, pk, owner, num_inputs)
}

/// Like [`random_case`], but with clustered keys: in key order, stretches of up to 300 rows
/// go to one input, so the same input wins many rounds in a row.
pub(crate) fn clustered_case(
    rng: &mut StdRng,
    shape: KeyShape,
    num_inputs: usize,
    max_rows: usize,
) -> Case {
    let rows = rng.random_range(0..=max_rows);
    let (table, pk) = random_table(rng, shape, rows);
    let keys = pk.encode(&table).unwrap();
    let mut by_key: Vec<usize> = (0..rows).collect();
    by_key.sort_by(|&a, &b| keys.value(a).cmp(keys.value(b)));
    let mut owner = vec![0; rows];
    for stretch in by_key.chunks(rng.random_range(1..=300)) {
        let input = rng.random_range(0..num_inputs);
        for &row in stretch {
            owner[row] = input;
        }
    }
    split(rng, table, pk, owner, num_inputs)
}

/// The case where row `r` of `table` belongs to input `owner[r]`: each input's rows sorted by
/// key and cut into batches of random sizes, with some empty batches.
fn split(
    rng: &mut StdRng,
    table: RecordBatch,
    pk: PrimaryKey,
    owner: Vec<usize>,
    num_inputs: usize,
) -> Case {
    let rows = owner.len();
    let keys = pk.encode(&table).unwrap();
    let mut inputs = Vec::with_capacity(num_inputs);
    for input in 0..num_inputs {
        let mut mine: Vec<u32> = (0..rows as u32)
            .filter(|&r| owner[r as usize] == input)
            .collect();
        mine.sort_by(|&a, &b| keys.value(a as usize).cmp(keys.value(b as usize)));
        let sorted = keyed(
            &pk,
            take_record_batch(&table.slice(0, rows), &UInt32Array::from(mine)).unwrap(),
        );
        let mut batches = Vec::new();
        let mut offset = 0;
        loop {
            if rng.random_bool(0.15) {
                batches.push(sorted.slice(offset, 0));
            }
            if offset == sorted.num_rows() {
                break;
            }
            let len = (*INPUT_BATCH_SIZES.choose(rng).unwrap()).min(sorted.num_rows() - offset);
            batches.push(sorted.slice(offset, len));
            offset += len;
        }
        let vnode = VirtualNode::new((input * 7 % 65_536) as u16);
        inputs.push((vnode, batches));
    }
    let keys = (0..rows).map(|r| keys.value(r).to_vec()).collect();
    Case {
        pk,
        inputs,
        owner,
        keys,
    }
}

/// `rows` rows with unique keys of the given shape and `id`s `0..rows`.
fn random_table(rng: &mut StdRng, shape: KeyShape, rows: usize) -> (RecordBatch, PrimaryKey) {
    let ids = Arc::new(UInt64Array::from_iter_values(0..rows as u64));
    let id = Field::new("id", DataType::UInt64, false);
    match shape {
        KeyShape::Int | KeyShape::NullableInt => {
            let nullable = matches!(shape, KeyShape::NullableInt);
            let mut seen = HashSet::new();
            let mut keys = Vec::with_capacity(rows);
            if nullable && rows > 0 && rng.random_bool(0.5) {
                keys.push(None);
            }
            while keys.len() < rows {
                let k = rng.random_range(-1_000_000..1_000_000_i64);
                if seen.insert(k) {
                    keys.push(Some(k));
                }
            }
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, nullable),
                id,
            ]));
            let pk = PrimaryKey::new(&schema, vec![KeyColumn::asc("k")]).unwrap();
            let batch =
                RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(keys)), ids]).unwrap();
            (batch, pk)
        }
        KeyShape::Composite => {
            const WORDS: [Option<&str>; 6] =
                [None, Some(""), Some("a"), Some("ab"), Some("b"), Some("ba")];
            let mut seen = HashSet::new();
            let (mut s, mut i) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
            while s.len() < rows {
                let key = (
                    *WORDS.choose(rng).unwrap(),
                    rng.random_range(-2_000..2_000_i32),
                );
                if seen.insert(key) {
                    s.push(key.0);
                    i.push(key.1);
                }
            }
            let schema = Arc::new(Schema::new(vec![
                Field::new("s", DataType::Utf8, true),
                Field::new("i", DataType::Int32, false),
                id,
            ]));
            let pk =
                PrimaryKey::new(&schema, vec![KeyColumn::asc("s"), KeyColumn::desc("i")]).unwrap();
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(StringArray::from(s)),
                    Arc::new(Int32Array::from(i)),
                    ids,
                ],
            )
            .unwrap();
            (batch, pk)
        }
        KeyShape::FewPrefixes => {
            const ORDERS: [Option<i64>; 7] = [
                None,
                Some(i64::MIN),
                Some(-1),
                Some(0),
                Some(1),
                Some(1 << 40),
                Some(i64::MAX),
            ];
            let mut seen = HashSet::new();
            let (mut o, mut l) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
            while o.len() < rows {
                let key = (*ORDERS.choose(rng).unwrap(), rng.random_range(0..1_000_i32));
                if seen.insert(key) {
                    o.push(key.0);
                    l.push(key.1);
                }
            }
            let schema = Arc::new(Schema::new(vec![
                Field::new("o", DataType::Int64, true),
                Field::new("l", DataType::Int32, false),
                id,
            ]));
            let pk =
                PrimaryKey::new(&schema, vec![KeyColumn::asc("o"), KeyColumn::asc("l")]).unwrap();
            let batch = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int64Array::from(o)),
                    Arc::new(Int32Array::from(l)),
                    ids,
                ],
            )
            .unwrap();
            (batch, pk)
        }
    }
}

/// Every output of `merger`, failing after `max` outputs (a merger that never ends).
pub(crate) fn drain(merger: &mut impl SnapshotMerger, max: usize) -> Result<Vec<MergeOutput>> {
    let mut outputs = Vec::new();
    while let Some(output) = merger.next_output()? {
        outputs.push(output);
        assert!(outputs.len() <= max, "more than {max} outputs");
    }
    Ok(outputs)
}

/// What every merger promises, ordered or not: each row exactly once, per-vnode order kept,
/// keys that match the rows, exact progress, and each vnode reported exhausted exactly once,
/// after its last row.
pub(crate) fn check_outputs(case: &Case, outputs: &[MergeOutput]) {
    let input_of: HashMap<VirtualNode, usize> = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (v, _))| (*v, i))
        .collect();
    let k = case.inputs.len();
    let mut emitted: Vec<Vec<u64>> = vec![Vec::new(); k];
    let mut exhausted_at = vec![None; k];
    for (j, output) in outputs.iter().enumerate() {
        let batch = &output.batch;
        let mut tally: HashMap<VirtualNode, (u64, usize)> = HashMap::new();
        if !batch.is_empty() {
            assert_eq!(
                batch.keys,
                case.pk.encode(&batch.batch).unwrap(),
                "output {j}"
            );
            for id in ids(&batch.batch) {
                let input = case.owner[id as usize];
                emitted[input].push(id);
                let entry = tally.entry(case.inputs[input].0).or_insert((id, 0));
                *entry = (id, entry.1 + 1);
            }
        }
        assert_eq!(
            output.progress.len(),
            tally.len(),
            "output {j}: one entry per vnode"
        );
        for advance in &output.progress {
            let (last, rows) = tally[&advance.vnode];
            assert_eq!(advance.rows, rows, "output {j} vnode {}", advance.vnode);
            assert_eq!(advance.last.as_bytes(), case.keys[last as usize].as_slice());
        }
        for vnode in &output.exhausted {
            let input = input_of[vnode];
            assert_eq!(exhausted_at[input], None, "vnode {vnode} reported twice");
            exhausted_at[input] = Some(j);
            assert_eq!(
                emitted[input].len(),
                case.input_ids(input).len(),
                "vnode {vnode} reported exhausted before its last row"
            );
        }
    }
    for (input, rows) in emitted.iter().enumerate() {
        assert_eq!(rows, &case.input_ids(input), "input {input}: rows or order");
        assert!(
            exhausted_at[input].is_some(),
            "input {input} never exhausted"
        );
    }
    let total: usize = emitted.iter().map(Vec::len).sum();
    assert_eq!(total, case.owner.len());
}

/// Rows of [`int_key`]'s table with these keys, each row's `id` its key (keys must be >= 0).
fn rows_named_by_key(pk: &PrimaryKey, keys: &[i64]) -> KeyedBatch {
    let batch = int_rows(pk, keys).batch;
    let ids: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
    let batch = RecordBatch::try_new(
        batch.schema(),
        vec![batch.column(0).clone(), Arc::new(UInt64Array::from(ids))],
    )
    .unwrap();
    keyed(pk, batch)
}

/// A scan of `keys` (sorted) cut into batches of random sizes.
fn random_scan(rng: &mut StdRng, pk: &PrimaryKey, keys: &[i64]) -> VecScan {
    let mut batches = Vec::new();
    let mut rest = keys;
    while !rest.is_empty() {
        let most = *[1, 2, 7, 50].choose(rng).unwrap();
        let n = rng.random_range(1..=rest.len().min(most));
        batches.push(rows_named_by_key(pk, &rest[..n]));
        rest = &rest[n..];
    }
    VecScan::new(batches)
}

/// A differential test of [`RestartInputs`]: a merger over `k` vnodes (vnode `v` holds keys
/// `≡ v mod k`) is drained a few outputs at a time; between rounds random vnodes get fresh
/// scans of new rows after their position (the rows an epoch's changes left there), and
/// others patches of upserts and deletes after their position. After each restart or
/// patch, what the merger emits must be what a merger opened afresh on every vnode's
/// remaining rows would emit: the sorted remaining rows (`ordered`), or per vnode its
/// remaining rows in order. Every row of the final table is emitted exactly once, and each
/// vnode is reported exhausted after its last row. A merger's deferred inputs
/// ([`crate::merge::RestartInputs::is_deferred`]) get neither: their rows change at will
/// (as a store's do under changes the filter drops) and they open on the rows of the
/// moment they are reached, after the position they were given.
pub(crate) fn check_restarts<M: crate::merge::RestartInputs<VecScan>>(
    seed: u64,
    ordered: bool,
    make: impl Fn(Vec<(VirtualNode, VecScan)>, usize) -> M,
) {
    let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let pk = int_key(false);
    let k = *[1usize, 4, 16, 64].choose(&mut rng).unwrap();
    let batch_size = *[1usize, 3, 16, 100].choose(&mut rng).unwrap();
    let span = 60i64;
    let class = |v: usize, rng: &mut StdRng, above: Option<i64>| -> Vec<i64> {
        (0..span)
            .map(|i| i * k as i64 + v as i64)
            .filter(|key| above.is_none_or(|a| *key > a))
            .filter(|_| rng.random_bool(0.5))
            .collect()
    };
    // Per vnode: the rows not emitted yet, in key order.
    let mut remaining: Vec<VecDeque<i64>> =
        (0..k).map(|v| class(v, &mut rng, None).into()).collect();
    let scans = (0..k)
        .map(|v| {
            let keys: Vec<i64> = remaining[v].iter().copied().collect();
            (
                VirtualNode::new(v as u16),
                random_scan(&mut rng, &pk, &keys),
            )
        })
        .collect();
    let mut merger = make(scans, batch_size);
    let mut open_rng = <StdRng as rand::SeedableRng>::seed_from_u64(seed ^ 0x0DEF_E55E);
    let mut pos: Vec<Option<i64>> = vec![None; k];
    let mut reported = vec![false; k];
    for round in 0..8 {
        let last_round = round == 7;
        let pulls = if last_round {
            usize::MAX
        } else {
            rng.random_range(0..4)
        };
        let mut expected_order: Vec<i64> = remaining.iter().flatten().copied().collect();
        expected_order.sort_unstable();
        let mut got = Vec::new();
        for _ in 0..pulls {
            let mut open = |vnode: VirtualNode, after: Option<&Position>| {
                let v = vnode.index();
                let at = pos[v].map(|p| int_rows(&pk, &[p]).last_position().unwrap());
                assert_eq!(
                    after,
                    at.as_ref(),
                    "seed {seed}: vnode {v} opened elsewhere"
                );
                let keys: Vec<i64> = remaining[v].iter().copied().collect();
                Ok(random_scan(&mut open_rng, &pk, &keys))
            };
            let Some(output) = merger.next_output_opening(&mut open).unwrap() else {
                break;
            };
            let keys: Vec<i64> = ids(&output.batch.batch)
                .iter()
                .map(|&id| id as i64)
                .collect();
            for &key in &keys {
                let v = (key % k as i64) as usize;
                assert_eq!(
                    remaining[v].pop_front(),
                    Some(key),
                    "seed {seed}: vnode {v} order"
                );
                pos[v] = Some(key);
            }
            for advance in &output.progress {
                let v = advance.vnode.index();
                assert_eq!(
                    advance.last,
                    int_rows(&pk, &[pos[v].unwrap()]).last_position().unwrap()
                );
            }
            for vnode in &output.exhausted {
                assert!(
                    remaining[vnode.index()].is_empty(),
                    "seed {seed}: {vnode} early"
                );
                reported[vnode.index()] = true;
            }
            got.extend(keys);
        }
        if ordered {
            assert_eq!(
                got,
                expected_order[..got.len()],
                "seed {seed} round {round}"
            );
        }
        if last_round {
            break;
        }
        for v in 0..k {
            let after = pos[v].map(|p| int_rows(&pk, &[p]).last_position().unwrap());
            let vnode = VirtualNode::new(v as u16);
            if merger.is_deferred(vnode) {
                // Not open: whatever its rows are when it is reached is what it reads.
                if rng.random_bool(0.5) {
                    remaining[v] = class(v, &mut rng, pos[v]).into();
                }
                continue;
            }
            if rng.random_bool(0.3) {
                let keys = class(v, &mut rng, pos[v]);
                remaining[v] = keys.iter().copied().collect();
                reported[v] = false;
                let scan = random_scan(&mut rng, &pk, &keys);
                merger.restart(vnode, scan, after.as_ref()).unwrap();
            } else if rng.random_bool(0.4) {
                // Changes after the position: upserts of rows there or new, and deletes.
                let keys = class(v, &mut rng, pos[v]);
                let deleted: Vec<bool> = keys.iter().map(|_| rng.random_bool(0.4)).collect();
                let mut rows: std::collections::BTreeSet<i64> =
                    remaining[v].iter().copied().collect();
                for (key, &delete) in keys.iter().zip(&deleted) {
                    if delete {
                        rows.remove(key);
                    } else {
                        rows.insert(*key);
                    }
                }
                remaining[v] = rows.into_iter().collect();
                reported[v] = false;
                let patch = Patch::new(
                    rows_named_by_key(&pk, &keys),
                    Some(arrow_buffer::BooleanBuffer::from(deleted)),
                )
                .unwrap();
                merger.patch(vnode, patch, after.as_ref()).unwrap();
            }
        }
    }
    assert!(
        remaining.iter().all(VecDeque::is_empty),
        "seed {seed}: rows left"
    );
    assert!(
        reported.iter().all(|r| *r),
        "seed {seed}: a vnode never reported"
    );
}
