"""Backfill throughput next to ``COPY ... TO /dev/null`` of the same table, in one run.

A table of N rows; ``psql`` copies the shape's query to /dev/null (the floor: what
Postgres needs to produce the rows), then tidemark backfills a new shape on it
(snapshot, parallel COPY chunks into Arrow, Spark writing Parquet, one Delta
commit), timed from the shape's activation to its backfill commit; twice, since the
first backfill in a fresh JVM also loads Spark's Parquet code.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tidemark.demo.postgres import EmbeddedPostgres


def _prepare(pg: EmbeddedPostgres, rows: int) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            "create table bench_items (id bigint primary key, grp int not null, name text,"
            " amount numeric(12,2), created timestamptz)"
        )
        conn.execute("alter table bench_items replica identity full")
        conn.execute(
            "insert into bench_items select g, g %% 10, 'item-' || g, g %% 100000 / 100.0,"
            " '2024-01-01'::timestamptz + g * interval '1 s' from generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("vacuum analyze bench_items")


def _copy_to_devnull(pg: EmbeddedPostgres, query: str) -> float:
    t0 = time.perf_counter()
    with open("/dev/null", "wb") as sink:
        subprocess.run(
            [pg.bin("psql"), pg.dsn(), "-qAt", "-c", f"copy ({query}) to stdout (format csv)"],
            stdout=sink,
            check=True,
        )
    return time.perf_counter() - t0


async def _backfill(pg: EmbeddedPostgres, spark: Any, root: Path, run: int) -> tuple[float, int]:
    from tidemark.app import Service
    from tidemark.settings.config import Settings

    settings = Settings.model_validate(
        {
            "source": {"dsn": pg.dsn(), "slot": f"bench_bf{run}", "publication": f"bench_bf{run}"},
            "sink": {"root": str(root)},
            "http": {"port": 0},
            "log_level": "warning",
            "shapes": [{"name": "all_items", "table": "public.bench_items"}],
        }
    )
    service = Service(settings, spark=spark)
    task = asyncio.create_task(service.run())
    while "all_items" not in service.shapes:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    status = service.shapes["all_items"]
    while status.state != "active":
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    progress = status.backfill
    assert progress is not None and progress.finished_at is not None
    seconds = progress.finished_at - progress.started_at
    rows = progress.rows_done
    service.request_stop()
    await task
    return seconds, rows


def main(rows: int = 1_000_000) -> dict[str, float]:
    from tidemark.spark import build_session

    print(f"== backfill: {rows:,} rows, next to COPY TO /dev/null of the same query ==")
    spark = build_session()
    spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-backfill-"))
    try:
        with EmbeddedPostgres() as pg:
            _prepare(pg, rows)
            query = 'select "id", "grp", "name", "amount", "created" from "public"."bench_items"'
            copy_s = min(_copy_to_devnull(pg, query) for _ in range(2))
            # the first backfill in a fresh JVM pays for loading Spark's Parquet reading
            # and writing code; the second is what a running service sees
            timings = []
            for run in (1, 2):
                seconds, done = asyncio.run(_backfill(pg, spark, root / str(run), run))
                assert done == rows, f"backfilled {done} rows, expected {rows}"
                timings.append(seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"COPY TO /dev/null   {copy_s:7.2f}s  {rows / copy_s:>12,.0f} rows/s")
    for label, seconds in zip(("first (cold JVM)", "second"), timings, strict=True):
        print(
            f"tidemark backfill, {label:<16} {seconds:7.2f}s  {rows / seconds:>12,.0f} rows/s"
            f"  = {copy_s / seconds:.2f}x COPY (target >= 0.5x)"
        )
    backfill_s = timings[1]
    return {
        "copy_s": copy_s,
        "backfill_s": backfill_s,
        "first_backfill_s": timings[0],
        "ratio": copy_s / backfill_s,
    }


if __name__ == "__main__":
    main()
