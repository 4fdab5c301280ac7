//! The completion certificate: per vnode, what the downstream holds against what the upstream
//! holds, when the backfill has finished.
//!
//! ```text
//!   downstream: every committed output change ──┐  per vnode: rows (+1 insert, -1 delete) and
//!                                               ├─ the wrapping sum of a 64-bit row hash
//!   upstream: snapshot + every input change ────┘  (+ insert, - delete): order-independent
//! ```
//!
//! The upstream side is the table the input ends with, digested from the input itself: by
//! the dataset's validation pass during a replay (which reads every row anyway, on its own
//! thread), by [`certify_output`] for `backfill verify`. It does not trust the state: a row
//! the store lost, or one the backfill emitted twice, shows as a difference.
//!
//! A [`TableDigest`] keeps, per vnode, a row count and the wrapping sum of a 64-bit hash of
//! each row's values. Both are order-independent and a delete subtracts what its insert added,
//! so the digest of a changelog applied to an empty table equals the digest of the resulting
//! table, whatever the order of the changes. By I2 the downstream equals the upstream once the
//! backfill finished: a [`Certificate`] compares the two digests vnode by vnode.
//!
//! The row hash is 64 bits folded from the row's values, column by column, with a multiply
//! per 64-bit word (the vnode hash's walk over the values, with a faster fold than its CRC:
//! a replay hashes every row it writes and every row of the table). Columns of types the
//! vnode hash does not cover (nested types) are left out of the hash (the count still covers
//! their rows); [`Certificate::hashed_columns`] says how many counted.

use std::borrow::Cow;
use std::path::Path;

use arrow_array::{ArrayRef, RecordBatch};

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;

use crate::chunk::{OP_COLUMN, Op, StreamChunk};
use crate::error::{Error, Result, internal};
use crate::job::shard::Shard;
use crate::replay::{Dataset, Observed};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeCount, check_hashable, mix64_rows};

/// Rows per read while digesting.
const DIGEST_BATCH_ROWS: usize = 64 * 1024;

/// Per vnode: a row count and an order-independent checksum of the rows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TableDigest {
    rows: Vec<i64>,
    sums: Vec<u64>,
}

/// The columns of `batch` that the row hash covers.
fn hashed(batch: &RecordBatch) -> Vec<ArrayRef> {
    batch
        .schema_ref()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(f, _)| check_hashable(f.name(), f.data_type()).is_ok())
        .map(|(_, c)| c.clone())
        .collect()
}

impl TableDigest {
    /// The digest of an empty table of `count` vnodes.
    pub fn new(count: VnodeCount) -> Self {
        Self {
            rows: vec![0; count.get()],
            sums: vec![0; count.get()],
        }
    }

    fn row_hashes(batch: &RecordBatch) -> Result<Vec<u64>> {
        Ok(mix64_rows(&hashed(batch), batch.num_rows())?)
    }

    /// Adds the rows of `other` (a digest of the same vnode count): the digest of both
    /// changelogs together.
    pub fn add(&mut self, other: &TableDigest) -> Result<()> {
        if other.rows.len() != self.rows.len() {
            return Err(internal!(
                "adding a digest of {} vnodes to one of {}",
                other.rows.len(),
                self.rows.len()
            ));
        }
        for (rows, more) in self.rows.iter_mut().zip(&other.rows) {
            *rows += more;
        }
        for (sum, more) in self.sums.iter_mut().zip(&other.sums) {
            *sum = sum.wrapping_add(*more);
        }
        Ok(())
    }

    /// Applies rows a dataset's validation read ([`Dataset::validate_observed`]): snapshot
    /// rows are inserts.
    ///
    /// The pass's row hashes, when it computed them, are this digest's (the same function
    /// over every column).
    pub(crate) fn observe(&mut self, desc: &TableDesc, rows: Observed<'_>) -> Result<()> {
        let (batch, hashes, ops) = match rows {
            Observed::Snapshot(batch, hashes) => (batch, hashes, None),
            Observed::Changes(batch, ops, hashes) => (batch, hashes, Some(ops)),
            Observed::Checkpoint(_) | Observed::Resumed(_) => return Ok(()),
        };
        let hashes = match hashes {
            Some(hashes) => Cow::Borrowed(hashes),
            None => Cow::Owned(Self::row_hashes(batch)?),
        };
        let ops = match ops {
            Some(ops) => Cow::Borrowed(ops),
            None => Cow::Owned(vec![Op::Insert; batch.num_rows()]),
        };
        self.apply_hashed(desc, batch, &hashes, &ops)
    }

