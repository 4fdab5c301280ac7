//! The durable store end to end, through its public handles: dictionary columns written,
//! committed, compacted and reopened.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::*;
use crate::chunk::StreamChunk;
use crate::error::Result;
use crate::key::KeyColumn;
use crate::store::io::RealIo;
use crate::store::{SnapshotScan, StateStore, StateTable};
use crate::table::TableDesc;
use crate::vnode::VnodeCount;
use crate::vnode::{VirtualNode, VnodeBitmap};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::{DataType, Field, Schema};

/// `a|b|...` of each row of a batch: column `a` (Int64), then every other column as
/// strings (any layout: dictionaries as their values).
fn rows_of(batch: &RecordBatch) -> Vec<String> {
    let a = batch.column(0).as_primitive::<Int64Type>();
    let rest: Vec<ArrayRef> = (1..batch.num_columns())
        .map(|i| arrow_cast::cast(batch.column(i), &DataType::Utf8).unwrap())
        .collect();
    (0..batch.num_rows())
        .map(|i| {
            let mut row = a.value(i).to_string();
            for c in &rest {
                row.push('|');
                row.push_str(c.as_string::<i32>().value(i));
            }
            row
        })
        .collect()
}

/// A table `t` of a key `(a, b)` distributed by `a`, `b` a dictionary of `key_type`
/// keys, a value column `d` of the same type, and `v`.
fn dictionary_table(key_type: &DataType) -> (Arc<Schema>, TableDesc) {
    let dictionary = DataType::Dictionary(Box::new(key_type.clone()), Box::new(DataType::Utf8));
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", dictionary.clone(), false),
        Field::new("d", dictionary, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let key = vec![KeyColumn::asc("a"), KeyColumn::asc("b")];
    let desc = TableDesc::with_distribution("t", schema.clone(), key, &["a"])
        .unwrap()
        .with_vnode_count(VnodeCount::new(4).unwrap());
    (schema, desc)
}

/// Batch `part` of [`dictionary_table`]: 6000 rows, 60 values of `a`, each with
/// `distinct` values of `b` (out of `labels`, a window moving by `stride` a part) and of
/// `d` (some null); each batch's dictionaries in their own order.
fn dictionary_batch(
    schema: &Arc<Schema>,
    part: i64,
    distinct: i64,
    (labels, stride): (i64, i64),
) -> RecordBatch {
    let dictionary = schema.field(1).data_type();
    let label = |i: i64| format!("{:04}-a label long enough", (i + part * stride) % labels);
    let b = StringArray::from_iter_values((0..6000).map(|i| label(i % distinct)));
    let d = StringArray::from_iter(
        (0..6000).map(|i| (i % 13 != 0).then(|| label((i * 7 + 3) % distinct))),
    );
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (0..6000).map(|i| part * 60 + i / distinct),
            )),
            arrow_cast::cast(&b, dictionary).unwrap(),
            arrow_cast::cast(&d, dictionary).unwrap(),
            Arc::new(Int64Array::from_iter_values(
                (0..6000).map(|i| part * 10_000 + i),
            )),
        ],
    )
    .unwrap()
}

/// Options with a 64 KiB memory budget (layers spill early).
fn small_options(compaction: Compaction, max_deltas: usize, merge_deltas: usize) -> DurableOptions {
    DurableOptions {
        memory_budget: 64 << 10,
        compaction,
        max_deltas,
        merge_deltas,
        ..DurableOptions::default()
    }
}

/// The store in `dir` with table `desc` created, and a handle of all its vnodes.
fn open_table(
    dir: &std::path::Path,
    options: &DurableOptions,
    desc: TableDesc,
) -> (DurableStore, DurableTable) {
    let store = DurableStore::open_with(dir, RealIo::shared(), options.clone()).unwrap();
    let desc = store.create_table(desc).unwrap();
    let table = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    (store, table)
}

