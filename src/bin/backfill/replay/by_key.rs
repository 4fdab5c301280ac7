//! A snapshot and a changelog checked key by key, in memory bounded by a budget.
//!
//! Applying a changelog to a table only ever looks at one key at a time, so instead of holding
//! the table, [`KeyedChanges`] numbers every row in stream order (snapshot files, then change
//! files: the *sequence*), sorts the rows by key with an [`ExternalSorter`] (stably, so each
//! key's rows stay in sequence order), and [`KeyFold`] replays each key's rows strictly:
//!
//! ```text
//!   snapshot/a  row 0..  ─┐  seq 0..                      key 1: seq 0 (snapshot) 7 (U-) 8 (U+)
//!   snapshot/b  row 0..  ─┼─ seq ..    ──external sort──>  key 2: seq 1 (snapshot) 9 (-)
//!   changes/x   row 0..  ─┘  seq ..       by key           key 4: seq 5 (+) ...
//!                                                            │ fold each key (the rules of `apply`)
//!                                                            ▼
//!                                  the violation with the smallest sequence, its final rows
//! ```
//!
//! Because keys do not interact, the rows can also be split by a hash of their key into
//! partitions sorted and folded on their own, each on a thread ([`first_violation_of`]): the
//! validation uses one a core, so its last step (the fold, after the whole input is read)
//! does not leave the other cores idle. Verification compares two folds key by key in order,
//! so it keeps one.
//!
//! Each key's rows are folded with the rules of [`super::apply`]: snapshot row or insert/U+ of
//! an absent key, delete/U- of a present key with the same values. A table model stops at its
//! first violation in stream order; the keys do not interact, so that violation is the one
//! with the smallest sequence among each key's first violation, and that is the one reported,
//! with the file, the row within it and the epoch of the offending row (found again from the
//! sequence). Only the rows before a stream error (an unreadable file, a NULL key, an unknown
//! op, ...) are sorted: the caller reports a violation among them first, as a table model that
//! applied them one by one would have.
//!
//! # A snapshot in key order
//! A snapshot row whose key no change touches can only break one rule: a duplicate key. A
//! snapshot that comes in strictly increasing key order (as a dump of an arrangement does)
//! has none, so while it does, such rows need no sort:
//! [`KeyedChanges::skip_untouched_snapshot_rows`] leaves them out, given the hashes of
//! every key the changelog holds (`touched.rs`), and checks the order of each snapshot
//! batch as it comes (arrow-row keys, the order the fold compares in). The certificate
//! hashes still cover every row. If the order breaks (an unsorted snapshot, a duplicate),
//! the batch that breaks it waits: the rows left out before it are pushed again first
//! (the caller reads them again), so that every key's rows still reach the sort in
//! sequence order, and from there on every row is sorted, as without the skip. A lineitem
//! replay (6M snapshot rows, 1.2M changes touching 0.8M keys) sorts about a quarter of
//! the rows it did.
//!
//! What is kept per row besides the key, the sequence, the op and the epoch ([`Payload`]):
//! - [`Payload::Hash`] (validation): a 64-bit hash of the row's values; a violation's row
//!   values are read back from its file. The hash is the completion certificate's row hash
//!   (a multiply-fold of the values, [`mix64_rows`]) when it covers every column exactly,
//!   so the validation's digest of the input reuses it ([`KeyedChanges::certificate_hashes`]);
//!   otherwise (a nested or floating-point column, which that hash leaves out or
//!   canonicalizes) the hash of the row's all-column encoding;
//! - [`Payload::Row`] (verification): the whole row, compared exactly.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int8Type, UInt64Type};
use arrow_array::{Array, ArrayRef, Int8Array, RecordBatch, UInt32Array, UInt64Array};
use arrow_buffer::ScalarBuffer;
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::apply::describe_row;
use super::changelog::{ChangelogRows, RowLocation};
use super::extsort::{ExternalSorter, SortConfig, SortedBatch, SortedStream};
use super::files;
use super::ordered_run::{OrderedRun, Segment};
use super::touched::KeyFilter;
use crate::chunk::Op;
use crate::error::{Error, Result, internal};
use crate::key::{PrimaryKey, first_unordered_in};
use crate::vnode::{check_hashable, mix64_rows};

/// The `_op` code of a snapshot row in the sorted rows (the changelog's codes are 1..=4).
const SNAPSHOT_CODE: i8 = 0;

/// What is kept of a row besides its key. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload {
    /// The key columns and a 64-bit hash of the row.
    Hash,
    /// Every column.
    Row,
}

/// Where each file's rows start in the sequence.
#[derive(Debug, Default, Clone)]
struct FileIndex {
    /// `(first sequence, path, is a snapshot file)`, in sequence order.
    starts: Vec<(u64, PathBuf, bool)>,
}

impl FileIndex {
    /// Notes that the rows of `path` from `first_row` on start at sequence `seq`.
    fn note(&mut self, path: &Path, snapshot: bool, first_row: u64, seq: u64) {
        if self.starts.last().is_none_or(|(_, p, _)| p != path) {
            self.starts
                .push((seq.saturating_sub(first_row), path.to_path_buf(), snapshot));
        }
    }

    /// The file and the row within it of sequence `seq`.
    fn locate(&self, seq: u64) -> Result<(&Path, u64, bool)> {
        let i = self.starts.partition_point(|(start, _, _)| *start <= seq);
        match i.checked_sub(1).and_then(|i| self.starts.get(i)) {
            Some((start, path, snapshot)) => Ok((path, seq - start, *snapshot)),
            None => Err(internal!("sequence {seq} is in no file")),
        }
    }
}

