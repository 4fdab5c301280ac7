//! Run files: sorted runs of one table as Arrow IPC files, with checksums and a block index.
//!
//! A run file is a standard Arrow IPC file (pyarrow's `pa.ipc.open_file` reads it) whose
//! schema is the table's columns plus a non-null Boolean `__deleted` column (tombstones of
//! delta runs; always false in a base run). Columns are stored in as few bytes as Arrow
//! allows for the same values ([`stored_type`]): string and binary views as offsets and
//! bytes, decimals of precision 18 or less in 64 bits, dictionaries as their values (a
//! lineitem row takes 146 bytes instead of 218, IPC framing included). Files of format 1,
//! which stored every column as the table holds it, are still read. Each record batch holds
//! at most [`SEGMENT_ROWS`] rows. The index lists *blocks*: rows of **one** vnode, sorted by key,
//! each a whole record batch or, for runs shorter than [`MIN_BLOCK_ROWS`] rows, a row range
//! of a record batch shared with other short runs (a *packed* batch: an epoch touching
//! 32768 vnodes a row each writes a few record batches, not 32768). Consecutive blocks of a
//! vnode form a *run* (the manifest names runs as `(file, first block, block count)`).
//!
//! ```text
//!   ARROW1 | schema message | batch 0 | batch 1 | ... | EOS | footer | len | ARROW1
//!   └──── header ─────────┘                            └──────── tail ─────────┘
//!   footer custom metadata:
//!     arrangement_backfill.index       hex of an Arrow IPC stream, one row per block:
//!                                      vnode u16, rows u32, offset u64, len u64, crc u32
//!                                      (of the record batch holding the block),
//!                                      start u32 (the block's first row in that batch),
//!                                      key_0.. = the block's last primary key (typed;
//!                                      dictionaries as their values)
//!     arrangement_backfill.header_crc  CRC-32 of the header bytes
//! ```
//!
//! Blocks of one packed batch are consecutive in the index, with the same offset, length
//! and CRC, and starts that follow each other from 0. Files written before packing have no
//! `start` column (every block is a whole batch) and are read as such.
//!
//! Integrity: the manifest records each file's size and the CRC-32 of its tail, checked when
//! the file is opened (so the index and header CRC are trusted); the header is checked
//! against its CRC at open too, and each block against its own CRC whenever it is read.
//! Every byte of the file is covered: corruption is an error naming the file, never data.
//! Keys in the index are typed values (arrow-row bytes are not a persisted format) and are
//! encoded with the table's key converter on open.
//!
//! The code follows the file's parts: [`writer`] writes a file block by block (cutting
//! rows into blocks, packing short runs), [`reader`] opens one (checking its size, tail and
//! header) and loads its blocks, and [`index`] encodes and decodes the block index the
//! footer carries; the round trips through both are tested in `tests.rs`. This module holds
//! what they share: the file's schema, the block sizes, where a run lies in a file
//! ([`RunSpan`]) and what the manifest checks a file with ([`FileCheck`]).

mod index;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

pub(crate) use self::index::{hex_decode, hex_encode};
pub(crate) use self::reader::{Chain, DiskRun, RunFile};
pub(crate) use self::writer::RunFileWriter;

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::stored::{stored_type, stored_type_v1};
#[cfg(doc)]
use crate::runs::SEGMENT_ROWS;
use crate::vnode::VirtualNode;

/// The tombstone column appended to every run file's schema.
pub(crate) const DELETED_COLUMN: &str = "__deleted";
const INDEX_KEY: &str = "arrangement_backfill.index";
const HEADER_CRC_KEY: &str = "arrangement_backfill.header_crc";

/// The target size of a block in memory: 128 KiB (about a thousand lineitem rows). Against 64 KiB,
/// a scale-1 vnode-order replay takes 6% less CPU (half the blocks to cut, index, check,
/// decode, key-encode and cache; fewer, longer slices to gather), merged order the same time
/// for 17 MB more peak memory (a merge holds a block per source per vnode); see
/// `docs/benchmarks-history.md`.
pub(crate) const BLOCK_BYTES: usize = 128 << 10;
/// The fewest rows in a block (unless the run is shorter).
pub(crate) const MIN_BLOCK_ROWS: usize = 64;

/// The schema of a run file of `table`: its columns as [`stored_type`] stores them, and the
/// tombstone column.
pub(crate) fn file_schema(table: &Schema) -> SchemaRef {
    schema_with(table, stored_type)
}

/// The schema of a run file of `table` in format 1 ([`stored_type_v1`]).
fn file_schema_v1(table: &Schema) -> SchemaRef {
    schema_with(table, stored_type_v1)
}

fn schema_with(table: &Schema, stored: fn(&DataType) -> DataType) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = (table.fields().iter())
        .map(|f| Arc::new(f.as_ref().clone().with_data_type(stored(f.data_type()))))
        .collect();
    fields.push(Arc::new(Field::new(
        DELETED_COLUMN,
        DataType::Boolean,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// What the manifest records about a file to check it on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileCheck {
    /// Total length in bytes.
    pub size: u64,
    /// Length of the tail (EOS, footer, footer length, magic).
    pub tail_len: u64,
    /// CRC-32 of the tail.
    pub tail_crc: u32,
}

/// A run inside a file: `count` blocks of `vnode` from block `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunSpan {
    /// The vnode.
    pub vnode: VirtualNode,
    /// The first block.
    pub first: u32,
    /// The number of blocks.
    pub count: u32,
    /// The rows (tombstones included).
    pub rows: u64,
}
