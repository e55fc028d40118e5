"""Reading shapes: the current state with and without the current-state table, what a
refresh costs, and how long opening a table with a long Delta log takes.

A changelog of ``TIDEMARK_BENCH_READ_ROWS`` keys (default 1M) and
``TIDEMARK_BENCH_READ_CHANGES`` changes (default 20M: the inserts, then rounds of
updates of every key) is written with pyarrow and committed as tidemark commits it,
one Delta commit per million rows. Then, with the local Spark session:

* ``read.current`` without a current table (the fold of the whole changelog);
* the first refresh (the table built from the whole changelog: the full rewrite);
* ``read.current`` with the current table and no tail;
* 1% of the keys updated (one commit), ``read.current`` with that tail, then the
  refresh that folds it (target: <= 10% of the full rewrite); then 0.01% of the
  keys, and its refresh (with ``TIDEMARK_BENCH_BUCKETS`` buckets, default 16);
* many small shapes (``TIDEMARK_BENCH_SMALL_SHAPES``, default 100, of 1.3k keys; 100
  keys of each changed per round): their refreshes together (``refresh_many``: one
  Spark job) against one shape at a time (``refresh`` in 1 and in 16 buckets, on 10
  of them);
* opening a table of ``TIDEMARK_BENCH_COMMITS`` commits (default 10k, one small file
  each, as a shape committing every second writes them) with deltalake's checkpoint
  every 100 commits, and without checkpoints.

Each Spark figure forces the whole result (``write.format("noop")``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidemark import read
from tidemark.sink import current
from tidemark.sink.delta.table import ShapeTable
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.spark import build_session

COLUMNS = [ColumnSpec("id", 20), ColumnSpec("name", 25), ColumnSpec("amount", 20)]
PER_COMMIT = 1_000_000


def _commit(table: ShapeTable, ids: np.ndarray, kind: str, lsn: int, tag: int) -> None:
    n = len(ids)
    schema = table_schema(COLUMNS)
    arrow = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(np.char.add("name-", (ids + tag).astype(str)), pa.string()),
            "amount": pa.array(ids * 3 + tag, pa.int64()),
            "_lsn": pa.array(np.full(n, lsn), pa.int64()),
            "_op": pa.array(np.arange(n), pa.int64()),
            "_kind": pa.array([kind] * n, pa.string()),
            "_xid": pa.array(np.full(n, lsn), pa.int64()),
            "_commit_ts": pa.nulls(n, pa.timestamp("us", tz="UTC")),
            "_unchanged": pa.nulls(n, pa.list_(pa.string())),
        },
        schema=schema,
    )
    rel, folder = table.new_batch_dir()
    folder.mkdir(parents=True)
    pq.write_table(arrow, folder / "part-0.parquet")
    table.commit([table.file_at(f"{rel}/part-0.parquet")], lsn)


def _timed(frame: Any) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def build_changelog(root: Path, rows: int, changes: int) -> tuple[ShapeTable, int]:
    table = ShapeTable(root, "bench")
    table.create(table_schema(COLUMNS), ["id"], {"name": "bench"})
    keys = np.arange(rows, dtype=np.int64)
    lsn = 1000
    done = 0
    tag = 0
    while done < changes:
        for start in range(0, rows, PER_COMMIT):
            if done >= changes:
                break
            part = keys[start : start + min(PER_COMMIT, changes - done)]
            lsn += 100
            _commit(table, part, "insert" if tag == 0 else "update", lsn, tag)
            done += len(part)
        tag += 1
    return table, lsn


def open_times(folder: Path, commits: int) -> tuple[float, float]:
    """Seconds to open (and list the files of) a table of ``commits`` commits, each
    adding one file and setting an application transaction (what a flush commit
    writes), with a checkpoint every 100 commits (deltalake's default) and without
    any. The first commit is deltalake's; the others repeat its log entry with the
    next version, file and transaction (10k deltalake commits take minutes)."""
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.transaction import AddAction

    out = []
    for checkpoints in (True, False):
        path = folder / ("log-checkpointed" if checkpoints else "log-plain")
        dt = DeltaTable.create(
            str(path),
            schema=pa.schema([("id", pa.int64())]),
            configuration={"delta.checkpointInterval": str(10 * commits)},
        )
        stats = '{"numRecords":1,"minValues":{"id":1},"maxValues":{"id":1},"nullCount":{"id":0}}'
        dt.create_write_transaction(
            [AddAction("data/1.parquet", 600, {}, 0, True, stats)],
            mode="append",
            schema=dt.schema(),
            commit_properties=CommitProperties(app_transactions=[Transaction("app", 1)]),
        )
        log_dir = path / "_delta_log"
        template = (log_dir / f"{1:020d}.json").read_text()
        for version in range(2, commits + 1):
            text = template.replace('"data/1.parquet"', f'"data/{version}.parquet"').replace(
                '"version":1}', f'"version":{version}}}'
            )
            (log_dir / f"{version:020d}.json").write_text(text)
            if checkpoints and version % 100 == 0:
                DeltaTable(str(path), version=version).create_checkpoint()
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            opened = DeltaTable(str(path))
            assert len(opened.file_uris()) == commits
            assert opened.transaction_version("app") == commits
            samples.append(time.perf_counter() - started)
        out.append(min(samples))
    return out[0], out[1]


def small_shapes(spark: Any, folder: Path, shapes: int) -> None:
    """Refreshing many small shapes: together in one job, and one at a time."""
    names = [f"small{i}" for i in range(shapes)]
    tables = {}
    lsn = 1000
    for name in names:
        tables[name] = ShapeTable(folder, name)
        tables[name].create(table_schema(COLUMNS), ["id"], {"name": name})
        lsn += 10
        _commit(tables[name], np.arange(1300, dtype=np.int64), "insert", lsn, 0)

    def change(names: list[str], tag: int) -> None:
        nonlocal lsn
        for i, name in enumerate(names):
            lsn += 10
            ids = (np.arange(100, dtype=np.int64) + 7 * i + 100 * tag) % 1300
            _commit(tables[name], ids, "update", lsn, tag)

    def together() -> float:
        started = time.perf_counter()
        done = current.refresh_many(spark, folder, names)
        failed = [o for o in done.values() if isinstance(o, Exception)]
        assert not failed, failed[0]
        return time.perf_counter() - started

    first = together()
    times = []
    for tag in (1, 2, 3):
        change(names, tag)
        times.append(together())
    alone = names[:10]
    per_shape = {}
    for buckets in (1, 16):
        for tag in (4, 5):  # the first round rebuilds in this bucket count
            change(alone, tag)
            started = time.perf_counter()
            for name in alone:
                current.refresh(spark, folder, name, buckets=buckets, parallelism=2)
            per_shape[buckets] = (time.perf_counter() - started) / len(alone)
    print(
        f"{shapes} small shapes together:       first {first:.2f} s, then "
        + ", ".join(f"{t:.2f}" for t in times)
        + f" s for all {shapes}"
    )
    print(
        f"one at a time:                     {per_shape[1]:.2f} s per shape (1 bucket), "
        f"{per_shape[16]:.2f} s (16 buckets): {shapes * per_shape[1]:.0f}-"
        f"{shapes * per_shape[16]:.0f} s for {shapes}"
    )
    state = read.current(spark, folder, names[0])
    assert state.count() == 1300


def main() -> None:
    rows = int(os.environ.get("TIDEMARK_BENCH_READ_ROWS", "1000000"))
    changes = int(os.environ.get("TIDEMARK_BENCH_READ_CHANGES", str(20 * rows)))
    commits = int(os.environ.get("TIDEMARK_BENCH_COMMITS", "10000"))
    buckets = int(os.environ.get("TIDEMARK_BENCH_BUCKETS", "16"))
    print(f"== read: {rows:,} keys, {changes:,} changes, {buckets} buckets ==")
    folder = Path(tempfile.mkdtemp(prefix="tidemark-bench-read-"))
    spark = build_session("local[2]", app_name="tidemark-bench-read")
    try:
        spark.range(100_000).selectExpr("sum(id)").collect()  # the JVM's first job
        started = time.perf_counter()
        table, lsn = build_changelog(folder, rows, changes)
        print(f"changelog written:                 {time.perf_counter() - started:7.2f} s")
        no_table = _timed(read.current(spark, folder, "bench"))
        print(f"read.current, no current table:    {no_table:7.2f} s  (fold of every change)")
        full = current.refresh(spark, folder, "bench", buckets=buckets, parallelism=2)
        print(f"first refresh (full rewrite):      {full.seconds:7.2f} s")
        with_table = _timed(read.current(spark, folder, "bench"))
        print(
            f"read.current, current table:       {with_table:7.2f} s  "
            f"({no_table / with_table:.1f}x faster)"
        )
        rng = np.random.default_rng(7)
        changed = np.sort(rng.choice(rows, size=max(1, rows // 100), replace=False))
        _commit(table, changed.astype(np.int64), "update", lsn + 100, 999)
        tail = _timed(read.current(spark, folder, "bench"))
        print(f"read.current, table + 1% tail:     {tail:7.2f} s")
        step = current.refresh(spark, folder, "bench", buckets=buckets, parallelism=2)
        print(
            f"refresh after 1% of keys changed:  {step.seconds:7.2f} s  "
            f"({step.seconds / full.seconds:.0%} of the full rewrite; "
            f"{step.buckets_written}/{buckets} buckets rewritten)"
        )
        few = np.sort(rng.choice(rows, size=max(1, rows // 10_000), replace=False))
        _commit(table, few.astype(np.int64), "update", lsn + 200, 998)
        small = current.refresh(spark, folder, "bench", buckets=buckets, parallelism=2)
        print(
            f"refresh after 0.01% changed:       {small.seconds:7.2f} s  "
            f"({small.seconds / full.seconds:.0%}; "
            f"{small.buckets_written}/{buckets} buckets rewritten)"
        )
        state = read.current(spark, folder, "bench")
        assert state.count() == rows
        small_shapes(spark, folder, int(os.environ.get("TIDEMARK_BENCH_SMALL_SHAPES", "100")))
        if commits:
            with_cp, without_cp = open_times(folder, commits)
            print(
                f"open a table of {commits:,} commits:  {with_cp * 1000:7.0f} ms with checkpoints, "
                f"{without_cp * 1000:.0f} ms without"
            )
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)