/// The columns of a sorted row, by payload.
#[derive(Debug, Clone)]
struct Layout {
    payload: Payload,
    /// The table's columns.
    table: SchemaRef,
    /// The key columns within a sorted row.
    key_columns: Vec<usize>,
    seq: usize,
    op: usize,
    epoch: usize,
    /// The hash column ([`Payload::Hash`]).
    hash: usize,
}

impl Layout {
    fn new(table: &SchemaRef, pk: &PrimaryKey, payload: Payload) -> (Self, SchemaRef) {
        let mut fields: Vec<Arc<Field>> = match payload {
            Payload::Hash => pk
                .indices()
                .iter()
                .map(|&i| table.fields()[i].clone())
                .collect(),
            Payload::Row => table.fields().iter().cloned().collect(),
        };
        let key_columns = match payload {
            Payload::Hash => (0..fields.len()).collect(),
            Payload::Row => pk.indices().to_vec(),
        };
        let seq = fields.len();
        for (name, data_type) in [
            ("__seq", DataType::UInt64),
            ("__op", DataType::Int8),
            ("__epoch", DataType::UInt64),
            ("__hash", DataType::UInt64),
        ] {
            if name != "__hash" || payload == Payload::Hash {
                fields.push(Arc::new(Field::new(name, data_type, false)));
            }
        }
        let layout = Layout {
            payload,
            table: table.clone(),
            key_columns,
            seq,
            op: seq + 1,
            epoch: seq + 2,
            hash: seq + 3,
        };
        (layout, Arc::new(Schema::new(fields)))
    }
}

/// `row` as an Arrow IPC stream, in hex.
fn encode_row(row: &RecordBatch) -> Result<String> {
    let mut bytes = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, row.schema_ref())?;
    writer.write(row)?;
    writer.finish()?;
    drop(writer);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hex: Vec<u8> = (bytes.iter())
        .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
        .collect();
    String::from_utf8(hex).map_err(|e| internal!("hex digits: {e}"))
}

/// The batch [`encode_row`] encoded; `None` if `hex` is not one.
fn decode_row(hex: &str) -> Option<RecordBatch> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let mut reader = arrow_ipc::reader::StreamReader::try_new(bytes.as_slice(), None).ok()?;
    reader.next()?.ok()
}

/// A converter of every column of `schema`: byte equality is row equality.
fn all_columns(schema: &Schema) -> Result<RowConverter> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    Ok(RowConverter::new(fields)?)
}

/// Rows of a snapshot then a changelog, numbered and sorted by key. See the module docs.
pub(crate) struct KeyedChanges {
    pk: PrimaryKey,
    layout: Layout,
    names: Vec<String>,
    all_columns: RowConverter,
    /// Every column's values are hashed exactly by [`mix64_rows`] (see the module docs).
    mix64: bool,
    /// The [`mix64_rows`] hashes of the rows pushed last, when `mix64`.
    last_hashes: Option<ScalarBuffer<u64>>,
    /// One sorter a partition: a key's rows all go to the partition of its key's hash.
    sorters: Vec<ExternalSorter>,
    /// [`mix64_rows`] hashes every key column (partitions and [`Skip`] need it).
    keys_hashable: bool,
    /// Snapshot rows left out of the sort (see the module docs).
    skip: Skip,
    /// While snapshot rows are left out of the sort: the rows it keeps, in key order, one
    /// run a partition (see the module docs, "A snapshot in key order").
    snapshot_runs: Vec<OrderedRun>,
    /// While they are: the last snapshot row pushed, for a checkpoint.
    last_row: Option<RecordBatch>,
    /// Rows given to the sorters.
    rows_sorted: u64,
    files: FileIndex,
    next_seq: u64,
}

/// Where [`KeyedChanges`] writes the runs of a snapshot in key order: `dir`, files named
/// `{prefix}-p{partition}-NNNNNN.arrow`.
#[derive(Debug, Clone)]
pub(crate) struct RunPlace {
    pub dir: PathBuf,
    pub prefix: String,
}

/// What [`KeyedChanges::checkpoint`] records: the rows pushed so far, durable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SortCheckpoint {
    /// The rows pushed (snapshot rows, all of them numbered, most left out).
    pub next_seq: u64,
    /// The segments of each partition's run of the snapshot rows kept.
    pub segments: Vec<Vec<Segment>>,
    /// The last snapshot row pushed (whose key the next must follow), as an Arrow IPC
    /// stream in hex: typed values, not the encoded key (arrow-row bytes are no persisted
    /// format).
    #[serde(default)]
    pub last_row: Option<String>,
}

/// Whether snapshot rows are left out of the sort (module docs, "A snapshot in key order").
#[derive(Debug)]
enum Skip {
    /// Every row is sorted.
    Off,
    /// The snapshot has come in strictly increasing key order so far (its last key is
    /// `last_key`): only its rows whose key `touched` may hold are sorted.
    Untouched {
        touched: KeyFilter,
        last_key: Option<Vec<u8>>,
    },
    /// The order broke at sequence `until`: the snapshot rows left out before it must be
    /// sorted after all ([`KeyedChanges::left_out_until`]).
    Broken { touched: KeyFilter, until: u64 },
}

/// Which rows of a batch [`KeyedChanges::push`] sorts.
#[derive(Debug, Clone, Copy)]
enum Keep<'a> {
    All,
    /// The rows whose key hash the filter may hold.
    Touched(&'a KeyFilter),
    /// The rows whose key hash it does not hold.
    Untouched(&'a KeyFilter),
}

impl Keep<'_> {
    fn keeps(self, key_hash: u64) -> bool {
        match self {
            Keep::All => true,
            Keep::Touched(filter) => filter.may_contain(key_hash),
            Keep::Untouched(filter) => !filter.may_contain(key_hash),
        }
    }
}

