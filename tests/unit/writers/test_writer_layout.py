"""A shape's column layout changes while rows are buffered (a column added, dropped or
reordered upstream, or a resync rebinding the shape): rows keep their values."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tidemark.lsn import LogOffset
from tidemark.sink.delta.table import ShapeTable
from tidemark.sink.schema import ColumnSpec
from tidemark.writers.arrow_batch import build_table
from tidemark.writers.writer import ShapeWriter, TableState

ID, A, B = ColumnSpec("id", 23), ColumnSpec("a", 25), ColumnSpec("b", 25)


def writer_with_one_row(tmp_path: Path) -> ShapeWriter:
    writer = ShapeWriter(ShapeTable(tmp_path, "s"), [ID, A, B], lambda *_: None)
    assert writer.begin_txn(100, 1, 0)
    writer.append(0, "insert", (b"1", b"A", b"B"), None, 8)
    writer.end_txn(LogOffset(100, 1))
    return writer


def built(writer: ShapeWriter) -> dict[str, list[object]]:
    batch = writer.take_batch()
    assert batch is not None
    schema, columns = getattr(batch, "schema", writer.schema), getattr(batch, "columns", None)
    table = build_table(schema, columns or writer.columns, batch.rows)
    return {
        name: table.column(name).to_pylist() for name in ("id", "a", "b") if name in schema.names
    }


def test_a_reorder_while_rows_are_buffered_keeps_each_value_in_its_column(tmp_path: Path) -> None:
    writer = writer_with_one_row(tmp_path)
    writer.set_columns([ID, B, A])
    assert built(writer) == {"id": [1], "a": ["A"], "b": ["B"]}


def test_a_dropped_column_while_rows_are_buffered_does_not_break_the_flush(
    tmp_path: Path,
) -> None:
    writer = writer_with_one_row(tmp_path)
    writer.set_columns([ID, B])
    assert built(writer) == {"id": [1], "b": ["B"]}


def test_an_added_column_while_rows_are_buffered_is_null_for_them(tmp_path: Path) -> None:
    writer = writer_with_one_row(tmp_path)
    writer.set_columns([ID, A, B, ColumnSpec("c", 23)])
    batch = writer.take_batch()
    assert batch is not None
    columns = getattr(batch, "columns", None) or writer.columns
    schema = getattr(batch, "schema", writer.schema)
    table = build_table(schema, columns, batch.rows)
    assert table.column("c").to_pylist() == [None] and table.column("b").to_pylist() == ["B"]


def test_a_writer_given_its_tables_state_does_not_read_the_table(tmp_path: Path) -> None:
    """The service reads a table's state in a thread, with its creation; the writer
    made on the event loop from it must not read the table again."""

    class Unreadable(ShapeTable):
        def op_type(self) -> pa.DataType | None:
            raise AssertionError("read on the event loop")

        def committed_lsn(self) -> int | None:
            raise AssertionError("read on the event loop")

    table = Unreadable(tmp_path, "s")
    writer = ShapeWriter(table, [ID, A], lambda *_: None, state=TableState(pa.int32(), 500))
    assert writer.op_type == pa.int32() and writer.committed_lsn == 500
    assert not writer.begin_txn(400, 1, 0)  # committed before: left out
    assert writer.begin_txn(600, 2, 0)
    # without a state, it reads the table (no table yet: nothing committed, _op int64)
    fresh = ShapeWriter(ShapeTable(tmp_path, "t"), [ID, A], lambda *_: None)
    assert TableState.read(ShapeTable(tmp_path, "t")) == TableState(None, None)
    assert fresh.committed_lsn is None and fresh.schema.field("_op").type == pa.int64()
