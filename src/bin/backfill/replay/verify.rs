//! Verifying a replay's output against its dataset: the oracle of a replay.
//!
//! The output directory holds `changes/epoch-<20 digits>.parquet` files (`_epoch`, `_op`, the
//! table's columns; exactly the names [`output_parts`] lists, the replay's own rule, so
//! `epoch-my-notes.parquet` is not read). [`verify`] applies them, in epoch order, strictly to an empty table
//! (exact row values: an all-column arrow-row encoding), so a duplicate insert, a delete of an
//! absent row or of a row with other values, or a lone update half fails with an
//! [`Error::Dataset`] naming the output file, row and epoch. A sharded output
//! (`epoch-E.shard-I-of-N.parquet`) is read shard by shard (each shard's files are one
//! changelog; the shards' keys are apart), after checking that all N shards are there. It then computes the expected
//! final table (snapshot + every change, applied just as strictly) and compares the two; a
//! difference names the first differing key in primary-key order and counts the others.
//!
//! Neither table is held in memory: the output's rows and the dataset's rows are each sorted
//! by key with an external sort ([`super::by_key`], whole rows with their sequence number in
//! their stream), then the two sorted streams are walked side by side, each key's rows applied
//! in stream order on each side and the two final rows compared:
//!
//! ```text
//!   out/changes/epoch-*.parquet ──sort by key──> key 1: + U- U+ │ final (1, x) ┐ equal?
//!   snapshot + dataset changes  ──sort by key──> key 1: snap U- U+ │ final (1, x) ┘
//! ```
//!
//! Errors come in the order an in-memory check would meet them: the output's (stream order),
//! then the dataset's, then the first difference. Memory is bounded by
//! [`ExternalSortOptions::memory_budget`] (half for each side).

use std::path::{Path, PathBuf};

use super::by_key::{KeyFold, KeyedChanges, Payload};
use super::changelog::ChangelogReader;
use super::dataset::{CHANGES_DIR, Dataset};
use super::extsort::{ExternalSortOptions, SortConfig};
use crate::error::{Error, Result};
use crate::job::output::{Parts, lock_output_to_read, output_parts};
use crate::job::shard::Shard;
use crate::vnode::VnodeCount;

/// Rows per batch read during verification.
const BATCH_SIZE: usize = 8192;

/// What a successful [`verify`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Output changelog files read.
    pub output_files: usize,
    /// Output changelog rows.
    pub output_rows: u64,
    /// Rows of the final table (equal in the output and the expectation).
    pub final_rows: u64,
    /// The shards of a sharded output (all N of them); `None`: an unsharded output.
    pub shards: Option<Vec<Shard>>,
}

/// Checks that the output in `out_dir` is a consistent changelog whose result equals the
/// dataset's snapshot plus all its changes (see the module docs), spilling to a temporary
/// directory (`TMPDIR`, removed afterwards) with the default memory budget. The output is
/// locked meanwhile ([`lock_output_to_read`]): one a replay is writing is refused with
/// [`Error::Locked`].
#[cfg(test)]
pub fn verify(dataset: &Dataset, out_dir: &Path) -> Result<VerifyReport> {
    verify_with(
        dataset,
        out_dir,
        &ExternalSortOptions::new(std::env::temp_dir()),
    )
}

