"""The collector with transactions Postgres streams before their commit (protocol v2
``streaming 'on'``): chunks per xid, interleaving, subtransaction and top-level
aborts, commit order, reconnects, fences and snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tidemark.continuity.fence import SnapshotFence
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
    (m.RelationColumn("id", INT4, -1, True), m.RelationColumn("region", TEXT, -1, True)),
)
OTHER = m.Relation(16390, "public", "other", "d", (m.RelationColumn("id", INT4, -1, True),))


@dataclass
class StreamWriter:
    """Stands in for ShapeWriter: keeps streamed rows per xid as the buffer would."""

    name: str
    committed_lsn: int | None = None
    open: dict[int, list[tuple[int, str, tuple[object, ...]]]] = field(default_factory=dict)
    committed: list[tuple[int, int, list[tuple[int, str, tuple[object, ...]]], LogOffset]] = field(
        default_factory=list
    )
    plain: list[tuple[object, ...]] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)

    # ordinary transactions
    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> bool:
        self.plain.append(("begin", lsn))
        return True

    def append(self, op, kind, values, unchanged, size_hint) -> None:  # type: ignore[no-untyped-def]
        self.plain.append(("row", op, values))

    def end_txn(self, last: LogOffset) -> None:
        self.plain.append(("end", last))

    def abort_txn(self) -> None:
        self.plain.append(("abort",))

    # streamed transactions
    def stream_append(self, xid, op, kind, values, unchanged, size_hint) -> None:  # type: ignore[no-untyped-def]
        self.open.setdefault(xid, []).append((op, kind, values))

    def stream_drop(self, xid: int, lo: int, hi: int) -> None:
        self.open[xid] = [r for r in self.open.get(xid, []) if not lo <= r[0] < hi]

    def stream_discard(self, xid: int) -> None:
        self.open.pop(xid, None)
        self.discarded.append(xid)

    def stream_wants(self, lsn: int) -> bool:
        return self.committed_lsn is None or lsn > self.committed_lsn

    def stream_commit(self, xid: int, lsn: int, commit_ts: int, last: LogOffset) -> None:
        self.committed.append((xid, lsn, self.open.pop(xid, []), last))

    def ids(self, i: int = -1) -> list[bytes]:
        return [r[2][0] for r in self.committed[i][2]]  # type: ignore[misc]


def shape(name: str, where: str | None = None):  # type: ignore[no-untyped-def]
    return bind(ShapeDefinition(name=name, table="public.orders", where=where), ORDERS, ["id"])


@pytest.fixture
def setup():  # type: ignore[no-untyped-def]
    durable: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: durable.append(lsn), clock=lambda: 0.0)
    collector = ShapeLogCollector(tracker)
    eu, everything = StreamWriter("eu"), StreamWriter("everything")
    collector.add_shape(shape("eu", "region = 'eu'"), eu)  # type: ignore[arg-type]
    collector.add_shape(shape("everything"), everything)  # type: ignore[arg-type]
    collector.handle(ORDERS)
    collector.handle(OTHER)
    return collector, tracker, eu, everything, durable


def ins(i: int, region: str = "eu", xid: int | None = None) -> m.Insert:
    return m.Insert(ORDERS.oid, (str(i).encode(), region.encode()), xid)


def block(collector: ShapeLogCollector, xid: int, *changes: m.Message, first: bool = False) -> None:
    collector.handle(m.StreamStart(xid, first))
    for change in changes:
        collector.handle(change)
    collector.handle(m.StreamStop())


def commit(collector: ShapeLogCollector, xid: int, lsn: int) -> None:
    collector.handle(m.StreamCommit(xid, 0, lsn, lsn + 8, 0))


def test_a_streamed_transaction_reaches_the_tracker_only_at_its_commit(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, _ = setup
    block(collector, 700, ins(1, xid=700), ins(2, "us", xid=700), first=True)
    block(collector, 700, ins(3, xid=700))
    assert tracker.last_flushed_of("eu") is None and collector.open_streams == 1
    assert eu.committed == [] and [r[0] for r in eu.open[700]] == [0, 4]
    commit(collector, 700, 5000)
    # ops count every change of the transaction, across chunks
    assert eu.committed == [(700, 5000, eu.committed[0][2], LogOffset(5000, 7))]
    assert eu.ids() == [b"1", b"3"] and everything.ids() == [b"1", b"2", b"3"]
    assert tracker.last_flushed_of("eu") is not None
    assert tracker.last_flushed_of("everything") is not None
    assert collector.open_streams == 0 and collector.stats.streamed_commits == 1
    assert collector.last_commit_lsn == 5000


def test_interleaved_streamed_transactions_are_kept_apart(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, _, everything, _ = setup
    block(collector, 701, ins(1, xid=701), first=True)
    block(collector, 702, ins(10, xid=702), first=True)
    block(collector, 701, ins(2, xid=701))
    # an ordinary small transaction commits between the chunks
    collector.handle(m.Begin(4000, 0, 703))
    collector.handle(ins(20))
    collector.handle(m.Commit(0, 4000, 4008, 0))
    block(collector, 702, ins(11, xid=702))
    commit(collector, 702, 5000)
    commit(collector, 701, 6000)
    assert [(x, lsn) for x, lsn, _, _ in everything.committed] == [(702, 5000), (701, 6000)]
    assert everything.ids(0) == [b"10", b"11"] and everything.ids(1) == [b"1", b"2"]
    assert ("row", 0, (b"20", b"eu")) in everything.plain


def test_a_rolled_back_savepoint_drops_its_rows_and_what_its_children_wrote(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, eu, everything, _ = setup
    # top 800 writes 1; savepoint a (801) writes 2; nested b (802) writes 3, released;
    # a writes 4; ROLLBACK TO a; top writes 5; savepoint c (803) writes 6, kept
    block(
        collector,
        800,
        ins(1, xid=800),
        ins(2, xid=801),
        ins(3, xid=802),
        ins(4, xid=801),
        first=True,
    )
    collector.handle(m.StreamAbort(800, 802))  # Postgres aborts each subxact
    collector.handle(m.StreamAbort(800, 801))
    block(collector, 800, ins(5, xid=800), ins(6, xid=803))
    commit(collector, 800, 9000)
    assert everything.ids() == [b"1", b"5", b"6"] and eu.ids() == [b"1", b"5", b"6"]
    assert collector.stats.subtransaction_aborts == 2


def test_aborting_a_savepoint_that_wrote_nothing_keeps_everything(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, _, everything, _ = setup
    block(collector, 810, ins(1, xid=810), first=True)
    collector.handle(m.StreamAbort(810, 811))
    block(collector, 810, ins(2, xid=810))
    commit(collector, 810, 9100)
    assert everything.ids() == [b"1", b"2"]


def test_a_top_level_abort_discards_the_transaction_and_the_tracker_never_sees_it(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, _ = setup
    block(collector, 820, ins(1, xid=820), ins(2, xid=821), first=True)
    collector.handle(m.StreamAbort(820, 820))
    assert eu.discarded == [820] and everything.discarded == [820]
    assert tracker.last_flushed_of("eu") is None and collector.open_streams == 0
    assert collector.stats.streamed_aborts == 1 and collector.stats.transactions == 0


def test_a_reconnect_forgets_open_streams_and_a_replayed_commit_is_skipped(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, _, everything, _ = setup
    block(collector, 830, ins(1, xid=830), first=True)
    commit(collector, 830, 5000)
    block(collector, 831, ins(2, xid=831), first=True)
    collector.stream_restarted()
    assert 831 in everything.discarded and collector.open_streams == 0
    # Postgres sends both again from their start: 830 is already handled
    block(collector, 830, ins(1, xid=830), first=True)
    commit(collector, 830, 5000)
    block(collector, 831, ins(2, xid=831), first=True)
    commit(collector, 831, 6000)
    assert [(x, lsn) for x, lsn, _, _ in everything.committed] == [(830, 5000), (831, 6000)]
    assert everything.ids() == [b"2"] and collector.stats.transactions_skipped == 1


def test_a_stream_started_again_from_its_first_segment_starts_over(setup) -> None:  # type: ignore[no-untyped-def]
    collector, _, _, everything, _ = setup
    block(collector, 840, ins(1, xid=840), first=True)
    block(collector, 840, ins(1, xid=840), first=True)
    commit(collector, 840, 7000)
    assert everything.ids() == [b"1"]


def test_a_shape_whose_sink_or_snapshot_has_the_transaction_declines_it_at_commit() -> None:
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=lambda: 0.0)
    collector = ShapeLogCollector(tracker)
    done = StreamWriter("done", committed_lsn=6000)
    fenced, fresh = StreamWriter("f"), StreamWriter("n")
    collector.add_shape(shape("done"), done)  # type: ignore[arg-type]
    # snapshot at LSN 8000 that sees xid 850 (committed before it was taken)
    fence = SnapshotFence(8000, xmin=851, xmax=900, xip=frozenset())
    collector.add_shape(shape("f"), fenced, fence=fence)  # type: ignore[arg-type]
    collector.add_shape(shape("n"), fresh)  # type: ignore[arg-type]
    collector.handle(ORDERS)
    block(collector, 850, ins(1, xid=850), first=True)
    commit(collector, 850, 5000)
    assert done.committed == [] and done.discarded == [850]
    assert fenced.committed == [] and fenced.discarded == [850]
    assert fresh.ids() == [b"1"]
    assert tracker.last_flushed_of("done") is None and tracker.last_flushed_of("f") is None


def test_a_snapshot_is_unusable_while_a_stream_that_changed_its_table_is_in_progress(setup) -> None:  # type: ignore[no-untyped-def]
    collector, *_ = setup
    block(collector, 860, ins(1, xid=860), first=True)
    block(collector, 861, m.Insert(OTHER.oid, (b"1",), 861), first=True)
    in_progress = {860, 861}

    def visible(xid: int) -> bool:
        return xid not in in_progress

    # a shape of orders routed from now on would get only the rest of 860
    assert collector.passed_invisible(visible, ORDERS.oid) == [860]
    assert collector.passed_invisible(visible, OTHER.oid) == [861]
    assert sorted(collector.passed_invisible(visible)) == [860, 861]
    # committed before the snapshot (visible): its fence skips it, no problem
    assert collector.passed_invisible(lambda xid: True, ORDERS.oid) == []
    collector.handle(m.StreamAbort(860, 860))
    assert collector.passed_invisible(visible, ORDERS.oid) == []


def test_a_shape_added_during_a_stream_gets_the_rest_of_it() -> None:
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=lambda: 0.0)
    collector = ShapeLogCollector(tracker)
    collector.handle(ORDERS)
    block(collector, 870, first=True)  # the stream has begun, no change of orders yet
    late = StreamWriter("late")
    in_progress = SnapshotFence(100, 870, 871, frozenset({870}))
    collector.add_shape(shape("late"), late, fence=in_progress)  # type: ignore[arg-type]
    block(collector, 870, ins(1, xid=870))
    commit(collector, 870, 5000)
    assert late.ids() == [b"1"]


def test_removing_a_shape_discards_its_part_of_open_streams(setup) -> None:  # type: ignore[no-untyped-def]
    collector, tracker, eu, everything, _ = setup
    block(collector, 880, ins(1, xid=880), first=True)
    collector.remove_shape("eu")
    assert eu.discarded == [880]
    commit(collector, 880, 5000)
    assert eu.committed == [] and everything.ids() == [b"1"]
    assert tracker.last_flushed_of("eu") is None


def test_a_stream_start_inside_an_ordinary_transaction_is_a_protocol_error(setup) -> None:  # type: ignore[no-untyped-def]
    collector, *_ = setup
    collector.handle(m.Begin(100, 0, 1))
    with pytest.raises(ProtocolError, match="Stream Start"):
        collector.handle(m.StreamStart(5, True))


def test_two_phase_messages_are_refused_with_the_reason(setup) -> None:  # type: ignore[no-untyped-def]
    collector, *_ = setup
    with pytest.raises(ProtocolError, match="two-phase"):
        collector.handle(m.BeginPrepare(1, 2, 3, 4, "g"))
