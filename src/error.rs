//! The engine's error type (the command-line tool has its own, which wraps this one).
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
    /// An I/O operation on a named file or directory failed.
    #[error("{}: {source}", .path.display())]
    File {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Messages in an order the receiver does not accept: a chunk before the first barrier,
    /// anything after a `Stop`, a stream that does not start with a barrier.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A stream chunk violates the chunk rules (ops length, U-/U+ pairing, ...).
    #[error("invalid chunk: {0}")]
    InvalidChunk(String),
    /// A value breaks its column's declared type: a decimal with more digits than its
    /// precision allows.
    #[error("column `{column}`: {message}")]
    InvalidValue {
        /// The column.
        column: String,
        /// What is wrong with which value.
        message: String,
    },
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
    /// An upstream change that does not fit the table it changes (the job's checks, see
    /// `BackfillJob`): a duplicate insert, a delete or update of a key the table does not
    /// hold, old values that differ from the stored row.
    #[error("bad upstream change in epoch {epoch} at key {key}: {problem}")]
    BadChange {
        /// The job's epoch the change was sent in.
        epoch: u64,
        /// The key columns and values of the row.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A job identity already used with another definition (table, columns, key, vnodes):
    /// a job resumes only the work it started.
    #[error(
        "job `{job}` was started with another definition: {differences}; use a new job identity for a new view (or reset this one)"
    )]
    JobDefinition {
        /// The job identity.
        job: String,
        /// What differs, stored against given.
        differences: String,
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
    /// A directory is locked by another process (or another store in this one).
    #[error("{}: in use by {holder}; wait for it to finish or stop it first", .path.display())]
    Locked {
        /// The lock file.
        path: std::path::PathBuf,
        /// Who holds it, as far as known (`process 1234`).
        holder: String,
    },
    /// An earlier I/O failure left the store's on-disk state unknown: reopen it.
    #[error("the store failed and must be reopened: {0}")]
    StoreFailed(String),
    /// A sink ([`ExactlyOnceSink`](crate::ExactlyOnceSink)) failed: its own error, boxed.
    #[error("{0}")]
    Sink(Box<dyn std::error::Error + Send + Sync>),
    /// A broken internal invariant: a bug in this crate.
    #[error("internal error: {0}")]
    Internal(String),
}

/// An [`Error::Internal`] with a `format!` message: `internal!("vnode {vnode} vanished")`.
macro_rules! internal {
    ($($arg:tt)*) => {
        $crate::error::Error::Internal(format!($($arg)*))
    };
}
pub(crate) use internal;

/// The engine's errors flow through Arrow interfaces (a `RecordBatchReader`, the C stream):
/// an Arrow error comes back as itself, anything else as an external error keeping its
/// source chain.
impl From<Error> for ArrowError {
    fn from(error: Error) -> Self {
        match error {
            Error::Arrow(e) => e,
            other => ArrowError::ExternalError(Box::new(other)),
        }
    }
}

impl Error {
    /// True for errors caused by bad input (a table definition, a chunk, an upstream change,
    /// an option out of range, messages out of order, a locked or corrupt store) rather than
    /// by the system: the caller's to fix.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::SchemaMismatch { .. }
                | Error::UnknownColumn { .. }
                | Error::InvalidChunk(_)
                | Error::InvalidValue { .. }
                | Error::UnsupportedType { .. }
                | Error::CorruptState { .. }
                | Error::Locked { .. }
                | Error::InvalidConfig(_)
                | Error::Protocol(_)
                | Error::BadChange { .. }
                | Error::JobDefinition { .. }
        )
    }

    /// An [`Error::File`]: `source` happened on `path`.
    pub fn file(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        Error::File {
            path: path.into(),
            source,
        }
    }

    /// An [`Error::InvalidValue`]: `value` (unscaled) of `column` has more digits than its
    /// type `decimal(precision, scale)` allows.
    pub(crate) fn decimal_too_long(column: &str, value: i128, precision: u8, scale: i8) -> Self {
        Error::InvalidValue {
            column: column.to_string(),
            message: format!(
                "{value} (unscaled) has more digits than its type decimal({precision}, {scale}) \
                 allows"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_become_arrow_errors() {
        let arrow = ArrowError::ComputeError("x".into());
        assert!(matches!(
            ArrowError::from(Error::Arrow(arrow)),
            ArrowError::ComputeError(_)
        ));
        let e = ArrowError::from(Error::Protocol("no barrier".into()));
        let ArrowError::ExternalError(inner) = e else {
            panic!("expected an external error");
        };
        assert!(matches!(
            inner.downcast_ref::<Error>(),
            Some(Error::Protocol(_))
        ));
        assert_eq!(internal!("v{}", 1).to_string(), "internal error: v1");
    }

    #[test]
    fn file_errors_name_the_path_and_keep_the_source() {
        let source =
            std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device");
        let e = Error::file("/d/x.parquet", source);
        assert_eq!(e.to_string(), "/d/x.parquet: No space left on device");
        assert!(std::error::Error::source(&e).is_some());
        assert!(!e.is_bad_input());
        assert!(Error::InvalidConfig("x".into()).is_bad_input());
        assert!(Error::Protocol("x".into()).is_bad_input());
    }
}
