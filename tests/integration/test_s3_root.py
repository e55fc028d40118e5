"""An ``s3://`` sink root end to end (issue 52): the service streams into Delta tables
on a real S3 server (S3Proxy) behind a real proxy (Toxiproxy), Spark writing the data
files through S3A and the log entries and state files put with conditional PUTs.

Each run compares every shape, folded, with Postgres (through Spark and without it),
reads the tables with ``deltalake`` and Polars straight from the bucket, and checks
that no change row is there twice; at the end the format's own reader (delta-spark,
Iceberg's Spark runtime, in a Spark of its own) reads every table from the bucket.
Then the same with 20 ms added to every request (as on real S3), a restart on the same
root, and a partition of the store that the service rides out: the slot is not
acknowledged past what is in the tables meanwhile, and everything arrives once the
store is back.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from structlog.testing import capture_logs

from tidemark import read
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape, normalise
from tidemark.lsn import Lsn
from tidemark.state import objectstore
from tidemark.writers import job

from .conftest import PgDatabase
from .object_store_support import (
    REGION,
    HttpFaults,
    Proxy,
    S3Server,
    http_faults,
    object_store,
    require_object_store,
    s3_client,
)
from .service_support import (
    confirmed_flush,
    current_lsn,
    run_cli,
    running_service,
    settings_for,
    wait_frontiers,
)

BUCKET = "lake-e2e"

SCHEMA = """
create table accounts (id int primary key, owner text not null, balance numeric(12,2),
                       tier text, tags text[]);
alter table accounts replica identity full;
create table events (id bigint, kind text, payload jsonb);
alter table events replica identity full;
"""

SHAPES = [
    {"name": "rich", "table": "public.accounts", "where": "balance >= 1000"},
    {
        "name": "gold",
        "table": "public.accounts",
        "where": "tier = 'gold'",
        "columns": ["owner", "tier"],
    },
    {"name": "events", "table": "public.events"},  # keyless: duplicates kept
]

TRUTH = {
    "rich": "select * from accounts where balance >= 1000",
    "gold": "select id, owner, tier from accounts where tier = 'gold'",
    "events": "select id, kind, payload::text from events",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, Proxy]]:
    require_object_store(spark=True)
    with object_store(tmp_path_factory.mktemp("s3-root"), BUCKET) as pair:
        yield pair


@pytest.fixture
def proxy(store: tuple[S3Server, Proxy]) -> Iterator[Proxy]:
    yield store[1]
    store[1].clear()


def s3_settings(server: S3Server, proxy: Proxy) -> dict[str, Any]:
    return {
        "endpoint": proxy.endpoint,
        "region": REGION,
        "path_style": True,
        "access_key_id": server.identity,
        "secret_access_key": server.credential,
        "attempts": 3,
        "connect_timeout_s": 1.0,
        "read_timeout_s": 5.0,
    }


def settings(db: PgDatabase, root: str, server: S3Server, proxy: Proxy) -> Any:
    return settings_for(
        db.dsn,
        root,
        SHAPES,
        s3=s3_settings(server, proxy),
        current={"enabled": False},
    )


def current_settings(
    db: PgDatabase, root: str, server: S3Server, proxy: Proxy, **extra: Any
) -> Any:
    """``settings`` with the current-state tables on: refreshed every second, and
    folded at the clean stop (``extra``: more sections)."""
    return settings_for(
        db.dsn,
        root,
        SHAPES,
        s3=s3_settings(server, proxy),
        current={"enabled": True, "refresh_s": 1.0, "fold_on_stop": True},
        **extra,
    )


async def workload(db: PgDatabase, start: int) -> None:
    await db.aexecute(
        "insert into accounts select g, 'owner ' || g, (g * 37) %% 2500,"
        " (array['gold','silver'])[g %% 2 + 1], case when g %% 4 = 0 then null"
        " else array['a' || g] end from generate_series(%s::int, %s::int) g",
        (start, start + 199),
    )
    await db.aexecute(
        "insert into events select g %% 7, 'k' || (g %% 3), jsonb_build_object('n', g %% 5)"
        " from generate_series(%s::int, %s::int) g",
        (start, start + 299),
    )
    await db.aexecute(
        "update accounts set balance = balance + 1500 where id %% 7 = 0 and id >= %s::int", (start,)
    )
    await db.aexecute(
        "update accounts set tier = 'gold' where id %% 11 = 0 and id >= %s::int", (start,)
    )
    await db.aexecute("delete from accounts where id %% 13 = 0 and id >= %s::int", (start,))
    # one copy of a duplicated keyless row
    await db.aexecute("delete from events where ctid = (select min(ctid) from events where id = 3)")


def check_every_reader(spark: Any, db: PgDatabase, root: str, *, retained: bool = False) -> None:
    """Every shape, folded, equals Postgres: through Spark (S3A), through
    ``tidemark.read`` without Spark (pyarrow's S3), and no change row twice
    (``retained``: the changelog may be empty, its rows all in the current tables)."""
    from deltalake import DeltaTable

    options = objectstore.storage_options(root)
    with psycopg.connect(db.dsn) as conn:
        for shape, query in TRUTH.items():
            result = compare_shape(spark, root, shape, query, db.dsn)
            assert result.equal, result.describe()
            expected = Counter(tuple(map(normalise, r)) for r in conn.execute(query))
            got = read.arrow_current(root, shape)
            columns = [c for c in got.column_names if c != "_lsn"]
            rows = Counter(tuple(normalise(r[c]) for c in columns) for r in got.to_pylist())
            assert rows == expected, shape
            # deltalake straight from the bucket (its own S3 client): no row twice
            changes = DeltaTable(f"{root}/tables/{shape}", storage_options=options)
            pairs = Counter(
                (r["_lsn"], r["_op"])
                for r in changes.to_pyarrow_table(columns=["_lsn", "_op"]).to_pylist()
            )
            assert (pairs or retained) and max(pairs.values(), default=1) == 1, shape


def check_current_tables(db: PgDatabase, root: str, server: S3Server, proxy: Proxy) -> None:
    """Each shape's current-state table, read plainly from the bucket (deltalake,
    Polars and DuckDB with httpfs, no tidemark), equals Postgres: a clean stop folded
    it to the frontier. Spark wrote its files in place, in a folder of the refresh's
    own in each bucket."""
    import polars as pl
    from deltalake import DeltaTable

    from .outside_readers import duck_s3, records

    options = objectstore.storage_options(root)
    con = duck_s3(proxy.endpoint, server.identity, server.credential, REGION)
    with psycopg.connect(db.dsn) as conn:
        for shape, query in TRUTH.items():
            expected = Counter(tuple(map(normalise, r)) for r in conn.execute(query))
            uri = f"{root}/current/{shape}"
            table = DeltaTable(uri, storage_options=options)
            got = table.to_pyarrow_table()
            columns = [c for c in got.column_names if c != "_lsn"]
            rows = Counter(tuple(normalise(r[c]) for c in columns) for r in got.to_pylist())
            assert rows == expected, shape
            assert pl.read_delta(uri, storage_options=options).height == sum(expected.values())
            ducked = records(con, f"select * from delta_scan('{uri}')")
            assert Counter(tuple(normalise(r[c]) for c in columns) for r in ducked) == expected
            paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            assert all(p.startswith("bucket-") and "/r-" in p for p in paths), paths[:3]
    keys = [f.name for f in objectstore.listing(objectstore.join(root, "current"))]
    assert keys and not any("_staging" in k or "_temporary" in k for k in keys)


def s3a_counter(spark: Any, name: str) -> int:
    """A counter of the session's S3A filesystem for the test's bucket."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(f"s3a://{BUCKET}/"), conf)
    return int(fs.getIOStatistics().counters().get(name) or 0)


