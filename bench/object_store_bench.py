"""An ``s3://`` sink root against local disk, in the same run: the ``shapes`` workload
(N equality shapes, 5k rows/s in 100-row transactions for 30 s) with Delta tables on
local disk, then on a real S3 server (S3Proxy, started here) behind Toxiproxy adding
20 ms to every reply, as a region's S3 does. Current-state tables are off in both, so
the two runs measure the stream's rounds alone; both in one Spark session with the
task slots tidemark gives a root on an object store (``local[32]``).

Printed per N: ready time, ack lag p50/p99, drain, and the S3 run's p99 against the
local one's (issue 52's goal: at most 2x at 1000 shapes); then the requests the S3 run
made per flush round, by kind: Spark's through S3A (its own counters) and tidemark's
(``tidemark.state.objectstore``: state files, log entries, listings, footers). Needs
``make objectstore`` (S3Proxy's jar, Toxiproxy, the S3A jars).

First, ``e2e``'s bulk workload (1M rows, 10 shapes; ``TIDEMARK_BENCH_E2E_ROWS``, 0 to
leave it out) on local disk and then on the store: the throughput to acknowledged of
both and their ratio (issue 52's goal: at least 0.67x).

Usage: ``python -m bench object-store`` (N = 100, 1000; ``TIDEMARK_BENCH_SHAPES`` to
choose; ``TIDEMARK_BENCH_S3_SERVER=versitygw`` for the tests' other server instead of
S3Proxy).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from bench import shapes_bench
from tidemark.demo.postgres import EmbeddedPostgres

LATENCY_MS = 20
TARGET_P99_RATIO = 2.0
TARGET_E2E_RATIO = 0.67
BUCKET = "bench"


def _s3a_counters(spark: Any) -> dict[str, int]:
    """S3A's request counters of the session's filesystem for the bench's bucket."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(f"s3a://{BUCKET}/"), conf)
    counters = fs.getIOStatistics().counters()
    wanted = (
        "object_put_request",
        "object_list_request",
        "object_metadata_request",
        "action_http_get_request",
        "object_delete_request",
        "multipart_upload_completed",
    )
    return {name: int(counters.get(name) or 0) for name in wanted}


SERVER_NAMES = {"s3proxy": "S3Proxy", "versitygw": "versitygw"}


def main() -> list[dict[str, float]]:
    from tests.integration.object_store_support import object_store

    from tidemark.spark import (
        build_session,
        configure_s3a,
        object_store_master,
        s3a_jars,
        with_s3a,
    )
    from tidemark.state import objectstore

    counts = [int(n) for n in os.environ.get("TIDEMARK_BENCH_SHAPES", "100,1000").split(",") if n]
    kind = os.environ.get("TIDEMARK_BENCH_S3_SERVER", "s3proxy")
    print(
        f"== object-store: the shapes workload with Delta tables on local disk, then on "
        f"{SERVER_NAMES[kind]} behind Toxiproxy (+{LATENCY_MS} ms a reply), one Spark "
        "session =="
    )
    # the master tidemark runs with on an object store (local[32]: tidemark.spark
    # .object_store_master), for the disk run too: one session, one JVM
    spark = build_session(object_store_master("local[2]"), conf=with_s3a({}, s3a_jars()))
    spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
    results: list[dict[str, float]] = []
    workdir = Path(tempfile.mkdtemp(prefix="tidemark-bench-s3-"))
    with object_store(workdir, BUCKET, kind) as (server, proxy), EmbeddedPostgres() as pg:
        proxy.latency(LATENCY_MS)
        s3 = {
            "endpoint": proxy.endpoint,
            "region": "us-east-1",
            "path_style": True,
            "access_key_id": server.identity,
            "secret_access_key": server.credential,
        }
        # (S3A's filesystem for the bucket is made, and cached, by the first use)
        configure_s3a(spark, BUCKET, objectstore.S3Access(**s3).hadoop_conf())
        rows = int(os.environ.get("TIDEMARK_BENCH_E2E_ROWS", "1000000"))
        if rows:
            results.append(_e2e_pair(spark, s3, rows))
        print(
            f"{'shapes':>6} {'root':>5} {'ready':>8} {'lag p50':>8} {'lag p99':>8} {'drain':>7}"
            f" {'commits/s':>10} {'shapes/job':>10}"
        )
        for n in counts:
            local = {"lag_p99_s": 0.0}
            if os.environ.get("TIDEMARK_BENCH_DISK", "1") != "0":  # ("0": the S3 run only)
                local = asyncio.run(
                    shapes_bench._run(pg, spark, n, extra={"current": {"enabled": False}}, tag="l")
                )
                _row(n, "disk", local)
            root = f"s3://{BUCKET}/{secrets.token_hex(3)}/shapes-{n}"

            def requests() -> dict[str, int]:
                return {
                    **objectstore.requests_made(),
                    **{f"S3A {k}": v for k, v in _s3a_counters(spark).items()},
                }

            remote = asyncio.run(
                shapes_bench._run(
                    pg,
                    spark,
                    n,
                    root=root,
                    extra={"current": {"enabled": False}, "s3": s3},
                    tag="s",
                    requests=requests,
                )
            )
            ratio = remote["lag_p99_s"] / local["lag_p99_s"] if local["lag_p99_s"] else 0.0
            _row(n, "s3", remote, f"  p99 {ratio:.2f}x disk (target <= {TARGET_P99_RATIO:.0f}x)")
            rounds = max(1.0, remote.get("rounds", 0.0))
            counted = {k[4:]: v for k, v in remote.items() if k.startswith("req ")}
            print(
                f"{'':>13} during the load, per flush round ({rounds:.0f} rounds): "
                + ", ".join(
                    f"{k.replace('object_', '').replace('_request', '')} {v / rounds:.1f}"
                    for k, v in sorted(counted.items())
                )
            )
            results.append({"shapes": n, "p99_ratio": ratio, **remote})
    return results


