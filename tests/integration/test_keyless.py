"""A table without a primary key (REPLICA IDENTITY FULL): the whole row is its key, and
Postgres may hold a row several times. Every reader must hold each row as many times as
Postgres does, through a backfill of a table that already has duplicates, deletes and
updates of one copy, a bulk delete of some copies, and a truncate; in Delta and Iceberg.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.demo.verify import compare_shape, normalise

from .conftest import PgDatabase, one_server
from .outside_readers import changelog_rows, current_rows
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_e2e import rows_at_version

SCHEMA = """
create table bag (n int, s text, v int);
alter table bag replica identity full;
insert into bag select 1, 'x', 1 from generate_series(1, 4);
insert into bag select 5, 'w', 5 from generate_series(1, 2);
insert into bag select 6, 'six', null from generate_series(1, 2);
insert into bag select 7, 'dup', 7 from generate_series(1, 3000);
insert into bag select g, 'r' || g, g from generate_series(100, 399) g;
"""

SHAPES = [
    {"name": "bag_all", "table": "public.bag"},
    {"name": "bag_some", "table": "public.bag", "where": "v is null or v < 50"},
]
TRUTH = {
    "bag_all": "select n, s, v from bag",
    "bag_some": "select n, s, v from bag where v is null or v < 50",
}


def one_copy(condition: str, copies: int = 1) -> str:
    """Delete ``copies`` of the rows matching ``condition`` (a keyless row is told apart
    only by its place)."""
    return f"delete from bag where ctid in (select ctid from bag where {condition} limit {copies})"


def multiset(rows: Iterable[Sequence[Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(normalise(v) for v in r) for r in rows)


def postgres(dsn: str) -> dict[str, Counter[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {shape: multiset(conn.execute(query)) for shape, query in TRUTH.items()}


def shape_rows(rows: Iterable[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return multiset((r["n"], r["s"], r["v"]) for r in rows)


def fold_copies(changes: Sequence[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """A keyless changelog folded plainly: a snapshot row or an insert adds a copy, a
    delete removes one, a truncate clears."""
    ordered = sorted(changes, key=lambda r: (r["_kind"] != "snapshot", r["_lsn"], r["_op"]))
    state: Counter[tuple[Any, ...]] = Counter()
    for r in ordered:
        row = tuple(normalise(r[c]) for c in ("n", "s", "v"))
        if r["_kind"] == "truncate":
            state.clear()
        elif r["_kind"] == "delete":
            state[row] -= 1
        elif r["_kind"] in ("snapshot", "insert"):
            state[row] += 1
    return +state


@one_server()
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_a_keyless_table_keeps_every_copy_postgres_has_in_every_reader(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    table_format: str,
) -> None:
    import polars as pl

    from tidemark import read

    await pg_db.aexecute(SCHEMA)  # the backfill reads a table that has duplicates
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        SHAPES,
        current={"refresh_s": 3600, "buckets": 4},
        sink={"format": table_format},
    )
    async with running_service(settings, spark) as service:
        assert service.keeper is not None
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.keeper.refresh(*TRUTH)  # current tables hold the copies too
        # one copy deleted, one updated, a bulk delete of some copies, new duplicates
        await pg_db.aexecute(one_copy("n = 1"))
        await pg_db.aexecute(one_copy("n = 6"))
        await pg_db.aexecute(
            "update bag set v = 50 where ctid in (select ctid from bag where n = 5 limit 1)"
        )
        await pg_db.aexecute(one_copy("n = 7", 1000))
        await pg_db.aexecute("insert into bag select 8, 'new', 8 from generate_series(1, 5)")
        await pg_db.aexecute(one_copy("n = 8", 2))
        await pg_db.aexecute("update bag set v = v + 1 where n between 100 and 120")
        at = current_lsn(pg_db.dsn)
        await wait_frontiers(service, at)
        then = postgres(pg_db.dsn)
        assert then["bag_all"][(1, "x", 1)] == 3 and then["bag_all"][(7, "dup", 7)] == 2000
        await service.keeper.refresh(*TRUTH)  # folded onto the copies folded before
        # a truncate, then duplicates again
        await pg_db.aexecute("truncate bag")
        await pg_db.aexecute("insert into bag select 9, 'again', null from generate_series(1, 3)")
        await pg_db.aexecute("insert into bag values (10, 'one', 10)")
        await pg_db.aexecute(one_copy("n = 9"))
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        now = postgres(pg_db.dsn)
        for shape in TRUTH:
            # tidemark read (Arrow) and read.current (Spark): the table plus its tail
            assert shape_rows(read.arrow_current(tmp_path, shape).to_pylist()) == now[shape]
            result = compare_shape(spark, str(tmp_path), shape, TRUTH[shape], pg_db.dsn)
            assert result.equal, result.describe()
            # as of the LSN before the truncate
            at_then = read.arrow_current(tmp_path, shape, as_of=at).to_pylist()
            assert shape_rows(at_then) == then[shape], shape
            assert shape_rows(read.current(spark, tmp_path, shape, at).collect()) == then[shape]
            # the changelog as an outside reader sees it, folded as a multiset
            assert (
                fold_copies(changelog_rows("duckdb", tmp_path, shape, table_format)) == now[shape]
            )
        await service.keeper.refresh(*TRUTH)
    for shape in TRUTH:
        # the current tables read plainly, each copy a row
        assert shape_rows(current_rows("duckdb", tmp_path, shape, table_format)) == now[shape]
        if table_format == "delta":
            frame = pl.read_delta(str(tmp_path / "current" / shape))
            assert shape_rows(frame.to_dicts()) == now[shape]
        # time travel: each table at its version for the LSN before the truncate
        found = read.versions_at(tmp_path, [shape], at)[shape]
        changes = rows_at_version(tmp_path, "tables", shape, table_format, found.changelog_version)
        upto = [r for r in changes if int(r["_lsn"]) <= at]
        assert fold_copies(upto) == then[shape], found.how()
        assert found.current_version is not None and found.current_lsn is not None
        base = rows_at_version(tmp_path, "current", shape, table_format, found.current_version)
        rows = [r | {"_kind": "snapshot", "_op": 0} for r in base]
        rows += [r for r in upto if int(r["_lsn"]) > found.current_lsn]
        assert fold_copies(rows) == then[shape], found.how()
