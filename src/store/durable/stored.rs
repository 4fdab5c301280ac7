//! How run files store the table's columns, and the kernels that convert them.
//!
//! A run file stores each column in as few bytes as Arrow allows for the same values
//! ([`stored_type`]); blocks are converted as they are written ([`to_stored`]) and back as
//! they are read ([`from_stored`]). Both conversions run once per block written or read, so
//! they are written for speed: one pass over the values, no builder, no per-value allocation.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ByteViewType, Decimal64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, BinaryArray, BinaryViewArray, Decimal64Array,
    Decimal128Array, GenericByteViewArray, RecordBatch, StringArray, StringViewArray,
};
use arrow_buffer::{ArrowNativeType, Buffer, OffsetBuffer, ScalarBuffer};
use arrow_cast::CastOptions;
use arrow_cast::display::FormatOptions;
use arrow_data::MAX_INLINE_VIEW_LEN;
use arrow_schema::{DECIMAL64_MAX_PRECISION, DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};

/// The most bytes of values a block stores in one string or binary column kept as offsets
/// (`Utf8`, `Binary`: 32-bit offsets). Rows of longer values are cut into smaller blocks.
pub(super) const MAX_BLOCK_VALUE_BYTES: usize = i32::MAX as usize;

/// The bytes of values that rows `start..start + len` of `batch` store in its largest column
/// kept as offsets and bytes in a file of `schema` (views and dictionaries of strings or
/// binaries stored as `Utf8` or `Binary`), or an upper bound of them; 0 for a batch without
/// such columns. Read from the batch's arrays, without slicing them (a slice of a view array
/// clones its list of buffers, which a spill's gathered rows have many of).
pub(super) fn stored_value_bytes(
    batch: &RecordBatch,
    start: usize,
    len: usize,
    schema: &Schema,
) -> usize {
    (batch.columns().iter().zip(schema.fields()))
        .filter(|(_, field)| matches!(field.data_type(), DataType::Utf8 | DataType::Binary))
        .map(|(column, _)| value_bytes(column.as_ref(), start, len))
        .max()
        .unwrap_or(0)
}

/// The bytes of the values of rows `start..start + len` of `column`: exact, and read in
/// O(`len`) (a dictionary's rows through their keys, never a pass over its values, which a
/// shared batch of many short runs would pay once per run).
fn value_bytes(column: &dyn Array, start: usize, len: usize) -> usize {
    let end = start + len;
    if let Some(dict) = column.as_any_dictionary_opt() {
        return value_lengths(dict.values().as_ref()).map_or(0, |length| {
            key_value_bytes(dict.keys(), start, end, length.as_ref())
        });
    }
    let views = |views: &[u128]| {
        (views.get(start..end).unwrap_or_default().iter())
            .map(|&v| v as u32 as usize)
            .sum()
    };
    match column.data_type() {
        DataType::Utf8View => views(column.as_string_view().views()),
        DataType::BinaryView => views(column.as_binary_view().views()),
        DataType::Utf8 => offsets_span(column.as_string::<i32>().offsets(), start, end),
        DataType::Binary => offsets_span(column.as_binary::<i32>().offsets(), start, end),
        DataType::LargeUtf8 => offsets_span(column.as_string::<i64>().offsets(), start, end),
        DataType::LargeBinary => offsets_span(column.as_binary::<i64>().offsets(), start, end),
        _ => 0,
    }
}

/// The byte length of value `i` of a string or binary array (0 past its end); `None` for
/// other types.
fn value_lengths(values: &dyn Array) -> Option<Box<dyn Fn(usize) -> usize + '_>> {
    fn offsets<O: arrow_array::OffsetSizeTrait>(offsets: &[O]) -> Box<dyn Fn(usize) -> usize + '_> {
        Box::new(move |i| offsets_span(offsets, i, i + 1))
    }
    fn views(views: &[u128]) -> Box<dyn Fn(usize) -> usize + '_> {
        Box::new(move |i| views.get(i).map_or(0, |&v| v as u32 as usize))
    }
    Some(match values.data_type() {
        DataType::Utf8View => views(values.as_string_view().views()),
        DataType::BinaryView => views(values.as_binary_view().views()),
        DataType::Utf8 => offsets(values.as_string::<i32>().offsets()),
        DataType::Binary => offsets(values.as_binary::<i32>().offsets()),
        DataType::LargeUtf8 => offsets(values.as_string::<i64>().offsets()),
        DataType::LargeBinary => offsets(values.as_binary::<i64>().offsets()),
        _ => return None,
    })
}