/// Whether [`mix64_rows`] hashes every column of `schema` by its exact values: every type
/// covered, and no floating point (which it canonicalizes: -0.0 as 0.0, every NaN alike).
fn mix64_exact(schema: &Schema) -> bool {
    schema
        .fields()
        .iter()
        .all(|f| !f.data_type().is_floating() && check_hashable(f.name(), f.data_type()).is_ok())
}

impl KeyedChanges {
    /// Rows of `table` keyed by `pk`, spilling to `dir` as `{name}-*.arrow`, sorted in
    /// `partitions` parts of the keys (at least one), each with its share of `config`'s
    /// memory, each folded on its own ([`Self::finish`]). More than one needs key columns
    /// [`mix64_rows`] can hash; otherwise there is one.
    pub fn new(
        table: &SchemaRef,
        pk: &PrimaryKey,
        payload: Payload,
        dir: &Path,
        name: &str,
        config: SortConfig,
        partitions: usize,
    ) -> Result<Self> {
        let (layout, schema) = Layout::new(table, pk, payload);
        // The key resolved by name against the sorted rows: key columns come first, so a
        // table column named like an extra column cannot shadow it.
        let sort_key = PrimaryKey::new(&schema, pk.columns().to_vec())?;
        let hashable = pk.indices().iter().all(|&i| {
            let field = &table.fields()[i];
            check_hashable(field.name(), field.data_type()).is_ok()
        });
        let partitions = if hashable { partitions.max(1) } else { 1 };
        let config = config.split(partitions);
        let sorters = (0..partitions)
            .map(|p| {
                let name = match partitions {
                    1 => name.to_string(),
                    _ => format!("{name}-p{p}"),
                };
                ExternalSorter::new(schema.clone(), sort_key.clone(), dir, &name, config)
            })
            .collect();
        Ok(Self {
            pk: pk.clone(),
            names: table.fields().iter().map(|f| f.name().clone()).collect(),
            all_columns: all_columns(table)?,
            mix64: payload == Payload::Hash && mix64_exact(table),
            last_hashes: None,
            sorters,
            keys_hashable: hashable,
            skip: Skip::Off,
            snapshot_runs: Vec::new(),
            last_row: None,
            rows_sorted: 0,
            files: FileIndex::default(),
            layout,
            next_seq: 0,
        })
    }

    /// Leaves out of the sort the snapshot rows whose key no change touches (`touched`
    /// holds the hash of every key the changelog holds, see [`KeyFilter`]), for as long as
    /// the snapshot comes in strictly increasing key order: see the module docs. Call it
    /// before the first snapshot row; nothing changes if the key columns cannot be hashed.
    /// The rows the sort keeps meanwhile are written, in key order, as one run a partition
    /// at `place`, which a checkpoint can name ([`Self::checkpoint`]).
    pub fn skip_untouched_snapshot_rows(&mut self, touched: KeyFilter, place: &RunPlace) {
        if self.keys_hashable && self.next_seq == 0 {
            self.skip = Skip::Untouched {
                touched,
                last_key: None,
            };
            self.snapshot_runs = (0..self.sorters.len())
                .map(|p| {
                    let prefix = format!("{}-p{p}", place.prefix);
                    OrderedRun::create(&place.dir, &prefix, self.sorters[p].schema().clone())
                })
                .collect();
        }
    }

    /// Records the rows pushed so far, while snapshot rows are left out of the sort
    /// (otherwise `None`: rows went to the sort, which keeps no checkpoint): the run of each
    /// partition is closed up to here (`ordered_run.rs`).
    pub fn checkpoint(&mut self) -> Result<Option<SortCheckpoint>> {
        if !matches!(self.skip, Skip::Untouched { .. }) || self.snapshot_runs.is_empty() {
            return Ok(None);
        }
        let segments = (self.snapshot_runs.iter_mut())
            .map(|run| Ok(run.close_segment()?.to_vec()))
            .collect::<Result<_>>()?;
        let last_row = self.last_row.as_ref().map(encode_row).transpose()?;
        Ok(Some(SortCheckpoint {
            next_seq: self.next_seq,
            segments,
            last_row,
        }))
    }

    /// Resumes from `checkpoint` (made by a run of the same dataset with the same
    /// `touched` and `place`): the rows it recorded are pushed, those of the snapshot files
    /// `files` (each with the sequence its first row has). `Ok(false)`, nothing changed, if
    /// a recorded segment is not as recorded, its last row unreadable or the partitions
    /// differ: the caller starts over.
    pub fn resume(
        &mut self,
        touched: KeyFilter,
        place: &RunPlace,
        checkpoint: SortCheckpoint,
        files: &[(PathBuf, u64)],
    ) -> Result<bool> {
        if !self.keys_hashable
            || self.next_seq != 0
            || checkpoint.segments.len() != self.sorters.len()
        {
            return Ok(false);
        }
        let mut runs = Vec::with_capacity(self.sorters.len());
        for (p, segments) in checkpoint.segments.into_iter().enumerate() {
            let prefix = format!("{}-p{p}", place.prefix);
            let schema = self.sorters[p].schema().clone();
            match OrderedRun::resume(&place.dir, &prefix, schema, segments)? {
                Some(run) => runs.push(run),
                None => return Ok(false),
            }
        }
        let last_row = match checkpoint.last_row.as_deref().map(decode_row) {
            Some(Some(row)) if row.num_rows() == 1 && row.schema() == self.layout.table => {
                Some(row)
            }
            Some(_) => return Ok(false),
            None if checkpoint.next_seq > 0 => return Ok(false),
            None => None,
        };
        let last_key = match &last_row {
            Some(row) => Some(self.pk.encode(row)?.value(0).to_vec()),
            None => None,
        };
        self.last_row = last_row;
        for (path, first_seq) in files {
            self.files.note(path, true, 0, *first_seq);
        }
        self.snapshot_runs = runs;
        self.skip = Skip::Untouched { touched, last_key };
        self.next_seq = checkpoint.next_seq;
        Ok(true)
    }

