"""Transactions Postgres streams while they run (``streaming 'on'``), on real
Postgres and Spark: with ``logical_decoding_work_mem = 64kB`` every transaction of
a few hundred rows is streamed. Savepoints rolled back, a top-level abort, two
interleaved transactions, rows that left memory (spooled) before a rollback, and a
SIGKILL in the middle of a streamed transaction: every shape equals Postgres, no
``(_lsn, _op)`` twice, and the server streamed instead of spilling to disk."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn
from tidemark.sink.delta.table import table_path

from .conftest import PgDatabase, one_server
from .remote_service import (
    get_json,
    service_env,
    start_service,
    stop_service,
    wait_shapes,
    wait_streaming,
)
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_continuity import assert_equal

MB = 1024 * 1024
SHAPES = [
    {"name": "g0", "table": "big", "where": "grp = 0"},
    {"name": "big_all", "table": "big"},
]
TRUTH = {"g0": "select * from big where grp = 0", "big_all": "select * from big"}
# rows of ~600 bytes: a few thousand fill the 2 MiB budget and are spooled
FLUSH = {"memory_budget_bytes": 2 * MB, "stage_bytes": 1 * MB}


def streaming_dsn(dsn: str) -> str:
    """``dsn`` with a 64 kB decoding memory for its sessions (the walsender too)."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options={quote('-c logical_decoding_work_mem=64kB')}"


def make_table(db: PgDatabase) -> None:
    db.execute(
        "create table big (id int primary key, grp int not null, body text);"
        "alter table big replica identity full;"
        "insert into big select g, g % 3, repeat('s', 20) from generate_series(1, 300) g"
    )


def insert_sql(first: int, last: int) -> str:
    return (
        f"insert into big select g, g % 3, md5(g::text) || repeat('b', 560)"
        f" from generate_series({first}, {last}) g"
    )


def slot_stats(db: PgDatabase, slot: str) -> tuple[int, int, int]:
    """(spill_bytes, stream_bytes, stream_txns) of the slot."""
    rows = db.execute(
        "select spill_bytes, stream_bytes, stream_txns from pg_stat_replication_slots"
        " where slot_name = %s",
        (slot,),
    )
    if not rows:
        return 0, 0, 0
    spill, stream, txns = rows[0]
    return int(spill), int(stream), int(txns)  # type: ignore[call-overload]