/// The bytes of the values that keys `start..end` of a dictionary point to. A null row's
/// key counts too (an upper bound then); a key out of range counts 0.
fn key_value_bytes(
    keys: &dyn Array,
    start: usize,
    end: usize,
    length: &dyn Fn(usize) -> usize,
) -> usize {
    fn sum<K: ArrowPrimitiveType>(
        keys: &dyn Array,
        start: usize,
        end: usize,
        length: &dyn Fn(usize) -> usize,
    ) -> usize {
        keys.as_primitive_opt::<K>().map_or(0, |keys| {
            (keys.values().get(start..end).unwrap_or_default().iter())
                .map(|k| k.to_usize().map_or(0, length))
                .sum()
        })
    }
    match keys.data_type() {
        DataType::Int8 => sum::<Int8Type>(keys, start, end, length),
        DataType::Int16 => sum::<Int16Type>(keys, start, end, length),
        DataType::Int32 => sum::<Int32Type>(keys, start, end, length),
        DataType::Int64 => sum::<Int64Type>(keys, start, end, length),
        DataType::UInt8 => sum::<UInt8Type>(keys, start, end, length),
        DataType::UInt16 => sum::<UInt16Type>(keys, start, end, length),
        DataType::UInt32 => sum::<UInt32Type>(keys, start, end, length),
        DataType::UInt64 => sum::<UInt64Type>(keys, start, end, length),
        _ => 0,
    }
}

/// The bytes between offsets `start` and `end`.
fn offsets_span<O: arrow_array::OffsetSizeTrait>(offsets: &[O], start: usize, end: usize) -> usize {
    match (offsets.get(start), offsets.get(end)) {
        (Some(first), Some(last)) => (*last - *first).as_usize(),
        _ => 0,
    }
}

/// How a run file stores a column of the table's `data_type`: in fewer bytes where Arrow has
/// a narrower layout for the same values.
///
/// - strings and binaries held as views (16 bytes a value, plus the bytes of values over 12)
///   are stored as offsets and bytes (4 bytes a value, plus every value's bytes): lineitem's
///   five short strings take 66 bytes a row instead of 114;
/// - decimals of precision 18 or less (every value fits 64 bits) are stored as 64-bit
///   decimals: 8 bytes instead of 16;
/// - dictionaries are stored as their values, so that every block is self-contained.
///
/// Blocks are made back into the table's types as they are read ([`from_stored`]).
pub(super) fn stored_type(data_type: &DataType) -> DataType {
    match data_type {
        // A dictionary's values: strings as offsets, anything else as it is (writes check
        // plain decimal columns only, see `crate::store::rules::check_decimals`).
        DataType::Dictionary(_, values) => offsets_for_views(values),
        DataType::Decimal128(precision, scale) if *precision <= DECIMAL64_MAX_PRECISION => {
            DataType::Decimal64(*precision, *scale)
        }
        other => offsets_for_views(other),
    }
}

/// String and binary views as offsets; any other type as it is.
fn offsets_for_views(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

/// Casts that fail rather than make a value null: a store never changes a value.
const EXACT: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: FormatOptions::new(),
};

/// How files written before [`stored_type`] (format 1) store a column: as the table does,
/// dictionaries as their values. They are still read.
pub(super) fn stored_type_v1(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Dictionary(_, values) => values.as_ref().clone(),
        other => other.clone(),
    }
}

