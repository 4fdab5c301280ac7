//! Rows of several batches of one schema, gathered into one batch: `arrow_select`'s
//! `interleave_record_batch` with its per-source cost taken out.
//!
//! A merge's output takes each row from wherever its input's current batch is, so one output
//! batch draws on about as many source batches as there are inputs (128 an actor at 256
//! vnodes; at 32768 vnodes nearly one per row). Arrow's interleave checks every source
//! column's type against the first's and downcasts each source again for every column: with
//! 1024-row outputs of lineitem's 16 columns, about two type comparisons and two dynamic
//! downcasts per value gathered (`DataType::eq` alone was 1.2% of a merged scale-1 replay).
//!
//! Here the sources are checked once for one schema (the same `Arc` as a rule, since they
//! are all blocks of one table), then each column of the common types (fixed-width
//! primitives, string and binary views) is gathered from typed slices. Any other type, and
//! sources of different schemas, go to arrow's interleave, which also reports the errors;
//! dictionaries with narrow keys through [`crate::dictionary`], which merges them.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{BinaryViewType, ByteViewType, StringViewType};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, GenericByteViewArray, PrimitiveArray, RecordBatch,
    downcast_primitive_array,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field};
use arrow_select::interleave::interleave_record_batch;

use crate::error::{Result, internal};

