"""``make bench`` section ``cluster``: the end-to-end figures of e2e_bench.py (N inserts
through 10 shapes, committed and acknowledged; then the ack lag at a steady 5k rows/s)
on three Spark engines, in one run:

* ``local[2]``: tidemark is the driver, Spark in its own JVM (the default);
* ``standalone``: tidemark is the driver of an application on a standalone master and
  one worker (2 cores, 1 GiB; executors of 512 MiB) started from pyspark's
  installation on loopback (``tidemark.demo.spark``); executors write the files;
* ``connect``: tidemark is a Spark Connect client of a server (``local[2]`` behind
  it, 2 GiB driver like tidemark's own) started the same way; no JVM in tidemark.

Each engine gets a fresh embedded PostgreSQL 16 and the same workload; only one
engine's JVMs run at a time. Connect goes last: a Connect session switches pyspark's
process into Connect mode for good. Then the takeover figures (takeover_bench.py):
a standby taking over a SIGKILLed leader, 5 tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.e2e_bench import _backfill_empty, _prepare, _through, _workload
from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.demo.spark import ConnectServer, StandaloneCluster

ENGINES = ("local[2]", "standalone", "connect")
# a driver on the loopback cluster: reachable by executors, executors that fit the worker
CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.cores.max": "2",
}


@contextlib.contextmanager
def engine(name: str) -> Iterator[Any]:
    """A warmed Spark session of the named engine, stopped (with its JVMs) after."""
    from tidemark.spark import build_session

    with contextlib.ExitStack() as stack:
        if name == "local[2]":
            spark = build_session("local[2]", app_name="tidemark-bench-local")
        elif name == "standalone":
            cluster = stack.enter_context(StandaloneCluster(cores=2, memory="1g"))
            spark = build_session(cluster.master_url, CLUSTER_CONF, "tidemark-bench-cluster")
        else:
            server = stack.enter_context(ConnectServer(driver_memory="2g"))
            spark = build_session(remote=server.url, app_name="tidemark-bench-connect")
        try:
            spark.createDataFrame([(1,)], "a int").collect()  # warm up before timing
            yield spark
        finally:
            spark.stop()


def measure(spark: Any, rows: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-cluster-"))
    try:
        with EmbeddedPostgres() as pg:
            _prepare(pg, "bulk")
            asyncio.run(_backfill_empty(pg, spark, root))
            end = _workload(pg, rows)
            return asyncio.run(_through(pg, spark, root, end, rows))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(rows: int = 200_000) -> dict[str, dict[str, float]]:
    from tidemark.observability import configure_logging

    configure_logging("console", "warning")  # the table, not every commit
    print(f"== cluster: {rows:,} inserts through 10 shapes on {', '.join(ENGINES)} ==")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver's JVM: loopback only
    results: dict[str, dict[str, float]] = {}
    for name in ENGINES:
        with engine(name) as spark:
            results[name] = measure(spark, rows)
        r = results[name]
        print(f"  {name}: committed {r['committed_s']:.1f}s, acknowledged {r['acked_s']:.1f}s")
    print(
        f"{'engine':<12}{'committed':>12}{'rows/s':>10}{'acked':>10}{'rows/s':>10}"
        f"{'commits':>9}{'lag p50':>9}{'lag p99':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:<12}{r['committed_s']:>11.2f}s{rows / r['committed_s']:>10,.0f}"
            f"{r['acked_s']:>9.2f}s{rows / r['acked_s']:>10,.0f}{r['commits']:>9.0f}"
            f"{r['lag_p50_s']:>8.2f}s{r['lag_p99_s']:>8.2f}s"
        )
    print(f"(ack lag: source commit -> confirmed_flush_lsn at {5_000:,} rows/s, max_age_s = 1)")
    from bench import takeover_bench

    takeover = takeover_bench.main()
    results["takeover"] = takeover
    return results


if __name__ == "__main__":
    main()