    /// Snapshot rows left out of the sort before this sequence must be sorted after all:
    /// the last [`Self::push_snapshot`] found the snapshot's key order broken. Push them
    /// with [`Self::push_left_out`], then call [`Self::left_out_pushed`].
    pub fn left_out_until(&self) -> Option<u64> {
        match self.skip {
            Skip::Broken { until, .. } => Some(until),
            _ => None,
        }
    }

    /// Sorts the rows of `batch` (snapshot rows from sequence `first_seq` on, as
    /// [`Self::push_snapshot`] was given them, before [`Self::left_out_until`]) that were
    /// left out.
    pub fn push_left_out(&mut self, batch: &RecordBatch, first_seq: u64) -> Result<()> {
        let Skip::Broken { touched, until } = std::mem::replace(&mut self.skip, Skip::Off) else {
            return Err(internal!("snapshot rows pushed again, none left out"));
        };
        let n = batch.num_rows();
        let ops = Int8Array::from(vec![SNAPSHOT_CODE; n]);
        let epochs = UInt64Array::from(vec![0; n]);
        // (Their certificate hashes are not kept: the pass showed these rows before.)
        let pushed = self.push(batch, ops, epochs, first_seq, Keep::Untouched(&touched));
        self.skip = Skip::Broken { touched, until };
        pushed.map(|_| ())
    }

    /// Every row left out is sorted now: from here on every row is.
    pub fn left_out_pushed(&mut self) {
        self.skip = Skip::Off;
    }

