"""End to end with a real Postgres and a real Spark: a mixed workload on several
tables with overlapping shapes; at the end every shape, folded, equals the
matching query on Postgres."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from tidemark.demo.verify import compare_shape, normalise

from .conftest import PgDatabase, one_server
from .outside_readers import (
    changelog_rows,
    current_rows,
    folded,
    metadata_location,
    plain,
    records,
)
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

SCHEMA = """
create table accounts (id int primary key, owner text not null, balance numeric(12,2),
                       tier text, doc text, tags text[]);
alter table accounts replica identity full;
create table events (id bigint primary key, account_id int, kind text, payload jsonb);
alter table events replica identity full;
create table notes (id int primary key, priority int, body text);
alter table notes replica identity full;
create table unpublished (id serial primary key, junk text);
"""

SHAPES = [
    {"name": "rich", "table": "public.accounts", "where": "balance >= 1000"},
    {
        "name": "gold",
        "table": "public.accounts",
        "where": "tier = 'gold'",
        "columns": ["owner", "tier", "doc"],
    },
    {"name": "all_accounts", "table": "public.accounts"},
    {"name": "signups", "table": "public.events", "where": "kind = 'signup'"},
    {"name": "event_kinds", "table": "public.events", "columns": ["kind"]},
    {"name": "urgent", "table": "public.notes", "where": "priority > 100"},
]

TRUTH = {
    "rich": "select * from accounts where balance >= 1000",
    "gold": "select id, owner, tier, doc from accounts where tier = 'gold'",
    "all_accounts": "select * from accounts",
    "signups": "select id, account_id, kind, payload::text from events where kind = 'signup'",
    "event_kinds": "select id, kind from events",
    "urgent": "select * from notes where priority > 100",
}


def run(db: PgDatabase, sql: str, params: object = None) -> None:
    db.execute(sql, params)


async def arun(db: PgDatabase, sql: str, params: object = None) -> None:
    await db.aexecute(sql, params)


async def mixed_workload(db: PgDatabase) -> None:
    big = "lorem ipsum " * 4000  # ~48 kB: stored out of line (TOAST)
    # inserts, some with TOASTed documents, arrays and NULLs
    await arun(
        db,
        "insert into accounts select g, 'owner ' || g, (g * 37) %% 2500,"
        " (array['gold','silver','bronze'])[g %% 3 + 1],"
        " case when g %% 5 = 0 then %s else 'short' end,"
        " case when g %% 4 = 0 then null else array['a' || g, 'b'] end"
        " from generate_series(1, 300) g",
        (big,),
    )
    await arun(
        db,
        "insert into events select g, g % 300 + 1,"
        " (array['signup','click','purchase'])[g % 3 + 1],"
        " jsonb_build_object('n', g, 'tag', 'e' || g) from generate_series(1, 600) g",
    )
    await asyncio.sleep(0.3)
    # updates moving rows in and out of predicates; TOASTed doc left unchanged
    await arun(db, "update accounts set balance = balance + 1500 where id % 7 = 0")
    await arun(db, "update accounts set balance = 5 where id % 11 = 0")
    await arun(db, "update accounts set tier = 'gold' where id between 40 and 60")
    await arun(db, "update accounts set tier = 'silver', owner = owner || '!' where id % 13 = 0")
    await arun(db, "update accounts set doc = 'rewritten' where id = 10")
    # a primary-key change
    await arun(db, "update accounts set id = 1000 where id = 20")
    # deletes
    await arun(db, "delete from accounts where id % 17 = 0")
    await arun(db, "delete from events where id % 10 = 0")
    # a transaction that touches no shape (notes with low priority; unpublished table)
    await arun(db, "insert into notes select g, g % 50, 'note ' || g from generate_series(1, 40) g")
    await arun(db, "insert into unpublished (junk) select 'x' from generate_series(1, 100)")
    # a truncate, then new rows
    await arun(db, "truncate events")
    await arun(
        db,
        "insert into events select g, 1, (array['signup','click'])[g % 2 + 1],"
        " '{\"after\": true}' from generate_series(1000, 1100) g",
    )
    # an added column (no default: existing rows are NULL in Postgres too) flows into
    # shapes without a column list
    await arun(db, "alter table accounts add column region text")
    await arun(db, "update accounts set region = 'us', balance = balance + 1 where id % 3 = 0")
    await arun(
        db,
        "insert into accounts (id, owner, balance, tier, region)"
        " values (5000, 'late', 4000, 'gold', 'apac')",
    )
    await arun(db, "update notes set priority = 500 where id = 7")
    # an idle stretch (keepalives only), then one more change
    await asyncio.sleep(3)
    await arun(db, "update accounts set balance = 1234.5 where id = 1")


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_mixed_workload_every_shape_equals_postgres(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    table_format: str,
) -> None:
    await arun(pg_db, SCHEMA)
    settings = settings_for(pg_db.dsn, str(tmp_path), SHAPES, sink={"format": table_format})
    async with running_service(settings, spark) as service:
        await mixed_workload(pg_db)
        target = current_lsn(pg_db.dsn)
        await wait_frontiers(service, target)
        # every shape is active, nothing violated, nothing stalled
        ready, reasons = service.readiness()
        assert ready, reasons
        # 17 transactions reach us (the one on an unpublished table is empty: skipped)
        assert service.collector.stats.transactions == 17
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(tmp_path), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
    # the tables read without tidemark's code, folded plainly, equal Postgres too
    readers = ["duckdb"] if table_format == "delta" else ["duckdb", "pyiceberg", "polars"]
    with psycopg.connect(pg_db.dsn) as conn:
        for shape, query in TRUTH.items():
            expected = frozenset(tuple(map(normalise, r)) for r in conn.execute(query))
            for reader in readers:
                rows = changelog_rows(reader, tmp_path, shape, table_format)
                assert folded(rows, ["id"]) == expected, (shape, reader)
    # the slot ended at or past the last write, and never beyond what was received
    with psycopg.connect(pg_db.dsn) as conn:
        row = conn.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = 'tm_e2e'"
        ).fetchone()
    from tidemark.lsn import Lsn

    assert row is not None and int(Lsn.parse(row[0])) >= target


def rows_at_version(
    root: Path, kind: str, shape: str, table_format: str, version: int
) -> list[dict[str, object]]:
    """A table's rows at one version (Delta) or snapshot (Iceberg), read with the
    format's own library, as a user's engine would time travel."""
    if table_format == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(root / kind / shape), version=version).to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]
    from pyiceberg.table import StaticTable

    namespace = "tidemark" if kind == "tables" else "tidemark_current"
    static = StaticTable.from_metadata(metadata_location(root, namespace, shape))
    return static.scan(snapshot_id=version).to_arrow().to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_every_table_time_travelled_to_the_versions_at_one_lsn_equals_postgres_then(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    table_format: str,
) -> None:
    """``tidemark.read.versions_at``: the version of each shape's tables holding the
    state as of one LSN; read there with the format's own library and folded, every
    shape equals what Postgres held at that LSN, while changes went on after it."""
    from tidemark import read

    await arun(pg_db, SCHEMA)
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        SHAPES,
        current={"refresh_s": 3600, "buckets": 4},
        sink={"format": table_format},
    )
    async with running_service(settings, spark) as service:
        assert service.keeper is not None
        await mixed_workload(pg_db)
        at = current_lsn(pg_db.dsn)
        await wait_frontiers(service, at)
        with psycopg.connect(pg_db.dsn) as conn:
            then = {
                shape: frozenset(tuple(map(normalise, r)) for r in conn.execute(query))
                for shape, query in TRUTH.items()
            }
        await service.keeper.refresh(*TRUTH)  # current tables folded through ``at``
        # changes after the LSN: updates, deletes, inserts
        await arun(pg_db, "update accounts set balance = balance + 5000, tier = 'gold'")
        await arun(pg_db, "delete from events where id % 2 = 0")
        await arun(pg_db, "insert into notes values (9001, 900, 'later')")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.keeper.refresh(*TRUTH)
    versions = read.versions_at(tmp_path, list(TRUTH), at)
    for shape, expected in then.items():
        found = versions[shape]
        assert found.format == table_format and found.lsn == at
        changes = rows_at_version(tmp_path, "tables", shape, table_format, found.changelog_version)
        assert any(int(r["_lsn"]) > at for r in rows_of_newest(tmp_path, shape, table_format))
        upto = [r for r in changes if int(r["_lsn"]) <= at]  # type: ignore[call-overload]
        assert folded(upto, ["id"]) == expected, (shape, found.how())
        # the current table at its refresh, and the changelog rows after it folded on
        assert found.current_version is not None and found.current_lsn is not None, found
        base = rows_at_version(tmp_path, "current", shape, table_format, found.current_version)
        rows = [r | {"_kind": "snapshot", "_op": 0} for r in base]
        rows += [r for r in upto if int(r["_lsn"]) > found.current_lsn]  # type: ignore[call-overload]
        assert folded(rows, ["id"]) == expected, (shape, found.how())
    # the same reads without Spark (``tidemark.read.arrow_*``): as of the LSN (each
    # current table's refresh there plus the changelog after it), and now; and the Arrow
    # tables handed to pandas, Polars and DuckDB as their users would
    import duckdb
    import polars as pl

    arrow_then = read.arrow_snapshot(tmp_path, list(TRUTH), at)
    with psycopg.connect(pg_db.dsn) as conn:
        for shape, query in TRUTH.items():
            assert plain(arrow_then[shape].to_pylist()) == then[shape], shape
            state = read.arrow_current(tmp_path, shape)
            now = frozenset(tuple(map(normalise, r)) for r in conn.execute(query))
            assert plain(state.to_pylist()) == now, shape
            frame = state.to_pandas()  # (pandas turns NULL integers into NaN floats)
            assert sorted(frame["id"].tolist()) == sorted(r[0] for r in now), shape
            assert plain(pl.from_arrow(state).to_dicts()) == now, shape  # type: ignore[union-attr]
            con = duckdb.connect()
            con.register("state", state)
            assert plain(records(con, "select * from state")) == now, shape
            changes = read.arrow_changelog(tmp_path, shape)
            assert folded(changes.to_pylist(), ["id"]) == now, shape


def rows_of_newest(root: Path, shape: str, table_format: str) -> list[dict[str, object]]:
    return changelog_rows("duckdb", root, shape, table_format)


async def test_added_column_with_a_default_is_resynced_to_equal_postgres(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # given a shape without a column list on a table with rows flowing
    await arun(pg_db, "create table t (id int primary key, v text)")
    settings = settings_for(pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "public.t"}])
    async with running_service(settings, spark) as service:
        await arun(pg_db, "insert into t select g, 'v' from generate_series(1, 10) g")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when a column is added with a default (existing rows get it, no change says so)
        await arun(pg_db, "alter table t add column flag text default 'yes'")
        await arun(pg_db, "insert into t values (11, 'w')")
        async with asyncio.timeout(60):
            while not service.collector.stats.resyncs:
                await asyncio.sleep(0.05)
        # then the shape is flagged with the reason, rebuilt from a snapshot, and complete
        assert "flag" in service.collector.stats.resyncs[0].reason
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    result = compare_shape(spark, str(tmp_path), "t_all", "select * from t", pg_db.dsn)
    assert result.equal, result.describe()
    assert ("1", "v", "yes") in {tuple(map(str, r)) for r in result.got}


async def test_a_table_whose_names_hold_dots_and_quotes_is_published_and_followed(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    await arun(
        pg_db,
        'create schema "My.Schema";'
        ' create table "My.Schema"."Or""ders" (id int primary key, v text)',
    )
    await arun(pg_db, """insert into "My.Schema"."Or""ders" values (1, 'before')""")
    shape = {"name": "odd", "table": '"My.Schema"."Or""ders"'}
    async with running_service(settings_for(pg_db.dsn, str(tmp_path), [shape]), spark) as service:
        await arun(pg_db, """insert into "My.Schema"."Or""ders" values (2, 'after')""")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    rows = pg_db.execute(
        "select schemaname, tablename from pg_publication_tables where pubname = 'tm_e2e'"
    )
    assert rows == [("My.Schema", 'Or"ders')]
    result = compare_shape(
        spark, str(tmp_path), "odd", 'select * from "My.Schema"."Or""ders"', pg_db.dsn
    )
    assert result.equal, result.describe()


def plain_current_state(
    root: Path, shape: str, table_format: str
) -> tuple[frozenset[tuple[object, ...]], int, int]:
    """``current/<shape>`` read without tidemark's code (deltalake, or the Iceberg
    metadata file through DuckDB): its rows without ``_lsn``, how many there are, and
    the LSN its newest refresh records."""
    if table_format == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(str(root / "current" / shape))
        lsn = dt.transaction_version(f"tidemark-current:{shape}")
        assert lsn is not None
        assert lsn == next(int(e["tidemark.lsn"]) for e in dt.history() if "tidemark.lsn" in e)
        rows = dt.to_pyarrow_table().to_pylist()
    else:
        from pyiceberg.table import StaticTable

        static = StaticTable.from_metadata(metadata_location(root, "tidemark_current", shape))
        snap = static.current_snapshot()
        while snap is not None and "tidemark.lsn" not in snap.summary.additional_properties:
            snap = static.snapshot_by_id(snap.parent_snapshot_id)  # type: ignore[arg-type]
        assert snap is not None
        lsn = int(snap.summary.additional_properties["tidemark.lsn"])
        rows = current_rows("duckdb", root, shape, table_format)
    got = [tuple(normalise(v) for c, v in r.items() if c != "_lsn") for r in rows]
    return frozenset(got), len(got), lsn


def changelog_count(root: Path, shape: str, table_format: str) -> int:
    return len(changelog_rows("duckdb", root, shape, table_format))


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_current_tables_read_plainly_equal_postgres_and_retention_shrinks_the_changelog(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    table_format: str,
) -> None:
    from tidemark import read
    from tidemark.errors import SinkError
    from tidemark.sink import table_format as format_named

    tables = format_named(table_format)
    await arun(pg_db, SCHEMA)
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        SHAPES,
        current={"refresh_s": 0.5, "buckets": 4},
        sink={"changelog_retention_hours": 0, "format": table_format},
    )
    first_lsn = current_lsn(pg_db.dsn)
    async with running_service(settings, spark) as service:
        assert service.keeper is not None
        await mixed_workload(pg_db)  # refreshes run meanwhile, every 0.5 s
        target = current_lsn(pg_db.dsn)
        await wait_frontiers(service, target)

        def refreshes() -> dict[str, float]:
            return {n: service.metrics.current_refreshes.labels(n)._value.get() for n in TRUTH}

        async with asyncio.timeout(120):  # the keeper folds every shape on its own
            while min(refreshes().values()) < 1 or service.keeper.shapes_waiting():
                await asyncio.sleep(0.2)
        await arun(pg_db, "update accounts set tier = 'silver' where id = 3")
        await arun(pg_db, "delete from events where id = 1001")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        for shape in TRUTH:  # fold what is left now, rather than wait for the timer
            await service.keeper.refresh(shape)
        assert min(refreshes().values()) >= 1 and sum(refreshes().values()) > len(TRUTH)
        # a resync rebuilds the changelog from a new snapshot: the current table follows
        urgent = tables.changelog(tmp_path, "urgent")
        generation = urgent.generation()
        await service.resync_shape("urgent")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert urgent.generation() == generation + 1
        await service.keeper.refresh("urgent")
        point = tables.current(tmp_path, "urgent").points()[0]
        assert point.generation == generation + 1
        before = {s: changelog_count(tmp_path, s, table_format) for s in TRUTH}
        await service._maintain()  # retention 0 h: everything folded may go
        # a change after the retention, folded onto the current table again
        await arun(pg_db, "update accounts set owner = 'after retention' where id = 2")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # every shape at once: small tables, so one Spark job per column layout
        done = await service.keeper.refresh(*TRUTH)
        assert all(r is not None for r in done.values()), done
        # (the keeper's own timer, every 0.5 s, may have folded a shape just before:
        # then this call found nothing to do; either way the table now folds the
        # change, and a small table is one bucket)
        point = tables.current(tmp_path, "all_accounts").points()[0]
        committed = tables.changelog(tmp_path, "all_accounts").committed_lsn()
        assert committed is not None
        assert point.lsn >= committed and point.buckets == 1, (point, committed)
        from tidemark.api.shape_view import shape_json

        view = shape_json(service, "all_accounts")["current"]
        assert view["folded"] is not None and view["rows_waiting"] == 0, view
        assert view["lag_bytes"] is not None
    with psycopg.connect(pg_db.dsn) as conn:
        for shape, query in TRUTH.items():
            table = tables.changelog(tmp_path, shape)
            retained = table.retained_lsn(table.generation())
            assert retained is not None, shape
            after = changelog_count(tmp_path, shape, table_format)
            assert after < before[shape], (shape, before[shape], after)
            # the current table alone, as any reader sees it, as of its LSN
            got, count, lsn = plain_current_state(tmp_path, shape, table_format)
            assert lsn >= retained
            expected = [tuple(map(normalise, r)) for r in conn.execute(query).fetchall()]
            assert got == frozenset(expected) and count == len(expected), shape
            # tidemark.read: the current table plus the changelog tail, exact now
            result = compare_shape(spark, str(tmp_path), shape, query, pg_db.dsn)
            assert result.equal, result.describe()
            # before the retained history: refused, naming the oldest readable LSN
            with pytest.raises(SinkError, match="Read as of"):
                read.current(spark, tmp_path, shape, as_of=first_lsn).collect()


@one_server()
async def test_upkeep_waiting_for_a_slow_refresh_leaves_flushes_and_watchdog_running(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upkeep of a shape whose current table is being refreshed waits for the refresh.
    Meanwhile the shape's changes must go on being committed and acknowledged (a
    refresh of a big table takes minutes: the ack lag must not grow by them), and the
    event loop's systemd watchdog pings must go on (``WatchdogSec=60`` would kill a
    service whose upkeep waited longer)."""
    import threading
    import time

    from tidemark import systemd

    pings: list[float] = []

    def notify(state: str) -> bool:
        if state.startswith("WATCHDOG=1"):
            pings.append(time.monotonic())
        return True

    monkeypatch.setattr(systemd, "notify", notify)
    await arun(pg_db, SCHEMA)
    shapes = [s for s in SHAPES if s["name"] == "all_accounts"]
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        shapes,
        current={"refresh_s": 3600},  # refreshed below, by hand
        sink={"changelog_retention_hours": 0, "maintenance_every_s": 1},
    )
    async with running_service(settings, spark) as service:
        keeper = service.keeper
        assert keeper is not None
        await arun(pg_db, "insert into accounts values (1, 'a', 1, 'gold', null, null)")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        refresh_current = keeper.tables.refresh_current
        release = threading.Event()

        def slow_refresh(*args, **kwargs):  # type: ignore[no-untyped-def]
            release.wait(60)  # (a refresh of a big table: it holds the shape's upkeep)
            return refresh_current(*args, **kwargs)

        monkeypatch.setattr(keeper.tables, "refresh_current", slow_refresh)
        refreshing = asyncio.create_task(keeper.refresh("all_accounts"))
        try:
            async with asyncio.timeout(30):
                while not keeper.lock("all_accounts").locked():
                    await asyncio.sleep(0.02)
            await asyncio.sleep(2.0)  # upkeep (every second) now waits for the refresh
            waiting_since = time.monotonic()
            await arun(pg_db, "insert into accounts values (2, 'b', 2, 'gold', null, null)")
            target = current_lsn(pg_db.dsn)
            # committed (and so acknowledged) while the refresh still runs
            await wait_frontiers(service, target, timeout=20)
            async with asyncio.timeout(10):
                while service.progress().flushed_lsn < target:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(max(0.0, waiting_since + 2.0 - time.monotonic()))
            assert not refreshing.done()
            assert sum(1 for t in pings if t > waiting_since) >= 2, "no watchdog pings"
        finally:
            release.set()
        await refreshing
        await arun(pg_db, "update accounts set owner = 'after upkeep' where id = 1")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    result = compare_shape(spark, str(tmp_path), "all_accounts", TRUTH["all_accounts"], pg_db.dsn)
    assert result.equal, result.describe()
