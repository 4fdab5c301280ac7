from typing import Any, Mapping, Optional, Sequence, Union

import pyarrow

class BackfillError(Exception):
    """An error of the engine or of the system (I/O, a store that failed)."""

class BadInput(ValueError):
    """Bad input: a schema without the key, a bad change, a bad option, a state of another
    job. The command-line tool exits with status 2 for these."""

def backfill(
    snapshot: Any,
    changes: Any,
    key: Union[str, Sequence[str]],
    *,
    job: str = "view",
    table: str = "upstream",
    distribution_key: Optional[Union[str, Sequence[str]]] = None,
    descending: Optional[Union[str, Sequence[str]]] = None,
    vnodes: int = 256,
    parallelism: int = 1,
    order: Union[str, Mapping[str, str], None] = None,
    state: Optional[str] = None,
    checkpoint_every: int = 1,
    barrier_interval_ms: Optional[int] = 1000,
    rate_limit: Optional[int] = None,
    batch_size: int = 8192,
    check_changes: bool = True,
) -> pyarrow.RecordBatchReader:
    """Backfills job ``job``: the table ``snapshot`` (loaded once; a durable ``state`` that
    holds it already keeps its own), fed ``changes``, as a reader of the downstream changelog
    (``_epoch``, ``_op``, the table's columns) that DuckDB (``duckdb.sql("from reader")``) and
    Polars (``polars.from_arrow(reader)``) read directly.

    Reading it drives the job, without the GIL. Each batch's ``_epoch`` is the job's epoch; a
    checkpoint at epoch E commits once the reader has been asked for the batch after epoch E's
    rows. Ctrl-C during a read raises ``KeyboardInterrupt`` and stops the job; so does dropping
    the reader (``del reader``; pyarrow's ``close()`` of this reader does not reach the job).
    A durable job (``state`` a directory) then resumes from its last checkpoint under the same
    ``job`` and ``state``: its ``changes`` are read again from the start and those the table
    already holds skipped; ``resume_point(state, job=...)`` names the checkpoint, so a consumer
    that keeps the rows of epochs up to it, and every row of the resumed run, has every row
    once.

    ``snapshot``, ``changes``: objects with ``__arrow_c_stream__`` (a pyarrow Table or
    RecordBatchReader, a Polars DataFrame, a DuckDB relation's ``arrow()`` reader); ``changes``
    has ``_epoch`` (uint64; a new value closes an epoch) and ``_op`` (int8: 1 insert, 2 delete,
    3 update-delete, 4 update-insert), then the table's columns, cut into batches anywhere (an
    update's two rows may fall in two batches).
    ``key``: the primary key's columns; ``order``: ``{column: "desc"}`` for key columns in
    descending order (or ``descending=[...]``), else ``"merged"`` (the default: the snapshot in
    key order across vnodes) or ``"vnode"`` (vnode by vnode, no merge);
    ``distribution_key``: the columns that pick a row's vnode (default: the key);
    ``parallelism``: backfill actors; ``batch_size``: rows per snapshot batch;
    ``rate_limit``: snapshot rows per second; ``barrier_interval_ms``: an epoch closes at
    least this often (``None``: only at the changes' epochs); ``checkpoint_every``: every
    n-th barrier is a checkpoint; ``check_changes``: check every change against the table (a
    duplicate insert, a delete of a missing key, old values that differ are ``BadInput``; a
    delete whose non-key columns are all null is a delete by key).

    Raises ``BadInput`` (a ``ValueError``) for what the caller can fix: a key not in the
    schema, a non-Arrow object, a bad option, a bad change (raised by the read that meets it),
    a state of another job definition; ``BackfillError`` for the system's failures.
    """

def resume_point(state: str, *, job: str = "view", table: str = "upstream") -> Optional[dict]:
    """Where job ``job`` of the durable ``state`` stands: ``checkpoint`` (its last committed
    epoch, ``None`` for a job never run), ``finished`` (its backfill done), ``ended`` (it ran to
    its end), ``changes`` (change rows the table holds), ``upstream_epoch`` (the ``_epoch`` of
    the last of them) and ``epoch`` (the store's). ``None`` when ``state`` holds no table
    ``table``."""


