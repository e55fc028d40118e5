"""StallWatch: a shape is stalled when it owes a flush and its flushed offset has not
moved for the grace period; a busy shape that keeps flushing never is (scenarios driven
through a real FlushTracker)."""

from __future__ import annotations

from tidemark.flush import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset
from tidemark.stalls import StallWatch

GRACE = 30.0


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def commit(tx: int) -> CommitFragment:
    return CommitFragment(LogOffset(tx, 2))


def look(watch: StallWatch, tracker: FlushTracker, now: float) -> list[str]:
    return [s.name for s in watch.observe(tracker.stalled_shapes(now, 0.0), now, GRACE)]


def test_a_busy_shape_that_keeps_flushing_is_never_stalled() -> None:
    # given a shape that receives a transaction every second and commits each one a
    # second later, so it never catches up exactly (it always owes the newest)
    clock, watch = Clock(), StallWatch()
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=clock)
    tracker.handle_txn_fragment(commit(0x100), ["busy"])
    for second in range(1, 600):
        clock.now = float(second)
        tracker.handle_txn_fragment(commit(0x100 + 8 * second), ["busy"])
        tracker.handle_flush_notification("busy", LogOffset(0x100 + 8 * (second - 1), 2))
        # then it owes a flush all along, for far longer than the grace period ...
        assert tracker.last_flushed_of("busy") is not None
        # ... but it is not stalled, since what it flushed keeps moving
        assert look(watch, tracker, clock.now + 0.5) == []
    assert [s.name for s in tracker.stalled_shapes(600.0, GRACE)] == ["busy"]


def test_a_shape_whose_flushes_stop_is_stalled_after_the_grace_period() -> None:
    clock, watch = Clock(), StallWatch()
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=clock)
    clock.now = 100.0
    tracker.handle_txn_fragment(commit(0x100), ["held", "fine"])
    tracker.handle_flush_notification("fine", LogOffset(0x100, 2))  # caught up
    clock.now = 110.0
    tracker.handle_txn_fragment(commit(0x108), ["held"])

    assert look(watch, tracker, 129.0) == []
    assert look(watch, tracker, 131.0) == ["held"]  # owes since 100, never flushed
    (stall,) = watch.observe(tracker.stalled_shapes(140.0, 0.0), 140.0, GRACE)
    assert stall.since == 100.0 and stall.seconds(140.0) == 40.0


def test_progress_restarts_the_clock_and_catching_up_clears_the_stall() -> None:
    clock, watch = Clock(), StallWatch()
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=clock)
    tracker.handle_txn_fragment(commit(0x100), ["s"])
    tracker.handle_txn_fragment(commit(0x108), ["s"])
    assert look(watch, tracker, 31.0) == ["s"]

    # when it flushes the first transaction (still owing the second)
    tracker.handle_flush_notification("s", LogOffset(0x100, 2))
    # then the look that sees the progress dates it: not stalled until 40 + grace
    assert look(watch, tracker, 40.0) == []
    assert look(watch, tracker, 69.0) == []
    assert look(watch, tracker, 71.0) == ["s"]

    # when it catches up, it is forgotten; owing again starts a fresh clock
    tracker.handle_flush_notification("s", LogOffset(0x108, 2))
    assert look(watch, tracker, 80.0) == []
    clock.now = 200.0
    tracker.handle_txn_fragment(commit(0x110), ["s"])
    assert look(watch, tracker, 229.0) == []
    assert look(watch, tracker, 231.0) == ["s"]


def test_stalls_keep_the_trackers_order_lowest_flushed_first() -> None:
    clock, watch = Clock(), StallWatch()
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=clock)
    tracker.handle_txn_fragment(commit(0x100), ["b", "a"])
    tracker.handle_txn_fragment(commit(0x108), ["b", "a"])
    tracker.handle_flush_notification("b", LogOffset(0x100, 2))
    assert look(watch, tracker, 100.0) == ["a", "b"]