/// The schema a run file's batches are decoded with: the file's, with string views (format 1)
/// read as binary views (the same buffers), whose decoding checks their bounds but not their
/// UTF-8 ([`from_stored`] does that, a buffer at a time).
pub(super) fn decode_schema(file: &Schema) -> SchemaRef {
    let fields: Vec<Arc<Field>> = (file.fields().iter())
        .map(|f| match f.data_type() {
            DataType::Utf8View => Arc::new(f.as_ref().clone().with_data_type(DataType::BinaryView)),
            _ => f.clone(),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The table's columns as the file stores them (the types of `fields`).
pub(super) fn to_stored(columns: &[ArrayRef], fields: &[Arc<Field>]) -> Result<Vec<ArrayRef>> {
    (columns.iter().zip(fields))
        .map(
            |(column, field)| match (column.data_type(), field.data_type()) {
                (from, to) if from == to => Ok(column.clone()),
                (DataType::Utf8View, DataType::Utf8) => {
                    let views = column.as_string_view();
                    let (offsets, values) = views_to_offsets(views)?;
                    // Safe constructor: it checks the UTF-8 of the values (a pass over the bytes)
                    // and that every offset falls on a character boundary.
                    let array = StringArray::try_new(offsets, values, views.nulls().cloned())?;
                    Ok(Arc::new(array) as ArrayRef)
                }
                (DataType::BinaryView, DataType::Binary) => {
                    let views = column.as_binary_view();
                    let (offsets, values) = views_to_offsets(views)?;
                    let array = BinaryArray::try_new(offsets, values, views.nulls().cloned())?;
                    Ok(Arc::new(array) as ArrayRef)
                }
                (DataType::Decimal128(..), DataType::Decimal64(precision, scale)) => {
                    narrow_decimals(column.as_primitive(), *precision, *scale, field.name())
                }
                (_, to) => Ok(arrow_cast::cast_with_options(column, to, &EXACT)?),
            },
        )
        .collect()
}

/// The values of `array` as offsets and bytes, each value's bytes copied once (a null's as
/// none). The caller keeps the total under 2 GiB (blocks are cut to fit); more is an error.
fn views_to_offsets<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
) -> Result<(OffsetBuffer<i32>, Buffer)> {
    match array.nulls() {
        None => copy_values(array, std::iter::repeat(true)),
        Some(nulls) => copy_values(array, nulls.iter()),
    }
}

/// Bytes copied at a time: a value of up to this many bytes is one fixed-size copy (two
/// vector moves, no call), over-reading its source and over-writing the output's slack.
const CHUNK: usize = 32;

/// [`views_to_offsets`] with each value's validity from `valid` (a null's bytes, whatever
/// its view says, are none).
fn copy_values<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
    valid: impl Iterator<Item = bool> + Clone,
) -> Result<(OffsetBuffer<i32>, Buffer)> {
    let views = array.views();
    let buffers = array.data_buffers();
    let lens = views
        .iter()
        .zip(valid)
        .map(|(&v, valid)| v as u32 as usize * usize::from(valid));
    let total: usize = lens.clone().sum();
    if i32::try_from(total).is_err() {
        return Err(Error::Internal(format!(
            "{total} bytes of values in one block, more than 32-bit offsets address"
        )));
    }
    // `CHUNK` bytes of slack: each value is copied in whole chunks, the next value
    // overwriting what the last chunk wrote past its end.
    let mut values = vec![0u8; total + CHUNK];
    let mut offsets = vec![0i32; views.len() + 1];
    let mut end = 0;
    for ((&view, len), offset) in views.iter().zip(lens).zip(&mut offsets[1..]) {
        let out = &mut values[end..];
        if len <= MAX_INLINE_VIEW_LEN as usize {
            // The value and its zero padding: 12 bytes, of which `len` are kept.
            out[..12].copy_from_slice(&view.to_le_bytes()[4..16]);
        } else {
            let buffer = (view >> 64) as u32 as usize;
            let start = (view >> 96) as u32 as usize;
            let source = (buffers.get(buffer).and_then(|b| b.get(start..start + len)))
                .ok_or_else(|| Error::Internal("a view outside its buffers".into()))?;
            // Whole chunks while the source has them (a value followed by enough bytes of
            // its buffer, as most are), else the exact bytes.
            let padded = len.next_multiple_of(CHUNK);
            match buffers[buffer].get(start..start + padded) {
                Some(chunks) => {
                    for (to, from) in (out.chunks_exact_mut(CHUNK)).zip(chunks.chunks_exact(CHUNK))
                    {
                        to.copy_from_slice(from);
                    }
                }
                None => out[..len].copy_from_slice(source),
            }
        }
        end += len;
        // At most `total`, checked above to fit.
        *offset = end as i32;
    }
    values.truncate(total);
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok((offsets, Buffer::from_vec(values)))
}

/// `array` as 64-bit decimals. A value that does not fit breaks the precision the column
/// declares (at most 18 digits always fits; writes refuse more, see
/// `crate::store::rules::check_decimals`): an error naming the column, never a wrapped value.
pub(super) fn narrow_decimals(
    array: &Decimal128Array,
    precision: u8,
    scale: i8,
    column: &str,
) -> Result<ArrayRef> {
    // One branch-free pass that narrows every slot and notes any that did not fit.
    let mut wrapped = false;
    let narrow: Vec<i64> = (array.values().iter())
        .map(|&v| {
            // Fits iff the high 64 bits are the sign of the low 64: 64-bit operations only.
            let (low, high) = (v as i64, (v >> 64) as i64);
            wrapped |= high != low >> 63;
            low
        })
        .collect();
    // A null slot's value means nothing: only a hit is looked at again, null-aware.
    if wrapped && let Some(value) = array.iter().flatten().find(|&v| i64::try_from(v).is_err()) {
        return Err(Error::decimal_too_long(column, value, precision, scale));
    }
    let narrow = Decimal64Array::new(ScalarBuffer::from(narrow), array.nulls().cloned());
    Ok(Arc::new(narrow.with_precision_and_scale(precision, scale)?))
}

/// The decoded columns of a block back in the table's types (of `fields`): strings and
/// binaries stored as offsets become views into the block's buffer, 64-bit decimals widen,
/// string views of format 1 (decoded as binary views) are checked to be UTF-8, and
/// dictionaries are rebuilt from their values.
pub(super) fn from_stored(columns: &[ArrayRef], fields: &[Arc<Field>]) -> Result<Vec<ArrayRef>> {
    (columns.iter().zip(fields))
        .map(|(column, field)| {
            let column = match (column.data_type(), stored_type_v1(field.data_type())) {
                (DataType::BinaryView, DataType::Utf8View) => {
                    Arc::new(utf8_view(column.as_binary_view().clone())?) as ArrayRef
                }
                (DataType::Utf8, DataType::Utf8View) => {
                    Arc::new(string_views(column.as_string::<i32>())) as ArrayRef
                }
                (DataType::Binary, DataType::BinaryView) => {
                    let array = column.as_binary::<i32>();
                    let views = offsets_to_views(array.offsets(), array.values());
                    let views = match views {
                        Some(views) => BinaryViewArray::try_new(
                            views,
                            vec![array.values().clone()],
                            array.nulls().cloned(),
                        )?,
                        None => BinaryViewArray::from(array),
                    };
                    Arc::new(views) as ArrayRef
                }
                (DataType::Decimal64(..), DataType::Decimal128(precision, scale)) => {
                    let wide: Decimal128Array =
                        column.as_primitive::<Decimal64Type>().unary(i128::from);
                    Arc::new(wide.with_precision_and_scale(precision, scale)?) as ArrayRef
                }
                _ => column.clone(),
            };
            if column.data_type() == field.data_type() {
                Ok(column)
            } else {
                Ok(arrow_cast::cast_with_options(
                    &column,
                    field.data_type(),
                    &EXACT,
                )?)
            }
        })
        .collect()
}

/// Views of the values between `offsets`, all in one buffer (`values`, buffer 0): inline
/// for values of 12 bytes or less, else its first 4 bytes and place. `None` for a buffer
/// longer than a view can point into (4 GiB).
fn offsets_to_views(offsets: &OffsetBuffer<i32>, values: &[u8]) -> Option<ScalarBuffer<u128>> {
    u32::try_from(values.len()).ok()?;
    let views: Vec<u128> = (offsets.windows(2))
        .map(|w| {
            // Offsets of a valid array: rising, within `values`.
            let (start, end) = (w[0] as usize, w[1] as usize);
            let len = end - start;
            // The value's first 16 bytes, zero past the buffer's end: one load in the
            // common case instead of a copy of each short value.
            let word = match values.get(start..start + 16) {
                Some(word) => <[u8; 16]>::try_from(word).map_or(0, u128::from_le_bytes),
                None => {
                    let mut word = [0u8; 16];
                    let tail = &values[start..];
                    word[..tail.len()].copy_from_slice(tail);
                    u128::from_le_bytes(word)
                }
            };
            if len <= MAX_INLINE_VIEW_LEN as usize {
                let data = word & ((1u128 << (8 * len)) - 1);
                len as u128 | (data << 32)
            } else {
                // Buffer 0, at `start`; the prefix is the value's first 4 bytes.
                len as u128 | (u128::from(word as u32) << 32) | ((start as u128) << 96)
            }
        })
        .collect();
    Some(ScalarBuffer::from(views))
}

/// `array` (validated when the block was decoded: UTF-8 throughout, every offset on a
/// character boundary) as string views into its buffer.
#[expect(unsafe_code, reason = "views of a validated string array; see SAFETY")]
fn string_views(array: &StringArray) -> StringViewArray {
    let Some(views) = offsets_to_views(array.offsets(), array.values()) else {
        return StringViewArray::from(array);
    };
    // SAFETY: each view describes the bytes between two consecutive offsets of `array`
    // (inline, zero-padded, for 12 bytes or less; else buffer 0 at the first offset, with
    // the value's first 4 bytes as prefix), and `values.len()` fits in u32. `array` was
    // built by the IPC decoder with full validation (never `with_skip_validation`):
    // offsets rise within the values buffer and fall on character boundaries of UTF-8
    // text, so every view lies within buffer 0 and holds valid UTF-8.
    unsafe {
        StringViewArray::new_unchecked(views, vec![array.values().clone()], array.nulls().cloned())
    }
}

/// The bytes [`from_stored`] allocated to make `column`: the views (their data stays in the
/// block's buffer) or widened decimals, 16 bytes a value, and its null buffer; all of a
/// rebuilt dictionary.
pub(super) fn made_bytes(column: &dyn Array) -> usize {
    match column.data_type() {
        DataType::Dictionary(..) => column.get_array_memory_size(),
        _ => column.len() * 16 + column.nulls().map_or(0, |n| n.buffer().len()),
    }
}

/// High bit of each of the 12 bytes after a view's length: an inline value and its padding.
const INLINE_HIGH_BITS: u128 = 0x8080_8080_8080_8080_8080_8080 << 32;

/// `array` as strings, checked to be UTF-8.
///
/// Checking each value, as arrow does, was about a sixth of reading a block of lineitem.
/// Text that is ASCII throughout (every data buffer, and every inline value) is checked
/// here a word at a time instead; other text gets arrow's check of every value.
pub(super) fn utf8_view(array: BinaryViewArray) -> Result<StringViewArray> {
    // Branch-free, so that it vectorizes: the high bits of every inline view, or-ed.
    let inline_high_bits = (array.views().iter()).fold(0u128, |bits, &view| {
        let inline = u128::from(view as u32 <= MAX_INLINE_VIEW_LEN);
        bits | ((view & INLINE_HIGH_BITS) * inline)
    });
    let inline_ascii = inline_high_bits == 0;
    let buffers_ascii = (array.data_buffers().iter()).all(|buffer| buffer.as_slice().is_ascii());
    if !(inline_ascii && buffers_ascii) {
        return Ok(array.to_string_view()?);
    }
    Ok(ascii_to_string_view(array))
}

/// `array`, found ASCII throughout by [`utf8_view`], as strings.
#[expect(
    unsafe_code,
    reason = "UTF-8 shown by the caller for the whole array; see SAFETY"
)]
fn ascii_to_string_view(array: BinaryViewArray) -> StringViewArray {
    // SAFETY: the array is a valid binary view array (the decoder validated its views: every
    // non-inline value lies within a data buffer, every inline one is zero-padded), and
    // `utf8_view` found all its data buffers ASCII and every inline value too (its bytes, and
    // the zero padding, have no high bit set): each value is ASCII, hence UTF-8.
    unsafe { array.to_string_view_unchecked() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decimal_with_more_digits_than_its_precision_is_refused_naming_its_column() {
        let bad = Decimal128Array::from(vec![Some(5), None, Some(i128::from(i64::MAX) + 1)])
            .with_precision_and_scale(15, 2)
            .unwrap();
        let err = narrow_decimals(&bad, 15, 2, "l_price").unwrap_err();
        assert!(matches!(err, Error::InvalidValue { .. }), "{err}");
        assert!(err.to_string().contains("l_price"), "{err}");
        // Under a null, a slot's value means nothing: it is not looked at.
        let nulls = arrow_buffer::NullBuffer::from(vec![true, false, true]);
        let fine = Decimal128Array::new(vec![5, i128::MAX, -7].into(), Some(nulls))
            .with_precision_and_scale(15, 2)
            .unwrap();
        let narrow = narrow_decimals(&fine, 15, 2, "l_price").unwrap();
        let narrow = narrow.as_primitive::<Decimal64Type>();
        assert_eq!(narrow.iter().collect::<Vec<_>>(), [Some(5), None, Some(-7)]);
    }

    #[test]
    fn value_bytes_count_the_rows_values_in_every_layout() {
        use arrow_array::types::{Int8Type, UInt16Type};
        use arrow_array::{DictionaryArray, LargeStringArray};
        let values = [
            "",
            "a",
            "twelve bytes",
            "a value longer than twelve bytes",
            "b",
        ];
        let rows: Vec<&str> = (0..40)
            .map(|i| values[(i * 7 + i / 3) % values.len()])
            .collect();
        let expected = |start: usize, len: usize| -> usize {
            rows[start..start + len].iter().map(|v| v.len()).sum()
        };
        let dictionary_values = StringArray::from_iter_values(values);
        let keys: Vec<usize> = (rows.iter())
            .map(|r| values.iter().position(|v| v == r).unwrap())
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(&rows)),
            Arc::new(StringViewArray::from_iter_values(&rows)),
            Arc::new(LargeStringArray::from_iter_values(&rows)),
            Arc::new(BinaryViewArray::from_iter_values(
                rows.iter().map(|r| r.as_bytes()),
            )),
            Arc::new(DictionaryArray::<Int8Type>::new(
                keys.iter().map(|&k| k as i8).collect(),
                Arc::new(dictionary_values.clone()),
            )),
            Arc::new(DictionaryArray::<UInt16Type>::new(
                keys.iter().map(|&k| k as u16).collect(),
                Arc::new(StringViewArray::from_iter_values(values)),
            )),
        ];
        for column in &columns {
            for (start, len) in [(0, 40), (0, 1), (3, 17), (39, 1), (10, 0)] {
                assert_eq!(
                    value_bytes(column.as_ref(), start, len),
                    expected(start, len),
                    "{} rows {start}..+{len}",
                    column.data_type()
                );
            }
            // A slice counts from its own first row.
            let sliced = column.slice(5, 20);
            assert_eq!(value_bytes(sliced.as_ref(), 2, 10), expected(7, 10));
        }
    }

    #[test]
    fn string_views_of_format_1_are_checked_for_plain_and_dictionary_columns() {
        let broken: ArrayRef = Arc::new(BinaryViewArray::from_iter_values([
            b"fine".as_slice(),
            b"out of line and broken \xc3",
        ]));
        let fine: ArrayRef = Arc::new(BinaryViewArray::from_iter_values([
            "fine".as_bytes(),
            "out of line, grüße".as_bytes(),
        ]));
        let dictionary =
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View));
        for data_type in [DataType::Utf8View, dictionary] {
            let field = vec![Arc::new(Field::new("v", data_type.clone(), true))];
            let err = from_stored(std::slice::from_ref(&broken), &field).unwrap_err();
            assert!(err.to_string().contains("UTF-8"), "{data_type}: {err}");
            let read = from_stored(std::slice::from_ref(&fine), &field).unwrap();
            assert_eq!(read[0].data_type(), &data_type);
            let read = arrow_cast::cast(&read[0], &DataType::Utf8View).unwrap();
            let strings: Vec<_> = read.as_string_view().iter().flatten().collect();
            assert_eq!(strings, ["fine", "out of line, grüße"], "{data_type}");
        }
    }

    #[test]
    fn utf8_view_checks_what_is_not_ascii() {
        let check = |values: &[&[u8]]| {
            utf8_view(arrow_array::BinaryViewArray::from_iter_values(
                values.iter().copied(),
            ))
            .map(|strings| {
                strings
                    .iter()
                    .map(|s| s.unwrap().to_string())
                    .collect::<Vec<_>>()
            })
        };
        let long = b"long enough to be out of line";
        assert_eq!(
            check(&[b"a", long]).unwrap(),
            ["a", std::str::from_utf8(long).unwrap()]
        );
        assert_eq!(check(&["é".as_bytes(), long]).unwrap()[0], "é");
        assert_eq!(
            check(&["out of line, and ü".as_bytes()]).unwrap()[0],
            "out of line, and ü"
        );
        // Not UTF-8, inline or out of line: an error, never strings.
        assert!(check(&[b"\xff", long]).is_err());
        assert!(check(&[b"a", b"out of line and broken \xc3"]).is_err());
        assert!(check(&[b"twelve bytes", b"elevenbytes\x80"]).is_err());
    }

    mod kernels {
        use super::*;
        use proptest::prelude::*;
        use proptest::test_runner::{Config as ProptestConfig, RngSeed};

        /// Values of every shape a view takes: empty, inline (up to 12 bytes), just out of
        /// line, long; ASCII and not; and nulls.
        fn texts() -> impl Strategy<Value = Vec<Option<String>>> {
            let text = prop_oneof![
                Just(String::new()),
                "[a-z]{1,12}",
                "[a-z]{13,14}",
                "[a-zé€]{0,40}",
                "[ -~]{20,200}",
            ];
            prop::collection::vec(prop::option::weighted(0.9, text), 0..120)
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                rng_seed: RngSeed::Fixed(0x5701ed),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Strings and binaries, whole or sliced, are stored as arrow's cast stores
            /// them, and read back as the same values.
            #[test]
            fn views_store_as_offsets_and_read_back_equal(
                values in texts(),
                cut in (0usize..20, 0usize..20),
            ) {
                let all = StringViewArray::from(values.clone());
                let start = cut.0.min(all.len());
                let len = (all.len() - start).saturating_sub(cut.1);
                let strings: ArrayRef = Arc::new(all.slice(start, len));
                let binaries: ArrayRef = arrow_cast::cast(&strings, &DataType::BinaryView).unwrap();
                for (table, stored) in [
                    (strings, DataType::Utf8),
                    (binaries, DataType::Binary),
                ] {
                    let field = vec![Arc::new(Field::new("v", stored.clone(), true))];
                    let written = to_stored(std::slice::from_ref(&table), &field).unwrap();
                    let oracle = arrow_cast::cast(&table, &stored).unwrap();
                    prop_assert_eq!(&written[0], &oracle);
                    let field = vec![Arc::new(Field::new("v", table.data_type().clone(), true))];
                    let read = from_stored(&written, &field).unwrap();
                    prop_assert_eq!(&read[0], &table);
                    read[0].to_data().validate_full().unwrap();
                }
            }

            /// Decimals of precision 18 or less narrow to 64 bits and widen back unchanged.
            #[test]
            fn short_decimals_store_in_64_bits_and_read_back_equal(
                values in prop::collection::vec(
                    prop::option::weighted(0.9, -999_999_999_999_999i128..=999_999_999_999_999),
                    0..100,
                ),
            ) {
                let table: ArrayRef = Arc::new(
                    Decimal128Array::from(values).with_precision_and_scale(15, 2).unwrap(),
                );
                let field = vec![Arc::new(Field::new("v", DataType::Decimal64(15, 2), true))];
                let written = to_stored(std::slice::from_ref(&table), &field).unwrap();
                prop_assert_eq!(written[0].data_type(), &DataType::Decimal64(15, 2));
                let field = vec![Arc::new(Field::new("v", DataType::Decimal128(15, 2), true))];
                let read = from_stored(&written, &field).unwrap();
                prop_assert_eq!(&read[0], &table);
            }
        }
    }
}