/// Writes `parts` batches of [`dictionary_table`] with `key_type` keys, one commit each,
/// compacts, reopens and checks every row reads back, in key order.
fn dictionary_round_trip(key_type: &DataType, parts: i64) {
    let dir = tempfile::tempdir().unwrap();
    let (schema, desc) = dictionary_table(key_type);
    let mut expected: Vec<String> = (0..parts)
        .flat_map(|part| rows_of(&dictionary_batch(&schema, part, 100, (100, 7))))
        .collect();
    expected.sort();
    let options = small_options(Compaction::Inline, 6, 3);
    {
        let (store, mut table) = open_table(dir.path(), &options, desc);
        for part in 0..parts {
            let batch = dictionary_batch(&schema, part, 100, (100, 7));
            table.write(&StreamChunk::inserts(batch)).unwrap();
            table.seal(part as u64 + 1).unwrap();
            store.commit(part as u64 + 1).unwrap();
        }
        store.compact().unwrap();
    }
    let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
    let table = store
        .table("t", VnodeBitmap::full(VnodeCount::new(4).unwrap()))
        .unwrap();
    let mut rows = Vec::new();
    for vnode in table.vnodes().iter() {
        let mut scan = table.scan(vnode, None, parts as u64, 1000).unwrap();
        let mut last: Option<Vec<u8>> = None;
        while let Some(keyed) = scan.next_batch().unwrap() {
            let batch = &keyed.batch;
            assert_eq!(batch.schema(), schema);
            for i in 0..batch.num_rows() {
                let key = keyed.keys.value(i).to_vec();
                assert!(last.as_ref().is_none_or(|l| *l < key), "key order");
                last = Some(key);
            }
            rows.extend(rows_of(batch));
        }
    }
    rows.sort();
    assert_eq!(rows, expected);
}

/// Issue 41 item 7: a dictionary key column outside the distribution key (each batch's
/// dictionary in another order) is stored, committed in files whose index
/// holds its values, and reads back the same after a reopen and compaction, in key order.
#[test]
fn a_dictionary_key_column_commits_and_reads_back_after_a_reopen() {
    dictionary_round_trip(&DataType::Int32, 6);
}

/// Dictionaries of narrow keys whose distinct values do not fit (each part's 100 fit,
/// every part has others): a compaction's merge across parts is refused naming the
/// column, as bad input (inline: by the commit; in the background: by the next call),
/// installing nothing; the store reopens at its committed epoch, never as corrupt.
#[test]
fn narrow_dictionary_keys_beyond_their_type_are_refused_naming_the_column() {
    for compaction in [Compaction::Inline, Compaction::Background] {
        let dir = tempfile::tempdir().unwrap();
        let (schema, desc) = dictionary_table(&DataType::Int8);
        let options = DurableOptions {
            memory_budget: 64 << 10,
            compaction,
            max_deltas: 4,
            merge_deltas: 2,
            ..DurableOptions::default()
        };
        let mut committed = 0;
        let error = {
            let store =
                DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
            let desc = store.create_table(desc).unwrap();
            let mut table = store
                .table("t", VnodeBitmap::full(desc.vnode_count()))
                .unwrap();
            let mut step = |epoch: u64| -> Result<()> {
                if epoch <= 12 {
                    let batch = dictionary_batch(&schema, epoch as i64, 100, (10_000, 100));
                    table.write(&StreamChunk::inserts(batch))?;
                }
                table.seal(epoch)?;
                store.commit(epoch)
            };
            // The background thread fails some time after a commit: empty epochs until
            // a call reports it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                match step(committed + 1) {
                    Ok(()) => committed += 1,
                    Err(e) => break e,
                }
                assert!(std::time::Instant::now() < deadline, "no error");
                if committed > 12 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        };
        assert!(error.is_bad_input(), "{compaction:?}: {error}");
        let text = error.to_string();
        assert!(
            (text.starts_with("column `b`: ") || text.starts_with("column `d`: "))
                && text.contains("Int8"),
            "{compaction:?}: {text}"
        );
        // The store reopens (nothing corrupt) with every commit that succeeded, or one
        // more (an inline compaction fails after its commit's record is durable).
        let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
        let reopened = store.committed_epoch().unwrap().unwrap();
        assert!(
            reopened == committed || reopened == committed + 1,
            "{compaction:?}: {reopened} after {committed}"
        );
    }
}

/// Dictionaries of narrow keys (100 distinct values, which fit): the store's
/// concatenations and merges of many runs, inline and at the final compaction, keep
/// one dictionary of the distinct values instead of overflowing the key type.
#[test]
fn narrow_dictionary_keys_survive_compaction_of_many_runs() {
    for key_type in [DataType::Int8, DataType::UInt8, DataType::Int16] {
        dictionary_round_trip(&key_type, 16);
    }
}

