"""One large transaction through 4 shapes, with Postgres streaming it while it runs
(``[source] stream_large_transactions = true``, the default) and without: how long
after its COMMIT every shape has it committed, how long the whole run takes, and
what the server spilled to ``pg_replslot/`` or streamed (``pg_stat_replication_slots``).

The server decodes with ``logical_decoding_work_mem = 16MB``; the transaction writes
about 10x that, once in one statement (it runs for about a second, so decoding is
mostly after its commit either way) and once in 24 statements 0.25 s apart (as a
batch job would: streaming overlaps the decoding, routing and buffering with it).
Each variant gets its own slot and sink root, on the same database, and starts from
shapes already backfilled (empty), so every row comes through the stream.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.lsn import Lsn

SHAPES = 4


def _settings(pg: EmbeddedPostgres, root: Path, slot: str, streaming: bool) -> Any:
    from tidemark.settings.config import Settings

    return Settings.model_validate(
        {
            "source": {
                "dsn": pg.dsn(),
                "slot": slot,
                "publication": "bench_pub",
                "stream_large_transactions": streaming,
            },
            "sink": {"root": str(root)},
            "http": {"port": 0},
            "monitor": {"period_s": 0.2},
            "log_level": "warning",
            "shapes": [
                {"name": f"grp_{k}", "table": "public.big_items", "where": f"grp = {k}"}
                for k in range(SHAPES)
            ],
        }
    )


def _slot_stats(dsn: str, slot: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select spill_bytes, stream_bytes from pg_stat_replication_slots where slot_name = %s",
            (slot,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def _run(
    pg: EmbeddedPostgres, spark: Any, streaming: bool, rows: int, pieces: int, first: int
) -> dict[str, float]:
    """``rows`` inserted in one transaction, in ``pieces`` statements 0.25 s apart."""
    from tidemark.app import Service

    slot = f"bench_{'streamed' if streaming else 'spilled'}_{pieces}"
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-streamed-"))
    service = Service(_settings(pg, root, slot, streaming), spark=spark)
    task = asyncio.create_task(service.run())
    try:
        while not service.shapes or any(s.state != "active" for s in service.shapes.values()):
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        started = time.perf_counter()

        def insert() -> int:
            per = rows // pieces
            with psycopg.connect(pg.dsn()) as conn:
                for i in range(pieces):
                    if i:
                        time.sleep(0.25)
                    lo = first + i * per
                    conn.execute(
                        "insert into big_items select g, g %% %s, repeat('x', 200) || g"
                        " from generate_series(%s::bigint, %s::bigint) g",
                        (SHAPES, lo, lo + per - 1),
                    )
                conn.commit()
                row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            return int(Lsn.parse(row[0]))

        end_lsn = await asyncio.to_thread(insert)
        committed_at = time.perf_counter()
        while True:
            if task.done():
                task.result()
            frontiers = service.progress().frontiers
            if len(frontiers) == SHAPES and min(frontiers.values()) >= end_lsn:
                break
            await asyncio.sleep(0.01)
        done = time.perf_counter()
        total = sum(w.rows_committed for w in service.scheduler.writers.values())  # type: ignore[union-attr]
        assert total == rows, f"committed {total} rows, expected {rows}"
        await asyncio.sleep(1.0)  # the walsender reports its slot statistics
        spill, stream = _slot_stats(pg.dsn(), slot)
        return {
            "txn_s": committed_at - started,
            "after_commit_s": done - committed_at,
            "total_s": done - started,
            "spill_mb": spill / 2**20,
            "stream_mb": stream / 2**20,
        }
    finally:
        service.request_stop()
        await task


def main(rows: int = 600_000) -> dict[str, dict[str, float]]:
    from tidemark.spark import build_session

    print(f"== one transaction of {rows:,} rows (~{rows * 230 / 2**20:.0f} MiB) through "
          f"{SHAPES} shapes, streamed while it runs vs sent at its commit ==")  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    pg = EmbeddedPostgres("wheel", settings={"logical_decoding_work_mem": "16MB"}).start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("create table big_items (id bigint primary key, grp int, body text)")
            conn.execute("alter table big_items replica identity full")
            conn.execute("create publication bench_pub for table big_items")
        spark = build_session()
        spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
        first = 10**9
        for pieces, what in ((1, "one statement"), (24, "24 statements, 0.25 s apart")):
            print(f"-- the transaction: {what}")
            for streaming in (True, False):
                label = f"{'streamed' if streaming else 'not streamed'}, {pieces}"
                r = asyncio.run(_run(pg, spark, streaming, rows, pieces, first))
                first += rows
                results[label] = r
                print(
                    f"{'streamed (default)' if streaming else 'not streamed':19s} txn "
                    f"{r['txn_s']:5.1f}s  commit -> all shapes {r['after_commit_s']:5.1f}s  "
                    f"total {r['total_s']:5.1f}s  server spilled {r['spill_mb']:4.0f} MiB, "
                    f"streamed {r['stream_mb']:4.0f} MiB"
                )
            on, off = results[f"streamed, {pieces}"], results[f"not streamed, {pieces}"]
            print(
                f"commit -> all shapes: streamed / not streamed = "
                f"{on['after_commit_s'] / max(off['after_commit_s'], 1e-3):.2f}"
            )
    finally:
        pg.stop()
    return results
