"""The last minutes of the service, for the status page's sparklines: in each interval
(``INTERVAL_S``), the longest acknowledgement lag of a transaction acknowledged in it
(from its arrival to the acknowledgement that covered it; None when none was) and the
rows committed to the shape tables per second. ``SPAN_S`` of them are kept.

Pure: the times and counts are given (housekeeping ``tick``s it with the wall clock
and the writers' committed-row count; each acknowledgement reports its longest lag).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

INTERVAL_S: Final = 10.0
SPAN_S: Final = 15 * 60.0


@dataclass(frozen=True, slots=True)
class Point:
    at: float  # wall time at the interval's end
    ack_lag_s: float | None  # the longest acknowledgement lag in it (None: none acked)
    rows_per_s: float  # rows committed to the shape tables, per second


class History:
    def __init__(self, interval_s: float = INTERVAL_S, span_s: float = SPAN_S) -> None:
        self.interval_s = interval_s
        self._points: deque[Point] = deque(maxlen=max(1, round(span_s / interval_s)))
        self._started: float | None = None
        self._rows_at_start = 0
        self._lag: float | None = None

    def ack_lag(self, seconds: float) -> None:
        """A transaction was acknowledged ``seconds`` after it arrived."""
        if self._lag is None or seconds > self._lag:
            self._lag = seconds

    def tick(self, now: float, rows_committed: int) -> None:
        """The wall clock, and how many rows the writers have committed in all: closes
        the interval once it is ``interval_s`` long (a long pause closes one longer
        interval, its rate over all of it)."""
        if self._started is None or rows_committed < self._rows_at_start:
            self._started, self._rows_at_start = now, rows_committed
            return
        elapsed = now - self._started
        if elapsed < self.interval_s:
            return
        rate = (rows_committed - self._rows_at_start) / elapsed
        self._points.append(Point(now, self._lag, rate))
        self._started, self._rows_at_start, self._lag = now, rows_committed, None

    def points(self) -> tuple[Point, ...]:
        """The closed intervals, oldest first."""
        return tuple(self._points)

    def facts(self) -> HistoryFacts:
        return HistoryFacts(self.interval_s, self.points())


@dataclass(frozen=True, slots=True)
class HistoryFacts:
    interval_s: float
    points: tuple[Point, ...]
