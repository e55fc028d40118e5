"""``tidemark.state.objectstore`` against a real S3 server (S3Proxy) behind a real proxy.

What an ``s3://`` sink root's state files and Delta log entries rest on: a replace is
refused by the store itself once another writer replaced the object (If-Match on the
ETag this process saw), a put-if-absent is made once among racing writers, a PUT whose
reply was lost and that is retried is recognised as this process's own (not taken for
another writer's), and an unreachable store, wrong credentials or a missing bucket fail
with a message that says what to do. No Postgres, no Spark.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tidemark.state import objectstore, s3put
from tidemark.state.objectstore import S3Access, StoreConflict, StoreUnavailable

from .object_store_support import (
    IDENTITY,
    REGION,
    SERVERS,
    Proxy,
    S3Server,
    object_store,
    require_object_store,
    s3_client,
)

BUCKET = "state"


@pytest.fixture(scope="module", params=SERVERS)
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[S3Server, Proxy]]:
    """Each test against each server (S3Proxy, versitygw), unless it names one
    (``ONE_SERVER``: what it checks is tidemark's, not the store's)."""
    require_object_store()
    with object_store(tmp_path_factory.mktemp("objectstore"), BUCKET, request.param) as pair:
        yield pair


ONE_SERVER = pytest.mark.parametrize("store", ["s3proxy"], indirect=True)


def access(server: S3Server, endpoint: str, **changes: Any) -> S3Access:
    fields: dict[str, Any] = {
        "endpoint": endpoint,
        "region": REGION,
        "path_style": True,
        "access_key_id": server.identity,
        "secret_access_key": server.credential,
        "attempts": 3,
        "connect_timeout_s": 1.0,
        "read_timeout_s": 2.0,
    }
    return S3Access(**(fields | changes))


@pytest.fixture
def proxy(store: tuple[S3Server, Proxy]) -> Iterator[Proxy]:
    server, proxy = store
    objectstore.configure(access(server, proxy.endpoint))
    yield proxy
    proxy.clear()
    objectstore.configure(None)


def uri(name: str = "") -> str:
    return f"s3://{BUCKET}/t-{secrets.token_hex(5)}/{name or 'f.json'}"


def test_read_replace_put_if_absent_listing_delete(proxy: Proxy) -> None:
    target = uri("_tidemark/frontiers.json")
    assert objectstore.read(target) is None
    assert not objectstore.exists(target)
    objectstore.replace(target, "one")
    objectstore.replace(target, "two")
    assert objectstore.read_text(target) == "two"
    entry = objectstore.join(target.rsplit("/", 2)[0], "_delta_log", "00000000000000000000.json")
    assert objectstore.put_if_absent(entry, b"v0")
    assert not objectstore.put_if_absent(entry, b"other")
    assert objectstore.read(entry) == b"v0"
    top = target.rsplit("/", 2)[0]
    listed = objectstore.listing(top)
    assert [(f.name, f.size) for f in listed] == [
        ("_delta_log/00000000000000000000.json", 2),
        ("_tidemark/frontiers.json", 3),
    ]
    assert objectstore.folders(top) == {"_delta_log", "_tidemark"}  # (one delimited LIST)
    assert objectstore.folders(objectstore.join(top, "nothing")) == set()
    objectstore.delete([entry, objectstore.join(top, "never-there")])
    assert [f.name for f in objectstore.listing(top)] == ["_tidemark/frontiers.json"]


def test_a_replace_after_another_writers_is_refused_by_the_store(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """A deposed leader read the file, a new leader replaced it: the old one's write is
    refused by the store (412), whatever its own checks said, and changes nothing."""
    server = store[0]
    target = uri()
    objectstore.replace(target, "old leader")
    other = s3_client(server.endpoint)
    bucket, key = objectstore.split(target)
    other.put_object(Bucket=bucket, Key=key, Body=b"new leader")
    with pytest.raises(StoreConflict, match="another writer replaced"):
        objectstore.replace(target, "stale")
    assert objectstore.read(target) == b"new leader"  # (and this process saw it now)
    objectstore.replace(target, "after reading it")
    assert objectstore.read(target) == b"after reading it"


def test_a_create_after_another_writers_is_refused(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    target = uri()
    assert objectstore.read(target) is None  # seen absent
    bucket, key = objectstore.split(target)
    s3_client(store[0].endpoint).put_object(Bucket=bucket, Key=key, Body=b"theirs")
    with pytest.raises(StoreConflict):
        objectstore.replace(target, "mine")
    assert objectstore.read(target) == b"theirs"


def test_racing_put_if_absent_makes_one_version(proxy: Proxy) -> None:
    entry = uri("_delta_log/00000000000000000007.json")
    won: list[bytes] = []
    start = threading.Barrier(8)

    def commit(i: int) -> None:
        data = f"writer {i}".encode()
        start.wait()
        if objectstore.put_if_absent(entry, data):
            won.append(data)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert objectstore.read(entry) == won[0]


@ONE_SERVER  # (the proxy drops the replies; versitygw's connections then close early)
def test_a_retried_put_whose_reply_was_lost_is_taken_as_made(
    store: tuple[S3Server, Proxy], proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stores the entry but its reply never comes (the proxy swallows it):
    the client times out and retries, the store refuses the retry (the key exists), and
    the refusal is recognised as this very write, not another writer's."""
    server = store[0]
    entry = uri("_delta_log/00000000000000000003.json")
    bucket, key = objectstore.split(entry)
    stored = server.basedir / bucket / key
    looked: list[str] = []
    real_get = objectstore._get

    def spy(location: str) -> Any:
        looked.append(location)
        return real_get(location)

    monkeypatch.setattr(objectstore, "_get", spy)
    # requests reach the server, replies stop
    toxic = proxy.add_toxic("timeout", {"timeout": 0}, stream="downstream")
    outcome: list[object] = []

    def commit() -> None:
        try:
            outcome.append(objectstore.put_if_absent(entry, b"the entry"))
        except Exception as exc:  # (reported below)
            outcome.append(exc)

    worker = threading.Thread(target=commit)
    worker.start()
    deadline = time.monotonic() + 20
    while not stored.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stored.exists(), "the first attempt never reached the server"
    time.sleep(2.5)  # past the read timeout (2 s): the client retried meanwhile
    proxy.remove_toxic(toxic)
    worker.join(30)
    assert outcome == [True]
    assert looked == [entry]  # the retry was refused (412) and the stored bytes compared
    assert objectstore.read(entry) == b"the entry"


