//! Synthetic shapes (`Int64` or composite keys, optionally skewed). A row's values are made
//! from a hash of the seed and its key id ([`RowRng`]), so any snapshot row can be made again.

use super::*;

/// `H(j) = 1 + 1/2 + ... + 1/j` (`H(0) = 0`): exact sums up to 64, the
/// asymptotic series above (error below 10^-13), so it costs the same for any `j`.
fn harmonic(j: u64) -> f64 {
    const EXACT: u64 = 64;
    if j <= EXACT {
        return (1..=j).map(|t| 1.0 / t as f64).sum();
    }
    const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;
    let x = j as f64;
    let x2 = x * x;
    x.ln() + EULER_GAMMA + 1.0 / (2.0 * x) - 1.0 / (12.0 * x2) + 1.0 / (120.0 * x2 * x2)
}

/// Zipf-like weights `1 / (s + 1)` over `s` in `0..distinct`, with nothing stored: the
/// cumulative weights are harmonic numbers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Zipf {
    distinct: u64,
    total: f64,
}

impl Zipf {
    pub(super) fn new(distinct: u64) -> Self {
        Self {
            distinct,
            total: harmonic(distinct),
        }
    }

    /// The share of the weight of the first `j` values.
    fn cdf(&self, j: u64) -> f64 {
        if j >= self.distinct {
            1.0
        } else {
            harmonic(j) / self.total
        }
    }

    /// The largest `s < distinct` with `f(s)` true, for `f` true at 0 and monotone.
    fn last_true(&self, f: impl Fn(u64) -> bool) -> u64 {
        let (mut lo, mut hi) = (0, self.distinct);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if f(mid) { lo = mid } else { hi = mid }
        }
        lo
    }

    /// The first of `rows` rows (in order) that has value `s`: value `s` has about `rows`
    /// times its weight (some tail values none).
    pub(super) fn first_row(&self, s: u64, rows: u64) -> u64 {
        ((rows as f64 * self.cdf(s)).floor() as u64).min(rows)
    }

    /// The value of row `r` of `rows` rows ([`Self::first_row`]).
    pub(super) fn value_of_row(&self, r: u64, rows: u64) -> u64 {
        self.last_true(|s| self.first_row(s, rows) <= r)
    }

    /// A value drawn by `u` uniform in `[0, 1)`.
    pub(super) fn draw(&self, u: f64) -> u64 {
        self.last_true(|s| self.cdf(s) <= u)
    }
}

/// A synthetic table: key columns, then `a` Int64, `b` Float64 (10% NULL), `c` Utf8.
pub(super) struct Synthetic {
    schema: SchemaRef,
    manifest: Manifest,
    indices: Vec<usize>,
    seed: u64,
    /// Snapshot rows, and those streamed so far.
    rows: u64,
    made: u64,
    keys: Keys,
}

/// How snapshot rows and fresh keys get their key ids.
enum Keys {
    /// `k` = the row's index; fresh keys count on from the snapshot's size.
    Counting {
        next: u64,
    },
    Skewed(SkewedKeys),
    Composite(CompositeKeys),
}

/// `Int64` keys crowded into a few vnodes: candidate keys count up, and a key is kept with
/// probability `1 / (rank + 1)` where `rank` is its vnode's rank in a seeded permutation
/// (the draw a hash of the candidate, so that a slot's key is known again). The snapshot
/// holds the first kept ones; a slot is a candidate below the snapshot's end.
struct SkewedKeys {
    keep: Vec<f64>,
    salt: u64,
    next_candidate: u64,
    ready: VecDeque<u64>,
    /// One past the snapshot's last key (once it is done).
    end: u64,
}

impl SkewedKeys {
    /// Candidates hashed per refill.
    const CANDIDATES: u64 = 1 << 14;

    fn new(seed: u64, rng: &mut StdRng) -> Self {
        let count = VnodeCount::DEFAULT.get();
        let mut ranks: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            ranks.swap(i, rng.random_range(0..=i));
        }
        Self {
            keep: ranks.iter().map(|&r| 1.0 / (r as f64 + 1.0)).collect(),
            salt: mix(seed ^ 0xA076_1D64_78BD_642F),
            next_candidate: 0,
            ready: VecDeque::new(),
            end: 0,
        }
    }

    /// Pushes onto `out` the kept ones of `candidates`, in order.
    fn kept(&self, candidates: &[u64], out: &mut VecDeque<u64>) -> Result<()> {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(
            candidates.iter().map(|&c| c as i64),
        ));
        let vnodes = vnode::compute_vnodes(&[keys], candidates.len(), VnodeCount::DEFAULT)?;
        for (&c, v) in candidates.iter().zip(vnodes) {
            if RowRng::new(self.salt, c).unit() < self.keep[v.index()] {
                out.push_back(c);
            }
        }
        Ok(())
    }

    fn take(&mut self) -> Result<u64> {
        loop {
            if let Some(k) = self.ready.pop_front() {
                return Ok(k);
            }
            let start = self.next_candidate;
            self.next_candidate += Self::CANDIDATES;
            let candidates: Vec<u64> = (start..self.next_candidate).collect();
            let mut ready = std::mem::take(&mut self.ready);
            self.kept(&candidates, &mut ready)?;
            self.ready = ready;
        }
    }
}