    /// Whether the rows of `batch` (the next snapshot rows) continue a strictly increasing
    /// key order from `last_key`, which becomes the batch's last key if so.
    fn continues_key_order(
        &self,
        batch: &RecordBatch,
        last_key: &mut Option<Vec<u8>>,
    ) -> Result<bool> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(true);
        }
        let keys = self.pk.encode(batch)?;
        let ordered = first_unordered_in(&keys, 0, n).is_none()
            && last_key.as_deref().is_none_or(|last| last < keys.value(0));
        if ordered {
            *last_key = Some(keys.value(n - 1).to_vec());
        }
        Ok(ordered)
    }

    /// The first row with a NULL key value (by key column, then row), as an error made by
    /// `error(row, message)`.
    fn check_keys(
        &self,
        batch: &RecordBatch,
        error: impl Fn(usize, String) -> Error,
    ) -> Result<()> {
        for &c in self.pk.indices() {
            let column = batch.column(c);
            if column.null_count() > 0
                && let Some(i) = (0..batch.num_rows()).find(|&i| column.is_null(i))
            {
                return Err(error(
                    i,
                    format!("NULL in primary key column `{}`", self.names[c]),
                ));
            }
        }
        Ok(())
    }

    /// Checks the keys of snapshot rows `batch` (rows `first_row..` of `path`); a NULL is an
    /// error about the data, in `Ok(Err(..))`. Then adds them; `Err` is a system error.
    ///
    /// While rows are left out of the sort ([`Self::skip_untouched_snapshot_rows`]), a batch
    /// that breaks the snapshot's key order is not added: [`Self::left_out_until`] then says
    /// which rows to push again first (a key's rows go to the sort in sequence order), and
    /// the batch is pushed again after them.
    pub fn push_snapshot(
        &mut self,
        path: &Path,
        first_row: u64,
        batch: &RecordBatch,
    ) -> Result<Result<()>> {
        if let Err(e) = self.check_keys(batch, |i, message| {
            Error::dataset(path, format!("row {}", first_row + i as u64), message)
        }) {
            return Ok(Err(e));
        }
        let n = batch.num_rows();
        let first_seq = self.next_seq;
        // Taken out of `self` while `push` borrows it; put back after.
        let skip = match std::mem::replace(&mut self.skip, Skip::Off) {
            Skip::Untouched {
                touched,
                mut last_key,
            } => {
                if !self.continues_key_order(batch, &mut last_key)? {
                    self.skip = Skip::Broken {
                        touched,
                        until: first_seq,
                    };
                    return Ok(Ok(()));
                }
                Skip::Untouched { touched, last_key }
            }
            skip => skip,
        };
        self.files.note(path, true, first_row, first_seq);
        self.next_seq += n as u64;
        let ops = Int8Array::from(vec![SNAPSHOT_CODE; n]);
        let epochs = UInt64Array::from(vec![0; n]);
        let keep = match &skip {
            Skip::Untouched { touched, .. } => Keep::Touched(touched),
            _ => Keep::All,
        };
        let hashes = self.push(batch, ops, epochs, first_seq, keep);
        if matches!(skip, Skip::Untouched { .. }) && n > 0 {
            // The row alone: a copy (its view columns' strings too), not a slice holding
            // the batch.
            let last = UInt32Array::from(vec![(n - 1) as u32]);
            let row = arrow_select::take::take_record_batch(batch, &last)?;
            self.last_row = Some(crate::store::gc_views(row)?);
        }
        self.skip = skip;
        self.last_hashes = hashes?;
        Ok(Ok(()))
    }

    /// Like [`Self::push_snapshot`] for changelog rows.
    pub fn push_changes(&mut self, rows: &ChangelogRows) -> Result<Result<()>> {
        if let Err(e) = self.check_keys(&rows.data, |i, message| rows.location(i).error(message)) {
            return Ok(Err(e));
        }
        self.files
            .note(&rows.path, false, rows.first_row, self.next_seq);
        let ops: Int8Array = rows.ops.iter().map(|op| op.code()).collect();
        let epochs = UInt64Array::from(rows.epochs.clone());
        let first_seq = self.next_seq;
        self.next_seq += rows.ops.len() as u64;
        self.last_hashes = self.push(&rows.data, ops, epochs, first_seq, Keep::All)?;
        Ok(Ok(()))
    }

    /// Sorts the rows of `batch` that `keep` keeps, numbered from `first_seq` (each row's
    /// number is its place in `batch` from there, kept or not); returns the rows'
    /// certificate hashes when the payload is that hash (see the module docs).
    fn push(
        &mut self,
        batch: &RecordBatch,
        ops: Int8Array,
        epochs: UInt64Array,
        first_seq: u64,
        keep: Keep<'_>,
    ) -> Result<Option<ScalarBuffer<u64>>> {
        let n = batch.num_rows() as u64;
        let seqs = UInt64Array::from_iter_values(first_seq..first_seq + n);
        let mut columns: Vec<ArrayRef> = match self.layout.payload {
            Payload::Hash => self.pk.key_columns(batch),
            Payload::Row => batch.columns().to_vec(),
        };
        columns.push(Arc::new(seqs));
        columns.push(Arc::new(ops));
        columns.push(Arc::new(epochs));
        let mut certificate_hashes = None;
        if self.mix64 {
            let hashes = UInt64Array::from(mix64_rows(batch.columns(), batch.num_rows())?);
            certificate_hashes = Some(hashes.values().clone());
            columns.push(Arc::new(hashes));
        } else if self.layout.payload == Payload::Hash {
            // The same hash of the all-column encoding in every process: a validation's
            // checkpoint keeps it (`ordered_run.rs`).
            let rows = self.all_columns.convert_columns(batch.columns())?;
            let rows: ArrayRef = Arc::new(rows.try_into_binary()?);
            let hashes = UInt64Array::from(mix64_rows(&[rows], batch.num_rows())?);
            columns.push(Arc::new(hashes));
        }
        let sorted = RecordBatch::try_new(self.sorters[0].schema().clone(), columns)?;
        match self.sorters.as_mut_slice() {
            [sorter] if matches!(keep, Keep::All) => {
                self.rows_sorted += n;
                sorter.push(sorted)?;
            }
            sorters => {
                // A key's partition: its hash scaled to the partitions (equal keys, equal
                // hashes: a key's rows all go to one partition).
                let parts = sorters.len() as u128;
                let hashes = mix64_rows(&self.pk.key_columns(batch), batch.num_rows())?;
                let mut rows: Vec<Vec<u32>> = vec![Vec::new(); sorters.len()];
                for (row, hash) in (0u32..).zip(hashes) {
                    if keep.keeps(hash) {
                        let part = ((u128::from(hash) * parts) >> 64) as usize;
                        rows[part].push(row);
                    }
                }
                // Snapshot rows in key order go to their partition's run as they are.
                let runs = match keep {
                    Keep::Touched(_) if self.snapshot_runs.len() == sorters.len() => {
                        Some(&mut self.snapshot_runs)
                    }
                    _ => None,
                };
                let mut runs = runs.map(|r| r.iter_mut());
                for (sorter, rows) in sorters.iter_mut().zip(rows) {
                    self.rows_sorted += rows.len() as u64;
                    let part = if rows.len() as u64 == n {
                        sorted.clone()
                    } else if !rows.is_empty() {
                        let rows = UInt32Array::from(rows);
                        arrow_select::take::take_record_batch(&sorted, &rows)?
                    } else {
                        sorted.slice(0, 0)
                    };
                    match runs.as_mut().and_then(|r| r.next()) {
                        Some(run) => run.push(part)?,
                        None if part.num_rows() > 0 => sorter.push(part)?,
                        None => {}
                    }
                }
            }
        }
        Ok(certificate_hashes)
    }

    /// Rows given to the sort so far.
    #[cfg(test)]
    pub fn rows_sorted(&self) -> u64 {
        self.rows_sorted
    }

    /// The completion certificate's row hashes ([`mix64_rows`] of every column) of the rows
    /// pushed last, if the validation's own hash is that one (see the module docs).
    pub fn certificate_hashes(&self) -> Option<&[u64]> {
        self.last_hashes.as_deref()
    }

    /// All rows pushed, sorted by key, ready to be folded: one fold a partition, each over
    /// keys no other holds, in key order (the keys of all of them are in key order only
    /// with one partition).
    pub fn finish(self) -> Result<Vec<KeyFold>> {
        let Self {
            pk,
            layout,
            files,
            sorters,
            snapshot_runs,
            ..
        } = self;
        let mut runs = snapshot_runs.into_iter();
        sorters
            .into_iter()
            .map(|sorter| {
                // The snapshot's run holds each of its keys' first rows.
                let leading = runs.next().map(OrderedRun::into_run).transpose()?.flatten();
                Ok(KeyFold {
                    stream: sorter.finish_after(leading)?,
                    pk: pk.clone(),
                    all_columns: all_columns(&layout.table)?,
                    layout: layout.clone(),
                    files: files.clone(),
                    current: None,
                    pos: 0,
                    key: Vec::new(),
                    present: false,
                    held: Vec::new(),
                    first: None,
                })
            })
            .collect()
    }

    /// [`Self::finish`] of rows sorted in one partition: every key in key order.
    pub fn finish_one(self) -> Result<KeyFold> {
        let parts = self.sorters.len();
        let mut folds = self.finish()?;
        match (folds.pop(), folds.is_empty()) {
            (Some(fold), true) => Ok(fold),
            _ => Err(internal!("one fold of keys sorted in {parts} partitions")),
        }
    }
}

