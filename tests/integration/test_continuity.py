"""Continuity: every break between a shape and the stream is detected and healed.

Each test plays an operational event the way an operator meets it (against a real
Postgres and a real Spark), then folds the shape and compares it with Postgres.
Before issue 12 each of these ran on silently: the shape said ``active`` and rows
were missing or doubled.

Most run on one server: what they test is tidemark's lifecycle, not the server's
version (``one_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark import read
from tidemark.api.shape_view import continuity_json, lsn_json
from tidemark.app import Service
from tidemark.backfill import reader
from tidemark.demo.verify import compare_shape
from tidemark.errors import TidemarkError
from tidemark.shapes.model import ShapeDefinition

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_backfill import HIGH, HIGH_SHAPE, Writer, keys_unique, make_items

SLOT = "tm_e2e"  # settings_for's slot


async def wait_acked(service: Service, lsn: int, timeout: float = 90.0) -> None:
    """Until tidemark has acknowledged ``lsn`` to Postgres (flush LSN sent)."""
    async with asyncio.timeout(timeout):
        while service.progress().flushed_lsn < lsn:
            await asyncio.sleep(0.05)


async def wait_state(service: Service, name: str, state: str, timeout: float = 120.0) -> None:
    async with asyncio.timeout(timeout):
        while name not in service.shapes or service.shapes[name].state != state:
            await asyncio.sleep(0.05)


def assert_equal(spark: Any, root: Path, shape: str, query: str, dsn: str) -> None:
    result = compare_shape(spark, str(root), shape, query, dsn)
    assert result.equal, result.describe()
    assert keys_unique(root, shape)


def slow_chunks(monkeypatch: pytest.MonkeyPatch, seconds: float, pages: int = 50) -> None:
    """Backfills read small chunks, each taking at least ``seconds``."""
    monkeypatch.setattr(reader, "PAGES_PER_CHUNK", pages)
    original = reader.read_chunk

    async def read_chunk(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(seconds)
        return await original(*args, **kwargs)

    monkeypatch.setattr(reader, "read_chunk", read_chunk)
    import tidemark.backfill.runner as runner

    if hasattr(runner, "read_chunk"):
        monkeypatch.setattr(runner, "read_chunk", read_chunk)


def parallel_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backfills read with the two reader connections (asyncpg, for the test servers'
    URLs), not on the snapshot's own connection, however small the table."""
    import tidemark.backfill.runner as runner

    monkeypatch.setattr(runner, "SMALL_TABLE_BYTES", 0)


PARALLEL = pytest.mark.parametrize(
    "parallel", [False, True], ids=["one_connection", "parallel_readers"]
)


# -- 1. the slot is dropped while tidemark is stopped ------------------------------------


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_a_slot_dropped_while_stopped_is_a_gap_failed_by_default_and_resynced_by_policy(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, table_format: str
) -> None:
    make_items(pg_db, 2_000)
    sink = {"format": table_format}
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE], sink=sink)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # while tidemark is stopped the slot is dropped (a failover, a DBA) and rows change
    pg_db.execute(f"select pg_drop_replication_slot('{SLOT}')")
    pg_db.execute("update items set score = 99 where id <= 300")
    pg_db.execute("delete from items where id between 301 and 500")
    # the default policy refuses to resume over the gap and says how to resync
    service = Service(settings, spark=spark)
    with pytest.raises(TidemarkError) as failure:
        async with asyncio.timeout(60):
            await service.run()
    message = str(failure.value)
    assert f"slot '{SLOT}' does not exist" in message and "on_stream_gap" in message
    assert not pg_db.execute(f"select 1 from pg_replication_slots where slot_name = '{SLOT}'")
    # the resync policy rebuilds the shape from a snapshot of the new slot's stream
    healing = settings_for(
        pg_db.dsn, str(tmp_path), [HIGH_SHAPE], source={"on_stream_gap": "resync"}, sink=sink
    )
    async with running_service(healing, spark) as service:
        pg_db.execute("update items set score = 51 where id between 1000 and 1100")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        invalidation = service.shapeset.store.last_invalidation("high")
        assert invalidation is not None and "does not exist" in invalidation.reason
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