def test_the_files_a_round_writes_are_described_without_asking_the_store(
    spark: Any, store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path
) -> None:
    """A round's write into tables' folders on S3 (tidemark's commit protocol, with the
    report): each file's size is what the task wrote through S3A, kept by tidemark's S3A
    file system, so neither Spark's write statistics nor the report sends a HEAD per file
    (before: two). The sizes reported are the objects' sizes on the server."""
    from tidemark.jvm import DIRECT_COLUMN, DIRECT_REPORT, SIZED_S3A_CLASS
    from tidemark.sink.folder import take_reported
    from tidemark.spark import configure_s3a

    server, _ = store
    configure_s3a(spark, BUCKET, objectstore.S3Access(**s3_settings(server, proxy)).hadoop_conf())
    root = f"s3://{BUCKET}/sized-{secrets.token_hex(3)}"
    folders = [
        objectstore.s3a(objectstore.join(root, "tables", f"t{k}", "data", f"f{k}"))
        for k in range(12)
    ]
    rows = [(i, "x" * (i % 50), folders[i % len(folders)]) for i in range(1200)]
    frame = spark.createDataFrame(rows, f"id long, note string, {DIRECT_COLUMN} string")
    heads = s3a_counter(spark, "object_metadata_request")
    frame.repartition(3).write.partitionBy(DIRECT_COLUMN).mode("append").option(
        DIRECT_REPORT, "true"
    ).parquet(str(tmp_path / "scratch"))
    asked = s3a_counter(spark, "object_metadata_request") - heads
    reported = take_reported(spark, folders)

    fs = spark._jvm.org.apache.hadoop.fs.FileSystem.get(
        spark._jvm.java.net.URI(f"s3a://{BUCKET}/"), spark._jsc.hadoopConfiguration()
    )
    assert fs.getClass().getName() == SIZED_S3A_CLASS
    on_server = store_listing(server, root)
    files = {
        f"tables/t{k}/data/f{k}/{name}": size
        for k, folder in enumerate(folders)
        for name, size, _ in reported.get(folder, [])
    }
    # every file the tasks wrote is reported, with the size the server has
    assert sorted(files) == sorted(k for k in on_server if k.endswith(".parquet"))
    assert files == {k: on_server[k][0] for k in files}
    assert len(files) >= len(folders)
    # no HEAD at all (before: two per file, 72 for these 36)
    assert asked == 0, (asked, len(files))
    assert take_reported(spark, folders) == {}  # (taken: forgotten there)


