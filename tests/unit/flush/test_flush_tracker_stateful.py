"""The flush boundary against a brute-force model of the whole pipeline.

Hypothesis drives random interleavings of: shapes added and removed, transactions
(commit LSNs at least 8 apart) whose changes are routed to random shapes and arrive
in several fragments, writers flushing any prefix of what they wrote (also while a
transaction is open), aligned through ``TxnAlignment`` as a real writer would, and
crashes followed by Postgres's replay from the confirmed flush LSN.

The model remembers every row routed to every shape and how far each shape's sink is
durable. After every step:

* safety: every transaction with commit LSN <= the confirmed LSN is durable in every
  live shape it touched (the promise ``notify(D)`` makes);
* notifications strictly increase, across restarts, and never pass what was received;
* no row is lost: each routed row is durable in its sink or held by its writer, even
  after a crash (Postgres replays commit LSN >= confirmed, writers drop what their
  sink already has);
* liveness: once no transaction is open and every writer has flushed everything, the
  boundary is the last transaction seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tidemark.flush import CommitFragment, FlushTracker, TxnAlignment
from tidemark.lsn import LogOffset

NONE: frozenset[str] = frozenset()


@dataclass
class Writer:
    alignment: TxnAlignment = field(default_factory=TxnAlignment)
    unflushed: list[LogOffset] = field(default_factory=list)
    durable_upto: LogOffset | None = None  # the sink's committed offset

    def is_durable(self, row: LogOffset) -> bool:
        return self.durable_upto is not None and row <= self.durable_upto


@dataclass
class Txn:
    lsn: int
    ops: int
    routing: list[frozenset[str]]  # per change: shapes it is routed to
    skipped: frozenset[str]  # routed, but already in the shape's sink/snapshot
    rows: dict[str, list[LogOffset]] = field(default_factory=dict)  # written rows per shape
    delivered: int = 0

    @property
    def last_offset(self) -> LogOffset:
        return LogOffset(self.lsn, self.ops - 1)

    @property
    def participants(self) -> frozenset[str]:
        return NONE.union(*self.routing)


class FlushPipeline(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.notified: list[int] = []
        self.confirmed = 0  # the slot's confirmed_flush_lsn: max flush_lsn ever sent
        self.tracker = self._new_tracker()
        self.lsn = 0x1000
        self.next_shape = 0
        self.writers: dict[str, Writer] = {}
        self.removed: set[str] = set()
        self.committed: list[Txn] = []
        self.open: Txn | None = None
        self.commits_since_restart = 0

    # -- plumbing ----------------------------------------------------------------------

    def _new_tracker(self) -> FlushTracker:
        return FlushTracker(self._on_notify, clock=lambda: 0.0, durable_lsn=self.confirmed or None)

    def _on_notify(self, lsn: int, caught_up: bool) -> None:
        # Checked at the moment of the notification, before anything else moves.
        assert not self.notified or lsn > self.notified[-1], "notification not increasing"
        # (the notification says whether any shape still owes a flush: no one asks back)
        assert caught_up == self.tracker.is_caught_up, (caught_up, lsn)
        assert lsn > self.confirmed or not self.notified
        self._check_promise(lsn)
        self.notified.append(lsn)
        self.confirmed = max(self.confirmed, lsn)  # the client sends flush_lsn = D

    def _check_promise(self, durable: int) -> None:
        assert self.committed and durable <= self.committed[-1].lsn, (
            f"confirmed {durable:#x}, beyond every commit received"
        )
        for txn in self.committed:
            if txn.lsn > durable:
                break
            for shape, rows in txn.rows.items():
                writer = self.writers.get(shape)
                if writer is None:
                    continue  # removed: it no longer counts
                assert all(writer.is_durable(r) for r in rows), (
                    f"confirmed {durable:#x} but {shape} has not flushed txn {txn.lsn:#x}"
                )

    def _report(self, shape: str, report: LogOffset | None) -> None:
        if report is not None:
            self.tracker.handle_flush_notification(shape, report)

    def _deliver(self, txn: Txn, upto: int) -> None:
        for op in range(txn.delivered, upto):
            row = LogOffset(txn.lsn, op)
            for shape in sorted(txn.routing[op] - txn.skipped):
                writer = self.writers.get(shape)
                if writer is None or writer.is_durable(row):
                    continue  # removed, or the sink already has it (a replay)
                writer.alignment.record_written(row)
                writer.unflushed.append(row)
                txn.rows.setdefault(shape, []).append(row)
        txn.delivered = upto

    def _commit(self, txn: Txn) -> None:
        affected = txn.participants & self.writers.keys()
        # The tracker learns about the commit before the writers do.
        self.tracker.handle_txn_fragment(CommitFragment(txn.last_offset), affected)
        for shape in sorted(affected):
            self._report(shape, self.writers[shape].alignment.end_txn(txn.last_offset))

    # -- shapes ------------------------------------------------------------------------

    @initialize(count=st.integers(min_value=1, max_value=4))
    def start_with_shapes(self, count: int) -> None:
        for _ in range(count):
            self.add_shape()

    def churn_shapes(self, data: st.DataObject) -> None:
        # Drawn at each transaction start rather than as a rule of its own, so shape
        # churn does not crowd out transactions and flushes.
        choice = data.draw(st.integers(0, 5), label="churn")
        if choice == 0:
            self.maybe_remove_shape(data)
        elif choice == 1 and len(self.writers) < 5:
            self.add_shape()

    def maybe_remove_shape(self, data: st.DataObject) -> None:
        if self.writers:
            shape = data.draw(st.sampled_from(sorted(self.writers)), label="removed")
            del self.writers[shape]
            self.removed.add(shape)
            self.tracker.handle_shape_removed(shape)

    def add_shape(self) -> None:
        self.writers[f"s{self.next_shape}"] = Writer()
        self.next_shape += 1

    # -- transactions ------------------------------------------------------------------

    @precondition(lambda self: self.open is None)
    @rule(data=st.data())
    def begin(self, data: st.DataObject) -> None:
        self.churn_shapes(data)
        self.lsn += data.draw(st.integers(min_value=8, max_value=64), label="gap")
        live = sorted(self.writers)
        # Most changes go to some shape; some touch none (other tables, other rows).
        subsets = (
            st.frozensets(st.sampled_from(live), max_size=len(live)) if live else st.just(NONE)
        )
        routing = data.draw(st.lists(subsets, min_size=1, max_size=6), label="routing")
        participants = NONE.union(*routing)
        skipped = NONE
        if participants and data.draw(st.integers(0, 3), label="replayed?") == 0:
            skipped = data.draw(st.frozensets(st.sampled_from(sorted(participants)), min_size=1))
        txn = Txn(self.lsn, len(routing), routing, skipped)
        for shape in sorted(participants):
            self.writers[shape].alignment.begin_txn()
        self.open = txn

    @precondition(lambda self: self.open is not None and self.open.delivered < self.open.ops)
    @rule(data=st.data())
    def deliver_fragment(self, data: st.DataObject) -> None:
        assert self.open is not None
        upto = data.draw(
            st.integers(min_value=self.open.delivered + 1, max_value=self.open.ops), label="upto"
        )
        self._deliver(self.open, upto)
        if data.draw(st.integers(0, 7), label="remove mid-transaction?") == 0:
            self.maybe_remove_shape(data)

    @precondition(lambda self: self.open is not None and self.open.delivered == self.open.ops)
    @rule()
    def commit(self) -> None:
        assert self.open is not None
        txn, self.open = self.open, None
        self.committed.append(txn)
        self.commits_since_restart += 1
        self._commit(txn)

    # -- writers -----------------------------------------------------------------------

    @precondition(lambda self: any(w.unflushed for w in self.writers.values()))
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        self._flush_some(data)

    @precondition(
        lambda self: (
            self.open is not None
            and any(w.unflushed and w.alignment.in_txn for w in self.writers.values())
        )
    )
    @rule(data=st.data())
    def flush_while_a_transaction_is_open(self, data: st.DataObject) -> None:
        self._flush_some(data)

    def _flush_some(self, data: st.DataObject) -> None:
        owing = sorted(s for s, w in self.writers.items() if w.unflushed)
        shape = data.draw(st.sampled_from(owing), label="writer")
        writer = self.writers[shape]
        count = data.draw(st.integers(min_value=1, max_value=len(writer.unflushed)), label="rows")
        writer.durable_upto = writer.unflushed[count - 1]
        del writer.unflushed[:count]
        self._report(shape, writer.alignment.on_flushed(writer.durable_upto))

    # -- crash -------------------------------------------------------------------------

    @precondition(lambda self: self.open is None and self.commits_since_restart >= 2)
    @rule()
    def crash_and_restart(self) -> None:
        # Buffers and in-memory state are gone; sinks keep what they committed.
        for shape, writer in self.writers.items():
            self.writers[shape] = Writer(durable_upto=writer.durable_upto)
        self.tracker = self._new_tracker()
        self.commits_since_restart = 0
        # Postgres resends every transaction with commit LSN >= confirmed_flush_lsn.
        for old in self.committed:
            if old.lsn < self.confirmed:
                continue
            replay = Txn(old.lsn, old.ops, old.routing, old.skipped)
            for shape in sorted(replay.participants & self.writers.keys()):
                self.writers[shape].alignment.begin_txn()
            self._deliver(replay, replay.ops)
            for shape, rows in replay.rows.items():
                # Rows re-received now sit in the writer again, as in the original.
                assert set(rows) <= set(old.rows.get(shape, []))
            self._commit(replay)

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def confirmed_transactions_are_durable_everywhere(self) -> None:
        durable = self.tracker.durable_lsn
        if durable is not None and self.committed:
            self._check_promise(durable)

    @invariant()
    def sorted_map_matches_the_pending_shapes(self) -> None:
        # White-box: the seed's fourth invariant (the min structure and the map move
        # together), read through private attributes on purpose.
        tracker = self.tracker
        by_flushed = {k: set(v) for k, v in tracker._by_flushed.items()}
        expected: dict[int, set[str]] = {}
        for shape, entry in tracker._pending.items():
            expected.setdefault(entry.last_flushed, set()).add(shape)
            assert entry.last_flushed < entry.last_sent
        assert by_flushed == expected
        assert tracker._min == (min(expected) if expected else None)

    @invariant()
    def the_holding_shape_is_the_first_stalled_one(self) -> None:
        stalled = self.tracker.stalled_shapes(now=float("inf"), grace=0.0)
        assert self.tracker.holding_shape() == (stalled[0].name if stalled else None)

    @invariant()
    def no_row_is_lost(self) -> None:
        for txn in [*self.committed, *([self.open] if self.open else [])]:
            for shape, rows in txn.rows.items():
                writer = self.writers.get(shape)
                if writer is None:
                    continue
                for row in rows:
                    assert writer.is_durable(row) or row in writer.unflushed, (
                        f"row {row} of {shape} neither durable nor buffered"
                    )

    @invariant()
    def boundary_reaches_the_last_transaction_once_everything_is_flushed(self) -> None:
        if self.open is not None or not self.committed:
            return
        if any(w.unflushed for w in self.writers.values()):
            return
        assert self.tracker.is_caught_up
        assert all(w.alignment.is_idle for w in self.writers.values())
        assert self.tracker.durable_lsn == self.committed[-1].lsn
        assert self.confirmed == self.committed[-1].lsn


FlushPipeline.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestFlushPipeline = FlushPipeline.TestCase
