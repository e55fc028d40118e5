"""A shape's table made at start: the state its writer gets without reading it back
(``shapeset._Prepared.create``) is the state read from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.sink import table_format
from tidemark.sink.schema import OP, ColumnSpec, table_schema
from tidemark.writers.writer import TableState

SPECS = [ColumnSpec("id", 23), ColumnSpec("a", 25)]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_table_made_now_has_the_state_of_its_schema_and_nothing_committed(
    tmp_path: Path, fmt: str
) -> None:
    table = table_format(fmt).changelog(tmp_path, "s")
    schema = table_schema(SPECS)
    assert table.create(schema, ["id"], {"name": "s"}) is True
    assert TableState.read(table) == TableState(schema.field(OP).type, None)
    # made already: the next start reads its state back
    again = table_format(fmt).changelog(tmp_path, "s")
    assert again.create(schema, ["id"], {"name": "s"}) is False
    assert TableState.read(again) == TableState(schema.field(OP).type, None)