/// The rows `(batch, row)` of `batches`, in order, as one batch of their schema.
pub fn interleave_batches(
    batches: &[&RecordBatch],
    indices: &[(usize, usize)],
) -> Result<RecordBatch> {
    let Some(first) = batches.first() else {
        return Err(internal!("an interleave of no batch"));
    };
    let schema = first.schema_ref();
    let same = |b: &RecordBatch| Arc::ptr_eq(b.schema_ref(), schema) || b.schema_ref() == schema;
    let same = batches.iter().all(|b| same(b));
    let dictionaries = || {
        (schema.fields().iter()).any(|f| crate::dictionary::has_narrow_dictionary(f.data_type()))
    };
    if indices.is_empty() || (!same && !dictionaries()) {
        return Ok(interleave_record_batch(batches, indices)?);
    }
    // Checked once for every column: the gathers below index without failing.
    let rows: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    if let Some(&(source, row)) =
        (indices.iter()).find(|&&(source, row)| rows.get(source).is_none_or(|&rows| row >= rows))
    {
        return Err(internal!(
            "interleave index ({source}, {row}) outside its {} source batches",
            batches.len()
        ));
    }
    let fields = schema.fields();
    if let Some(other) = batches.iter().find(|b| b.num_columns() != fields.len()) {
        return Err(internal!(
            "an interleave of a batch of {} columns into {} columns",
            other.num_columns(),
            fields.len()
        ));
    }
    let columns = (fields.iter().enumerate())
        .map(|(i, field)| {
            let sources: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
            match same {
                true => interleave_column(field, &sources, indices),
                // Arrow's interleave, with its type checks, dictionaries merged.
                false => crate::dictionary::interleave(field, &sources, indices),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// One column of [`interleave_batches`] (`field` of the schema): `sources` are of one type,
/// and every index is in range.
fn interleave_column(
    field: &Field,
    sources: &[&dyn Array],
    indices: &[(usize, usize)],
) -> Result<ArrayRef> {
    let first = sources[0];
    downcast_primitive_array!(
        first => primitive(first, sources, indices),
        DataType::Utf8View => views::<StringViewType>(sources, indices),
        DataType::BinaryView => views::<BinaryViewType>(sources, indices),
        // Dictionaries of narrow keys merged; any other type by arrow's interleave.
        _ => crate::dictionary::interleave(field, sources, indices)
    )
}

/// Each source's nulls, if it has any.
fn source_nulls<'a>(sources: &[&'a dyn Array]) -> Vec<Option<&'a NullBuffer>> {
    sources
        .iter()
        .map(|s| s.nulls().filter(|n| n.null_count() > 0))
        .collect()
}

/// The validity of the gathered rows, if any source has a null (`nulls`: per source, from
/// [`source_nulls`]).
fn gathered_nulls(nulls: &[Option<&NullBuffer>], indices: &[(usize, usize)]) -> Option<NullBuffer> {
    if nulls.iter().all(Option::is_none) {
        return None;
    }
    let valid = BooleanBuffer::collect_bool(indices.len(), |i| {
        let (source, row) = indices[i];
        nulls[source].is_none_or(|n| n.is_valid(row))
    });
    Some(NullBuffer::new(valid))
}

/// A fixed-width column (`first` is `sources[0]`, typed): its values gathered from the
/// sources' value slices; the output keeps `first`'s exact type (a decimal's precision and
/// scale, a timestamp's zone).
fn primitive<T: ArrowPrimitiveType>(
    first: &PrimitiveArray<T>,
    sources: &[&dyn Array],
    indices: &[(usize, usize)],
) -> Result<ArrayRef> {
    let values = sources
        .iter()
        .map(|s| {
            s.as_primitive_opt::<T>()
                .map(|a| a.values().as_ref())
                .ok_or_else(|| internal!("an interleave source of another type"))
        })
        .collect::<Result<Vec<&[T::Native]>>>()?;
    // Indices checked in range by `interleave_batches`.
    let gathered: Vec<T::Native> = indices
        .iter()
        .map(|&(source, row)| values[source][row])
        .collect();
    let nulls = gathered_nulls(&source_nulls(sources), indices);
    let array = PrimitiveArray::<T>::new(ScalarBuffer::from(gathered), nulls)
        .with_data_type(first.data_type().clone());
    Ok(Arc::new(array))
}

/// A string or binary view column: the views copied, each long value's buffer index
/// renumbered among the buffers the gathered rows use (each such buffer kept once, by
/// reference; the others are not held by the output).
#[expect(
    unsafe_code,
    reason = "a view array built from valid views; see SAFETY"
)]
fn views<T: ByteViewType>(sources: &[&dyn Array], indices: &[(usize, usize)]) -> Result<ArrayRef> {
    let arrays = sources
        .iter()
        .map(|s| {
            s.as_byte_view_opt::<T>()
                .ok_or_else(|| internal!("an interleave source of another type"))
        })
        .collect::<Result<Vec<&GenericByteViewArray<T>>>>()?;
    // Each source's first buffer in a numbering of all sources' buffers, and each such
    // buffer's place among the output's (u32::MAX: not used yet).
    let mut first_buffer = Vec::with_capacity(arrays.len());
    let mut total = 0usize;
    for a in &arrays {
        first_buffer.push(total);
        total += a.data_buffers().len();
    }
    let mut placed = vec![u32::MAX; total];
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut views = Vec::with_capacity(indices.len());
    let source_nulls = source_nulls(sources);
    // Indices checked in range by `interleave_batches`.
    for &(source, row) in indices {
        let array = arrays[source];
        let view = array.views()[row];
        // A null's view may say anything: it becomes the empty view.
        if source_nulls[source].is_some_and(|n| n.is_null(row)) {
            views.push(0);
            continue;
        }
        if view as u32 <= 12 {
            views.push(view);
            continue;
        }
        let buffer = (view >> 64) as u32 as usize;
        let slot = (placed.get_mut(first_buffer[source] + buffer))
            .ok_or_else(|| internal!("a view outside its buffers"))?;
        if *slot == u32::MAX {
            let data = (array.data_buffers().get(buffer))
                .ok_or_else(|| internal!("a view outside its buffers"))?;
            *slot = u32::try_from(buffers.len())
                .map_err(|_| internal!("more than 2^32 buffers in one interleave"))?;
            buffers.push(data.clone());
        }
        let renumbered = (view & !(u128::from(u32::MAX) << 64)) | (u128::from(*slot) << 64);
        views.push(renumbered);
    }
    let nulls = gathered_nulls(&source_nulls, indices);
    // SAFETY: every view is a valid source array's view of a valid value, unchanged but
    // for its buffer index, which now names the same buffer (cloned, by reference) in
    // `buffers`, or the empty view (a null); inline views name no buffer. Lengths, offsets
    // within the buffer, prefixes and (for strings) UTF-8 validity are therefore those the
    // sources were validated with, and `nulls` has one bit per view.
    let array = unsafe { GenericByteViewArray::<T>::new_unchecked(views.into(), buffers, nulls) };
    Ok(Arc::new(array))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        BinaryViewArray, Decimal128Array, Int32Array, Int64Array, StringArray, StringViewArray,
        TimestampMillisecondArray,
    };
    use arrow_schema::{Field, Schema, TimeUnit};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(15, 2), false),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Millisecond, Some("+01:00".into())),
                true,
            ),
            Field::new("s", DataType::Utf8View, true),
            Field::new("b", DataType::BinaryView, false),
            // Not one of the gathered types: arrow's interleave.
            Field::new("u", DataType::Utf8, true),
            Field::new("n", DataType::Int32, false),
        ]))
    }

    /// A batch of `rows` random rows: nulls in the nullable columns unless `dense`, strings
    /// both inline (up to 12 bytes) and long, in views over several buffers.
    fn batch(rng: &mut StdRng, schema: &Arc<Schema>, rows: usize, dense: bool) -> RecordBatch {
        let null = |rng: &mut StdRng| !dense && rng.random_ratio(1, 5);
        let text = |rng: &mut StdRng| -> String {
            let len = if rng.random_bool(0.5) {
                rng.random_range(0..=12)
            } else {
                rng.random_range(13..40)
            };
            (0..len)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect()
        };
        let i: Int64Array = (0..rows)
            .map(|_| (!null(rng)).then(|| rng.random()))
            .collect();
        let d = Decimal128Array::from_iter_values(
            (0..rows).map(|_| rng.random_range(-1_000_000..1_000_000)),
        )
        .with_precision_and_scale(15, 2)
        .unwrap();
        let t = TimestampMillisecondArray::from_iter(
            (0..rows).map(|_| (!null(rng)).then(|| rng.random_range(0..1 << 40))),
        )
        .with_timezone("+01:00");
        // Views over two buffers: built in two halves and concatenated.
        let strings: Vec<Option<String>> =
            (0..rows).map(|_| (!null(rng)).then(|| text(rng))).collect();
        let half = rows / 2;
        let s = arrow_select::concat::concat(&[
            &StringViewArray::from_iter(strings[..half].iter().map(|s| s.as_deref())),
            &StringViewArray::from_iter(strings[half..].iter().map(|s| s.as_deref())),
        ])
        .unwrap();
        let b = BinaryViewArray::from_iter_values((0..rows).map(|_| text(rng).into_bytes()));
        let u: StringArray = (0..rows).map(|_| (!null(rng)).then(|| text(rng))).collect();
        let n = Int32Array::from_iter_values((0..rows).map(|_| rng.random()));
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(i),
                Arc::new(d),
                Arc::new(t),
                s,
                Arc::new(b),
                Arc::new(u),
                Arc::new(n),
            ],
        )
        .unwrap()
    }

    /// Against arrow's interleave, the oracle: same values, same types, on random sources
    /// and picks (seeded), with and without nulls, and with sliced sources.
    #[test]
    fn agrees_with_arrows_interleave() {
        let schema = schema();
        for seed in 0..40u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let dense = seed % 3 == 0;
            let owned: Vec<RecordBatch> = (0..rng.random_range(1..6))
                .map(|_| {
                    let rows = rng.random_range(1..200);
                    let b = batch(&mut rng, &schema, rows, dense);
                    // Some sources are slices of a larger batch (offsets into their arrays).
                    if rows > 10 && rng.random_bool(0.5) {
                        b.slice(3, rows - 7)
                    } else {
                        b
                    }
                })
                .collect();
            let batches: Vec<&RecordBatch> = owned.iter().collect();
            let indices: Vec<(usize, usize)> = (0..rng.random_range(0..300))
                .map(|_| {
                    let s = rng.random_range(0..batches.len());
                    (s, rng.random_range(0..batches[s].num_rows()))
                })
                .collect();
            let ours = interleave_batches(&batches, &indices).unwrap();
            let arrows = interleave_record_batch(&batches, &indices).unwrap();
            assert_eq!(ours, arrows, "seed {seed}");
            assert_eq!(ours.schema(), schema);
            for column in ours.columns() {
                column.to_data().validate_full().unwrap();
            }
        }
    }

    /// The output holds only the view buffers its rows use.
    #[test]
    fn unused_view_buffers_are_not_held() {
        let long = |c: char| c.to_string().repeat(20);
        let a = StringViewArray::from_iter_values([long('a'), long('b')]);
        let b = StringViewArray::from_iter_values([long('c')]);
        let b =
            arrow_select::concat::concat(&[&b, &StringViewArray::from_iter_values([long('d')])])
                .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let a = RecordBatch::try_new(schema.clone(), vec![Arc::new(a)]).unwrap();
        let b = RecordBatch::try_new(schema, vec![b]).unwrap();
        let out = interleave_batches(&[&a, &b], &[(1, 1), (1, 1), (0, 0)]).unwrap();
        let s = out.column(0).as_string_view();
        assert_eq!(
            s.iter().flatten().collect::<Vec<_>>(),
            [long('d'), long('d'), long('a')]
        );
        assert_eq!(s.data_buffers().len(), 2);
    }

    #[test]
    fn sources_of_other_schemas_get_arrows_error() {
        let x =
            RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1])) as ArrayRef)])
                .unwrap();
        let y =
            RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1])) as ArrayRef)])
                .unwrap();
        assert!(interleave_batches(&[&x, &y], &[(0, 0), (1, 0)]).is_err());
        assert!(interleave_batches(&[], &[]).is_err());
    }

    #[test]
    fn an_index_out_of_range_is_an_error_not_a_panic() {
        let x =
            RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1])) as ArrayRef)])
                .unwrap();
        assert!(interleave_batches(&[&x], &[(0, 1)]).is_err());
        assert!(interleave_batches(&[&x], &[(1, 0)]).is_err());
    }
}
