"""The collector: routing rows to shape writers, transaction boundaries, the tracker,
replays after a reconnect or restart, schema changes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tidemark.errors import ProtocolError
from tidemark.flush.tracker import FlushTracker
from tidemark.lsn import LogOffset
from tidemark.pgoutput import messages as m
from tidemark.shapes.model import ShapeDefinition, bind
from tidemark.stream.collector import ShapeLogCollector

INT4, TEXT = 23, 25
ORDERS = m.Relation(
    16384,
    "public",
    "orders",
    "f",
    (
        m.RelationColumn("id", INT4, -1, True),
        m.RelationColumn("region", TEXT, -1, True),
        m.RelationColumn("note", TEXT, -1, True),
    ),
)
OTHER = m.Relation(16390, "public", "other", "d", (m.RelationColumn("id", INT4, -1, True),))


@dataclass
class RecordingWriter:
    """Stands in for ShapeWriter: records the calls the collector makes."""

    name: str
    committed_lsn: int | None = None
    calls: list[tuple[object, ...]] = field(default_factory=list)
    events: list[str] | None = None

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> bool:
        if self.committed_lsn is not None and lsn <= self.committed_lsn:
            return False
        self.calls.append(("begin", lsn))
        return True

    def append(self, op, kind, values, unchanged, size_hint) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("row", op, kind, values, unchanged))

    def end_txn(self, last: LogOffset) -> None:
        self.calls.append(("end", last))
        if self.events is not None:
            self.events.append(f"end:{self.name}")

    def abort_txn(self) -> None:
        self.calls.append(("abort",))

    def rows(self) -> list[tuple[object, ...]]:
        return [c[1:] for c in self.calls if c[0] == "row"]


def shape(name: str, where: str | None = None, columns: tuple[str, ...] | None = None):  # type: ignore[no-untyped-def]
    definition = ShapeDefinition(name=name, table="public.orders", where=where, columns=columns)
    return bind(definition, ORDERS, ["id"])


@pytest.fixture
def setup():  # type: ignore[no-untyped-def]
    notified: list[int] = []
    events: list[str] = []
    tracker = FlushTracker(
        lambda lsn, _caught_up: (notified.append(lsn), events.append(f"durable:{lsn}")),
        clock=lambda: 0.0,
    )
    collector = ShapeLogCollector(tracker)
    eu = RecordingWriter("eu", events=events)
    everything = RecordingWriter("everything", events=events)
    collector.add_shape(shape("eu", "region = 'eu'"), eu)  # type: ignore[arg-type]
    collector.add_shape(shape("everything", columns=("note",)), everything)  # type: ignore[arg-type]
    collector.handle(ORDERS)
    collector.handle(OTHER)
    return collector, tracker, eu, everything, notified, events


def txn(collector: ShapeLogCollector, lsn: int, *changes: m.Message, xid: int = 7) -> None:
    collector.handle(m.Begin(lsn, 0, xid))
    for change in changes:
        collector.handle(change)
    collector.handle(m.Commit(0, lsn, lsn + 8, 0))


def row(i: int, region: str, note: str = "n") -> tuple[bytes, ...]:
    return (str(i).encode(), region.encode(), note.encode())


def test_rows_reach_the_matching_shapes_projected_with_unique_ops(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, notified, _ = setup
    txn(
        collector,
        100,
        m.Insert(ORDERS.oid, row(1, "eu")),
        m.Insert(ORDERS.oid, row(2, "us")),
        m.Update(ORDERS.oid, row(1, "eu"), "O", row(1, "us", "moved")),
    )
    assert eu.rows() == [(0, "insert", row(1, "eu"), None), (4, "delete", row(1, "eu"), None)]
    assert everything.rows() == [
        (0, "insert", (b"1", b"n"), None),
        (2, "insert", (b"2", b"n"), None),
        (4, "update", (b"1", b"moved"), None),
    ]
    # the tracker learned the transaction with both shapes; nothing durable yet
    assert tracker.last_flushed_of("eu") is not None
    assert tracker.last_flushed_of("everything") is not None
    assert notified == []
    assert eu.calls[-1] == ("end", LogOffset(100, 7))


def test_the_tracker_sees_the_commit_before_writers_end_their_part(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, _notified, _events = setup
    seen_at_end = []
    for writer in (eu, everything):
        original = writer.end_txn

        def end_txn(last: LogOffset, original=original) -> None:  # type: ignore[no-untyped-def]
            seen_at_end.append(tracker.last_seen_offset)
            original(last)

        writer.end_txn = end_txn  # type: ignore[method-assign]
    txn(collector, 200, m.Insert(ORDERS.oid, row(2, "eu")))
    assert seen_at_end == [LogOffset(200, 3), LogOffset(200, 3)]


def test_a_transaction_touching_no_shape_is_durable_at_once(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, notified, _ = setup
    txn(collector, 100, m.Insert(OTHER.oid, (b"1",)))
    assert notified == [100] and eu.calls == [] and everything.calls == []
    assert not collector.in_txn and tracker.is_caught_up


def test_a_primary_key_change_is_a_delete_and_an_insert_with_distinct_ops(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, eu, _, _, _ = setup
    txn(collector, 100, m.Update(ORDERS.oid, row(1, "eu"), "O", row(9, "eu")))
    assert [(op, kind) for op, kind, *_ in eu.rows()] == [(0, "delete"), (1, "insert")]


def test_truncate_reaches_every_shape_of_the_table(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, eu, everything, _, _ = setup
    txn(collector, 100, m.Truncate((ORDERS.oid, OTHER.oid), 0))
    assert [kind for _, kind, *_ in eu.rows()] == ["truncate"]
    assert [kind for _, kind, *_ in everything.rows()] == ["truncate"]


def test_a_writer_that_has_the_transaction_already_is_not_affected(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, _everything, _notified, _ = setup
    eu.committed_lsn = 150  # committed before a restart
    txn(collector, 100, m.Insert(ORDERS.oid, row(1, "eu")))
    assert eu.calls == []
    assert tracker.last_flushed_of("eu") is None
    assert tracker.last_flushed_of("everything") is not None


def test_after_a_reconnect_the_open_transaction_is_dropped_and_replays_skipped(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, eu, _, _, _ = setup
    txn(collector, 100, m.Insert(ORDERS.oid, row(1, "eu")))
    collector.handle(m.Begin(200, 0, 8))
    collector.handle(m.Insert(ORDERS.oid, row(2, "eu")))
    # the connection drops mid-transaction; Postgres re-sends from the durable point
    collector.stream_restarted()
    assert eu.calls[-1] == ("abort",)
    txn(collector, 100, m.Insert(ORDERS.oid, row(1, "eu")))  # already fully seen
    txn(collector, 200, m.Insert(ORDERS.oid, row(2, "eu")))
    assert [c for c in eu.calls if c[0] == "begin"] == [
        ("begin", 100),
        ("begin", 200),
        ("begin", 200),
    ]
    assert collector.stats.transactions_skipped == 1


def test_an_added_column_flows_on_for_shapes_without_a_column_list(setup) -> None:  # type: ignore[no-untyped-def]
    changed = []
    collector, _tracker, eu, _everything, _, _ = setup
    collector._on_columns_changed = changed.append
    wider = m.Relation(
        ORDERS.oid,
        "public",
        "orders",
        "f",
        (*ORDERS.columns, m.RelationColumn("qty", INT4, -1, True)),
    )
    collector.handle(wider)
    assert [s.name for s in changed] == ["eu"]  # "everything" lists its columns
    txn(collector, 100, m.Insert(ORDERS.oid, (*row(1, "eu"), b"5")))
    assert eu.rows()[-1][2] == (b"1", b"eu", b"n", b"5")


def test_origin_type_and_messages_are_recorded_not_fatal(setup) -> None:  # type: ignore[no-untyped-def]
    collector, *_ = setup
    collector.handle(m.Begin(100, 0, 1))
    collector.handle(m.Origin(100, "node_a"))
    collector.handle(m.TypeInfo(90000, "public", "mood"))
    collector.handle(m.LogicalMessage(True, 100, "app", b"hi"))
    collector.handle(m.Commit(0, 100, 108, 0))
    assert (collector.stats.origins, collector.stats.types, collector.stats.logical_messages) == (
        1,
        1,
        1,
    )


def test_a_change_for_an_undescribed_relation_is_a_protocol_error(setup) -> None:  # type: ignore[no-untyped-def]
    collector, *_ = setup
    collector.handle(m.Begin(100, 0, 1))
    with pytest.raises(ProtocolError, match="12345"):
        collector.handle(m.Insert(12345, (b"1",)))


def test_removing_a_shape_unblocks_the_boundary(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, _eu, _everything, notified, _ = setup
    txn(collector, 100, m.Insert(ORDERS.oid, row(1, "eu")))
    tracker.handle_flush_notification("everything", LogOffset(100, 3))
    assert max(notified, default=0) < 100  # eu still owes its flush
    collector.remove_shape("eu")
    assert notified[-1] == 100


def test_a_fenced_shape_skips_what_its_snapshot_holds_and_applies_the_rest() -> None:
    from tidemark.continuity.fence import SnapshotFence

    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=lambda: 0.0)
    collector = ShapeLogCollector(tracker)
    writer = RecordingWriter("eu")
    # snapshot at LSN 500: xids < 10 done, 12 in progress, >= 15 not started
    fence = SnapshotFence(500, xmin=10, xmax=15, xip=frozenset({12}))
    collector.add_shape(shape("eu", "region = 'eu'"), writer, fence=fence)  # type: ignore[arg-type]
    collector.handle(ORDERS)
    txn(collector, 300, m.Insert(ORDERS.oid, row(1, "eu")), xid=9)  # in the snapshot
    txn(collector, 350, m.Insert(ORDERS.oid, row(2, "eu")), xid=11)  # in the snapshot
    txn(collector, 400, m.Insert(ORDERS.oid, row(3, "eu")), xid=12)  # was in progress
    txn(collector, 450, m.Insert(ORDERS.oid, row(4, "eu")), xid=16)  # started after
    txn(collector, 600, m.Insert(ORDERS.oid, row(5, "eu")), xid=5)  # past the fence LSN
    assert [r[2][0] for r in writer.rows()] == [b"3", b"4", b"5"]
    # the skipped transactions never reached the tracker for this shape: it owes a
    # flush from its first applied transaction on, not from 300
    assert tracker.last_flushed_of("eu") == LogOffset(400, 0).prev_tx()


def test_a_shape_added_mid_transaction_skips_that_transaction() -> None:
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=lambda: 0.0)
    collector = ShapeLogCollector(tracker)
    collector.handle(ORDERS)
    collector.handle(m.Begin(100, 0, 7))
    collector.handle(m.Insert(ORDERS.oid, row(1, "eu")))
    writer = RecordingWriter("eu")
    collector.add_shape(shape("eu", "region = 'eu'"), writer)  # type: ignore[arg-type]
    collector.handle(m.Insert(ORDERS.oid, row(2, "eu")))
    collector.handle(m.Commit(0, 100, 108, 0))
    txn(collector, 200, m.Insert(ORDERS.oid, row(3, "eu")))
    assert [r[2][0] for r in writer.rows()] == [b"3"]


def test_a_snapshot_that_misses_the_transaction_being_received_is_unusable(setup) -> None:  # type: ignore[no-untyped-def]
    # given the consumer paused in the middle of a transaction (a socket read ends
    # inside it): pgoutput sent it because it committed
    collector, *_ = setup
    txn(collector, 100, m.Insert(ORDERS.oid, row(1, "eu")), xid=40)
    collector.handle(m.Begin(200, 0, 41))
    collector.handle(m.Insert(ORDERS.oid, row(2, "eu")))
    # when a new snapshot sees xid 40 but not 41 (taken between 41's commit record and
    # its visibility), a shape fenced by it would decline 41 and miss its rows
    missed = collector.passed_invisible(lambda xid: xid != 41)
    # then the snapshot is refused for 41, and for nothing else
    assert missed == [41]
    assert collector.passed_invisible(lambda xid: True) == []
    collector.handle(m.Commit(0, 200, 208, 0))
    assert collector.passed_invisible(lambda xid: xid != 41) == [41]  # a recent commit now
