//! How the sink encodes a changelog file: its Parquet writer properties, some of them chosen
//! from a sample of the first rows the sink sees.
//!
//! Each choice was made by measurement (lineitem scale 1, `docs/benchmarks-history.md`):
//!
//! - integer leaves are `DELTA_BINARY_PACKED` ([`writer_properties`]);
//! - string and binary columns keep a dictionary if their values repeat
//!   ([`choose_dictionaries`]);
//! - zstd compresses a leaf only if it makes the leaf's sample at least a tenth smaller
//!   ([`choose_plain`]): prices, random ids, dates and dictionary indices come out of
//!   their encodings about as dense as zstd leaves them, and compressing them anyway cost a
//!   scale-1 replay 5 to 6% of its CPU for 1% of its output's bytes;
//! - min/max statistics everywhere except non-key strings.
//!
//! The sample is the first [`SAMPLE_ROWS`] rows; its choices hold for every file begun after
//! it is full. Until then every string column has a dictionary and every leaf is compressed.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use hashbrown::HashSet;
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::Result;

/// The rows the sink looks at to choose a file's encodings.
pub(crate) const SAMPLE_ROWS: usize = 4096;

/// The most distinct values among the sample of a column that keeps its dictionary.
const DICTIONARY_DISTINCT: usize = SAMPLE_ROWS / 2;

/// zstd stays on a leaf whose sample it makes at least this fraction smaller (tenths).
const MIN_ZSTD_SAVING_TENTHS: i64 = 1;

/// A leaf whose sample encodes to fewer bytes is not judged (it stays compressed): its pages
/// are small whatever zstd does to them, and a few bytes say little of the rest.
const MIN_JUDGED_BYTES: i64 = 1024;

/// The encodings the sink chooses from its sample: dictionaries and compression.
#[derive(Debug, Default)]
pub(crate) struct EncodingChoice {
    /// The sampled rows, until the choices are made.
    sample: Vec<RecordBatch>,
    sampled: usize,
    /// The choices; `None` until the sample is full.
    chosen: Option<Chosen>,
}

/// What the sample decided.
#[derive(Debug)]
struct Chosen {
    /// Per column: whether it gets a dictionary ([`choose_dictionaries`]).
    dictionaries: Vec<bool>,
    /// The leaves left uncompressed ([`choose_plain`]).
    plain: Vec<ColumnPath>,
}

impl EncodingChoice {
    /// Keeps the rows of `batch` (a changelog batch of `schema`) the sample still needs, and
    /// makes the choices once it is full.
    pub(crate) fn observe(
        &mut self,
        batch: &RecordBatch,
        schema: &SchemaRef,
        key_columns: &[String],
    ) -> Result<()> {
        if self.chosen.is_some() {
            return Ok(());
        }
        let take = batch.num_rows().min(SAMPLE_ROWS - self.sampled);
        if take > 0 {
            self.sample.push(batch.slice(0, take));
            self.sampled += take;
        }
        if self.sampled == SAMPLE_ROWS {
            let sample = std::mem::take(&mut self.sample);
            let dictionaries = choose_dictionaries(&sample);
            // Measured under the file's own encodings, every leaf compressed.
            let props = writer_properties(schema, Some(&dictionaries), &[], key_columns)?;
            let plain = choose_plain(schema, &sample, props)?;
            self.chosen = Some(Chosen {
                dictionaries,
                plain,
            });
        }
        Ok(())
    }

    /// The writer properties of a file begun now ([`writer_properties`]).
    pub(crate) fn writer_properties(
        &self,
        schema: &SchemaRef,
        key_columns: &[String],
    ) -> Result<WriterProperties> {
        match &self.chosen {
            Some(chosen) => writer_properties(
                schema,
                Some(&chosen.dictionaries),
                &chosen.plain,
                key_columns,
            ),
            None => writer_properties(schema, None, &[], key_columns),
        }
    }
}

/// Whether the sink may dictionary-encode a column of `data_type`: strings and binaries
/// only, and among them only those whose values repeat ([`choose_dictionaries`]).
///
/// Chosen by measurement (lineitem scale 1, `docs/benchmarks-history.md`): dictionary encoding of the
/// numeric columns (hashing and interning every value) was about 3 s of a replay's CPU, and
/// under zstd their plain pages came out smaller than dictionary-encoded ones; strings (flags,
/// modes, free text) keep it, readers can then decode them to dictionary arrays.
fn dictionary_encoded(data_type: &DataType) -> bool {
    byte_array(data_type)
}

