//! Tests of the generators: determinism, validity, shapes, skew, errors.

use super::*;
use crate::error::EngineError;
use crate::replay::Dataset;

fn round_trip(
    kind: GenKind,
    scale: f64,
    epochs: u64,
) -> (Dataset, DatasetSummary, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let opts = GenOptions {
        epochs,
        seed: 7,
        ..GenOptions::new(&kind, scale)
    };
    let summary = generate(&kind, &out, &opts).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.validate().unwrap(), summary, "{kind:?}");
    assert_eq!(summary.change_rows, opts.changes);
    assert_eq!(summary.first_epoch, Some(1));
    assert!(summary.epochs <= epochs && summary.epochs > epochs / 2);
    let snapshot: usize = ds
        .read_snapshot(1000)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(snapshot as u64, summary.snapshot_rows);
    let mut changed = 0;
    for chunk in ds.read_changes(100).unwrap() {
        changed += chunk.unwrap().chunk.num_rows();
    }
    assert_eq!(changed as u64, summary.change_rows);
    (ds, summary, dir)
}

/// The number of changes of each op.
fn op_counts(ds: &Dataset) -> [usize; 4] {
    let mut counts = [0; 4];
    for chunk in ds.read_changes(1000).unwrap() {
        for op in chunk.unwrap().chunk.ops() {
            counts[op.code() as usize - 1] += 1;
        }
    }
    counts
}

#[test]
fn synthetic_int64_round_trip() {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    let (ds, summary, _dir) = round_trip(kind, 0.05, 10);
    assert_eq!(summary.snapshot_rows, 5000);
    assert_eq!(summary.change_rows, 1000);
    let [ins, del, ud, ui] = op_counts(&ds);
    assert!(
        ins > 100 && del > 100 && ud > 100 && ud == ui,
        "{ins} {del} {ud} {ui}"
    );
}

#[test]
fn synthetic_composite_skewed_round_trip() {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Composite,
        skew: true,
    };
    let (ds, _, _dir) = round_trip(kind, 0.05, 5);
    let desc = ds.table_desc(VnodeCount::DEFAULT).unwrap();
    assert_eq!(desc.pk().columns()[1], crate::key::KeyColumn::desc("i"));
    assert_eq!(ds.manifest().distribution_key(), ["s"]);
    let top = top_vnode_share(&ds);
    assert!(top > 0.1, "skewed: the busiest vnode has {top} of the rows");
}

#[test]
fn skewed_int64_crowds_vnodes() {
    let even = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    let skewed = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: true,
    };
    let (ds, _, _d1) = round_trip(even, 0.05, 3);
    let (sk, _, _d2) = round_trip(skewed, 0.05, 3);
    let (even_top, skew_top) = (top_vnode_share(&ds), top_vnode_share(&sk));
    assert!(even_top < 0.02 && skew_top > 0.1, "{even_top} {skew_top}");
}

/// The share of snapshot rows in the busiest vnode (of 256).
fn top_vnode_share(ds: &Dataset) -> f64 {
    let desc = ds.table_desc(VnodeCount::DEFAULT).unwrap();
    let mut counts = vec![0usize; 256];
    let mut total = 0;
    for batch in ds.read_snapshot(4096).unwrap() {
        let batch = batch.unwrap();
        for v in desc.vnodes_of(&batch).unwrap() {
            counts[v.index()] += 1;
        }
        total += batch.num_rows();
    }
    *counts.iter().max().unwrap() as f64 / total as f64
}

#[test]
fn tpch_round_trips() {
    let (ds, summary, _d1) = round_trip(GenKind::TpchOrders, 0.001, 4);
    assert_eq!(summary.snapshot_rows, 1500);
    assert_eq!(ds.name(), "orders");
    let (ds, summary, _d2) = round_trip(GenKind::TpchLineitem, 0.001, 4);
    assert!(summary.snapshot_rows > 5000, "{summary:?}");
    assert_eq!(ds.manifest().distribution_key(), ["l_orderkey"]);
}

#[test]
fn same_seed_same_dataset() {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Composite,
        skew: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions::new(&kind, 0.01);
    generate(&kind, &dir.path().join("a"), &opts).unwrap();
    generate(&kind, &dir.path().join("b"), &opts).unwrap();
    for file in [
        "snapshot/part-00000.parquet",
        "changes/part-00000.parquet",
        "dataset.json",
    ] {
        let a = std::fs::read(dir.path().join("a").join(file)).unwrap();
        let b = std::fs::read(dir.path().join("b").join(file)).unwrap();
        assert!(a == b, "{file} differs");
    }
}

#[test]
fn refuses_a_non_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), "").unwrap();
    let kind = GenKind::TpchOrders;
    let err = generate(&kind, dir.path(), &GenOptions::new(&kind, 0.001)).unwrap_err();
    assert!(
        matches!(err, Error::Engine(EngineError::InvalidConfig(_))),
        "{err}"
    );
}

