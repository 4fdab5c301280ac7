//! Synthetic snapshots (`Int64` or composite keys, optionally skewed), and their key spaces.

use super::*;

/// Zipf-like weights `1 / (rank + 1)` over `n` items, as a cumulative distribution.
pub(super) fn zipf_cdf(n: usize) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (0..n)
        .map(|r| {
            acc += 1.0 / (r as f64 + 1.0);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

pub(super) fn draw(cdf: &[f64], rng: &mut StdRng) -> usize {
    let u: f64 = rng.random();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

/// `Int64` keys crowded into a few vnodes: candidate keys count up, and a key is kept with
/// probability `1 / (rank + 1)` where `rank` is its vnode's rank in a seeded permutation.
pub(super) struct SkewedInt64Keys {
    indices: [usize; 1],
    next_candidate: i64,
    keep: Vec<f64>,
    ready: VecDeque<i64>,
}

impl SkewedInt64Keys {
    /// Candidates hashed per refill.
    const CANDIDATES: usize = 1 << 14;

    fn new(rng: &mut StdRng) -> Self {
        let count = VnodeCount::DEFAULT.get();
        let mut ranks: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            ranks.swap(i, rng.random_range(0..=i));
        }
        Self {
            indices: [0],
            next_candidate: 0,
            keep: ranks.iter().map(|&r| 1.0 / (r as f64 + 1.0)).collect(),
            ready: VecDeque::new(),
        }
    }

    fn refill(&mut self, rng: &mut StdRng) -> Result<()> {
        let start = self.next_candidate;
        self.next_candidate += Self::CANDIDATES as i64;
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(start..self.next_candidate));
        let vnodes = vnode::compute_vnodes(&[keys], Self::CANDIDATES, VnodeCount::DEFAULT)?;
        for (i, v) in vnodes.iter().enumerate() {
            if rng.random_bool(self.keep[v.index()]) {
                self.ready.push_back(start + i as i64);
            }
        }
        Ok(())
    }

    fn take(&mut self, rng: &mut StdRng) -> Result<i64> {
        loop {
            if let Some(k) = self.ready.pop_front() {
                return Ok(k);
            }
            self.refill(rng)?;
        }
    }
}

impl KeySpace for SkewedInt64Keys {
    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn new_key(&mut self, rng: &mut StdRng) -> u64 {
        // `refill` only fails if hashing an Int64 column fails, which it cannot.
        self.take(rng).unwrap_or_else(|_| {
            self.next_candidate += 1;
            self.next_candidate
        }) as u64
    }

    fn key_columns(&self, ids: &[u64]) -> Vec<ArrayRef> {
        vec![Arc::new(Int64Array::from_iter_values(
            ids.iter().map(|&id| id as i64),
        ))]
    }
}

/// `(s, i)` keys: id = `s_index << 32 | i`, `s = format!("s{s_index:06}")`, `i` counting up
/// per `s`. `s_index` is uniform, or Zipf-like with `skew`.
pub(super) struct CompositeKeys {
    indices: [usize; 2],
    cdf: Option<Vec<f64>>,
    next_i: Vec<u32>,
}

impl CompositeKeys {
    /// Rows per distinct `s` without skew.
    const ROWS_PER_S: u64 = 16;
}

impl KeySpace for CompositeKeys {
    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn new_key(&mut self, rng: &mut StdRng) -> u64 {
        let s = match &self.cdf {
            Some(cdf) => draw(cdf, rng),
            None => rng.random_range(0..self.next_i.len()),
        };
        let i = self.next_i[s];
        self.next_i[s] += 1;
        ((s as u64) << 32) | u64::from(i)
    }

    fn key_columns(&self, ids: &[u64]) -> Vec<ArrayRef> {
        vec![
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|id| format!("s{:06}", id >> 32)),
            )),
            Arc::new(Int32Array::from_iter_values(
                ids.iter().map(|id| (id & 0xFFFF_FFFF) as i32),
            )),
        ]
    }
}

/// The value columns `a`, `b`, `c` of `n` synthetic rows.
pub(super) fn synthetic_values(n: usize, rng: &mut StdRng) -> Vec<ArrayRef> {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz ";
    let a = Int64Array::from_iter_values((0..n).map(|_| rng.random_range(0..1_000_000)));
    let b: Float64Array = (0..n)
        .map(|_| (!rng.random_bool(0.1)).then(|| rng.random_range(-1e6..1e6)))
        .collect();
    let c = StringArray::from_iter_values((0..n).map(|_| {
        let len = rng.random_range(8..32);
        (0..len)
            .map(|_| LETTERS[rng.random_range(0..LETTERS.len())] as char)
            .collect::<String>()
    }));
    vec![Arc::new(a), Arc::new(b), Arc::new(c)]
}

pub(super) fn synthetic(
    shape: SyntheticShape,
    skew: bool,
    scale: f64,
    rng: &mut StdRng,
) -> Result<Table> {
    let n = synthetic_rows(scale) as usize;
    let values = [
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Float64, true),
        Field::new("c", DataType::Utf8, false),
    ];
    let suffix = if skew { "_skew" } else { "" };
    let (manifest, key_fields, mut keys): (Manifest, Vec<Field>, Box<dyn KeySpace>) = match shape {
        SyntheticShape::Int64 => {
            let keys: Box<dyn KeySpace> = if skew {
                Box::new(SkewedInt64Keys::new(rng))
            } else {
                Box::new(CountingKeys {
                    indices: [0],
                    next: -1,
                })
            };
            (
                manifest(&format!("synthetic_int64{suffix}"), &["k"], None, &[]),
                vec![Field::new("k", DataType::Int64, false)],
                keys,
            )
        }
        SyntheticShape::Composite => {
            let distinct = (n as u64 / CompositeKeys::ROWS_PER_S).max(1) as usize;
            (
                manifest(
                    &format!("synthetic_composite{suffix}"),
                    &["s", "i"],
                    Some(&["s"]),
                    &["i"],
                ),
                vec![
                    Field::new("s", DataType::Utf8, false),
                    Field::new("i", DataType::Int32, false),
                ],
                Box::new(CompositeKeys {
                    indices: [0, 1],
                    cdf: skew.then(|| zipf_cdf(distinct)),
                    next_i: vec![0; distinct],
                }),
            )
        }
    };
    let schema = Arc::new(Schema::new(
        key_fields.into_iter().chain(values).collect::<Vec<_>>(),
    ));
    let ids: Vec<u64> = (0..n).map(|_| keys.new_key(rng)).collect();
    let mut columns = keys.key_columns(&ids);
    columns.extend(synthetic_values(n, rng));
    let pool = RecordBatch::try_new(schema, columns)?;
    Ok(Table {
        manifest,
        pool,
        ids,
        keys,
    })
}
