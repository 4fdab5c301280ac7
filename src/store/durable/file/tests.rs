//! Round trips through the writer and the reader: runs, blocks and packed batches read back
//! as written, every damaged byte is detected, columns come back as the table holds them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Decimal128Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::*;
use crate::chunk::StreamChunk;
use crate::error::Result;
use crate::key::KeyColumn;
use crate::runs::{Rows, Run, RunList};
use crate::store::KeyedBatch;
use crate::store::io::{RealIo, StorageIo};
use crate::table::TableDesc;
use crate::vnode::{VirtualNode, VnodeCount};

fn desc() -> Arc<TableDesc> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    Arc::new(
        TableDesc::new("t", schema, vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(4).unwrap()),
    )
}

fn run(desc: &TableDesc, keys: std::ops::Range<i64>, deleted: bool) -> Run {
    let batch = RecordBatch::try_new(
        desc.schema().clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(keys.clone())),
            Arc::new(StringArray::from_iter_values(keys.map(|k| format!("v{k}")))),
        ],
    )
    .unwrap();
    let n = batch.num_rows();
    let keys = desc.pk().encode(&batch).unwrap();
    let deleted = deleted.then(|| arrow_buffer::BooleanBuffer::collect_bool(n, |i| i % 3 == 0));
    Run::new(KeyedBatch { batch, keys }, deleted).unwrap()
}

fn write_file(dir: &Path) -> (Arc<RunFile>, FileCheck, Vec<RunSpan>) {
    let desc = desc();
    let mut w =
        RunFileWriter::create(RealIo::shared(), dir.join("f.arrow"), 7, desc.clone()).unwrap();
    w.write_run(VirtualNode::new(1), &run(&desc, 0..20_000, false))
        .unwrap();
    w.write_run(VirtualNode::new(3), &run(&desc, 5..10, true))
        .unwrap();
    w.finish().unwrap()
}

#[test]
fn a_written_file_reopens_with_the_same_runs_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (file, check, spans) = write_file(dir.path());
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].rows, 20_000);
    assert!(
        spans[0].count >= 3,
        "cut into blocks of about {BLOCK_BYTES} bytes"
    );
    assert_eq!(
        (spans[1].vnode, spans[1].first, spans[1].rows),
        (VirtualNode::new(3), spans[0].count, 5)
    );
    let reopened = RunFile::open(
        RealIo::shared(),
        dir.path().join("f.arrow"),
        7,
        desc(),
        check,
    )
    .unwrap();
    assert_eq!(reopened.spans(), spans);
    assert_eq!(reopened.last_keys, file.last_keys);
    let last = DiskRun {
        file: Arc::new(reopened),
        span: spans[1],
    }
    .load(0)
    .unwrap();
    assert_eq!(last.len(), 5);
    let deleted: Vec<bool> = last.deleted().unwrap().iter().collect();
    assert_eq!(deleted, [true, false, false, true, false]);
    // pyarrow-compatible: the standard reader reads it too.
    let reader = arrow_ipc::reader::FileReader::try_new(
        std::fs::File::open(dir.path().join("f.arrow")).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 20_005);
    let _ = StreamChunk::inserts; // keep the import used in every configuration
}

#[test]
fn every_flipped_byte_and_truncation_is_detected_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_, check, _) = write_file(dir.path());
    let path = dir.path().join("f.arrow");
    let original = std::fs::read(&path).unwrap();
    let step = (original.len() / 97).max(1);
    for at in (0..original.len()).step_by(step) {
        let mut bytes = original.clone();
        bytes[at] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let result = RunFile::open(RealIo::shared(), path.clone(), 7, desc(), check)
            .and_then(|f| (0..f.blocks.len()).try_for_each(|i| f.read_block(i).map(|_| ())));
        let err = result.expect_err(&format!("flipped byte {at} not detected"));
        assert!(err.to_string().contains("f.arrow"), "{err}");
    }
    std::fs::write(&path, &original[..original.len() - 3]).unwrap();
    let err = RunFile::open(RealIo::shared(), path.clone(), 7, desc(), check).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

