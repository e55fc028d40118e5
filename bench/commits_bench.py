"""Stream commits alone, Delta beside Iceberg: ``TABLES`` tables, each given one small
Parquet file a round, committed through ``ChangelogTable.commit`` on the flush's 8
commit threads, ``ROUNDS`` rounds in a fresh JVM. Per round: commits a second, and the
CPU each commit took in the JVM (Spark's driver, where Iceberg's stream commits are
made) and in this Python process (the CPU of both processes over the round, divided by
its commits: the files' writing is outside the round).

What it shows: the round's cost a flush pays per shape beyond Spark's write (a Delta
commit is one log entry written by Python; an Iceberg one a manifest, a manifest list
and a table metadata file written in the JVM, and a catalog row swapped), and how much
of the Iceberg commit's cost is the JVM running its code cold (the first rounds) rather
than the work itself (the last)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench import cpu_s, jvm_pid, sink_formats
from tidemark.sink import table_format
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.state import fencing

TABLES = int(os.environ.get("TIDEMARK_BENCH_COMMIT_TABLES", "500"))
ROUNDS = int(os.environ.get("TIDEMARK_BENCH_COMMIT_ROUNDS", "12"))
THREADS = 8  # (FlushPolicy.commit_concurrency)
COLUMNS = [ColumnSpec("id", 23)]


def _one_row(schema: pa.Schema, lsn: int) -> pa.Table:
    columns = {}
    for field in schema:
        if pa.types.is_integer(field.type):
            columns[field.name] = pa.array([lsn], field.type)
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            columns[field.name] = pa.array(["u"], field.type)
        else:
            columns[field.name] = pa.array([None], field.type)
    return pa.table(columns, schema=schema)


def _rounds(spark: Any, fmt_name: str, root: Path) -> list[dict[str, float]]:
    fmt = table_format(fmt_name)
    fmt.use_engine(spark)
    schema = table_schema(COLUMNS)
    tables = []
    for k in range(TABLES):
        table = fmt.changelog(root, f"s{k}")
        table.create(schema, ["id"], {"name": f"s{k}"})
        tables.append(table)
    jvm = jvm_pid(spark)
    out = []
    for r in range(ROUNDS):
        end = 1000 * (r + 1)
        batches = []
        for k, table in enumerate(tables):
            rel, path = table.new_batch_dir()
            Path(path).mkdir(parents=True)
            pq.write_table(_one_row(schema, end + k), Path(path) / "part-0.parquet")
            batch = [table.file_at(f"{rel}/part-0.parquet")]
            table.files_sync(batch).sync()  # (as a flush round does before its commits)
            batches.append(batch)

        def commit(k: int, end: int = end, batches: list[list[Any]] = batches) -> None:
            tables[k].commit(batches[k], end + k, {"tidemark.rows": 1}, first_lsn=end + k)
            tables[k].log_sync().sync()

        jvm_before = cpu_s(jvm)
        py_before = cpu_s(os.getpid())
        started = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(commit, range(TABLES)))
        seconds = time.perf_counter() - started
        out.append(
            {
                "commits_per_s": TABLES / seconds,
                "jvm_ms": (cpu_s(jvm) - jvm_before) / TABLES * 1000,
                "python_ms": (cpu_s(os.getpid()) - py_before) / TABLES * 1000,
            }
        )
    return out


def main() -> dict[str, dict[str, float]]:
    from tidemark.spark import build_session

    print(
        f"== commits: {TABLES} tables, one 1-row file each a round, {THREADS} commit "
        f"threads, {ROUNDS} rounds ==",
        flush=True,
    )
    spark = build_session()
    results: dict[str, dict[str, float]] = {}
    before = fencing.current()
    print(f"{'format':8} {'round':>5} {'commits/s':>10} {'JVM ms':>8} {'Python ms':>10}")
    for fmt_name in sink_formats():
        root = Path(tempfile.mkdtemp(prefix=f"tidemark-bench-commits-{fmt_name}-"))
        try:
            (root / "_tidemark").mkdir()
            (root / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
            fencing.install(fencing.Fence(str(root), 1))
            rounds = _rounds(spark, fmt_name, root)
        finally:
            fencing.install(before)
            shutil.rmtree(root, ignore_errors=True)
        for r, found in enumerate(rounds):
            if r in (0, 1, len(rounds) // 2, len(rounds) - 1):
                print(
                    f"{fmt_name:8} {r:>5} {found['commits_per_s']:>10.0f} "
                    f"{found['jvm_ms']:>8.2f} {found['python_ms']:>10.2f}"
                )
        results[fmt_name] = {f"first_{k}": v for k, v in rounds[0].items()} | {
            f"last_{k}": v for k, v in rounds[-1].items()
        }
    if {"delta", "iceberg"} <= results.keys():
        d, i = results["delta"], results["iceberg"]
        print(
            "-- commits: iceberg / delta -- first round "
            f"{d['first_commits_per_s'] / i['first_commits_per_s']:.2f}x the time, last "
            f"{d['last_commits_per_s'] / i['last_commits_per_s']:.2f}x"
        )
    return results


if __name__ == "__main__":
    main()
