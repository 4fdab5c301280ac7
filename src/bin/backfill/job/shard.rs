//! Shards of a replay: `--shard I/N` owns the I-th of N even vnode ranges.
//!
//! ```text
//!   vnodes 0 ................................................ V-1
//!          [ shard 0/3        )[ shard 1/3      )[ shard 2/3      )
//!            V/3 (+1 for the first V % N shards), contiguous
//! ```
//!
//! Shards count from 0 (`--shard 0/2` and `--shard 1/2`), as Kubernetes' completion index
//! and AWS Batch's array index do; a Slurm array's task ids are made to count from 0 by
//! subtracting `SLURM_ARRAY_TASK_MIN` (and dividing by the step). The ranges are those of
//! [`VnodeBitmap::split`](crate::vnode::VnodeBitmap::split) (the actors' ranges), so
//! `N <= V`: no shard is empty of vnodes.
//!
//! A shard loads only its vnodes' snapshot rows and applies only its vnodes' changes
//! ([`ShardFilter`], applied to the batches before they reach the loader and to the change
//! chunks before they reach the job): its store holds only its rows, the job runs over its
//! table as usual, and its output holds only its rows, in files named apart
//! (`epoch-<20 digits>.shard-I-of-N.parquet`, [`Shard::tag`]). N processes share the
//! dataset and the output with no coordination: every name a shard writes carries its tag.

use std::ops::Range;

use arrow_array::{BooleanArray, RecordBatch};

use crate::chunk::StreamChunk;
use crate::error::{Error, Result};
use crate::table::TableDesc;
#[cfg(test)]
use crate::vnode::VnodeBitmap;
use crate::vnode::VnodeCount;

/// One of N shards of a replay, counted from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: u32,
    count: u32,
}

/// The variable that gives N to `--shard auto` when the scheduler does not (Kubernetes
/// indexed Jobs, AWS Batch arrays) and `--shards` is not given.
pub const SHARDS_ENV: &str = "BACKFILL_SHARDS";

impl Shard {
    /// Shard `index` of `count` (`index < count`, `count >= 1`).
    pub fn new(index: u32, count: u32) -> Result<Self> {
        if count == 0 || index >= count {
            return Err(Error::config(format!(
                "shard {index}/{count}: a shard is I/N with 0 <= I < N (shards count from 0)"
            )));
        }
        Ok(Self { index, count })
    }

    /// How many shards there are.
    pub fn count(self) -> u32 {
        self.count
    }

    /// The vnodes this shard owns out of `vnodes`: the `index`-th of `count` contiguous ranges
    /// whose sizes differ by at most one (the first `vnodes % count` one longer). An error
    /// when there are more shards than vnodes.
    pub fn range(self, vnodes: VnodeCount) -> Result<Range<usize>> {
        let (v, n, i) = (vnodes.get(), self.count as usize, self.index as usize);
        if n > v {
            return Err(Error::config(format!(
                "{n} shards of {v} vnodes: a shard owns at least one vnode, so choose at most \
                 {v} shards (or more --vnodes)"
            )));
        }
        let (base, extra) = (v / n, v % n);
        let start = i * base + i.min(extra);
        Ok(start..start + base + usize::from(i < extra))
    }

    /// [`Shard::range`] as a set.
    #[cfg(test)]
    pub fn vnodes(self, vnodes: VnodeCount) -> Result<VnodeBitmap> {
        let range = self.range(vnodes)?;
        let mut set = VnodeBitmap::empty(vnodes);
        for v in vnodes.vnodes().filter(|v| range.contains(&v.index())) {
            set.insert(v)?;
        }
        Ok(set)
    }

    /// The shard's part of the names it writes: `shard-I-of-N`.
    pub fn tag(self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }

