"""Backfill a new streaming view from a live, continuously updated table, on Apache Arrow.

``backfill(snapshot, changes, key=[...])`` loads the upstream table from ``snapshot`` (any
object with ``__arrow_c_stream__``: a pyarrow Table or RecordBatchReader, a Polars DataFrame,
a DuckDB relation's arrow stream), feeds it the changelog ``changes`` (``_epoch`` uint64,
``_op`` int8: 1 insert, 2 delete, 3 update-delete, 4 update-insert, then the table's columns)
and returns the downstream changelog as a ``pyarrow.RecordBatchReader``: every row of the
table exactly once, with the changes, as the backfill produces them.

The command-line tool's jobs are functions too: ``replay(dataset, out)``, ``verify(dataset,
out)`` and ``gen(kind, out)``, with the tool's option names, returning what the tool prints as a
dict.

Ctrl-C stops a ``backfill()`` read or a ``replay`` at a checkpoint and raises
``KeyboardInterrupt``; the same call resumes. ``resume_point(state, job=...)`` says where a
durable job stands.
"""

from ._native import BackfillError, BadInput, backfill, gen, replay, resume_point, verify

__all__ = ["BackfillError", "BadInput", "backfill", "gen", "replay", "resume_point", "verify"]
