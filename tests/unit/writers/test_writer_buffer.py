"""A shape's buffer: transaction boundaries, batches, staging; Arrow building."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.errors import SinkError
from tidemark.lsn import LogOffset
from tidemark.pgoutput.messages import UNCHANGED_TOAST
from tidemark.sink.files import DataFile
from tidemark.sink.schema import ColumnSpec, table_schema
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


# -- transactions streamed before their commit ---------------------------------------


def spool_file(name: str, rows: int) -> DataFile:
    return DataFile(f"_spool/{name}/part-0.parquet", 10, rows, 0, "{}")


def stream_rows(buf: ShapeBuffer, xid: int, ops: list[int]) -> None:
    for op in ops:
        buf.stream_append(xid, op, "insert", (str(op).encode(), b"n", b"x"), None, 10)


def test_streamed_rows_wait_apart_until_their_commit_gives_them_an_lsn() -> None:
    from tidemark.writers.buffer import Spooled

    buf = ShapeBuffer("s")
    stream_rows(buf, 70, [0, 2])
    stream_rows(buf, 71, [0])
    assert buf.open_streams == 2 and buf.stream_bytes > 0 and buf.ready_rows == 0
    assert buf.oldest_lsn is None  # unknown commit LSN: holds no acknowledgement
    # rows of 70 left memory into a spool file while it was still open
    (part, rows), (other, _) = buf.take_stream_rows()
    assert part.xid == 70 and rows.runs == [(0, 70, 0, 2)] and buf.stream_bytes == 0
    assert buf.attach_spooled(part, Spooled([spool_file("a", 2)], 0, 2, 2)) == []
    stream_rows(buf, 70, [4])
    assert buf.stream_commit(70, lsn=500, commit_ts=9, now=1.0) == 4
    batch = buf.take_batch()
    assert batch is not None
    assert (batch.end_lsn, batch.last_offset, batch.transactions) == (500, LogOffset(500, 4), 1)
    assert batch.rows.runs == [(500, 70, 9, 1)] and batch.rows.ops == [4]
    (spooled,) = batch.spooled
    assert (spooled.lsn, spooled.xid, spooled.commit_ts, spooled.rows) == (500, 70, 9, 2)
    assert [f.path for f in spooled.files] == ["_spool/a/part-0.parquet"]
    assert batch.row_count == 3
    assert other.xid == 71 and buf.open_streams == 1


def test_a_subtransaction_abort_drops_buffered_rows_and_spool_files_it_covers() -> None:
    from tidemark.writers.buffer import Spooled

    buf = ShapeBuffer("s")
    stream_rows(buf, 70, [0, 2])
    ((part, _),) = buf.take_stream_rows()
    buf.attach_spooled(part, Spooled([spool_file("a", 2)], 0, 2, 2))
    stream_rows(buf, 70, [4, 6])
    ((_, _),) = buf.take_stream_rows()  # a chunk 4..6 on its way to a spool file
    stream_rows(buf, 70, [8, 10, 12])
    # a subtransaction whose first change was op 4 aborts: 4..12 go
    assert buf.stream_drop(70, 4, 14) == []
    assert buf.attach_spooled(part, Spooled([spool_file("b", 2)], 4, 6, 2)) == [spool_file("b", 2)]
    stream_rows(buf, 70, [14])
    # a later abort that starts inside the first spool file keeps the file (filtered
    # when rewritten) and drops the buffered row
    assert buf.stream_drop(70, 2, 16) == []
    buf.stream_commit(70, 600, 0, 0.0)
    batch = buf.take_batch()
    assert batch is not None and len(batch.rows) == 0
    assert batch.spooled[0].dropped == [(4, 14), (2, 16)]
    assert [f.path for f in batch.spooled[0].files] == ["_spool/a/part-0.parquet"]
    assert batch.last_offset == LogOffset(600, 14)


def test_spool_files_wholly_inside_an_aborted_range_are_returned_for_deletion() -> None:
    from tidemark.writers.buffer import Spooled

    buf = ShapeBuffer("s")
    stream_rows(buf, 70, [0])
    stream_rows(buf, 70, [2, 4])
    ((part, _),) = buf.take_stream_rows()
    buf.attach_spooled(part, Spooled([spool_file("a", 3)], 0, 4, 3))
    stream_rows(buf, 70, [6])
    ((part, _),) = buf.take_stream_rows()
    buf.attach_spooled(part, Spooled([spool_file("b", 1)], 6, 6, 1))
    assert buf.stream_drop(70, 6, 8) == [spool_file("b", 1)]
    assert buf.stream_discard(70) == [spool_file("a", 3)]
    assert buf.open_streams == 0 and buf.take_batch() is None


def test_a_chunk_spooled_after_its_transaction_committed_joins_that_commit() -> None:
    from tidemark.writers.buffer import Spooled

    buf = ShapeBuffer("s")
    stream_rows(buf, 70, [0, 2])
    ((part, _),) = buf.take_stream_rows()
    buf.stream_commit(70, 700, 0, 0.0)  # committed while the spooling job runs
    assert buf.attach_spooled(part, Spooled([spool_file("a", 2)], 0, 2, 2)) == []
    batch = buf.take_batch()
    assert batch is not None and batch.spooled[0].rows == 2 and batch.row_count == 2
    # a chunk of an aborted transaction is an orphan
    stream_rows(buf, 71, [0])
    ((part, _),) = buf.take_stream_rows()
    buf.stream_discard(71)
    assert buf.attach_spooled(part, Spooled([spool_file("c", 1)], 0, 0, 1)) == [spool_file("c", 1)]


def test_a_streamed_transaction_with_nothing_for_the_shape_commits_nothing() -> None:
    buf = ShapeBuffer("s")
    assert buf.stream_commit(99, 800, 0, 0.0) is None
    assert buf.take_batch() is None


def test_rows_split_at_the_front_keep_their_metadata_runs() -> None:
    from tidemark.writers.buffer import Rows

    rows = Rows()
    for op in range(5):
        rows.values.append((str(op).encode(), b"n", b"x"))
        rows.ops.append(op)
        rows.kinds.append("insert")
        rows.unchanged.append(None)
    rows.runs = [(100, 1, 7, 2), (200, 2, 8, 3)]
    rows.nbytes = 500
    peek, rest = rows.slices(3)
    assert peek.ops == [0, 1, 2] and peek.runs == [(100, 1, 7, 2), (200, 2, 8, 1)]
    assert rest.ops == [3, 4] and rest.runs == [(200, 2, 8, 2)]
    assert len(rows) == 5  # slicing leaves the rows
    front = peek
    front.nbytes = rows.drop_front(3)  # how the spool ends: slices written, then dropped
    assert rows.ops == [3, 4] and rows.runs == [(200, 2, 8, 2)]
    assert (front.nbytes, rows.nbytes) == (300, 200)
    # both halves build the same metadata the whole would have
    schema = table_schema(SPECS)
    lsns = build_table(schema, SPECS, front).column("_lsn").to_pylist()
    lsns += build_table(schema, SPECS, rows).column("_lsn").to_pylist()
    assert lsns == [100, 100, 200, 200, 200]


def test_dropping_rows_at_the_front_leaves_what_the_front_split_leaves() -> None:
    """``drop_front`` (the spool's slices, one pass over the runs) against the split
    the first of ``slices`` describes, done run by run: on runs of every length, a run
    per row (one-row transactions) and empty runs (a transaction whose rows were staged)."""
    import random

    from tidemark.writers.buffer import Rows

    def reference(rows: Rows, n: int) -> tuple[list[int], list[tuple[int, int, int, int]]]:
        if n > len(rows):  # everything goes, empty runs after the last row too
            return [], []
        front = next(rows.slices(n), Rows()) if n else Rows()
        runs = list(rows.runs)
        for _ in front.runs[:-1]:  # the runs the front took whole
            runs.pop(0)
        if front.runs:
            lsn, xid, ts, count = runs[0]
            left = count - front.runs[-1][3]
            if left:
                runs[0] = (lsn, xid, ts, left)
            else:
                runs.pop(0)
        return rows.ops[len(front) :], runs

    rng = random.Random(5)
    for _ in range(300):
        counts = [rng.choice([0, 1, 1, 1, 2, 5]) for _ in range(rng.randrange(1, 12))]
        total = sum(counts)
        rows = Rows()
        for op in range(total):
            rows.values.append((str(op).encode(),))
            rows.ops.append(op)
            rows.kinds.append("insert")
            rows.unchanged.append(None)
        rows.runs = [(100 + i, i, 7, c) for i, c in enumerate(counts)]
        rows.nbytes = 100 * total
        n = rng.randrange(0, total + 2)
        want = reference(rows, n)
        # and the slices, laid end to end, cover each run's rows exactly
        pieces = list(rows.slices(max(1, n)))
        assert [op for p in pieces for op in p.ops] == rows.ops
        for piece in pieces:
            assert sum(run[3] for run in piece.runs) == len(piece)
        expanded = [run[0] for p in pieces for run in p.runs for _ in range(run[3])]
        assert expanded == [run[0] for run in rows.runs for _ in range(run[3])]
        dropped = rows.drop_front(n)
        assert (rows.ops, rows.runs) == want, (counts, n)
        assert dropped == 100 * min(n, total) and rows.nbytes == 100 * total - dropped
        assert len(rows.values) == len(rows.kinds) == len(rows.unchanged) == len(rows.ops)


def test_a_new_table_numbers_snapshot_rows_past_two_to_the_31() -> None:
    from tidemark.writers.arrow_batch import snapshot_table

    text = pa.table({s.name: pa.array(["1", "2"]) for s in SPECS})
    first = 2**31 + 5
    table = snapshot_table(table_schema(SPECS), SPECS, text, 100, first, "s")
    assert table.schema.field("_op").type == pa.int64()
    assert table.column("_op").to_pylist() == [first, first + 1]


def test_an_int32_op_table_refuses_a_snapshot_past_two_to_the_31_with_what_to_do() -> None:
    from tidemark.writers.arrow_batch import snapshot_table

    schema = table_schema(SPECS, pa.int32())
    assert schema.field("_op").type == pa.int32()
    text = pa.table({s.name: pa.array(["1", "2"]) for s in SPECS})
    ok = snapshot_table(schema, SPECS, text, 100, 2**31 - 2, "s")
    assert ok.column("_op").to_pylist() == [2**31 - 2, 2**31 - 1]
    with pytest.raises(SinkError, match="resync the shape"):
        snapshot_table(schema, SPECS, text, 100, 2**31 - 1, "s")


# -- the open transaction's rows beside the ready ones --------------------------------


def test_a_batch_taken_while_a_transaction_is_open_leaves_its_rows_for_its_commit() -> None:
    # given a committed transaction and an open one with two rows
    buf = ShapeBuffer("s")
    txn(buf, 100, [("insert", (b"1", b"a", b"x"))])
    buf.begin_txn(200, 2, 0)
    buf.append(0, "insert", (b"2", b"b", b"y"), None, 10)
    buf.append(1, "insert", (b"3", b"c", b"z"), None, 10)
    assert (buf.ready_rows, buf.open_rows) == (1, 2)
    assert buf.ready_bytes == buf.open_bytes // 2 and buf.nbytes == 3 * buf.ready_bytes
    # when a flush takes the ready region
    batch = buf.take_batch()
    # then it holds the committed row only, and the open rows wait
    assert batch is not None and batch.rows.ops == [0] and batch.end_lsn == 100
    assert batch.rows.nbytes == 10 + 96 and buf.ready_rows == 0
    assert buf.open_rows == 2 and buf.ready_bytes == 0 and buf.nbytes == buf.open_bytes
    # and after the commit they are the next batch, with their own run
    buf.append(2, "insert", (b"4", b"d", b"w"), None, 10)
    assert buf.end_txn(1.0) == 3 and buf.open_bytes == 0
    after = buf.take_batch()
    assert after is not None and after.rows.ops == [0, 1, 2]
    assert after.rows.runs == [(200, 2, 0, 3)] and after.rows.nbytes == 3 * (10 + 96)
    assert buf.nbytes == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["begin", "row", "end", "abort", "take", "stage"]), max_size=60))
def test_batches_hold_exactly_the_committed_rows_in_commit_order(steps: list[str]) -> None:
    """Any sequence of the stream's and the flush's calls: the batches (rows and staged
    rows) hold every row of every ended transaction once, in order, and nothing of an
    aborted one; the byte counts add up."""
    buf = ShapeBuffer("s")
    committed: list[int] = []  # keys of rows of ended transactions
    open_keys: list[int] = []
    got: list[int] = []
    staged_keys: dict[str, list[int]] = {}
    lsn = key = 0
    for step in [*steps, "end", "take"]:
        if step == "begin" and not buf.in_txn:
            lsn += 100
            buf.begin_txn(lsn, lsn, 0)
            open_keys = []
        elif step == "row" and buf.in_txn:
            buf.append(2 * len(open_keys), "insert", (str(key).encode(),), None, 4)
            open_keys.append(key)
            key += 1
        elif step == "end" and buf.in_txn:
            buf.end_txn(0.0)
            committed += open_keys
        elif step == "abort" and buf.in_txn:
            buf.abort_txn()
        elif step == "stage":
            taken = buf.take_open_rows()
            if taken is not None:
                delivery, rows = taken
                name = f"f{len(staged_keys)}"
                staged_keys[name] = [int(v[0]) for v in rows.values]  # type: ignore[arg-type]
                buf.attach_staged(delivery, [DataFile(name, 1, len(rows), 0, "{}")])
        elif step == "take":
            batch = buf.take_batch()
            if batch is not None:
                staged = [k for f in batch.staged for k in staged_keys[f.path]]
                rows = [int(v[0]) for v in batch.rows.values]  # type: ignore[arg-type]
                assert sum(r[3] for r in batch.rows.runs) == len(rows)
                assert batch.rows.nbytes == len(rows) * (4 + 96)
                got += sorted(staged + rows)
        expected_open = buf.open_rows * (4 + 96)
        assert buf.open_bytes == expected_open
        assert buf.nbytes == buf.ready_bytes + buf.open_bytes
    assert got == committed
