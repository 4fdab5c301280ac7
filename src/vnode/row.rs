//! The per-row reference of the vnode hash: one [`crc32fast::Hasher`] per row, fed value by
//! value from the contract table. Bit-identical to the vectorized path (a differential test
//! checks it), much slower: the baseline of `benches/vnode.rs`.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType, DurationMillisecondType,
    DurationNanosecondType, DurationSecondType, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, Time32MillisecondType, Time32SecondType,
    Time64MicrosecondType, Time64NanosecondType, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};

use crate::error::{Error, Result};

use super::{
    BYTES_TERMINATOR, NULL_MARKER, VirtualNode, VnodeCount, column_name, is_hashable, unsupported,
};

// ---------------------------------------------------------------------------------------------
// Per-row reference
// ---------------------------------------------------------------------------------------------

/// The CRC-32 of one row's distribution-key values: the plain reference, one
/// [`crc32fast::Hasher`] fed value by value. Bit-identical to [`hash_rows`](super::hash_rows), much slower.
///
/// Errors: [`Error::UnsupportedType`] for a type outside the contract, [`Error::InvalidChunk`]
/// if `row` is beyond a column.
pub fn hash_row(columns: &[ArrayRef], row: usize) -> Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    for (i, column) in columns.iter().enumerate() {
        if row >= column.len() {
            return Err(Error::InvalidChunk(format!(
                "row {row} is beyond {}, which has {} rows",
                column_name(i),
                column.len()
            )));
        }
        let bytes = value_bytes(column.as_ref(), row)
            .ok_or_else(|| unsupported(column_name(i), column.data_type()))?;
        hasher.update(&bytes);
    }
    Ok(hasher.finalize())
}

/// The vnode of one row: the per-row reference of [`compute_vnodes`](super::compute_vnodes).
pub fn vnode_of_row(columns: &[ArrayRef], row: usize, count: VnodeCount) -> Result<VirtualNode> {
    if columns.is_empty() {
        return Ok(VirtualNode::ZERO);
    }
    let crc = hash_row(columns, row)?;
    let vnode = crc % count.0 as u32;
    // `vnode < count <= 32768`.
    Ok(VirtualNode(vnode as u16))
}

/// The bytes one value contributes to its row's CRC, written straight from the contract table;
/// `None` for an unsupported type. `row` is in bounds.
fn value_bytes(array: &dyn Array, row: usize) -> Option<Vec<u8>> {
    use DataType::*;
    let data_type = array.data_type();
    if !is_hashable(data_type) {
        return None;
    }
    if *data_type == Null || array.is_null(row) {
        return Some(NULL_MARKER.to_le_bytes().to_vec());
    }
    fn terminated(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out.push(BYTES_TERMINATOR);
        out
    }
    // A primitive value's little-endian bytes.
    macro_rules! le {
        ($t:ty) => {
            array.as_primitive::<$t>().value(row).to_le_bytes().to_vec()
        };
    }
    let bytes = match data_type {
        Boolean => vec![u8::from(array.as_boolean().value(row))],
        Int8 => le!(Int8Type),
        Int16 => le!(Int16Type),
        Int32 => le!(Int32Type),
        Int64 => le!(Int64Type),
        UInt8 => le!(UInt8Type),
        UInt16 => le!(UInt16Type),
        UInt32 => le!(UInt32Type),
        UInt64 => le!(UInt64Type),
        Float16 => {
            let v = array.as_primitive::<Float16Type>().value(row);
            let wide = v.to_f32();
            let bits: u16 = if wide.is_nan() {
                0x7E00
            } else if wide == 0.0 {
                0
            } else {
                v.to_bits()
            };
            bits.to_le_bytes().to_vec()
        }
        Float32 => {
            let v = array.as_primitive::<Float32Type>().value(row);
            let v = if v.is_nan() {
                f32::NAN
            } else if v == 0.0 {
                0.0
            } else {
                v
            };
            v.to_le_bytes().to_vec()
        }
        Float64 => {
            let v = array.as_primitive::<Float64Type>().value(row);
            let v = if v.is_nan() {
                f64::NAN
            } else if v == 0.0 {
                0.0
            } else {
                v
            };
            v.to_le_bytes().to_vec()
        }
        Date32 => le!(Date32Type),
        Date64 => le!(Date64Type),
        Time32(TimeUnit::Second) => le!(Time32SecondType),
        Time32(TimeUnit::Millisecond) => le!(Time32MillisecondType),
        Time64(TimeUnit::Microsecond) => le!(Time64MicrosecondType),
        Time64(TimeUnit::Nanosecond) => le!(Time64NanosecondType),
        Timestamp(TimeUnit::Second, _) => le!(TimestampSecondType),
        Timestamp(TimeUnit::Millisecond, _) => le!(TimestampMillisecondType),
        Timestamp(TimeUnit::Microsecond, _) => le!(TimestampMicrosecondType),
        Timestamp(TimeUnit::Nanosecond, _) => le!(TimestampNanosecondType),
        Duration(TimeUnit::Second) => le!(DurationSecondType),
        Duration(TimeUnit::Millisecond) => le!(DurationMillisecondType),
        Duration(TimeUnit::Microsecond) => le!(DurationMicrosecondType),
        Duration(TimeUnit::Nanosecond) => le!(DurationNanosecondType),
        Decimal128(_, _) => le!(Decimal128Type),
        Utf8 => terminated(array.as_string::<i32>().value(row).as_bytes()),
        LargeUtf8 => terminated(array.as_string::<i64>().value(row).as_bytes()),
        Utf8View => terminated(array.as_string_view().value(row).as_bytes()),
        Binary => terminated(array.as_binary::<i32>().value(row)),
        LargeBinary => terminated(array.as_binary::<i64>().value(row)),
        BinaryView => terminated(array.as_binary_view().value(row)),
        _ => return None,
    };
    Some(bytes)
}
