"""Compare a shape's folded table with a query on Postgres (demo, tests, operators).

Values are normalised so equal data compares equal across the two drivers:
timestamps to aware UTC (Spark returns naive local-time datetimes, psycopg aware
ones), decimals without trailing zeros, lists and dicts as tuples.
"""

from __future__ import annotations

import datetime as dt
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
    shape: str
    expected: frozenset[tuple[Any, ...]]
    got: frozenset[tuple[Any, ...]]
    duplicates: int  # rows the fold returned more than once

    @property
    def equal(self) -> bool:
        return self.expected == self.got and self.duplicates == 0

    def describe(self, limit: int = 5) -> str:
        missing = [_short(r) for r in sorted(self.expected - self.got, key=repr)[:limit]]
        extra = [_short(r) for r in sorted(self.got - self.expected, key=repr)[:limit]]
        return (
            f"{self.shape}: {len(self.expected)} rows on Postgres, {len(self.got)} in the "
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
    """The folded shape (columns in table order, without _lsn) vs ``query``'s rows."""
    from tidemark import read

    with psycopg.connect(dsn) as conn:
        expected = [tuple(map(normalise, r)) for r in conn.execute(query).fetchall()]
    frame = read.current(spark, root, shape, as_of)
    columns = [c for c in frame.columns if c != "_lsn"]
    got = [tuple(normalise(r[c]) for c in columns) for r in frame.collect()]
    return Comparison(shape, frozenset(expected), frozenset(got), len(got) - len(set(got)))
