"""End to end: N changes through 10 shapes to committed Delta tables, acknowledged,
next to pg_recvlogical reading the same WAL in the same run; then the ack lag
(source commit -> slot confirmed_flush_lsn) at a steady 5k rows/s.

A first run of tidemark creates the slot and backfills the (still empty) shapes, then
stops; the slot is copied for pg_recvlogical; then the workload is written. Both
readers start at the same confirmed position and read the same WAL to the same end,
and every row reaches tidemark through the stream (not a snapshot). The Spark
session is started (and warmed) before timing: its ~10 s start is a one-off of a
long-running service, not a per-change cost.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import sink_format, sink_sync, sink_sync_method
from tidemark.embedded import EmbeddedPostgres
from tidemark.lsn import Lsn, format_lsn

SHAPES = 10


def _prepare(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            "create table bench_items (id bigint primary key, grp int not null, name text,"
            " amount numeric(12,2), created timestamptz)"
        )
        conn.execute("alter table bench_items replica identity full")
        conn.execute("create publication bench_pub for table bench_items")


def _workload(pg: EmbeddedPostgres, rows: int, txn_rows: int = 10_000) -> int:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        for start in range(0, rows, txn_rows):
            conn.execute(
                "insert into bench_items select g, g %% %s, 'item-' || g,"
                " g %% 100000 / 100.0, '2024-01-01'::timestamptz + g * interval '1 s'"
                " from generate_series(%s::bigint, %s::bigint) g",
                (SHAPES, start + 1, min(rows, start + txn_rows)),
            )
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert end is not None
    return int(Lsn.parse(end[0]))


async def _backfill_empty(pg: EmbeddedPostgres, spark: Any, root: Path) -> None:
    """First run: creates the slot and backfills the (empty) shapes, then stops."""
    from tidemark.app import Service

    service = Service(_settings(pg, root), spark=spark)
    task = asyncio.create_task(service.run())
    while not service.shapes or any(s.state != "active" for s in service.shapes.values()):
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    service.request_stop()
    await task


def _recvlogical(pg: EmbeddedPostgres, slot: str, end_lsn: int) -> float:
    args = [
        pg.bin("pg_recvlogical"),
        "-d",
        pg.dsn(),
        "--slot",
        slot,
        "--start",
        "-E",
        str(Lsn(end_lsn)),
        "-o",
        "proto_version=1",
        "-o",
        "publication_names=bench_pub",
        "-f",
        "/dev/null",
        "--no-loop",
        "-s",
        "10",
    ]
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0


def _settings(pg: EmbeddedPostgres, root: Path) -> Any:
    from tidemark.config import Settings

    return Settings.model_validate(
        {
            "source": {"dsn": pg.dsn(), "slot": "tidemark_bench", "publication": "bench_pub"},
            "sink": {
                "root": str(root),
                "sync": sink_sync(),
                "sync_method": sink_sync_method(),
                "format": sink_format(),
            },
            "http": {"port": 0},
            "flush": {"max_age_s": 1.0, "max_rows": 250_000},
            "monitor": {"period_s": 0.2},
            "log_level": "warning",
            "shapes": [
                {"name": f"grp_{k}", "table": "public.bench_items", "where": f"grp = {k}"}
                for k in range(SHAPES)
            ],
        }
    )


def _confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
            (slot,),
        ).fetchone()
    return int(Lsn.parse(row[0])) if row and row[0] else 0


async def _through(
    pg: EmbeddedPostgres, spark: Any, root: Path, end_lsn: int, end_rows: int
) -> dict[str, float]:
    from tidemark.app import Service

    service = Service(_settings(pg, root), spark=spark)
    t0 = time.perf_counter()
    task = asyncio.create_task(service.run())
    while True:
        if task.done():
            task.result()
        frontiers = service.progress().frontiers
        if len(frontiers) == SHAPES and min(frontiers.values()) >= end_lsn:
            break
        await asyncio.sleep(0.02)
    committed = time.perf_counter() - t0
    while _confirmed(pg.dsn(), "tidemark_bench") < end_lsn:
        await asyncio.sleep(0.02)
    acked = time.perf_counter() - t0
    rows = sum(w.rows_committed for w in service.scheduler.writers.values())  # type: ignore[union-attr]
    assert rows == end_rows, f"committed {rows} rows through the stream, expected {end_rows}"
    commits = service.scheduler.stats.commits  # type: ignore[union-attr]
    lag = await _ack_lag(pg, service)
    service.request_stop()
    await task
    return {"committed_s": committed, "acked_s": acked, "rows": rows, "commits": commits, **lag}


async def _ack_lag(pg: EmbeddedPostgres, service: Any, rate: int = 5_000,
                   seconds: float = 20.0, txn_rows: int = 100) -> dict[str, float]:  # fmt: skip
    """Commit -> confirmed_flush_lsn for transactions written at a steady rate."""
    dsn = pg.dsn()
    commits: list[tuple[int, float]] = []  # (LSN just before the commit record, wall time)
    acks: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "select confirmed_flush_lsn::text from pg_replication_slots"
                    " where slot_name = 'tidemark_bench'"
                ).fetchone()
                acks.append((time.time(), int(Lsn.parse(row[0]))))  # type: ignore[index]
                time.sleep(0.01)

    def write() -> None:
        interval = txn_rows / rate
        next_id = 10**9
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + seconds
            due = time.monotonic()
            while time.monotonic() < deadline:
                with conn.transaction():
                    conn.execute(
                        "insert into bench_items select g, g %% 10, 'lag', 1, now()"
                        " from generate_series(%s::bigint, %s::bigint) g",
                        (next_id, next_id + txn_rows - 1),
                    )
                    before = conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()
                commits.append((int(Lsn.parse(before[0])), time.time()))  # type: ignore[index]
                next_id += txn_rows
                due += interval
                time.sleep(max(0.0, due - time.monotonic()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    await asyncio.to_thread(write)
    await asyncio.sleep(8)
    stop.set()
    sampler.join()
    lags = []
    j = 0
    for lsn, at in commits:
        while j < len(acks) and acks[j][1] <= lsn:
            j += 1
        if j < len(acks):
            lags.append(acks[j][0] - at)
    lags.sort()
    return {
        "lag_txns": len(lags),
        "lag_p50_s": statistics.median(lags) if lags else float("nan"),
        "lag_p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else float("nan"),
        "lag_rate_rows_s": rate,
    }


def main(rows: int = 1_000_000) -> dict[str, float]:
    from tidemark.spark import build_session

    print(
        f"== end to end: {rows:,} inserts through {SHAPES} shapes to committed "
        f"{sink_format()} tables =="
    )
    spark = build_session()
    spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-e2e-"))
    try:
        with EmbeddedPostgres() as pg:
            _prepare(pg)
            # shapes exist (backfilled, empty) before the workload: every row then comes
            # through the stream, which is what this measures
            asyncio.run(_backfill_empty(pg, spark, root))
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                conn.execute("select pg_copy_logical_replication_slot('tidemark_bench', 'rl')")
            end = _workload(pg, rows)
            recv = _recvlogical(pg, "rl", end)
            out = asyncio.run(_through(pg, spark, root, end, rows))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["recvlogical_s"] = recv
    out["ratio_committed"] = recv / out["committed_s"]
    out["ratio_acked"] = recv / out["acked_s"]
    print(f"end LSN {format_lsn(end)}")
    print(f"pg_recvlogical           {recv:7.2f}s  {rows / recv:>10,.0f} rows/s")
    print(
        f"tidemark, committed      {out['committed_s']:7.2f}s  {rows / out['committed_s']:>10,.0f}"
        f" rows/s  = {out['ratio_committed']:.2f}x pg_recvlogical ({out['commits']:.0f} commits)"
    )
    print(
        f"tidemark, acknowledged   {out['acked_s']:7.2f}s  {rows / out['acked_s']:>10,.0f} rows/s"
        f"  = {out['ratio_acked']:.2f}x pg_recvlogical (target >= 0.5x)"
    )
    print(
        f"ack lag at {out['lag_rate_rows_s']:,.0f} rows/s ({out['lag_txns']:.0f} txns): "
        f"p50 {out['lag_p50_s']:.2f}s  p99 {out['lag_p99_s']:.2f}s"
    )
    return out


if __name__ == "__main__":
    main()
