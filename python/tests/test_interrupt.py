"""Stops from the outside, with real processes: a durable `backfill()` killed with SIGKILL and
resumed from Python; Ctrl-C (SIGINT) during a `backfill()` read and during a `replay`, each
stopped at a checkpoint and resumed to an exact result; a reader dropped mid-way lets go of its
state at once.

A consumer that wants every row once keeps, of a stopped run, the rows of the epochs up to the
checkpoint `resume_point()` names (a checkpoint commits once the reader has handed out every
row of its epoch), and all rows of the run that resumes.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import arrangement_backfill as ab
from oracle import Upstream, net

# The child: a durable backfill read batch by batch, each batch made durable in its own file
# before the next is asked for.
CONSUMER = textwrap.dedent(
    """
    import os, sys, json
    import pyarrow as pa, pyarrow.ipc, pyarrow.parquet as pq
    import arrangement_backfill as ab
    data, state, out, key = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    reader = ab.backfill(pq.read_table(f"{data}/snapshot.parquet"), pq.read_table(f"{data}/changes.parquet"),
                         key=key, state=state, job="kept", rate_limit=4000, batch_size=200,
                         barrier_interval_ms=50)
    try:
        for i, batch in enumerate(reader):
            path = f"{out}/batch-{i:06}.arrow"
            with open(path + ".tmp", "wb") as f:
                with pa.ipc.new_file(f, batch.schema) as w:
                    w.write_batch(batch)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(0)
    print("finished", flush=True)
    """
)


def write_upstream(up, data):
    os.makedirs(data, exist_ok=True)
    pq.write_table(up.snapshot_batches(), f"{data}/snapshot.parquet")
    pq.write_table(up.changes_table(), f"{data}/changes.parquet")


def consumed(out):
    batches = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".arrow"):
            with pa.ipc.open_file(f"{out}/{name}") as f:
                batches.extend(f.get_batch(i) for i in range(f.num_record_batches))
    return batches


def start_consumer(tmp_path, up):
    data, state, out = tmp_path / "data", tmp_path / "state", tmp_path / "out"
    write_upstream(up, data)
    os.makedirs(out)
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    child = subprocess.Popen(
        [sys.executable, str(script), str(data), str(state), str(out), ",".join(up.key)],
        stdout=subprocess.PIPE,
        text=True,
    )
    return child, data, state, out


def wait_for_batches(out, n, child, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len([f for f in os.listdir(out) if f.endswith(".arrow")]) >= n:
            return
        assert child.poll() is None, "the consumer ended before it was stopped"
        time.sleep(0.01)
    raise AssertionError(f"the consumer wrote fewer than {n} batches in {timeout} s")


def resume_and_check(up, data, state, out):
    """Keeps the stopped run's rows up to its checkpoint, resumes, and checks every row once."""
    point = ab.resume_point(str(state), job="kept")
    assert point is not None and not point["ended"], point
    # No checkpoint yet: nothing of the stopped run is kept.
    checkpoint = point["checkpoint"] or 0
    kept = [b.filter(pc.less_equal(b.column("_epoch"), checkpoint)) for b in consumed(out)]
    resumed = ab.backfill(
        pq.read_table(f"{data}/snapshot.parquet"),
        pq.read_table(f"{data}/changes.parquet"),
        key=up.key,
        state=str(state),
        job="kept",
    )
    again = list(resumed)
    assert all(b.column("_epoch").to_pylist()[0] > checkpoint for b in again if b.num_rows)
    assert net(kept + again, up.columns) == up.expected()
    assert ab.resume_point(str(state), job="kept")["ended"]


@pytest.mark.parametrize("seed,after", [(11, 2), (12, 9), (13, 25)])
def test_a_killed_backfill_resumes_from_its_checkpoint(tmp_path, seed, after):
    up = Upstream(seed, rows=20000, epochs=30)
    child, data, state, out = start_consumer(tmp_path, up)
    try:
        wait_for_batches(out, after, child)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
    resume_and_check(up, data, state, out)


def test_ctrl_c_stops_a_backfill_read_at_its_checkpoint(tmp_path):
    up = Upstream(21, rows=20000, epochs=30)
    child, data, state, out = start_consumer(tmp_path, up)
    try:
        wait_for_batches(out, 5, child)
        sent = time.time()
        child.send_signal(signal.SIGINT)
        stdout, _ = child.communicate(timeout=30)
    finally:
        child.kill()
    assert stdout.strip() == "interrupted"
    assert child.returncode == 0
    assert time.time() - sent < 10
    resume_and_check(up, data, state, out)


def test_ctrl_c_stops_a_replay_at_a_checkpoint_and_it_resumes(tmp_path):
    ds, out = str(tmp_path / "ds"), str(tmp_path / "out")
    ab.gen("synthetic", ds, scale=0.5, epochs=20, seed=9)
    script = tmp_path / "replay.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import arrangement_backfill as ab
            print("started", flush=True)
            try:
                ab.replay(sys.argv[1], sys.argv[2], rate_limit=5000)
            except KeyboardInterrupt as e:
                print("interrupted:", e, flush=True)
                sys.exit(0)
            print("finished", flush=True)
            """
        )
    )
    child = subprocess.Popen([sys.executable, str(script), ds, out], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        time.sleep(2.5)
        child.send_signal(signal.SIGINT)
        stdout, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert stdout.startswith("interrupted:"), stdout
    summary = ab.replay(ds, out)
    assert summary["resumed_from"] is not None
    assert summary["certificate_matches"] is True
    assert ab.verify(ds, out)["final_rows"] > 0


def test_a_dropped_reader_lets_go_of_its_state_at_once(tmp_path):
    up = Upstream(31, rows=5000, epochs=10)
    state = str(tmp_path / "state")
    reader = ab.backfill(up.snapshot_batches(), up.changes_table(), key=up.key, state=state,
                         job="kept", batch_size=100, barrier_interval_ms=10)
    first = [reader.read_next_batch() for _ in range(5)]
    del reader
    point = ab.resume_point(state, job="kept")
    kept = [b.filter(pc.less_equal(b.column("_epoch"), point["checkpoint"] or 0)) for b in first]
    again = ab.backfill(up.snapshot_batches(), up.changes_table(), key=up.key, state=state, job="kept")
    assert net(kept + list(again), up.columns) == up.expected()


def test_replay_shows_progress_when_asked(tmp_path, capsys, monkeypatch):
    ds = str(tmp_path / "ds")
    ab.gen("synthetic", ds, scale=0.2, epochs=5, seed=4)
    capsys.readouterr()
    # Without tqdm: a line a second on stderr (and one at the end).
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    ab.replay(ds, str(tmp_path / "plain"), progress=True)
    err = capsys.readouterr().err
    assert "snapshot 20000/20000 rows" in err, err
    monkeypatch.undo()
    # Off by default.
    ab.replay(ds, str(tmp_path / "quiet"))
    assert capsys.readouterr().err == ""


def test_replay_progress_through_tqdm(tmp_path, capsys):
    pytest.importorskip("tqdm")
    ds = str(tmp_path / "ds")
    ab.gen("synthetic", ds, scale=0.2, epochs=5, seed=4)
    capsys.readouterr()
    ab.replay(ds, str(tmp_path / "out"), progress=True)
    err = capsys.readouterr().err
    assert "20.0k/20.0k" in err, err
