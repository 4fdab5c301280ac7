//! A Parquet file writer that encodes its columns in parallel.
//!
//! The sink's encoding (statistics, dictionaries, delta packing, zstd) is the replay's
//! longest single thread: on one core it kept the backfill waiting (lineitem scale 1, see
//! `docs/benchmarks-history.md`). Parquet stores each column chunk on its own, so the columns of a row
//! group can be encoded independently: [`ColumnParallelWriter`] keeps one
//! [`ArrowColumnWriter`] per leaf, each on a lane of its own ([`Lanes`]): a queue of the
//! leaves it is to write, drained in order by a rayon task. A call to
//! [`ColumnParallelWriter::write`] queues its batches and returns; the columns catch up
//! independently (a slow column does not hold the others at every batch), and a row group
//! is closed once all of them have. A file is the one [`ArrowWriter`] would write from the
//! same batches and properties, byte for byte (same pages, same row groups of at most
//! `max_row_group_row_count` rows, the same embedded Arrow schema; a test holds it to that):
//! only the work is spread.
//!
//! ```text
//!   batches ──compute_leaves──▶ leaf 0 ──▶ lane 0: writer 0 ─┐   (rayon, a task a lane
//!                               leaf 1 ──▶ lane 1: writer 1 ─┼─▶ close ─▶ row group ─▶ footer
//!                               ...                           │    while it has leaves)
//!                               leaf n ──▶ lane n: writer n ─┘
//! ```

use std::io::Write;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnWriter, ArrowLeafColumn, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use rayon::prelude::*;

use crate::error::{Result, internal};
use crate::job::lanes::{Lanes, MAX_QUEUED_ROWS};

/// Writes one Parquet file into `W` (a `Vec<u8>`, a file), its columns encoded in parallel
/// (on rayon's pool: the global one, or the one it is called from), each column while the
/// caller goes on: the file [`ArrowWriter`] writes from the same batches and properties.
/// Each row group goes to `W` when it is closed, so memory holds one row group's encoded
/// pages (and at most 64k rows of batches queued for a column), not the file.
///
/// ```
/// # use std::sync::Arc;
/// # use arrow_array::{Int64Array, RecordBatch, StringArray};
/// # use arrow_schema::{DataType, Field, Schema};
/// # use parquet::file::properties::WriterProperties;
/// use arrangement_backfill::job::ColumnParallelWriter;
///
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("k", DataType::Int64, false),
///     Field::new("s", DataType::Utf8, true),
/// ]));
/// let batch = RecordBatch::try_new(
///     schema.clone(),
///     vec![
///         Arc::new(Int64Array::from(vec![1, 2, 3])),
///         Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
///     ],
/// )?;
/// let mut writer =
///     ColumnParallelWriter::try_new(Vec::new(), schema, WriterProperties::default())?;
/// writer.write(&[batch.clone(), batch])?;
/// let bytes = writer.finish()?;
/// assert_eq!(&bytes[..4], b"PAR1");
/// # Ok::<(), arrangement_backfill::Error>(())
/// ```
pub struct ColumnParallelWriter<W: Write + Send = Vec<u8>> {
    file: SerializedFileWriter<W>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// The column writers of the row group being written, one per leaf.
    group: Option<Lanes>,
    /// Rows in the row group being written.
    group_rows: usize,
    /// The most rows of a row group (the properties' `max_row_group_row_count`).
    max_group_rows: usize,
    /// Row groups written so far.
    groups: usize,
    /// The most rows a column's lane holds before [`ColumnParallelWriter::write`] waits.
    max_queued_rows: usize,
}