def botocore_puts() -> list[str]:
    """The keys botocore's client is asked to PUT from now on (tidemark's fallback)."""
    made: list[str] = []
    objectstore._STORE.client().meta.events.register(
        "before-call.s3.PutObject", lambda params, **_: made.append(params["url_path"])
    )
    return made


def test_puts_go_direct_and_a_store_refusing_them_gets_botocores(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """Log entries and state files are PUT as tidemark signs them (``s3put``), botocore's
    client making none. A store that answers a direct PUT with an error and takes
    botocore's PUT of the same object gets the PUT from botocore, once, and no direct
    PUT again; the object is written once."""
    server = store[0]
    made = botocore_puts()
    entry = uri("_delta_log/00000000000000000000.json")
    assert objectstore.put_if_absent(entry, b"v0")
    assert not objectstore.put_if_absent(entry, b"other")
    state = uri("_tidemark/frontiers.json")
    objectstore.replace(state, "one")
    objectstore.replace(state, "two")
    assert (made, objectstore.read(entry), objectstore.read(state)) == ([], b"v0", b"two")

    # what the store would say to a signer it does not understand: here, a wrong secret
    direct = objectstore._STORE.direct()
    direct._credentials = s3put.Credentials(server.identity, "not-the-secret")
    direct._keys.clear()  # (the signing key made from the right one)
    entry = uri("_delta_log/00000000000000000001.json")
    with capture_logs() as logs:
        assert objectstore.put_if_absent(entry, b"v1")
    assert len(made) == 1 and not direct.enabled
    assert [e["event"] for e in logs] == ["objectstore.direct_puts_off"]
    assert "403" in logs[0]["direct_reply"]
    objectstore.replace(state, "three")  # (botocore's now)
    assert len(made) == 2
    assert (objectstore.read(entry), objectstore.read(state)) == (b"v1", b"three")


def test_a_partition_fails_with_a_clear_message_and_heals(proxy: Proxy) -> None:
    target = uri()
    objectstore.replace(target, "before")
    with proxy.partitioned():
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="reachable") as caught:
            objectstore.replace(target, "during")
        assert time.monotonic() - started < 15  # 3 tries, 1 s connect timeout, backoff
        assert "[s3] endpoint" in str(caught.value)
    objectstore.replace(target, "after")
    assert objectstore.read(target) == b"after"