/// `(s, i)` keys: id = `s_index << 32 | i as u32`, `s = format!("s{s_index:06}")`. Snapshot
/// row `r` of `n`: without skew `s_index = r % distinct`, `i = r / distinct` (16 rows per
/// `s`); with skew the rows of `s_index` follow each other, about `n / (s_index + 1)` of
/// them over `H(distinct)`, `i` counting from 0. Fresh keys draw `s_index` the same way and
/// take `i = -1, -2, ...`.
struct CompositeKeys {
    distinct: u64,
    zipf: Option<Zipf>,
    fresh: u64,
    /// The snapshot's current `s_index` and the first row of the next (with skew).
    s: u64,
    next_first: u64,
}

impl CompositeKeys {
    /// Rows per distinct `s` without skew.
    const ROWS_PER_S: u64 = 16;

    fn id(s: u64, i: i32) -> u64 {
        (s << 32) | u64::from(i as u32)
    }

    /// The key of snapshot row `r` of `rows`.
    fn row_key(&self, r: u64, rows: u64) -> u64 {
        match &self.zipf {
            None => Self::id(r % self.distinct, (r / self.distinct) as i32),
            Some(zipf) => {
                let s = zipf.value_of_row(r, rows);
                Self::id(s, (r - zipf.first_row(s, rows)) as i32)
            }
        }
    }
}

