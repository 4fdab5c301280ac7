"""The Python package from the outside: a backfill read through pyarrow and DuckDB, checked
against the table the snapshot and the changes make; bad input as `BadInput`; a durable job
resumed under its name."""

from collections import Counter

import pyarrow as pa
import pytest

import arrangement_backfill as ab


def snapshot(n=2000):
    return pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array([i * 10 for i in range(n)], pa.int64())})


def changes():
    """Epochs 1-3: updates, deletes, inserts (deletes 7 and 8 by key only: NULL values)."""
    rows = [
        (1, 3, 5, 50), (1, 4, 5, 51),      # update 5
        (1, 1, 5000, 1),                   # insert
        (2, 2, 7, None),                   # delete by key
        (2, 2, 8, 80),                     # delete with its values
        (3, 3, 5, 51), (3, 4, 5, 52),      # update 5 again
        (3, 1, 5001, 2),
    ]
    return pa.table({
        "_epoch": pa.array([r[0] for r in rows], pa.uint64()),
        "_op": pa.array([r[1] for r in rows], pa.int8()),
        "id": pa.array([r[2] for r in rows], pa.int64()),
        "v": pa.array([r[3] for r in rows], pa.int64()),
    })


def expected():
    table = {i: i * 10 for i in range(2000)}
    table[5] = 52
    table[5000] = 1
    table[5001] = 2
    del table[7]
    del table[8]
    return Counter((k, v) for k, v in table.items())


def net(batches):
    counts = Counter()
    for batch in batches:
        d = batch.to_pydict()
        for op, k, v in zip(d["_op"], d["id"], d["v"]):
            counts[(k, v)] += 1 if op in (1, 4) else -1
    return Counter({k: n for k, n in counts.items() if n != 0})


def test_a_backfill_reads_as_a_pyarrow_reader_every_row_once():
    reader = ab.backfill(snapshot(), changes(), key=["id"], parallelism=2)
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema.names == ["_epoch", "_op", "id", "v"]
    assert net(reader) == expected()


def test_duckdb_reads_the_backfill():
    duckdb = pytest.importorskip("duckdb")
    reader = ab.backfill(snapshot(), changes(), key=["id"], order="vnode")
    rows = duckdb.sql("select _op, id, v from reader").fetchall()
    assert Counter((k, v) for op, k, v in rows if op in (1, 4)) - Counter(
        (k, v) for op, k, v in rows if op in (2, 3)) == expected()
    # duckdb.from_arrow over the reader, as the API names it.
    relation = duckdb.from_arrow(ab.backfill(snapshot(), changes(), key=["id"]))
    rows = relation.select("_op, id, v").fetchall()
    counts = Counter()
    for op, k, v in rows:
        counts[(k, v)] += 1 if op in (1, 4) else -1
    assert Counter({k: n for k, n in counts.items() if n}) == expected()


def test_bad_input_is_a_value_error_with_the_engines_message():
    with pytest.raises(ab.BadInput, match="nope"):
        ab.backfill(snapshot(), changes(), key=["nope"])
    with pytest.raises(ValueError, match="order"):
        ab.backfill(snapshot(), changes(), key=["id"], order="sideways")
    with pytest.raises(ab.BadInput, match="not an Arrow stream"):
        ab.backfill([1, 2, 3], changes(), key=["id"])
    bad = changes().to_pydict()
    bad["_op"][2] = 1
    bad["id"][2] = 9  # an insert of a key the table holds
    bad = pa.table(bad, schema=changes().schema)
    with pytest.raises(Exception, match="insert of a key the table holds already"):
        ab.backfill(snapshot(), bad, key=["id"]).read_all()


def test_a_durable_job_resumes_under_its_name(tmp_path):
    state = str(tmp_path / "state")
    first = ab.backfill(snapshot(), changes(), key=["id"], state=state, job="v1")
    assert net(first) == expected()
    # The same job again: it had ended; the changes it holds are skipped, no row again.
    again = ab.backfill(snapshot(), changes(), key=["id"], state=state, job="v1")
    assert net(again) == Counter()
    # Another view of the same table in the same state: every row.
    other = ab.backfill(snapshot(), changes(), key=["id"], state=state, job="v2")
    assert net(other) == expected()


def test_polars_frames_in_and_out():
    pl = pytest.importorskip("polars")
    snap = pl.from_arrow(snapshot())
    reader = ab.backfill(snap, changes(), key=["id"])
    frame = pl.from_arrow(reader)  # the reader itself, no table in between
    counts = Counter()
    for op, k, v in zip(frame["_op"], frame["id"], frame["v"]):
        counts[(k, v)] += 1 if op in (1, 4) else -1
    assert Counter({k: n for k, n in counts.items() if n}) == expected()


