#!/usr/bin/env python3
"""Makes a bigger lineitem dataset from a generated one: K shifted copies.

`backfill gen` used to build a dataset in memory (about TPC-H scale 1-2 on a 24 GiB machine);
it now writes any scale in bounded memory (`gen tpch-lineitem --scale 10`), so this script is
only a quicker way to a big dataset from a small one. It streams `SRC` (made by `backfill gen tpch-lineitem --scale 1`)
into `DST` with K copies: copy k adds k * (max l_orderkey + 1) to `l_orderkey` in the
snapshot and in the changelog, so keys stay unique and every change applies to its own copy;
the changes of one epoch are written copy after copy, so `_epoch` never decreases and update
pairs stay adjacent. Usage: python3 benches/scale_up.py SRC DST K  (needs pyarrow).
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def shifted(table, column, by):
    col = table.column(column)
    return table.set_column(
        table.schema.get_field_index(column), column, pc.add(col, pa.scalar(by, col.type))
    )


def main(src, dst, k):
    os.makedirs(f"{dst}/snapshot")
    os.makedirs(f"{dst}/changes")
    with open(f"{src}/dataset.json") as f:
        manifest = json.load(f)
    with open(f"{dst}/dataset.json", "w") as f:
        json.dump(manifest, f)
    snapshots = sorted(os.listdir(f"{src}/snapshot"))
    change_files = sorted(os.listdir(f"{src}/changes"))
    # Above every key of the snapshot and of the changelog (which inserts new keys).
    offset = 1 + max(
        pc.max(pq.read_table(path, columns=["l_orderkey"])["l_orderkey"]).as_py()
        for path in [f"{src}/snapshot/{s}" for s in snapshots]
        + [f"{src}/changes/{c}" for c in change_files]
    )
    for copy in range(k):
        for s in snapshots:
            source = pq.ParquetFile(f"{src}/snapshot/{s}")
            writer = None
            for batch in source.iter_batches(batch_size=262144):
                t = shifted(pa.Table.from_batches([batch]), "l_orderkey", copy * offset)
                if writer is None:
                    writer = pq.ParquetWriter(
                        f"{dst}/snapshot/copy{copy:03d}-{s}", t.schema, compression="zstd"
                    )
                writer.write_table(t)
            if writer is not None:
                writer.close()
    changes = pa.concat_tables(pq.read_table(f"{src}/changes/{c}") for c in change_files)
    epochs = changes.column("_epoch").to_pylist()
    writer = None
    start = 0
    for i in range(1, len(epochs) + 1):
        if i == len(epochs) or epochs[i] != epochs[start]:
            for copy in range(k):
                t = shifted(changes.slice(start, i - start), "l_orderkey", copy * offset)
                if writer is None:
                    writer = pq.ParquetWriter(
                        f"{dst}/changes/part-00000.parquet", t.schema, compression="zstd"
                    )
                writer.write_table(t)
            start = i
    if writer is not None:
        writer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