/// A load in steps (`StateTable::commit_load_step`) of rows in key order grows each vnode's
/// base, across reopens, and leaves nothing to compact; rows out of order become deltas.
#[test]
fn load_steps_in_key_order_grow_the_base() {
    let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
    let desc = TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("a")])
        .unwrap()
        .with_vnode_count(VnodeCount::new(4).unwrap());
    let options = DurableOptions {
        compaction: Compaction::Manual,
        ..DurableOptions::default()
    };
    let chunk = |keys: Vec<i64>| {
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(keys))]).unwrap();
        StreamChunk::inserts(batch)
    };
    let runs = |store: &DurableStore| -> Vec<(usize, usize)> {
        let state = store.read().unwrap();
        let table = state.table("t").unwrap();
        table
            .vnodes
            .iter()
            .map(|v| (v.base.len(), v.deltas.len()))
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let store = DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
    store.create_table(desc.clone()).unwrap();
    let mut handle = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    for step in 0..3 {
        handle
            .write(&chunk((step * 1000..(step + 1) * 1000).collect()))
            .unwrap();
        handle.commit_load_step().unwrap();
    }
    assert_eq!(store.committed_epoch().unwrap(), None);
    assert_eq!(
        runs(&store),
        vec![(3, 0); 4],
        "each step's runs extend the base"
    );
    drop(handle);
    drop(store);
    let store = DurableStore::open_with(dir.path(), RealIo::shared(), options.clone()).unwrap();
    assert_eq!(runs(&store), vec![(3, 0); 4], "reopened");
    // Keys below the base's last: deltas, merged by reads and compaction.
    let mut handle = store
        .table("t", VnodeBitmap::full(desc.vnode_count()))
        .unwrap();
    handle.write(&chunk((3000..3500).rev().collect())).unwrap();
    handle.write(&chunk((-500..0).collect())).unwrap();
    handle.commit_load_step().unwrap();
    assert!(
        runs(&store)
            .iter()
            .all(|&(base, deltas)| base == 3 && deltas == 1)
    );
    handle.seal(1).unwrap();
    store.commit(1).unwrap();
    let count = |store: &DurableStore| -> usize {
        let handle = store
            .table("t", VnodeBitmap::full(desc.vnode_count()))
            .unwrap();
        (0..4)
            .map(|v| {
                let mut scan = handle.scan(VirtualNode::new(v), None, 1, 4096).unwrap();
                let mut n = 0;
                while let Some(b) = scan.next_batch().unwrap() {
                    n += b.batch.num_rows();
                }
                n
            })
            .sum()
    };
    assert_eq!(count(&store), 4000);
    store.compact().unwrap();
    assert_eq!(runs(&store), vec![(1, 0); 4]);
    assert_eq!(count(&store), 4000);
}

/// Every row of table `t` of `store`, read at `epoch`, as [`rows_of`] strings, sorted.
fn all_rows(store: &DurableStore, epoch: u64) -> Vec<String> {
    let table = store
        .table("t", VnodeBitmap::full(VnodeCount::new(4).unwrap()))
        .unwrap();
    let mut rows = Vec::new();
    for vnode in table.vnodes().iter() {
        let mut scan = table.scan(vnode, None, epoch, 1000).unwrap();
        while let Some(keyed) = scan.next_batch().unwrap() {
            rows.extend(rows_of(&keyed.batch));
        }
    }
    rows.sort();
    rows
}

