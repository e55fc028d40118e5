"""Faults in the sink and in upkeep: a failing Spark job or Delta commit, a failing
compaction, and an acknowledgement bug. None may stop the stream for the other shapes,
lose a row, or go unnoticed; every shape ends equal to Postgres.

They run on one server: the faults are tidemark's own (``one_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tidemark.api.server import shape_json
from tidemark.sink.delta.table import ShapeTable

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_backfill import HIGH, HIGH_SHAPE, make_items
from .test_continuity import assert_equal

LOW_SHAPE = {"name": "low", "table": "public.items", "where": "score < 50"}
LOW = "select * from items where score < 50"


@one_server()
async def test_a_failing_flush_is_retried_and_a_persistent_failure_marks_only_that_shape(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_items(pg_db, 1_000)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE, LOW_SHAPE])
    failures: dict[str, int] = {}
    original = ShapeTable.commit

    def flaky_commit(self: ShapeTable, *args: Any, **kwargs: Any) -> Any:
        if failures.get(self.shape, 0) > 0:
            failures[self.shape] -= 1
            raise OSError(f"planted: the disk under {self.shape} hiccuped")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ShapeTable, "commit", flaky_commit)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # a transient failure: retried in process, nothing lost
        failures["high"] = 2
        pg_db.execute("update items set score = 90 where id <= 100")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert failures["high"] == 0
        # a persistent failure: that shape is in error, with the cause, and holds the ack
        failures["high"] = 10**9
        pg_db.execute("update items set score = 91 where id between 101 and 150")
        held = current_lsn(pg_db.dsn)
        pg_db.execute("update items set score = 1 where id between 151 and 160")
        async with asyncio.timeout(60):
            while shape_json(service, "high")["state"] != "error":
                await asyncio.sleep(0.05)
        assert "planted" in (shape_json(service, "high")["error"] or "")
        ready, reasons = service.readiness()
        assert not ready and any("high" in r and "planted" in r for r in reasons), reasons
        await asyncio.sleep(2)
        assert service.progress().flushed_lsn < held
        assert shape_json(service, "low")["state"] == "active"
        # once the cause is gone the shape catches up by itself
        failures["high"] = 0
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # (the retried job's commit moves the frontier; the job's end, a moment later,
        # clears the failure)
        async with asyncio.timeout(10):
            while shape_json(service, "high")["state"] != "active":
                await asyncio.sleep(0.05)
        assert service.readiness()[0]
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)
    assert_equal(spark, tmp_path, "low", LOW, pg_db.dsn)


@one_server()
async def test_a_failing_compaction_is_logged_and_retried_while_the_stream_goes_on(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_items(pg_db, 500)
    settings = settings_for(
        pg_db.dsn, str(tmp_path), [HIGH_SHAPE], sink={"maintenance_every_s": 0.5}
    )
    calls = {"failed": 0, "done": 0}
    original = ShapeTable.compact

    def flaky_compact(self: ShapeTable, *args: Any, **kwargs: Any) -> Any:
        if calls["failed"] < 2:
            calls["failed"] += 1
            raise RuntimeError("planted: optimize blew up")
        calls["done"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ShapeTable, "compact", flaky_compact)
    async with running_service(settings, spark) as service:
        for i in range(10):
            pg_db.execute("update items set score = %s where id = %s", (60 + i, i + 1))
            await asyncio.sleep(0.2)
        async with asyncio.timeout(60):
            while calls["done"] < 1:
                await asyncio.sleep(0.1)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        failed = service.metrics.maintenance_failures._value.get()
        assert failed == 2 and service.phase == "streaming"
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


@one_server()
async def test_the_monitor_itself_catches_an_acknowledgement_beyond_what_the_sinks_hold(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    make_items(pg_db, 500)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE], monitor={"period_s": 0.2})
    original = ShapeTable.commit

    def slow_commit(self: ShapeTable, *args: Any, **kwargs: Any) -> Any:
        time.sleep(2.0)  # data is held by the writer a while before it is durable
        return original(self, *args, **kwargs)

    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        monkeypatch.setattr(ShapeTable, "commit", slow_commit)
        client = service.client
        assert client is not None and client.feedback is service.feedback

        async def ack_everything_received() -> None:  # the planted bug
            while True:
                service.feedback.note_durable(service.feedback.received)
                await asyncio.sleep(0.05)

        bug = asyncio.create_task(ack_everything_received())
        try:
            for i in range(20):
                pg_db.execute("update items set score = %s where id = %s", (70 + i, i + 1))
                await asyncio.sleep(0.1)
            async with asyncio.timeout(30):
                while not any(v.kind == "ack_beyond_durable" for v in service.violations):
                    await asyncio.sleep(0.1)
        finally:
            bug.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bug
        ready, reasons = service.readiness()
        assert not ready and any("invariant violated" in r for r in reasons)


@one_server()
async def test_the_table_audit_catches_a_table_that_lost_commits_its_writer_made(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a shape whose writer committed several stream batches
    make_items(pg_db, 200)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        for i in range(3):
            pg_db.execute("update items set score = %s where id <= 20", (60 + i,))
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.scheduler is not None
        writer = service.scheduler.writers["high"]
        believed = writer.committed_lsn
        assert believed is not None and not service.violations
        # when the table on storage loses its last commit (a restore from an older copy)
        log_dir = tmp_path / "tables" / "high" / "_delta_log"
        last = max(log_dir.glob("*.json"))
        last.unlink()
        writer.table.refresh()
        assert (writer.table.committed_lsn() or 0) < believed
        # (the audit passes over a writer while a job or maintenance holds it)
        with capture_logs() as logs:
            async with asyncio.timeout(30):
                while not service.violations:
                    await service._audit_tables()
                    await asyncio.sleep(0.1)
        # then the audit reports it, logs it, and the service is not ready
        kinds = [v.kind for v in service.violations]
        assert kinds == ["committed_not_in_table"], kinds
        (logged,) = [e for e in logs if e["event"] == "invariant.violated"]
        assert logged["kind"] == "committed_not_in_table" and "shape high" in logged["detail"]
        ready, reasons = service.readiness()
        assert not ready and any("committed_not_in_table" in r for r in reasons), reasons
