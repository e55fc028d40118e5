"""Sink throughput: rows/s committed per shape by batch size, and commits/s with many
shapes flushing at once, through the real path (Arrow build -> Spark Parquet ->
Delta commit), with a local Spark session.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from tidemark.flush.tracker import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset
from tidemark.sink.delta.table import ShapeTable
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.spark import build_session
from tidemark.writers.scheduler import FlushPolicy, FlushScheduler
from tidemark.writers.writer import ShapeWriter

COLUMNS = [
    ColumnSpec("id", 20),
    ColumnSpec("name", 25),
    ColumnSpec("created", 1184),
    ColumnSpec("amount", 1700, (12 << 16 | 2) + 4),
]


def _row(i: int) -> tuple[bytes, ...]:
    return (
        str(i).encode(),
        f"item-{i}-abcdefghij".encode(),
        b"2024-01-01 00:00:00+00",
        f"{i % 100000 / 100:.2f}".encode(),
    )


class _Stream:
    def __init__(self, root: Path, shapes: list[str]) -> None:
        self.tracker = FlushTracker(lambda lsn, _caught_up: None, clock=time.monotonic)
        self.writers = {}
        for shape in shapes:
            table = ShapeTable(root, shape)
            table.create(table_schema(COLUMNS), ["id"])
            self.writers[shape] = ShapeWriter(
                table, COLUMNS, self.tracker.handle_flush_notification
            )
        self.lsn = 0

    def txn(self, rows_per_shape: dict[str, int], start_id: int) -> None:
        self.lsn += 1000
        op = 0
        for shape, n in rows_per_shape.items():
            w = self.writers[shape]
            w.begin_txn(self.lsn, 1, 0)
            for i in range(start_id, start_id + n):
                w.append(op, "insert", _row(i), None, 60)
                op += 1
        last = LogOffset(self.lsn, op)
        self.tracker.handle_txn_fragment(CommitFragment(last), list(rows_per_shape))
        for shape in rows_per_shape:
            self.writers[shape].end_txn(last)


async def _flush(spark, stream: _Stream, concurrency: int) -> float:  # type: ignore[no-untyped-def]
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=3600, concurrency=concurrency))
    for w in stream.writers.values():
        scheduler.add(w)
    t0 = time.perf_counter()
    await scheduler.flush_all()
    return time.perf_counter() - t0


def main() -> dict[str, float]:
    print("== sink: Arrow -> Spark Parquet -> Delta commit (local[2]) ==")
    spark = build_session()
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-sink-"))
    out: dict[str, float] = {}
    try:
        warm = _Stream(root / "warm", ["w"])
        warm.txn({"w": 10_000}, 0)
        asyncio.run(_flush(spark, warm, 1))
        print(f"{'batch rows':>12} {'seconds':>9} {'rows/s':>12}")
        for n in (1_000, 10_000, 100_000, 1_000_000):
            stream = _Stream(root / f"b{n}", ["s"])
            for start in range(0, n, 50_000):
                stream.txn({"s": min(50_000, n - start)}, start)
            seconds = asyncio.run(_flush(spark, stream, 1))
            out[f"rows_per_s_{n}"] = n / seconds
            out[f"seconds_{n}"] = seconds
            print(f"{n:>12,} {seconds:>9.2f} {n / seconds:>12,.0f}")
        print(f"per-commit overhead (1k-row batch): {out['seconds_1000'] * 1000:.0f} ms")
        for shapes in (10, 100):
            names = [f"s{i}" for i in range(shapes)]
            stream = _Stream(root / f"c{shapes}", names)
            stream.txn(dict.fromkeys(names, 100), 0)
            seconds = asyncio.run(_flush(spark, stream, 2))
            out[f"commits_per_s_{shapes}"] = shapes / seconds
            print(
                f"{shapes} shapes flushing at once (2 concurrent jobs): {shapes / seconds:.1f} "
                f"commits/s ({seconds:.1f}s)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()