/// Issue 45 item 3: an image taken at epoch 3 keeps its files on disk while compaction and
/// later commits replace them; copied into an empty directory by `restore`, it opens at
/// epoch 3 with exactly epoch 3's rows and values. An interrupted restore is refused by
/// `open`, naming its marker, and a second restore finishes it; a store is never restored
/// over.
#[test]
fn an_image_restores_its_committed_state_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let (schema, desc) = dictionary_table(&DataType::Int32);
    let options = small_options(Compaction::Manual, 2, 2);
    let (store, mut table) = open_table(dir.path(), &options, desc);
    let mut step = |epoch: u64| {
        let batch = dictionary_batch(&schema, epoch as i64, 100, (100, 7));
        table.write(&StreamChunk::inserts(batch)).unwrap();
        table.seal(epoch).unwrap();
        store.stage_meta("job.at", &epoch.to_string()).unwrap();
        store.commit(epoch).unwrap();
    };
    for epoch in 1..=3 {
        step(epoch);
    }
    let expected = all_rows(&store, 3);
    let image = store.image().unwrap();
    assert_eq!(image.committed_epoch(), Some(3));
    assert_eq!(image.meta().get("job.at").map(String::as_str), Some("3"));
    // Later commits and a compaction replace every file the image names.
    for epoch in 4..=5 {
        step(epoch);
    }
    store.compact().unwrap();
    for file in image.files() {
        let size = std::fs::metadata(&file.path).unwrap().len();
        assert_eq!(size, file.size, "{} pinned", file.name);
    }

    // `file.path` is where the restore puts it; the image's copy is found by name.
    let source = dir.path().to_path_buf();
    let copy = |file: &ImageFile, to: &std::path::Path| -> Result<()> {
        std::fs::copy(source.join(&file.name), to)
            .map(|_| ())
            .map_err(Into::into)
    };
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("state");
    let what = std::path::Path::new("memory://bucket/manifest");
    // Interrupted after its first file: refused by open, then restored again.
    let mut fetched = 0;
    let error = restore(
        &RealIo,
        &target,
        image.manifest(),
        what,
        false,
        |file, to| {
            fetched += 1;
            if fetched == 2 {
                return Err(crate::error::Error::Internal("connection lost".into()));
            }
            copy(file, to)
        },
    )
    .unwrap_err();
    assert!(error.to_string().contains("connection lost"), "{error}");
    let refused = DurableStore::open_with(&target, RealIo::shared(), options.clone()).unwrap_err();
    assert!(refused.to_string().contains(RESTORING_FILE), "{refused}");
    restore(&RealIo, &target, image.manifest(), what, false, copy).unwrap();
    let restored = DurableStore::open_with(&target, RealIo::shared(), options.clone()).unwrap();
    assert_eq!(restored.committed_epoch().unwrap(), Some(3));
    assert_eq!(restored.meta("job.at").unwrap().as_deref(), Some("3"));
    assert_eq!(all_rows(&restored, 3), expected);
    drop(restored);
    // A store is never restored over; a file of the wrong size is refused.
    let again = restore(&RealIo, &target, image.manifest(), what, false, copy).unwrap_err();
    assert!(again.to_string().contains("holds a store"), "{again}");
    // Asked to replace it, the restore removes only the store's own files.
    std::fs::write(target.join("notes.txt"), b"not the store's").unwrap();
    restore(&RealIo, &target, image.manifest(), what, true, copy).unwrap();
    assert_eq!(
        std::fs::read(target.join("notes.txt")).unwrap(),
        b"not the store's"
    );
    let replaced = DurableStore::open_with(&target, RealIo::shared(), options.clone()).unwrap();
    assert_eq!(all_rows(&replaced, 3), expected);
    drop(replaced);
    let short = elsewhere.path().join("short");
    let error = restore(&RealIo, &short, image.manifest(), what, false, |_, to| {
        std::fs::write(to, b"short").map_err(Into::into)
    })
    .unwrap_err();
    assert!(error.to_string().contains("restored 5 bytes"), "{error}");
    // The image's files go once it is dropped (they were replaced).
    let paths: Vec<_> = image.files().iter().map(|f| f.path.clone()).collect();
    drop(image);
    assert!(paths.iter().any(|p| !p.exists()), "replaced files removed");
    drop(store);
}

/// Issue 43: run files written with each body compression read back the same rows, in a
/// store reopened with another setting (its older files stay as written, its new ones take
/// the new setting), after compaction; compressed files are smaller.
#[test]
fn compressed_run_files_read_back_whatever_the_setting() {
    let (schema, desc) = dictionary_table(&DataType::Int64);
    let parts = 6;
    let mut expected: Vec<String> = (0..parts)
        .flat_map(|part| rows_of(&dictionary_batch(&schema, part, 300, (300, 7))))
        .collect();
    expected.sort();
    let mut sizes = Vec::new();
    for (first, then) in [
        (StateCompression::None, StateCompression::Lz4),
        (StateCompression::Lz4, StateCompression::Zstd),
        (StateCompression::Zstd, StateCompression::None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut options = small_options(Compaction::Manual, 6, 3);
        options.compression = first;
        {
            let (store, mut table) = open_table(dir.path(), &options, desc.clone());
            for part in 0..parts / 2 {
                let batch = dictionary_batch(&schema, part, 300, (300, 7));
                table.write(&StreamChunk::inserts(batch)).unwrap();
                table.seal(part as u64 + 1).unwrap();
                store.commit(part as u64 + 1).unwrap();
            }
        }
        let bytes: u64 = (std::fs::read_dir(dir.path()).unwrap())
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("run-"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        sizes.push((first, bytes));
        options.compression = then;
        let store = DurableStore::open_with(dir.path(), RealIo::shared(), options).unwrap();
        {
            let mut table = store
                .table("t", VnodeBitmap::full(VnodeCount::new(4).unwrap()))
                .unwrap();
            for part in parts / 2..parts {
                let batch = dictionary_batch(&schema, part, 300, (300, 7));
                table.write(&StreamChunk::inserts(batch)).unwrap();
                table.seal(part as u64 + 1).unwrap();
                store.commit(part as u64 + 1).unwrap();
            }
        }
        assert_eq!(
            all_rows(&store, parts as u64),
            expected,
            "{first:?} then {then:?}"
        );
        store.compact().unwrap();
        assert_eq!(
            all_rows(&store, parts as u64),
            expected,
            "compacted, {then:?}"
        );
    }
    let none = sizes[0].1;
    for (compression, bytes) in &sizes[1..] {
        assert!(
            *bytes < none,
            "{compression:?}: {bytes} bytes, uncompressed {none}"
        );
    }
}
