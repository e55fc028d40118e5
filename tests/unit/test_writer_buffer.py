"""A shape's buffer: transaction boundaries, batches, staging; Arrow building."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidemark.lsn import LogOffset
from tidemark.pgoutput.messages import UNCHANGED_TOAST
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.sink.table import DataFile
from tidemark.writers.arrow_batch import PG_EPOCH_US, build_table
from tidemark.writers.buffer import ShapeBuffer

SPECS = [ColumnSpec("id", 23), ColumnSpec("name", 25), ColumnSpec("big", 25)]


def txn(buf: ShapeBuffer, lsn: int, rows: list[tuple[str, tuple]], now: float = 0.0) -> int:  # type: ignore[type-arg]
    buf.begin_txn(lsn, xid=lsn // 10, commit_ts=lsn * 1000)
    for op, (kind, values) in enumerate(rows):
        unchanged = ["big"] if UNCHANGED_TOAST in values else None
        buf.append(op, kind, values, unchanged, size_hint=10)
    return buf.end_txn(now)


def test_open_rows_are_not_ready_until_the_transaction_ends() -> None:
    buf = ShapeBuffer("s")
    buf.begin_txn(100, 1, 0)
    buf.append(0, "insert", (b"1", b"a", b"x"), None, 10)
    assert buf.take_batch() is None and buf.ready_rows == 0 and buf.open_bytes > 0
    buf.end_txn(now=5.0)
    batch = buf.take_batch()
    assert batch is not None
    assert (batch.end_lsn, batch.last_offset, batch.transactions) == (100, LogOffset(100, 0), 1)
    assert batch.first_buffered_at == 5.0 and len(batch.rows) == 1
    assert buf.take_batch() is None


def test_a_batch_ends_at_the_last_transaction_and_keeps_commit_order() -> None:
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a", b"x")), ("insert", (b"2", b"b", b"y"))])
    txn(buf, 200, [("delete", (b"1", None, None))])
    batch = buf.take_batch()
    assert batch is not None
    assert batch.end_lsn == 200 and batch.last_offset == LogOffset(200, 0)
    assert batch.rows.kinds == ["insert", "insert", "delete"]
    assert batch.rows.runs == [(100, 10, 100_000, 2), (200, 20, 200_000, 1)]


def test_a_transaction_without_rows_for_the_shape_leaves_nothing_ready() -> None:
    buf = ShapeBuffer("s")
    assert txn(buf, 100, []) == 0
    assert buf.take_batch() is None


def test_aborted_transaction_rows_are_dropped() -> None:
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a", b"x"))])
    buf.begin_txn(200, 2, 0)
    buf.append(0, "insert", (b"2", b"b", b"y"), None, 10)
    buf.abort_txn()
    assert not buf.in_txn
    batch = buf.take_batch()
    assert batch is not None and batch.end_lsn == 100 and len(batch.rows) == 1


def test_staged_rows_travel_with_their_transaction_into_the_batch() -> None:
    buf = ShapeBuffer("s")
    buf.begin_txn(300, 3, 0)
    buf.append(0, "insert", (b"1", b"a", b"x"), None, 10)
    taken = buf.take_open_rows()
    assert taken is not None and taken[0].lsn == 300 and len(taken[1]) == 1
    assert buf.open_bytes == 0
    staged = DataFile("data/x/part-0.parquet", 100, 1, 0, "{}")
    assert buf.attach_staged(taken[0], [staged]) == []
    buf.append(1, "insert", (b"2", b"b", b"y"), None, 10)
    assert buf.end_txn(0.0) == 2
    batch = buf.take_batch()
    assert batch is not None and batch.staged == [staged] and batch.row_count == 2
    assert batch.last_offset == LogOffset(300, 1)


def test_files_staged_for_an_aborted_transaction_are_not_committed() -> None:
    buf = ShapeBuffer("s")
    buf.begin_txn(300, 3, 0)
    buf.append(0, "insert", (b"1", b"a", b"x"), None, 10)
    delivery, _ = buf.take_open_rows()  # type: ignore[misc]
    buf.abort_txn()
    orphan = DataFile("data/x/p.parquet", 1, 1, 0, "{}")
    assert buf.attach_staged(delivery, [orphan]) == [orphan]  # for the caller to delete
    assert buf.take_batch() is None


def test_arrow_batch_has_typed_columns_and_expanded_metadata() -> None:
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a", b"x")), ("update", (b"1", b"b", UNCHANGED_TOAST))])
    batch = buf.take_batch()
    assert batch is not None
    table = build_table(table_schema(SPECS), SPECS, batch.rows)
    assert table.schema == table_schema(SPECS)
    assert table.column("id").to_pylist() == [1, 1]
    assert table.column("big").to_pylist() == ["x", None]  # unchanged -> NULL ...
    assert table.column("_unchanged").to_pylist() == [None, ["big"]]  # ... and listed
    assert table.column("_lsn").to_pylist() == [100, 100]
    assert table.column("_op").to_pylist() == [0, 1]
    assert table.column("_commit_ts").cast(pa.int64()).to_pylist() == [100_000 + PG_EPOCH_US] * 2


def test_rows_from_before_an_added_column_get_null_for_it() -> None:
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a"))])  # buffered while the table had 2 columns
    txn(buf, 200, [("insert", (b"2", b"b", b"x"))])
    batch = buf.take_batch()
    assert batch is not None
    table = build_table(table_schema(SPECS), SPECS, batch.rows)
    assert table.column("big").to_pylist() == [None, "x"]


def test_arrow_batch_refuses_rows_wider_than_the_shape() -> None:
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a", b"x", b"extra"))])
    batch = buf.take_batch()
    assert batch is not None
    with pytest.raises(ValueError, match="4 values, the shape has 3"):
        build_table(table_schema(SPECS), SPECS, batch.rows)


def test_files_staged_for_an_aborted_delivery_are_not_committed_with_its_redelivery() -> None:
    # given a huge transaction whose open rows went to a staging job
    buf = ShapeBuffer("s")
    buf.begin_txn(100, 7, 0)
    buf.append(0, "insert", (b"1", b"a", b"x"), None, 10)
    buf.append(2, "insert", (b"2", b"b", b"y"), None, 10)
    taken = buf.take_open_rows()
    assert taken is not None
    delivery = taken[0]
    # when the stream restarts before the job ends, and Postgres re-sends the transaction
    buf.abort_txn()
    buf.begin_txn(100, 7, 0)
    for op, key in ((0, b"1"), (2, b"2"), (4, b"3")):
        buf.append(op, "insert", (key, b"a", b"x"), None, 10)
    buf.end_txn(now=1.0)
    staged = DataFile("data/x/part-0.parquet", 100, 2, 0, "{}")
    buf.attach_staged(delivery, [staged])  # the first delivery's staging job finishes
    # then only the redelivery is committed: its three rows, not the stale staged two
    batch = buf.take_batch()
    assert batch is not None
    assert batch.staged == [] and batch.rows.ops == [0, 2, 4]
    assert batch.row_count == 3


def test_files_staged_for_the_open_delivery_travel_with_it() -> None:
    buf = ShapeBuffer("s")
    buf.begin_txn(100, 7, 0)
    buf.append(0, "insert", (b"1", b"a", b"x"), None, 10)
    taken = buf.take_open_rows()
    assert taken is not None
    buf.append(2, "insert", (b"2", b"b", b"y"), None, 10)
    buf.end_txn(now=1.0)  # the transaction commits while the staging job still runs
    staged = DataFile("data/x/part-0.parquet", 100, 1, 0, "{}")
    buf.attach_staged(taken[0], [staged])
    batch = buf.take_batch()
    assert batch is not None and batch.staged == [staged] and batch.rows.ops == [2]
    assert batch.row_count == 2
