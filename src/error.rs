//! The crate's one error type.
//!
//! Every fallible function returns [`Result`]. Messages say *what* went wrong and *where*
//! (table, vnode, epoch, column, file, row) so that a user can act on them without a debugger.
//! [`Error::Internal`] is reserved for broken invariants: seeing it is a bug in this crate.

use arrow_schema::{ArrowError, DataType};
use parquet::errors::ParquetError;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in arrangement-backfill.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
    /// Reading or writing Parquet failed.
    #[error("parquet: {0}")]
    Parquet(#[from] ParquetError),
    /// An I/O operation failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A column named in a table definition does not exist in its schema.
    #[error("column `{column}` is not in the schema of {context}")]
    UnknownColumn {
        /// The missing column.
        column: String,
        /// Where it was named (a table, a dataset, a file).
        context: String,
    },
    /// A column type cannot be used where it was asked for (as a distribution key, for example).
    #[error("column `{column}` has type {data_type}, which {usage} does not support")]
    UnsupportedType {
        /// The column.
        column: String,
        /// Its type.
        data_type: DataType,
        /// What it was used for ("vnode hashing", "a primary key").
        usage: &'static str,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A stream chunk violates the chunk rules (ops length, U-/U+ pairing, ...).
    #[error("invalid chunk: {0}")]
    InvalidChunk(String),
    /// A batch's schema is not the table's.
    #[error("schema mismatch for {context}: expected {expected}, found {found}")]
    SchemaMismatch {
        /// Which table or file.
        context: String,
        /// The schema that was required.
        expected: String,
        /// The schema that was given.
        found: String,
    },
    /// A table id that the store does not know.
    #[error("unknown table {0}")]
    UnknownTable(String),
    /// A table name that is already taken.
    #[error("table `{0}` already exists")]
    TableExists(String),
    /// An epoch that goes backwards or is otherwise out of order.
    #[error("epoch out of order in {context}: {epoch} after {previous}")]
    EpochOrder {
        /// Where the epoch was seen.
        context: String,
        /// The offending epoch.
        epoch: u64,
        /// The epoch it had to exceed.
        previous: u64,
    },
    /// A read at an epoch whose history was already compacted away.
    #[error("cannot read table `{table}` at epoch {epoch}: committed epoch is {committed}")]
    StaleRead {
        /// The table.
        table: String,
        /// The requested epoch.
        epoch: u64,
        /// The store's committed epoch, which is newer.
        committed: u64,
    },
    /// A row of a vnode the handle or executor does not own.
    #[error("vnode {vnode} is not owned by {owner}")]
    VnodeNotOwned {
        /// The vnode.
        vnode: u16,
        /// Who was asked (a table handle, a backfill executor).
        owner: String,
    },
    /// Snapshot rows that are not strictly increasing by key within a vnode: storage order and
    /// comparator order disagree, which would silently corrupt the backfill.
    #[error("snapshot order violated in table `{table}` vnode {vnode} at row {row}")]
    OrderViolation {
        /// The table.
        table: String,
        /// The vnode.
        vnode: u16,
        /// The row within the offending batch.
        row: usize,
    },
    /// Persisted state (progress, manifest) that cannot be decoded.
    #[error("corrupt state in {context}: {message}")]
    CorruptState {
        /// Where.
        context: String,
        /// What is wrong.
        message: String,
    },
    /// A broken internal invariant: a bug in this crate.
    #[error("internal error: {0}")]
    Internal(String),
}
