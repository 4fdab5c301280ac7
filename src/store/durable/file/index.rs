//! The block index of a run file: one row per block (its vnode, rows, place and checksum,
//! its first row in a packed batch, its last key as typed values), written as an Arrow IPC
//! stream, hex-encoded, in the footer's custom metadata (see the layout in [`super`]).
//! Encoding it for the writer, decoding and checking it for the reader.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{UInt16Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt16Array, UInt32Array, UInt64Array};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema};

use crate::error::Result;
use crate::table::TableDesc;
use crate::vnode::VirtualNode;

/// One block's place in the file.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockMeta {
    pub vnode: VirtualNode,
    pub rows: u32,
    /// The record batch holding the block.
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
    /// The block's first row in its batch.
    pub start: u32,
    /// The index of the first block of its batch (itself unless packed).
    pub batch: u32,
    /// The rows of its batch.
    pub batch_rows: u32,
}

/// The index as a batch (see the module docs).
pub(super) fn index_batch(
    blocks: &[BlockMeta],
    keys: &[ArrayRef],
    key_schema: &Schema,
) -> Result<RecordBatch> {
    let mut fields = vec![
        Field::new("vnode", DataType::UInt16, false),
        Field::new("rows", DataType::UInt32, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("len", DataType::UInt64, false),
        Field::new("crc", DataType::UInt32, false),
        Field::new("start", DataType::UInt32, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt16Array::from_iter_values(
            blocks.iter().map(|b| b.vnode.get()),
        )),
        Arc::new(UInt32Array::from_iter_values(blocks.iter().map(|b| b.rows))),
        Arc::new(UInt64Array::from_iter_values(
            blocks.iter().map(|b| b.offset),
        )),
        Arc::new(UInt64Array::from_iter_values(blocks.iter().map(|b| b.len))),
        Arc::new(UInt32Array::from_iter_values(blocks.iter().map(|b| b.crc))),
        Arc::new(UInt32Array::from_iter_values(
            blocks.iter().map(|b| b.start),
        )),
    ];
    for (i, (field, column)) in key_schema.fields().iter().zip(keys).enumerate() {
        fields.push(Field::new(
            format!("key_{i}"),
            field.data_type().clone(),
            true,
        ));
        columns.push(column.clone());
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// `batch` as an Arrow IPC stream.
pub(super) fn ipc_stream(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// Lower-case hex.
pub(crate) fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The inverse of [`hex_encode`]; `None` on a malformed string.
pub(crate) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The blocks and last keys of a decoded index, checked against the table and the bytes of
/// the file before its tail (`data_end`); what is wrong otherwise.
pub(super) fn parse_index(
    index: &RecordBatch,
    desc: &TableDesc,
    data_end: u64,
) -> std::result::Result<(Vec<BlockMeta>, Vec<ArrayRef>), String> {
    let key_fields = desc.pk().key_schema().fields().len();
    // Files written before packed batches have no `start` column.
    let fixed = if index.num_columns() == 6 + key_fields {
        6
    } else if index.num_columns() == 5 + key_fields {
        5
    } else {
        return Err("block index has the wrong number of columns".into());
    };
    let col = |i: usize, t: DataType| -> std::result::Result<&ArrayRef, String> {
        let c = index.column(i);
        if c.data_type() == &t && c.null_count() == 0 {
            Ok(c)
        } else {
            Err(format!("block index column {i} is malformed"))
        }
    };
    let vnode = col(0, DataType::UInt16)?
        .as_primitive::<UInt16Type>()
        .clone();
    let rows = col(1, DataType::UInt32)?
        .as_primitive::<UInt32Type>()
        .clone();
    let offset = col(2, DataType::UInt64)?
        .as_primitive::<UInt64Type>()
        .clone();
    let len = col(3, DataType::UInt64)?
        .as_primitive::<UInt64Type>()
        .clone();
    let crc = col(4, DataType::UInt32)?
        .as_primitive::<UInt32Type>()
        .clone();
    let start = if fixed == 6 {
        Some(
            col(5, DataType::UInt32)?
                .as_primitive::<UInt32Type>()
                .clone(),
        )
    } else {
        None
    };
    let mut blocks: Vec<BlockMeta> = Vec::with_capacity(index.num_rows());
    let mut end = 0u64;
    for i in 0..index.num_rows() {
        let mut b = BlockMeta {
            vnode: VirtualNode::new(vnode.value(i)),
            rows: rows.value(i),
            offset: offset.value(i),
            len: len.value(i),
            crc: crc.value(i),
            start: start.as_ref().map_or(0, |s| s.value(i)),
            batch: i as u32,
            batch_rows: rows.value(i),
        };
        let out_of_range = || format!("block index entry {i} is out of range");
        if b.vnode.index() >= desc.vnode_count().get() {
            return Err(out_of_range());
        }
        match blocks.last().copied() {
            // The next block of a packed batch: the same batch, the rows after the last.
            Some(prev) if prev.offset == b.offset && b.start > 0 => {
                if prev.len != b.len
                    || prev.crc != b.crc
                    || prev.start.checked_add(prev.rows) != Some(b.start)
                {
                    return Err(out_of_range());
                }
                b.batch = prev.batch;
                b.batch_rows = b.start.checked_add(b.rows).ok_or_else(out_of_range)?;
                let first = prev.batch as usize;
                for block in &mut blocks[first..] {
                    block.batch_rows = b.batch_rows;
                }
            }
            _ => {
                if b.start != 0
                    || b.offset < end
                    || b.offset.checked_add(b.len).is_none_or(|e| e > data_end)
                {
                    return Err(out_of_range());
                }
            }
        }
        end = b.offset + b.len;
        blocks.push(b);
    }
    let mut keys = Vec::with_capacity(key_fields);
    for (i, field) in desc.pk().decoded_schema().fields().iter().enumerate() {
        let c = index.column(fixed + i);
        if c.data_type() != field.data_type() {
            return Err(format!("block index key column {i} has the wrong type"));
        }
        keys.push(c.clone());
    }
    Ok((blocks, keys))
}