/// Folds every key of `folds` (the partitions of [`KeyedChanges::finish`]), each on a thread
/// of its own, and describes the violation with the smallest sequence among them, if any:
/// the one a single fold of all the keys would report, since keys do not interact.
pub(crate) fn first_violation_of(folds: Vec<KeyFold>) -> Result<Option<Error>> {
    let folds = std::thread::scope(|scope| {
        let running = folds
            .into_iter()
            .map(|mut fold| {
                std::thread::Builder::new()
                    .name("backfill-fold".into())
                    .spawn_scoped(scope, move || -> Result<KeyFold> {
                        while fold.next_key()? {}
                        Ok(fold)
                    })
                    .map_err(|e| internal!("cannot start a fold thread: {e}"))
            })
            .collect::<Result<Vec<_>>>()?;
        running
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(internal!("a fold thread panicked")))
            })
            .collect::<Result<Vec<KeyFold>>>()
    })?;
    let first = (folds.iter())
        .filter_map(|fold| Some((fold, fold.first_violation()?)))
        .min_by_key(|(_, violation)| violation.seq);
    first
        .map(|(fold, violation)| fold.error(violation))
        .transpose()
}

/// What went wrong with a key's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breach {
    /// A snapshot row of a key already in the snapshot.
    Duplicate,
    /// An insert or U+ of a present key.
    Exists(Op),
    /// A delete or U- of an absent key.
    Absent(Op),
    /// A delete or U- with other values than the row held.
    Differs(Op),
}

/// The first violation of a key: its sequence, what, the offending row (one row of sorted
/// rows) and, for [`Breach::Differs`], the held row's value.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    seq: u64,
    breach: Breach,
    row: RecordBatch,
    held: Vec<u8>,
}

/// One sorted batch with its decoded columns.
struct Current {
    sorted: SortedBatch,
    seqs: ScalarBuffer<u64>,
    ops: ScalarBuffer<i8>,
    values: Values,
}

/// The compared value of each row of a sorted batch, as bytes.
enum Values {
    /// Little-endian 64-bit hashes.
    Hashes(ScalarBuffer<u64>),
    /// All-column encodings.
    Rows(Rows),
}

impl Values {
    fn get(&self, i: usize) -> &[u8] {
        match self {
            Values::Hashes(h) => bytes_of(&h[i..i + 1]),
            Values::Rows(rows) => rows.row(i).data(),
        }
    }
}