/// A one-vnode table of `schema`, keyed by its column `k`.
fn one_vnode_keyed_by_k(schema: &SchemaRef) -> Arc<TableDesc> {
    Arc::new(
        TableDesc::new("t", schema.clone(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(1).unwrap()),
    )
}

/// `batch` with its encoded keys.
fn keyed(desc: &TableDesc, batch: &RecordBatch) -> KeyedBatch {
    let keys = desc.pk().encode(batch).unwrap();
    KeyedBatch {
        batch: batch.clone(),
        keys,
    }
}

/// `batch` written as one run of vnode 0 and read back, block by block, as one batch; in
/// both formats, which must read back alike.
fn round_trip(desc: &Arc<TableDesc>, batch: &RecordBatch) -> RecordBatch {
    let read = round_trip_as(desc, batch, RunFileWriter::create);
    let read_v1 = round_trip_as(desc, batch, RunFileWriter::create_v1);
    assert_eq!(read, read_v1, "format 1 reads back alike");
    read
}

type Create = fn(Arc<dyn StorageIo>, PathBuf, u64, Arc<TableDesc>) -> Result<RunFileWriter>;

/// `batch` written by `create` as one run of vnode 0, reopened as the manifest would,
/// and read back, block by block, as one batch.
fn round_trip_as(desc: &Arc<TableDesc>, batch: &RecordBatch, create: Create) -> RecordBatch {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.arrow");
    let mut w = create(RealIo::shared(), path.clone(), 1, desc.clone()).unwrap();
    w.begin_run(VirtualNode::ZERO).unwrap();
    w.write(&keyed(desc, batch), None).unwrap();
    let (_, check, _) = w.finish().unwrap();
    let file = RunFile::open(RealIo::shared(), path, 1, desc.clone(), check).unwrap();
    let read: Vec<RecordBatch> = (0..file.blocks.len())
        .map(|i| file.read_block(i).unwrap().batch())
        .collect();
    arrow_select::concat::concat_batches(desc.schema(), &read).unwrap()
}

/// A table of every type a run file stores narrower than the table holds it, and rows
/// of it: inline and out-of-line strings and binaries, nulls, short and long decimals
/// (negative too), a dictionary of string views.
fn narrowed_columns(n: i64) -> (Arc<TableDesc>, RecordBatch) {
    let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View));
    // Decimals in a dictionary are stored as the dictionary's values are: not narrowed.
    let tiers = DataType::Dictionary(
        Box::new(DataType::Int8),
        Box::new(DataType::Decimal128(10, 2)),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8View, true),
        Field::new("b", DataType::BinaryView, true),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("wide", DataType::Decimal128(30, 2), true),
        Field::new("mode", dictionary.clone(), true),
        Field::new("tier", tiers.clone(), true),
    ]));
    let text = |k: i64| match k % 3 {
        0 => None,
        1 => Some(format!("s{k}")),
        _ => Some(format!("grüße, out of line {k}")),
    };
    let decimal = |k: i64| (k % 7 != 0).then_some(i128::from(k) * 99_999_999 - 10i128.pow(14));
    let modes = arrow_array::StringViewArray::from_iter((0..n).map(|k| match k % 4 {
        0 => None,
        1 => Some("AIR"),
        _ => Some("a mode long enough to be out of line"),
    }));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(arrow_array::StringViewArray::from_iter((0..n).map(text))),
            Arc::new(arrow_array::BinaryViewArray::from_iter(
                (0..n).map(|k| text(k).map(String::into_bytes)),
            )),
            Arc::new(
                Decimal128Array::from_iter((0..n).map(decimal))
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            Arc::new(
                Decimal128Array::from_iter((0..n).map(|k| decimal(k).map(|d| d * 10i128.pow(12))))
                    .with_precision_and_scale(30, 2)
                    .unwrap(),
            ),
            arrow_cast::cast(&modes, &dictionary).unwrap(),
            arrow_cast::cast(
                &Decimal128Array::from_iter(
                    (0..n).map(|k| (k % 9 != 0).then_some(i128::from(k % 3))),
                )
                .with_precision_and_scale(10, 2)
                .unwrap(),
                &tiers,
            )
            .unwrap(),
        ],
    )
    .unwrap();
    (one_vnode_keyed_by_k(&schema), batch)
}