#[test]
fn options_are_checked_before_anything_is_made() {
    let synthetic = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    let cases: Vec<(GenKind, GenOptions, &str)> = vec![
        (synthetic, GenOptions::new(&synthetic, 1e30), "at most"),
        (synthetic, GenOptions::new(&synthetic, f64::NAN), "positive"),
        (
            synthetic,
            GenOptions::new(&synthetic, f64::INFINITY),
            "positive",
        ),
        (synthetic, GenOptions::new(&synthetic, 0.0), "positive"),
        (
            GenKind::TpchLineitem,
            GenOptions::new(&GenKind::TpchLineitem, 100_000.0),
            "at most",
        ),
        (
            GenKind::TpchLineitem,
            GenOptions::new(&GenKind::TpchLineitem, 1e-6),
            "smallest",
        ),
        (
            GenKind::TpchOrders,
            GenOptions::new(&GenKind::TpchOrders, 1e-5),
            "smallest",
        ),
        (
            synthetic,
            GenOptions {
                changes: u64::MAX,
                ..GenOptions::new(&synthetic, 0.001)
            },
            "changes",
        ),
    ];
    for (kind, opts, needle) in cases {
        let err = generate(&kind, &out, &opts).unwrap_err();
        assert!(
            matches!(err, Error::Engine(EngineError::InvalidConfig(_))),
            "{kind:?} {opts:?}: {err}"
        );
        assert!(err.to_string().contains(needle), "{kind:?} {opts:?}: {err}");
        assert!(err.is_bad_input());
        assert!(!out.exists(), "nothing is written");
    }
    // The smallest TPC-H scale works.
    let (_, summary, _d) = round_trip(GenKind::TpchLineitem, MIN_TPCH_SCALE, 3);
    assert!(summary.snapshot_rows > 0);
    let (_, summary, _d) = round_trip(GenKind::TpchOrders, MIN_TPCH_SCALE, 3);
    assert_eq!(summary.snapshot_rows, 150);
}

/// `_epoch` never decreases, also with epochs at or above 2^63 (issue 8: `done * epochs`
/// overflowed).
#[test]
fn huge_epoch_counts_never_decrease() {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    for epochs in [1u64 << 63, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let opts = GenOptions {
            epochs,
            changes: 300,
            ..GenOptions::new(&kind, 0.001)
        };
        let summary = generate(&kind, &dir.path().join("ds"), &opts).unwrap();
        let ds = Dataset::open(&dir.path().join("ds")).unwrap();
        assert_eq!(ds.validate().unwrap(), summary);
        assert!(summary.last_epoch.unwrap() > 1 << 62, "{summary:?}");
    }
}

#[test]
fn out_must_be_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    let kind = GenKind::TpchOrders;
    let err = generate(&kind, &file, &GenOptions::new(&kind, 0.001)).unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    assert!(err.to_string().contains(file.to_str().unwrap()), "{err}");
}

/// A failed write names its file, and what was written is removed again.
#[test]
fn a_failed_write_names_the_file_and_cleans_up() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
    )
    .unwrap();
    let full = Path::new("/dev/full");
    if full.exists() {
        let err = (|| {
            let mut w = write::PartWriter::create(full.into(), batch.schema(), &|p: &Path| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .map_err(|e| Error::file(p, e))
            })?;
            w.write(&batch)?;
            w.finish()
        })()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/dev/full") && err.contains("No space left"),
            "{err}"
        );
    }
    let failing = |path: &Path| -> Result<File> {
        if path.to_string_lossy().contains(CHANGES_DIR) {
            Err(Error::file(path, std::io::Error::other("disk full")))
        } else {
            write::create_file(path)
        }
    };
    let kind = GenKind::TpchOrders;
    let opts = GenOptions::new(&kind, 0.001);
    let dir = tempfile::tempdir().unwrap();
    // `out` created by the call: removed.
    let out = dir.path().join("new");
    let err = generate_with(&kind, &out, &opts, &Limits::DEFAULT, &failing).unwrap_err();
    assert!(err.to_string().contains("changes"), "{err}");
    assert!(!out.exists());
    // `out` empty before: empty again.
    let out = dir.path().join("empty");
    std::fs::create_dir(&out).unwrap();
    generate_with(&kind, &out, &opts, &Limits::DEFAULT, &failing).unwrap_err();
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

