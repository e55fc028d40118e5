"""What tidemark tells the walsender, and when (pure: time is passed in).

A standby status update carries three LSNs:

* **write**: the last WAL position received (XLogData start or keepalive end);
* **flush**: the durable position. Postgres resends every transaction whose commit
  LSN is ``>=`` the confirmed flush LSN and forgets the rest, without validating
  what we send. ``flush`` is therefore the FlushTracker's notified value ``D``
  (every transaction with commit LSN ``<= D`` is durably committed in every shape
  it touched), raised to an *idle point* when the pipeline proves nothing is
  pending (below);
* **apply**: what readers can see; a sink commit is also its publication, so it
  equals ``flush``.

Rules, each enforced here and unit-tested:

1. never acknowledge beyond what was received (``flush <= write``);
2. never go backwards (each of the three is monotonic);
3. idle acknowledgement: a keepalive's ``wal_end`` W says the server has sent
   everything before W. When the consumer has processed the stream up to that
   keepalive (``keepalive_reached``), has no transaction open and the tracker holds
   nothing pending, everything before W is durable, so W may be acknowledged.
   "Nothing pending" is not a flag that can go stale: the tracker's ``caught_up`` is
   given with each input that can change it, the keepalive reached and every
   tracker notification (``note_durable``), and "no transaction open" is asked
   (``txn_open``) at that moment; the last keepalive reached becomes an idle point
   only then. A new stream forgets it (``stream_restarted``): the keepalives of the
   connection before say nothing of the one after.

This class is the one owner of the acknowledgement. The service makes it and the
FlushTracker notifies it (``note_durable`` is a tracker listener); the consumer tells
it the keepalives it reached; the replication client starts it at its first
connection (``start``: the slot's position and the server's timeouts), feeds it what
the socket brings and asks it what to send and when (``on_change`` wakes the
client's sender).

When to send: at once when a keepalive asks for a reply; when flush advanced
(debounced by ``min_interval``); and at least every ``keepalive_interval``, which
is ``min(wal_sender_timeout / 3, 10 s)`` so the walsender never times us out,
even while the consumer is paused and the socket is not being read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    write_lsn: int
    flush_lsn: int
    apply_lsn: int
    reply_requested: bool = False


def keepalive_interval(wal_sender_timeout_s: float) -> float:
    """Seconds between status updates: a third of the server's timeout, at most 10 s."""
    if wal_sender_timeout_s <= 0:  # timeout disabled on the server
        return 10.0
    return min(wal_sender_timeout_s / 3.0, 10.0)


def _no_transaction_open() -> bool:
    return False


def _nobody() -> None:
    return None