    /// Applies a chunk of changes of the table `desc`: inserts add, deletes subtract.
    pub fn apply(&mut self, desc: &TableDesc, chunk: &StreamChunk) -> Result<()> {
        self.apply_rows(desc, chunk.batch(), chunk.ops())
    }

    /// Applies rows of the table `desc` with their ops. Unlike a [`StreamChunk`], the rows
    /// may cut an update pair in two (a batch read back from a file ends where it ends): the
    /// digest counts each row on its own.
    fn apply_rows(&mut self, desc: &TableDesc, batch: &RecordBatch, ops: &[Op]) -> Result<()> {
        if ops.len() != batch.num_rows() {
            return Err(internal!(
                "{} ops for {} rows in a digest",
                ops.len(),
                batch.num_rows()
            ));
        }
        self.apply_hashed(desc, batch, &Self::row_hashes(batch)?, ops)
    }

    /// [`Self::apply_rows`] with the rows' hashes given.
    fn apply_hashed(
        &mut self,
        desc: &TableDesc,
        batch: &RecordBatch,
        hashes: &[u64],
        ops: &[Op],
    ) -> Result<()> {
        if hashes.len() != batch.num_rows() {
            return Err(internal!(
                "{} hashes for {} rows in a digest",
                hashes.len(),
                batch.num_rows()
            ));
        }
        let vnodes = desc.vnodes_of(batch)?;
        for ((vnode, hash), op) in vnodes.iter().zip(hashes).zip(ops) {
            let i = vnode.index();
            let (rows, sum) = match (self.rows.get_mut(i), self.sums.get_mut(i)) {
                (Some(r), Some(s)) => (r, s),
                _ => return Err(internal!("vnode {vnode} beyond the digest's count")),
            };
            if op.is_insert() {
                *rows += 1;
                *sum = sum.wrapping_add(*hash);
            } else {
                *rows -= 1;
                *sum = sum.wrapping_sub(*hash);
            }
        }
        Ok(())
    }

    /// Keeps the vnodes in `range` (a shard's), as if the others held nothing: the table a
    /// shard owns.
    pub fn retain(&mut self, range: std::ops::Range<usize>) {
        for (i, (rows, sum)) in self.rows.iter_mut().zip(&mut self.sums).enumerate() {
            if !range.contains(&i) {
                (*rows, *sum) = (0, 0);
            }
        }
    }

    /// The digest of the committed output of a replay in `out`: its
    /// [`output_files`](crate::job::output::output_files).
    pub fn of_output(out: &Path, desc: &TableDesc) -> Result<Self> {
        let files = crate::job::output::output_files(out)?;
        Self::of_files(files, desc, DIGEST_BATCH_ROWS)
    }

    /// The digest of the part `shard` of the committed output in `out` (`None`: an
    /// unsharded replay's files).
    pub fn of_part(out: &Path, desc: &TableDesc, shard: Option<Shard>) -> Result<Self> {
        let files = crate::job::output::part_files(out, shard)?;
        Self::of_files(files, desc, DIGEST_BATCH_ROWS)
    }

    /// [`TableDigest::of_output`], reading `batch_rows` rows at a time.
    #[cfg(test)]
    fn of_output_in_batches(out: &Path, desc: &TableDesc, batch_rows: usize) -> Result<Self> {
        Self::of_files(crate::job::output::output_files(out)?, desc, batch_rows)
    }

