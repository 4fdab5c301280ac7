//! Encoding a changelog file: parquet's `ArrowWriter` (one thread) against our
//! `ColumnParallelWriter` (one rayon task a column), on the same batches, in one run.
//!
//! `sink_encode/1M_lineitem/{arrow_writer,column_parallel}`: 1M rows of a lineitem-shaped
//! changelog (`_epoch`, `_op` and lineitem's 16 columns: integers, decimals, dates, flags,
//! free text; strings as `Utf8View`, as the store hands them out) in batches of 1024, encoded
//! into one in-memory file with the sink's settings (zstd, integers `DELTA_BINARY_PACKED`,
//! dictionaries only for the columns whose values repeat, no min/max statistics for the
//! string columns outside the key), except that zstd compresses every column here: the sink
//! leaves uncompressed the columns its sample shows zstd does not shrink (`job::encoding`),
//! which depends on the data, and this bench is about spreading the same work over cores. `ArrowWriter` gets the batches one at a time, the
//! parallel writer in groups of 16 (the sink takes up to 16K rows off its queue at a time).
//! Both write the same bytes; the ratio is what the cores buy.
//! `column_parallel_string_statistics` is the parallel writer with statistics for every
//! string column too, as the sink wrote them before: the ratio is what leaving them out buys.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

// The sink's column writer is the command-line tool's (in the binary target): its source
// files are compiled into this bench, with the tool's error type they use.
#[path = "../src/bin/backfill/job/column_writer.rs"]
#[allow(dead_code, unused_imports)]
mod column_writer;
#[path = "../src/bin/backfill/error.rs"]
#[allow(dead_code, unused_imports)]
mod error;
#[path = "../src/bin/backfill/job/lanes.rs"]
#[allow(dead_code, unused_imports)]
mod lanes;
mod job {
    pub(crate) use crate::lanes;
}

