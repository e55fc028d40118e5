"""What Spark's part of a flush costs alone: the same Arrow batches written as Parquet by
Spark (as ``writers.job.write_arrow`` does) and by pyarrow, with the CPU of each side.

The batches are what a shape's flush hands Spark: ``build_table`` over buffered rows of
the end-to-end bench's table (bigint, int, text, numeric(12,2), timestamptz, plus the six
metadata columns), ``--rows`` rows in batches of 100k, one transaction of 10 rows each.
Each way is run twice over all batches; the first pass is the JVM's first meeting with
this work (the JIT compiling it), the second the steady state. Spark also writes with
the ``noop`` sink, which takes the rows and writes nothing: what moving the Arrow data
into the JVM as rows costs without Parquet; and from a file (``spark-file``): pyarrow
writes each batch plain on the driver and Spark reads that file and writes the table's
(the way spooled rows go).

Run: ``python -m bench parquet`` (or ``.venv/bin/python bench/parquet_bench.py``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench import cpu_s, jvm_pid

BATCH_ROWS = 100_000
INT8, INT4, TEXT, NUMERIC, TIMESTAMPTZ = 20, 23, 25, 1700, 1184


def _batches(rows: int) -> list[pa.Table]:
    from tidemark.sink.schema import ColumnSpec, table_schema
    from tidemark.writers.arrow_batch import build_table
    from tidemark.writers.buffer import Rows

    specs = [
        ColumnSpec("id", INT8),
        ColumnSpec("grp", INT4),
        ColumnSpec("name", TEXT),
        ColumnSpec("amount", NUMERIC, ((12 << 16) | 2) + 4),
        ColumnSpec("created", TIMESTAMPTZ),
    ]
    schema = table_schema(specs)
    out = []
    for start in range(0, rows, BATCH_ROWS):
        batch = Rows()
        for g in range(start + 1, min(rows, start + BATCH_ROWS) + 1):
            values = (
                str(g).encode(),
                str(g % 10).encode(),
                f"item-{g}".encode(),
                f"{g % 100000 // 100}.{g % 100:02d}".encode(),
                f"2024-01-01 00:00:{g % 60:02d}+00".encode(),
            )
            batch.add(g, "insert", values, None, 60)
            if g % 10 == 0:
                batch.runs.append((0x1000000 + g, g // 10, 770_000_000_000_000 + g, 10))
        left = len(batch) - sum(run[3] for run in batch.runs)
        if left:
            batch.runs.append((0x1000000 + start + BATCH_ROWS, 0, 0, left))
        out.append(build_table(schema, specs, batch))
    return out


def _timed(run: Any, jvm: int) -> tuple[float, float, float]:
    """Wall seconds, this process's CPU seconds and the JVM's, of ``run()``."""
    wall, mine, theirs = time.perf_counter(), time.process_time(), cpu_s(jvm)
    run()
    return (
        time.perf_counter() - wall,
        time.process_time() - mine,
        cpu_s(jvm) - theirs,
    )


def main(rows: int = 1_000_000) -> dict[str, float]:
    from tidemark.sink.schema import spark_schema
    from tidemark.spark import build_session

    print(f"== Parquet alone: {rows:,} rows in Arrow batches of {BATCH_ROWS:,}, written by "
          "Spark (createDataFrame + write.parquet, as a flush) and by pyarrow ==")  # fmt: skip
    batches = _batches(rows)
    spark = build_session()
    jvm = jvm_pid(spark)
    target = spark_schema(batches[0].schema)
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-parquet-"))
    figures: dict[str, float] = {}

    def with_spark(sink: str) -> None:
        for i, batch in enumerate(batches):
            frame = spark.createDataFrame(batch, schema=target).coalesce(1)
            if sink == "noop":
                frame.write.format("noop").mode("overwrite").save()
            else:
                frame.write.mode("append").parquet(str(root / f"spark-{i}"))

    def via_file() -> None:
        # as a spooled batch goes: pyarrow writes it plain on the driver, Spark reads
        # the file (its vectorized reader) and writes the table's file
        for i, batch in enumerate(batches):
            spool = root / f"spool-{i}.parquet"
            pq.write_table(batch, spool, compression="none", use_dictionary=False)
            frame = spark.read.schema(target).parquet(str(spool)).coalesce(1)
            frame.write.mode("append").parquet(str(root / f"spark-{i}"))

    def with_pyarrow() -> None:
        for i, batch in enumerate(batches):
            pq.write_table(batch, root / f"pyarrow-{i}.parquet", compression="snappy")

    try:
        for attempt in ("first", "then"):
            for name, run in (
                ("spark", lambda: with_spark("parquet")),
                ("spark-noop", lambda: with_spark("noop")),
                ("spark-file", via_file),
                ("pyarrow", with_pyarrow),
            ):
                wall, mine, theirs = _timed(run, jvm)
                figures[f"{name}_{attempt}_s"] = wall
                per_row = 1e6 * (mine + theirs) / rows
                print(f"{attempt:5} {name:10} {wall:6.2f} s  CPU: Python {mine:5.2f} s, "
                      f"JVM {theirs:5.2f} s = {per_row:5.2f} us a row")  # fmt: skip
                for path in root.iterdir():
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


if __name__ == "__main__":
    main()