#[test]
fn strings_are_stored_as_offsets_and_short_decimals_in_64_bits() {
    let (desc, batch) = narrowed_columns(5000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.arrow");
    let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 1, desc.clone()).unwrap();
    w.begin_run(VirtualNode::ZERO).unwrap();
    w.write(&keyed(&desc, &batch), None).unwrap();
    w.finish().unwrap();
    // What a standard reader (pyarrow's too) sees.
    let reader =
        arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None).unwrap();
    let types: Vec<DataType> = (reader.schema().fields().iter())
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(
        types,
        [
            DataType::Int64,
            DataType::Utf8,
            DataType::Binary,
            DataType::Decimal64(15, 2),
            DataType::Decimal128(30, 2),
            DataType::Utf8,
            DataType::Decimal128(10, 2),
            DataType::Boolean,
        ]
    );
    assert_eq!(round_trip(&desc, &batch), batch);
}

#[test]
fn long_values_are_cut_into_blocks_their_offsets_can_hold() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8View, false),
    ]));
    let desc = one_vnode_keyed_by_k(&schema);
    let rows = |keys: std::ops::Range<i64>| {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(keys.clone())),
                Arc::new(arrow_array::StringViewArray::from_iter_values(
                    keys.map(|k| format!("{k:>1000}")),
                )),
            ],
        )
        .unwrap();
        let keys = desc.pk().encode(&batch).unwrap();
        Run::new(KeyedBatch { batch, keys }, None).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunFileWriter::create(
        RealIo::shared(),
        dir.path().join("l.arrow"),
        1,
        desc.clone(),
    )
    .unwrap();
    // A block may hold 10 000 bytes of values here: 10 rows.
    w.value_bytes_limit = 10_000;
    w.write_run(VirtualNode::ZERO, &rows(0..200)).unwrap();
    // Short runs share a packed batch only up to the limit too.
    for first in (200..400).step_by(5) {
        w.write_run(VirtualNode::new(0), &rows(first..first + 5))
            .unwrap();
    }
    let (file, _, spans) = w.finish().unwrap();
    let mut keys = Vec::new();
    for span in &spans {
        keys.extend(read_span(&file, span).0);
    }
    assert_eq!(keys, (0..400).collect::<Vec<_>>());
    for block in &file.blocks {
        assert!(
            block.batch_rows <= 10,
            "{} rows of 1000 bytes",
            block.batch_rows
        );
    }
}

#[test]
fn slices_of_view_columns_write_only_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8View, false),
    ]));
    let desc = one_vnode_keyed_by_k(&schema);
    let n = 50_000i64;
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(arrow_array::StringViewArray::from_iter_values((0..n).map(
                |k| format!("a string long enough to be out of line {k:>10}"),
            ))),
        ],
    )
    .unwrap();
    let mut w = RunFileWriter::create(
        RealIo::shared(),
        dir.path().join("v.arrow"),
        1,
        desc.clone(),
    )
    .unwrap();
    w.begin_run(VirtualNode::ZERO).unwrap();
    w.write(&keyed(&desc, &batch), None).unwrap();
    let (_, check, _) = w.finish().unwrap();
    let raw = n as u64 * (8 + 16 + 50);
    assert!(
        check.size < raw * 2,
        "{} bytes on disk for {raw} bytes of rows: every block wrote all string data",
        check.size
    );
}