    /// The shard a [`Shard::tag`] names; `None` for anything else (one spelling only: no
    /// sign, no leading zero).
    pub fn parse_tag(tag: &str) -> Option<Self> {
        let rest = tag.strip_prefix("shard-")?;
        let (index, count) = rest.split_once("-of-")?;
        Self::new(canonical_number(index)?, canonical_number(count)?).ok()
    }

    /// The shard from a batch scheduler's environment (`--shard auto`), read through `var`;
    /// `shards` is `--shards`. See [`Shard::from_env`].
    pub fn from_vars(shards: Option<u32>, var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |name: &str| -> Result<Option<u64>> {
            match var(name) {
                None => Ok(None),
                Some(text) => text.trim().parse::<u64>().map(Some).map_err(|_| {
                    Error::config(format!("--shard auto: {name}={text} is not a whole number"))
                }),
            }
        };
        let given_count = match shards {
            Some(n) => Some(u64::from(n)),
            None => number(SHARDS_ENV)?,
        };
        let need_count = |scheduler: &str| {
            given_count.ok_or_else(|| {
                Error::config(format!(
                    "--shard auto: {scheduler} gives this task's index but not the number of \
                     shards: pass --shards N or set {SHARDS_ENV}=N"
                ))
            })
        };
        let k8s = number("JOB_COMPLETION_INDEX")?;
        let slurm = number("SLURM_ARRAY_TASK_ID")?;
        let aws = number("AWS_BATCH_JOB_ARRAY_INDEX")?;
        let found: Vec<&str> = [
            (k8s.is_some(), "JOB_COMPLETION_INDEX (Kubernetes)"),
            (slurm.is_some(), "SLURM_ARRAY_TASK_ID (Slurm)"),
            (aws.is_some(), "AWS_BATCH_JOB_ARRAY_INDEX (AWS Batch)"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        if found.len() > 1 {
            return Err(Error::config(format!(
                "--shard auto: cannot tell which scheduler runs this task, several set their \
                 index: {}; pass --shard I/N",
                found.join(", ")
            )));
        }
        let (index, count) = if let Some(index) = k8s {
            (index, need_count("Kubernetes (JOB_COMPLETION_INDEX)")?)
        } else if let Some(id) = slurm {
            let min = number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = number("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            let count = match (number("SLURM_ARRAY_TASK_COUNT")?, given_count) {
                (Some(c), Some(g)) if c != g => {
                    return Err(Error::config(format!(
                        "--shard auto: the Slurm array has SLURM_ARRAY_TASK_COUNT={c} tasks, \
                         but {g} shards were asked for"
                    )));
                }
                (Some(c), _) => c,
                (None, Some(g)) => g,
                (None, None) => need_count("Slurm (SLURM_ARRAY_TASK_ID)")?,
            };
            let offset = id.checked_sub(min).ok_or_else(|| {
                Error::config(format!(
                    "--shard auto: SLURM_ARRAY_TASK_ID={id} is below SLURM_ARRAY_TASK_MIN={min}"
                ))
            })?;
            if offset % step != 0 {
                return Err(Error::config(format!(
                    "--shard auto: SLURM_ARRAY_TASK_ID={id} is not on the array's step {step} \
                     from {min}"
                )));
            }
            (offset / step, count)
        } else if let Some(index) = aws {
            (index, need_count("AWS Batch (AWS_BATCH_JOB_ARRAY_INDEX)")?)
        } else {
            return Err(Error::config(
                "--shard auto: no batch scheduler's task index in the environment (looked for \
                 JOB_COMPLETION_INDEX of a Kubernetes indexed Job, SLURM_ARRAY_TASK_ID of a \
                 Slurm array, AWS_BATCH_JOB_ARRAY_INDEX of an AWS Batch array job); pass \
                 --shard I/N"
                    .into(),
            ));
        };
        let index = u32::try_from(index).map_err(|_| too_big(index))?;
        let count = u32::try_from(count).map_err(|_| too_big(count))?;
        if index >= count {
            return Err(Error::config(format!(
                "--shard auto: this task's index {index} is not below the {count} shards"
            )));
        }
        Self::new(index, count)
    }

    /// [`Shard::from_vars`] on the process's environment.
    pub fn from_env(shards: Option<u32>) -> Result<Self> {
        Self::from_vars(shards, |name| std::env::var(name).ok())
    }
}

fn too_big(n: u64) -> Error {
    Error::config(format!(
        "--shard auto: {n} shards is more than any vnode count"
    ))
}

/// A number written the one way: digits, no leading zero (but `0`).
fn canonical_number(text: &str) -> Option<u32> {
    let ok = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    ok.then(|| text.parse().ok()).flatten()
}

impl std::fmt::Display for Shard {
    /// `I/N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = Error;

    /// `I/N`, `0 <= I < N`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::config(format!(
                "a shard is I/N (the I-th of N, counting from 0: 0/2 and 1/2) or auto, not `{s}`"
            ))
        };
        let (index, count) = s.split_once('/').ok_or_else(bad)?;
        let index = index.trim().parse().map_err(|_| bad())?;
        let count = count.trim().parse().map_err(|_| bad())?;
        Self::new(index, count)
    }
}

