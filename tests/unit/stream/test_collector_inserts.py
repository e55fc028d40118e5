"""The collector's insert path (``ShapeLogCollector._insert``) against the general one
(``_deliver`` of ``shapes.convert``'s items): the same streams give every writer the same
calls, the same counts and the same resyncs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.continuity.fence import SnapshotFence
from tidemark.flush.tracker import FlushTracker
from tidemark.lsn import LogOffset
from tidemark.pgoutput import messages as m
from tidemark.shapes.convert import convert
from tidemark.shapes.model import ShapeDefinition, bind
from tidemark.stream.collector import ShapeLogCollector

INT4, TEXT, DATE = 23, 25, 1082
ITEMS = m.Relation(
    16500,
    "public",
    "items",
    "f",
    (
        m.RelationColumn("id", INT4, -1, True),
        m.RelationColumn("region", TEXT, -1, True),
        m.RelationColumn("day", DATE, -1, True),
        m.RelationColumn("note", TEXT, -1, True),
    ),
)

# every kind of routing: always, a lookup, a lookup with a residual, IN, a scanned
# predicate, one whose values can fail (a BC date), a column list
SHAPES = {
    "everything": None,
    "eu": "region = 'eu'",
    "eu_small": "region = 'eu' and id < 20",
    "americas": "region in ('us', 'br')",
    "big": "id > 30",
    "recent": "day > '2020-01-01'",
    "notes": None,
}


@dataclass
class Recording:
    name: str
    committed_lsn: int | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> bool:
        if self.committed_lsn is not None and lsn <= self.committed_lsn:
            return False
        self.calls.append(("begin", lsn, xid))
        return True

    def append(self, op, kind, values, unchanged, size_hint) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("row", op, kind, values, unchanged, size_hint))

    def end_txn(self, last: LogOffset) -> None:
        self.calls.append(("end", last))

    def abort_txn(self) -> None:
        self.calls.append(("abort",))


def _collector(general: bool) -> tuple[ShapeLogCollector, dict[str, Recording], list[str]]:
    resyncs: list[str] = []
    collector = ShapeLogCollector(
        FlushTracker(lambda lsn, _caught_up: None, clock=lambda: 0.0),
        on_resync=lambda r: resyncs.append(r.shape),
    )
    if general:  # every insert through convert's items, as before the insert path

        def insert(txn: Any, index: Any, change: m.Insert, op: int, size: int) -> None:
            collector._deliver(txn, convert(index, change), op, size)

        collector._insert = insert  # type: ignore[method-assign]
    writers: dict[str, Recording] = {}
    for name, where in SHAPES.items():
        columns = ("id", "note") if name == "notes" else None
        definition = ShapeDefinition(name=name, table="public.items", where=where, columns=columns)
        # one sink has transactions up to 400, one shape's snapshot holds some
        writer = writers[name] = Recording(name, committed_lsn=400 if name == "big" else None)
        fence = SnapshotFence(300, xmin=10, xmax=15, xip=frozenset({12})) if name == "eu" else None
        collector.add_shape(bind(definition, ITEMS, ["id"]), writer, fence=fence)  # type: ignore[arg-type]
    collector.handle(ITEMS)
    return collector, writers, resyncs


_values = st.tuples(
    st.integers(0, 50).map(lambda i: str(i).encode()),
    st.sampled_from([b"eu", b"us", b"br", b"asia", None]),
    st.sampled_from([b"2019-05-01", b"2024-02-29", b"0044-03-15 BC", None]),
    st.sampled_from([b"n", b"", None, m.UNCHANGED_TOAST]),
)


@st.composite
def _change(draw: st.DrawFn) -> m.Message:
    kind = draw(st.sampled_from(["I", "I", "I", "U", "D"]))
    new = draw(_values)
    if kind == "I":
        return m.Insert(ITEMS.oid, tuple(v if v is not m.UNCHANGED_TOAST else b"t" for v in new))
    if kind == "U":
        return m.Update(ITEMS.oid, draw(_values), "O", new)
    return m.Delete(ITEMS.oid, draw(_values), "O")


_txns = st.lists(
    st.tuples(st.integers(5, 20), st.lists(_change(), min_size=0, max_size=6)),
    min_size=1,
    max_size=8,
)


def _run(general: bool, txns: list[tuple[int, list[m.Message]]]) -> tuple[Any, ...]:
    collector, writers, resyncs = _collector(general)
    for n, (xid, changes) in enumerate(txns):
        lsn = 100 * (n + 1)
        collector.handle(m.Begin(lsn, 0, xid))
        for change in changes:
            collector.handle(change, 17)
        collector.handle(m.Commit(0, lsn, lsn + 8, 0))
    stats = collector.stats
    return (
        {name: w.calls for name, w in writers.items()},
        resyncs,
        stats.rows_routed,
        stats.changes,
    )


@settings(max_examples=300, deadline=None)
@given(_txns)
def test_the_insert_path_delivers_what_the_general_one_does(txns) -> None:  # type: ignore[no-untyped-def]
    assert _run(False, txns) == _run(True, txns)


def test_an_insert_the_predicate_cannot_evaluate_resyncs_that_shape_only() -> None:
    # given a BC date, which the date predicate cannot compare
    txns = [(20, [m.Insert(ITEMS.oid, (b"40", b"eu", b"0044-03-15 BC", b"n"))])]
    writers_calls, resyncs, routed, _ = _run(False, txns)
    # then that shape resyncs, and every other matching shape gets the row
    assert resyncs == ["recent"]
    assert routed == 3  # everything, eu (not fenced at 100: xid 20 >= xmax), notes
    assert [c[0] for c in writers_calls["everything"]] == ["begin", "row", "end"]
    assert writers_calls["big"] == []  # its sink has LSN 100 already
    assert writers_calls["recent"] == []
