"""`backfill()` against an oracle: random tables and changes (composite and descending keys,
NULL values, empty snapshots, many tiny epochs, deletes by key), random options, in memory and
durable; the net changelog must be the final table computed in plain Python, every row once.

``AB_ORACLE_SEEDS=a..b`` runs other seeds (default ``0..24``); a failure names its seed.
"""

import os
import random

import pytest

import arrangement_backfill as ab
from oracle import Upstream, net


def seeds():
    first, last = os.environ.get("AB_ORACLE_SEEDS", "0..24").split("..")
    return range(int(first), int(last))


@pytest.mark.parametrize("seed", seeds())
def test_backfill_is_the_final_table(seed, tmp_path):
    up = Upstream(seed)
    rng = random.Random(seed * 7919)
    vnodes = rng.choice([1, 16, 256])
    options = dict(
        vnodes=vnodes,
        parallelism=rng.randint(1, min(4, vnodes)),
        batch_size=rng.choice([1, 5, 64, 8192]),
        checkpoint_every=rng.choice([1, 1, 3]),
        barrier_interval_ms=rng.choice([None, 5, 1000]),
    )
    if up.descending and rng.random() < 0.5:
        options["order"] = {c: "desc" for c in up.descending}
    else:
        options["descending"] = up.descending
        if rng.random() < 0.5:
            options["order"] = "vnode"
    if up.composite and rng.random() < 0.5:
        options["distribution_key"] = ["s"]
    if rng.random() < 0.5:
        options["state"] = str(tmp_path / "state")
    reader = ab.backfill(up.snapshot_batches(), up.changes_table(), key=up.key, **options)
    got = net(reader, up.columns)
    assert got == up.expected(), f"seed {seed}, options {options}"


def test_an_empty_snapshot_and_no_changes_end_at_once():
    up = Upstream(1, rows=0, epochs=0)
    reader = ab.backfill(up.snapshot_batches(), up.changes_table(), key=up.key)
    assert reader.read_all().num_rows == 0


def test_many_tiny_epochs():
    up = Upstream(5, rows=50, epochs=400)
    reader = ab.backfill(up.snapshot_batches(), up.changes_table(), key=up.key, parallelism=2)
    batches = list(reader)
    assert net(batches, up.columns) == up.expected()
    epochs = {e for b in batches for e in b.column("_epoch").to_pylist()}
    assert len(epochs) > 10