def test_a_warm_up_on_s3_writes_a_round_in_place_under_the_root_and_deletes_it(
    spark: Any,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A service on an S3 root warms S3A's write path (its client, its upload pool,
    tidemark's commit protocol) at start: a made-up round written in place under
    ``<root>/_tidemark/warm/<uuid>``, one folder per made-up table, deleted after. What a
    killed service's warm-up left there goes at a later start, once an hour old."""
    from tidemark.spark import configure_s3a

    server, _ = store
    access = objectstore.S3Access(**s3_settings(server, proxy))
    configure_s3a(spark, BUCKET, access.hadoop_conf())
    before = objectstore.s3_access()
    objectstore.configure(access)
    try:
        root = f"s3://{BUCKET}/warm-{secrets.token_hex(3)}"
        warm = str(objectstore.join(root, "_tidemark", "warm"))
        # given what a killed service's warm-up left
        left = str(objectstore.join(warm, "killed", "t0", "r0", "part-0.parquet"))
        assert objectstore.put_if_absent(left, b"left")
        # when a warm-up writes (its deletion held back, to look)
        held: list[str] = []
        monkeypatch.setattr(job, "_delete_below", lambda folder, *_: held.append(folder))
        folder = str(objectstore.join(warm, "w1"))
        (tmp_path / "scratch").mkdir()
        stop = threading.Event()
        assert job.warm_up(spark, tmp_path / "scratch", stop, 1, 3, 5, remote=folder) == 1
        # then its files are on the store, a folder per made-up table, with their rows
        written = objectstore.listing(folder)
        assert sorted({f.name.split("/")[0] for f in written}) == ["t0", "t1", "t2"], written
        assert all(f.name.endswith(".parquet") and f.size > 0 for f in written), written
        back = spark.read.parquet(objectstore.s3a(objectstore.join(folder, "t1", "r0")))
        assert back.count() == 5
        assert held == [folder] and not (tmp_path / "scratch").exists()
        assert not job.needs_warm_up(spark, remote=True)  # once per JVM
        monkeypatch.undo()
        job._delete_below(folder)
        assert objectstore.listing(folder) == []
        # and the leftover stays while it may be another instance's warm-up, still
        # writing; once older than an hour, it goes
        job.forget_warm_leftovers(warm)
        assert [f.name for f in objectstore.listing(warm)] == ["killed/t0/r0/part-0.parquet"]
        monkeypatch.setattr(job, "WARM_LEFTOVER_S", -60.0)  # (an hour passed)
        job.forget_warm_leftovers(warm)
        assert objectstore.listing(warm) == []
    finally:
        objectstore.configure(before)


def test_a_delta_table_on_s3_is_found_by_one_list_that_lets_other_threads_run(
    store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """Whether a folder on the store holds a Delta table: one LIST of its log's first
    names, through botocore, which lets Python's other threads run while it waits for
    the reply (deltalake's ``is_deltatable`` holds the GIL meanwhile: threads checking
    tables took turns)."""
    from concurrent.futures import ThreadPoolExecutor

    from deltalake import DeltaTable, write_deltalake

    from tidemark.sink.delta.log import delta_exists

    server, _ = store
    before = objectstore.s3_access()
    objectstore.configure(objectstore.S3Access(**s3_settings(server, proxy)))
    try:
        table = f"s3://{BUCKET}/exists-{secrets.token_hex(3)}/t"
        options = objectstore.storage_options(table)
        # nothing there; then only a writer's temporary file in the log: no table
        assert not delta_exists(table, options)
        assert objectstore.put_if_absent(f"{table}/_delta_log/_commit_x.json.tmp", b"{}")
        assert not delta_exists(table, options)
        # a table: found with one LIST, as deltalake finds it
        write_deltalake(table, pa.table({"a": [1, 2]}), storage_options=options)
        lists = objectstore.requests_made().get("LIST", 0)
        assert delta_exists(table, options)
        assert objectstore.requests_made()["LIST"] - lists == 1
        assert DeltaTable.is_deltatable(table, storage_options=options)
        # 200 ms on every reply: 8 checks in 8 threads wait for about one reply, not 8
        proxy.latency(200)
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(lambda _: delta_exists(table, options), range(8)))
        assert time.monotonic() - started < 1.0
    finally:
        proxy.clear()
        objectstore.configure(before)


def test_a_write_whose_uploads_fail_fails_and_reports_no_file(
    spark: Any, store: tuple[S3Server, Proxy], faults: HttpFaults, tmp_path: Path
) -> None:
    """A task does not wait for the upload of a file it closes (tidemark's S3A file
    system uploads it beside the task), but it commits only once every upload of its
    files returned: when the store refuses them, the write fails and no file is
    reported, so no commit can name a file the store does not hold."""
    from tidemark.jvm import DIRECT_COLUMN, DIRECT_REPORT
    from tidemark.sink.folder import take_reported
    from tidemark.spark import configure_s3a

    server, proxy = store
    bucket = f"refusing-{secrets.token_hex(3)}"  # (S3A keeps a file system per bucket)
    s3_client(server.endpoint).create_bucket(Bucket=bucket)
    through_faults = {**s3_settings(server, proxy), "endpoint": faults.endpoint}
    configure_s3a(spark, bucket, objectstore.S3Access(**through_faults).hadoop_conf())
    folders = [objectstore.s3a(f"s3://{bucket}/t{k}/data/f{k}") for k in range(6)]
    rows = [(i, folders[i % len(folders)]) for i in range(60)]
    frame = spark.createDataFrame(rows, f"id long, {DIRECT_COLUMN} string")
    writer = frame.coalesce(1).write.partitionBy(DIRECT_COLUMN).mode("append")
    faults.refuse(403, "AccessDenied", methods=("PUT",))
    try:
        with pytest.raises(Exception, match=r"AccessDenied|403"):
            writer.option(DIRECT_REPORT, "true").parquet(str(tmp_path / "refused"))
        assert faults.counts()["made"].get("403", 0) >= 1
    finally:
        faults.clear()
    assert take_reported(spark, folders) == {}
    # the store taking PUTs again, the same write passes and reports each file it holds
    frame.coalesce(1).write.partitionBy(DIRECT_COLUMN).mode("append").option(
        DIRECT_REPORT, "true"
    ).parquet(str(tmp_path / "taken"))
    reported = take_reported(spark, folders)
    assert sorted(reported) == sorted(folders)
    held = {
        o["Key"]: o["Size"]
        for o in s3_client(server.endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])
    }
    for folder, files in reported.items():
        prefix = folder.split("/", 3)[3]
        for name, size, _ in files:
            assert held[f"{prefix}/{name}"] == size


