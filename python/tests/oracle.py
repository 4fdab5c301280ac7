"""A seeded random upstream for the tests: a table (its snapshot), valid changes to it, and
the final table they make, computed in plain Python; and the net count of a changelog's rows.

Shapes: an ``Int64`` key ``id``, or a composite key (``s`` utf8, ``i`` int32), each column
ascending or descending at random; value columns ``v`` (int64) and ``w`` (utf8), both with
NULLs. Changes: inserts of new keys, deletes (with their values, or by key: every value NULL),
updates (``_op`` 3 then 4), in epochs of one to many changes, cut into batches that may span
epochs.
"""

import random
from collections import Counter

import pyarrow as pa

INSERT, DELETE, UPDATE_DELETE, UPDATE_INSERT = 1, 2, 3, 4


class Upstream:
    def __init__(self, seed, rows=None, epochs=None):
        rng = random.Random(seed)
        self.rng = rng
        self.composite = rng.random() < 0.5
        if self.composite:
            self.key = ["s", "i"]
            self.key_fields = [pa.field("s", pa.utf8(), nullable=False), pa.field("i", pa.int32(), nullable=False)]
        else:
            self.key = ["id"]
            self.key_fields = [pa.field("id", pa.int64(), nullable=False)]
        self.descending = [c for c in self.key if rng.random() < 0.4]
        self.schema = pa.schema(self.key_fields + [pa.field("v", pa.int64()), pa.field("w", pa.utf8())])
        self.columns = self.schema.names
        n = rows if rows is not None else rng.choice([0, 1, 7, rng.randrange(0, 3000)])
        self.table = {}
        while len(self.table) < n:
            self.table[self.new_key()] = self.values()
        self.snapshot_rows = sorted(self.table.items())
        self.changes = []  # (epoch, op, key, values)
        self.epoch = 0
        for _ in range(epochs if epochs is not None else rng.choice([1, 5, rng.randrange(1, 60)])):
            self.epoch += 1
            for _ in range(rng.choice([1, 1, 2, rng.randrange(1, 80)])):
                self.change()

    def new_key(self):
        while True:
            if self.composite:
                key = (f"s{self.rng.randrange(0, 200):03}", self.rng.randrange(-1000, 1000))
            else:
                key = (self.rng.randrange(-(10**12), 10**12),)
            if key not in self.table:
                return key

    def values(self):
        v = None if self.rng.random() < 0.15 else self.rng.randrange(-100, 100)
        w = None if self.rng.random() < 0.15 else self.rng.choice(["", "x", "yy", "zzz" * 5])
        return (v, w)

    def change(self):
        rng = self.rng
        roll = rng.random()
        if not self.table or roll < 0.35:
            key = self.new_key()
            values = self.values()
            self.table[key] = values
            self.changes.append((self.epoch, INSERT, key, values))
        elif roll < 0.6:
            key = rng.choice(list(self.table))
            values = self.table.pop(key)
            by_key = rng.random() < 0.3
            self.changes.append((self.epoch, DELETE, key, (None, None) if by_key else values))
        else:
            key = rng.choice(list(self.table))
            old = self.table[key]
            new = self.values()
            self.table[key] = new
            self.changes.append((self.epoch, UPDATE_DELETE, key, old))
            self.changes.append((self.epoch, UPDATE_INSERT, key, new))

    def _table(self, schema, rows):
        columns = list(zip(*rows)) if rows else [[] for _ in schema.names]
        return pa.table([pa.array(list(c), f.type) for c, f in zip(columns, schema)], schema=schema)

    def snapshot_batches(self):
        """The snapshot as a pyarrow Table of a few chunks (in random order)."""
        rows = [k + v for k, v in self.snapshot_rows]
        self.rng.shuffle(rows)
        table = self._table(self.schema, rows)
        cuts = sorted(self.rng.sample(range(1, len(rows)), min(3, max(0, len(rows) - 1)))) if len(rows) > 1 else []
        pieces, start = [], 0
        for cut in cuts + [len(rows)]:
            pieces.append(table.slice(start, cut - start))
            start = cut
        return pa.concat_tables(pieces) if pieces else table

    def changes_schema(self):
        return pa.schema([pa.field("_epoch", pa.uint64()), pa.field("_op", pa.int8())] + list(self.schema))

    def changes_table(self):
        """The changes as a pyarrow Table cut into batches that may span epochs."""
        rows = [(e, op) + k + v for e, op, k, v in self.changes]
        table = self._table(self.changes_schema(), rows)
        batches = []
        start = 0
        while start < len(rows):
            size = self.rng.choice([1, 3, 17, 500])
            batches.extend(table.slice(start, size).to_batches())
            start += size
        return pa.Table.from_batches(batches, schema=self.changes_schema())

    def expected(self):
        """The final table as a multiset of full rows."""
        return Counter(k + v for k, v in self.table.items())


def net(batches, columns):
    """The net count of every full row in changelog batches: +1 for an insert (1, 4), -1 for
    a delete (2, 3); rows that cancel out dropped."""
    counts = Counter()
    for batch in batches:
        d = batch.to_pydict()
        for i, op in enumerate(d["_op"]):
            row = tuple(d[c][i] for c in columns)
            counts[row] += 1 if op in (INSERT, UPDATE_INSERT) else -1
    return Counter({row: n for row, n in counts.items() if n != 0})
