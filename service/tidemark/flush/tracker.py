"""FlushTracker: the one place that decides which LSN tidemark may confirm to Postgres.

Shapes flush on their own cadences and most transactions touch only a few of them,
so the durable position is a minimum over the shapes that still owe a flush, aligned
to transaction boundaries. The algorithm is the seed's (ElectricSQL's
``ShapeLogCollector.FlushTracker``); the names and checks are ours.

State
-----
* ``last_seen_offset``: ``last_log_offset`` of the newest committed transaction the
  collector dispatched.
* ``last_global_flushed_offset``: the highest offset below which every shape has
  flushed everything it was sent. Never decreases.
* pending shapes: ``shape -> (last_sent, last_flushed)`` for the shapes that have not
  caught up. A shape whose ``last_flushed`` reaches its ``last_sent`` leaves the map.
* a sorted map ``last_flushed -> {shapes}`` over the pending shapes, so the minimum
  is found in O(1) and moved in O(log n).

On a committed transaction (``handle_txn_fragment``) every affected shape gets
``last_sent = last_log_offset``; a shape entering the pending map is seeded with
``last_flushed = last_log_offset.prev_tx()``: it owes nothing from before this
transaction, even if earlier transactions never touched it. If no shape is pending
afterwards, the transaction is durable at once.

On a writer's flush notice (``handle_flush_notification``) the shape either catches
up (offset == ``last_sent``: it leaves the map) or moves in the sorted map; then
``last_global_flushed_offset = max(itself, minimum pending last_flushed)``. A notice
for a shape that is not pending (removed, or already caught up) is ignored.

Removing a shape (``handle_shape_removed``) forgets what it owed, which may unblock
the boundary.

The promise ``notify(D)`` makes
-------------------------------
Every transaction with commit LSN ``<= D`` is durably committed in every shape it
touched (shapes removed since do not count). ``D`` is computed as:

* nothing pending: ``last_seen_offset.tx_offset``: every transaction seen is durable;
* otherwise ``last_global_flushed_offset.tx_offset - 1``: the minimum pending shape has
  flushed everything before its ``last_flushed``; whether the transaction *at* that
  offset is complete is not known here (the offset may be mid-transaction), so it is
  excluded. Commit records are at least 8 bytes apart, so ``tx_offset - 1`` is never a
  real commit LSN and "``<= D``" equals "``< tx_offset``".

Postgres, on restart, resends every transaction whose commit LSN is ``>=`` the
confirmed flush LSN and skips the rest, without validating the value. The
replication client sends ``flush_lsn = D``: transaction ``D`` itself may be replayed
after a crash (sinks drop what they already committed), and nothing at or below
``D`` is lost. Notifications strictly increase: a value not above the previous one
(or above ``durable_lsn`` given at construction, e.g. the slot's
``confirmed_flush_lsn`` on restart) is not notified again.

Contract with the collector and writers (checked where cheap, ``InvariantViolation``
otherwise):

* only commit fragments reach the tracker, in increasing commit order, naming every
  shape that received any change of the transaction (in any of its fragments);
* the tracker sees a commit before any writer reports a flush inside that
  transaction; writers report offsets aligned by ``tidemark.flush.alignment``, so a
  notice never exceeds the shape's ``last_sent``.

Time is injected (``clock``) and only read when shapes enter the pending map, to
attribute stalls (``stalled_shapes``). The tracker does no IO and is not thread-safe:
one owner (the collector's task) calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedDict

from tidemark.errors import InvariantViolation
from tidemark.lsn import LogOffset

# Inside the tracker an offset is one int, ``tx_offset * 2**64 + op_offset`` (same
# order, since 0 <= op_offset < 2**64): the sorted map compares O(log n) keys per
# notice and dict lookups hash them, and int comparisons and hashes run in C without
# touching a dataclass or building a tuple (the 100k-shape target is < 10 us/notice).
_Key = int
_OP_BITS = 64
_OP_MASK = (1 << _OP_BITS) - 1


def _key(offset: LogOffset) -> _Key:
    return (offset.tx_offset << _OP_BITS) + offset.op_offset


def _offset(key: _Key) -> LogOffset:
    return LogOffset(key >> _OP_BITS, key & _OP_MASK)


class TxnFragment(Protocol):
    """What the tracker reads from a transaction fragment (the collector's type fits)."""

    @property
    def has_commit(self) -> bool: ...

    @property
    def last_log_offset(self) -> LogOffset: ...


@dataclass(frozen=True, slots=True)
class CommitFragment:
    """The commit fragment of a transaction: all the tracker needs to know about it.

    ``last_log_offset`` is the offset of the transaction's last change (its
    ``tx_offset`` is the commit LSN). Any object with ``has_commit`` and
    ``last_log_offset`` is accepted as well, so the collector can pass its own
    fragments without building one of these.
    """

    last_log_offset: LogOffset

    @property
    def has_commit(self) -> bool:
        return True

    @property
    def commit_lsn(self) -> int:
        return self.last_log_offset.tx_offset


@dataclass(frozen=True, slots=True)
class StalledShape:
    """A shape that has owed a flush for longer than the grace period."""

    name: str
    last_flushed: LogOffset
    last_sent: LogOffset
    pending_since: float


class _Pending:
    """A shape that has not caught up (mutable: updated on every notice)."""

    __slots__ = ("last_flushed", "last_sent", "since")

    def __init__(self, last_sent: _Key, last_flushed: _Key, since: float) -> None:
        self.last_sent = last_sent
        self.last_flushed = last_flushed
        self.since = since


class FlushTracker:
    """Global durable position across all shapes (see the module docstring)."""

    __slots__ = (
        "_by_flushed",
        "_clock",
        "_durable_lsn",
        "_global",
        "_last_seen",
        "_listeners",
        "_min",
        "_pending",
    )

    def __init__(
        self,
        *listeners: Callable[[int, bool], object],
        clock: Callable[[], float],
        durable_lsn: int | None = None,
    ) -> None:
        """Each listener is called ``listener(D, caught_up)`` on every advance of the
        durable LSN ``D``, in the order given (the service's: the acknowledgement
        first, then what follows durability); ``caught_up``: no shape owes a flush at
        that moment (everything seen is durable), so a listener need not ask the
        tracker back from inside it.

        ``clock`` gives the time (seconds, monotonic) recorded when a shape starts
        owing a flush. ``durable_lsn`` is what is already confirmed to Postgres (the
        slot's ``confirmed_flush_lsn`` on restart): notifications stay above it.
        """
        self._listeners = listeners
        self._clock = clock
        self._durable_lsn = durable_lsn
        self._last_seen: _Key = _key(LogOffset.before_all())
        self._global: _Key = self._last_seen
        self._pending: dict[str, _Pending] = {}
        self._by_flushed: SortedDict = SortedDict()  # _Key -> set[str]
        # First key of _by_flushed, cached: most notices move a shape that is not the
        # minimum, and reading the first key of a SortedDict is not free.
        self._min: _Key | None = None

    # -- inputs ----------------------------------------------------------------

    def handle_txn_fragment(self, fragment: TxnFragment, affected_shapes: Iterable[str]) -> None:
        """A committed transaction was dispatched to ``affected_shapes``."""
        if not fragment.has_commit:
            raise InvariantViolation(
                f"FlushTracker got a fragment without a commit (last offset "
                f"{fragment.last_log_offset}): the collector must pass only the commit "
                "fragment of each transaction, naming every shape any fragment touched"
            )
        last = fragment.last_log_offset
        key = _key(last)
        if key <= self._last_seen:
            raise InvariantViolation(
                f"commit fragment at {last} is not after the last seen "
                f"{_offset(self._last_seen)}: transactions must reach the tracker once, in "
                "commit order; after a reconnect skip transactions at or below the last "
                "seen offset, or start a new tracker"
            )
        self._last_seen = key
        pending = self._pending
        seed = _key(last.prev_tx())
        entering: set[str] | None = None
        since = 0.0
        for shape in affected_shapes:
            entry = pending.get(shape)
            if entry is not None:
                entry.last_sent = key
                continue
            if entering is None:
                entering = set()
                since = self._clock()
            pending[shape] = _Pending(key, seed, since)
            entering.add(shape)
        if entering:
            existing = self._by_flushed.get(seed)
            if existing is None:
                self._by_flushed[seed] = entering
                if self._min is None or seed < self._min:
                    self._min = seed
            else:
                existing |= entering
        if not pending:
            self._advance()

    def handle_flush_notification(self, shape: str, offset: LogOffset) -> None:
        """``shape``'s writer has durably committed everything up to ``offset``."""
        entry = self._pending.get(shape)
        if entry is None:
            return  # removed, or caught up and not sent anything since
        key = (offset.tx_offset << _OP_BITS) + offset.op_offset
        if key > entry.last_sent:
            raise InvariantViolation(
                f"shape {shape!r} reported a flush at {offset}, beyond what it was sent "
                f"({_offset(entry.last_sent)}): writers must align flushes with "
                "TxnAlignment and report a transaction only after the tracker saw its commit"
            )
        # The hot path: _discard inlined.
        by_flushed = self._by_flushed
        old = entry.last_flushed
        shapes = by_flushed[old]
        if len(shapes) == 1:
            del by_flushed[old]
            if old == self._min:
                self._min = by_flushed.peekitem(0)[0] if by_flushed else None
        else:
            shapes.discard(shape)
        if key == entry.last_sent:
            del self._pending[shape]
        else:
            entry.last_flushed = key
            shapes = by_flushed.get(key)
            if shapes is None:
                by_flushed[key] = {shape}
                if self._min is None or key < self._min:
                    self._min = key
            else:
                shapes.add(shape)
        self._advance()

    def handle_shape_removed(self, shape: str) -> None:
        """``shape`` is gone: it no longer holds the boundary back."""
        entry = self._pending.pop(shape, None)
        if entry is None:
            return
        self._discard(entry.last_flushed, shape)
        self._advance()

    # -- state -----------------------------------------------------------------

    @property
    def durable_lsn(self) -> int | None:
        """The last notified ``D`` (or the one given at construction); None before any."""
        return self._durable_lsn

    @property
    def last_seen_offset(self) -> LogOffset:
        return _offset(self._last_seen)

    @property
    def last_global_flushed_offset(self) -> LogOffset:
        return _offset(self._global)

    @property
    def is_caught_up(self) -> bool:
        """No shape owes a flush: everything seen is durable."""
        return not self._pending

    def last_flushed_of(self, shape: str) -> LogOffset | None:
        """What a pending shape has flushed (None when it owes nothing)."""
        entry = self._pending.get(shape)
        return None if entry is None else _offset(entry.last_flushed)

    def holding_shape(self) -> str | None:
        """The pending shape holding the durable LSN back (the lowest ``last_flushed``;
        the first name among equals, as ``stalled_shapes`` orders them), or None. O(1)
        for the minimum, then its shapes at that offset."""
        if self._min is None:
            return None
        return min(self._by_flushed[self._min])

    def stalled_shapes(self, now: float, grace: float) -> list[StalledShape]:
        """Shapes owing a flush since before ``now - grace``, lowest ``last_flushed`` first.

        The first entry is the one holding the durable LSN back. A shape that keeps
        receiving data faster than it catches up stays pending although it flushes,
        so compare ``last_flushed`` between two calls to tell slow from stuck.
        O(pending shapes): meant for monitoring, not the hot path.
        """
        cutoff = now - grace
        stalled = [
            (entry.last_flushed, name, entry)
            for name, entry in self._pending.items()
            if entry.since < cutoff
        ]
        stalled.sort(key=lambda item: (item[0], item[1]))
        return [
            StalledShape(name, _offset(entry.last_flushed), _offset(entry.last_sent), entry.since)
            for _, name, entry in stalled
        ]

    # -- internals -------------------------------------------------------------

    def _discard(self, key: _Key, shape: str) -> None:
        by_flushed = self._by_flushed
        shapes = by_flushed[key]
        shapes.discard(shape)
        if not shapes:
            del by_flushed[key]
            if key == self._min:
                self._min = by_flushed.peekitem(0)[0] if by_flushed else None

    def _advance(self) -> None:
        if not self._pending:
            self._global = self._last_seen
            self._announce(self._last_seen >> _OP_BITS, True)
            return
        minimum = self._min
        if minimum is not None and minimum > self._global:
            self._global = minimum
            self._announce((minimum >> _OP_BITS) - 1, False)

    def _announce(self, lsn: int, caught_up: bool) -> None:
        # Equal values are dropped too: two shapes moving inside one transaction raise
        # the global offset without changing tx_offset - 1.
        if self._durable_lsn is None or lsn > self._durable_lsn:
            self._durable_lsn = lsn
            for listener in self._listeners:
                listener(lsn, caught_up)
