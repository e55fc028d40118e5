"""The memory budget is a real bound: buffered bytes are what the stream delivered,
wide rows are staged by their size, and one open transaction spread over many
shapes (each part under the staging threshold) is staged instead of filling the
budget and waiting forever. Every shape ends equal to Postgres.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_continuity import assert_equal

MB = 1024 * 1024
GROUPS = 6


def _wide_table(db: PgDatabase) -> None:
    db.execute(
        "create table wide (id int primary key, grp int, body text);"
        "alter table wide replica identity full"
    )


def _shapes() -> list[dict[str, Any]]:
    return [{"name": f"g{k}", "table": "wide", "where": f"grp = {k}"} for k in range(GROUPS)]


@one_server()
async def test_one_transaction_over_six_shapes_larger_than_the_budget_completes(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a budget of 8 MiB and a staging threshold of 4 MiB
    _wide_table(pg_db)
    flush = {"memory_budget_bytes": 8 * MB, "stage_bytes": 4 * MB}
    settings = settings_for(pg_db.dsn, str(tmp_path), _shapes(), flush=flush)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when one transaction puts ~2.5 MiB in each of 6 shapes (15 MiB in all)
        await pg_db.aexecute(
            "insert into wide select g, g %% %s, repeat('x', 100) from generate_series(1, 60000) g",
            (GROUPS,),
        )
        # then it is staged and committed, not stuck
        async with asyncio.timeout(120):
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.scheduler is not None and service.scheduler.stats.stage_jobs > 0
    for k in range(GROUPS):
        assert_equal(spark, tmp_path, f"g{k}", f"select * from wide where grp = {k}", pg_db.dsn)


@one_server()
async def test_wide_rows_are_counted_by_their_size_and_staged(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a budget of 16 MiB and a staging threshold of 8 MiB
    _wide_table(pg_db)
    flush = {"memory_budget_bytes": 16 * MB, "stage_bytes": 8 * MB}
    settings = settings_for(pg_db.dsn, str(tmp_path), _shapes()[:1], flush=flush)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when one transaction carries 500 rows of 50 kB for one shape (25 MB)
        await pg_db.aexecute(
            "insert into wide select g, 0, repeat(md5(g::text), 1600)"
            " from generate_series(1, 500) g"
        )
        async with asyncio.timeout(120):
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        # then its rows were staged as they came, by their size (a count of rows
        # would have seen 500 small rows)
        assert service.scheduler is not None and service.scheduler.stats.stage_jobs >= 2
    assert_equal(spark, tmp_path, "g0", "select * from wide where grp = 0", pg_db.dsn)


@one_server()
async def test_a_stream_waiting_for_memory_longer_than_the_grace_is_not_ready_and_says_why(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given one shape whose writer is held (as by a long maintenance job), and a budget
    _wide_table(pg_db)
    flush = {"memory_budget_bytes": 4 * MB, "stage_bytes": 4 * MB}
    settings = settings_for(
        pg_db.dsn, str(tmp_path), _shapes()[:1], flush=flush, monitor={"stall_grace_s": 1.0}
    )
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.scheduler is not None
        writer = service.scheduler.writers["g0"]
        async with service.scheduler.exclusive(writer):
            # when a transaction bigger than the budget arrives for it
            await pg_db.aexecute(
                "insert into wide select g, 0, repeat('y', 200) from generate_series(1, 40000) g"
            )
            # then the stream waits, and past the grace readiness says where the bytes are
            async with asyncio.timeout(60):
                while True:
                    ready, reasons = service.readiness()
                    if any("for memory" in r for r in reasons):
                        assert not ready
                        break
                    await asyncio.sleep(0.2)
            (reason,) = [r for r in reasons if "for memory" in r]
            assert "MiB budget" in reason and "g0 (open" in reason, reason
        # and once the writer is free the transaction is staged and committed
        async with asyncio.timeout(120):
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert not any("for memory" in r for r in service.readiness()[1])
    assert_equal(spark, tmp_path, "g0", "select * from wide where grp = 0", pg_db.dsn)
