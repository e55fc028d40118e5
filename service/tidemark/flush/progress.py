"""The progress rules: how far the stream was processed, what Postgres may have
confirmed, and how far each shape is complete, as functions of plain values.

* ``processed(start, last_commit, idle_keepalive)``: every transaction whose commit LSN
  is at or below it has been routed to its shapes: where the stream started, the last
  commit the collector handled, or a keepalive reached with no transaction open.
* ``acknowledgeable(processed, held)``: the highest LSN the writers' own state allows
  Postgres to have confirmed: not past what was processed, and below the oldest
  transaction any routed writer still holds uncommitted (``held``: each writer's
  oldest). Independent of the FlushTracker, so the monitor can check it.
* ``frontier(owed_from, flush_lsn, processed)``: how far one shape's table is complete,
  from that shape's state alone. A shape that owes a flush (``owed_from``: the commit
  LSN of the oldest transaction it has not committed, the tracker's ``last_flushed``)
  is complete just below it; one that owes nothing is complete up to what was
  processed (and never below what was acknowledged), whatever another shape owes.

Commit records are at least 8 bytes apart, so ``lsn - 1`` is never a commit LSN and
"``<= lsn - 1``" equals "``< lsn``". Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable


def processed(start: int, last_commit: int | None, idle_keepalive: int | None) -> int:
    return max(start, last_commit or 0, idle_keepalive or 0)


def acknowledgeable(processed: int, held: Iterable[int]) -> int:
    oldest = min(held, default=None)
    return processed if oldest is None else min(processed, oldest - 1)


def frontier(owed_from: int | None, flush_lsn: int, processed: int) -> int:
    if owed_from is not None:
        return max(0, owed_from - 1)
    return max(flush_lsn, processed)
