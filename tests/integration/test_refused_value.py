"""One shape's refused value holds the slot's acknowledgement, never another shape's
progress.

Three shapes on one table; a value one of them cannot store (NaN in its
``numeric(10,2)`` lake column) puts that shape in ``error`` at once, with the value and
the fix, and it is not retried until asked. The other shapes' frontiers pass a later
marker, ``wait-for-LSN`` answers for them, and the acknowledgement sent to Postgres stays
below the refused transaction (that shape still needs the WAL), with readiness naming
the shape that holds it. Once the value is fixed in Postgres and the shape resynced,
every shape equals Postgres and the acknowledgement moves on.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

SCHEMA = """
create table wide (id int primary key, amount numeric, m int[], seen_at timestamp, note text);
alter table wide replica identity full;
insert into wide select g, g * 1.5, array[g, g + 1],
    '2026-01-01'::timestamp + g * interval '1 day', 'n' || g from generate_series(1, 50) g;
"""
SHAPES = [
    {"name": "money", "table": "public.wide", "columns": ["amount::numeric(10,2)"]},
    {"name": "texts", "table": "public.wide", "columns": ["amount::text", "note"]},
    {"name": "notes", "table": "public.wide", "columns": ["m", "seen_at", "note"]},
]
TRUTH = {
    "money": "select id, amount::numeric(10,2) from wide",
    "texts": "select id, amount::text, note from wide",
    "notes": "select id, m, seen_at, note from wide",
}
HEALTHY = ["texts", "notes"]


@one_server()
async def test_a_refused_value_holds_the_acknowledgement_but_no_other_shape(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    await pg_db.aexecute(SCHEMA)
    settings = settings_for(pg_db.dsn, str(tmp_path), SHAPES)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        before = current_lsn(pg_db.dsn)
        await pg_db.aexecute("insert into wide values (51, 'NaN', '{1}', now(), 'nan')")
        await pg_db.aexecute("update wide set note = 'marker' where id = 1")
        marker = current_lsn(pg_db.dsn)

        async with asyncio.timeout(60):  # the refused shape fails at once
            while service.shape_state("money")[0] != "error":
                await asyncio.sleep(0.05)
        # the healthy shapes pass the marker while it is in error
        async with asyncio.timeout(60):
            while not all((f := service.frontier(n)) is not None and f >= marker for n in HEALTHY):
                await asyncio.sleep(0.05)
        url = (
            f"http://127.0.0.1:{service.http_port}/v1/progress/wait"
            f"?lsn={format_lsn(marker)}&shape=notes&timeout=20"
        )
        started = time.monotonic()
        with await asyncio.to_thread(urllib.request.urlopen, url, timeout=30) as answer:
            assert answer.status == 200
            assert json.loads(answer.read())["reached"] is True
        assert time.monotonic() - started < 10

        # not retried as if transient: one attempt, and the message says what to do
        await asyncio.sleep(4)  # (a retry with backoff would have run twice by now)
        writer = service.scheduler.writers["money"]  # type: ignore[union-attr]
        assert writer.failure is not None and writer.failure.attempts == 1
        state, error = service.shape_state("money")
        assert state == "error" and error is not None
        assert "'NaN'" in error and "numeric(10,2)" in error, error
        assert "resync" in error and "amount::text" in error, error
        # the acknowledgement waits for the refused shape (it still needs the WAL) ...
        progress = service.progress()
        assert progress.flushed_lsn < marker
        assert progress.flushed_lsn >= before
        assert service.frontier("money") is not None
        assert service.frontier("money") < marker  # type: ignore[operator]
        # ... and readiness and the metrics say which shape holds it and how much WAL
        ready, reasons = service.readiness()
        assert not ready
        held = [r for r in reasons if "acknowledgement" in r]
        assert held and "money" in held[0] and "resync" in held[0], reasons
        from tidemark.observability import refresh_metrics

        refresh_metrics(service.metrics, service.facts())
        from prometheus_client import generate_latest

        scrape = generate_latest(service.metrics.registry).decode().splitlines()
        held_lines = [line for line in scrape if line.startswith("tidemark_acknowledgement_held")]
        assert len(held_lines) == 1 and 'held_by="money"' in held_lines[0], held_lines
        assert float(held_lines[0].rsplit(" ", 1)[1]) > 0

        # fixed in Postgres and resynced: every shape equals Postgres, the ack moves on
        await pg_db.aexecute("update wide set amount = 7 where id = 51")
        await service.resync_shape("money")
        end = current_lsn(pg_db.dsn)
        await wait_frontiers(service, end)
        async with asyncio.timeout(60):
            while service.progress().flushed_lsn < marker:
                await asyncio.sleep(0.05)
        assert service.readiness()[0], service.readiness()[1]
        for shape, query in TRUTH.items():
            result = compare_shape(spark, str(tmp_path), shape, query, pg_db.dsn)
            assert result.equal, result.describe()


@one_server()
async def test_a_shape_whose_column_was_dropped_says_what_to_do(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    await pg_db.aexecute(
        "create table t (id int primary key, a int, b int); insert into t values (1, 1, 1)"
    )
    shapes = [{"name": "with_a", "table": "public.t", "columns": ["a"]}]
    settings = settings_for(pg_db.dsn, str(tmp_path), shapes)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # (a dropped listed column alone reads as NULL; a resync checks the table again)
        await pg_db.aexecute("alter table t drop column a; insert into t values (2, 2)")
        await service.resync_shape("with_a")
        async with asyncio.timeout(60):
            while service.shape_state("with_a")[0] != "error":
                await asyncio.sleep(0.05)
        error = service.shape_state("with_a")[1] or ""
        assert "a" in error and "no longer fits its table" in error, error
        assert "tidemark shapes resync with_a" in error, error
        assert "tidemark shapes remove with_a" in error, error