def test_the_tools_jobs_as_functions(tmp_path):
    ds = str(tmp_path / "ds")
    made = ab.gen("synthetic", ds, scale=0.05, epochs=5, seed=3, shape="composite")
    assert made["snapshot_rows"] == 5000 and made["epochs"] == 5
    out = str(tmp_path / "out")
    summary = ab.replay(ds, out, parallelism=2, verify=True)
    assert summary["certificate_matches"] is True
    assert summary["verified"]["final_rows"] > 0
    assert summary["snapshot_rows"] == 5000
    again = ab.replay(ds, out)
    assert again["already_finished"] is True
    assert ab.verify(ds, out)["final_rows"] == summary["verified"]["final_rows"]
    memory = ab.replay(ds, str(tmp_path / "mem"), memory=True, order="vnode")
    assert memory["certificate_matches"] is True
    with pytest.raises(ab.BadInput):
        ab.replay(str(tmp_path / "no-such-dataset"), out)
    with pytest.raises(ab.BadInput):
        ab.gen("nope", str(tmp_path / "x"))


def test_shards_as_functions(tmp_path):
    ds = str(tmp_path / "ds")
    ab.gen("synthetic", ds, scale=0.05, epochs=5, seed=4)
    out = str(tmp_path / "out")
    first = ab.replay(ds, out, shard="0/2")
    assert first["shard"] == "0/2" and first["certificate_matches"] is True
    with pytest.raises(ab.BadInput, match="shard 1/2 is missing"):
        ab.verify(ds, out)
    with pytest.raises(ab.BadInput, match="2 shards'"):
        ab.replay(ds, out, shard="0/3")
    with pytest.raises(ab.BadInput):
        ab.replay(ds, out, shard="2/2")
    ab.replay(ds, out, shard="1/2")
    assert ab.verify(ds, out)["shards"] == ["0/2", "1/2"]
    assert ab.replay(ds, str(tmp_path / "whole"))["shard"] is None


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    """README's Python example, run as a user would (from a copy of the repository's root:
    the bundled dataset where it says)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "datasets").symlink_to(root / "datasets")
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["summary"]["verified"]["final_rows"] > 0
    assert scope["summary"]["certificate_matches"] is True


def test_whatever_python_passes_in_is_an_exception_not_a_crash(tmp_path):
    """Wrong types, schemas without the key, non-Arrow objects, failing producers: each an
    exception naming what is wrong (BadInput where the caller can fix it)."""
    snap, ch = snapshot(10), changes()

    def failing():
        yield snap.to_batches()[0]
        raise RuntimeError("the producer failed")

    bad = {
        "key": dict(key=None),
        "not an Arrow stream": dict(key="id", snapshot={"id": [1]}),
        "_op": dict(key="id", changes=ch.set_column(1, "_op", pa.array([1] * ch.num_rows, pa.int32()))),
        "_epoch": dict(key="id", changes=ch.set_column(0, "_epoch", pa.array([1] * ch.num_rows, pa.int64()))),
        "a column `x`": dict(key="id", changes=ch.append_column("x", pa.array([1] * ch.num_rows))),
        "vnode hashing does not support": dict(
            key="id", snapshot=pa.table({"id": pa.array([[1]]), "v": pa.array([1])})),
        "vnode count": dict(key="id", vnodes=10**9),
        "job name": dict(key="id", job="../elsewhere", state=str(tmp_path / "s")),
        "not a directory": dict(key="id", state=__file__),
        "at least one column": dict(key=[]),
        "listed twice": dict(key=["id", "id"]),
        "parallelism": dict(key="id", parallelism=0),
        "rate_limit": dict(key="id", rate_limit=0),
        "barrier_interval_ms": dict(key="id", barrier_interval_ms=0),
    }
    for message, args in bad.items():
        args = {"snapshot": snap, "changes": ch, **args}
        with pytest.raises(ab.BadInput, match=message):
            ab.backfill(args.pop("snapshot"), args.pop("changes"), **args).read_all()
    with pytest.raises(ab.BackfillError, match="the producer failed"):
        ab.backfill(pa.RecordBatchReader.from_batches(snap.schema, failing()), ch, key="id").read_all()
    # A reader read to its end, then read again: the end again.
    reader = ab.backfill(snap, ch, key="id")
    reader.read_all()
    with pytest.raises(StopIteration):
        reader.read_next_batch()