class Feedback:
    """The positions to report and the decision when to report them."""

    def __init__(
        self,
        start_lsn: int | None = None,
        *,
        keepalive_interval_s: float = 10.0,
        min_interval_s: float = 0.05,
        receive_timeout_s: float | None = None,
        txn_open: Callable[[], bool] = _no_transaction_open,
    ) -> None:
        """``start_lsn``: the slot's confirmed position, or None until the client's
        first connection tells it (``start``). ``txn_open``: whether the stream has a
        transaction open now (the collector's), asked by the idle rule."""
        # Everything before the slot's confirmed position is durable by definition.
        self.started = start_lsn is not None
        self.received = start_lsn or 0
        self.durable = start_lsn or 0
        self.idle_point = start_lsn or 0
        self._txn_open = txn_open
        self.on_change: Callable[[], object] = _nobody  # the client's sender wakes
        self._keepalive_reached: int | None = None  # the last one the consumer reached
        self.keepalive_interval_s = keepalive_interval_s
        self.min_interval_s = min_interval_s
        self._sent: StatusUpdate | None = None
        self._sent_at = float("-inf")
        self._reply_due = False
        # silence: after half of ``receive_timeout_s`` without a message the next
        # update asks the walsender for a reply; after all of it the connection is lost
        # (a network that holds packets: TCP alone may not say so for hours)
        self.receive_timeout_s = receive_timeout_s
        self._heard_at: float | None = None
        self._pinged = False

    # -- inputs --------------------------------------------------------------

    def start(
        self, slot_lsn: int, *, keepalive_interval_s: float, receive_timeout_s: float | None
    ) -> None:
        """A connection of the replication client: the first one gives the slot's
        confirmed position (where the positions start) and the update interval; every
        one gives the receive timeout (from the server's ``wal_sender_timeout``)."""
        if not self.started:
            self.started = True
            self.received = self.durable = self.idle_point = slot_lsn
            self.keepalive_interval_s = keepalive_interval_s
        self.receive_timeout_s = receive_timeout_s

    def note_received(self, lsn: int) -> None:
        """XLogData start or keepalive ``wal_end`` seen on the socket."""
        if lsn > self.received:
            self.received = lsn

    def note_heard(self, now: float) -> None:
        """A message (data or keepalive) arrived from the walsender at ``now``."""
        self._heard_at = now
        self._pinged = False

    def silent_for(self, now: float) -> float:
        """Seconds since the walsender was last heard (0 before the first message is
        awaited: ``note_heard`` at the connection's start)."""
        return 0.0 if self._heard_at is None else max(0.0, now - self._heard_at)

    def timed_out(self, now: float) -> bool:
        """Whether the walsender has been silent for all of ``receive_timeout_s``."""
        limit = self.receive_timeout_s
        return limit is not None and self.silent_for(now) >= limit

    def _ping_due(self, now: float) -> bool:
        limit = self.receive_timeout_s
        return limit is not None and not self._pinged and self.silent_for(now) >= limit / 2

    def note_keepalive(self, wal_end: int, reply_requested: bool) -> None:
        self.note_received(wal_end)
        if reply_requested:
            self._reply_due = True

    def note_durable(self, lsn: int, caught_up: bool = False) -> None:
        """The FlushTracker's notification ``D``; ``caught_up``: no writer holds
        anything at this moment (with no transaction open, the last keepalive reached
        is then an idle point). Ignored before the first connection, whose slot
        position is where the positions start."""
        if not self.started:
            return
        if lsn > self.durable:
            self.durable = lsn
        if self._keepalive_reached is not None and self._idle(caught_up):
            self.note_idle(self._keepalive_reached)
        self.on_change()

    def keepalive_reached(self, wal_end: int, caught_up: bool) -> None:
        """The consumer processed the stream up to a keepalive at ``wal_end``;
        ``caught_up`` as for ``note_durable``, at this moment."""
        if not self.started:
            return
        self._keepalive_reached = wal_end
        if self._idle(caught_up):
            self.note_idle(wal_end)
        self.on_change()

    def _idle(self, caught_up: bool) -> bool:
        """The idle rule: nothing pending in any writer and no transaction open."""
        return caught_up and not self._txn_open()

    def stream_restarted(self) -> None:
        """The consumer reached a new stream: no keepalive of it is reached yet."""
        self._keepalive_reached = None

    def note_idle(self, wal_end: int) -> None:
        """The consumer processed the stream up to a keepalive at ``wal_end`` and, at that
        moment, had no open transaction and nothing pending in any writer."""
        if wal_end > self.idle_point:
            self.idle_point = wal_end

    # -- outputs -------------------------------------------------------------

    @property
    def flush_lsn(self) -> int:
        candidate = max(self.durable, self.idle_point)
        floor = self._sent.flush_lsn if self._sent is not None else 0
        return max(floor, min(candidate, self.received))

    def current(self) -> StatusUpdate:
        flush = self.flush_lsn
        prev = self._sent
        write = max(self.received, prev.write_lsn if prev else 0)
        return StatusUpdate(write, flush, flush)

    def due(self, now: float) -> StatusUpdate | None:
        """The update to send now, or None. Call ``sent`` after actually sending it."""
        update = self.current()
        if self._reply_due:
            return update
        if self._ping_due(now):  # (``sent`` records the ping)
            return StatusUpdate(
                update.write_lsn, update.flush_lsn, update.apply_lsn, reply_requested=True
            )
        elapsed = now - self._sent_at
        if elapsed >= self.keepalive_interval_s:
            return update
        prev = self._sent
        if (
            prev is not None
            and update.flush_lsn > prev.flush_lsn
            and elapsed >= self.min_interval_s
        ):
            return update
        return None

    def next_deadline(self, now: float) -> float:
        """Seconds until an update becomes due without new input."""
        prev = self._sent
        if self._reply_due or self._ping_due(now):
            return 0.0
        if prev is not None and self.current().flush_lsn > prev.flush_lsn:
            wait = max(0.0, self._sent_at + self.min_interval_s - now)
        else:
            wait = max(0.0, self._sent_at + self.keepalive_interval_s - now)
        limit = self.receive_timeout_s
        if limit is not None and not self._pinged and self._heard_at is not None:
            wait = min(wait, max(0.0, self._heard_at + limit / 2 - now))
        return wait

    def sent(self, update: StatusUpdate, now: float) -> None:
        self._sent = update
        self._sent_at = now
        self._reply_due = False
        if update.reply_requested:
            self._pinged = True

    @property
    def last_sent(self) -> StatusUpdate | None:
        return self._sent
