"""What a Prometheus scrape costs at many shapes: the gauges refreshed from the
service's state (``observability.refresh_metrics``, as housekeeping does) and the text
exposition ``GET /metrics`` serves, with every per-shape series a running service has.

The service's state is given as the values ``Service.facts`` takes (writers with
buffered rows, frontiers, shape states, backfills), and each shape gets what commits and
current-table refreshes add; no Postgres or Spark is needed to measure the metrics
layer (taking the facts is not timed here). Target at 1000 shapes: a scrape under
100 ms, at most 12 series a shape. The refresh runs on the event loop (housekeeping);
the exposition in a worker thread.

Run: ``python -m bench metrics`` (``TIDEMARK_BENCH_SHAPES`` picks the shape counts).
"""

from __future__ import annotations

import os
import time

from prometheus_client import generate_latest

from tidemark.observability import Metrics, refresh_metrics
from tidemark.status.facts import (
    BackfillFacts,
    CollectorFacts,
    FlushFacts,
    Progress,
    ServiceFacts,
    WriterFacts,
)

STATES = ("active", "active", "active", "active", "backfilling", "catching_up", "error")


def stub_facts(shapes: int, metrics: Metrics) -> ServiceFacts:
    """What ``tidemark.app.Service.facts`` gives ``refresh_metrics``, for ``shapes``
    shapes in every state; and the per-shape series that commits and current-table
    refreshes create, added to ``metrics``."""
    names = [f"shape_{i:05d}" for i in range(shapes)]
    flush = FlushFacts(
        buffered_bytes=0,
        memory_budget=1 << 30,
        flush_age_s=0.25,
        waiting_s=None,
        backpressure_waits=0,
        blocked_seconds=0.0,
        stage_jobs=0,
        spooled_bytes=0,
        rounds=0,
        round_shapes=0,
        job_failures=0,
    )
    writers = {
        n: WriterFacts(
            committed_lsn=1000 + i,
            rows_committed=0,
            pending_rows=i % 7 + i % 3,
            pending_bytes=100 * i,
        )
        for i, n in enumerate(names)
    }
    frontiers = {n: 10**9 - i for i, n in enumerate(names)}
    progress = Progress(
        received_lsn=10**9, flushed_lsn=10**9 - 5, applied_lsn=10**9 - 5, frontiers=frontiers
    )
    backfill = BackfillFacts(chunks=3, rows_done=500, rows_estimated=1000)
    for n in names:  # what commits and the keeper add for each shape
        metrics.changes.labels(n).inc(10)
        metrics.commits.labels(n).inc()
        metrics.current_refreshes.labels(n).inc()
        metrics.current_refresh_failures.labels(n)
        metrics.current_lag_bytes.labels(n).set(100)
        metrics.current_lag_seconds.labels(n).set(1.5)
    for kind in ("insert", "update", "delete", "truncate", "snapshot"):
        metrics.changes_by_kind.labels(kind).inc()
    return ServiceFacts(
        phase="streaming",
        progress=progress,
        stream=None,
        flush=flush,
        writers=writers,
        lag_s=dict.fromkeys(frontiers, 0.5),
        states={n: STATES[i % len(STATES)] for i, n in enumerate(names)},
        backfills={n: backfill for i, n in enumerate(names) if i % 2},
        stalled=frozenset(names[:1]),
        holder=(names[0], 4096) if names else None,
        backfill_failures=0,
        claim_invalidations=0,
        collector=CollectorFacts(changes=0, open_streams=0, streamed_commits=0, streamed_aborts=0),
        postgres=None,
    )


def scrape(shapes: int, per_shape: bool = True, rounds: int = 20) -> dict[str, float]:
    """Series, bytes, and the medians over ``rounds`` of the refresh (on the event loop,
    in housekeeping) and of the exposition (``GET /metrics``, in a worker thread)."""
    metrics = Metrics(per_shape=per_shape)
    facts = stub_facts(shapes, metrics)
    refresh_metrics(metrics, facts)
    refreshes, expositions = [], []
    body = b""
    for _ in range(rounds):
        start = time.perf_counter()
        refresh_metrics(metrics, facts)
        middle = time.perf_counter()
        body = generate_latest(metrics.registry)
        refreshes.append(middle - start)
        expositions.append(time.perf_counter() - middle)
    lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    by_shape = sum(1 for line in lines if line.startswith("tidemark_") and "shape=" in line)
    return {
        "shapes": shapes,
        "series": len(lines),
        "series_per_shape": by_shape / shapes if shapes else 0.0,
        "bytes": len(body),
        "refresh_ms": sorted(refreshes)[rounds // 2] * 1000,
        "exposition_ms": sorted(expositions)[rounds // 2] * 1000,
    }


def main() -> list[dict[str, float]]:
    counts = [int(n) for n in os.environ.get("TIDEMARK_BENCH_SHAPES", "10,100,1000").split(",")]
    out = []
    for per_shape in (True, False):
        for shapes in counts:
            found = scrape(shapes, per_shape)
            out.append(found)
            print(
                f"   {shapes:>5} shapes{'' if per_shape else ' (per_shape off)'}: "
                f"{found['series']:.0f} series ({found['series_per_shape']:.1f} a shape), "
                f"{found['bytes'] / 1024:.0f} KiB; refresh {found['refresh_ms']:.1f} ms on the "
                f"event loop, exposition {found['exposition_ms']:.1f} ms in a thread "
                "(target at 1000: < 100 ms, <= 12 a shape)"
            )
    return out


if __name__ == "__main__":
    main()
