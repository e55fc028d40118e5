"""The stream's Python work per change, without Postgres or Spark: pgoutput messages
decoded (``PgOutputDecoder``), routed and converted (``ShapeLogCollector``) into ten
shapes' writers (``ShapeWriter``: buffers, transaction alignment, the FlushTracker),
as the end-to-end sections' service does between the socket and a flush.

The table and shapes are the end-to-end sections': ``bench_items(id int8, grp int4,
name text, note text)`` with shapes ``grp = 0`` .. ``grp = 9``, rows spread over
them, with the garbage collector's thresholds the service sets at its start
(``allocators.tune_collector``). Two workloads: ``small`` (transactions of 10 rows,
so each touches every shape with one row: the per-transaction work of each writer
counts for every row) and ``bulk`` (transactions of 10,000 rows). The messages are
built up front; the best of five runs is reported, in microseconds a row, on one core.

Run: ``python -m bench collector`` (about 20 s).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

import pgoutput_bytes as pg

from tidemark.allocators import tune_collector
from tidemark.flush.tracker import FlushTracker
from tidemark.lsn import LogOffset
from tidemark.pgoutput import messages as m
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.shapes.model import ShapeDefinition, bind
from tidemark.sink.schema import ColumnSpec
from tidemark.stream.collector import ShapeLogCollector
from tidemark.writers.writer import ShapeWriter

INT8, INT4, TEXT = 20, 23, 25
OID = 16384
RELATION = m.Relation(
    OID,
    "public",
    "bench_items",
    "f",
    (
        m.RelationColumn("id", INT8, -1, True),
        m.RelationColumn("grp", INT4, -1, True),
        m.RelationColumn("name", TEXT, -1, True),
        m.RelationColumn("note", TEXT, -1, True),
    ),
)
SHAPES = 10
RUNS = 5


class _Table:
    """The little of a ``ChangelogTable`` a writer asks for on the stream side."""

    def __init__(self, shape: str) -> None:
        self.shape = shape

    def op_type(self) -> None:
        return None

    def committed_lsn(self) -> None:
        return None


def payloads(rows: int, txn_rows: int) -> list[bytes]:
    out = [pg.encode(RELATION)]
    lsn = 0x1000000
    for first in range(0, rows, txn_rows):
        lsn += 0x1000
        out.append(pg.begin(lsn, 0, first // txn_rows + 1000))
        for i in range(first, min(rows, first + txn_rows)):
            new = [str(i).encode(), str(i % SHAPES).encode(), f"item-{i}".encode(), b"a note"]
            out.append(pg.insert(OID, new))
        out.append(pg.commit(lsn, lsn + 8, 0))
    return out


def one_run(messages: list[bytes]) -> tuple[float, int]:
    """Seconds to take ``messages`` through, and the rows buffered."""
    tracker = FlushTracker(lambda lsn, _caught_up: None, clock=time.monotonic)
    collector = ShapeLogCollector(tracker)
    columns = [ColumnSpec(c.name, c.type_oid, c.type_modifier) for c in RELATION.columns]
    writers = []

    def report(shape: str, offset: LogOffset) -> None:
        tracker.handle_flush_notification(shape, offset)

    for k in range(SHAPES):
        definition = ShapeDefinition(
            name=f"grp_{k}", table="public.bench_items", where=f"grp = {k}"
        )
        writer = ShapeWriter(_Table(definition.name), columns, report)  # type: ignore[arg-type]
        writers.append(writer)
        collector.add_shape(bind(definition, RELATION, ["id"]), writer)
    decode, handle = PgOutputDecoder(4).decode, collector.handle
    started = time.perf_counter()
    for payload in messages:
        handle(decode(payload), len(payload))
    seconds = time.perf_counter() - started
    return seconds, sum(w.buffer.ready_rows for w in writers)


def main(rows: int = 200_000) -> dict[str, float]:
    print(f"== the stream's Python work: {rows:,} inserts through {SHAPES} shapes ==")
    tune_collector()  # as the service does at its start
    out: dict[str, float] = {}
    for name, txn_rows in (("small", 10), ("bulk", 10_000)):
        messages = payloads(rows, txn_rows)
        best = float("inf")
        for _ in range(RUNS):
            seconds, buffered = one_run(messages)
            assert buffered == rows, (buffered, rows)
            best = min(best, seconds)
        out[f"{name}_us_per_row"] = best / rows * 1e6
        print(
            f"{name:6} (transactions of {txn_rows:,} rows): {best:.3f}s"
            f" = {best / rows * 1e6:.2f} us a row (decode, route, buffer; best of {RUNS})"
        )
    return out


if __name__ == "__main__":
    main()
