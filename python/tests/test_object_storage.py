"""`replay` with its dataset and its output on object storage (a local moto S3 server): the
output verifies, and pyarrow's S3 filesystem reading the bucket sees exactly the committed
rows, every row of the final table once."""

import os
import pathlib
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

import arrangement_backfill as ab

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3():
    try:
        import boto3  # noqa: F401  (comes with moto)
        import moto  # noqa: F401
    except ImportError:
        if os.environ.get("BACKFILL_REQUIRE_S3") == "1":
            raise
        pytest.skip("no moto (pip install 'moto[server]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, "moto did not start"
            time.sleep(0.05)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield endpoint
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.kill()
    server.wait()


def test_a_replay_from_and_into_a_bucket_is_read_back_exactly_once(s3, tmp_path):
    import boto3
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    bucket = f"b{uuid.uuid4().hex[:12]}"  # the module caches one client per bucket
    client = boto3.client("s3", endpoint_url=s3, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    dataset = ROOT / "datasets" / "tpch-lineitem-sf0.01"
    for path in dataset.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"ds/{path.relative_to(dataset)}")
    summary = ab.replay(f"s3://{bucket}/ds", f"s3://{bucket}/out", cache=str(tmp_path / "cache"),
                        parallelism=2)
    assert summary["certificate_matches"] is True
    assert summary["uploaded_files"] == summary["output_files"] > 0
    report = ab.verify(f"s3://{bucket}/ds", f"s3://{bucket}/out")
    fs = pafs.S3FileSystem(endpoint_override=s3, access_key="test", secret_key="test", region="us-east-1",
                           scheme="http")
    table = pads.dataset(f"{bucket}/out/changes", filesystem=fs, format="parquet").to_table()
    assert table.num_rows == summary["output_rows"] == report["output_rows"]
    ops = Counter(table.column("_op").to_pylist())
    assert ops[1] + ops[4] - ops[2] - ops[3] == report["final_rows"]
    # The same call again: finished, nothing uploaded twice.
    again = ab.replay(f"s3://{bucket}/ds", f"s3://{bucket}/out", cache=str(tmp_path / "cache"))
    assert again["already_finished"] is True
    # Another writer (another cache) is refused.
    with pytest.raises(ab.BadInput, match="another replay"):
        ab.replay(f"s3://{bucket}/ds", f"s3://{bucket}/out", cache=str(tmp_path / "other"), fresh=True)


def test_the_same_call_on_an_empty_cache_restores_the_bucket_checkpoint(s3, tmp_path):
    """A lost machine: the cache is deleted, and the same call restores the latest checkpoint
    from the bucket (the output finished: nothing is redone, nothing published twice), and
    pyarrow still reads every committed row once."""
    import boto3
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import shutil

    bucket = f"r{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    dataset = ROOT / "datasets" / "tpch-lineitem-sf0.01"
    cache = tmp_path / "cache"
    first = ab.replay(str(dataset), f"s3://{bucket}/out", cache=str(cache), parallelism=2)
    assert first["checkpoints_uploaded"] >= 1 and first["restored_checkpoint"] is None
    shutil.rmtree(cache)
    again = ab.replay(str(dataset), f"s3://{bucket}/out", cache=str(cache))
    assert again["restored_checkpoint"] is not None
    assert again["already_finished"] is True
    assert again["uploaded_files"] == 0
    report = ab.verify(str(dataset), f"s3://{bucket}/out")
    fs = pafs.S3FileSystem(endpoint_override=s3, access_key="test", secret_key="test", region="us-east-1",
                           scheme="http")
    table = pads.dataset(f"{bucket}/out/changes", filesystem=fs, format="parquet").to_table()
    assert table.num_rows == first["output_rows"] == report["output_rows"]