#[test]
fn string_views_read_back_equal_ascii_or_not() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8View, true),
    ]));
    let desc = one_vnode_keyed_by_k(&schema);
    fn ascii(k: i64) -> Option<String> {
        match k % 4 {
            0 => None,
            1 => Some(format!("s{k}")),
            _ => Some(format!("an ascii string out of line {k}")),
        }
    }
    type Text = fn(i64) -> Option<String>;
    let texts: [(&str, Text); 3] = [
        ("ascii", ascii),
        // Non-ASCII out of line, in one row of a thousand.
        ("one long", |k| match k % 1000 {
            7 => Some(format!("grüße aus köln, zeile {k}")),
            _ => ascii(k),
        }),
        // Non-ASCII inline only: every data buffer is ASCII.
        ("one inline", |k| match k % 1000 {
            7 => Some("é".to_string()),
            _ => ascii(k),
        }),
    ];
    for (name, text) in texts {
        let n = 5000i64;
        let values = arrow_array::StringViewArray::from_iter((0..n).map(text));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(values),
            ],
        )
        .unwrap();
        assert_eq!(round_trip(&desc, &batch), batch, "{name}");
    }
}

#[test]
fn dictionary_string_columns_read_back_equal() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new(
            "v",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View)),
            true,
        ),
    ]));
    let desc = one_vnode_keyed_by_k(&schema);
    let n = 3000i64;
    let values = arrow_array::StringViewArray::from_iter((0..n).map(|k| match k % 5 {
        0 => None,
        1 => Some("é"),
        2 => Some("a mode out of line, and ascii"),
        _ => Some("grüße aus köln, out of line"),
    }));
    let values = arrow_cast::cast(&values, schema.field(1).data_type()).unwrap();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from_iter_values(0..n)), values],
    )
    .unwrap();
    let read = round_trip(&desc, &batch);
    let text = |b: &RecordBatch| {
        let v = arrow_cast::cast(b.column(1), &DataType::Utf8).unwrap();
        v.as_string::<i32>()
            .iter()
            .map(|s| s.map(str::to_string))
            .collect::<Vec<_>>()
    };
    assert_eq!(text(&read), text(&batch));
}

/// Short runs share record batches; each still reads back as its own rows (with its
/// last key in the index), and runs keep their order around a long run.
#[test]
fn short_runs_share_packed_batches() {
    let dir = tempfile::tempdir().unwrap();
    let desc = Arc::new(
        TableDesc::new(
            "t",
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, false),
                Field::new("v", DataType::Utf8, true),
            ])),
            vec![KeyColumn::asc("k")],
        )
        .unwrap()
        .with_vnode_count(VnodeCount::new(1024).unwrap()),
    );
    let path = dir.path().join("p.arrow");
    let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 3, desc.clone()).unwrap();
    let mut want = Vec::new();
    for v in 0..1000u16 {
        let keys = if v == 500 {
            0..5000 // a long run in the middle
        } else {
            i64::from(v) * 10..i64::from(v) * 10 + 1 + i64::from(v % 3)
        };
        let r = run(&desc, keys.clone(), v % 2 == 0);
        w.write_run(VirtualNode::new(v), &r).unwrap();
        want.push((v, keys.collect::<Vec<_>>()));
    }
    let (_, check, spans) = w.finish().unwrap();
    assert_eq!(spans.len(), 1000);
    let file = Arc::new(RunFile::open(RealIo::shared(), path.clone(), 3, desc, check).unwrap());
    for (span, (v, keys)) in spans.iter().zip(&want) {
        assert_eq!(span.vnode, VirtualNode::new(*v));
        file.check_span(span).unwrap();
        let (got, _) = read_span(&file, span);
        assert_eq!(&got, keys, "vnode {v}");
    }
    let batches = arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None)
        .unwrap()
        .count();
    assert!(
        batches < 100,
        "{batches} record batches for 999 short runs and one long"
    );
}