/// The TPC-H shapes make any snapshot row again from its slot: the slots in order give the
/// snapshot's keys, and their rows are the snapshot's.
#[test]
fn tpch_slots_make_the_snapshot_rows_again() {
    let shapes: Vec<Box<dyn Shape>> = vec![
        Box::new(Lineitem::new(0.002).unwrap()),
        Box::new(Orders::new(0.002).unwrap()),
    ];
    for mut shape in shapes {
        let mut snapshot = Vec::new();
        while let Some(batch) = shape.next_snapshot().unwrap() {
            snapshot.push(batch);
        }
        let snapshot = arrow_select::concat::concat_batches(&shape.schema(), &snapshot).unwrap();
        let slots: Vec<u64> = (0..shape.slots()).collect();
        let mut ids = VecDeque::new();
        shape.slot_keys(&slots, &mut ids).unwrap();
        let ids: Vec<u64> = ids.into();
        assert_eq!(ids.len(), snapshot.num_rows());
        let again = shape.originals(&ids).unwrap();
        assert_eq!(again, snapshot, "{}", shape.manifest().name);
        // Key columns of the ids are the snapshot's too.
        for (&c, column) in shape
            .key_indices()
            .iter()
            .zip(shape.key_columns(&ids).unwrap())
        {
            assert_eq!(&column, snapshot.column(c));
        }
        // In any order, and repeated.
        let picked = [ids[ids.len() - 1], ids[0], ids[ids.len() / 2], ids[0]];
        let rows = shape.originals(&picked).unwrap();
        for (i, id) in picked.iter().enumerate() {
            let at = ids.iter().position(|x| x == id).unwrap();
            assert_eq!(rows.slice(i, 1), snapshot.slice(at, 1));
        }
    }
}

/// With a small sample, few hot keys and small chunks, the changelog freezes most keys it
/// changes and is still valid; its counts are the same as with the defaults.
#[test]
fn small_limits_still_make_valid_changelogs() {
    let limits = Limits {
        sample_rows: 100,
        hot_keys: 50,
        chunk_rows: 64,
    };
    for (kind, scale) in [
        (GenKind::TpchLineitem, 0.001),
        (
            GenKind::Synthetic {
                shape: SyntheticShape::Composite,
                skew: true,
            },
            0.05,
        ),
        (
            GenKind::Synthetic {
                shape: SyntheticShape::Int64,
                skew: true,
            },
            0.05,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let opts = GenOptions {
            seed: 3,
            epochs: 7,
            ..GenOptions::new(&kind, scale)
        };
        let summary = generate_with(&kind, &out, &opts, &limits, &write::create_file).unwrap();
        let ds = Dataset::open(&out).unwrap();
        assert_eq!(ds.validate().unwrap(), summary, "{kind:?}");
        assert_eq!(summary.change_rows, opts.changes);
        let [ins, del, ud, ui] = op_counts(&ds);
        assert!(
            ins > 100 && del > 100 && ud > 100 && ud == ui,
            "{ins} {del} {ud} {ui}"
        );
    }
    // The model itself: most changed keys are frozen with 50 hot keys.
    let kind = GenKind::TpchOrders;
    let mut shape = Orders::new(0.01).unwrap();
    let mut sample = write::Sample::new(limits.sample_rows);
    let mut rows = 0;
    while let Some(batch) = shape.next_snapshot().unwrap() {
        rows += batch.num_rows() as u64;
        sample.offer(&batch);
    }
    let sample = sample.finish(&shape.schema()).unwrap();
    let opts = GenOptions::new(&kind, 0.01);
    let mut written = 0;
    let counts = changelog::generate(
        &mut shape,
        &sample,
        rows,
        &opts,
        &limits,
        &mut StdRng::seed_from_u64(1),
        &mut |batch| {
            assert!(batch.num_rows() <= limits.chunk_rows + 1);
            written += batch.num_rows() as u64;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(written, opts.changes);
    assert!(counts.frozen > 1000, "{counts:?}");
}

#[test]
fn same_seed_same_tpch_dataset() {
    let kind = GenKind::TpchLineitem;
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions::new(&kind, 0.001);
    generate(&kind, &dir.path().join("a"), &opts).unwrap();
    generate(&kind, &dir.path().join("b"), &opts).unwrap();
    for file in [
        "snapshot/part-00000.parquet",
        "changes/part-00000.parquet",
        "dataset.json",
    ] {
        let a = std::fs::read(dir.path().join("a").join(file)).unwrap();
        let b = std::fs::read(dir.path().join("b").join(file)).unwrap();
        assert!(a == b, "{file} differs");
    }
}

#[test]
fn zero_changes_and_bad_options() {
    let kind = GenKind::Synthetic {
        shape: SyntheticShape::Int64,
        skew: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = GenOptions {
        changes: 0,
        ..GenOptions::new(&kind, 0.001)
    };
    let summary = generate(&kind, &dir.path().join("a"), &opts).unwrap();
    assert_eq!(
        (summary.snapshot_rows, summary.change_rows, summary.epochs),
        (100, 0, 0)
    );
    Dataset::open(&dir.path().join("a"))
        .unwrap()
        .validate()
        .unwrap();
    let bad = GenOptions {
        epochs: 0,
        ..GenOptions::new(&kind, 0.001)
    };
    assert!(generate(&kind, &dir.path().join("b"), &bad).is_err());
}