async def test_a_delta_root_on_s3_equals_postgres(
    pg_db: PgDatabase,
    spark: Any,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = store[0]
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/lake"
    await pg_db.aexecute(SCHEMA)
    await workload(pg_db, 1)  # before the start: the backfill's snapshot
    config = current_settings(pg_db, root, server, proxy)
    # (the suite's JVM taken for a fresh one: the service warms S3A's write path)
    monkeypatch.setattr(job, "_WARMED", set())
    with capture_logs() as logs:
        async with running_service(config, spark) as service:
            await workload(pg_db, 1000)
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            ready, reasons = service.readiness()
            assert ready, reasons
    # it warmed on the store, and deleted what it wrote there before it was done
    (warmed,) = [e for e in logs if e["event"] == "spark.warmed"]
    assert warmed["on"] == "s3" and warmed["rounds"] == 1, warmed
    assert objectstore.listing(objectstore.join(root, "_tidemark", "warm")) == []
    check_every_reader(spark, pg_db, root)
    check_current_tables(pg_db, root, server, proxy)
    # retention: the changelog rows the current tables hold folded are dropped, Spark
    # rewriting the files that held them in place; every reader still gets Postgres
    from tidemark.sink import retention

    for shape in TRUTH:
        done = retention.compact_changelog(spark, root, shape, 0, now_ms=2**62)
        assert done is not None and done.files_removed > 0, shape
    check_every_reader(spark, pg_db, root, retained=True)
    # nothing of the root on the local disk but scratch: the tables and state are objects
    keys = {f.name for f in objectstore.listing(root)}
    for name in ("_tidemark/format.json", "_tidemark/frontiers.json", "_tidemark/claims.json"):
        assert name in keys, sorted(keys)[:20]
    assert any(k.startswith("tables/rich/_delta_log/") for k in keys)
    assert any(k.startswith("tables/rich/data/") and k.endswith(".parquet") for k in keys)
    assert not any("_temporary" in k for k in keys)
    # written in place: S3A renamed nothing (a rename on S3 is a copy and a delete)
    assert s3a_counter(spark, "op_rename") == 0
    assert s3a_counter(spark, "object_put_request") > 0

    # 20 ms on every request, as on real S3; then a restart on the same root
    proxy.latency(20)
    listed: list[str] = []
    real_listing = objectstore.listing

    def listing(location: Any, *args: Any, **kwargs: Any) -> Any:  # (the real one, noted)
        listed.append(str(location))
        return real_listing(location, *args, **kwargs)

    monkeypatch.setattr(objectstore, "listing", listing)
    async with running_service(config, spark) as service:
        await workload(pg_db, 2000)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    monkeypatch.undo()
    check_every_reader(spark, pg_db, root)
    check_current_tables(pg_db, root, server, proxy)
    # the files Spark wrote (a round's, a large batch's) are described as its tasks
    # reported them: no data/<uuid> folder is listed (before: a LIST per shape per
    # round, and one per batch written alone)
    assert listed, "the service listed nothing at all: the spy is not in the way"
    assert not [p for p in listed if re.search(r"/tables/[a-z_]+/data/[0-9a-f-]{36}$", p)], listed

    # the command line reads the bucket with [s3] from a settings file: tidemark read
    # (pyarrow), tidemark read --spark (its own Spark, S3A on its class path), tables
    secret = tmp_path / "s3-secret"
    secret.write_text(server.credential)
    config = tmp_path / "read.toml"
    config.write_text(
        f'[sink]\nroot = "{root}"\n[current]\nenabled = false\n'
        f'[s3]\nendpoint = "{proxy.endpoint}"\npath_style = true\n'
        f'access_key_id = "{server.identity}"\nsecret_access_key_file = "{secret}"\n'
    )
    with psycopg.connect(pg_db.dsn) as conn:
        truth = Counter(tuple(map(normalise, r)) for r in conn.execute(TRUTH["gold"]).fetchall())
    for spark_flag in ([], ["--spark"]):
        done = run_cli("read", "gold", "--config", str(config), "-o", "json", *spark_flag)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = json.loads(done.stdout)["rows"]
        got = Counter((r["id"], r["owner"], r["tier"]) for r in rows)
        assert got == truth, spark_flag
    listed = run_cli("tables", "--config", str(config), "-o", "json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert sorted(t["shape"] for t in json.loads(listed.stdout)) == sorted(TRUTH)

    # Polars reads the same table from the bucket (delta-rs underneath)
    import polars as pl

    frame = pl.read_delta(f"{root}/tables/gold", storage_options=objectstore.storage_options(root))
    assert frame.height > 0 and {"owner", "tier", "_lsn", "_op"} <= set(frame.columns)
    proxy.clear()  # (the latency is for the service: the readers' requests need not wait)
    check_reference_reader(pg_db, root, tmp_path / "reference")


def check_reference_reader(
    db: PgDatabase, root: str, work: Path, catalog_uri: str | None = None
) -> None:
    """The format's own reader in a Spark of its own, through S3A of its own Hadoop
    (delta-spark; Iceberg's runtime with its JDBC catalog on ``catalog_uri``) reads every
    changelog from the bucket as ``tidemark.read`` does and every current table equal
    to Postgres (Delta: with the protocol tidemark declares)."""
    import pyarrow.parquet as pq

    from .reference_support import (
        equals_postgres,
        postgres_catalog,
        postgres_rows,
        reference_read,
        same_rows,
    )

    access = objectstore.s3_access()
    assert access is not None
    hadoop = access.hadoop_conf()
    reads: list[dict[str, Any]] = []
    for shape in TRUTH:
        for kind in ("tables", "current"):
            if catalog_uri is None:
                path = objectstore.s3a(objectstore.join(root, kind, shape))
                reads.append({"id": f"{kind}-{shape}", "delta": path, "version": None})
                reads.append({"id": f"detail-{kind}-{shape}", "delta_detail": path})
            else:
                namespace = "tidemark" if kind == "tables" else "tidemark_current"
                reads.append({"id": f"{kind}-{shape}", "iceberg": f"{namespace}.{shape}"})
    catalog = None
    if catalog_uri is not None:
        catalog = postgres_catalog(catalog_uri, objectstore.s3a(root))
        hadoop["fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"  # s3:// locations
    answers = reference_read(work, reads, catalog, hadoop=hadoop)
    for shape, query in TRUTH.items():
        changes = pq.read_table(work / f"tables-{shape}.parquet")
        same_rows(changes, read.arrow_changelog(root, shape), f"changelog {shape}")
        current = pq.read_table(work / f"current-{shape}.parquet")
        equals_postgres(current, postgres_rows(db.dsn, query), f"current {shape}")
        for kind in ("tables", "current") if catalog_uri is None else ():
            detail = answers[f"detail-{kind}-{shape}"]
            assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2), detail


async def test_teardown_purge_removes_the_instances_objects_from_the_bucket(
    pg_db: PgDatabase, spark: Any, store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """``teardown --purge`` on an ``s3://`` root: the slot, the publication and every
    object of the instance under the root go; an object beside the root stays."""
    from tidemark.cli.teardown import carry_out, make_plan

    server = store[0]
    base = f"s3://{BUCKET}/{secrets.token_hex(4)}"
    root = f"{base}/lake"
    await pg_db.aexecute(SCHEMA)
    await workload(pg_db, 1)
    config = current_settings(pg_db, root, server, proxy)
    async with running_service(config, spark) as service:
        await workload(pg_db, 1000)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    beside = f"{base}/lake-notes.txt"  # (shares the root's prefix as text, not as a folder)
    assert objectstore.put_if_absent(beside, b"not tidemark's")
    assert any(f.name.startswith("tables/rich/") for f in objectstore.listing(root))
    # when the plan is made and carried out
    plan = await make_plan(config, purge=True)
    assert f"{root}/tables/rich" in plan.paths and f"{root}/current/rich" in plan.paths
    assert f"{root}/_tidemark" in plan.paths
    done = await carry_out(config, plan)
    # then nothing of the root is left, the slot is gone, and the object beside it stays
    assert objectstore.listing(root) == [], objectstore.listing(root)[:5]
    assert f"removed {root}/tables/rich" in done
    slots = "select 1 from pg_replication_slots where slot_name = 'tm_e2e'"
    assert await pg_db.aexecute(slots) == []
    assert objectstore.read(beside) == b"not tidemark's"


@pytest.fixture
def iceberg_catalog(pg_db: PgDatabase, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PostgreSQL database of its own as the Iceberg catalog (the catalog an
    object-store root needs), also for the readers (``TIDEMARK_ICEBERG__CATALOG_URI``)."""
    from tidemark.sink.iceberg.catalog import forget_catalogs

    name = f"{pg_db.name}_catalog"
    with psycopg.connect(pg_db.server.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    uri = pg_db.server.dsn_for(name)
    monkeypatch.setenv("TIDEMARK_ICEBERG__CATALOG_URI", uri)
    try:
        yield uri
    finally:
        forget_catalogs()
        with psycopg.connect(pg_db.server.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


def iceberg_settings(db: PgDatabase, root: str, server: S3Server, proxy: Proxy, uri: str) -> Any:
    return current_settings(
        db, root, server, proxy, sink={"format": "iceberg"}, iceberg={"catalog_uri": uri}
    )


def check_iceberg_readers(
    spark: Any, db: PgDatabase, root: str, uri: str, server: S3Server, proxy: Proxy
) -> None:
    """Every shape, folded, equals Postgres through Spark (S3A) and ``tidemark.read``;
    pyiceberg with its own catalog connection and S3 client reads every table from
    the bucket, no change row twice."""
    from pyiceberg.catalog.sql import SqlCatalog

    with psycopg.connect(db.dsn) as conn:
        for shape, query in TRUTH.items():
            result = compare_shape(spark, root, shape, query, db.dsn)
            assert result.equal, result.describe()
            expected = Counter(tuple(map(normalise, r)) for r in conn.execute(query))
            got = read.arrow_current(root, shape)
            columns = [c for c in got.column_names if c != "_lsn"]
            rows = Counter(tuple(normalise(r[c]) for c in columns) for r in got.to_pylist())
            assert rows == expected, shape
    outside = SqlCatalog(
        "tidemark",  # (the catalog's name in its tables: tidemark's)
        uri=uri.replace("postgresql://", "postgresql+psycopg://", 1),
        **{
            "s3.endpoint": proxy.endpoint,
            "s3.region": REGION,
            "s3.access-key-id": server.identity,
            "s3.secret-access-key": server.credential,
        },
    )
    try:
        for shape in TRUTH:
            table = outside.load_table(("tidemark", shape))
            assert table.location().startswith(f"{root}/tables/{shape}")
            changes = table.scan(selected_fields=("_lsn", "_op")).to_arrow()
            lsns, ops = (changes.column(c).to_pylist() for c in ("_lsn", "_op"))
            pairs = Counter(zip(lsns, ops, strict=True))
            assert pairs and max(pairs.values()) == 1, shape
        # the current-state tables, folded at the clean stop: the state, plainly
        with psycopg.connect(db.dsn) as conn:
            for shape, query in TRUTH.items():
                expected = Counter(tuple(map(normalise, r)) for r in conn.execute(query))
                state = outside.load_table(("tidemark_current", shape)).scan().to_arrow()
                columns = [c for c in state.column_names if c != "_lsn"]
                got = Counter(tuple(normalise(r[c]) for c in columns) for r in state.to_pylist())
                assert got == expected, shape
    finally:
        outside.engine.dispose()


async def test_an_iceberg_root_on_s3_equals_postgres(
    pg_db: PgDatabase,
    spark: Any,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    iceberg_catalog: str,
    tmp_path: Path,
) -> None:
    """Iceberg tables on the bucket, registered in a PostgreSQL catalog: Spark writes
    the data files in place through S3A, pyiceberg puts each metadata file with
    ``If-None-Match`` and the catalog's swap commits. Under 20 ms a request, then a
    restart on the same root."""
    server = store[0]
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/berg"
    await pg_db.aexecute(SCHEMA)
    await workload(pg_db, 1)
    config = iceberg_settings(pg_db, root, server, proxy, iceberg_catalog)
    puts_before = objectstore.requests_made().get("PUT", 0)
    async with running_service(config, spark) as service:
        await workload(pg_db, 1000)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        ready, reasons = service.readiness()
        assert ready, reasons
    check_iceberg_readers(spark, pg_db, root, iceberg_catalog, server, proxy)
    keys = {f.name for f in objectstore.listing(root)}
    assert "_tidemark/format.json" in keys and "_tidemark/frontiers.json" in keys
    assert any(k.startswith("tables/rich/metadata/") and k.endswith(".metadata.json") for k in keys)
    assert any(k.startswith("tables/rich/data/") and k.endswith(".parquet") for k in keys)
    assert not any("_temporary" in k or k.startswith("_tidemark/iceberg.db") for k in keys)
    # the metadata files went through tidemark's conditional PUTs
    assert objectstore.requests_made().get("PUT", 0) - puts_before > len(
        [k for k in keys if k.endswith(".metadata.json")]
    )

    proxy.latency(20)
    async with running_service(config, spark) as service:
        await workload(pg_db, 2000)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    check_iceberg_readers(spark, pg_db, root, iceberg_catalog, server, proxy)
    proxy.clear()  # (the latency is for the service: the readers' requests need not wait)
    check_reference_reader(pg_db, root, tmp_path / "reference", iceberg_catalog)


async def test_a_partition_of_the_store_holds_the_acknowledgement_back(
    pg_db: PgDatabase, spark: Any, store: tuple[S3Server, Proxy], proxy: Proxy
) -> None:
    """While the store cannot be reached, rounds fail and are retried; the slot is
    not acknowledged past what the tables hold; once it is back, every change arrives
    once."""
    server = store[0]
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/lake"
    await pg_db.aexecute(SCHEMA)
    config = settings(pg_db, root, server, proxy)
    async with running_service(config, spark) as service:
        await workload(pg_db, 1)
        before = current_lsn(pg_db.dsn)
        await wait_frontiers(service, before)
        await asyncio.sleep(1.5)  # the acknowledgement catches up
        acked = confirmed_flush(pg_db.dsn)
        with proxy.partitioned():
            await workload(pg_db, 1000)
            during = current_lsn(pg_db.dsn)
            await asyncio.sleep(6)  # rounds fail meanwhile (3 tries, 1 s connect timeout)
            assert confirmed_flush(pg_db.dsn) < during
            failing = [n for n, s in service.shapes.items() if s.state == "error"]
            frontiers = service.progress().frontiers
            assert failing or all(frontiers.get(n, 0) < during for n in service.shapes)
        await wait_frontiers_after_errors(service, during)
        assert confirmed_flush(pg_db.dsn) >= acked
    check_every_reader(spark, pg_db, root)


@pytest.fixture(scope="module")
def faults(
    store: tuple[S3Server, Proxy], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpFaults]:
    """An HTTP proxy that makes up S3 errors, in front of the Toxiproxy proxy."""
    with http_faults(tmp_path_factory.mktemp("faults"), store[1].endpoint) as made:
        yield made


async def wait_for_error(service: Any, words: str, timeout: float = 90) -> str:
    """Until a shape is in error with ``words`` in its message; the message."""
    async with asyncio.timeout(timeout):
        while True:
            for name in service.shapes:
                state, error = service.shape_state(name)
                if state == "error" and words in (error or ""):
                    return str(error)
            await asyncio.sleep(0.1)


async def test_throttling_and_revoked_credentials_hold_the_acknowledgement_and_heal(
    pg_db: PgDatabase,
    spark: Any,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    faults: HttpFaults,
) -> None:
    """The store's own refusals, mid-run, from an HTTP proxy that makes them up: a tenth
    of all requests answered ``503 SlowDown`` (tidemark's, pyarrow's and S3A's clients
    retry with backoff: every change arrives); then every request throttled, then
    every request refused ``403 AccessDenied`` (credentials revoked): the shapes go to
    ``error`` with a message that says which and what to do, the slot is not
    acknowledged past the tables meanwhile, and everything arrives once it is over."""
    server = store[0]
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/refused"
    await pg_db.aexecute(SCHEMA)
    given = s3_settings(server, proxy) | {"endpoint": faults.endpoint}
    config = settings_for(pg_db.dsn, root, SHAPES, s3=given, current={"enabled": False})
    faults.clear()
    async with running_service(config, spark) as service:
        await workload(pg_db, 1)
        await wait_frontiers(service, current_lsn(pg_db.dsn))

        faults.refuse(503, "SlowDown", rate=0.1)
        # (a tenth of the requests: one is refused once ten have come; a round of these
        # few shapes makes fewer, so more workloads come until one was, at most five)
        for start in range(1000, 2000, 200):
            await workload(pg_db, start)
            await wait_frontiers_after_errors(service, current_lsn(pg_db.dsn))
            counts = faults.counts()
            if counts["made"].get("503", 0) > 0:
                break
        assert counts["made"].get("503", 0) > 0, counts

        # (PUTs throttled: Spark's writes through S3A meet it first; then everything)
        for start, status, code, methods, words in (
            (2000, 503, "SlowDown", ("PUT",), "throttling"),
            (3000, 403, "AccessDenied", (), "credentials"),
        ):
            await asyncio.sleep(1.5)  # the acknowledgement catches up
            acked = confirmed_flush(pg_db.dsn)
            faults.refuse(status, code, methods=methods)
            await workload(pg_db, start)
            during = current_lsn(pg_db.dsn)
            message = await wait_for_error(service, words)
            assert "Traceback" not in message and server.credential not in message, message
            assert acked <= confirmed_flush(pg_db.dsn) < during
            made = faults.clear()["made"]
            assert made.get(str(status), 0) > 0
            await wait_frontiers_after_errors(service, during)
    check_every_reader(spark, pg_db, root)


async def wait_frontiers_after_errors(service: Any, lsn: int, timeout: float = 120) -> None:
    """Until every shape's frontier is at or past ``lsn`` (shapes in error meanwhile are
    expected: their rounds are retried)."""
    async with asyncio.timeout(timeout):
        while True:
            frontiers = service.progress().frontiers
            if service.shapes and all(frontiers.get(n, -1) >= lsn for n in service.shapes):
                return
            await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("credentials", "refused the credentials"),
        ("bucket", "the bucket 'no-such-bucket' does not exist: create it"),
        ("unreachable", "reachable?"),
    ],
)
def test_a_root_the_store_refuses_stops_run_and_config_check(
    pg_db: PgDatabase,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    tmp_path: Path,
    problem: str,
    expected: str,
) -> None:
    """Wrong credentials, a missing bucket, a store that does not answer: ``config
    check`` fails its sink check and ``run`` exits with 4 before Spark starts, the
    setting named and what to do said; never a traceback, never the secret."""
    server = store[0]
    pg_db.execute("create table orders (id int primary key)")
    bucket = "no-such-bucket" if problem == "bucket" else BUCKET
    secret = tmp_path / "s3-secret"
    secret.write_text("wrong-secret\n" if problem == "credentials" else server.credential)
    endpoint = "http://127.0.0.1:1" if problem == "unreachable" else proxy.endpoint
    config = tmp_path / "tidemark.toml"
    config.write_text(
        f'[source]\ndsn = "{pg_db.dsn}"\n'
        f'[sink]\nroot = "s3://{bucket}/{secrets.token_hex(3)}"\n'
        "[current]\nenabled = false\n"
        f'[s3]\nendpoint = "{endpoint}"\npath_style = true\nattempts = 2\n'
        f'connect_timeout_s = 1\naccess_key_id = "{server.identity}"\n'
        f'secret_access_key_file = "{secret}"\n'
        '[[shapes]]\nname = "orders"\ntable = "public.orders"\n'
    )
    check = run_cli("config", "check", "--config", str(config))
    assert check.returncode == 4, check.stdout + check.stderr
    assert expected in check.stdout + check.stderr
    started = time.monotonic()
    done = run_cli("run", "--config", str(config))
    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "[sink] root = 's3://" in output and expected in output
    assert "Traceback" not in output and "log4j" not in output
    assert server.credential not in output and "wrong-secret" not in output
    assert time.monotonic() - started < 30


def test_config_check_says_a_root_on_s3_works(
    pg_db: PgDatabase, store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path
) -> None:
    server = store[0]
    pg_db.execute("create table orders (id int primary key)")
    secret = tmp_path / "s3-secret"
    secret.write_text(server.credential)
    config = tmp_path / "tidemark.toml"
    config.write_text(
        f'[source]\ndsn = "{pg_db.dsn}"\n'
        f'[sink]\nroot = "s3://{BUCKET}/checked"\n'
        "[current]\nenabled = false\n"
        f'[s3]\nendpoint = "{proxy.endpoint}"\npath_style = true\n'
        f'access_key_id = "{server.identity}"\nsecret_access_key_file = "{secret}"\n'
        '[[shapes]]\nname = "orders"\ntable = "public.orders"\n'
    )
    check = run_cli("config", "check", "--config", str(config))
    output = check.stdout + check.stderr
    assert "written, read and removed a file" in output, output
    assert server.credential not in output


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_service_sigkilled_five_times_on_s3_loses_and_duplicates_nothing(
    pg_db: PgDatabase,
    spark: Any,
    store: tuple[S3Server, Proxy],
    proxy: Proxy,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    table_format: str,
) -> None:
    """``tidemark run`` (a real process, its own Spark with S3A) on an ``s3://`` root,
    SIGKILLed five times during rounds under 20 ms of latency per request, its current
    tables refreshed every second meanwhile: every shape (read through its current
    table and the changelog's tail) equals Postgres, no ``(_lsn, _op)`` twice, and no
    sampled acknowledgement ever passed what the tables on the store held. Iceberg: the
    catalog in PostgreSQL."""
    from .test_e2e_crash import TRUTH as KILLED_TRUTH
    from .test_e2e_crash import killed_runs

    server = store[0]
    secret = tmp_path / "s3-secret"
    secret.write_text(server.credential)
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/killed"
    objectstore.configure(objectstore.S3Access(**s3_settings(server, proxy)))
    proxy.latency(20)
    env = {
        "TIDEMARK_SINK__ROOT": root,
        # refreshes of the current tables under the kills too (a kill mid-refresh)
        "TIDEMARK_CURRENT__ENABLED": "true",
        "TIDEMARK_CURRENT__REFRESH_S": "1",
        "TIDEMARK_S3__ENDPOINT": proxy.endpoint,
        "TIDEMARK_S3__REGION": REGION,
        "TIDEMARK_S3__PATH_STYLE": "true",
        "TIDEMARK_S3__ACCESS_KEY_ID": server.identity,
        "TIDEMARK_S3__SECRET_ACCESS_KEY_FILE": str(secret),
        "TIDEMARK_SPARK__WARM_UP": "false",
    }
    if table_format == "iceberg":
        env["TIDEMARK_SINK__FORMAT"] = "iceberg"
        env["TIDEMARK_ICEBERG__CATALOG_URI"] = request.getfixturevalue("iceberg_catalog")
    killed_runs(pg_db, tmp_path, spark, root, env, kills=5)
    # (and the current tables were refreshed meanwhile: the reads above went through them)
    tables = {
        f.name.split("/", 1)[0] for f in objectstore.listing(objectstore.join(root, "current"))
    }
    assert tables == set(KILLED_TRUTH), tables


def store_listing(server: S3Server, root: str) -> dict[str, tuple[int, str]]:
    """Every object under ``root``: size and ETag (its content's digest), from the
    server itself (no proxy between)."""
    bucket, prefix = objectstore.split(root)
    client = s3_client(server.endpoint, attempts=3)
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            out[item["Key"][len(prefix) + 1 :]] = (int(item["Size"]), str(item["ETag"]))
    return out


def delta_commit_infos(root: str, shape: str) -> list[dict[str, Any]]:
    """The commitInfo of every log entry of the shape's changelog, oldest first."""
    log_dir = objectstore.join(root, "tables", shape, "_delta_log")
    out = []
    for entry in objectstore.listing(log_dir):
        if "/" in entry.name or not entry.name.endswith(".json"):
            continue
        text = objectstore.read_text(objectstore.join(log_dir, entry.name)) or ""
        for line in text.splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                out.append(action["commitInfo"])
    return out


def test_a_leader_deposed_while_alive_on_s3_writes_nothing_and_exits(
    pg_db: PgDatabase, spark: Any, store: tuple[S3Server, Proxy], proxy: Proxy, tmp_path: Path
) -> None:
    """Two ``tidemark run`` on one slot and one ``s3://`` root (``test_deposed_leader``
    on a bucket, 20 ms a request): the leader is SIGSTOPped mid-stream and its lease
    session ended; the standby takes over; then the new leader's whole tree is frozen
    and the old one continued. Nothing under the root changes meanwhile but data files
    its Spark tasks were already writing (no ETag of a log entry or state file moves:
    the store refuses its conditional PUTs, its epoch check the rest); it exits with
    1; every shape equals Postgres, no ``(_lsn, _op)`` twice, and every commit after
    the new leader's mark carries its epoch."""
    from tidemark.state.fencing import read_epoch

    from . import test_deposed_leader as deposed
    from .remote_service import service_env, start_service, stop_service, tail, wait_shapes
    from .test_backfill import keys_unique

    server = store[0]
    pg_db.execute(deposed.SCHEMA)
    root = f"s3://{BUCKET}/{secrets.token_hex(4)}/ha"
    objectstore.configure(objectstore.S3Access(**s3_settings(server, proxy)))
    proxy.latency(20)
    secret = tmp_path / "s3-secret"
    secret.write_text(server.credential)
    slot = "tm_deposed"
    ports = [free_port(), free_port()]
    logs = [tmp_path / "old.log", tmp_path / "new.log"]
    envs = []
    for port in ports:
        env = service_env(
            dsn=pg_db.dsn, root=tmp_path / "lake", port=port, name=slot, shapes=deposed.SHAPES
        )
        env |= {
            "TIDEMARK_SINK__ROOT": root,
            "TIDEMARK_CURRENT__ENABLED": "false",
            "TIDEMARK_S3__ENDPOINT": proxy.endpoint,
            "TIDEMARK_S3__REGION": REGION,
            "TIDEMARK_S3__PATH_STYLE": "true",
            "TIDEMARK_S3__ACCESS_KEY_ID": server.identity,
            "TIDEMARK_S3__SECRET_ACCESS_KEY_FILE": str(secret),
            "TIDEMARK_SPARK__WARM_UP": "false",
        }
        envs.append(env)
    old = start_service(envs[0], logs[0])
    new = None
    workload = deposed.Workload(pg_db.dsn)
    try:
        deposed.wait_role(ports[0], "leader", old, logs[0], timeout=240)
        new = start_service(envs[1], logs[1])
        deposed.wait_role(ports[1], "standby", new, logs[1], timeout=240)
        workload.start()
        time.sleep(6.0)  # rounds and their Spark jobs under way
        old_epoch = read_epoch(root)
        lease_pid = deposed.lease_backend(pg_db.dsn, slot)
        os.kill(old.pid, signal.SIGSTOP)
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("select pg_terminate_backend(%s)", (lease_pid,))
        deposed.wait_role(ports[1], "leader", new, logs[1], timeout=120)
        new_epoch = read_epoch(root)
        assert new_epoch == old_epoch + 1
        time.sleep(3.0)  # the new leader commits
        deposed.signal_tree(new.pid, signal.SIGSTOP)
        time.sleep(0.5)
        before = store_listing(server, root)
        os.kill(old.pid, signal.SIGCONT)
        continued = time.monotonic()
        code = old.wait(timeout=60)
        exited_in = time.monotonic() - continued
        after = store_listing(server, root)
        deposed.signal_tree(new.pid, signal.SIGCONT)
        text = logs[0].read_text()
        assert code == 1, tail(logs[0])
        assert "lease.deposed" in text or "was lost" in text, tail(logs[0])
        assert exited_in < 30, f"exited {exited_in:.1f} s after it ran again:\n{tail(logs[0])}"
        assert "invariant.violated" not in text, tail(logs[0])
        changed = deposed.changed_paths(before, after)  # type: ignore[arg-type]
        in_flight = [p for p in changed if p not in before and deposed._task_output(p)]
        wrote = [p for p in changed if p not in in_flight]
        assert not wrote, f"the deposed leader wrote under the root: {wrote}"
        workload.stop.set()
        workload.join(timeout=30)
        wait_shapes(ports[1], str(Lsn(current_lsn(pg_db.dsn))), list(deposed.TRUTH), timeout=180)
    finally:
        workload.stop.set()
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                deposed.signal_tree(proc.pid, signal.SIGCONT)
        if old.poll() is None:
            old.kill()
        if new is not None:
            stop_service(new, logs[1])
    print(f"in flight: {len(in_flight)} data files; {workload.transactions} transactions")
    for shape, query in deposed.TRUTH.items():
        result = compare_shape(spark, root, shape, query, pg_db.dsn)
        assert result.equal, result.describe()
        assert keys_unique(root, shape), shape  # type: ignore[arg-type]
        infos = delta_commit_infos(root, shape)
        marks = [i for i, c in enumerate(infos) if c.get("tidemark.operation") == "epoch"]
        after_mark = infos[marks[-1] + 1 :] if marks else infos
        assert marks and infos[marks[-1]].get("tidemark.epoch") == str(new_epoch), shape
        assert {c.get("tidemark.epoch") for c in after_mark} <= {str(new_epoch)}, shape
