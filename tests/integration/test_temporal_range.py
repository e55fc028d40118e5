"""Dates and timestamps across Postgres's whole range reach the lake unchanged.

Spark writes Parquet timestamps as INT96 unless told otherwise, which plain Parquet
and Delta readers (``deltalake``, pyarrow) read as nanoseconds: values outside
1677-2262 overflow and the others fail to cast to microseconds. Dates and timestamps
before the Gregorian switch (1582) make Spark either raise or rebase them into its
old hybrid calendar. Postgres uses the proleptic Gregorian calendar throughout, so
the lake must too: a value in year 1000 or 9999 written by the backfill and by the
stream reads back equal to Postgres with plain ``deltalake`` and with ``tidemark.read``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from tidemark.demo.verify import compare_shape, normalise

from .conftest import PgDatabase
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

# (timestamptz, timestamp, date): far outside 1677-2262 (where INT96 read as nanoseconds
# overflows), and 1582-10-10, which only the proleptic Gregorian calendar has (the
# hybrid Julian/Gregorian one skips 1582-10-05..14). Year 1 is left out: PySpark's own
# conversion of such a timestamp to a Python datetime fails, whatever the file holds.
VALUES = [
    ("1000-01-01 00:00:00+00", "1000-01-01 00:00:00", "1000-01-01"),
    ("9999-12-31 23:59:59.999999+00", "9999-12-31 23:59:59.999999", "9999-12-31"),
    ("1582-10-10 12:00:00+00", "1582-10-10 12:00:00", "1582-10-10"),
    ("2024-05-06 07:08:09.123456+02", "2024-05-06 07:08:09.123456", "2024-05-06"),
    (None, None, None),
]
QUERY = "select id, tsz, ts, d from moments"


def insert(db: PgDatabase, first_id: int) -> None:
    for offset, (tsz, ts, d) in enumerate(VALUES):
        db.execute("insert into moments values (%s, %s, %s, %s)", (first_id + offset, tsz, ts, d))


def lake_rows_by_deltalake(root: Path, shape: str) -> set[tuple[Any, ...]]:
    """The shape table read with plain deltalake (pyarrow), no Spark, no tidemark."""
    table = DeltaTable(str(root / "tables" / shape)).to_pyarrow_table()
    rows = table.select(["id", "tsz", "ts", "d"]).to_pylist()
    return {tuple(normalise(r[c]) for c in ("id", "tsz", "ts", "d")) for r in rows}


async def test_dates_and_timestamps_from_year_1000_to_9999_read_back_equal_to_postgres(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a table holding the extremes, backfilled when the shape starts
    pg_db.execute(
        "set timezone = 'UTC';"
        "create table moments (id int primary key, tsz timestamptz, ts timestamp, d date)"
    )
    insert(pg_db, 1)
    settings = settings_for(pg_db.dsn, str(tmp_path), [{"name": "moments", "table": "moments"}])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when the same values arrive through the stream
        insert(pg_db, 101)
        await wait_frontiers(service, current_lsn(pg_db.dsn))

    # then plain deltalake reads every row, equal to Postgres (backfill and stream)
    expected = {tuple(normalise(v) for v in row) for row in pg_db.execute(QUERY)}
    assert len(expected) == 2 * len(VALUES)
    assert lake_rows_by_deltalake(tmp_path, "moments") == expected
    # and so does tidemark.read (Spark) after the fold
    comparison = compare_shape(spark, str(tmp_path), "moments", QUERY, pg_db.dsn)
    assert comparison.equal, comparison.describe()
    # (and the extremes really are in the table, in each of the three types)
    by_id = {row[0]: row for row in pg_db.execute(QUERY)}
    assert by_id[1][1:] == (
        dt.datetime(1000, 1, 1, tzinfo=dt.UTC),
        dt.datetime(1000, 1, 1),
        dt.date(1000, 1, 1),
    )
    assert [v.year for v in by_id[102][1:]] == [9999, 9999, 9999]
