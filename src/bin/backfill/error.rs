//! The tool's error type: the engine's errors, and what only the tool has (datasets, a state
//! that belongs to another job, signals, the completion certificate, scratch files), each
//! with the exit status it maps to.

use arrow_schema::ArrowError;
use parquet::errors::ParquetError;

/// The engine's error.
pub use arrangement_backfill::Error as EngineError;

/// `Result` with the tool's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the tool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the engine (the store, the backfill, a chunk, an option).
    #[error(transparent)]
    Engine(EngineError),
    /// A dataset (docs/DESIGN.md section 10.1) or a replay's output that is malformed or
    /// inconsistent: a missing or malformed manifest, an unreadable Parquet file, a NULL or
    /// duplicate key, an unknown op, a decreasing epoch, a lone update half, a delete of an
    /// absent row, ...
    #[error(
        "{}: {}{message}{}",
        .path.display(),
        location_prefix(.location),
        source_suffix(.source.as_deref())
    )]
    Dataset {
        /// The file at fault (or the dataset directory).
        path: std::path::PathBuf,
        /// Where in the file: `"row 17"`, `"epoch 5, row 3"`, or empty when it is the whole
        /// file. Rows are counted from 0 within the file.
        location: String,
        /// What is wrong.
        message: String,
        /// The error underneath, when there is one (a Parquet decoding error, for example);
        /// also printed after the message.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A state directory that belongs to another job (another dataset, key or vnode count).
    #[error("{}: {message}", .path.display())]
    StateConflict {
        /// The state directory.
        path: std::path::PathBuf,
        /// What differs.
        message: String,
    },
    /// The job was stopped by a signal; committed checkpoints stay and the job resumes from
    /// them when run again.
    #[error(
        "interrupted by {signal}: {}; run the same command again to resume",
        match .committed {
            Some(e) => format!("the state is committed up to epoch {e}"),
            None => "nothing was committed by this run".to_string(),
        }
    )]
    Interrupted {
        /// The signal's name.
        signal: &'static str,
        /// The exit status to use (128 + the signal number).
        code: u8,
        /// The committed epoch at the stop.
        committed: Option<u64>,
    },
    /// The completion certificate failed: per vnode, the output does not net to the table the
    /// dataset ends with. The output is left as it is for inspection; exit status 3.
    #[error("{}: certificate MISMATCH: {message}", .out.display())]
    CertificateMismatch {
        /// The output directory.
        out: std::path::PathBuf,
        /// Which vnodes differ, and by how much.
        message: String,
    },
    /// A scratch file of an external sort (validation, verification) could not be created,
    /// written or read: a missing scratch directory, a full disk, ...
    #[error("scratch file {}: {source}{}", .path.display(), scratch_hint(.source.as_ref()))]
    Scratch {
        /// The scratch file or directory.
        path: std::path::PathBuf,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// An engine error; the tool's own errors come back from the engine's sink error as
/// themselves (see [`Error::into_engine`]).
impl From<EngineError> for Error {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Sink(source) => match source.downcast::<Error>() {
                Ok(tool) => *tool,
                Err(other) => Error::Engine(EngineError::Sink(other)),
            },
            other => Error::Engine(other),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Engine(EngineError::Io(error))
    }
}

impl From<ParquetError> for Error {
    fn from(error: ParquetError) -> Self {
        Error::Engine(EngineError::Parquet(error))
    }
}

impl From<ArrowError> for Error {
    fn from(error: ArrowError) -> Self {
        Error::Engine(EngineError::Arrow(error))
    }
}

/// The tool's errors flow through Arrow interfaces too (a dataset's `RecordBatchReader`).
impl From<Error> for ArrowError {
    fn from(error: Error) -> Self {
        match error {
            Error::Engine(e) => e.into(),
            other => ArrowError::ExternalError(Box::new(other)),
        }
    }
}

