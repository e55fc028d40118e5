"""Spark's scheduler pools in a tidemark session: work that can wait (current-table
refreshes, backfill rewrites) runs in the background pool, and a stream flush's job
started meanwhile is not queued behind all of its tasks."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidemark.spark import BACKGROUND_POOL, in_background

pytestmark = pytest.mark.integration

POOL = "spark.scheduler.pool"


def _sleeping_job(spark: Any, tasks: int, sleep_ms: int) -> None:
    """A job of ``tasks`` tasks that each sleep ``sleep_ms`` (no Python worker)."""
    (
        spark.range(0, tasks, 1, tasks)
        .selectExpr(f"java_method('java.lang.Thread', 'sleep', {sleep_ms} + id * 0) as s")
        .collect()
    )


def test_a_flush_job_goes_ahead_of_the_background_jobs_queued_tasks(spark: Any) -> None:
    ended: dict[str, float] = {}
    started = threading.Event()

    def background() -> None:
        def job() -> None:
            started.set()
            _sleeping_job(spark, tasks=40, sleep_ms=100)  # ~2 s on local[2]

        in_background(spark, job)
        ended["background"] = time.monotonic()

    thread = threading.Thread(target=background)
    thread.start()
    try:
        started.wait(10)
        time.sleep(0.5)  # its tasks hold both slots, most still queued
        _sleeping_job(spark, tasks=2, sleep_ms=100)  # a flush: the default pool
        ended["flush"] = time.monotonic()
    finally:
        thread.join(60)
    # FIFO would have run all 40 queued background tasks first
    assert ended["flush"] < ended["background"]


def test_in_background_sets_the_threads_pool_and_resets_it(spark: Any) -> None:
    context = spark.sparkContext
    assert context.getLocalProperty(POOL) is None
    assert in_background(spark, context.getLocalProperty, POOL) == BACKGROUND_POOL
    assert context.getLocalProperty(POOL) is None

    def failing() -> None:
        raise RuntimeError("a failed refresh")

    with pytest.raises(RuntimeError):
        in_background(spark, failing)
    assert context.getLocalProperty(POOL) is None  # reset after a failure too
    scheduler = context._jsc.sc()
    background = scheduler.getPoolForName(BACKGROUND_POOL).get()
    flushes = scheduler.getPoolForName("default").get()
    assert (background.weight(), background.minShare()) == (1, 0)
    assert flushes.minShare() > 1000  # always below its share: offered every slot first
