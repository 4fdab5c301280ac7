from typing import Any, Optional, Sequence

import pyarrow

class BackfillError(Exception):
    """An error of the engine or of the system (I/O, a store that failed)."""

class BadInput(ValueError):
    """Bad input: a schema without the key, a bad change, a bad option, a state of another
    job. The command-line tool exits with status 2 for these."""

def backfill(
    snapshot: Any,
    changes: Any,
    key: Sequence[str],
    *,
    job: str = "view",
    table: str = "upstream",
    distribution_key: Optional[Sequence[str]] = None,
    descending: Optional[Sequence[str]] = None,
    vnodes: int = 256,
    parallelism: int = 1,
    order: str = "merged",
    state: Optional[str] = None,
    checkpoint_every: int = 1,
    rate_limit: Optional[int] = None,
    batch_size: int = 1024,
    check_changes: bool = True,
) -> pyarrow.RecordBatchReader:
    """Backfills job ``job``: the table ``snapshot`` (loaded once; a durable ``state`` that
    holds it already keeps its own), fed ``changes``, as a reader of the downstream changelog
    (``_epoch``, ``_op``, the table's columns). Reading it drives the job; closing or dropping
    it stops the job (a durable ``state`` keeps its last checkpoint; a call with the same
    ``job`` and ``state`` resumes, its ``changes`` read again from the start and the rows the
    table already holds skipped).

    ``key``: the primary key's columns; ``descending``: those of them in descending order;
    ``distribution_key``: the columns that pick a row's vnode (default: the key);
    ``order``: ``"merged"`` (the snapshot in key order) or ``"vnode"`` (vnode by vnode);
    ``rate_limit``: snapshot rows per second; ``check_changes``: check every change against
    the table (a duplicate insert, a delete of a missing key, old values that differ are
    ``BadInput``; a delete whose non-key columns are all null is a delete by key).
    """


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
) -> dict:
    """``backfill replay``: replays ``dataset`` into ``out`` (default ``out/<dataset name>``),
    resumable (durable state in ``OUT/state`` unless ``state`` or ``memory=True``). Returns
    the tool's summary: ``snapshot_rows``, ``upstream_changes``, ``output_rows``,
    ``output_files``, ``epochs``, ``checkpoints``, ``elapsed_s``, ``load_s``, ``resumed_from``,
    ``already_finished``, ``dataset_epoch``, ``certificate``, ``certificate_matches`` (and
    ``verified`` with ``verify=True``). Bad input raises ``BadInput``; a signal
    ``KeyboardInterrupt``; a certificate mismatch ``BackfillError``."""

def verify(dataset: str, out: str, *, tmp: Optional[str] = None) -> dict:
    """``backfill verify``: checks that ``out`` holds exactly snapshot + changes, each row once
    (``output_files``, ``output_rows``, ``final_rows``), or raises saying what differs."""

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