    /// The digest of output `files`, reading `batch_rows` rows at a time.
    fn of_files(
        files: Vec<(u64, std::path::PathBuf)>,
        desc: &TableDesc,
        batch_rows: usize,
    ) -> Result<Self> {
        let mut digest = Self::new(desc.vnode_count());
        let schema = desc.schema();
        for (_, path) in files {
            let mut reader = crate::replay::files::open_reader(&path, batch_rows)?;
            while let Some(batch) = reader.next_batch() {
                // Batches of a file may end between the two halves of an update pair, so
                // they are not read as chunks: only each row's op and values count here.
                let batch = batch?;
                let ops = ops_of(&batch, &path)?;
                let columns: Vec<ArrayRef> = schema
                    .fields()
                    .iter()
                    .map(|f| {
                        batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                            Error::dataset(
                                &path,
                                "columns",
                                format!("the output lacks column `{}`", f.name()),
                            )
                        })
                    })
                    .collect::<Result<_>>()?;
                let columns = crate::replay::files::conform(&columns, schema)?;
                let batch = RecordBatch::try_new(schema.clone(), columns)?;
                digest.apply_rows(desc, &batch, &ops)?;
            }
        }
        Ok(digest)
    }
}

impl TableDigest {
    /// The digest of the table `dataset` ends with (its snapshot, then every change), with
    /// the dataset's last epoch: the expectation a replay's output is certified against,
    /// computed from the input alone, in one pass and constant memory (the digest is a sum).
    pub fn of_dataset(dataset: &Dataset, desc: &TableDesc) -> Result<(Self, u64)> {
        let mut digest = Self::new(desc.vnode_count());
        for batch in dataset.read_snapshot(DIGEST_BATCH_ROWS)? {
            digest.apply(desc, &StreamChunk::inserts(batch?))?;
        }
        let mut last_epoch = 0;
        for item in dataset.read_changes(DIGEST_BATCH_ROWS)? {
            let item = item?;
            last_epoch = item.epoch;
            digest.apply(desc, &item.chunk)?;
        }
        Ok((digest, last_epoch))
    }
}

/// The completion certificate of a replay's output in `out` against the dataset it replayed,
/// computed from the files alone (no state): per vnode of `dataset`'s default vnode count, the
/// rows and checksum the output's changes net to, against the snapshot's and the changelog's.
/// `backfill verify` checks it next to its row-by-row comparison. The output is locked
/// meanwhile ([`lock_output_to_read`](crate::job::output::lock_output_to_read)).
pub fn certify_output(dataset: &Dataset, out: &Path) -> Result<Certificate> {
    let _lock = crate::job::output::lock_output_to_read(out)?;
    certify_locked_output(dataset, out)
}

/// The completion certificate of the part `shard` of the output in `out` (a replay's, which
/// holds its lock), per vnode of `vnodes`: the whole output for `None`, else the shard's
/// files against the table of its vnodes.
pub(crate) fn certify_locked_part(
    dataset: &Dataset,
    out: &Path,
    shard: Option<Shard>,
    vnodes: VnodeCount,
) -> Result<Certificate> {
    let desc = dataset.table_desc(vnodes)?;
    let downstream = TableDigest::of_part(out, &desc, shard)?;
    let (mut upstream, epoch) = TableDigest::of_dataset(dataset, &desc)?;
    if let Some(shard) = shard {
        upstream.retain(shard.range(vnodes)?);
    }
    Ok(Certificate::compare(&desc, epoch, &downstream, &upstream))
}

/// [`certify_output`] for a caller that holds the output's lock already.
fn certify_locked_output(dataset: &Dataset, out: &Path) -> Result<Certificate> {
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let downstream = TableDigest::of_output(out, &desc)?;
    let (upstream, epoch) = TableDigest::of_dataset(dataset, &desc)?;
    Ok(Certificate::compare(&desc, epoch, &downstream, &upstream))
}

