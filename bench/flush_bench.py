"""FlushTracker cost per flush notice with 10, 1k and 100k shapes pending.

Two workloads per size:

* ``notice``: every shape owes a flush and sits at its own offset (the sorted map
  holds one key per shape, the worst case for it); each notice moves one shape,
  picked at random, further into the transaction it owes.
* ``minimum``: each shape owes a different transaction and every notice moves the
  shape holding the minimum, so every notice advances the confirmed LSN (the
  notify path; fresh trackers are set up, untimed, until enough notices ran);
* ``txn+catch-up``: the same pending shapes stay behind while a stream of
  transactions touches one more shape each, which then catches up: one
  ``handle_txn_fragment`` plus one catch-up notice per iteration.

Run: ``.venv/bin/python bench/flush_bench.py`` (about 10 s). Target: under 10 us per
notice at 100k pending shapes.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

from tidemark.flush import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset

_T1, _T2 = 0x1_0000, 0x1_0008  # the two transactions every pending shape received


@dataclass(frozen=True, slots=True)
class Result:
    workload: str
    pending: int
    notices: int
    advances: int  # notices that moved the confirmed LSN
    seconds: float

    @property
    def us_per_notice(self) -> float:
        return self.seconds / self.notices * 1e6

    @property
    def notices_per_second(self) -> float:
        return self.notices / self.seconds


def _pending_tracker(pending: int, advances: list[int]) -> tuple[FlushTracker, list[str]]:
    """A tracker where ``pending`` shapes each owe a flush at their own offset."""
    shapes = [f"shape-{i}" for i in range(pending)]
    tracker = FlushTracker(lambda lsn, _caught_up: advances.append(lsn), clock=time.monotonic)
    tracker.handle_txn_fragment(CommitFragment(LogOffset(_T1, pending)), shapes)
    tracker.handle_txn_fragment(CommitFragment(LogOffset(_T2, 1 << 40)), shapes)
    order = shapes[:]
    random.Random(1).shuffle(order)
    for op, shape in enumerate(order):
        tracker.handle_flush_notification(shape, LogOffset(_T1, op))
    return tracker, shapes


def bench_notices(pending: int, notices: int) -> Result:
    advances: list[int] = []
    tracker, shapes = _pending_tracker(pending, advances)
    rng = random.Random(2)
    picks = [shapes[rng.randrange(pending)] for _ in range(notices)]
    offsets = [LogOffset(_T2, op) for op in range(notices)]
    advances.clear()
    notice = tracker.handle_flush_notification
    start = time.perf_counter()
    for shape, offset in zip(picks, offsets, strict=True):
        notice(shape, offset)
    seconds = time.perf_counter() - start
    return Result("notice", pending, notices, len(advances), seconds)


def bench_minimum(pending: int, notices: int) -> Result:
    advances: list[int] = []
    shapes = [f"shape-{i}" for i in range(pending)]
    final = LogOffset(_T1 + 8 * (pending + 1), 1 << 40)
    done, advanced, seconds = 0, 0, 0.0
    while done < notices:
        tracker = FlushTracker(lambda lsn, _caught_up: advances.append(lsn), clock=time.monotonic)
        for i, shape in enumerate(shapes):  # shape i owes transaction i first
            tracker.handle_txn_fragment(CommitFragment(LogOffset(_T1 + 8 * i, 0)), (shape,))
        tracker.handle_txn_fragment(CommitFragment(final), shapes)
        advances.clear()
        batch = [(shape, LogOffset(final.tx_offset, op)) for op, shape in enumerate(shapes)]
        notice = tracker.handle_flush_notification
        start = time.perf_counter()
        for shape, offset in batch:
            notice(shape, offset)
        seconds += time.perf_counter() - start
        done += len(batch)
        advanced += len(advances)
    return Result("minimum", pending, done, advanced, seconds)


def bench_txn_catch_up(pending: int, iterations: int) -> Result:
    advances: list[int] = []
    tracker, _ = _pending_tracker(pending, advances)
    extra = [f"extra-{i}" for i in range(64)]
    fragments = [CommitFragment(LogOffset(_T2 + 8 * (i + 1), 3)) for i in range(iterations)]
    advances.clear()
    handle_txn = tracker.handle_txn_fragment
    notice = tracker.handle_flush_notification
    start = time.perf_counter()
    for i, fragment in enumerate(fragments):
        shape = extra[i & 63]
        handle_txn(fragment, (shape,))
        notice(shape, fragment.last_log_offset)
    seconds = time.perf_counter() - start
    return Result("txn+catch-up", pending, iterations, len(advances), seconds)


def main() -> int:
    print(
        f"{'workload':<14}{'pending':>9}{'notices':>10}{'advances':>10}"
        f"{'notices/s':>12}{'us/notice':>11}"
    )
    results = []
    for pending in (10, 1_000, 100_000):
        for result in (
            bench_notices(pending, 200_000),
            bench_minimum(pending, 100_000),
            bench_txn_catch_up(pending, 100_000),
        ):
            results.append(result)
            print(
                f"{result.workload:<14}{result.pending:>9}{result.notices:>10}"
                f"{result.advances:>10}{result.notices_per_second:>12,.0f}"
                f"{result.us_per_notice:>11.2f}"
            )
    worst = max(r.us_per_notice for r in results if r.pending == 100_000)
    print(f"worst at 100k pending: {worst:.2f} us per notice (target < 10)")
    return 0 if worst < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