/// [`verify`] with explicit scratch space and memory budget.
pub fn verify_with(
    dataset: &Dataset,
    out_dir: &Path,
    options: &ExternalSortOptions,
) -> Result<VerifyReport> {
    let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
    let _lock = lock_output_to_read(out_dir)?;
    let shards = check_shards(out_dir)?;
    // Each part's files are one changelog (its epochs never decrease); the parts' keys are
    // apart (a key's vnode is in one shard), so they are read one after the other.
    let mut parts: Vec<Vec<PathBuf>> = Vec::new();
    let mut last = None;
    for file in output_parts(out_dir)? {
        if parts.is_empty() || last != Some(file.shard) {
            parts.push(Vec::new());
            last = Some(file.shard);
        }
        if let Some(part) = parts.last_mut() {
            part.push(file.path);
        }
    }
    let output_files = parts.iter().map(Vec::len).sum();
    let scratch = options.scratch()?;
    let config = SortConfig::for_budget(options.memory_budget / 2);
    let side = |name| {
        KeyedChanges::new(
            dataset.schema(),
            desc.pk(),
            Payload::Row,
            scratch.path(),
            name,
            config,
            1,
        )
    };

    let mut output = side("output")?;
    let mut output_rows = 0u64;
    let mut output_error = None;
    for files in parts {
        output_error = read_changelog(
            ChangelogReader::new(files, dataset.schema().clone(), BATCH_SIZE),
            &mut output,
            &mut output_rows,
        )?;
        if output_error.is_some() {
            break;
        }
    }
    let mut expected = side("expected")?;
    let expected_error = match output_error {
        // Like a check that stops at the output's first error, never read the dataset then.
        Some(_) => None,
        None => read_dataset(dataset, &mut expected)?,
    };

    // Two folds compared key by key: each in one partition, so in key order.
    let mut found = output.finish_one()?;
    let mut wanted = expected.finish_one()?;
    let diff = compare(&mut wanted, &mut found)?;
    if let Some(violation) = found.first_violation() {
        return Err(found.error(violation)?);
    }
    if let Some(e) = output_error {
        return Err(e);
    }
    if let Some(violation) = wanted.first_violation() {
        return Err(wanted.error(violation)?);
    }
    if let Some(e) = expected_error {
        return Err(e);
    }
    if let Some((message, others)) = diff.first {
        let others = match others {
            0 => String::new(),
            n => format!(" (and {n} other keys)"),
        };
        return Err(Error::dataset(
            out_dir.join(CHANGES_DIR),
            "",
            format!("the replay output does not match snapshot + changes: {message}{others}"),
        ));
    }
    Ok(VerifyReport {
        output_files,
        output_rows,
        final_rows: diff.found_rows,
        shards,
    })
}

/// The shards of the output in `out_dir` (`None`: unsharded): one layout, and all N shards
/// present (their files, or for a shard with no row, its job record or claim); an error
/// names the missing shards.
fn check_shards(out_dir: &Path) -> Result<Option<Vec<Shard>>> {
    let parts = Parts::of(out_dir)?;
    if parts.shards.is_empty() {
        return Ok(None);
    }
    let changes = out_dir.join(CHANGES_DIR);
    let counts: std::collections::BTreeSet<u32> = parts.shards.iter().map(|s| s.count()).collect();
    if parts.whole || counts.len() > 1 {
        return Err(Error::dataset(
            changes,
            "",
            format!(
                "mixes {} output: an output is unsharded or the shards of one N",
                parts.layouts().join(" and ")
            ),
        ));
    }
    let count = counts.first().copied().unwrap_or(1);
    let missing: Vec<String> = (0..count)
        .filter_map(|i| Shard::new(i, count).ok())
        .filter(|s| !parts.shards.contains(s))
        .map(|s| s.to_string())
        .collect();
    if !missing.is_empty() {
        let seen: Vec<String> = parts.shards.iter().map(|s| s.to_string()).collect();
        return Err(Error::dataset(
            changes,
            "",
            format!(
                "is sharded {count} ways, but shard {} is missing (seen: {}): run                  `backfill replay ... --shard I/{count}` for each missing shard into this output",
                missing.join(", shard "),
                seen.join(", ")
            ),
        ));
    }
    Ok(Some(parts.shards.into_iter().collect()))
}

/// Reads checked changelog rows into `rows`, counting them. `Ok(Some(e))`: the data is bad
/// at `e` (rows before its batch were added); `Err`: a system error.
fn read_changelog(
    reader: ChangelogReader,
    rows: &mut KeyedChanges,
    count: &mut u64,
) -> Result<Option<Error>> {
    for changes in reader {
        let changes = match changes {
            Ok(changes) => changes,
            Err(e) => return Ok(Some(e)),
        };
        if let Err(e) = rows.push_changes(&changes)? {
            return Ok(Some(e));
        }
        *count += changes.ops.len() as u64;
    }
    Ok(None)
}

