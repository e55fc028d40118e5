"""Which shapes are stalled: owing a flush and not making progress for a grace period.

The FlushTracker knows since when a shape has owed a flush (``pending_since``), but a
shape that keeps receiving transactions while it commits stays owing although it
flushes on time: under a steady workload it never catches up exactly, so "pending for
longer than the grace period" would call every busy, healthy shape stalled (and fail
readiness, and page). A shape is *stalled* when it has owed a flush for longer than
``grace`` **and** its ``last_flushed`` has not moved for ``grace``: a held or hung
writer, not a busy one.

``StallWatch.observe`` is fed the tracker's pending shapes at each look (housekeeping,
readiness) and remembers, per shape, the last ``last_flushed`` it saw and when it saw
it move. Progress between two looks is dated at the later look, so a stall is reported
at most one look interval late, never early. Pure: no IO, the time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidemark.flush.tracker import StalledShape
from tidemark.lsn import LogOffset


@dataclass(frozen=True, slots=True)
class Stall:
    name: str
    since: float  # when its last_flushed last moved (or it started owing a flush)
    last_flushed: LogOffset

    def seconds(self, now: float) -> float:
        return now - self.since


@dataclass(slots=True)
class _Seen:
    pending_since: float
    last_flushed: LogOffset
    moved_at: float


class StallWatch:
    """Per shape: last flushed offset seen and when it last moved (module docstring)."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def observe(self, pending: Iterable[StalledShape], now: float, grace: float) -> list[Stall]:
        """The stalled shapes among ``pending`` (every shape owing a flush now, in the
        tracker's order: the one holding the durable LSN back first)."""
        seen: dict[str, _Seen] = {}
        stalled = []
        for shape in pending:
            before = self._seen.get(shape.name)
            if before is None or before.pending_since != shape.pending_since:
                # newly owing (or owing again after catching up)
                entry = _Seen(shape.pending_since, shape.last_flushed, shape.pending_since)
            elif before.last_flushed != shape.last_flushed:
                entry = _Seen(shape.pending_since, shape.last_flushed, now)
            else:
                entry = before
            seen[shape.name] = entry
            if now - entry.moved_at > grace:
                stalled.append(Stall(shape.name, entry.moved_at, entry.last_flushed))
        self._seen = seen  # shapes that caught up (or were removed) are forgotten
        return stalled