/// The native bytes of `values` (a value compared with values of the same process only).
#[expect(unsafe_code, reason = "a zero-copy view of u64s as bytes; see SAFETY")]
fn bytes_of(values: &[u64]) -> &[u8] {
    debug_assert!(values.len() <= usize::MAX / 8);
    // SAFETY: u64 has no padding and every byte pattern is a valid u8; the length covers
    // exactly the values and the alignment of u8 is 1.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// Sorted rows folded key by key. See the module docs.
pub(crate) struct KeyFold {
    stream: SortedStream,
    pk: PrimaryKey,
    layout: Layout,
    all_columns: RowConverter,
    files: FileIndex,
    current: Option<Current>,
    pos: usize,
    /// The key of the last group folded, whether it ends with a row, and that row's value.
    key: Vec<u8>,
    present: bool,
    held: Vec<u8>,
    first: Option<Violation>,
}

impl KeyFold {
    /// Makes sure a row is at `pos`; false at the end.
    fn ensure_row(&mut self) -> Result<bool> {
        if let Some(current) = &self.current
            && self.pos < current.sorted.batch.num_rows()
        {
            return Ok(true);
        }
        self.current = None;
        self.pos = 0;
        let Some(sorted) = self.stream.next_batch()? else {
            return Ok(false);
        };
        let batch = &sorted.batch;
        let seqs = batch
            .column(self.layout.seq)
            .as_primitive::<UInt64Type>()
            .values()
            .clone();
        let ops = batch
            .column(self.layout.op)
            .as_primitive::<Int8Type>()
            .values()
            .clone();
        let values = match self.layout.payload {
            Payload::Hash => Values::Hashes(
                batch
                    .column(self.layout.hash)
                    .as_primitive::<UInt64Type>()
                    .values()
                    .clone(),
            ),
            Payload::Row => Values::Rows(
                self.all_columns
                    .convert_columns(&batch.columns()[..self.layout.table.fields().len()])?,
            ),
        };
        self.current = Some(Current {
            sorted,
            seqs,
            ops,
            values,
        });
        Ok(true)
    }

    /// Folds the rows of the next key. False when there are no more keys; then
    /// [`Self::key`], [`Self::final_value`] describe that key.
    pub fn next_key(&mut self) -> Result<bool> {
        if !self.ensure_row()? {
            return Ok(false);
        }
        let Some(current) = &self.current else {
            return Ok(false);
        };
        self.key.clear();
        self.key
            .extend_from_slice(current.sorted.keys.value(self.pos));
        self.present = false;
        let mut failed = false;
        while self.ensure_row()? {
            let Some(current) = &self.current else {
                break;
            };
            if current.sorted.keys.value(self.pos) != self.key.as_slice() {
                break;
            }
            if !failed {
                let (seq, code, value) = (
                    current.seqs[self.pos],
                    current.ops[self.pos],
                    current.values.get(self.pos),
                );
                let breach = match code {
                    SNAPSHOT_CODE if self.present => Some(Breach::Duplicate),
                    _ if code == SNAPSHOT_CODE => None,
                    code => match Op::from_code(code)? {
                        op @ (Op::Insert | Op::UpdateInsert) => {
                            self.present.then_some(Breach::Exists(op))
                        }
                        op @ (Op::Delete | Op::UpdateDelete) if !self.present => {
                            Some(Breach::Absent(op))
                        }
                        op => (self.held != value).then_some(Breach::Differs(op)),
                    },
                };
                match breach {
                    Some(breach) => {
                        failed = true;
                        if self.first.as_ref().is_none_or(|f| seq < f.seq) {
                            self.first = Some(Violation {
                                seq,
                                breach,
                                row: current.sorted.batch.slice(self.pos, 1),
                                held: match breach {
                                    Breach::Differs(_) => self.held.clone(),
                                    _ => Vec::new(),
                                },
                            });
                        }
                    }
                    None if code == SNAPSHOT_CODE || Op::from_code(code)?.is_insert() => {
                        self.present = true;
                        self.held.clear();
                        self.held.extend_from_slice(value);
                    }
                    None => self.present = false,
                }
            }
            self.pos += 1;
        }
        Ok(true)
    }

    /// The key of the last folded group ([`PrimaryKey::encode`] bytes).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The value the last folded key ends with: its row's all-column encoding (or hash),
    /// `None` when it ends deleted.
    pub fn final_value(&self) -> Option<&[u8]> {
        self.present.then_some(self.held.as_slice())
    }

    /// The violation with the smallest sequence so far.
    pub fn first_violation(&self) -> Option<&Violation> {
        self.first.as_ref()
    }

    /// `(name=value, ...)` of a value of [`Payload::Row`] ([`Self::final_value`]).
    pub fn describe_value(&self, value: &[u8]) -> String {
        let parser = self.all_columns.parser();
        let decoded = self
            .all_columns
            .convert_rows([parser.parse(value)])
            .map_err(Error::from)
            .and_then(|columns| Ok(RecordBatch::try_new(self.layout.table.clone(), columns)?));
        match decoded {
            Ok(batch) => describe_row(&batch, &(0..batch.num_columns()).collect::<Vec<_>>(), 0),
            Err(_) => "(?)".into(),
        }
    }

    /// `(key=value, ...)` of an encoded key.
    pub fn describe_key(&self, key: &[u8]) -> String {
        let decoded = self.pk.decode([key]).and_then(|columns| {
            Ok(RecordBatch::try_new(
                self.pk.decoded_schema().clone(),
                columns,
            )?)
        });
        match decoded {
            Ok(batch) => describe_row(&batch, &(0..batch.num_columns()).collect::<Vec<_>>(), 0),
            Err(_) => "(?)".into(),
        }
    }

    /// The error of a violation: the file, row and epoch of its row, and what is wrong, in
    /// the words of [`super::apply`].
    pub fn error(&self, violation: &Violation) -> Result<Error> {
        let row = &violation.row;
        let (path, file_row, snapshot) = self.files.locate(violation.seq)?;
        let key = describe_row(row, &self.layout.key_columns, 0);
        let what = |op: Op| match op {
            Op::Insert => "insert",
            Op::UpdateInsert => "update-insert (U+)",
            Op::Delete => "delete",
            Op::UpdateDelete => "update-delete (U-)",
        };
        let message = match violation.breach {
            Breach::Duplicate => format!("duplicate primary key {key} in the snapshot"),
            Breach::Exists(op) => format!("{} of key {key}, which already exists", what(op)),
            Breach::Absent(op) => format!("{} of key {key}, which does not exist", what(op)),
            Breach::Differs(op) => {
                let (values, held) = match self.layout.payload {
                    Payload::Row => {
                        let columns: Vec<usize> = (0..self.layout.table.fields().len()).collect();
                        (
                            describe_row(row, &columns, 0),
                            format!(" {}", self.describe_value(&violation.held)),
                        )
                    }
                    Payload::Hash => {
                        // Only the hash was kept: read the row back from its file.
                        let batch = files::read_row(path, file_row)?;
                        let first = if snapshot { 0 } else { 2 };
                        let columns: Vec<usize> = (first..batch.num_columns()).collect();
                        (describe_row(&batch, &columns, 0), String::new())
                    }
                };
                format!(
                    "{} of key {key} with values {values} that differ from the stored row{held}",
                    what(op)
                )
            }
        };
        if snapshot {
            return Ok(Error::dataset(path, format!("row {file_row}"), message));
        }
        let epoch = row
            .column(self.layout.epoch)
            .as_primitive::<UInt64Type>()
            .value(0);
        Ok(RowLocation {
            path: path.to_path_buf(),
            row: file_row,
            epoch,
        }
        .error(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_hash_serves_only_when_it_is_exact() {
        let schema = |types: &[DataType]| {
            Schema::new(
                types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| Field::new(format!("c{i}"), t.clone(), true))
                    .collect::<Vec<_>>(),
            )
        };
        assert!(mix64_exact(&schema(&[
            DataType::Int64,
            DataType::Utf8View,
            DataType::Decimal128(15, 2),
            DataType::Date32,
        ])));
        assert!(!mix64_exact(&schema(&[DataType::Int64, DataType::Float64])));
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
        assert!(!mix64_exact(&schema(&[DataType::Int64, list])));
    }

    /// Hashed rows of the testing table keyed by `k`, sorted in `partitions` with `budget`.
    /// The runs of a snapshot in key order in `dir`.
    fn place(dir: &Path) -> RunPlace {
        RunPlace {
            dir: dir.to_path_buf(),
            prefix: "snapshot".into(),
        }
    }

    fn hashed_rows(dir: &Path, budget: usize, partitions: usize) -> KeyedChanges {
        let table = crate::replay::testing::schema();
        let pk = PrimaryKey::new(&table, vec![crate::key::KeyColumn::asc("k")]).unwrap();
        let config = SortConfig::for_budget(budget);
        KeyedChanges::new(&table, &pk, Payload::Hash, dir, "t", config, partitions).unwrap()
    }

    #[test]
    fn pushed_rows_carry_their_certificate_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = hashed_rows(dir.path(), 1 << 20, 1);
        assert_eq!(rows.certificate_hashes(), None, "nothing pushed yet");
        let batch = crate::replay::testing::rows("1 a\n2 b\n3 NULL");
        rows.push_snapshot(Path::new("s"), 0, &batch)
            .unwrap()
            .unwrap();
        let expected = mix64_rows(batch.columns(), batch.num_rows()).unwrap();
        assert_eq!(rows.certificate_hashes(), Some(expected.as_slice()));
    }

    fn key_filter(keys: &[i64]) -> KeyFilter {
        let column: ArrayRef = Arc::new(arrow_array::Int64Array::from(keys.to_vec()));
        let mut filter = KeyFilter::for_keys(keys.len() as u64, 1 << 20).unwrap();
        for hash in mix64_rows(&[column], keys.len()).unwrap() {
            filter.insert(hash);
        }
        filter
    }

    /// Snapshot rows in key order whose key no change touches are not sorted, in one
    /// partition or more; the fold finds what the changes do to the others.
    #[test]
    fn untouched_rows_of_a_snapshot_in_key_order_are_not_sorted() {
        for partitions in [1, 3] {
            let dir = tempfile::tempdir().unwrap();
            let mut rows = hashed_rows(dir.path(), 4 << 10, partitions);
            rows.skip_untouched_snapshot_rows(key_filter(&[2, 7]), &place(dir.path()));
            let first = crate::replay::testing::rows("1 a\n2 b\n3 c");
            let second = crate::replay::testing::rows("4 d\n7 e\n9 f");
            rows.push_snapshot(Path::new("s0"), 0, &first)
                .unwrap()
                .unwrap();
            rows.push_snapshot(Path::new("s1"), 0, &second)
                .unwrap()
                .unwrap();
            assert_eq!(rows.left_out_until(), None);
            // The certificate hashes still cover every row shown.
            assert_eq!(rows.certificate_hashes().map(<[u64]>::len), Some(3));
            assert_eq!(rows.rows_sorted(), 2, "{partitions} partitions");
            let changes = ChangelogRows {
                path: PathBuf::from("c0"),
                first_row: 0,
                epochs: vec![1],
                ops: vec![Op::Delete],
                data: crate::replay::testing::rows("7 x"),
            };
            rows.push_changes(&changes).unwrap().unwrap();
            assert_eq!(rows.rows_sorted(), 3);
            let violations: Vec<(u64, Breach)> = (rows.finish().unwrap().into_iter())
                .filter_map(|mut fold| {
                    while fold.next_key().unwrap() {}
                    fold.first_violation().map(|v| (v.seq, v.breach))
                })
                .collect();
            // The delete (sequence 6) of key 7 with other values than its snapshot row.
            assert_eq!(violations, [(6, Breach::Differs(Op::Delete))]);
        }
    }

    /// A batch that breaks the key order is not pushed: the rows left out before it are
    /// pushed first (each key's rows in sequence order), then it, and every row after.
    #[test]
    fn a_broken_key_order_sorts_the_rows_left_out_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = hashed_rows(dir.path(), 1 << 20, 2);
        rows.skip_untouched_snapshot_rows(key_filter(&[2]), &place(dir.path()));
        let first = crate::replay::testing::rows("1 a\n2 b\n3 c");
        let second = crate::replay::testing::rows("4 d\n3 z");
        rows.push_snapshot(Path::new("s0"), 0, &first)
            .unwrap()
            .unwrap();
        assert_eq!(rows.rows_sorted(), 1);
        rows.push_snapshot(Path::new("s1"), 0, &second)
            .unwrap()
            .unwrap();
        assert_eq!(rows.left_out_until(), Some(3));
        assert_eq!(
            rows.rows_sorted(),
            1,
            "the batch waits for the rows left out"
        );
        rows.push_left_out(&first, 0).unwrap();
        assert_eq!(rows.rows_sorted(), 3);
        rows.left_out_pushed();
        assert_eq!(rows.left_out_until(), None);
        rows.push_snapshot(Path::new("s1"), 0, &second)
            .unwrap()
            .unwrap();
        assert_eq!(rows.rows_sorted(), 5);
        let error = first_violation_of(rows.finish().unwrap()).unwrap().unwrap();
        assert!(
            error
                .to_string()
                .contains("s1: row 1: duplicate primary key (k=3)"),
            "{error}"
        );
    }

    /// Keys sorted and folded in partitions report the violation one fold of every key
    /// reports: the one with the smallest sequence.
    #[test]
    fn partitions_report_the_first_violation_of_all_keys() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut duplicates = 0;
        for case in 0..30 {
            // Snapshot rows of keys drawn from a range: duplicates at random places.
            let batches: Vec<RecordBatch> = (0..rng.random_range(1..6))
                .map(|_| {
                    let text: String = (0..rng.random_range(1..40))
                        .map(|_| format!("{} x\n", rng.random_range(0..(60 + case * 20))))
                        .collect();
                    crate::replay::testing::rows(&text)
                })
                .collect();
            let report = |partitions: usize| {
                let dir = tempfile::tempdir().unwrap();
                let mut rows = hashed_rows(dir.path(), 4 << 10, partitions);
                let mut first_row = 0;
                for batch in &batches {
                    rows.push_snapshot(Path::new("snapshot/a.parquet"), first_row, batch)
                        .unwrap()
                        .unwrap();
                    first_row += batch.num_rows() as u64;
                }
                let folds = rows.finish().unwrap();
                assert_eq!(folds.len(), partitions);
                first_violation_of(folds).unwrap().map(|e| e.to_string())
            };
            let one = report(1);
            duplicates += usize::from(one.is_some());
            for partitions in [2, 3] {
                assert_eq!(
                    report(partitions),
                    one,
                    "case {case}, {partitions} partitions"
                );
            }
        }
        assert!(
            (5..30).contains(&duplicates),
            "{duplicates} cases with a duplicate"
        );
    }
}
