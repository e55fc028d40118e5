"""TxnAlignment scenarios: a writer's flushed offsets, aligned to transaction ends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import InvariantViolation
from tidemark.flush import CommitFragment, FlushTracker, TxnAlignment
from tidemark.lsn import LogOffset


def off(tx: int, op: int) -> LogOffset:
    return LogOffset(tx, op)


def write_txn(writer: TxnAlignment, tx: int, ops: list[int], last_op: int) -> LogOffset | None:
    """The writer receives transaction ``tx`` with its rows at ``ops`` and its commit."""
    writer.begin_txn()
    for op in ops:
        writer.record_written(off(tx, op))
    return writer.end_txn(off(tx, last_op))


# -- closed transactions --------------------------------------------------------------


def test_flush_at_the_writers_last_row_reports_the_transaction_end() -> None:
    writer = TxnAlignment()
    assert write_txn(writer, 0x100, [2, 5], last_op=9) is None

    assert writer.on_flushed(off(0x100, 5)) == off(0x100, 9)
    assert writer.is_idle


def test_flush_inside_a_transaction_reports_the_offset_as_is() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [2, 5], last_op=9)

    assert writer.on_flushed(off(0x100, 2)) == off(0x100, 2)
    assert not writer.is_idle
    assert writer.on_flushed(off(0x100, 5)) == off(0x100, 9)


def test_flush_over_several_transactions_reports_the_last_end() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=3)
    write_txn(writer, 0x108, [0, 4], last_op=4)
    write_txn(writer, 0x110, [7], last_op=8)

    assert writer.on_flushed(off(0x110, 7)) == off(0x110, 8)


def test_flush_past_one_end_into_the_next_transaction_reports_the_offset() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=3)
    write_txn(writer, 0x108, [0, 4], last_op=6)

    assert writer.on_flushed(off(0x108, 0)) == off(0x108, 0)
    assert writer.on_flushed(off(0x108, 4)) == off(0x108, 6)


def test_repeated_notice_reports_nothing() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1, 2], last_op=3)
    writer.on_flushed(off(0x100, 2))

    assert writer.on_flushed(off(0x100, 2)) is None
    assert writer.on_flushed(off(0x100, 1)) is None


# -- transactions that left no row here -----------------------------------------------


def test_transaction_without_rows_is_flushed_at_once_when_nothing_is_owed() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=3)
    writer.on_flushed(off(0x100, 1))

    # Rows routed here were already in the sink (a replay): nothing written.
    assert write_txn(writer, 0x108, [], last_op=5) == off(0x108, 5)
    assert writer.is_idle


def test_transaction_without_rows_relabels_the_pending_flush() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=3)

    assert write_txn(writer, 0x108, [], last_op=5) is None
    # Flushing the 0x100 rows also settles 0x108 for this writer.
    assert writer.on_flushed(off(0x100, 1)) == off(0x108, 5)


def test_first_transaction_without_rows_is_flushed_at_once() -> None:
    writer = TxnAlignment()

    assert write_txn(writer, 0x100, [], last_op=3) == off(0x100, 3)


# -- flushes while a transaction is open ----------------------------------------------


def test_flush_covering_an_open_transaction_is_held_until_its_commit() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=3)
    writer.begin_txn()
    writer.record_written(off(0x108, 0))
    writer.record_written(off(0x108, 2))

    # The closed transaction is reported now; the open one is not known to the tracker.
    assert writer.on_flushed(off(0x108, 2)) == off(0x100, 3)
    assert not writer.is_idle

    writer.record_written(off(0x108, 4))
    assert writer.end_txn(off(0x108, 6)) == off(0x108, 2)
    assert writer.on_flushed(off(0x108, 4)) == off(0x108, 6)
    assert writer.is_idle


def test_held_flush_of_all_open_rows_reports_the_transaction_end_on_commit() -> None:
    writer = TxnAlignment()
    writer.begin_txn()
    writer.record_written(off(0x100, 1))

    assert writer.on_flushed(off(0x100, 1)) is None
    assert writer.end_txn(off(0x100, 3)) == off(0x100, 3)


def test_flush_not_reaching_the_open_transaction_is_reported_now() -> None:
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1, 2], last_op=3)
    writer.begin_txn()
    writer.record_written(off(0x108, 0))

    assert writer.on_flushed(off(0x100, 2)) == off(0x100, 3)
    assert writer.end_txn(off(0x108, 1)) is None
    assert writer.in_txn is False


# -- contract checks ------------------------------------------------------------------


def test_misuse_is_refused_with_a_clear_error() -> None:
    writer = TxnAlignment()
    with pytest.raises(InvariantViolation, match="outside a transaction"):
        writer.record_written(off(0x100, 0))
    with pytest.raises(InvariantViolation, match="without an open transaction"):
        writer.end_txn(off(0x100, 0))
    with pytest.raises(InvariantViolation, match="beyond the last written"):
        writer.on_flushed(off(0x100, 0))

    writer.begin_txn()
    with pytest.raises(InvariantViolation, match="while a transaction is open"):
        writer.begin_txn()
    writer.record_written(off(0x100, 4))
    with pytest.raises(InvariantViolation, match="not after the previous one"):
        writer.record_written(off(0x100, 4))
    with pytest.raises(InvariantViolation, match="after its transaction's end"):
        writer.end_txn(off(0x100, 3))
    with pytest.raises(InvariantViolation, match="beyond the last written"):
        writer.on_flushed(off(0x100, 5))
    writer.end_txn(off(0x100, 4))

    writer.begin_txn()
    with pytest.raises(InvariantViolation, match="transactions must end in commit order"):
        writer.end_txn(off(0x100, 4))


# -- with the tracker -----------------------------------------------------------------


def test_shape_seeing_part_of_a_transaction_catches_up_through_alignment() -> None:
    notified: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: notified.append(lsn), clock=lambda: 0.0)
    writer = TxnAlignment()
    writer.begin_txn()
    writer.record_written(off(0x100, 3))  # the shape got change 3 of 0..7
    tracker.handle_txn_fragment(CommitFragment(off(0x100, 7)), ["orders"])
    assert writer.end_txn(off(0x100, 7)) is None

    report = writer.on_flushed(off(0x100, 3))
    assert report is not None
    tracker.handle_flush_notification("orders", report)

    assert tracker.is_caught_up
    assert notified == [0x100]


def test_transaction_not_routed_to_a_writer_does_not_hold_the_tracker() -> None:
    notified: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: notified.append(lsn), clock=lambda: 0.0)
    writer = TxnAlignment()
    write_txn(writer, 0x100, [1], last_op=1)
    tracker.handle_txn_fragment(CommitFragment(off(0x100, 1)), ["orders"])

    # 0x108 touches another table: the collector names no shape, the writer sees nothing.
    tracker.handle_txn_fragment(CommitFragment(off(0x108, 0)), [])
    report = writer.on_flushed(off(0x100, 1))
    assert report == off(0x100, 1)
    tracker.handle_flush_notification("orders", report)

    assert notified == [0x108]


# -- invariants -----------------------------------------------------------------------

# A writer's life: transactions (rows it gets out of how many changes, and where in
# the transaction a flush lands while it is open) and flushes of a prefix of what it
# wrote, between transactions.
_life = st.lists(
    st.tuples(
        st.lists(st.booleans(), min_size=1, max_size=6),  # change i routed here?
        st.one_of(st.none(), st.integers(min_value=0, max_value=5)),  # flush while open
        st.integers(min_value=0, max_value=8),  # flush this many written rows after
    ),
    max_size=15,
)


@given(_life)
def test_reports_increase_stay_within_ended_transactions_and_reach_the_last(
    life: list[tuple[list[bool], int | None, int]],
) -> None:
    writer = TxnAlignment()
    written: list[LogOffset] = []
    flushed = 0  # rows of `written` flushed
    reports: list[LogOffset] = []
    ended: LogOffset | None = None

    def report(value: LogOffset | None) -> None:
        if value is not None:
            assert ended is not None and value <= ended, "reported a transaction not ended"
            assert not reports or value > reports[-1], "reports went backwards"
            reports.append(value)

    def flush(upto: int) -> None:
        nonlocal flushed
        if upto > flushed:
            flushed = upto
            report(writer.on_flushed(written[upto - 1]))

    for i, (routed, open_flush, after) in enumerate(life):
        tx = 0x100 + 8 * i
        writer.begin_txn()
        for op, here in enumerate(routed):
            if here:
                written.append(off(tx, op))
                writer.record_written(written[-1])
            if open_flush == op and written:
                flush(len(written))
        ended = off(tx, len(routed) - 1)
        report(writer.end_txn(ended))
        flush(min(len(written), flushed + after))

    flush(len(written))
    if ended is not None:
        assert reports and reports[-1] == ended
        assert writer.is_idle


def test_aborted_open_transaction_is_forgotten_and_can_be_received_again() -> None:
    # given a writer with one closed transaction and one open when the stream restarts
    align = TxnAlignment()
    align.begin_txn()
    align.record_written(LogOffset(100, 3))
    assert align.end_txn(LogOffset(100, 5)) is None
    align.begin_txn()
    align.record_written(LogOffset(200, 1))
    # when the open transaction is aborted and Postgres sends it again
    align.abort_txn()
    assert not align.in_txn
    align.begin_txn()
    align.record_written(LogOffset(200, 1))  # same offset accepted again
    assert align.end_txn(LogOffset(200, 4)) is None
    # then flushes align to both transactions' boundaries as usual
    assert align.on_flushed(LogOffset(100, 3)) == LogOffset(100, 5)
    assert align.on_flushed(LogOffset(200, 1)) == LogOffset(200, 4)
    assert align.is_idle
