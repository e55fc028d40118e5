"""Shapes on partitioned tables, on real Postgres and Spark: the publication publishes
via the root, the backfill reads every partition in one snapshot, and partition
maintenance the stream does not show (ATTACH of a table with rows, DETACH, TRUNCATE
of one partition) rebuilds the shape, while a new empty partition costs nothing.
After each step every shape equals Postgres."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.app import Service
from tidemark.errors import ReplicationError, ShapeError
from tidemark.replication import slot as slots
from tidemark.shapes.model import ShapeDefinition

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_continuity import assert_equal

SCHEMA = """
create table events (
    id int not null, day date not null, region text not null, body text,
    primary key (id, day)
) partition by range (day);
alter table events replica identity full;
create table events_jan partition of events for values from ('2026-01-01') to ('2026-02-01');
create table events_feb partition of events for values from ('2026-02-01') to ('2026-03-01');
alter table events_jan replica identity full;
alter table events_feb replica identity full;
insert into events
  select g, date '2026-01-01' + (g % 59), case when g % 3 = 0 then 'eu' else 'us' end, 'b' || g
  from generate_series(1, 3000) g;
"""
SHAPES = [
    {"name": "ev_all", "table": "events"},
    {"name": "ev_eu", "table": "events", "where": "region = 'eu'"},
]
TRUTH = {
    "ev_all": "select * from events",
    "ev_eu": "select * from events where region = 'eu'",
}


async def settle(service: Service, dsn: str) -> None:
    """Until no shape has a backfill to do and every frontier passed the source."""
    async with asyncio.timeout(180):
        while any(
            s.backfills_done < s.backfills_wanted or s.state != "active"
            for s in service.shapeset.statuses.values()
        ):
            errors = {n: s.error for n, s in service.shapeset.statuses.items() if s.error}
            assert not any("attempt 3" in (e or "") for e in errors.values()), errors
            await asyncio.sleep(0.1)
    await wait_frontiers(service, current_lsn(dsn))


def assert_all_equal(spark: Any, root: Path, dsn: str) -> None:
    for shape, query in TRUTH.items():
        assert_equal(spark, root, shape, query, dsn)


def backfills(service: Service) -> dict[str, int]:
    return {n: s.backfills_wanted for n, s in service.shapeset.statuses.items()}


async def partition_check(service: Service) -> None:
    """Run the partition check now rather than waiting for its period."""
    await service.shapeset.check_partitions()


async def test_a_partitioned_table_is_followed_through_partition_maintenance(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given shapes on a partitioned table (rows in two partitions)
    pg_db.execute(SCHEMA)
    settings = settings_for(pg_db.dsn, str(tmp_path), SHAPES)
    async with running_service(settings, spark) as service:
        await settle(service, pg_db.dsn)
        # the publication tidemark created publishes the partitions as the root
        assert pg_db.execute("select pubviaroot from pg_publication where pubname = 'tm_e2e'") == [
            (True,)
        ]
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # when rows change, and some move to another partition (an update of the key)
        await pg_db.aexecute(
            "update events set region = 'eu' where id % 7 = 0;"
            "update events set day = date '2026-02-15' where id between 1 and 40"
            " and day < date '2026-02-01';"
            "delete from events where id % 11 = 0"
        )
        await settle(service, pg_db.dsn)
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # when a partition is created ahead of its rows, then filled
        before = backfills(service)
        await pg_db.aexecute(
            "create table events_mar partition of events"
            " for values from ('2026-03-01') to ('2026-04-01');"
            "alter table events_mar replica identity full"
        )
        await partition_check(service)
        await pg_db.aexecute(
            "insert into events select g, date '2026-03-05', 'eu', 'm' || g"
            " from generate_series(5000, 5200) g"
        )
        await settle(service, pg_db.dsn)
        # then nothing was rebuilt: its rows are changes of the root
        assert backfills(service) == before
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # when a table that has rows is attached (rows no change in the stream carried)
        await pg_db.aexecute(
            "create table events_apr (like events including defaults);"
            "alter table events_apr add primary key (id, day);"
            "alter table events_apr replica identity full;"
            "insert into events_apr select g, date '2026-04-02', 'eu', 'a' || g"
            " from generate_series(6000, 6100) g;"
            "alter table events attach partition events_apr"
            " for values from ('2026-04-01') to ('2026-05-01')"
        )
        await partition_check(service)
        # then the shapes are rebuilt from a new snapshot, and say why
        assert all(backfills(service)[n] == before[n] + 1 for n in before), backfills(service)
        reason = service.shapeset.statuses["ev_all"].backfill
        assert reason is not None and "events_apr" in reason.reason, reason
        await settle(service, pg_db.dsn)
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # when a partition is detached (its rows leave the root without deletes)
        before = backfills(service)
        await pg_db.aexecute("alter table events detach partition events_jan")
        await partition_check(service)
        assert all(backfills(service)[n] == before[n] + 1 for n in before)
        await settle(service, pg_db.dsn)
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # when one partition is truncated (not replicated under publish_via_partition_root)
        before = backfills(service)
        await pg_db.aexecute("truncate events_feb")
        await partition_check(service)
        assert all(backfills(service)[n] == before[n] + 1 for n in before)
        await settle(service, pg_db.dsn)
        assert_all_equal(spark, tmp_path, pg_db.dsn)

        # and the check finds nothing more to do once the shapes caught up
        before = backfills(service)
        await partition_check(service)
        assert backfills(service) == before
    # (the recorded tree is kept with the claims, for a check after a restart)
    assert "events_apr" in (tmp_path / "_tidemark" / "claims.json").read_text()


@one_server()
async def test_a_partition_attached_while_tidemark_is_stopped_is_found_at_start(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg_db.execute(SCHEMA)
    settings = settings_for(pg_db.dsn, str(tmp_path), SHAPES[:1])
    async with running_service(settings, spark) as service:
        await settle(service, pg_db.dsn)
    # when a table with rows is attached while tidemark is stopped
    pg_db.execute(
        "create table events_may (like events including defaults);"
        "alter table events_may replica identity full;"
        "insert into events_may select g, date '2026-05-02', 'us', 'y' || g"
        " from generate_series(7000, 7050) g;"
        "alter table events attach partition events_may"
        " for values from ('2026-05-01') to ('2026-06-01')"
    )
    async with running_service(settings, spark) as service:
        await partition_check(service)
        # then the resumed shape is rebuilt, and equals Postgres
        status = service.shapeset.statuses["ev_all"]
        assert status.backfill is not None and "events_may" in status.backfill.reason
        await settle(service, pg_db.dsn)
    assert_equal(spark, tmp_path, "ev_all", TRUTH["ev_all"], pg_db.dsn)


@one_server()
async def test_a_shape_on_one_partition_keeps_working_and_a_root_shape_beside_it_is_refused(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg_db.execute(SCHEMA)
    jan = {"name": "jan", "table": "events_jan", "where": "region = 'eu'"}
    settings = settings_for(pg_db.dsn, str(tmp_path), [jan])
    async with running_service(settings, spark) as service:
        await settle(service, pg_db.dsn)
        await pg_db.aexecute(
            "update events set body = 'x' where id % 5 = 0;"
            "insert into events values (9000, '2026-01-09', 'eu', 'n')"
        )
        await settle(service, pg_db.dsn)
        assert_equal(
            spark, tmp_path, "jan", "select * from events_jan where region = 'eu'", pg_db.dsn
        )
        # a shape on the root would make the partition's changes arrive as the root's
        with pytest.raises(ShapeError, match=r"jan.*would receive nothing"):
            await service.add_shape(ShapeDefinition(name="all", table="events"))


@one_server()
async def test_a_publication_not_publishing_via_the_root_is_explained_or_changed(
    pg_db: PgDatabase,
) -> None:
    pg_db.execute(SCHEMA + "create publication fixed for table events")
    async with await psycopg.AsyncConnection.connect(pg_db.dsn, autocommit=True) as conn:
        # tidemark may not change it: the error says what to run
        with pytest.raises(ReplicationError) as refused:
            await slots.add_tables_to_publication(
                conn, "fixed", [("public", "events")], alter=False
            )
        assert "ALTER PUBLICATION fixed SET (publish_via_partition_root = true);" in str(
            refused.value
        )
        # tidemark owns it: it turns the option on
        await slots.add_tables_to_publication(conn, "fixed", [("public", "events")])
    assert pg_db.execute("select pubviaroot from pg_publication where pubname = 'fixed'") == [
        (True,)
    ]


@one_server()
async def test_a_partition_published_via_its_root_is_refused_and_plain_tables_skip_it(
    pg_db: PgDatabase,
) -> None:
    from tidemark.replication.catalog import check_partition_publishing, read_table

    pg_db.execute(
        SCHEMA
        + "create table plain (id int primary key);"
        + "create publication via_root for table events with (publish_via_partition_root = true)"
    )

    def others_unasked() -> dict[int, str]:
        raise AssertionError("the other shapes were looked at for a plain table")

    async with await psycopg.AsyncConnection.connect(pg_db.dsn, autocommit=True) as conn:
        root = await read_table(conn, ShapeDefinition(name="r", table="events"))
        jan = await read_table(conn, ShapeDefinition(name="j", table="events_jan"))
        plain = await read_table(conn, ShapeDefinition(name="p", table="plain"))
        assert (root.partition, jan.partition, plain.partition) == (False, True, False)
        # a plain table: neither the other shapes nor the catalog's ancestors are asked
        # (on a closed connection: a query would fail)
        async with await psycopg.AsyncConnection.connect(pg_db.dsn) as closed:
            pass
        await check_partition_publishing(
            closed, plain, others_unasked, "via_root", publish_all_tables=False
        )
        # a partition whose root the publication publishes via the root: refused
        with pytest.raises(ShapeError, match=r"events_jan is a partition.*Define the shape"):
            await check_partition_publishing(conn, jan, dict, "via_root", publish_all_tables=False)
        # not known whether it is a partition (None): the catalog is asked, same answer
        unknown = dataclasses.replace(jan, partition=None)
        with pytest.raises(ShapeError, match=r"events_jan is a partition"):
            await check_partition_publishing(
                conn, unknown, dict, "via_root", publish_all_tables=False
            )
        # a publication tidemark has yet to create: refused when another shape follows the root
        await check_partition_publishing(conn, jan, dict, "absent", publish_all_tables=False)
        with pytest.raises(ShapeError, match=r"events_jan is a partition"):
            await check_partition_publishing(
                conn, jan, lambda: {root.oid: "r"}, "absent", publish_all_tables=False
            )