impl Synthetic {
    pub(super) fn new(
        shape: SyntheticShape,
        skew: bool,
        scale: f64,
        seed: u64,
        rng: &mut StdRng,
    ) -> Self {
        let rows = synthetic_rows(scale);
        let values = [
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Float64, true),
            Field::new("c", DataType::Utf8, false),
        ];
        let suffix = if skew { "_skew" } else { "" };
        let (manifest, key_fields, keys) = match shape {
            SyntheticShape::Int64 => (
                manifest(&format!("synthetic_int64{suffix}"), &["k"], None, &[]),
                vec![Field::new("k", DataType::Int64, false)],
                if skew {
                    Keys::Skewed(SkewedKeys::new(seed, rng))
                } else {
                    Keys::Counting { next: rows }
                },
            ),
            SyntheticShape::Composite => {
                let distinct = (rows / CompositeKeys::ROWS_PER_S).max(1);
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
                    Keys::Composite(CompositeKeys {
                        distinct,
                        zipf: skew.then(|| Zipf::new(distinct)),
                        fresh: 0,
                        s: 0,
                        next_first: Zipf::new(distinct).first_row(1, rows),
                    }),
                )
            }
        };
        let indices = (0..key_fields.len()).collect();
        Self {
            schema: Arc::new(Schema::new(
                key_fields.into_iter().chain(values).collect::<Vec<_>>(),
            )),
            manifest,
            indices,
            seed,
            rows,
            made: 0,
            keys,
        }
    }

    /// The value columns of the rows with key ids `ids`.
    fn values(&self, ids: &[u64]) -> Vec<ArrayRef> {
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz ";
        let mut a = Vec::with_capacity(ids.len());
        let mut b = Vec::with_capacity(ids.len());
        let mut c = arrow_array::builder::StringBuilder::with_capacity(ids.len(), ids.len() * 20);
        let mut text = String::with_capacity(32);
        for &id in ids {
            let mut rng = RowRng::new(self.seed, id);
            a.push(rng.below(1_000_000) as i64);
            b.push((rng.unit() >= 0.1).then(|| rng.unit() * 2e6 - 1e6));
            text.clear();
            for _ in 0..8 + rng.below(24) {
                text.push(LETTERS[rng.below(LETTERS.len() as u64) as usize] as char);
            }
            c.append_value(&text);
        }
        vec![
            Arc::new(Int64Array::from(a)),
            Arc::new(Float64Array::from(b)),
            Arc::new(c.finish()),
        ]
    }

    /// The rows of `ids`, all columns.
    fn rows_of(&self, ids: &[u64]) -> Result<RecordBatch> {
        let mut columns = self.key_columns(ids)?;
        columns.extend(self.values(ids));
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// Rows per snapshot batch.
const BATCH_ROWS: u64 = 8192;

impl Shape for Synthetic {
    fn manifest(&self) -> Manifest {
        self.manifest.clone()
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn key_indices(&self) -> &[usize] {
        &self.indices
    }

    fn next_snapshot(&mut self) -> Result<Option<RecordBatch>> {
        let (start, rows) = (self.made, self.rows);
        let end = rows.min(start + BATCH_ROWS);
        if start >= end {
            return Ok(None);
        }
        let ids: Vec<u64> = match &mut self.keys {
            Keys::Counting { .. } => (start..end).collect(),
            Keys::Skewed(keys) => {
                let ids = (start..end)
                    .map(|_| keys.take())
                    .collect::<Result<Vec<_>>>()?;
                keys.end = ids.last().map_or(keys.end, |&k| k + 1);
                ids
            }
            Keys::Composite(keys) => match keys.zipf {
                None => (start..end).map(|r| keys.row_key(r, rows)).collect(),
                Some(zipf) => (start..end)
                    .map(|r| {
                        // Rows of one `s` follow each other: move on past the empty ones.
                        while r >= keys.next_first && keys.s + 1 < keys.distinct {
                            keys.s += 1;
                            keys.next_first = zipf.first_row(keys.s + 1, rows);
                        }
                        CompositeKeys::id(keys.s, (r - zipf.first_row(keys.s, rows)) as i32)
                    })
                    .collect(),
            },
        };
        self.made = end;
        self.rows_of(&ids).map(Some)
    }

    fn slots(&self) -> u64 {
        match &self.keys {
            Keys::Skewed(keys) => keys.end,
            _ => self.rows,
        }
    }

    fn slot_keys(&self, slots: &[u64], out: &mut VecDeque<u64>) -> Result<()> {
        match &self.keys {
            Keys::Counting { .. } => out.extend(slots),
            Keys::Skewed(keys) => keys.kept(slots, out)?,
            Keys::Composite(keys) => out.extend(slots.iter().map(|&r| keys.row_key(r, self.rows))),
        }
        Ok(())
    }

    fn originals(&self, ids: &[u64]) -> Result<RecordBatch> {
        self.rows_of(ids)
    }

    fn new_key(&mut self, rng: &mut StdRng) -> Result<u64> {
        match &mut self.keys {
            Keys::Counting { next } => {
                *next += 1;
                Ok(*next - 1)
            }
            Keys::Skewed(keys) => keys.take(),
            Keys::Composite(keys) => {
                let s = match &keys.zipf {
                    Some(zipf) => zipf.draw(rng.random()),
                    None => rng.random_range(0..keys.distinct),
                };
                keys.fresh += 1;
                let i = i32::try_from(keys.fresh)
                    .map_err(|_| internal!("gen: more than 2^31 fresh composite keys"))?;
                Ok(CompositeKeys::id(s, -i))
            }
        }
    }

    fn key_columns(&self, ids: &[u64]) -> Result<Vec<ArrayRef>> {
        Ok(match &self.keys {
            Keys::Counting { .. } | Keys::Skewed(_) => vec![Arc::new(
                Int64Array::from_iter_values(ids.iter().map(|&id| id as i64)),
            )],
            Keys::Composite(_) => vec![
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|id| format!("s{:06}", id >> 32)),
                )),
                Arc::new(Int32Array::from_iter_values(
                    ids.iter().map(|id| (id & 0xFFFF_FFFF) as u32 as i32),
                )),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harmonic_numbers_match_their_sums() {
        let mut sum = 0.0;
        let mut last = 0.0;
        for j in 1..200_000u64 {
            sum += 1.0 / j as f64;
            let h = harmonic(j);
            assert!((h - sum).abs() < 1e-9, "H({j}) = {h}, sum {sum}");
            assert!(h > last, "H increases at {j}");
            last = h;
        }
    }

    #[test]
    fn zipf_rows_follow_each_other_and_crowd_the_first_values() {
        let (distinct, rows) = (312, 5000);
        let zipf = Zipf::new(distinct);
        let values: Vec<u64> = (0..rows).map(|r| zipf.value_of_row(r, rows)).collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]));
        let first = values.iter().filter(|&&s| s == 0).count() as f64;
        let expected = rows as f64 / harmonic(distinct);
        assert!((first - expected).abs() <= 1.0, "{first} vs {expected}");
        assert_eq!(zipf.first_row(distinct, rows), rows);
        // Draws: value 0 about 1/H of the time.
        let mut rng = StdRng::seed_from_u64(5);
        let zeros = (0..10_000).filter(|_| zipf.draw(rng.random()) == 0).count() as f64;
        assert!((zeros / 10_000.0 - 1.0 / harmonic(distinct)).abs() < 0.02);
    }

    /// Every shape makes any snapshot row again, by its slot: the slots in order give the
    /// snapshot's keys (in its order when that is key order), and their rows are the
    /// snapshot's.
    #[test]
    fn slots_make_the_snapshot_rows_again() {
        for (shape, skew) in [
            (SyntheticShape::Int64, false),
            (SyntheticShape::Int64, true),
            (SyntheticShape::Composite, false),
            (SyntheticShape::Composite, true),
        ] {
            let mut rng = StdRng::seed_from_u64(9);
            let mut s = Synthetic::new(shape, skew, 0.2, 9, &mut rng);
            let mut snapshot = Vec::new();
            while let Some(batch) = s.next_snapshot().unwrap() {
                snapshot.push(batch);
            }
            let snapshot = arrow_select::concat::concat_batches(&s.schema(), &snapshot).unwrap();
            assert_eq!(snapshot.num_rows(), 20_000);
            let slots: Vec<u64> = (0..s.slots()).collect();
            let mut ids = VecDeque::new();
            s.slot_keys(&slots, &mut ids).unwrap();
            let ids: Vec<u64> = ids.into();
            assert_eq!(ids.len(), 20_000, "{shape:?} {skew}");
            assert_eq!(s.originals(&ids).unwrap(), snapshot, "{shape:?} {skew}");
        }
    }
}