/// For a full disk: how to point the scratch elsewhere.
fn scratch_hint(source: &(dyn std::error::Error + Send + Sync + 'static)) -> &'static str {
    let full = std::iter::successors(Some(source as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .filter_map(|e| e.downcast_ref::<std::io::Error>())
    .any(|e| e.kind() == std::io::ErrorKind::StorageFull);
    if full {
        "; the scratch's disk is full: point the scratch at a disk with room with --tmp DIR \
         (or TMPDIR=DIR)"
    } else {
        ""
    }
}

/// `": {source}"`, or nothing without a source.
fn source_suffix(source: Option<&(dyn std::error::Error + Send + Sync)>) -> String {
    source.map(|e| format!(": {e}")).unwrap_or_default()
}

/// `"{location}: "`, or nothing for an empty location.
fn location_prefix(location: &str) -> String {
    if location.is_empty() {
        String::new()
    } else {
        format!("{location}: ")
    }
}

/// An engine `Internal` error with a `format!` message: a broken invariant of the tool.
macro_rules! internal {
    ($($arg:tt)*) => {
        $crate::error::Error::Engine($crate::error::EngineError::Internal(format!($($arg)*)))
    };
}
pub(crate) use internal;

impl Error {
    /// True for errors caused by bad input (a dataset, an option, a state or output of
    /// another job): exit status 2.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Engine(e) => e.is_bad_input(),
            Error::Dataset { .. } | Error::StateConflict { .. } => true,
            Error::Interrupted { .. }
            | Error::CertificateMismatch { .. }
            | Error::Scratch { .. } => false,
        }
    }

    /// The exit status for this error: 2 for bad input, 3 for a completion certificate
    /// mismatch, 128 + the signal for an interruption, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Interrupted { code, .. } => *code,
            Error::CertificateMismatch { .. } => 3,
            e if e.is_bad_input() => 2,
            _ => 1,
        }
    }

    /// This error as the engine's, for the library's interfaces the tool implements (its
    /// sink): an engine error as itself, the tool's own as the engine's sink error, which
    /// [`From<EngineError>`] turns back into this.
    pub fn into_engine(self) -> EngineError {
        match self {
            Error::Engine(e) => e,
            other => EngineError::Sink(Box::new(other)),
        }
    }

    /// An engine `InvalidConfig` error: an option out of range or inconsistent.
    pub fn config(message: String) -> Self {
        Error::Engine(EngineError::InvalidConfig(message))
    }

    /// An engine `File` error: `source` happened on `path`.
    pub fn file(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        Error::Engine(EngineError::file(path, source))
    }

    /// An [`Error::Scratch`] error.
    pub fn scratch(
        path: impl Into<std::path::PathBuf>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Scratch {
            path: path.into(),
            source: source.into(),
        }
    }

    /// An [`Error::Dataset`] error.
    pub fn dataset(
        path: impl Into<std::path::PathBuf>,
        location: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Dataset {
            path: path.into(),
            location: location.into(),
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Dataset`] error caused by `source` (kept as the error's source, and
    /// printed after `message`).
    pub fn dataset_caused_by(
        path: impl Into<std::path::PathBuf>,
        location: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Dataset {
            path: path.into(),
            location: location.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_error_names_file_and_location() {
        let e = Error::dataset(
            "/d/changes/a.parquet",
            "epoch 5, row 3",
            "unknown op code 9",
        );
        assert_eq!(
            e.to_string(),
            "/d/changes/a.parquet: epoch 5, row 3: unknown op code 9"
        );
        let e = Error::dataset("/d/dataset.json", "", "missing");
        assert_eq!(e.to_string(), "/d/dataset.json: missing");
        assert!(e.is_bad_input());
        assert_eq!(e.exit_code(), 2);
        assert_eq!(internal!("x").exit_code(), 1);
    }

    #[test]
    fn dataset_errors_keep_their_parquet_source() {
        let source = ParquetError::General("bad footer".into());
        let e = Error::dataset_caused_by("/d/x.parquet", "", "unreadable Parquet file", source);
        assert_eq!(
            e.to_string(),
            "/d/x.parquet: unreadable Parquet file: Parquet error: bad footer"
        );
        let inner = std::error::Error::source(&e).expect("a source");
        assert!(inner.downcast_ref::<ParquetError>().is_some());
        assert!(e.is_bad_input());
    }

    #[test]
    fn the_tools_errors_come_back_through_the_engine() {
        let e = Error::dataset("/d/x.parquet", "row 3", "bad");
        let back = Error::from(e.into_engine());
        assert!(matches!(back, Error::Dataset { .. }), "{back}");
        let engine = Error::config("x".into()).into_engine();
        assert!(matches!(engine, EngineError::InvalidConfig(_)));
    }

    #[test]
    fn a_full_scratch_disk_says_how_to_point_the_scratch_elsewhere() {
        let full = std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device");
        let e = Error::scratch("/tmp/backfill-sort-1/run-3", full);
        let text = e.to_string();
        assert!(text.contains("/tmp/backfill-sort-1/run-3"), "{text}");
        assert!(text.contains("--tmp DIR"), "{text}");
        let other = Error::scratch("/x", std::io::Error::other("bad"));
        assert!(!other.to_string().contains("--tmp"), "{other}");
    }

    #[test]
    fn engine_errors_keep_their_messages_and_statuses() {
        let e = Error::config("batch size 0".into());
        assert_eq!(e.to_string(), "invalid configuration: batch size 0");
        assert_eq!(e.exit_code(), 2);
        let mismatch = Error::CertificateMismatch {
            out: "o".into(),
            message: "x".into(),
        };
        assert_eq!(mismatch.exit_code(), 3);
    }
}
