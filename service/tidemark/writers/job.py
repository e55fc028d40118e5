"""The blocking work of a flush, run in a worker thread: Arrow -> Spark -> Delta.

``write_parquet`` has Spark write rows as Parquet into a fresh ``data/<uuid>/``
folder of the shape's table (``createDataFrame(pyarrow.Table)``, ``coalesce``) and
returns the files; nothing is visible until ``commit_batch`` adds them in one
Delta commit tagged with the batch's end LSN.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tidemark.errors import SinkError
from tidemark.sink.schema import ColumnSpec, spark_schema
from tidemark.sink.table import DataFile, ShapeTable
from tidemark.spark import arrow_parts
from tidemark.writers.arrow_batch import build_table
from tidemark.writers.buffer import Batch, Rows

ROWS_PER_FILE = 2_000_000


@dataclass(frozen=True, slots=True)
class CommitResult:
    shape: str
    version: int | None  # None: the sink had this batch already (replay)
    rows: int
    files: int
    end_lsn: int
    write_seconds: float
    commit_seconds: float
    kinds: dict[str, int]  # rows by _kind (metrics)


def write_parquet(
    spark: Any, table: ShapeTable, schema: pa.Schema, specs: Sequence[ColumnSpec], rows: Rows
) -> list[DataFile]:
    return write_arrow(spark, table, schema, build_table(schema, specs, rows, table.shape))


def write_arrow(
    spark: Any, table: ShapeTable, schema: pa.Schema, arrow: pa.Table, *, replacing: bool = False
) -> list[DataFile]:
    """Spark writes ``arrow`` as Parquet into a fresh folder of ``table``; not committed.

    Refuses (``SinkError``) a batch whose column types differ from the table's: a
    table created when tidemark mapped a type otherwise (e.g. interval as text). One
    job, or on Spark Connect one per ``arrow_parts`` slice, all into the folder.
    ``replacing``: the files belong to a backfill whose commit replaces the table's
    schema, so the table's current types do not apply to them."""
    if not replacing:
        check_column_types(table, schema)
    rel, folder = table.new_batch_dir()
    for part in arrow_parts(spark, arrow):
        files = max(1, -(-part.num_rows // ROWS_PER_FILE))
        frame = spark.createDataFrame(part, schema=spark_schema(schema))
        frame.coalesce(files).write.mode("append").parquet(str(folder))
    return table.files_in(rel)


def check_column_types(table: ShapeTable, schema: pa.Schema) -> None:
    """Every column of ``schema`` the table has must have the table's type, as Spark
    sees both: files of another type would be unreadable through the table."""
    existing = {f.name: f for f in spark_schema(table.arrow_schema()).fields}
    for wanted in spark_schema(schema).fields:
        have = existing.get(wanted.name)
        if have is not None and have.dataType != wanted.dataType:
            raise SinkError(
                f"shape '{table.shape}': column {wanted.name} is "
                f"{have.dataType.simpleString()} in the lake table but tidemark now writes "
                f"it as {wanted.dataType.simpleString()} (the table was created with "
                "another type mapping or another declared type): add the shape again under "
                "a new name, which builds a new table from a snapshot, and remove this one"
            )


def commit_batch(
    spark: Any, table: ShapeTable, schema: pa.Schema, specs: Sequence[ColumnSpec], batch: Batch
) -> CommitResult:
    started = time.perf_counter()
    table.ensure_columns(schema)
    files = list(batch.staged)
    if len(batch.rows):
        files += write_parquet(spark, table, schema, specs, batch.rows)
    written = time.perf_counter()
    metadata = {
        "tidemark.transactions": batch.transactions,
        "tidemark.lastOp": batch.last_offset.op_offset,
    }
    version = table.commit(files, batch.end_lsn, metadata, first_lsn=batch.first_lsn)
    done = time.perf_counter()
    kinds = dict(Counter(batch.rows.kinds))
    if batch.staged:
        kinds["staged"] = sum(f.num_rows for f in batch.staged)
    return CommitResult(
        table.shape,
        version,
        batch.row_count,
        len(files),
        batch.end_lsn,
        written - started,
        done - written,
        kinds,
    )
