"""The test object store itself (issue 52): S3Proxy behind a Toxiproxy proxy.

What an s3:// sink root will rest on, checked before anything is built on it: the
server refuses a put-if-absent on an existing key and a replace with a stale ETag (the
commit of a Delta log entry and the fencing of state files), and each network fault the
later tests inject does what they will assume. Then Spark, through S3A and the same
proxy, writes and reads a table and makes S3A's conditional creates. No Postgres.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemark.demo.postgres import death_signal_prefix

from .object_store_support import (
    REGION,
    Proxy,
    S3Server,
    object_store,
    require_object_store,
    s3_client,
    s3a_jars,
)

BUCKET = "lake"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, Proxy]]:
    require_object_store()
    with object_store(tmp_path_factory.mktemp("object-store"), BUCKET) as pair:
        yield pair


@pytest.fixture
def proxy(store: tuple[S3Server, Proxy]) -> Iterator[Proxy]:
    yield store[1]
    store[1].clear()  # a failed test leaves no toxic for the next


@pytest.fixture
def s3(proxy: Proxy) -> Any:
    return s3_client(proxy.endpoint)


def status(call: Callable[..., Any], **kwargs: Any) -> int:
    """The HTTP status of an S3 call, whether it succeeded or not."""
    from botocore.exceptions import ClientError

    try:
        return int(call(**kwargs)["ResponseMetadata"]["HTTPStatusCode"])
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def new_key() -> str:
    return f"k/{secrets.token_hex(6)}"


def body(s3: Any, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_put_if_absent_refused_on_an_existing_key(s3: Any) -> None:
    key = new_key()
    assert status(s3.put_object, Bucket=BUCKET, Key=key, Body=b"v1", IfNoneMatch="*") == 200
    assert status(s3.put_object, Bucket=BUCKET, Key=key, Body=b"v2", IfNoneMatch="*") == 412
    assert body(s3, key) == b"v1"


def test_if_match_refuses_a_stale_etag(s3: Any) -> None:
    key = new_key()
    first = s3.put_object(Bucket=BUCKET, Key=key, Body=b"v1")["ETag"]
    second = s3.put_object(Bucket=BUCKET, Key=key, Body=b"v2", IfMatch=first)["ETag"]
    assert second != first
    assert status(s3.put_object, Bucket=BUCKET, Key=key, Body=b"v3", IfMatch=first) == 412
    assert body(s3, key) == b"v2"
    assert status(s3.put_object, Bucket=BUCKET, Key=key, Body=b"v3", IfMatch=second) == 200
    assert body(s3, key) == b"v3"


def test_multipart_completion_if_none_match(s3: Any) -> None:
    """A large log entry or state file goes up in parts: its completion is the commit."""
    key = new_key()

    def complete(content: bytes) -> int:
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        part = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=content)
        return status(
            s3.complete_multipart_upload,
            Bucket=BUCKET,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
            IfNoneMatch="*",
        )

    assert complete(b"first") == 200
    assert complete(b"second") == 412
    assert body(s3, key) == b"first"


def test_latency_delays_every_request(s3: Any, proxy: Proxy) -> None:
    key = new_key()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    proxy.latency(20)
    for _ in range(5):
        started = time.monotonic()
        assert status(s3.head_object, Bucket=BUCKET, Key=key) == 200
        assert time.monotonic() - started >= 0.020


def test_reset_peer_fails_a_request_until_removed(s3: Any, proxy: Proxy) -> None:
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

    key = new_key()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    toxic = proxy.reset_peer()
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        s3.head_object(Bucket=BUCKET, Key=key)
    proxy.remove_toxic(toxic)
    assert status(s3.head_object, Bucket=BUCKET, Key=key) == 200


def test_silent_server_times_out(proxy: Proxy) -> None:
    """The timeout toxic swallows the data: a server gone quiet, which only the
    client's read timeout ends."""
    from botocore.exceptions import ReadTimeoutError

    s3 = s3_client(proxy.endpoint, read_timeout=1)
    key = new_key()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    toxic = proxy.timeout()
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        s3.head_object(Bucket=BUCKET, Key=key)
    assert 1 <= time.monotonic() - started < 5
    proxy.remove_toxic(toxic)
    assert status(s3.head_object, Bucket=BUCKET, Key=key) == 200