/// The op of every row of a changelog batch read from `path`.
fn ops_of(batch: &RecordBatch, path: &Path) -> Result<Vec<Op>> {
    let invalid = |message: String| Error::dataset(path, "column `_op`", message);
    let column = batch
        .column_by_name(OP_COLUMN)
        .ok_or_else(|| invalid("missing".into()))?;
    let codes = column
        .as_primitive_opt::<Int8Type>()
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| {
            invalid(format!(
                "must be non-null Int8, found {}",
                column.data_type()
            ))
        })?;
    codes
        .values()
        .iter()
        .enumerate()
        .map(|(row, &code)| Op::from_code(code).map_err(|e| invalid(format!("row {row}: {e}"))))
        .collect()
}

/// The downstream's digest against the upstream's, vnode by vnode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// The epoch both were taken at.
    pub epoch: u64,
    /// Vnodes compared.
    pub vnodes: usize,
    /// Rows in the upstream table.
    pub upstream_rows: i64,
    /// Rows the downstream holds.
    pub downstream_rows: i64,
    /// Columns the row hash covers (see the module docs).
    pub hashed_columns: usize,
    /// Vnodes whose count or checksum differ (at most the first 16).
    pub mismatched: Vec<VirtualNode>,
    /// Vnodes that differ, in all.
    pub mismatches: usize,
}

impl Certificate {
    /// Compares the digests (taken at `epoch`) of a table of `desc`.
    pub fn compare(
        desc: &TableDesc,
        epoch: u64,
        downstream: &TableDigest,
        upstream: &TableDigest,
    ) -> Self {
        let mut mismatched = Vec::new();
        let mut mismatches = 0;
        for (i, vnode) in desc.vnode_count().vnodes().enumerate() {
            let same = downstream.rows.get(i) == upstream.rows.get(i)
                && downstream.sums.get(i) == upstream.sums.get(i);
            if !same {
                mismatches += 1;
                if mismatched.len() < 16 {
                    mismatched.push(vnode);
                }
            }
        }
        let hashed_columns = desc
            .schema()
            .fields()
            .iter()
            .filter(|f| check_hashable(f.name(), f.data_type()).is_ok())
            .count();
        Self {
            epoch,
            vnodes: desc.vnode_count().get(),
            upstream_rows: upstream.rows.iter().sum(),
            downstream_rows: downstream.rows.iter().sum(),
            hashed_columns,
            mismatched,
            mismatches,
        }
    }

    /// True when every vnode matches.
    pub fn matches(&self) -> bool {
        self.mismatches == 0
    }

    /// One line: what matched, or which vnodes differ. `epoch` is the dataset's epoch the
    /// output is complete up to.
    pub fn describe(&self) -> String {
        if self.matches() {
            format!(
                "{} rows in {} vnodes at dataset epoch {}: downstream == upstream per vnode \
                 (count and checksum of {} columns)",
                self.upstream_rows, self.vnodes, self.epoch, self.hashed_columns
            )
        } else {
            let shown: Vec<String> = self.mismatched.iter().map(|v| v.to_string()).collect();
            format!(
                "{} of {} vnodes differ at dataset epoch {} (vnodes {}{}); downstream {} rows, \
                 upstream {}",
                self.mismatches,
                self.vnodes,
                self.epoch,
                shown.join(", "),
                if self.mismatches > shown.len() {
                    ", ..."
                } else {
                    ""
                },
                self.downstream_rows,
                self.upstream_rows
            )
        }
    }
}