use arrow_array::{
    ArrayRef, Date32Array, Decimal128Array, Int8Array, Int32Array, Int64Array, RecordBatch,
    StringViewArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use column_writer::ColumnParallelWriter;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The same allocator as the `backfill` binary (BENCHMARKS.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;
const BATCH: usize = 1024;
/// Batches the parallel writer gets at a time (the sink's 16K-row groups).
const GROUP: usize = 16;
const SEED: u64 = 0x5EED_5108_0000_0001;

const INTEGERS: [&str; 5] = [
    "_epoch",
    "l_orderkey",
    "l_partkey",
    "l_suppkey",
    "l_linenumber",
];
const DECIMALS: [&str; 4] = ["l_quantity", "l_extendedprice", "l_discount", "l_tax"];
const DATES: [&str; 3] = ["l_shipdate", "l_commitdate", "l_receiptdate"];
/// Flag-like columns: a few distinct values each.
const FLAGS: [(&str, &[&str]); 4] = [
    ("l_returnflag", &["A", "N", "R"]),
    ("l_linestatus", &["F", "O"]),
    (
        "l_shipinstruct",
        &[
            "DELIVER IN PERSON",
            "COLLECT COD",
            "NONE",
            "TAKE BACK RETURN",
        ],
    ),
    (
        "l_shipmode",
        &["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"],
    ),
];

fn schema() -> SchemaRef {
    let mut fields = vec![Field::new("_op", DataType::Int8, false)];
    for name in INTEGERS {
        let t = match name {
            "_epoch" => DataType::UInt64,
            "l_linenumber" => DataType::Int32,
            _ => DataType::Int64,
        };
        fields.push(Field::new(name, t, false));
    }
    for name in DECIMALS {
        fields.push(Field::new(name, DataType::Decimal128(15, 2), false));
    }
    for name in DATES {
        fields.push(Field::new(name, DataType::Date32, false));
    }
    for (name, _) in FLAGS {
        fields.push(Field::new(name, DataType::Utf8View, false));
    }
    fields.push(Field::new("l_comment", DataType::Utf8View, false));
    Arc::new(Schema::new(fields))
}

/// The sink's settings for this schema: zstd, delta-packed integers, a dictionary for the
/// flags only (the free text is written plain).
/// The sink's settings: `string_statistics` false as the replay writes lineitem (its key has
/// no string column, so no string column keeps min/max statistics), true as before that.
fn props_with(string_statistics: bool) -> WriterProperties {
    let mut builder = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_coerce_types(true)
        .set_column_dictionary_enabled(ColumnPath::from("l_comment"), false);
    for name in ["_op"].into_iter().chain(INTEGERS).chain(DATES) {
        builder = builder
            .set_column_dictionary_enabled(ColumnPath::from(name), false)
            .set_column_encoding(ColumnPath::from(name), Encoding::DELTA_BINARY_PACKED);
    }
    for name in DECIMALS {
        builder = builder.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    if !string_statistics {
        for name in FLAGS.iter().map(|(name, _)| *name).chain(["l_comment"]) {
            builder = builder
                .set_column_statistics_enabled(ColumnPath::from(name), EnabledStatistics::None);
        }
    }
    builder.build()
}

fn props() -> WriterProperties {
    props_with(false)
}

fn batches() -> Vec<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let words = [
        "carefully",
        "final",
        "deposits",
        "sleep",
        "quickly",
        "ironic",
        "packages",
        "among",
        "the",
        "furiously",
        "regular",
        "accounts",
        "haggle",
        "blithely",
        "express",
        "requests",
    ];
    let mut order = 1i64;
    (0..ROWS.div_ceil(BATCH))
        .map(|b| {
            let n = BATCH.min(ROWS - b * BATCH);
            let mut columns: Vec<ArrayRef> =
                vec![Arc::new(Int8Array::from_iter_values((0..n).map(|_| 1)))];
            columns.push(Arc::new(UInt64Array::from_iter_values(
                (0..n).map(|_| 2 + b as u64 / 20),
            )));
            let keys: Vec<i64> = (0..n)
                .map(|_| {
                    order += rng.random_range(0..2) * 32;
                    order
                })
                .collect();
            columns.push(Arc::new(Int64Array::from(keys)));
            for range in [1..200_000i64, 1..10_000] {
                columns.push(Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|_| rng.random_range(range.clone())),
                )));
            }
            columns.push(Arc::new(Int32Array::from_iter_values(
                (0..n).map(|_| rng.random_range(1..8)),
            )));
            for range in [100..5_000i128, 90_000..10_000_000, 0..11, 0..9] {
                let values = (0..n).map(|_| rng.random_range(range.clone()));
                let array = Decimal128Array::from_iter_values(values)
                    .with_precision_and_scale(15, 2)
                    .unwrap();
                columns.push(Arc::new(array));
            }
            for _ in DATES {
                columns.push(Arc::new(Date32Array::from_iter_values(
                    (0..n).map(|_| rng.random_range(8_000..10_500)),
                )));
            }
            for (_, values) in FLAGS {
                let strings = (0..n).map(|_| Some(values[rng.random_range(0..values.len())]));
                columns.push(Arc::new(StringViewArray::from_iter(strings)));
            }
            let comments = (0..n).map(|_| {
                let words = (0..rng.random_range(2..7)).map(|_| words[rng.random_range(0..16)]);
                Some(words.collect::<Vec<_>>().join(" "))
            });
            columns.push(Arc::new(StringViewArray::from_iter(comments)));
            RecordBatch::try_new(schema(), columns).unwrap()
        })
        .collect()
}

fn arrow_writer(batches: &[RecordBatch]) -> Vec<u8> {
    let mut writer = ArrowWriter::try_new(Vec::new(), schema(), Some(props())).unwrap();
    for batch in batches {
        writer.write(batch).unwrap();
    }
    writer.into_inner().unwrap()
}

fn column_parallel(batches: &[RecordBatch]) -> Vec<u8> {
    column_parallel_with(batches, props())
}

fn column_parallel_with(batches: &[RecordBatch], props: WriterProperties) -> Vec<u8> {
    let mut writer = ColumnParallelWriter::try_new(Vec::new(), schema(), props).unwrap();
    for group in batches.chunks(GROUP) {
        writer.write(group).unwrap();
    }
    writer.finish().unwrap()
}

fn sink_encode(c: &mut Criterion) {
    let batches = batches();
    assert!(
        arrow_writer(&batches) == column_parallel(&batches),
        "the two writers must write the same file"
    );
    let mut group = c.benchmark_group("sink_encode/1M_lineitem");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.bench_function("arrow_writer", |b| {
        b.iter(|| black_box(arrow_writer(&batches).len()))
    });
    group.bench_function("column_parallel", |b| {
        b.iter(|| black_box(column_parallel(&batches).len()))
    });
    group.bench_function("column_parallel_string_statistics", |b| {
        b.iter(|| black_box(column_parallel_with(&batches, props_with(true)).len()))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    targets = sink_encode
}
criterion_main!(benches);