def _e2e(spark: Any, root: str, extra: dict[str, Any], rows: int) -> dict[str, float]:
    """``e2e_bench``'s bulk workload (``rows`` inserts in 10,000-row transactions, 10
    shapes) on a fresh PostgreSQL, through the service to acknowledged on ``root``."""
    from bench import e2e_bench

    with EmbeddedPostgres() as pg:
        e2e_bench._prepare(pg, "bulk")
        asyncio.run(e2e_bench._backfill_empty(pg, spark, root, extra))
        end = e2e_bench._workload(pg, rows)
        return asyncio.run(
            e2e_bench._through(pg, spark, root, end, rows, with_lag=False, extra=extra)
        )


def _e2e_pair(spark: Any, s3: dict[str, Any], rows: int) -> dict[str, float]:
    """The e2e bulk run on local disk, then on the store: throughput and their ratio
    (issue 52's goal: the store at least 0.67x local disk)."""
    off = {"current": {"enabled": False}}
    print(f"e2e bulk: {rows:,} rows in 10,000-row transactions through 10 shapes")
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-e2e-disk-") as folder:
        disk = _e2e(spark, folder, off, rows)
    remote = _e2e(spark, f"s3://{BUCKET}/{secrets.token_hex(3)}/e2e", off | {"s3": s3}, rows)
    ratio = disk["acked_s"] / remote["acked_s"]
    for name, out in (("disk", disk), ("s3", remote)):
        print(
            f"{name:>6} committed {out['committed_s']:6.2f}s  acknowledged {out['acked_s']:6.2f}s"
            f"  {rows / out['acked_s']:>9,.0f} rows/s  ({out['commits']:.0f} commits)"
        )
    print(f"e2e on s3: {ratio:.2f}x the throughput on disk (target >= {TARGET_E2E_RATIO}x)")
    return {"e2e_ratio": ratio, "e2e_disk_s": disk["acked_s"], "e2e_s3_s": remote["acked_s"]}


def _row(n: int, root: str, out: dict[str, float], note: str = "") -> None:
    print(
        f"{n:>6} {root:>5} {out['ready_s']:>7.1f}s {out['lag_p50_s']:>7.2f}s"
        f" {out['lag_p99_s']:>7.2f}s {out['drain_s']:>6.1f}s {out['commits_s']:>10.1f}"
        f" {out['per_round']:>10.1f}{note}"
    )


if __name__ == "__main__":
    main()