/// Reads the dataset's snapshot and changes into `rows`, like [`read_changelog`].
fn read_dataset(dataset: &Dataset, rows: &mut KeyedChanges) -> Result<Option<Error>> {
    for path in dataset.snapshot_files() {
        let reader = match dataset.snapshot_file_reader(path, BATCH_SIZE) {
            Ok(reader) => reader,
            Err(e) => return Ok(Some(e)),
        };
        let mut first_row = 0u64;
        for batch in reader {
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => return Ok(Some(e)),
            };
            if let Err(e) = rows.push_snapshot(path, first_row, &batch)? {
                return Ok(Some(e));
            }
            first_row += batch.num_rows() as u64;
        }
    }
    read_changelog(dataset.changelog(BATCH_SIZE), rows, &mut 0)
}

/// What walking both sides found.
struct Comparison {
    /// Rows of the output's final table.
    found_rows: u64,
    /// The smallest differing key, described, and how many other keys differ.
    first: Option<(String, u64)>,
}

/// Walks both sorted sides key by key (folding each, which records their violations) and
/// compares the final rows of each key.
fn compare(expected: &mut KeyFold, found: &mut KeyFold) -> Result<Comparison> {
    let mut result = Comparison {
        found_rows: 0,
        first: None,
    };
    let mut has_expected = expected.next_key()?;
    let mut has_found = found.next_key()?;
    while has_expected || has_found {
        let order = match (has_expected, has_found) {
            (true, true) => expected.key().cmp(found.key()),
            (true, false) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        let (key_of, e, f) = match order {
            std::cmp::Ordering::Less => (&*expected, expected.final_value(), None),
            std::cmp::Ordering::Greater => (&*found, None, found.final_value()),
            std::cmp::Ordering::Equal => (&*found, expected.final_value(), found.final_value()),
        };
        result.found_rows += u64::from(f.is_some());
        if e != f {
            match &mut result.first {
                Some((_, others)) => *others += 1,
                None => {
                    let show = |side: &KeyFold, value: Option<&[u8]>| match value {
                        Some(v) => side.describe_value(v),
                        None => "no row".to_string(),
                    };
                    result.first = Some((
                        format!(
                            "key {} expected {} found {}",
                            key_of.describe_key(key_of.key()),
                            show(expected, e),
                            show(found, f)
                        ),
                        0,
                    ));
                }
            }
        }
        if order.is_le() {
            has_expected = expected.next_key()?;
        }
        if order.is_ge() {
            has_found = found.next_key()?;
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_array::RecordBatch;

    use super::*;
    use crate::chunk::StreamChunk;
    use crate::error::EngineError;
    use crate::replay::testing::{
        MANIFEST, changes, dataset, log, random_dataset_text, rows, split, write_batch,
    };

    const SNAPSHOT: &str = "1 a\n2 b\n3 c";
    const CHANGES: &str = "4 + 4 d\n4 U- 1 a\n4 U+ 1 x\n7 - 2 b\n7 + 2 y\n9 - 3 c";

    fn output(files: &[(u64, RecordBatch)]) -> tempfile::TempDir {
        let out = tempfile::tempdir().unwrap();
        for (epoch, batch) in files {
            write_batch(
                &out.path()
                    .join("changes")
                    .join(format!("epoch-{epoch:020}.parquet")),
                batch,
            );
        }
        out
    }

    fn run(out_files: &[(u64, RecordBatch)]) -> Result<VerifyReport> {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[log(CHANGES)]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let out = output(out_files);
        verify(&ds, out.path())
    }

    /// The snapshot as inserts at epoch 1, then the dataset's changes by epoch.
    fn correct() -> Vec<(u64, RecordBatch)> {
        vec![
            (1, changes(&[(1, "+ 1 a\n+ 2 b\n+ 3 c")])),
            (4, log("4 + 4 d\n4 U- 1 a\n4 U+ 1 x")),
            (9, log("7 - 2 b\n7 + 2 y\n9 - 3 c")),
        ]
    }

    fn message(err: Error) -> String {
        assert!(matches!(err, Error::Dataset { .. }), "{err}");
        err.to_string()
    }

    #[test]
    fn accepts_a_correct_output() {
        let report = run(&correct()).unwrap();
        assert_eq!(
            report,
            VerifyReport {
                output_files: 3,
                output_rows: 9,
                final_rows: 3,
                shards: None,
            }
        );
        // A different but equivalent changelog is fine too.
        let report = run(&[(2, changes(&[(2, "+ 4 d\n+ 2 y\n+ 1 x")]))]).unwrap();
        assert_eq!(report.final_rows, 3);
    }

    /// Names outside the replay's rule are not output, however much they look like it; a
    /// `.tmp` is not published.
    #[test]
    fn reads_the_replays_output_names_only() {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[log(CHANGES)]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let out = output(&correct());
        let junk = log("4 + 4 d");
        for name in [
            "epoch-my-notes.parquet",
            "epoch-10.parquet",
            "epoch-99999999999999999999.parquet",
            "epoch-00000000000000000005.parquet.tmp",
        ] {
            write_batch(&out.path().join("changes").join(name), &junk);
        }
        let report = verify(&ds, out.path()).unwrap();
        assert_eq!((report.output_files, report.final_rows), (3, 3));
        let c = crate::job::certify_output(&ds, out.path()).unwrap();
        assert!(c.matches(), "{c:?}");
    }

    /// An output a replay holds (`OUT/.lock`) is refused, naming the holder; verify holds the
    /// lock itself while it runs.
    #[test]
    fn a_locked_output_is_refused() {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[log(CHANGES)]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let out = output(&correct());
        let lock_file = out.path().join(crate::job::output::OUT_LOCK_FILE);
        let replay = crate::store::durable::DirLock::acquire_file(&lock_file).unwrap();
        for err in [
            verify(&ds, out.path()).unwrap_err(),
            crate::job::certify_output(&ds, out.path()).unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::Engine(EngineError::Locked { .. })),
                "{err}"
            );
            assert!(err.to_string().contains(".lock"), "{err}");
            assert!(
                err.to_string().contains(&std::process::id().to_string()),
                "{err}"
            );
        }
        drop(replay);
        verify(&ds, out.path()).unwrap();
        crate::store::durable::DirLock::acquire_file(&lock_file).unwrap();
    }

    /// Scratch that cannot be made is an error naming where; a pass that spills leaves none.
    /// (A spill that fails part way: `tests/cli.rs`, with a file size limit.)
    #[test]
    fn scratch_is_an_error_or_is_removed() {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[log(CHANGES)]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let out = output(&correct());
        let parent = tempfile::tempdir().unwrap();
        // Not a directory: the pass cannot make its scratch, and says where.
        let file = parent.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let err = verify_with(&ds, out.path(), &ExternalSortOptions::new(&file)).unwrap_err();
        assert!(matches!(err, Error::Scratch { .. }), "{err}");
        let options = ExternalSortOptions::new(parent.path()).with_memory_budget(1);
        verify_with(&ds, out.path(), &options).unwrap();
        let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file is left: {left:?}");
    }

    #[test]
    fn rejects_a_dropped_row() {
        let mut files = correct();
        files[2].1 = log("7 - 2 b\n7 + 2 y");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("does not match")
                && err.contains("key (k=3) expected no row found (k=3, v=c)"),
            "{err}"
        );
        files.remove(0);
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch-00000000000000000004.parquet: epoch 4, row 1"),
            "{err}"
        );
        assert!(
            err.contains("update-delete (U-) of key (k=1), which does not exist"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_duplicated_insert() {
        let mut files = correct();
        files[1].1 = log("4 + 4 d\n4 + 4 d");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch-00000000000000000004.parquet: epoch 4, row 1"),
            "{err}"
        );
        assert!(
            err.contains("insert of key (k=4), which already exists"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_changed_value() {
        let mut files = correct();
        files[2].1 = log("7 - 2 b\n7 + 2 z\n9 - 3 c");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("key (k=2) expected (k=2, v=y) found (k=2, v=z)"),
            "{err}"
        );
        // A delete with other values than the row held.
        files[2].1 = log("7 - 2 q\n7 + 2 y\n9 - 3 c");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch 7, row 0") && err.contains("(k=2, v=b)"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_lone_update_half() {
        let mut files = correct();
        files[1].1 = log("4 + 4 d\n4 U- 1 a\n4 + 1 x");
        let err = message(run(&files).unwrap_err());
        assert!(
            err.contains("epoch 4, row 1") && err.contains("not immediately followed"),
            "{err}"
        );
    }

    #[test]
    fn missing_output_is_an_error() {
        let ds_dir = dataset(MANIFEST, &[rows(SNAPSHOT)], &[]);
        let ds = Dataset::open(ds_dir.path()).unwrap();
        let err = verify(&ds, Path::new("/nonexistent/out")).unwrap_err();
        assert!(matches!(err, Error::Dataset { .. }), "{err}");
    }

    /// Differential: the bounded verifier and the in-memory one agree, error for error, on
    /// random outputs (correct, or with a row dropped, repeated, changed or moved) of random
    /// datasets (some of them invalid), whatever the budget.
    #[test]
    fn agrees_with_the_in_memory_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xbeef);
        let scratch = tempfile::tempdir().unwrap();
        let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
        for case in 0..100 {
            let (snapshot, change_files) = random_dataset_text(&mut rng, case % 5 == 0);
            let mut snapshot: Vec<RecordBatch> = snapshot.iter().map(|t| rows(t)).collect();
            if snapshot.is_empty() {
                snapshot.push(rows(""));
            }
            let ds_dir = dataset(
                MANIFEST,
                &snapshot,
                &change_files.iter().map(|t| log(t)).collect::<Vec<_>>(),
            );
            let ds = Dataset::open(ds_dir.path()).unwrap();

            // The correct output: the snapshot as inserts at epoch 1, then the changes.
            let mut lines: Vec<String> = snapshot
                .iter()
                .flat_map(|b| {
                    StreamChunk::inserts(b.clone())
                        .to_text()
                        .unwrap()
                        .lines()
                        .map(|l| format!("1 {l}"))
                        .collect::<Vec<_>>()
                })
                .collect();
            lines.extend(
                change_files
                    .iter()
                    .flat_map(|t| t.lines().map(str::to_string)),
            );
            if !lines.is_empty() {
                let i = rng.random_range(0..lines.len());
                match rng.random_range(0..6) {
                    0 => {
                        lines.remove(i);
                    }
                    1 => lines.insert(i, lines[i].clone()),
                    2 => {
                        let mut parts: Vec<&str> = lines[i].split(' ').collect();
                        parts[3] = if parts[3] == "q" { "r" } else { "q" };
                        lines[i] = parts.join(" ");
                    }
                    3 => {
                        let line = lines.remove(i);
                        let j = rng.random_range(0..=lines.len());
                        lines.insert(j, line);
                    }
                    _ => {}
                }
            }
            if case % 10 == 0 {
                // An empty but consistent output: the dataset's own errors come through.
                lines.clear();
            }
            let mut files: Vec<(u64, RecordBatch)> = split(&mut rng, &lines, 4)
                .iter()
                .enumerate()
                .map(|(i, t)| (i as u64, log(t)))
                .collect();
            if files.is_empty() {
                files.push((0, log("")));
            }
            let out = output(&files);
            let expected = format!("{:?}", in_memory::verify(&ds, out.path()));
            for budget in [1, 4 << 10, 1 << 20] {
                let options = ExternalSortOptions::new(scratch.path()).with_memory_budget(budget);
                let found = format!("{:?}", verify_with(&ds, out.path(), &options));
                assert_eq!(found, expected, "case {case}, budget {budget}");
            }
            let kind = if expected.starts_with("Ok") {
                "ok"
            } else if expected.contains("does not match") {
                "differs"
            } else if expected.contains("epoch-") {
                "bad output"
            } else {
                "bad dataset"
            };
            *outcomes.entry(kind.into()).or_default() += 1;
        }
        assert!(
            outcomes.values().all(|&n| n > 5) && outcomes.len() == 4,
            "{outcomes:?}"
        );
        let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().collect();
        assert!(left.is_empty(), "scratch space is cleaned up: {left:?}");
    }

    /// The verifier with both tables in memory: the reference.
    mod in_memory {
        use std::path::Path;

        use crate::error::{Error, Result};
        use crate::job::output::output_files;
        use crate::replay::changelog::{ChangelogReader, ChangelogRows};
        use crate::replay::dataset::{CHANGES_DIR, Dataset};
        use crate::replay::model::KeyedTable;
        use crate::replay::verify::{BATCH_SIZE, VerifyReport};
        use crate::vnode::VnodeCount;

        pub(super) fn verify(dataset: &Dataset, out_dir: &Path) -> Result<VerifyReport> {
            let desc = dataset.table_desc(VnodeCount::DEFAULT)?;
            let files: Vec<_> = output_files(out_dir)?.into_iter().map(|f| f.1).collect();
            let output_files = files.len();
            let mut output = KeyedTable::<Box<[u8]>>::new(dataset.schema(), desc.pk().clone())?;
            let mut output_rows = 0u64;
            for rows in ChangelogReader::new(files, dataset.schema().clone(), BATCH_SIZE) {
                let rows = rows?;
                apply_changes(&mut output, &rows)?;
                output_rows += rows.ops.len() as u64;
            }
            let mut expected = KeyedTable::<Box<[u8]>>::new(dataset.schema(), desc.pk().clone())?;
            for path in dataset.snapshot_files() {
                let mut first_row = 0u64;
                for batch in dataset.snapshot_file_reader(path, BATCH_SIZE)? {
                    let batch = batch?;
                    expected.load(&batch, |i, message| {
                        Error::dataset(path, format!("row {}", first_row + i as u64), message)
                    })?;
                    first_row += batch.num_rows() as u64;
                }
            }
            for rows in dataset.changelog(BATCH_SIZE) {
                apply_changes(&mut expected, &rows?)?;
            }
            compare(&expected, &output, &out_dir.join(CHANGES_DIR))?;
            Ok(VerifyReport {
                output_files,
                output_rows,
                final_rows: output.len() as u64,
                shards: None,
            })
        }

        fn apply_changes(table: &mut KeyedTable<Box<[u8]>>, rows: &ChangelogRows) -> Result<()> {
            table.apply(&rows.data, &rows.ops, |i, message| {
                rows.location(i).error(message)
            })
        }

        fn compare(
            expected: &KeyedTable<Box<[u8]>>,
            found: &KeyedTable<Box<[u8]>>,
            out: &Path,
        ) -> Result<()> {
            let missing_or_changed = expected
                .rows()
                .iter()
                .filter(|(k, v)| found.rows().get(*k) != Some(*v))
                .map(|(k, _)| k);
            let extra = found
                .rows()
                .keys()
                .filter(|k| !expected.rows().contains_key(*k));
            let differing: Vec<&Box<[u8]>> = missing_or_changed.chain(extra).collect();
            let Some(first) = differing.iter().min() else {
                return Ok(());
            };
            let show = |table: &KeyedTable<Box<[u8]>>| match table.rows().get(*first) {
                Some(row) => table.describe_value(row),
                None => "no row".into(),
            };
            let others = match differing.len() - 1 {
                0 => String::new(),
                n => format!(" (and {n} other keys)"),
            };
            Err(Error::dataset(
                out,
                "",
                format!(
                    "the replay output does not match snapshot + changes: key {} expected {} found {}{others}",
                    expected.describe_key(first),
                    show(expected),
                    show(found),
                ),
            ))
        }
    }
}