impl crate::job::output::FinishRecord {
    /// The end of a job whose final certificate is `certificate` (here, beside the
    /// certificate: the output's records know nothing of certificates).
    pub fn of(certificate: &Certificate) -> Self {
        Self {
            epoch: certificate.epoch,
            certificate_matches: certificate.matches(),
            certificate: certificate.describe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::key::KeyColumn;

    fn desc() -> TableDesc {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(8).unwrap())
    }

    fn chunk(desc: &TableDesc, text: &str) -> StreamChunk {
        StreamChunk::from_text(desc.schema(), text).unwrap()
    }

    #[test]
    fn a_changelog_digests_like_the_table_it_makes_in_any_order() {
        let desc = desc();
        let mut log = TableDigest::new(desc.vnode_count());
        log.apply(&desc, &chunk(&desc, "+ 1 10\n+ 2 20\n+ 3 30"))
            .unwrap();
        log.apply(&desc, &chunk(&desc, "U- 2 20\nU+ 2 21\n- 3 30"))
            .unwrap();
        let mut table = TableDigest::new(desc.vnode_count());
        table.apply(&desc, &chunk(&desc, "+ 2 21\n+ 1 10")).unwrap();
        assert_eq!(log, table);
        let certificate = Certificate::compare(&desc, 5, &log, &table);
        assert!(certificate.matches());
        assert_eq!(certificate.upstream_rows, 2);
    }

    #[test]
    fn output_batches_that_cut_an_update_pair_in_two_still_digest() {
        let desc = desc();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("changes")).unwrap();
        let log = chunk(&desc, "+ 1 10\n+ 2 20\nU- 2 20\nU+ 2 21\n- 1 10")
            .to_changelog(Some(7))
            .unwrap();
        let path = dir
            .path()
            .join("changes/epoch-00000000000000000007.parquet");
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            log.schema(),
            None,
        )
        .unwrap();
        writer.write(&log).unwrap();
        writer.close().unwrap();
        let mut table = TableDigest::new(desc.vnode_count());
        table.apply(&desc, &chunk(&desc, "+ 2 21")).unwrap();
        // Batches of 3 rows: the first ends with the U-, the second starts with its U+.
        for rows in [1, 2, 3, 1024] {
            let read = TableDigest::of_output_in_batches(dir.path(), &desc, rows).unwrap();
            assert_eq!(read, table, "batches of {rows}");
        }
    }

    #[test]
    fn an_output_is_certified_against_its_dataset_from_the_files_alone() {
        use crate::replay::testing::{MANIFEST, changes, dataset, rows, schema, write_batch};
        let dir = dataset(
            MANIFEST,
            &[rows("1 a\n2 b\n3 c")],
            &[changes(&[(5, "U- 2 b\nU+ 2 x\n- 3 c"), (6, "+ 4 d")])],
        );
        let dataset = Dataset::open(dir.path()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let file = out
            .path()
            .join("changes/epoch-00000000000000000006.parquet");
        let output = |text: &str| {
            let log = StreamChunk::from_text(&schema(), text)
                .unwrap()
                .to_changelog(Some(6))
                .unwrap();
            write_batch(&file, &log);
        };
        output("+ 1 a\n+ 2 b\nU- 2 b\nU+ 2 x\n+ 4 d");
        let c = certify_output(&dataset, out.path()).unwrap();
        assert!(c.matches(), "{c:?}");
        assert_eq!((c.upstream_rows, c.downstream_rows, c.epoch), (3, 3, 6));
        // One value off: its vnode's checksum differs, though the counts agree.
        output("+ 1 a\n+ 2 y\n+ 4 d");
        let c = certify_output(&dataset, out.path()).unwrap();
        assert_eq!(
            (c.mismatches, c.upstream_rows, c.downstream_rows),
            (1, 3, 3)
        );
        // A row missing.
        output("+ 1 a\n+ 2 x");
        let c = certify_output(&dataset, out.path()).unwrap();
        assert!(!c.matches());
        assert_eq!(c.downstream_rows, 2);
    }

    #[test]
    fn a_changed_value_or_a_missing_row_is_a_mismatch() {
        let desc = desc();
        let mut up = TableDigest::new(desc.vnode_count());
        up.apply(&desc, &chunk(&desc, "+ 1 10\n+ 2 20")).unwrap();
        let mut other_value = TableDigest::new(desc.vnode_count());
        other_value
            .apply(&desc, &chunk(&desc, "+ 1 10\n+ 2 99"))
            .unwrap();
        let c = Certificate::compare(&desc, 5, &other_value, &up);
        assert_eq!(c.mismatches, 1);
        let mut missing = TableDigest::new(desc.vnode_count());
        missing.apply(&desc, &chunk(&desc, "+ 1 10")).unwrap();
        let c = Certificate::compare(&desc, 5, &missing, &up);
        assert!(!c.matches());
        assert_eq!((c.downstream_rows, c.upstream_rows), (1, 2));
    }
}
