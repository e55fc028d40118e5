"""Backfill: shapes on tables that already have rows, merged with the live stream
exactly once; resync while writing; edge cases. Every test compares the folded
shape with Postgres."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tidemark.backfill import reader, runner
from tidemark.demo.verify import compare_shape
from tidemark.errors import ShapeError
from tidemark.shapes.model import ShapeDefinition
from tidemark.sink.delta.table import ShapeTable, table_path
from tidemark.sink.schema import ColumnSpec, table_schema

from .conftest import PgDatabase
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .sink_support import rows_of


class Writer(threading.Thread):
    """Inserts, updates moving rows across the predicate, deletes, in small txns."""

    def __init__(self, dsn: str, start_id: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id = dsn, start_id
        self.stop = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(5)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    for _ in range(rng.randint(1, 10)):
                        roll = rng.random()
                        if roll < 0.4:
                            conn.execute(
                                "insert into items values (%s, %s, 'new')",
                                (self.next_id, rng.randint(0, 99)),
                            )
                            self.next_id += 1
                        elif roll < 0.85:
                            conn.execute(
                                "update items set score = %s, note = note || '+' where id = %s",
                                (rng.randint(0, 99), rng.randint(1, self.next_id)),
                            )
                        else:
                            conn.execute(
                                "delete from items where id = %s", (rng.randint(1, self.next_id),)
                            )
                self.transactions += 1


def make_items(db: PgDatabase, rows: int) -> None:
    db.execute(
        "create table items (id int primary key, score int, note text);"
        "alter table items replica identity full"
    )
    db.execute(
        "insert into items select g, g %% 100, repeat('n', 40) from generate_series(1, %s) g",
        (rows,),
    )
    db.execute("analyze items")


def keys_unique(root: Path, shape: str) -> bool:
    """No ``(_lsn, _op)`` twice in the shape's changelog (read with its format's own
    library: deltalake, pyiceberg)."""
    from tidemark.sink.root import root_format

    rows = rows_of(root_format(root).changelog(root, shape))
    pairs = Counter((r["_lsn"], r["_op"]) for r in rows)
    return max(pairs.values(), default=1) == 1


INT4, TEXT = 23, 25  # type oids
HIGH = "select * from items where score >= 50"
HIGH_SHAPE = {"name": "high", "table": "public.items", "where": "score >= 50"}


async def rebuilt(service: Any, name: str, times: int, timeout: float = 120.0) -> None:
    """Until ``name`` has finished its ``times``-th backfill and is active again."""
    status = service.shapes[name]
    async with asyncio.timeout(timeout):
        while status.backfills_done < times or status.state != "active":
            await asyncio.sleep(0.05)


def split_by_seam(root: Path, shape: str) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """(snapshot rows, stream rows) of a backfilled shape, asserting that no stream
    row belongs to a transaction the shape's snapshot already holds (no doubling)."""
    from tidemark.continuity.store import ContinuityStore

    record = ContinuityStore(root).claim(shape)
    assert record is not None, f"{shape} has no recorded backfill"
    table = DeltaTable(str(table_path(root, shape)))
    rows = table.to_pyarrow_table(columns=["_kind", "_lsn", "_xid"]).to_pylist()
    stream = [r for r in rows if r["_kind"] != "snapshot"]
    doubled = [r for r in stream if record.fence.skips(r["_lsn"], r["_xid"])]
    assert doubled == [], f"{len(doubled)} stream rows repeat what the snapshot holds"
    return [r for r in rows if r["_kind"] == "snapshot"], stream


def backfill_series(service: Any) -> list[tuple[float, float]]:
    """Shape ``high``'s rows done and estimated as ``/metrics`` shows them (none: [])."""
    from prometheus_client import generate_latest

    from tidemark.observability import refresh_metrics

    refresh_metrics(service.metrics, service.facts())
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in generate_latest(service.metrics.registry).decode().splitlines()
        if line.startswith("tidemark_shape_backfill_rows")
    }
    done = values.get('tidemark_shape_backfill_rows_done{shape="high"}')
    estimated = values.get('tidemark_shape_backfill_rows_estimated{shape="high"}')
    return [] if done is None or estimated is None else [(done, estimated)]