/// Strings and binaries: Parquet byte arrays, whose statistics and dictionaries cost a
/// compare or a hash of their bytes a value.
fn byte_array(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// Which columns of `sample` get a dictionary: the string and binary ones whose values
/// repeat (at most [`DICTIONARY_DISTINCT`] distinct).
///
/// A dictionary pays for a column of few distinct values (flags, modes, names). For free
/// text it does not: the writer interns every value (a hash and a compare each) until the
/// dictionary page is full, then falls back to plain pages for the rest of the column
/// chunk; lineitem's `l_comment` cost a fifth of the sink's CPU that way. Until the sample
/// is full every string column has one.
fn choose_dictionaries(sample: &[RecordBatch]) -> Vec<bool> {
    let Some(first) = sample.first() else {
        return Vec::new();
    };
    (0..first.num_columns())
        .map(|i| {
            dictionary_encoded(first.column(i).data_type()) && {
                let mut seen = HashSet::new();
                for batch in sample {
                    collect_distinct(batch.column(i), &mut seen, DICTIONARY_DISTINCT);
                }
                seen.len() <= DICTIONARY_DISTINCT
            }
        })
        .collect()
}

/// Adds the distinct non-null values of `array` (a string or binary column) to `seen`, up to
/// one more than `limit` of them.
fn collect_distinct(array: &ArrayRef, seen: &mut HashSet<Vec<u8>>, limit: usize) {
    fn add<'a>(
        values: impl Iterator<Item = Option<&'a [u8]>>,
        seen: &mut HashSet<Vec<u8>>,
        limit: usize,
    ) {
        for value in values.flatten() {
            if seen.len() > limit {
                return;
            }
            if !seen.contains(value) {
                seen.insert(value.to_vec());
            }
        }
    }
    fn text(v: Option<&str>) -> Option<&[u8]> {
        v.map(str::as_bytes)
    }
    match array.data_type() {
        DataType::Utf8 => add(array.as_string::<i32>().iter().map(text), seen, limit),
        DataType::LargeUtf8 => add(array.as_string::<i64>().iter().map(text), seen, limit),
        DataType::Utf8View => add(array.as_string_view().iter().map(text), seen, limit),
        DataType::Binary => add(array.as_binary::<i32>().iter(), seen, limit),
        DataType::LargeBinary => add(array.as_binary::<i64>().iter(), seen, limit),
        DataType::BinaryView => add(array.as_binary_view().iter(), seen, limit),
        DataType::FixedSizeBinary(_) => add(array.as_fixed_size_binary().iter(), seen, limit),
        _ => {}
    }
}

/// The leaves of `sample` zstd does not make at least a tenth smaller
/// ([`MIN_ZSTD_SAVING_TENTHS`]), to be left uncompressed.
///
/// zstd's cost is per byte it reads, whatever it saves: on a leaf its encoding already left
/// dense (random ids, prices, dates delta-packed to a few bits of noise, dictionary indices)
/// it spends as much as on free text and saves almost nothing. The sample is encoded once,
/// in memory, with `props` (the file's encodings, every leaf compressed); each leaf's
/// compressed and uncompressed sizes in that file's metadata decide.
fn choose_plain(
    schema: &SchemaRef,
    sample: &[RecordBatch],
    props: WriterProperties,
) -> Result<Vec<ColumnPath>> {
    let mut writer = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props))?;
    for batch in sample {
        writer.write(batch)?;
    }
    let meta = writer.close()?;
    // Per leaf: (path, compressed bytes, uncompressed bytes) over the row groups.
    let mut sizes: Vec<(ColumnPath, i64, i64)> = Vec::new();
    for group in meta.row_groups() {
        for (i, column) in group.columns().iter().enumerate() {
            if sizes.len() <= i {
                sizes.push((column.column_path().clone(), 0, 0));
            }
            sizes[i].1 += column.compressed_size();
            sizes[i].2 += column.uncompressed_size();
        }
    }
    Ok(sizes
        .into_iter()
        .filter(|&(_, compressed, uncompressed)| !zstd_pays(compressed, uncompressed))
        .map(|(path, _, _)| path)
        .collect())
}

/// Whether zstd pays on a leaf whose sample it turned from `uncompressed` into `compressed`
/// bytes: a saving of at least [`MIN_ZSTD_SAVING_TENTHS`], or too few bytes to judge.
fn zstd_pays(compressed: i64, uncompressed: i64) -> bool {
    uncompressed < MIN_JUDGED_BYTES
        || (uncompressed - compressed) * 10 >= uncompressed * MIN_ZSTD_SAVING_TENTHS
}

/// Date64 as a Parquet DATE (so every reader sees a date), lists with Parquet's `element`.
const COERCE_TYPES: bool = true;