def test_wrong_credentials_and_a_missing_bucket_say_what_to_do(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    server = store[0]
    objectstore.configure(access(server, proxy.endpoint, secret_access_key="wrong"))
    with pytest.raises(StoreUnavailable, match=r"refused the credentials.*access_key_id"):
        objectstore.read(uri())
    objectstore.configure(access(server, proxy.endpoint))
    with pytest.raises(StoreUnavailable, match=r"bucket 'no-such-bucket' does not exist"):
        objectstore.replace("s3://no-such-bucket/x.json", "x")
    assert IDENTITY not in repr(objectstore.s3_access())
    assert server.credential not in repr(objectstore.s3_access())


def test_the_s3_access_is_never_printed(store: tuple[S3Server, Proxy], tmp_path: Path) -> None:
    server = store[0]
    shown = repr(access(server, "http://127.0.0.1:1"))
    assert server.credential not in shown


SHAPE = "raced"
ROUNDS = 40
BATCH = 10


def _batch_files(table: Any, first: int, end: int) -> list[Any]:
    """A batch's Parquet file written to the table's new ``data/<uuid>/`` on the store
    (with pyarrow, as Spark would through S3A), then found as the service finds it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.sink.schema import ColumnSpec, table_schema

    lsns = list(range(first, end + 1))
    n = len(lsns)
    arrays = [
        pa.array(lsns, pa.int32()),
        pa.array(lsns, pa.int64()),
        pa.array([0] * n, pa.int32()),
        pa.array(["insert"] * n, pa.string()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.list_(pa.string())),
    ]
    schema = table_schema([ColumnSpec("id", 23)])
    rel, _ = table.new_batch_dir()
    where = objectstore.arrow_path(table.location(f"{rel}/part-0.parquet"))
    pq.write_table(
        pa.Table.from_arrays(arrays, schema=schema),
        where,
        filesystem=objectstore.arrow_filesystem(),
    )
    return table.files_in(rel)  # type: ignore[no-any-return]


def _table(root: str, catalog: str) -> Any:
    """The raced changelog: Delta (``catalog`` empty), or Iceberg in that catalog."""
    if not catalog:
        from tidemark.sink.delta.table import ShapeTable

        return ShapeTable(root, SHAPE)
    from tidemark.settings.config import IcebergSettings
    from tidemark.sink.iceberg.format import IcebergFormat

    return IcebergFormat(IcebergSettings(catalog_uri=catalog)).changelog(root, SHAPE)


def _race(access: S3Access, root: str, catalog: str, offset: int, start: Any, out: Any) -> None:
    """One process committing batches shifted by ``offset`` from the other's, each
    round at the same moment (a barrier), so that both try the same log version (or
    Iceberg snapshot)."""
    from tidemark.errors import WriterFenced

    objectstore.configure(access)
    table = _table(root, catalog)
    committed, fenced, skipped = [], 0, 0
    for i in range(ROUNDS):
        first = offset + i * BATCH + 1
        end = first + BATCH - 1
        files = _batch_files(table, first, end)
        start.wait()
        try:
            version = table.commit(files, end, {}, first_lsn=first)
        except WriterFenced:
            fenced += 1
            continue
        if version is None:
            skipped += 1
        else:
            committed.append((first, end))
    out.put((offset, committed, fenced, skipped))


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_two_writers_racing_for_the_same_log_versions_on_s3_commit_each_once(
    store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path, table_format: str
) -> None:
    """Two processes commit overlapping batches to one table on S3, round after round,
    both aiming at the same next version: Delta's store makes each log version once
    (If-None-Match), Iceberg's catalog swaps its pointer once per snapshot; the loser
    re-reads and is refused or skips, and every transaction is in the table once."""
    import itertools
    import multiprocessing

    from tidemark.sink.schema import ColumnSpec, table_schema

    from .sink_support import rows_of

    server = store[0]
    root = f"s3://{BUCKET}/race-{secrets.token_hex(4)}"
    given = access(server, proxy.endpoint)
    objectstore.configure(given)
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}" if table_format == "iceberg" else ""
    _table(root, catalog).create(table_schema([ColumnSpec("id", 23)]), ["id"], {})
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    workers = [
        ctx.Process(target=_race, args=(given, root, catalog, off, start, out))
        for off in (0, BATCH // 2)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    ranges = sorted(r for _, committed, _, _ in results for r in committed)
    for (_, end), (first, _) in itertools.pairwise(ranges):
        assert first > end, ranges
    assert sum(fenced for _, _, fenced, _ in results) > 0, results
    table = _table(root, catalog)
    pairs = Counter((r["_lsn"], r["_op"]) for r in rows_of(table))
    assert max(pairs.values()) == 1
    assert sorted(lsn for lsn, _ in pairs) == [
        lsn for first, end in ranges for lsn in range(first, end + 1)
    ]
    assert table.committed_lsn() == ranges[-1][1]


def test_a_multipart_upload_left_incomplete_is_invisible_and_cannot_replace_an_entry(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """A writer killed during a multipart upload (S3A uploads a large file in parts)
    leaves an upload the store keeps but lists nowhere: a listing of the batch's
    folder (what a commit adds) does not see it, a log entry is put at that key
    meanwhile, and the old upload completed afterwards cannot replace the entry."""
    server = store[0]
    s3 = s3_client(server.endpoint)
    folder = uri("")
    entry = objectstore.join(folder, "_delta_log", "00000000000000000001.json")
    bucket, key = objectstore.split(str(entry))
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"zombie")
    data_key = objectstore.split(str(objectstore.join(folder, "data", "b", "part-0.parquet")))[1]
    s3.create_multipart_upload(Bucket=bucket, Key=data_key)
    assert objectstore.listing(folder) == []  # neither upload is an object
    assert objectstore.read(entry) is None
    assert objectstore.put_if_absent(entry, b"the commit")
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as refused:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
            IfNoneMatch="*",
        )
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert objectstore.read(entry) == b"the commit"


def test_threads_of_one_process_replacing_one_file_take_turns(proxy: Proxy) -> None:
    """Two writes of one state file from one process at once (the frontiers' periodic
    write and the one at a clean stop): each replaces the other's, none is refused as
    another writer's (the store's If-Match would refuse the second of two PUTs made
    with the same ETag)."""
    uri = f"s3://{BUCKET}/turns-{secrets.token_hex(4)}/_tidemark/frontiers.json"
    objectstore.replace(uri, b"0")
    failures: list[BaseException] = []

    def write(n: int) -> None:
        for i in range(10):
            try:
                objectstore.replace(uri, f"{n}-{i}".encode())
            except BaseException as exc:  # (collected for the assertion)
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures[:2]
    assert objectstore.read(uri) is not None


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_compaction_on_s3_rewrites_small_files_and_keeps_every_row(
    store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path, table_format: str
) -> None:
    """Upkeep's compaction on a table in the bucket: the small files of six commits
    rewritten into one (read and put through pyarrow's S3 client), one commit swapping
    them; the same rows, no ``(_lsn, _op)`` twice, and the new file under ``data/``."""
    from tidemark.sink.schema import ColumnSpec, table_schema

    from .sink_support import rows_of

    root = f"s3://{BUCKET}/compact-{secrets.token_hex(4)}"
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}" if table_format == "iceberg" else ""
    table = _table(root, catalog)
    table.create(table_schema([ColumnSpec("id", 23)]), ["id"], {})
    for i in range(6):
        first = i * BATCH + 1
        table.commit(
            _batch_files(table, first, first + BATCH - 1), first + BATCH - 1, {}, first_lsn=first
        )
    before = sorted((r["_lsn"], r["_op"]) for r in rows_of(table))
    assert len(table.active_files_with_sizes()) == 6
    done = table.compact(target_size=1 << 20)
    assert done["numFilesRemoved"] == 6 and done["numFilesAdded"] == 1, done
    files = table.active_files_with_sizes()
    assert len(files) == 1 and files[0][0].startswith("data/") and "compacted" in files[0][0]
    after = sorted((r["_lsn"], r["_op"]) for r in rows_of(_table(root, catalog)))
    assert after == before and len(set(after)) == len(after) == 6 * BATCH


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_damaged_table_on_s3_is_set_aside_and_made_again(
    store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path, table_format: str
) -> None:
    """A table on the bucket that its own log cannot read whole (a data file its
    commits name is gone, Delta) is set aside as on disk: every object below it copied
    to ``<root>/damaged/<shape>-<time>/`` and removed from its place (Iceberg: dropped
    from the catalog too), and the shape's table is made again, empty."""
    from tidemark.sink import table_format as format_named
    from tidemark.sink.schema import ColumnSpec, table_schema

    root = f"s3://{BUCKET}/aside-{secrets.token_hex(4)}"
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}" if table_format == "iceberg" else ""
    schema = table_schema([ColumnSpec("id", 23)])
    table = _table(root, catalog)
    table.create(schema, ["id"], {})
    for i in range(2):
        first = i * BATCH + 1
        table.commit(
            _batch_files(table, first, first + BATCH - 1), first + BATCH - 1, {}, first_lsn=first
        )
    place = objectstore.join(root, "tables", SHAPE)
    before = {f.name for f in objectstore.listing(place)}
    if table_format == "delta":  # a file its commits name, gone: the log reads it as damage
        from tidemark.errors import TableDamaged

        gone = next(n for n in before if n.startswith("data/") and n.endswith(".parquet"))
        objectstore.delete([objectstore.join(place, gone)])
        before.discard(gone)
        with pytest.raises(TableDamaged, match="missing"):
            _table(root, catalog).create(schema, ["id"], {})
    # when it is set aside
    damaged = _table(root, catalog)
    if table_format == "iceberg":
        from tidemark.settings.config import IcebergSettings

        tables = format_named("iceberg", IcebergSettings(catalog_uri=catalog))
    else:
        tables = format_named("delta")
    aside = tables.set_aside(damaged)
    # then every object of it is under damaged/, none is left in its place
    assert str(aside).startswith(f"{root}/damaged/{SHAPE}-"), aside
    assert {f.name for f in objectstore.listing(aside)} == before
    assert objectstore.listing(place) == []
    # and the shape's table is made again, empty
    again = _table(root, catalog)
    again.create(schema, ["id"], {})
    from .sink_support import rows_of

    assert rows_of(again) == []
