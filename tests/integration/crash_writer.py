"""A child process for the crash test: writes a deterministic stream of
transactions into three shapes, printing where it is, until killed.

Markers on stdout (each followed by a short pause, so the parent can kill there):
``WRITING <shape> <end_lsn>`` before Spark writes a batch, ``BETWEEN <shape>
<end_lsn>`` after the files are written and before the Delta commit, and
``COMMITTED <shape> <end_lsn>`` after it. ``DONE`` when every transaction is in.
The second argument is the table format (delta, iceberg).

Flush rounds (one Spark job for several shapes): ``ROUND <shape> ...`` after the
round's job wrote every member's files and before any of its commits, and
``PARTIAL <shape> <end_lsn>`` after a commit of a round that leaves some of its
members uncommitted. The commits of a round take turns here (they run in parallel
in the service), so a kill at ``PARTIAL`` leaves the round half committed.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from pathlib import Path

SHAPES = ("s1", "s2", "s3")
TXNS = 40


def expected_rows(k: int) -> dict[str, list[int]]:
    """Which ids transaction k writes to each shape (deterministic)."""
    rng = random.Random(k)
    out: dict[str, list[int]] = {}
    for shape in SHAPES:
        if rng.random() < 0.6:
            out[shape] = [k * 100 + i for i in range(rng.randint(1, 30))]
    return out


def lsn_of(k: int) -> int:
    return 1_000 * (k + 1)


def main(root: str, fmt: str = "delta") -> None:
    from tests.integration.sink_support import make_feeder, open_writer
    from tidemark.sink import table_format
    from tidemark.sink.delta.table import ShapeTable
    from tidemark.sink.iceberg.table import IcebergChangelog
    from tidemark.spark import build_session
    from tidemark.writers import job
    from tidemark.writers import scheduler as scheduler_module
    from tidemark.writers.scheduler import FlushPolicy, FlushScheduler

    def say(text: str) -> None:
        print(text, flush=True)
        time.sleep(0.3)

    changelog = ShapeTable if fmt == "delta" else IcebergChangelog
    real_write, real_commit = job.write_parquet, changelog.commit
    real_round = scheduler_module.write_round
    turns = threading.Lock()
    pending: set[str] = set()  # members of the round being committed

    def write_parquet(spark, table, schema, specs, rows):  # type: ignore[no-untyped-def]
        say(f"WRITING {table.shape}")
        return real_write(spark, table, schema, specs, rows)

    def write_round(spark, members, staging):  # type: ignore[no-untyped-def]
        say(f"WRITING {' '.join(m.table.shape for m in members)}")
        written = real_round(spark, members, staging)
        pending.update(m.table.shape for m in members)
        say(f"ROUND {' '.join(m.table.shape for m in members)}")
        return written

    def commit(self, files, end_lsn, metadata=None, **kwargs):  # type: ignore[no-untyped-def]
        with turns:
            say(f"BETWEEN {self.shape} {end_lsn}")
            version = real_commit(self, files, end_lsn, metadata, **kwargs)
            say(f"COMMITTED {self.shape} {end_lsn}")
            pending.discard(self.shape)
            if pending:
                say(f"PARTIAL {self.shape} {end_lsn}")
            return version

    job.write_parquet = write_parquet
    changelog.commit = commit  # type: ignore[method-assign]
    scheduler_module.write_round = write_round

    spark = build_session()
    feeder = make_feeder()
    tables = table_format(fmt)
    for shape in SHAPES:
        open_writer(feeder, root, shape, tables=tables)

    async def run() -> None:
        scheduler = FlushScheduler(
            spark, FlushPolicy(max_age_s=0.05, concurrency=1), staging=Path(root) / "_rounds"
        )
        scheduler.clear_staging()
        for writer in feeder.writers.values():
            scheduler.add(writer)
        task = asyncio.create_task(scheduler.run())
        for k in range(TXNS):
            per_shape = {
                shape: [("insert", (str(i).encode(), f"k{k}".encode(), b"b"), None) for i in ids]
                for shape, ids in expected_rows(k).items()
            }
            feeder.txn(lsn_of(k), per_shape, total_ops=90)
            scheduler.poke()
            if k % 5 == 4:
                await scheduler.flush_all()
        await scheduler.flush_all()
        task.cancel()
        say("DONE")

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:])
