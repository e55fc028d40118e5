"""Cost against the number of shapes: N equality shapes (``grp = k``) on one table,
a steady 5k rows/s in 100-row transactions for 30 s, defaults otherwise (flush age
0.25-1 s, following the flush jobs). For each N: how long until all (empty) shapes are
ready, the ack lag (source commit -> slot ``confirmed_flush_lsn``) p50/p99 during the load,
how long the acknowledgement takes to reach the last commit after the load stops
(drain), Delta commits per second and how many shape batches each Spark job wrote
(flush rounds). Every row inserted must be committed exactly once.

Usage: ``python -m bench shapes`` (N = 10, 100, 1000; ``TIDEMARK_BENCH_SHAPES=10,100``
to choose; ``TIDEMARK_BENCH_MAX_AGE=0.5`` and ``TIDEMARK_BENCH_MIN_AGE=0.5`` to try
other ``flush.max_age_s`` and ``flush.min_age_s``; both the same: a fixed age;
``TIDEMARK_BENCH_WARM=0``: without the service's warm-up of a fresh JVM; an N given
twice, ``TIDEMARK_BENCH_SHAPES=1000,1000``, runs again in the same JVM: a warm pass).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import cpu_s, jvm_pid, sink_format, sink_sync, sink_sync_method
from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.lsn import Lsn

RATE = 5_000  # rows/s
TXN_ROWS = 100
LOAD_S = 30.0
# issue 34's targets, with the section first in a fresh JVM
TARGET_P99_S = {100: 1.0, 1000: 3.0}
TARGET_READY_S = {1000: 15.0}
MAX_AGE = os.environ.get("TIDEMARK_BENCH_MAX_AGE")  # default: the service's own
MIN_AGE = os.environ.get("TIDEMARK_BENCH_MIN_AGE")  # = MAX_AGE: a fixed flush age
# "0": without current-state tables (their refreshes share Spark with the flushes)
CURRENT = os.environ.get("TIDEMARK_BENCH_CURRENT", "1") != "0"
# "0": without the service's warm-up of a fresh JVM (``[spark] warm_up``)
WARM = os.environ.get("TIDEMARK_BENCH_WARM", "1") != "0"


def _settings(
    pg: EmbeddedPostgres, db: str, root: Path | str, shapes: int, extra: dict[str, Any]
) -> Any:
    from tidemark.settings.config import Settings

    data: dict[str, Any] = {
        "source": {"dsn": pg.dsn(db), "slot": f"bench_{db}", "publication": "grp_pub"},
        "sink": {
            "root": str(root),
            "sync": sink_sync(),
            "sync_method": sink_sync_method(),
            "format": sink_format(),
        },
        "http": {"port": 0},
        "monitor": {"period_s": 0.5},
        "current": {"enabled": CURRENT},
        "spark": {"warm_up": WARM},
        "flush": {
            **({"max_age_s": float(MAX_AGE)} if MAX_AGE else {}),
            **({"min_age_s": float(MIN_AGE)} if MIN_AGE else {}),
        },
        "log_level": os.environ.get("TIDEMARK_BENCH_LOG", "warning"),
        "shapes": [
            {"name": f"g{k}", "table": "public.grp_items", "where": f"grp = {k}"}
            for k in range(shapes)
        ],
    }
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return Settings.model_validate(data)


def _prepare(pg: EmbeddedPostgres, db: str) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"create database {db}")
    with psycopg.connect(pg.dsn(db), autocommit=True) as conn:
        conn.execute("create table grp_items (id bigint primary key, grp int not null, body text)")
        conn.execute("alter table grp_items replica identity full")
        conn.execute("create publication grp_pub for table grp_items")


def _load(dsn: str, shapes: int, commits: list[tuple[int, float]]) -> int:
    """5k rows/s in 100-row transactions for 30 s; returns the rows written."""
    interval = TXN_ROWS / RATE
    next_id = 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + LOAD_S
        due = time.monotonic()
        while time.monotonic() < deadline:
            with conn.transaction():
                conn.execute(
                    "insert into grp_items select g, g %% %s, 'x'"
                    " from generate_series(%s::bigint, %s::bigint) g",
                    (shapes, next_id, next_id + TXN_ROWS - 1),
                )
                before = conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()
            commits.append((int(Lsn.parse(before[0])), time.time()))  # type: ignore[index]
            next_id += TXN_ROWS
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))
    return next_id - 1


async def _run(
    pg: EmbeddedPostgres,
    spark: Any,
    shapes: int,
    root: str | None = None,
    extra: dict[str, Any] | None = None,
    tag: str = "",
    requests: Callable[[], dict[str, int]] | None = None,
) -> dict[str, float]:
    """One run of N shapes; ``root`` (default: a fresh temporary folder) and ``extra``
    settings (by section) for the object-store section; ``tag`` tells the run's
    database apart from another run of the same N; ``requests``: counters read at the
    start and the end of the load (their differences returned as ``req <name>``)."""
    from tidemark.app import Service

    db = f"shapes_{shapes}{tag}"
    _prepare(pg, db)
    dsn = pg.dsn(db)
    local = root is None
    where: Path | str = (
        Path(tempfile.mkdtemp(prefix=f"tidemark-bench-shapes-{shapes}-")) if root is None else root
    )
    service = Service(_settings(pg, db, where, shapes, extra or {}), spark=spark)
    started = time.perf_counter()
    task = asyncio.create_task(service.run())
    try:
        while len(service.shapes) < shapes or any(
            s.state != "active" for s in service.shapes.values()
        ):
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        ready_s = time.perf_counter() - started

        acks: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    row = conn.execute(
                        "select confirmed_flush_lsn::text from pg_replication_slots"
                        " where slot_name = %s",
                        (f"bench_{db}",),
                    ).fetchone()
                    acks.append((time.time(), int(Lsn.parse(row[0]))))  # type: ignore[index]
                    time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        scheduler = service.scheduler
        assert scheduler is not None
        stats = scheduler.stats
        commits0 = stats.commits
        rounds0, members0 = getattr(stats, "rounds", 0), getattr(stats, "round_shapes", 0)
        commits: list[tuple[int, float]] = []
        counted = requests() if requests else {}
        jvm = jvm_pid(spark)
        cpu0 = time.process_time(), cpu_s(jvm)
        load_started = time.perf_counter()
        rows = await asyncio.to_thread(_load, dsn, shapes, commits)
        load_ended = time.time()
        last_lsn = commits[-1][0]
        while not acks or acks[-1][1] <= last_lsn:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        drain_s = time.time() - load_ended
        if requests:
            ended = requests()
            counted = {k: ended.get(k, 0) - counted.get(k, 0) for k in ended}
        elapsed = time.perf_counter() - load_started
        python_cpu, jvm_cpu = time.process_time() - cpu0[0], cpu_s(jvm) - cpu0[1]
        stop.set()
        sampler.join()
        committed = sum(w.rows_committed for w in scheduler.writers.values())
        assert committed == rows, f"{shapes} shapes: committed {committed} rows of {rows}"
        lags = []
        j = 0
        for lsn, at in commits:
            while j < len(acks) and acks[j][1] <= lsn:
                j += 1
            if j < len(acks):
                lags.append(acks[j][0] - at)
        lags.sort()
        rounds = getattr(stats, "rounds", 0) - rounds0
        return {
            "shapes": shapes,
            "ready_s": ready_s,
            "lag_p50_s": statistics.median(lags),
            "lag_p99_s": lags[int(0.99 * (len(lags) - 1))],
            "drain_s": drain_s,
            "commits_s": (scheduler.stats.commits - commits0) / elapsed,
            "per_round": (getattr(stats, "round_shapes", 0) - members0) / rounds if rounds else 0.0,
            "rows": rows,
            "rounds": rounds,
            # the CPU of the load and its drain, in cores: this process (tidemark's
            # Python, and the load's client) and the JVM
            "python_cores": python_cpu / elapsed,
            "jvm_cores": jvm_cpu / elapsed,
            **{f"req {k}": float(v) for k, v in counted.items() if v},
        }
    finally:
        service.request_stop()
        try:
            await task
        finally:
            if local:
                shutil.rmtree(where, ignore_errors=True)


def main() -> list[dict[str, float]]:
    from tidemark.spark import build_session

    counts = [int(n) for n in os.environ.get("TIDEMARK_BENCH_SHAPES", "10,100,1000").split(",")]
    print(
        f"== shapes: N equality shapes on one table, {RATE:,} rows/s in {TXN_ROWS}-row"
        f" transactions for {LOAD_S:.0f} s, default flush settings, {sink_format()} tables =="
    )
    spark = build_session()
    spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
    results = []
    with EmbeddedPostgres() as pg:
        print(
            f"{'shapes':>6} {'ready':>8} {'lag p50':>8} {'lag p99':>8} {'drain':>7}"
            f" {'commits/s':>10} {'shapes/job':>10} {'cpu py+jvm':>11}"
        )
        for k, n in enumerate(counts):
            # (an N given again runs again in the same JVM, warm: its own database)
            out = asyncio.run(_run(pg, spark, n, tag="" if n not in counts[:k] else f"_{k}"))
            results.append(out)
            targets = []
            if n in TARGET_P99_S:
                targets.append(f"p99 target <= {TARGET_P99_S[n]:.0f} s")
            if n in TARGET_READY_S:
                targets.append(f"ready target <= {TARGET_READY_S[n]:.0f} s")
            verdict = f"  ({', '.join(targets)})" if targets else ""
            print(
                f"{n:>6} {out['ready_s']:>7.1f}s {out['lag_p50_s']:>7.2f}s"
                f" {out['lag_p99_s']:>7.2f}s {out['drain_s']:>6.1f}s {out['commits_s']:>10.1f}"
                f" {out['per_round']:>10.1f} {out['python_cores']:>5.2f}+{out['jvm_cores']:<5.2f}"
                f"{verdict}"
            )
    return results


if __name__ == "__main__":
    main()