def test_partition_fails_fast_and_heals(s3: Any, proxy: Proxy) -> None:
    """A disabled proxy refuses connections: the client fails within its connect
    timeout (2 s), not after a read timeout, and works again once it is enabled."""
    from botocore.exceptions import EndpointConnectionError

    key = new_key()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    with proxy.partitioned():
        started = time.monotonic()
        with pytest.raises(EndpointConnectionError):
            s3.head_object(Bucket=BUCKET, Key=key)
        assert time.monotonic() - started < 2
    assert status(s3.head_object, Bucket=BUCKET, Key=key) == 200


# Runs in a fresh interpreter: a session of its own with the S3A jars, whatever else the
# test process has started. Prints one JSON line of facts last.
SPARK_SCRIPT = r"""
import itertools, json, sys
from tidemark.spark import build_session

conf, table, log_entry = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
spark = build_session("local[2]", conf=conf, app_name="tidemark-s3a-check")
# as a flush round writes: each row's destination folder in the `_tm_dest` column, which
# tidemark's commit protocol writes to in place (the job's own path gets only the
# standard protocol's bookkeeping)
from pyspark.sql import functions as F
rows = spark.range(1000).withColumn("_tm_dest", F.lit(table + "/data/batch-1"))
rows.write.mode("overwrite").partitionBy("_tm_dest").parquet(table + "-job")
facts = {"count": spark.read.parquet(table + "/data/batch-1").count()}

jvm, hadoop = spark._jvm, spark._jsc.hadoopConfiguration()
path = jvm.org.apache.hadoop.fs.Path(log_entry)
fs = path.getFileSystem(hadoop)
serial = itertools.count()

def create(option, value):
    builder = fs.createFile(path).overwrite(True).must(option, value)
    out = builder.build()
    out.write(bytearray(f"entry {next(serial)}".encode()))  # a new ETag each time
    try:
        out.close()  # S3A's PUT happens here
        return "ok"
    except Exception as exc:
        java = getattr(exc, "java_exception", None)
        name = java.getClass().getSimpleName() if java is not None else type(exc).__name__
        return name + (" 412" if " 412" in str(exc) else "")

absent = "fs.option.create.conditional.overwrite"
facts["if_none_match_new"] = create(absent, True)
facts["if_none_match_existing"] = create(absent, True)
etag = fs.getFileStatus(path).getEtag()
facts["if_match_current"] = create(absent + ".etag", etag)
facts["if_match_stale"] = create(absent + ".etag", etag)
spark.stop()
print(json.dumps(facts))
"""


@pytest.mark.timeout(600)
def test_spark_through_s3a(store: tuple[S3Server, Proxy], proxy: Proxy) -> None:
    """A session as tidemark builds it (``build_session``, in a fresh interpreter) with
    the S3A jars: a table written and read back through the proxy, and S3A's conditional
    creates (If-None-Match, If-Match on an ETag) refused by the server when they must."""
    require_object_store(spark=True)
    server, _ = store
    conf = {
        "spark.jars": ",".join(str(jar) for jar in s3a_jars()),
        "spark.hadoop.fs.s3a.endpoint": proxy.endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": server.identity,
        "spark.hadoop.fs.s3a.secret.key": server.credential,
        # S3A's default disk buffer takes FileSystem.getLocal(), which must be a
        # LocalFileSystem: build_session's tidemark.hadoop.NioLocalFileSystem is not
        # (ClassCastException on the first write)
        "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer",
    }
    table, log_entry = f"s3a://{BUCKET}/t1", f"s3a://{BUCKET}/t1-log/00000.json"
    argv = [sys.executable, "-c", SPARK_SCRIPT, json.dumps(conf), table, log_entry]
    # the interpreter's own python for the workers, as tidemark.spark sets it
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(
        [*death_signal_prefix(signal.SIGTERM), *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts == {
        "count": 1000,
        "if_none_match_new": "ok",
        "if_none_match_existing": "RemoteFileChangedException 412",
        "if_match_current": "ok",
        "if_match_stale": "RemoteFileChangedException 412",
    }
    # tidemark's commit protocol wrote the data files in place: the destination folder
    # holds them and nothing else (no `_temporary` tree renamed into it)
    written = [p.name for p in Path(server.basedir, BUCKET, "t1", "data", "batch-1").iterdir()]
    assert written and all(name.startswith("part-") for name in written), written
