"""Compare a shape's folded table with a query on Postgres (demo, tests, operators).

Values are normalised so equal data compares equal across the two drivers:
timestamps to aware UTC (Spark returns naive local-time datetimes, psycopg aware
ones), decimals without trailing zeros, lists and dicts as tuples.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg


def normalise(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        # a naive value (Spark) is local time; astimezone converts both kinds to UTC
        return value.astimezone(dt.UTC)
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, list | tuple):
        return tuple(normalise(v) for v in value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


@dataclass(frozen=True, slots=True)
class Comparison:
    """Postgres's rows and the lake's, each a multiset (a table without a primary key
    may hold a row several times: the lake must hold it as many times)."""

    shape: str
    expected: Counter[tuple[Any, ...]]
    got: Counter[tuple[Any, ...]]

    @property
    def equal(self) -> bool:
        return self.expected == self.got

    @property
    def expected_rows(self) -> int:
        return self.expected.total()

    @property
    def got_rows(self) -> int:
        return self.got.total()

    @property
    def duplicates(self) -> int:
        """Copies the lake holds of a Postgres row beyond the ones Postgres holds."""
        return sum(n for row, n in (self.got - self.expected).items() if row in self.expected)

    def describe(self, limit: int = 5) -> str:
        missing = [_short(r) for r in sorted(self.expected - self.got, key=repr)[:limit]]
        extra = [_short(r) for r in sorted(self.got - self.expected, key=repr)[:limit]]
        return (
            f"{self.shape}: {self.expected_rows} rows on Postgres, {self.got_rows} in the "
            f"lake, {self.duplicates} duplicated; missing {missing}; unexpected {extra}"
        )


def _short(row: tuple[Any, ...], width: int = 40) -> tuple[Any, ...]:
    """A row for a message: long values cut to ``width`` characters."""
    return tuple(
        f"{v[:width]}...({len(v)} chars)" if isinstance(v, str) and len(v) > width else v
        for v in row
    )


def compare_shape(
    spark: Any, root: str, shape: str, query: str, dsn: str, as_of: int | None = None
) -> Comparison:
    """The folded shape (columns in table order, without _lsn) vs ``query``'s rows, as
    multisets."""
    from tidemark import read

    with psycopg.connect(dsn) as conn:
        expected = [tuple(map(normalise, r)) for r in conn.execute(query).fetchall()]
    frame = read.current(spark, root, shape, as_of)
    columns = [c for c in frame.columns if c != "_lsn"]
    got = [tuple(normalise(r[c]) for c in columns) for r in frame.collect()]
    return Comparison(shape, Counter(expected), Counter(got))