/// The writer properties of a changelog file of `schema`: a dictionary for the columns
/// `dictionaries` names (for every string and binary column without a choice), zstd on every
/// leaf but those in `plain`, and min/max statistics of the string and binary
/// columns named in `key_columns` only.
///
/// Statistics as the sink's module docs say; the string ones left out were 7% of a replay's
/// CPU (lineitem scale 1, `docs/benchmarks-history.md`).
///
/// Integer leaves (Parquet INT32 and INT64: integers, dates, times, timestamps, small
/// decimals, and `_epoch`/`_op`) are written `DELTA_BINARY_PACKED` (a nested leaf keeps its
/// dictionary, delta-packed only if it falls back to plain pages): a page holds bit-packed
/// differences instead of 4 or 8 bytes a value, so zstd gets a fraction of the bytes to
/// compress. Chosen by measurement (lineitem scale 1, `docs/benchmarks-history.md`): zstd was over half of
/// the sink's CPU, most of its input plain integers.
fn writer_properties(
    schema: &SchemaRef,
    dictionaries: Option<&[bool]>,
    plain: &[ColumnPath],
    key_columns: &[String],
) -> Result<WriterProperties> {
    let mut builder = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_coerce_types(COERCE_TYPES);
    for (i, field) in schema.fields().iter().enumerate() {
        // Top-level leaves only; a nested column keeps the defaults (dictionary and
        // statistics on).
        if !field.data_type().is_nested() {
            let path = ColumnPath::from(field.name().as_str());
            builder = builder.set_column_dictionary_enabled(
                path.clone(),
                match dictionaries {
                    Some(chosen) => chosen.get(i).copied().unwrap_or(false),
                    None => dictionary_encoded(field.data_type()),
                },
            );
            if byte_array(field.data_type()) && !key_columns.contains(field.name()) {
                builder = builder.set_column_statistics_enabled(path, EnabledStatistics::None);
            }
        }
    }
    // The leaf paths of the file the writer writes (with the same coercion).
    let parquet_schema = ArrowSchemaConverter::new()
        .with_coerce_types(COERCE_TYPES)
        .convert(schema)?;
    for leaf in parquet_schema.columns() {
        if matches!(
            leaf.physical_type(),
            PhysicalType::INT32 | PhysicalType::INT64
        ) {
            builder =
                builder.set_column_encoding(leaf.path().clone(), Encoding::DELTA_BINARY_PACKED);
        }
    }
    for leaf in plain {
        builder = builder.set_column_compression(leaf.clone(), Compression::UNCOMPRESSED);
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    /// `k` ascending by one (delta-packed to almost nothing), `noise` random 64-bit
    /// integers (delta-packing and zstd leave them as they are), `text` repetitive free text.
    fn rows(schema: &SchemaRef, from: u64, n: u64) -> RecordBatch {
        let noise = (from..from + n).map(|i| {
            // splitmix64: a fixed sequence of well-spread numbers.
            let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as i64
        });
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    (from..from + n).map(|i| i as i64),
                )),
                Arc::new(Int64Array::from_iter_values(noise)),
                Arc::new(StringArray::from_iter_values(
                    (from..from + n).map(|i| format!("the quick brown fox jumps over {i}")),
                )),
            ],
        )
        .unwrap()
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("noise", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]))
    }

    fn codecs(choice: &EncodingChoice, schema: &SchemaRef) -> Vec<(String, Compression)> {
        let props = choice.writer_properties(schema, &[]).unwrap();
        (schema.fields().iter())
            .map(|f| {
                let path = ColumnPath::from(f.name().as_str());
                (f.name().clone(), props.compression(&path))
            })
            .collect()
    }

    #[test]
    fn zstd_stays_only_where_the_sample_shows_it_pays() {
        let schema = schema();
        let zstd = Compression::ZSTD(ZstdLevel::default());
        let mut choice = EncodingChoice::default();
        let all_zstd = [("k", zstd), ("noise", zstd), ("text", zstd)]
            .map(|(name, codec)| (name.to_string(), codec));
        // Until the sample is full, every leaf is compressed.
        assert_eq!(codecs(&choice, &schema), all_zstd);
        let n = SAMPLE_ROWS as u64;
        choice
            .observe(&rows(&schema, 0, n - 1), &schema, &[])
            .unwrap();
        assert_eq!(codecs(&choice, &schema), all_zstd);
        // The sample fills up within this batch; its later rows are not looked at.
        choice
            .observe(&rows(&schema, n - 1, 100), &schema, &[])
            .unwrap();
        let chosen = [
            // Too few bytes to judge (a page of deltas of one).
            ("k", zstd),
            ("noise", Compression::UNCOMPRESSED),
            ("text", zstd),
        ]
        .map(|(name, codec)| (name.to_string(), codec));
        assert_eq!(codecs(&choice, &schema), chosen);
        // The choice holds, whatever comes after.
        choice
            .observe(&rows(&schema, 2 * n, n), &schema, &[])
            .unwrap();
        assert_eq!(codecs(&choice, &schema), chosen);
        // The dictionary choice was made from the same sample: the free text goes plain.
        let props = choice.writer_properties(&schema, &[]).unwrap();
        assert!(!props.dictionary_enabled(&ColumnPath::from("text")));
    }

    #[test]
    fn zstd_pays_from_a_tenth_saved_on_enough_bytes() {
        assert!(zstd_pays(900, 1000) || 1000 < MIN_JUDGED_BYTES);
        assert!(zstd_pays(9000, 10_000));
        assert!(!zstd_pays(9001, 10_000));
        assert!(!zstd_pays(10_050, 10_000));
        assert!(zstd_pays(3000, 10_000));
        // Below the judged size, zstd stays whatever it saved.
        assert!(zstd_pays(MIN_JUDGED_BYTES, MIN_JUDGED_BYTES - 1));
    }
}