/// Keeps the rows of a shard's vnodes: vectorized (the table's vnode hash over a batch, one
/// mask, one filter kernel).
#[derive(Debug, Clone)]
pub struct ShardFilter {
    desc: TableDesc,
    range: Range<usize>,
}

impl ShardFilter {
    /// The filter of `shard` on rows of `desc` (its vnode count decides the range).
    pub fn new(shard: Shard, desc: TableDesc) -> Result<Self> {
        let range = shard.range(desc.vnode_count())?;
        Ok(Self { desc, range })
    }

    fn mask(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let vnodes = self.desc.vnodes_of(batch)?;
        Ok(vnodes
            .iter()
            .map(|v| Some(self.range.contains(&v.index())))
            .collect())
    }

    /// The rows of `batch` in the shard.
    pub fn batch(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mask = self.mask(&batch)?;
        if mask.true_count() == batch.num_rows() {
            return Ok(batch);
        }
        Ok(arrow_select::filter::filter_record_batch(&batch, &mask)?)
    }

    /// The changes of `chunk` in the shard; an update pair whose halves fall in two shards
    /// (a key change across vnodes) leaves each shard its half as a plain delete or insert.
    pub fn chunk(&self, chunk: StreamChunk) -> Result<StreamChunk> {
        let mask = self.mask(chunk.batch())?;
        if mask.true_count() == chunk.num_rows() {
            return Ok(chunk);
        }
        Ok(chunk.filter(&mask)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn ranges_are_the_even_split_of_the_vnodes() {
        for v in [1usize, 2, 3, 7, 16, 255, 256, 257, 1000] {
            let count = VnodeCount::new(v).unwrap();
            for n in 1..=v.min(20) {
                let split = VnodeBitmap::split(count, n).unwrap();
                let mut next = 0;
                for (i, set) in split.iter().enumerate() {
                    let shard = Shard::new(i as u32, n as u32).unwrap();
                    let range = shard.range(count).unwrap();
                    assert_eq!(range.start, next, "contiguous: {v} vnodes, shard {shard}");
                    next = range.end;
                    assert!(range.len() == v / n || range.len() == v / n + 1);
                    assert_eq!(shard.vnodes(count).unwrap(), *set, "{v} vnodes, {shard}");
                }
                assert_eq!(next, v, "the shards cover the vnodes");
            }
        }
        let count = VnodeCount::new(256).unwrap();
        assert_eq!(Shard::new(0, 2).unwrap().range(count).unwrap(), 0..128);
        assert_eq!(Shard::new(1, 2).unwrap().range(count).unwrap(), 128..256);
        assert_eq!(Shard::new(0, 3).unwrap().range(count).unwrap(), 0..86);
        assert_eq!(Shard::new(2, 3).unwrap().range(count).unwrap(), 171..256);
        let err = Shard::new(0, 257).unwrap().range(count).unwrap_err();
        assert!(err.to_string().contains("at most 256 shards"), "{err}");
    }

    #[test]
    fn shards_parse_and_name_one_way() {
        assert_eq!("1/3".parse::<Shard>().unwrap(), Shard::new(1, 3).unwrap());
        for bad in ["3/3", "1", "a/2", "-1/2", "0/0", "1/2/3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        let shard = Shard::new(12, 40).unwrap();
        assert_eq!(shard.tag(), "shard-12-of-40");
        assert_eq!(Shard::parse_tag(&shard.tag()), Some(shard));
        for bad in [
            "shard-01-of-2",
            "shard-1-of-02",
            "shard-2-of-2",
            "shard--1-of-2",
            "shard-1-of-",
            "shard-+1-of-2",
            "shard-1-of-2x",
            "shard-1of2",
            "shard-99999999999-of-99999999999",
        ] {
            assert_eq!(Shard::parse_tag(bad), None, "{bad}");
        }
        assert_eq!(Shard::parse_tag("shard-0-of-1"), Shard::new(0, 1).ok());
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn auto_reads_each_schedulers_variables() {
        let shard = |i, n| Shard::new(i, n).unwrap();
        // Kubernetes: the index, N from --shards or BACKFILL_SHARDS.
        let k8s = vars(&[("JOB_COMPLETION_INDEX", "2")]);
        assert_eq!(Shard::from_vars(Some(3), &k8s).unwrap(), shard(2, 3));
        let err = Shard::from_vars(None, &k8s).unwrap_err().to_string();
        assert!(
            err.contains("--shards N") && err.contains(SHARDS_ENV),
            "{err}"
        );
        let k8s_env = vars(&[("JOB_COMPLETION_INDEX", "0"), (SHARDS_ENV, "4")]);
        assert_eq!(Shard::from_vars(None, &k8s_env).unwrap(), shard(0, 4));
        assert!(Shard::from_vars(Some(2), &k8s).is_err(), "index 2 of 2");
        // Slurm: ids from SLURM_ARRAY_TASK_MIN, by the step; N from the array.
        let slurm = vars(&[
            ("SLURM_ARRAY_TASK_ID", "7"),
            ("SLURM_ARRAY_TASK_MIN", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Shard::from_vars(None, &slurm).unwrap(), shard(2, 4));
        assert_eq!(Shard::from_vars(Some(4), &slurm).unwrap(), shard(2, 4));
        assert!(
            Shard::from_vars(Some(3), &slurm).is_err(),
            "--shards disagrees"
        );
        let stepped = vars(&[
            ("SLURM_ARRAY_TASK_ID", "14"),
            ("SLURM_ARRAY_TASK_MIN", "10"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
        ]);
        assert_eq!(Shard::from_vars(None, &stepped).unwrap(), shard(2, 3));
        // AWS Batch: the index, N from the option or variable.
        let aws = vars(&[("AWS_BATCH_JOB_ARRAY_INDEX", "1"), (SHARDS_ENV, "2")]);
        assert_eq!(Shard::from_vars(None, &aws).unwrap(), shard(1, 2));
        // Nothing, two schedulers, or garbage: a clear error.
        let err = Shard::from_vars(Some(2), vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("JOB_COMPLETION_INDEX") && err.contains("--shard I/N"));
        let both = vars(&[
            ("JOB_COMPLETION_INDEX", "0"),
            ("AWS_BATCH_JOB_ARRAY_INDEX", "0"),
        ]);
        assert!(Shard::from_vars(Some(2), both).is_err());
        let garbage = vars(&[("JOB_COMPLETION_INDEX", "x")]);
        let err = Shard::from_vars(Some(2), garbage).unwrap_err().to_string();
        assert!(err.contains("JOB_COMPLETION_INDEX=x"), "{err}");
    }
}