/// The keys (an `Int64` first column) and tombstone flags of a run of `file`, read block
/// by block; each block's last key checked against the index.
fn read_span(file: &Arc<RunFile>, span: &RunSpan) -> (Vec<i64>, Vec<bool>) {
    let run = DiskRun {
        file: file.clone(),
        span: *span,
    };
    let (mut keys, mut dead) = (Vec::new(), Vec::new());
    for i in 0..run.len() {
        let block = run.load(i).unwrap();
        let batch = block.batch();
        let k = batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>();
        keys.extend(k.values().iter().copied());
        dead.extend((0..block.len()).map(|r| block.is_deleted(r)));
        assert!(block.last_key().is_some());
        assert_eq!(run.last_key(i), block.last_key());
    }
    (keys, dead)
}

/// An epoch's runs are consecutive ranges of one batch sorted by vnode: packed, they are
/// written as slices of it (with their tombstones), and a run of other rows in between
/// (or a long one) still lands where it belongs.
#[test]
fn ranges_of_shared_rows_pack_with_their_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let desc = Arc::new(
        TableDesc::new("t", desc().schema().clone(), vec![KeyColumn::asc("k")])
            .unwrap()
            .with_vnode_count(VnodeCount::new(1024).unwrap()),
    );
    let keys_of = |v: u16| -> Vec<i64> {
        let v = i64::from(v);
        if v == 200 {
            (v * 100..v * 100 + 3000).collect() // long: blocks of its own
        } else {
            (v * 100..v * 100 + 1 + v % 3).collect()
        }
    };
    let vnodes: Vec<u16> = (0..300).collect();
    let all: Vec<i64> = vnodes.iter().flat_map(|&v| keys_of(v)).collect();
    let batch = RecordBatch::try_new(
        desc.schema().clone(),
        vec![
            Arc::new(Int64Array::from(all.clone())),
            Arc::new(StringArray::from_iter_values(
                all.iter().map(|k| format!("v{k}")),
            )),
        ],
    )
    .unwrap();
    let keys = desc.pk().encode(&batch).unwrap();
    let dead: Vec<bool> = (0..all.len()).map(|i| i % 7 == 3).collect();
    let rows = Rows::new(
        KeyedBatch { batch, keys },
        Some(arrow_buffer::BooleanBuffer::from(dead.clone())),
    )
    .unwrap();
    let path = dir.path().join("r.arrow");
    let mut w = RunFileWriter::create(RealIo::shared(), path.clone(), 4, desc.clone()).unwrap();
    let mut want: Vec<(u16, Vec<i64>, Vec<bool>)> = Vec::new();
    let mut at = 0;
    for &v in &vnodes {
        let n = keys_of(v).len();
        if v == 150 {
            // Other rows between two ranges of the shared ones.
            let other = run(&desc, 15_000..15_002, true);
            w.write_run(VirtualNode::new(v), &other).unwrap();
            want.push((v, vec![15_000, 15_001], vec![true, false]));
        } else {
            w.write_run(VirtualNode::new(v), &Run::range(&rows, at, n).unwrap())
                .unwrap();
            want.push((v, all[at..at + n].to_vec(), dead[at..at + n].to_vec()));
        }
        at += n;
    }
    let (_, check, spans) = w.finish().unwrap();
    assert_eq!(spans.len(), vnodes.len());
    let file = Arc::new(RunFile::open(RealIo::shared(), path.clone(), 4, desc, check).unwrap());
    for (span, (v, keys, dead)) in spans.iter().zip(&want) {
        assert_eq!(span.vnode, VirtualNode::new(*v));
        file.check_span(span).unwrap();
        let (got, got_dead) = read_span(&file, span);
        assert_eq!(&got, keys, "vnode {v}");
        assert_eq!(&got_dead, dead, "vnode {v}");
    }
}

#[test]
fn hex_round_trips() {
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
    assert!(hex_decode("abc").is_none());
    assert!(hex_decode("zz").is_none());
}
