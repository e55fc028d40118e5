"""Backfills of shapes of one table share catalog reads: a rebind gets a read that
began after it asked, shared with every rebind that asked before that read began."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidemark import shapeset
from tidemark.errors import ShapeError
from tidemark.shapes.model import ShapeDefinition


class _Conn:
    closed = False

    async def close(self) -> None:
        self.closed = True


def _shapes() -> shapeset.ShapeSet:
    shapes = shapeset.ShapeSet.__new__(shapeset.ShapeSet)
    shapes._catalog_conn = _Conn()

    async def source() -> Any:  # (a failed read closes its connection: a new one)
        return _Conn()

    shapes._source = source
    shapes._catalog_lock = asyncio.Lock()
    shapes._catalog_next = {}
    shapes._tasks = set()
    return shapes


def _shape(name: str, table: str = "public.items") -> ShapeDefinition:
    return ShapeDefinition(name=name, table=table)


def test_rebinds_waiting_for_a_read_share_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    catalog = 0  # what the catalog says (a DDL moves it on)

    async def read_table(conn: Any, definition: ShapeDefinition) -> Any:
        reads.append(definition.name)
        seen = catalog
        await asyncio.sleep(0.05)
        return (definition.table, seen)

    monkeypatch.setattr(shapeset, "read_table", read_table)

    async def run() -> None:
        nonlocal catalog
        shapes = _shapes()
        first = asyncio.ensure_future(shapes._catalog(_shape("a")))
        await asyncio.sleep(0.01)  # a's read runs
        catalog = 1  # a DDL after a's read began: later rebinds must see it
        later = [asyncio.ensure_future(shapes._catalog(_shape(n))) for n in "bcd"]
        other = asyncio.ensure_future(shapes._catalog(_shape("e", "public.other")))
        got = await asyncio.gather(first, *later, other)
        assert got[0] == ("public.items", 0)
        assert got[1:4] == [("public.items", 1)] * 3  # one read for b, c and d
        assert got[4] == ("public.other", 1)
        assert sorted(reads) == ["a", "b", "e"]
        assert await shapes._catalog(_shape("f")) == ("public.items", 1)  # a read of its own
        assert len(reads) == 4

    asyncio.run(run())


def test_a_missing_table_is_reported_for_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    async def read_table(conn: Any, definition: ShapeDefinition) -> Any:
        await asyncio.sleep(0.02)
        raise ShapeError(f"shape {definition.name!r}: table {definition.table} does not exist")

    monkeypatch.setattr(shapeset, "read_table", read_table)

    async def run() -> None:
        shapes = _shapes()
        asked = [asyncio.ensure_future(shapes._catalog(_shape(n))) for n in "ab"]
        done = await asyncio.gather(*asked, return_exceptions=True)
        assert [str(e) for e in done] == [
            "shape 'a': table public.items does not exist",
            "shape 'b': table public.items does not exist",
        ]

    asyncio.run(run())