def replay(
    dataset: str,
    out: Optional[str] = None,
    *,
    state: Optional[str] = None,
    memory: bool = False,
    fresh: bool = False,
    vnodes: int = 256,
    batch_size: int = 8192,
    order: str = "merged",
    checkpoint_every: int = 1,
    barrier_interval_ms: Optional[int] = None,
    rate_limit: Optional[int] = None,
    upstream_rate: Optional[int] = None,
    parallelism: Optional[int] = None,
    rescale: Optional[Sequence[str]] = None,
    tmp: Optional[str] = None,
    verify: bool = False,
    progress: bool = False,
    cache: Optional[str] = None,
    shard: Optional[str] = None,
    checkpoint_url: Optional[str] = None,
    state_compression: str = "none",
) -> dict:
    """``backfill replay``: replays ``dataset`` into ``out`` (default ``out/<dataset name>``),
    resumable (durable state in ``OUT/state`` unless ``state`` or ``memory=True``).
    ``dataset`` and ``out`` may be object storage URLs (``s3://bucket/path``, ``gs://``,
    ``az://``; configured by the standard environment variables): the dataset is read by
    ranges, each committed file of the output published once (``uploaded_files``) after its
    checkpoint was uploaded beside it (``OUT/_backfill-state``, or ``checkpoint_url``;
    ``checkpoints_uploaded``), its state kept in the local ``cache`` directory (default
    ``out/cache/<the URL as a name>``). The same call on another machine, with an empty
    cache, restores the latest checkpoint (``restored_checkpoint``, its number) and resumes
    from it. Returns
    the tool's summary: ``snapshot_rows``, ``upstream_changes``, ``output_rows``,
    ``output_files``, ``epochs``, ``checkpoints``, ``elapsed_s``, ``load_s``,
    ``load_resumed_at`` (the snapshot rows a killed run's load steps had committed, or
    ``None``), ``validation_resumed_at`` (the snapshot row the validation of such a run
    resumed at, or ``None``), ``resumed_from``, ``already_finished``, ``dataset_epoch``, ``certificate``, ``certificate_matches`` (and
    ``verified`` with ``verify=True``). Runs without the GIL. Ctrl-C stops it at its next
    checkpoint, as SIGINT stops the tool, and raises ``KeyboardInterrupt``: the same call
    resumes. ``progress=True`` shows a progress bar (``tqdm`` when installed, in a terminal or
    a notebook; else a line a second on ``sys.stderr``). ``shard="I/N"`` replays only the
    I-th of N even vnode ranges (I from 0), as ``--shard I/N`` (``"auto"``: from the batch
    scheduler's environment, N from ``BACKFILL_SHARDS`` where it gives none); the summary's
    ``shard`` names it. ``state_compression`` (``"none"``, ``"lz4"``, ``"zstd"``) compresses
    the state's new run files, as ``--state-compression``. Bad input raises ``BadInput``; a
    certificate mismatch ``BackfillError``."""

def verify(dataset: str, out: str, *, tmp: Optional[str] = None) -> dict:
    """``backfill verify``: checks that ``out`` holds exactly snapshot + changes, each row once
    (``output_files``, ``output_rows``, ``final_rows``; for a sharded output, ``shards``: the
    ``"I/N"`` of all N shards, checked together), or raises saying what differs (a missing
    shard named)."""

def gen(
    kind: str,
    out: str,
    *,
    scale: float = 0.01,
    changes: Optional[int] = None,
    epochs: int = 50,
    seed: int = 42,
    shape: str = "int64",
    skew: bool = False,
) -> dict:
    """``backfill gen``: writes a dataset (``"tpch-lineitem"``, ``"tpch-orders"`` or
    ``"synthetic"``) into ``out``; returns ``snapshot_rows``, ``change_rows``, ``epochs``."""