@one_server()
async def test_a_slot_advanced_by_someone_else_is_a_gap(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    make_items(pg_db, 500)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    pg_db.execute("update items set score = 99 where id <= 100")
    # another client consumes the slot past what tidemark ever acknowledged
    pg_db.execute(f"select pg_replication_slot_advance('{SLOT}', pg_current_wal_lsn())")
    with pytest.raises(TidemarkError, match="beyond the highest position"):
        async with asyncio.timeout(60):
            await Service(settings, spark=spark).run()


# -- 2. a shape removed from the config and declared again -----------------------------


@one_server()
async def test_a_shape_removed_and_declared_again_is_backfilled_not_resumed(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    make_items(pg_db, 2_000)
    root = str(tmp_path)
    async with running_service(settings_for(pg_db.dsn, root, [HIGH_SHAPE]), spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # removed from the config; tidemark runs on and acknowledges while rows change
    other = {"name": "other", "table": "public.items", "where": "score < 0"}
    async with running_service(settings_for(pg_db.dsn, root, [other]), spark) as service:
        pg_db.execute("update items set score = 98 where id <= 250")
        pg_db.execute("delete from items where id between 251 and 400")
        await wait_acked(service, current_lsn(pg_db.dsn))
    # declared again: it is rebuilt from a snapshot, not resumed from its old record
    async with running_service(
        settings_for(pg_db.dsn, root, [HIGH_SHAPE, other]), spark
    ) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.shapes["high"].backfills_done == 1
        # the API says since when it is continuous, and why its previous claim ended
        continuity = continuity_json(service.continuity_facts("high"))
        assert continuity["since"] is not None
        assert continuity["from"] == lsn_json(service.shapes["high"].snapshot_lsn)
        assert continuity["last_invalidation"]["reason"] == "removed from the configuration"
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)
    # removed through the API and added again with another predicate: the old rows go
    async with running_service(
        settings_for(pg_db.dsn, root, [other]), spark
    ) as service:  # 'high' leaves the config again
        await service.add_shape(
            ShapeDefinition(name="high", table="public.items", where="score >= 90")
        )
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert_equal(spark, tmp_path, "high", "select * from items where score >= 90", pg_db.dsn)


# -- 3 and 4. resyncs that are pending, failing, or superseded ---------------------------


@one_server()
async def test_a_failing_resync_is_retried_and_a_restart_does_not_resume_it(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidemark.shapeset as shapeset

    make_items(pg_db, 2_000)
    root = str(tmp_path)
    settings = settings_for(pg_db.dsn, root, [HIGH_SHAPE])
    original = shapeset.read_table
    failures = {"left": 10**6}

    async def flaky_catalog(*args: Any, **kwargs: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise psycopg.OperationalError("planted: the source went away")
        return await original(*args, **kwargs)

    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        monkeypatch.setattr(shapeset, "read_table", flaky_catalog)
        # a column the shape reads changes type: the shape must be rebuilt, but the
        # resync cannot read the catalog
        await pg_db.aexecute("alter table items alter column score type bigint")
        pg_db.execute("update items set score = 97 where id <= 200")
        # it is not resumed silently: the shape says why it is not ready, so does readiness
        # (polled: the failed resync is retried every 2 s, and while a retry runs the
        # shape is backfilling, which readiness does not count)
        ready, reasons = True, []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ready, reasons = service.readiness()
            if not ready:
                break
            await asyncio.sleep(0.05)
        assert service.shapes["high"].state != "active"
        assert not ready and any("high" in r for r in reasons), reasons
        pg_db.execute("delete from items where id between 201 and 300")
        await wait_acked(service, current_lsn(pg_db.dsn))
    # a restart while the resync is pending rebuilds the shape: it does not resume it
    monkeypatch.setattr(shapeset, "read_table", original)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)
    # and a failing resync is retried until it succeeds
    failures["left"] = 2
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        monkeypatch.setattr(shapeset, "read_table", flaky_catalog)
        await service.resync_shape("high")
        pg_db.execute("update items set score = 3 where id <= 50")
        async with asyncio.timeout(120):
            while failures["left"] or service.shapes["high"].state != "active":
                await asyncio.sleep(0.05)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


@one_server()
async def test_a_second_schema_change_during_a_backfill_supersedes_it(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.sink.delta.table import ShapeTable

    make_items(pg_db, 3_000)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # the resync's final commit is slow, so a second change arrives while it runs
        original = ShapeTable.backfill_commit
        committing = threading.Event()

        def slow_commit(self: ShapeTable, *args: Any, **kwargs: Any) -> Any:
            committing.set()
            time.sleep(4)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(ShapeTable, "backfill_commit", slow_commit)
        await pg_db.aexecute("alter table items alter column score type bigint")
        pg_db.execute("update items set score = 96 where id <= 100")
        async with asyncio.timeout(60):
            while not committing.is_set():
                await asyncio.sleep(0.05)
        await pg_db.aexecute("alter table items add column flag int default 7")
        pg_db.execute("update items set score = 95 where id between 101 and 200")
        pg_db.execute("insert into items values (900001, 88, 'late', 1)")
        monkeypatch.setattr(ShapeTable, "backfill_commit", original)
        await asyncio.sleep(6)  # the superseded backfill has finished by now
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.shapes["high"].backfills_done >= 3
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 6. a table rewrite during a backfill ----------------------------------------------


@one_server()
@PARALLEL
async def test_vacuum_full_during_a_backfill_waits_for_it(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parallel: bool,
) -> None:
    make_items(pg_db, 60_000)
    pg_db.execute("delete from items where id % 3 = 0 and id < 40000")  # holes to compact
    slow_chunks(monkeypatch, 0.3, pages=40)
    if parallel:  # each of the two reader connections holds its own lock
        parallel_readers(monkeypatch)
    settings = settings_for(pg_db.dsn, str(tmp_path), [])
    vacuum: dict[str, float] = {}

    def vacuum_full() -> None:
        started = time.monotonic()
        pg_db.execute("vacuum full items")
        vacuum["waited_s"] = time.monotonic() - started

    async with running_service(settings, spark) as service:
        await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
        status = service.shapes["high"]
        async with asyncio.timeout(60):
            while status.backfill is None or status.backfill.chunks_done < 2:
                await asyncio.sleep(0.02)
        rewrite = threading.Thread(target=vacuum_full)
        rewrite.start()
        await wait_state(service, "high", "active")
        rewrite.join(timeout=60)
        pg_db.execute("update items set score = 94 where id between 40000 and 40100")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert vacuum["waited_s"] > 0.5  # the rewrite waited for the snapshot's lock
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 6b. a column added between binding a new shape and locking its table ---------------


@one_server()
async def test_a_column_added_just_before_the_snapshot_lock_is_in_the_snapshot(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a shape bound to the catalog, and then (before its snapshot locks the table)
    # a column added and filled by an update the snapshot will see and the stream skips
    from tidemark.backfill import runner

    make_items(pg_db, 1_000)
    original = runner.begin_snapshot
    moved: list[str] = []

    async def alter_first(conn: Any, shape: Any) -> None:
        if not moved:
            moved.append(shape.name)
            await pg_db.aexecute("alter table items add column region text")
            await pg_db.aexecute("update items set region = 'us' where id % 3 = 0")
        await original(conn, shape)

    monkeypatch.setattr(runner, "begin_snapshot", alter_first)
    async with running_service(settings_for(pg_db.dsn, str(tmp_path), []), spark) as service:
        await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # then the backfill bound the shape again and read the new column's values
        assert moved == ["high"]
        assert [c.name for c in service.scheduler.writers["high"].columns][-1] == "region"
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 7. a commit streamed before it is visible (synchronous standby) ----------------------


@one_server()
async def test_a_commit_streamed_before_it_is_visible_is_not_lost_by_a_new_snapshot(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    make_items(pg_db, 1_000)
    admin = pg_db.server.admin_dsn
    other = {"name": "other", "table": "public.items", "where": "score < 0"}
    settings = settings_for(pg_db.dsn, str(tmp_path), [other])
    blocked: dict[str, Any] = {}

    def commit_waiting_for_a_standby() -> None:
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            blocked["pid"] = conn.info.backend_pid
            with contextlib.suppress(psycopg.Error):
                conn.execute("insert into items values (999999, 77, 'sync')")

    session = threading.Thread(target=commit_waiting_for_a_standby)
    try:
        async with running_service(settings, spark) as service:
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            # from now on a commit waits for a synchronous standby that does not exist
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("alter system set synchronous_standby_names = 'tm_nobody'")
                conn.execute("select pg_reload_conf()")
            session.start()
            # the commit is in WAL (and streamed) but waits for a standby that never comes
            with psycopg.connect(admin, autocommit=True) as conn:
                async with asyncio.timeout(30):
                    while not conn.execute(
                        "select 1 from pg_stat_activity where wait_event = 'SyncRep'"
                    ).fetchall():
                        await asyncio.sleep(0.05)
                lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
            from tidemark.lsn import Lsn

            await wait_acked(service, int(Lsn.parse(lsn)))
            # a shape is added now: its snapshot does not see the waiting commit
            adding = asyncio.create_task(service.add_shape(ShapeDefinition(**HIGH_SHAPE)))
            await asyncio.sleep(3)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("select pg_cancel_backend(%s)", (blocked["pid"],))
            await adding
            session.join(timeout=30)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("alter system reset synchronous_standby_names")
                conn.execute("select pg_reload_conf()")
            await wait_frontiers(service, current_lsn(pg_db.dsn))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("alter system reset synchronous_standby_names")
            conn.execute("select pg_reload_conf()")
    assert pg_db.execute("select 1 from items where id = 999999")
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 8. a resync that changes a column type or the primary key ---------------------------


@one_server()
async def test_a_resync_after_a_type_or_key_change_replaces_the_table_schema(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    from tidemark.sink.delta.table import ShapeTable

    make_items(pg_db, 1_000)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # a type change the old schema cannot hold
        await pg_db.aexecute("alter table items alter column score type bigint")
        pg_db.execute("update items set score = 5000000000 where id <= 20")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        async with asyncio.timeout(120):
            while service.shapes["high"].backfills_done < 2:
                await asyncio.sleep(0.05)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # a new primary key: rows that share the old key are different rows now
        await pg_db.aexecute("alter table items drop constraint items_pkey")
        await pg_db.aexecute("alter table items add primary key (id, note)")
        pg_db.execute("insert into items values (1, 60, 'second row with id 1')")
        # (under REPLICA IDENTITY FULL the stream cannot show a key change: the operator
        # resyncs, as the README says)
        await service.resync_shape("high")
        async with asyncio.timeout(120):
            while service.shapes["high"].backfills_done < 3:
                await asyncio.sleep(0.05)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    table = ShapeTable(tmp_path, "high")
    assert str(table.arrow_schema().field("score").type) == "int64"
    assert table.primary_key() == ["id", "note"]
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 9. the frontier and reads as of an LSN around a backfill ------------------------------


@one_server()
async def test_a_ready_shape_frontier_covers_its_snapshot_and_older_reads_are_refused(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.errors import SinkError
    from tidemark.sink.delta.table import ShapeTable

    make_items(pg_db, 2_000)
    lagging = {"name": "lagging", "table": "public.items", "where": "score < 50"}
    settings = settings_for(pg_db.dsn, str(tmp_path), [lagging])
    writer = Writer(pg_db.dsn, 2_001)
    original = ShapeTable.commit

    def slow_commit(self: ShapeTable, *args: Any, **kwargs: Any) -> Any:
        if self.shape == "lagging":
            time.sleep(1.5)  # the global acknowledgement lags behind
        return original(self, *args, **kwargs)

    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        monkeypatch.setattr(ShapeTable, "commit", slow_commit)
        writer.start()
        try:
            await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
            status = service.shapes["high"]
            seen = 0
            async with asyncio.timeout(120):
                while status.state != "active" or seen < 20:
                    frontier = service.frontier("high")
                    if frontier is not None:
                        snapshot = status.backfill.snapshot_lsn if status.backfill else None
                        assert snapshot is not None and frontier >= snapshot - 1
                        seen += 1
                    await asyncio.sleep(0.05)
            before_resync = service.frontier("high")
            assert before_resync is not None
            await service.resync_shape("high")
            async with asyncio.timeout(120):
                while status.backfills_done < 2 or status.state != "active":
                    await asyncio.sleep(0.05)
        finally:
            writer.stop.set()
            writer.join(timeout=30)
        monkeypatch.setattr(ShapeTable, "commit", original)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # reading as of an LSN before the last resync would miss rows: refused, clearly
    with pytest.raises(SinkError, match=r"rebuilt\s+from a snapshot"):
        read.current(spark, str(tmp_path), "high", as_of=before_resync).collect()
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


# -- 10. a shape removed early in its backfill ---------------------------------------------


@one_server()
@PARALLEL
async def test_removing_a_shape_during_its_backfill_cancels_it_and_releases_acks(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parallel: bool,
) -> None:
    make_items(pg_db, 40_000)
    slow_chunks(monkeypatch, 0.5, pages=20)
    if parallel:
        parallel_readers(monkeypatch)
    other = {"name": "low", "table": "public.items", "where": "score < 10"}
    settings = settings_for(pg_db.dsn, str(tmp_path), [other])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
        async with asyncio.timeout(60):
            while service.shapes["high"].backfill is None or not (
                service.shapes["high"].backfill.chunks_done >= 1
            ):
                await asyncio.sleep(0.02)
        await service.remove_shape("high")
        await asyncio.sleep(1.0)
        # the stream keeps flowing and is acknowledged: nothing waits for the removed shape
        for i in range(20):  # rows move into 'high' (and out of 'low')
            pg_db.execute("update items set score = %s where id = %s", (60 + i, 1000 + i))
        await wait_acked(service, current_lsn(pg_db.dsn), timeout=60)
        assert "high" not in service.scheduler.writers  # type: ignore[union-attr]
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert_equal(spark, tmp_path, "low", "select * from items where score < 10", pg_db.dsn)


# -- a source restart during a backfill ---------------------------------------------------


@one_server()
@PARALLEL
async def test_a_backfill_interrupted_by_a_postgres_restart_is_retried(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parallel: bool,
) -> None:
    if pg_db.server.embedded is None:
        pytest.skip("needs a server this test can restart (the embedded one)")
    make_items(pg_db, 20_000)
    slow_chunks(monkeypatch, 0.5, pages=20)
    if parallel:
        parallel_readers(monkeypatch)
    settings = settings_for(pg_db.dsn, str(tmp_path), [])
    async with running_service(settings, spark) as service:
        await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
        async with asyncio.timeout(60):
            while service.shapes["high"].backfill is None or not (
                service.shapes["high"].backfill.chunks_done >= 1
            ):
                await asyncio.sleep(0.02)
        # the shutdown waited for in a thread, so the service's event loop goes on (its
        # walsender waits for it: a blocked loop held the shutdown past restart's 30 s);
        # the start on the loop's own thread: the server dies with the thread that starts it
        await asyncio.to_thread(pg_db.server.embedded.shut_down)
        pg_db.server.embedded.restart()
        pg_db.execute("update items set score = 93 where id <= 100")
        await wait_state(service, "high", "active", timeout=180)
        await wait_frontiers(service, current_lsn(pg_db.dsn), timeout=180)
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)