async def savepoints_aborts_and_interleaving(dsn: str) -> None:
    """The workload: each transaction is several times logical_decoding_work_mem."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a:
        # savepoints: one rolled back after its rows were streamed (and spooled), a
        # nested one released into its parent, updates and deletes of older rows
        async with a.transaction():
            await a.execute(insert_sql(1_000, 3_999))
            async with a.transaction():  # SAVEPOINT, released
                await a.execute("update big set body = body || '-u' where id between 1 and 150")
            try:
                async with a.transaction():  # SAVEPOINT ... ROLLBACK TO
                    await a.execute(insert_sql(10_000, 14_999))
                    async with a.transaction():
                        await a.execute("delete from big where id between 151 and 200")
                    raise _Rollback
            except _Rollback:
                pass
            await a.execute(insert_sql(4_000, 4_999))
            await a.execute("delete from big where id between 201 and 220")
        # a top-level abort of a streamed transaction
        try:
            async with a.transaction():
                await a.execute(insert_sql(20_000, 24_999))
                await a.execute("update big set grp = 0 where id between 1000 and 2000")
                raise _Rollback
        except _Rollback:
            pass
    # two streamed transactions interleaved, committed in the other order
    async with (
        await psycopg.AsyncConnection.connect(dsn) as first,
        await psycopg.AsyncConnection.connect(dsn) as second,
    ):
        for round_ in range(4):
            await first.execute(insert_sql(30_000 + round_ * 500, 30_499 + round_ * 500))
            await second.execute(insert_sql(40_000 + round_ * 500, 40_499 + round_ * 500))
        await first.execute("update big set grp = (grp + 1) % 3 where id between 1000 and 1500")
        await second.commit()
        await first.commit()


class _Rollback(Exception):
    pass


async def test_streamed_transactions_with_savepoints_aborts_and_interleaving_are_exact(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    await streamed_transactions_are_exact(pg_db, spark, tmp_path, "delta")


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
async def test_streamed_transactions_into_iceberg_tables_are_exact(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    await streamed_transactions_are_exact(pg_db, spark, tmp_path, "iceberg")


async def streamed_transactions_are_exact(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, table_format: str
) -> None:
    # given shapes on a table, a 64 kB decoding memory and a 2 MiB memory budget
    make_table(pg_db)
    dsn = streaming_dsn(pg_db.dsn)
    settings = settings_for(dsn, str(tmp_path), SHAPES, flush=FLUSH, sink={"format": table_format})
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when streamed transactions commit, abort, roll back savepoints, interleave
        await savepoints_aborts_and_interleaving(dsn)
        async with asyncio.timeout(180):
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        stats = service.collector.stats
        assert service.scheduler is not None
        # then they arrived streamed, rows left memory before their commit, and the
        # savepoint and the top-level abort were applied as Postgres did
        assert stats.streamed_commits >= 3, stats
        assert stats.subtransaction_aborts >= 1, stats
        # (PostgreSQL 18 checks whether a transaction aborted before it streams it, and
        # drops one it finds aborted itself: then no Stream Abort reaches tidemark)
        assert stats.streamed_aborts >= 1 or pg_db.server.version >= 18, stats
        assert service.scheduler.stats.spooled_bytes > 0
        assert service.collector.open_streams == 0
    for shape, query in TRUTH.items():
        assert_equal(spark, tmp_path, shape, query, pg_db.dsn)
    # nothing left in the spool folders: committed, or discarded with its abort
    for shape in TRUTH:
        spool = table_path(tmp_path, shape) / "_spool"
        assert not spool.exists() or not any(spool.rglob("*.parquet")), list(spool.rglob("*"))
    # and the server streamed them instead of spilling them to disk
    deadline = time.monotonic() + 15
    spill, stream, txns = slot_stats(pg_db, "tm_e2e")
    while txns < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        spill, stream, txns = slot_stats(pg_db, "tm_e2e")
    assert txns >= 3 and stream > 0, (spill, stream, txns)
    assert spill == 0, (spill, stream, txns)


async def test_a_service_killed_in_the_middle_of_a_streamed_transaction_loses_nothing(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given the service (its own process) following a table with a 64 kB decoding memory
    make_table(pg_db)
    dsn = streaming_dsn(pg_db.dsn)
    root = tmp_path / "lake"
    port = free_port()
    env = service_env(dsn=dsn, root=root, port=port, name="tm_stream_kill", shapes=SHAPES)
    env["TIDEMARK_FLUSH__MEMORY_BUDGET_BYTES"] = str(FLUSH["memory_budget_bytes"])
    env["TIDEMARK_FLUSH__STAGE_BYTES"] = str(FLUSH["stage_bytes"])
    log = tmp_path / "service.log"
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc, log, timeout=240)
        wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), list(TRUTH), timeout=180)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            # when a transaction is half streamed (and partly spooled) ...
            await conn.execute(insert_sql(1_000, 5_999))
            await conn.execute("update big set body = 'half' where id between 1 and 100")
            memory: dict[str, Any] = {}
            async with asyncio.timeout(60):
                while not (
                    memory.get("open_streamed_transactions") and memory.get("spooled_bytes")
                ):
                    await asyncio.sleep(0.2)
                    memory = (await asyncio.to_thread(get_json, port, "/v1/progress"))[1]["memory"]
            # ... the service is SIGKILLed, and the transaction goes on and commits
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            await conn.execute(insert_sql(6_000, 7_999))
            await conn.execute("savepoint s")
            await conn.execute(insert_sql(8_000, 8_999))
            await conn.execute("rollback to savepoint s")
            await conn.execute("delete from big where id between 101 and 150")
            await conn.commit()
        # then, started again, it has the transaction exactly once
        proc = start_service(env, log)
        wait_streaming(port, proc, log, timeout=240)
        wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), list(TRUTH), timeout=180)
        memory = get_json(port, "/v1/progress")[1]["memory"]
        assert memory["streamed_commits"] >= 1, memory
    finally:
        if proc.poll() is None:
            stop_service(proc, log)
    for shape, query in TRUTH.items():
        assert_equal(spark, root, shape, query, pg_db.dsn)
    for shape in TRUTH:  # the spool of the killed run was cleared at start
        spool = table_path(root, shape) / "_spool"
        assert not spool.exists() or not any(spool.rglob("*.parquet")), list(spool.rglob("*"))


# the budget is tidemark's; the other tests here stream transactions on every server
@one_server()
async def test_a_1gb_transaction_of_1mb_rows_over_six_shapes_stays_in_the_memory_budget(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given six shapes on a table of 1 MB rows (stored uncompressed), a 128 MiB budget
    pg_db.execute(
        "create table huge (id int primary key, grp int not null, body text);"
        "alter table huge replica identity full;"
        "alter table huge alter column body set storage external"
    )
    shapes = [{"name": f"h{k}", "table": "huge", "where": f"grp = {k}"} for k in range(6)]
    dsn = streaming_dsn(pg_db.dsn)
    root = tmp_path / "lake"
    port = free_port()
    env = service_env(dsn=dsn, root=root, port=port, name="tm_stream_huge", shapes=shapes)
    env["TIDEMARK_FLUSH__MEMORY_BUDGET_BYTES"] = str(128 * MB)
    env["TIDEMARK_FLUSH__STAGE_BYTES"] = str(32 * MB)
    log = tmp_path / "service.log"
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc, log, timeout=240)
        wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), [s["name"] for s in shapes], 180)
        before = vm_kib(proc.pid, "VmRSS")
        # when one transaction inserts 1,000 rows of 1 MiB (1 GiB) spread over the shapes
        started = time.monotonic()
        await pg_db.aexecute(
            "insert into huge select g, g % 6, repeat(md5(g::text), 32768)"
            " from generate_series(1, 1000) g"
        )
        wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), [s["name"] for s in shapes], 300)
        seconds = time.monotonic() - started
        # then it completed, and the service process (Spark's JVM is another process)
        # never held more than the budget plus 300 MB
        peak = vm_kib(proc.pid, "VmHWM")
        memory = get_json(port, "/v1/progress")[1]["memory"]
        print(
            f"1 GiB streamed transaction: {seconds:.1f}s, service RSS before {before / 1024:.0f}"
            f" MiB, peak {peak / 1024:.0f} MiB, spooled {memory['spooled_bytes'] / MB:.0f} MiB,"
            f" stream blocked {memory['blocked_s']:.1f}s"
        )
        assert memory["streamed_commits"] >= 1 and memory["spooled_bytes"] > 0, memory
        assert peak * 1024 < 128 * MB + 300 * MB, (peak, memory, memory_detail(proc.pid))
    finally:
        if proc.poll() is None:
            stop_service(proc, log)
    for k in range(6):
        result = compare_shape(
            spark, str(root), f"h{k}", f"select * from huge where grp = {k}", pg_db.dsn
        )
        assert result.equal, result.describe()


def vm_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def memory_detail(pid: int) -> dict[str, Any]:
    """What a process's resident memory is made of, for a failure message."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    fields = {"Rss", "Anonymous", "AnonHugePages", "Shared_Clean", "Private_Clean"}
    detail: dict[str, Any] = {
        line.split(":")[0]: line.split()[1] + " kB"
        for line in rollup.splitlines()
        if line.split(":")[0] in fields
    }
    detail["threads"] = len(list(Path(f"/proc/{pid}/task").iterdir()))
    detail["thp"] = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    detail["cpus"] = os.cpu_count()
    return detail
