"""FlushTracker scenarios: what tidemark may confirm to Postgres, and when."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import InvariantViolation
from tidemark.flush import CommitFragment, FlushTracker, StalledShape
from tidemark.lsn import LAST_OP, LogOffset


class Recorder:
    """Collects notifications, as the replication client would receive them."""

    def __init__(self) -> None:
        self.lsns: list[int] = []
        self.caught_up: list[bool] = []

    def __call__(self, lsn: int, caught_up: bool) -> None:
        self.lsns.append(lsn)
        self.caught_up.append(caught_up)


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_tracker(durable_lsn: int | None = None) -> tuple[FlushTracker, Recorder, FakeClock]:
    recorder, clock = Recorder(), FakeClock()
    return FlushTracker(recorder, clock=clock, durable_lsn=durable_lsn), recorder, clock


def commit(tx: int, last_op: int = 10) -> CommitFragment:
    return CommitFragment(LogOffset(tx, last_op))


def off(tx: int, op: int) -> LogOffset:
    return LogOffset(tx, op)


# -- transactions ---------------------------------------------------------------------


def test_transaction_touching_no_shape_is_durable_at_once() -> None:
    tracker, notified, _ = new_tracker()

    tracker.handle_txn_fragment(commit(0x100), [])

    assert notified.lsns == [0x100]
    assert tracker.durable_lsn == 0x100
    assert tracker.is_caught_up


def test_a_notification_says_whether_any_shape_still_owes_a_flush() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["orders"])
    tracker.handle_txn_fragment(commit(0x200), ["orders", "users"])
    # orders has flushed everything: D moves below 0x200, which users still owes
    tracker.handle_flush_notification("orders", off(0x200, 10))
    assert len(notified.lsns) == 1 and 0x100 <= notified.lsns[0] < 0x200
    assert notified.caught_up == [False] and not tracker.is_caught_up
    tracker.handle_flush_notification("users", off(0x200, 10))
    assert (notified.lsns[-1], notified.caught_up) == (0x200, [False, True])
    assert tracker.is_caught_up


def test_unconfirmed_shape_blocks_the_boundary() -> None:
    tracker, notified, _ = new_tracker()

    tracker.handle_txn_fragment(commit(0x100), ["orders"])

    assert notified.lsns == []
    assert tracker.durable_lsn is None
    assert len(tracker.stalled_shapes(math.inf, 0.0)) == 1  # (every pending one)
    assert tracker.last_flushed_of("orders") is not None


def test_commit_fragment_must_follow_the_last_seen_one() -> None:
    tracker, _, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x108), ["orders"])

    with pytest.raises(InvariantViolation, match="not after the last seen"):
        tracker.handle_txn_fragment(commit(0x100), ["orders"])
    with pytest.raises(InvariantViolation, match="not after the last seen"):
        tracker.handle_txn_fragment(commit(0x108), ["orders"])


@dataclass(frozen=True)
class OpenFragment:
    """A fragment of a transaction whose commit has not arrived yet."""

    last_log_offset: LogOffset
    has_commit: bool = False


def test_fragment_without_commit_is_refused() -> None:
    tracker, notified, _ = new_tracker()

    with pytest.raises(InvariantViolation, match="without a commit"):
        tracker.handle_txn_fragment(OpenFragment(off(0x100, 3)), ["orders"])

    assert tracker.is_caught_up
    assert tracker.last_seen_offset == LogOffset.before_all()
    assert notified.lsns == []


def test_collector_fragments_with_has_commit_are_accepted() -> None:
    tracker, notified, _ = new_tracker()

    tracker.handle_txn_fragment(OpenFragment(off(0x100, 3), has_commit=True), [])

    assert notified.lsns == [0x100]


# -- flush notices --------------------------------------------------------------------


def test_last_shape_catching_up_confirms_its_transaction() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100, 10), ["orders"])

    tracker.handle_flush_notification("orders", off(0x100, 10))

    assert notified.lsns == [0x100]
    assert tracker.is_caught_up
    assert tracker.last_global_flushed_offset == off(0x100, 10)


def test_last_shape_catching_up_confirms_the_last_seen_transaction() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["orders"])
    tracker.handle_txn_fragment(commit(0x118), [])

    tracker.handle_flush_notification("orders", off(0x100, 10))

    assert notified.lsns == [0x118]
    assert tracker.last_seen_offset == off(0x118, 10)


def test_partial_flush_confirms_one_behind_the_incomplete_transaction() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x140, 10), ["orders"])

    tracker.handle_flush_notification("orders", off(0x140, 5))

    assert notified.lsns == [0x13F]
    assert not tracker.is_caught_up


def test_minimum_across_many_shapes() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x140), ["a", "b"])
    tracker.handle_txn_fragment(commit(0x148), ["a"])
    tracker.handle_txn_fragment(commit(0x150), ["b"])

    tracker.handle_flush_notification("b", off(0x150, 4))
    tracker.handle_flush_notification("a", off(0x148, 3))
    # a is the minimum, inside 0x148: everything before 0x148 is durable.
    assert notified.lsns[-1] == 0x147

    tracker.handle_flush_notification("a", off(0x148, 10))
    # a caught up; b is inside 0x150.
    assert notified.lsns[-1] == 0x14F

    tracker.handle_flush_notification("b", off(0x150, 10))
    assert notified.lsns[-1] == 0x150
    assert notified.lsns == sorted(set(notified.lsns))


def test_several_shapes_at_the_same_position() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x140), ["a", "b"])
    tracker.handle_txn_fragment(commit(0x148), ["a", "b"])

    tracker.handle_flush_notification("a", off(0x140, 10))
    tracker.handle_flush_notification("b", off(0x140, 10))
    # Both finished 0x140 but owe 0x148: the seed lags one transaction behind.
    assert notified.lsns == [0x13E, 0x13F]

    tracker.handle_flush_notification("a", off(0x148, 3))
    # b still sits at the end of 0x140.
    assert notified.lsns == [0x13E, 0x13F]

    tracker.handle_flush_notification("b", off(0x148, 10))
    tracker.handle_flush_notification("a", off(0x148, 10))
    assert notified.lsns == [0x13E, 0x13F, 0x147, 0x148]


def test_transactions_touching_no_shape_in_between() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x138), [])
    tracker.handle_txn_fragment(commit(0x150), ["a"])
    tracker.handle_txn_fragment(commit(0x158), [])
    tracker.handle_txn_fragment(commit(0x160), ["b"])

    tracker.handle_flush_notification("a", off(0x150, 10))
    # b entered at "everything before 0x160", so 0x158 (no shape) is durable too.
    assert notified.lsns == [0x138, 0x15E]

    tracker.handle_flush_notification("b", off(0x160, 10))
    assert notified.lsns == [0x138, 0x15E, 0x160]
    assert tracker.is_caught_up


def test_continuous_updates_keep_advancing() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x150), ["a"])
    tracker.handle_txn_fragment(commit(0x158), ["b"])
    tracker.handle_flush_notification("a", off(0x150, 10))
    tracker.handle_txn_fragment(commit(0x160), ["a"])
    tracker.handle_flush_notification("b", off(0x158, 10))
    tracker.handle_txn_fragment(commit(0x168), ["b"])
    tracker.handle_flush_notification("a", off(0x160, 10))

    # Never caught up, yet the boundary follows each shape's progress.
    assert notified.lsns == [0x156, 0x15E, 0x166]
    assert len(tracker.stalled_shapes(math.inf, 0.0)) == 1  # (every pending one)


def test_notice_for_shape_not_pending_is_ignored() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["a"])

    tracker.handle_flush_notification("gone", off(0x100, 10))

    assert notified.lsns == []
    assert len(tracker.stalled_shapes(math.inf, 0.0)) == 1  # (every pending one)


def test_notice_beyond_what_the_shape_was_sent_is_refused() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["a"])

    with pytest.raises(InvariantViolation, match="beyond what it was sent"):
        tracker.handle_flush_notification("a", off(0x108, 2))

    assert notified.lsns == []
    assert tracker.last_flushed_of("a") is not None


def test_equal_boundary_is_not_notified_twice() -> None:
    # Two shapes move inside the same transaction: the global offset rises, the
    # confirmable LSN (tx_offset - 1) does not.
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x140), ["a", "b"])
    tracker.handle_flush_notification("a", off(0x140, 3))
    tracker.handle_flush_notification("b", off(0x140, 5))
    before = tracker.last_global_flushed_offset

    tracker.handle_flush_notification("a", off(0x140, 7))

    assert tracker.last_global_flushed_offset > before
    assert notified.lsns == [0x13E, 0x13F]


def test_stale_notice_does_not_move_the_boundary_back() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x140), ["a", "b"])
    tracker.handle_txn_fragment(commit(0x148), ["a", "b"])
    tracker.handle_flush_notification("a", off(0x140, 10))
    tracker.handle_flush_notification("b", off(0x140, 10))
    boundary = tracker.last_global_flushed_offset

    tracker.handle_flush_notification("a", off(0x140, 2))  # an old notice, late

    assert tracker.last_global_flushed_offset == boundary
    assert notified.lsns == [0x13E, 0x13F]


# -- shape removal --------------------------------------------------------------------


def test_removing_the_only_pending_shape_unblocks() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["a"])

    tracker.handle_shape_removed("a")

    assert notified.lsns == [0x100]
    assert tracker.is_caught_up


def test_removing_several_dead_shapes_unblocks_step_by_step() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["dead1"])
    tracker.handle_txn_fragment(commit(0x108), ["dead2", "live"])
    tracker.handle_txn_fragment(commit(0x110), ["live"])
    tracker.handle_flush_notification("live", off(0x108, 10))

    assert notified.lsns == [0xFE]  # dead1 owes 0x100

    tracker.handle_shape_removed("dead1")
    assert notified.lsns == [0xFE, 0x106]  # dead2 owes 0x108

    tracker.handle_shape_removed("dead2")
    assert notified.lsns == [0xFE, 0x106, 0x107]  # live finished 0x108, owes 0x110

    tracker.handle_shape_removed("unknown")
    tracker.handle_flush_notification("live", off(0x110, 10))
    assert notified.lsns == [0xFE, 0x106, 0x107, 0x110]


def test_flush_notice_after_removal_is_ignored() -> None:
    tracker, notified, _ = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["a", "b"])
    tracker.handle_shape_removed("a")

    tracker.handle_flush_notification("a", off(0x100, 10))

    assert notified.lsns == [0xFE]
    assert tracker.last_flushed_of("a") is None
    assert len(tracker.stalled_shapes(math.inf, 0.0)) == 1  # (every pending one)


# -- restart and replays --------------------------------------------------------------


def test_replayed_already_processed_transactions_are_still_acknowledged() -> None:
    # Before the crash Postgres was told 0x140; it resends 0x140 and 0x148. The sinks
    # hold both already, so each writer reports the transaction flushed at once.
    tracker, notified, _ = new_tracker(durable_lsn=0x140)

    tracker.handle_txn_fragment(commit(0x140), ["a"])
    tracker.handle_flush_notification("a", off(0x140, 10))
    tracker.handle_txn_fragment(commit(0x148), ["a", "b"])
    tracker.handle_flush_notification("b", off(0x148, 10))
    tracker.handle_flush_notification("a", off(0x148, 10))

    # 0x140 was confirmed before the crash and is not repeated; past it, the boundary
    # moves as usual (b done while a still owes 0x148, then a done).
    assert notified.lsns == [0x146, 0x148]
    assert tracker.durable_lsn == 0x148
    assert tracker.is_caught_up


def test_fresh_tracker_acknowledges_replays_without_a_start_position() -> None:
    tracker, notified, _ = new_tracker()

    tracker.handle_txn_fragment(commit(0x140), ["a"])
    tracker.handle_flush_notification("a", off(0x140, 10))

    assert notified.lsns == [0x140]


def test_start_position_keeps_notifications_above_it() -> None:
    tracker, notified, _ = new_tracker(durable_lsn=0x200)

    tracker.handle_txn_fragment(commit(0x1F8), ["a"])
    tracker.handle_flush_notification("a", off(0x1F8, 4))
    tracker.handle_flush_notification("a", off(0x1F8, 10))

    assert notified.lsns == []
    assert tracker.durable_lsn == 0x200


# -- stall attribution ----------------------------------------------------------------


def test_stalled_shapes_lists_long_pending_shapes_lowest_first() -> None:
    tracker, _, clock = new_tracker()
    clock.now = 100.0
    tracker.handle_txn_fragment(commit(0x100), ["slow", "stuck"])
    clock.now = 150.0
    tracker.handle_txn_fragment(commit(0x108), ["fresh", "slow"])
    tracker.handle_flush_notification("slow", off(0x100, 10))

    stalled = tracker.stalled_shapes(now=170.0, grace=30.0)

    assert stalled == [
        StalledShape("stuck", LogOffset(0xFF, LAST_OP), off(0x100, 10), 100.0),
        StalledShape("slow", off(0x100, 10), off(0x108, 10), 100.0),
    ]
    assert [s.name for s in tracker.stalled_shapes(now=190.0, grace=30.0)] == [
        "stuck",
        "slow",
        "fresh",
    ]


def test_caught_up_shape_restarts_its_pending_clock() -> None:
    tracker, _, clock = new_tracker()
    tracker.handle_txn_fragment(commit(0x100), ["a"])
    tracker.handle_flush_notification("a", off(0x100, 10))
    clock.now = 500.0

    tracker.handle_txn_fragment(commit(0x108), ["a"])

    assert tracker.stalled_shapes(now=520.0, grace=30.0) == []
    assert tracker.stalled_shapes(now=531.0, grace=30.0)[0].pending_since == 500.0


# -- the promise, against a brute-force model -----------------------------------------

# A history: transactions (each: which shapes it touches, how many changes) and, after
# each, flush notices given as (shape index, fraction of what it was sent). Notices
# follow the tracker's contract: a transaction boundary or an offset inside the
# shape's current transaction, never beyond what it was sent.

_SHAPES = ("a", "b", "c", "d")

_txn = st.tuples(
    st.frozensets(st.sampled_from(_SHAPES), max_size=4),
    st.integers(min_value=1, max_value=5),  # changes in the transaction
    st.integers(min_value=8, max_value=40),  # gap to the previous commit LSN
)
_notices = st.lists(
    st.tuples(
        st.sampled_from(_SHAPES),
        st.integers(min_value=0, max_value=4),  # how many more sent txns it finishes
        st.booleans(),  # then stop inside the next one
    ),
    max_size=3,
)
_history = st.lists(st.tuples(_txn, _notices, st.sets(st.sampled_from(_SHAPES))), max_size=25)


@given(_history)
def test_confirmed_lsn_never_loses_a_transaction_on_restart(
    history: list[tuple[tuple[frozenset[str], int, int], list[tuple[str, int, bool]], set[str]]],
) -> None:
    """Postgres resends commit LSN >= D and skips the rest: every skipped transaction,
    and D itself, must already be durable in every live shape it touched."""
    tracker, notified, _ = new_tracker()
    lsn = 0
    txns: list[tuple[int, int, frozenset[str]]] = []  # (commit LSN, last op, shapes)
    done: dict[str, int] = {s: 0 for s in _SHAPES}  # txns fully flushed, per shape
    flushed_at: dict[str, LogOffset | None] = {s: None for s in _SHAPES}
    removed: set[str] = set()

    def sent_to(shape: str) -> list[tuple[int, int, frozenset[str]]]:
        return [t for t in txns if shape in t[2]]

    def check(d: int) -> None:
        for commit_lsn, last_op, shapes in txns:
            if commit_lsn > d:
                continue
            for shape in shapes - removed:
                mark = flushed_at[shape]
                assert mark is not None and mark >= off(commit_lsn, last_op), (
                    f"confirmed {d:#x} but {shape} has not flushed txn {commit_lsn:#x}"
                )

    for (shapes, changes, gap), notices, removals in history:
        lsn += gap
        live = shapes - removed
        txns.append((lsn, changes - 1, frozenset(live)))
        tracker.handle_txn_fragment(commit(lsn, changes - 1), live)
        for shape, finish, stop_inside in notices:
            if shape in removed:
                continue
            mine = sent_to(shape)
            target = min(done[shape] + finish, len(mine))
            if stop_inside and target < len(mine) and mine[target][1] > 0:
                mark = off(mine[target][0], mine[target][1] - 1)
            elif target > 0:
                mark = off(mine[target - 1][0], mine[target - 1][1])
            else:
                continue
            previous = flushed_at[shape]
            if previous is not None and mark <= previous:
                continue
            done[shape], flushed_at[shape] = target, mark
            tracker.handle_flush_notification(shape, mark)
        for shape in removals - removed:
            removed.add(shape)
            tracker.handle_shape_removed(shape)
        if notified.lsns:
            check(notified.lsns[-1])

    assert notified.lsns == sorted(set(notified.lsns))
    assert all(d <= lsn for d in notified.lsns), "confirmed an LSN never received"

    # Every live shape finishes: the boundary reaches the last transaction seen.
    for shape in _SHAPES:
        if shape not in removed and sent_to(shape):
            last_lsn, last_op, _ = sent_to(shape)[-1]
            if flushed_at[shape] != off(last_lsn, last_op):
                tracker.handle_flush_notification(shape, off(last_lsn, last_op))
    if txns:
        assert tracker.is_caught_up
        assert tracker.durable_lsn == lsn


def test_last_flushed_of_reports_pending_shapes_only() -> None:
    notified: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: notified.append(lsn), clock=lambda: 0.0)
    tracker.handle_txn_fragment(CommitFragment(LogOffset(100, 4)), ["a"])
    assert tracker.last_flushed_of("a") == LogOffset(100, 4).prev_tx()
    assert tracker.last_flushed_of("b") is None
    tracker.handle_flush_notification("a", LogOffset(100, 4))
    assert tracker.last_flushed_of("a") is None and notified == [100]