async def test_backfill_under_concurrent_writes_equals_postgres(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # given a table that already has 60k rows, read in several parallel chunks
    make_items(pg_db, 60_000)
    monkeypatch.setattr(reader, "PAGES_PER_CHUNK", 100)
    writer = Writer(pg_db.dsn, 60_001)
    writer.start()  # writes keep coming before, during and after the snapshot
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    try:
        async with running_service(settings, spark) as service:
            # while backfilling, the shape is not ready and has no frontier
            status = service.shapes["high"]
            seen_backfilling = False
            progress: list[tuple[float, float]] = []  # the shape's backfill series
            async with asyncio.timeout(120):
                while status.state != "active":
                    if status.state == "backfilling":
                        seen_backfilling = True
                        assert service.frontier("high") is None
                        if status.backfill is not None:
                            progress.extend(backfill_series(service))
                    await asyncio.sleep(0.02)
            assert seen_backfilling and status.backfill is not None
            assert status.backfill.chunks > 3 and status.backfill.rows_done > 25_000
            # the metrics showed the backfill's rows as they grew, then dropped them
            assert progress and progress[-1][0] > progress[0][0], progress
            assert all(done <= estimated for done, estimated in progress), progress
            assert backfill_series(service) == []
            await asyncio.sleep(1.5)  # more stream on top of the snapshot
            writer.stop.set()
            writer.join(timeout=30)
            await wait_frontiers(service, current_lsn(pg_db.dsn))
    finally:
        writer.stop.set()
    assert writer.transactions > 50
    # nothing lost: the fold equals Postgres
    result = compare_shape(spark, str(tmp_path), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(tmp_path, "high")
    # nothing doubled: no stream row belongs to a transaction the snapshot holds
    snapshot, stream = split_by_seam(tmp_path, "high")
    assert len(snapshot) > 25_000 and stream
    # the chunks were spooled and rewritten by Spark: nothing left in the spool
    spool = table_path(tmp_path, "high") / "_spool"
    assert not spool.exists() or list(spool.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "kind"),
    [("", "CopyReader"), ("keepalives=1", "ThreadedReader")],
    ids=["asyncpg", "psycopg"],
)
async def test_a_table_bigger_than_one_chunk_is_read_by_two_connections_at_once(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    extra: str,
    kind: str,
) -> None:
    # given a plain table of several chunks, and a DSN asyncpg takes (the readers use
    # asyncpg) or one with a parameter only libpq implements (they use psycopg)
    make_items(pg_db, 30_000)
    monkeypatch.setattr(reader, "PAGES_PER_CHUNK", 20)
    async with await psycopg.AsyncConnection.connect(pg_db.dsn) as conn:
        oid = int((await (await conn.execute("select 'items'::regclass::oid")).fetchone())[0])  # type: ignore[index]
        size = int((await (await conn.execute("select pg_relation_size('items')")).fetchone())[0])  # type: ignore[index]
        # its heap size is what Postgres says (pg_partition_tree lists nothing for it)
        assert size > 0 and await reader.heap_bytes(conn, oid) == size
    monkeypatch.setattr(runner, "SMALL_TABLE_BYTES", size // 2)
    at_once: list[int] = []
    reading: set[int] = set()
    kinds: set[str] = set()
    original = reader.read_chunk

    async def read_chunk(conn: Any, *args: Any, **kwargs: Any) -> Any:
        kinds.add(type(conn).__name__)
        reading.add(id(conn))
        at_once.append(len(reading))
        try:
            await asyncio.sleep(0.05)
            return await original(conn, *args, **kwargs)
        finally:
            reading.discard(id(conn))

    monkeypatch.setattr(reader, "read_chunk", read_chunk)
    dsn = pg_db.dsn + (("&" if "?" in pg_db.dsn else "?") + extra if extra else "")
    settings = settings_for(dsn, str(tmp_path), [HIGH_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # then two connections read chunks at the same time, and the shape equals Postgres
    assert max(at_once) == 2, at_once
    assert kinds == {kind}
    result = compare_shape(spark, str(tmp_path), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(tmp_path, "high")
    # a new table numbers its rows with an int64 _op (a backfill may exceed 2^31 rows)
    assert ShapeTable(tmp_path, "high").op_type() == pa.int64()


async def test_a_table_made_when_op_was_int32_is_rewritten_with_int64_op_by_its_backfill(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a shape table an earlier tidemark made, with an int32 _op
    make_items(pg_db, 5_000)
    specs = [ColumnSpec("id", INT4), ColumnSpec("score", INT4), ColumnSpec("note", TEXT)]
    definition = ShapeDefinition.model_validate(HIGH_SHAPE).model_dump(mode="json")
    ShapeTable(tmp_path, "high").create(table_schema(specs, pa.int32()), ["id"], definition)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    # when tidemark backfills it and streams changes into it
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        pg_db.execute("update items set score = 99 where id % 7 = 0")
        pg_db.execute("insert into items select g, 75, 'late' from generate_series(5001, 5100) g")
        pg_db.execute("delete from items where id % 11 = 0")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # then its backfill replaced the table's schema with an int64 _op (no 2^31 cap on
    # its snapshots any more), and it equals Postgres
    assert ShapeTable(tmp_path, "high").op_type() == pa.int64()
    result = compare_shape(spark, str(tmp_path), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(tmp_path, "high")


async def test_resync_while_writing_replaces_the_table_and_equals_postgres(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    make_items(pg_db, 5_000)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    writer = Writer(pg_db.dsn, 5_001)
    try:
        async with running_service(settings, spark) as service:
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            writer.start()
            await asyncio.sleep(1.0)
            before = set(service.scheduler.writers["high"].table.active_files())  # type: ignore[union-attr]
            # when the shape is rebuilt while writes continue
            await service.resync_shape("high")
            await rebuilt(service, "high", times=2)
            await asyncio.sleep(1.0)
            writer.stop.set()
            writer.join(timeout=30)
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            after = set(service.scheduler.writers["high"].table.active_files())  # type: ignore[union-attr]
    finally:
        writer.stop.set()
    # then the old files were replaced in one commit, and the result is exact
    assert before and not (before & after)
    result = compare_shape(spark, str(tmp_path), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(tmp_path, "high")


async def test_a_predicate_matching_nothing_backfills_empty_and_is_ready(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    make_items(pg_db, 1_000)
    rewrites = []
    rewrite = runner.rewrite_spooled
    monkeypatch.setattr(
        runner, "rewrite_spooled", lambda *a, **k: rewrites.append(1) or rewrite(*a, **k)
    )
    settings = settings_for(
        pg_db.dsn, str(tmp_path), [{"name": "none", "table": "public.items", "where": "score < 0"}]
    )
    async with running_service(settings, spark) as service:
        pg_db.execute("update items set score = 7 where id = 1")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.shapes["none"].state == "active"
    result = compare_shape(
        spark, str(tmp_path), "none", "select * from items where score < 0", pg_db.dsn
    )
    assert result.equal and not result.got
    # nothing matched, so nothing was written: no Spark job, no empty file
    assert rewrites == []
    assert DeltaTable(str(table_path(str(tmp_path), "none"))).file_uris() == []


async def test_a_table_without_primary_key_needs_replica_identity_full(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    pg_db.execute(
        "create table log (at int, msg text);"
        "insert into log select g, 'm' || g from generate_series(1, 500) g"
    )
    async with running_service(settings_for(pg_db.dsn, str(tmp_path), []), spark) as service:
        definition = ShapeDefinition(name="log_all", table="public.log")
        with pytest.raises(ShapeError, match="REPLICA IDENTITY FULL"):
            await service.add_shape(definition)
        assert "log_all" not in service.shapes
        pg_db.execute("alter table log replica identity full")
        await service.add_shape(definition)
        pg_db.execute("insert into log values (501, 'late'); delete from log where at = 3")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    result = compare_shape(spark, str(tmp_path), "log_all", "select * from log", pg_db.dsn)
    assert result.equal, result.describe()


def test_a_backfill_killed_midway_restarts_cleanly(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    import json
    import os
    import signal
    import time
    import urllib.request

    from tidemark.demo.postgres import free_port

    from .test_e2e_crash import ROOT, start_service, wait_streaming

    # given a table big enough that its backfill takes a while
    make_items(pg_db, 300_000)
    port = free_port()
    root = tmp_path / "lake"
    shapes = [HIGH_SHAPE]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "service"),
        "TIDEMARK_SOURCE__DSN": pg_db.dsn,
        "TIDEMARK_SINK__ROOT": str(root),
        "TIDEMARK_HTTP__PORT": str(port),
        "TIDEMARK_SHAPES": json.dumps(shapes),
        "TIDEMARK_LOG_FORMAT": "json",
        "TIDEMARK_CONFIG": str(tmp_path / "none.toml"),
    }
    log = tmp_path / "service.log"
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc)
        # when the service is killed while the backfill is running
        deadline = time.monotonic() + 60
        while "backfill.started" not in log.read_text():
            assert time.monotonic() < deadline, "backfill did not start"
            time.sleep(0.1)
        pg_db.execute("update items set score = 99 where id <= 100")
        time.sleep(1.5)
        assert "backfill.committed" not in log.read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        pg_db.execute("delete from items where id between 101 and 200")
        # then a restart backfills again from a fresh snapshot, and the result is exact
        proc = start_service(env, log)
        wait_streaming(port, proc)
        pg_db.execute("insert into items values (400001, 77, 'after')")
        with psycopg.connect(pg_db.dsn) as conn:
            target = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        url = f"http://127.0.0.1:{port}/v1/progress/wait?lsn={target}&timeout=180&shape=high"
        with urllib.request.urlopen(url, timeout=190) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert log.read_text().count("backfill.started") == 2
    result = compare_shape(spark, str(root), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(root, "high")


async def test_a_snapshot_taken_while_the_stream_lags_skips_what_it_holds(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    make_items(pg_db, 2_000)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    writer = Writer(pg_db.dsn, 2_001)
    try:
        async with running_service(settings, spark) as service:
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            writer.start()
            # given a stream that lags: the consumer is held while writes pile up
            await service._consume_lock.acquire()
            try:
                await asyncio.sleep(1.5)
                await service.resync_shape("high")
                await asyncio.sleep(0.5)  # the backfill now waits to pause the consumer
            finally:
                service._consume_lock.release()
            # when the snapshot is taken with committed transactions still unprocessed
            await rebuilt(service, "high", times=2)
            await asyncio.sleep(0.5)
            writer.stop.set()
            writer.join(timeout=30)
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            skipped = service.collector.stats
    finally:
        writer.stop.set()
    # then those transactions were skipped for the shape (the snapshot holds them) ...
    split_by_seam(tmp_path, "high")
    assert skipped.transactions > 20
    # ... and nothing was lost
    result = compare_shape(spark, str(tmp_path), "high", HIGH, pg_db.dsn)
    assert result.equal, result.describe()


async def test_a_declared_shape_whose_definition_changed_is_rebuilt_at_start(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    make_items(pg_db, 3_000)
    first = [HIGH_SHAPE]
    async with running_service(settings_for(pg_db.dsn, str(tmp_path), first), spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    pg_db.execute("update items set score = 95 where id <= 10")
    # when the configuration changes the shape's predicate and the service restarts
    second = [{"name": "high", "table": "public.items", "where": "score >= 90"}]
    async with running_service(settings_for(pg_db.dsn, str(tmp_path), second), spark) as service:
        assert service.shapes["high"].state == "backfilling"
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # then its table holds exactly the rows of the new definition
    query = "select * from items where score >= 90"
    result = compare_shape(spark, str(tmp_path), "high", query, pg_db.dsn)
    assert result.equal, result.describe()
    assert keys_unique(tmp_path, "high")


async def test_many_new_shapes_read_each_table_s_catalog_once_and_share_snapshot_connections(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given 12 shapes on one table and 2 on another, all new when the service starts
    import tidemark.shapeset as shapeset

    make_items(pg_db, 3_000)
    pg_db.execute("create table notes (id int primary key, body text)")
    pg_db.execute("insert into notes select g, 'b' || g from generate_series(1, 500) g")
    shapes = [
        {"name": f"band{k}", "table": "public.items", "where": f"score >= {k * 8}"}
        for k in range(12)
    ] + [
        {"name": "notes_all", "table": "public.notes"},
        {"name": "notes_low", "table": "public.notes", "where": "id < 100"},
    ]
    preparing = 0
    read_at_start: list[str] = []
    read_table, prepare = shapeset.read_table, shapeset.ShapeSet._prepare

    async def counted_read(conn: Any, definition: Any) -> Any:
        if preparing:
            read_at_start.append(definition.table_name)
        return await read_table(conn, definition)

    async def counted_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal preparing
        preparing += 1
        try:
            return await prepare(self, *args, **kwargs)
        finally:
            preparing -= 1

    monkeypatch.setattr(shapeset, "read_table", counted_read)
    monkeypatch.setattr(shapeset.ShapeSet, "_prepare", counted_prepare)
    settings = settings_for(pg_db.dsn, str(tmp_path), shapes)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        pg_db.execute("update items set score = 99 where id % 5 = 0")
        pg_db.execute("insert into notes values (0, 'zero')")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # then the shapes were installed in their order, each table's catalog was read
        # once while starting, and the 14 backfills used at most one snapshot
        # connection per backfill running at once
        assert list(service.shapes) == [r.definition.name for r in service.registry.shapes()]
        assert sorted(service.shapes) == sorted(s["name"] for s in shapes)
        assert sorted(read_at_start) == ["items", "notes"]
        connections = service.shapeset._connections
        assert connections is not None
        assert 1 <= connections.made <= shapeset.BACKFILLS_AT_ONCE
    for name, query in [
        ("band0", "select * from items where score >= 0"),
        ("band11", "select * from items where score >= 88"),
        ("notes_low", "select * from notes where id < 100"),
    ]:
        result = compare_shape(spark, str(tmp_path), name, query, pg_db.dsn)
        assert result.equal, result.describe()
        assert keys_unique(tmp_path, name)


async def test_a_kept_snapshot_connection_is_used_again_only_when_it_still_works(
    pg_db: PgDatabase,
) -> None:
    wanted = True
    pool = reader.SnapshotConnections(pg_db.dsn, keep=2, wanted=lambda: wanted)
    try:
        first = await pool.take()
        await pool.give_back(first)
        # a connection given back while more backfills wait is the next one taken
        assert await pool.take() is first and pool.made == 1
        # one still in a transaction (a backfill that failed in its middle) is closed
        await first.execute("begin")
        await pool.give_back(first)
        assert first.closed
        # one the server ended while it was kept is replaced by a new one that works
        second = await pool.take()
        pid = second.info.backend_pid
        await pool.give_back(second)
        with psycopg.connect(pg_db.dsn, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(%s)", (pid,))
        third = await pool.take()
        assert third is not second and pool.made == 3
        assert await (await third.execute("select 1")).fetchone() == (1,)
        # nothing is kept when no backfill waits, nor after the pool is closed
        wanted = False
        await pool.give_back(third)
        assert third.closed
        wanted = True
        fourth = await pool.take()
        await pool.close()
        await pool.give_back(fourth)
        assert fourth.closed
    finally:
        await pool.close()