impl<W: Write + Send> std::fmt::Debug for ColumnParallelWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnParallelWriter")
            .field("group_rows", &self.group_rows)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl<W: Write + Send> ColumnParallelWriter<W> {
    /// A writer of `schema` with `props` into `out`.
    pub fn try_new(out: W, schema: SchemaRef, props: WriterProperties) -> Result<Self> {
        let max_group_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
        // ArrowWriter derives the Parquet schema and embeds the Arrow schema in the footer's
        // metadata, as for a file it writes itself; with nothing written it has no row group
        // to flush.
        let (file, factory) =
            ArrowWriter::try_new(out, schema.clone(), Some(props))?.into_serialized_writer()?;
        Ok(Self {
            file,
            factory,
            schema,
            group: None,
            group_rows: 0,
            max_group_rows,
            groups: 0,
            max_queued_rows: MAX_QUEUED_ROWS,
        })
    }

    /// The same writer with at most `rows` rows (and at least a batch) queued on a column.
    #[cfg(test)]
    fn with_max_queued_rows(mut self, rows: usize) -> Self {
        self.max_queued_rows = rows;
        self
    }

    /// Encodes `batches`, in order, splitting row groups where [`ArrowWriter`] would. The
    /// columns are encoded on rayon while this returns; it waits only when a column is far
    /// behind (a bounded queue) or a row group is full. An encoding error comes back from a
    /// later call, or from [`ColumnParallelWriter::finish`].
    pub fn write(&mut self, batches: &[RecordBatch]) -> Result<()> {
        let mut pending: Vec<RecordBatch> = Vec::with_capacity(batches.len());
        for batch in batches {
            self.check_schema(batch)?;
            let mut batch = batch.clone();
            while batch.num_rows() > 0 {
                let room = self.max_group_rows - self.group_rows - rows(&pending);
                if batch.num_rows() <= room {
                    pending.push(batch);
                    break;
                }
                if room > 0 {
                    pending.push(batch.slice(0, room));
                    batch = batch.slice(room, batch.num_rows() - room);
                }
                self.encode(&pending)?;
                pending.clear();
                self.flush_group()?;
            }
        }
        self.encode(&pending)?;
        if self.group_rows == self.max_group_rows {
            self.flush_group()?;
        }
        Ok(())
    }

    /// Finishes the file (the last row group and the footer), flushes it and returns `W`.
    pub fn finish(mut self) -> Result<W> {
        self.flush_group()?;
        Ok(self.file.into_inner()?)
    }

    /// Queues `batches` (all within the current row group) on the column lanes, each
    /// column written by a rayon task of its own ([`Lanes`]).
    fn encode(&mut self, batches: &[RecordBatch]) -> Result<()> {
        if rows(batches) == 0 {
            return Ok(());
        }
        let group = match &mut self.group {
            Some(group) => group,
            None => self.group.insert(Lanes::new(
                self.factory.create_column_writers(self.groups)?,
                self.max_queued_rows,
            )),
        };
        for batch in batches {
            // The batch's leaves in the writers' order.
            let mut leaves: Vec<ArrowLeafColumn> = Vec::with_capacity(group.len());
            for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
                leaves.extend(compute_leaves(field, column)?);
            }
            group.submit(leaves, batch.num_rows())?;
            self.group_rows += batch.num_rows();
        }
        Ok(())
    }

    /// Closes the row group being written once its lanes are drained (its column chunks
    /// closed in parallel) and appends it to the file.
    fn flush_group(&mut self) -> Result<()> {
        let Some(group) = self.group.take() else {
            return Ok(());
        };
        let chunks = group
            .finish()?
            .into_par_iter()
            .map(ArrowColumnWriter::close)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut row_group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
        self.groups += 1;
        self.group_rows = 0;
        Ok(())
    }

    /// A batch of another shape than the file's is refused, as [`ArrowWriter`] refuses it.
    fn check_schema(&self, batch: &RecordBatch) -> Result<()> {
        let fields = self.schema.fields();
        let matches = batch.num_columns() == fields.len()
            && (fields.iter().zip(batch.columns()))
                .all(|(field, column)| field.data_type() == column.data_type());
        if matches {
            Ok(())
        } else {
            Err(internal!(
                "a batch of schema {} does not fit the Parquet file of schema {}",
                batch.schema(),
                self.schema
            ))
        }
    }
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{ArrayRef, Int64Array, StringArray, StringViewArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::{Compression, ZstdLevel};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Utf8View, true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
        ]))
    }

    /// Seeded batches of random sizes (empty ones among them), with NULLs, repeated and
    /// free-text strings, and lists.
    fn batches(seed: u64, count: usize) -> Vec<RecordBatch> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut next_key = 0i64;
        (0..count)
            .map(|_| {
                let n = rng.random_range(0..700);
                let keys: Int64Array = (0..n)
                    .map(|_| {
                        next_key += rng.random_range(1..5);
                        next_key
                    })
                    .collect();
                let text = |rng: &mut StdRng| -> Option<String> {
                    match rng.random_range(0..10) {
                        0 => None,
                        1..=5 => Some(format!("flag-{}", rng.random_range(0..4))),
                        _ => Some(format!("free text {}", rng.random::<u64>())),
                    }
                };
                let s: StringArray = (0..n).map(|_| text(&mut rng)).collect();
                let v: StringViewArray = (0..n).map(|_| text(&mut rng)).collect();
                let mut l = ListBuilder::new(StringBuilder::new());
                for _ in 0..n {
                    if rng.random_range(0..8) == 0 {
                        l.append_null();
                    } else {
                        for _ in 0..rng.random_range(0..3) {
                            l.values().append_option(text(&mut rng));
                        }
                        l.append(true);
                    }
                }
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(keys),
                    Arc::new(s),
                    Arc::new(v),
                    Arc::new(l.finish()),
                ];
                RecordBatch::try_new(schema(), columns).unwrap()
            })
            .collect()
    }

    fn props(max_group_rows: usize) -> WriterProperties {
        WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(max_group_rows))
            .set_data_page_row_count_limit(300)
            .set_write_batch_size(128)
            .build()
    }

    fn with_arrow_writer(batches: &[RecordBatch], props: WriterProperties) -> Vec<u8> {
        let mut writer = ArrowWriter::try_new(Vec::new(), schema(), Some(props)).unwrap();
        for batch in batches {
            writer.write(batch).unwrap();
        }
        writer.into_inner().unwrap()
    }

    fn with_parallel_writer(
        batches: &[RecordBatch],
        props: WriterProperties,
        group_by: usize,
    ) -> Vec<u8> {
        with_queues_of(batches, props, group_by, MAX_QUEUED_ROWS)
    }

    fn with_queues_of(
        batches: &[RecordBatch],
        props: WriterProperties,
        group_by: usize,
        max_queued_rows: usize,
    ) -> Vec<u8> {
        let mut writer = ColumnParallelWriter::try_new(Vec::new(), schema(), props)
            .unwrap()
            .with_max_queued_rows(max_queued_rows);
        for group in batches.chunks(group_by) {
            writer.write(group).unwrap();
        }
        writer.finish().unwrap()
    }

    #[test]
    fn files_are_the_arrow_writers_byte_for_byte() {
        for seed in 0..6 {
            let batches = batches(seed, 40);
            // Row groups smaller than a batch, about one batch, several batches, unlimited.
            for max_group_rows in [97, 700, 5000, usize::MAX] {
                let expected = with_arrow_writer(&batches, props(max_group_rows));
                // Columns a batch behind at most, a few, or as far as they go.
                for (group_by, queued) in [(1, 1), (3, 1000), (40, MAX_QUEUED_ROWS)] {
                    let got = with_queues_of(&batches, props(max_group_rows), group_by, queued);
                    assert!(
                        got == expected,
                        "seed {seed}, row groups of {max_group_rows}, batches by {group_by}, \
                         {queued} rows queued: {} bytes against ArrowWriter's {}",
                        got.len(),
                        expected.len()
                    );
                }
            }
        }
    }

    #[test]
    fn a_writer_inside_a_pool_of_one_thread_does_not_wait_for_itself() {
        let batches = batches(3, 30);
        let expected = with_arrow_writer(&batches, props(700));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let got = pool.install(|| with_queues_of(&batches, props(700), 2, 1));
        assert!(got == expected);
    }

    #[test]
    fn row_groups_filled_exactly_by_whole_batches() {
        let batches: Vec<RecordBatch> = batches(11, 60)
            .into_iter()
            .filter(|b| b.num_rows() >= 50)
            .map(|b| b.slice(0, 50))
            .collect();
        let expected = with_arrow_writer(&batches, props(100));
        for group_by in [1, 2, 3, 7] {
            assert!(with_parallel_writer(&batches, props(100), group_by) == expected);
        }
    }

    #[test]
    fn a_file_reads_back_as_its_batches_in_row_groups_of_the_limit() {
        let batches = batches(7, 25);
        let bytes = with_parallel_writer(&batches, props(500), 4);
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let groups = reader.metadata().row_groups();
        assert_eq!(groups.len(), total.div_ceil(500));
        assert!(groups.iter().rev().skip(1).all(|g| g.num_rows() == 500));
        let read: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        let read = arrow_select::concat::concat_batches(&read[0].schema(), &read).unwrap();
        let written = arrow_select::concat::concat_batches(&schema(), &batches).unwrap();
        assert_eq!(read, written);
    }

    #[test]
    fn an_empty_file_and_a_batch_of_another_schema() {
        let empty = ColumnParallelWriter::try_new(Vec::new(), schema(), props(100))
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(empty, with_arrow_writer(&[], props(100)));
        let mut writer = ColumnParallelWriter::try_new(Vec::new(), schema(), props(100)).unwrap();
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        let err = writer.write(&[other]).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }
}
