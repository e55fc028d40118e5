"""Reading shape tables with plain Spark: the changelog, and the state as of an LSN.

Works without the table format's Spark connector: the table format
(``tidemark.sink.port``; Delta: ``deltalake``, Iceberg: ``pyiceberg``) names the
snapshot's files and Spark reads exactly those as Parquet. (With the Delta or Iceberg
Spark jar, Spark reads the tables natively; the fold applies the same way.)

The fold ("current state as of LSN L") is ``tidemark.sink.fold``.

``snapshot(shapes, as_of)`` folds several shapes at one LSN and refuses an LSN
beyond any requested shape's frontier (``_tidemark/frontiers.json``), so a
multi-shape read is consistent.

A table rebuilt from a snapshot (a backfill, a resync) no longer holds its history
before that snapshot: reading it as of an earlier LSN is refused (``current`` and
``snapshot``), rather than answered with part of the rows.

``current`` reads mostly pre-folded rows: the shape's current-state table
(``TableFormat.current_base``) as of its LSN ``C``, plus the fold of the changelog
rows after ``C`` onto it (``fold_onto``), so it stays exact up
to the frontier and costs what the table and the tail cost, not the whole history.
An ``as_of`` before ``C`` reads the current table's version at or before ``as_of``
plus the changelog rows after it, or without one the whole changelog. Once changelog
retention dropped rows at or below ``R`` (``compact_changelog``), an ``as_of``
before ``R`` is refused, naming ``R``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidemark.errors import SinkError
from tidemark.lsn import format_lsn
from tidemark.sink import TableFormat
from tidemark.sink.fold import fold, fold_onto, snapshot_rows
from tidemark.sink.frontiers import load_frontiers
from tidemark.sink.root import root_format
from tidemark.sink.schema import LSN, current_schema, spark_schema


def changelog(spark: Any, root: str | Path, shape: str, tables: TableFormat | None = None) -> Any:
    """The shape's table as a DataFrame of change rows (every version of every row).
    ``tables``: the root's table format (default: as the service recorded it,
    ``tidemark.sink.root``)."""
    table = (tables or root_format(root)).changelog(root, shape)
    if not table.exists():
        raise SinkError(
            f"shape '{shape}' has no table under {root}: is the name right, "
            "and has tidemark committed anything for it yet?"
        )
    files = table.file_uris()
    schema = spark_schema(table.arrow_schema())
    if not files:
        return spark.createDataFrame([], schema)
    # the table's schema is the union of all files' schemas (columns added later)
    return spark.read.schema(schema).parquet(*files)


def current(
    spark: Any,
    root: str | Path,
    shape: str,
    as_of: int | None = None,
    tables: TableFormat | None = None,
) -> Any:
    """The shape's rows as of ``as_of`` (default: everything committed)."""
    from pyspark.sql import functions as F

    if as_of is not None:
        _check_after_snapshot(root, shape, as_of)
    tables = tables or root_format(root)
    table = tables.changelog(root, shape)
    frame = changelog(spark, root, shape, tables)
    key = table.primary_key()
    start = tables.current_base(root, table, as_of)
    if start is None:
        return fold(frame, key, as_of)
    files, lsn = start
    target = current_schema(table.arrow_schema(), key)
    base_frame = (
        spark.read.schema(spark_schema(target)).parquet(*files)
        if files
        else spark.createDataFrame([], spark_schema(target))
    )
    tail = frame.where(F.col(LSN) > F.lit(lsn))
    if as_of is not None:
        tail = tail.where(F.col(LSN) <= F.lit(as_of))
    state = fold_onto(snapshot_rows(base_frame, frame.schema), tail, key)
    return state.select(*[F.col(f"`{f.name}`") for f in target])


def _check_after_snapshot(root: str | Path, shape: str, as_of: int) -> None:
    frontiers = load_frontiers(root)
    entry = None if frontiers is None else frontiers.shapes.get(shape)
    if entry is None or entry.snapshot_lsn is None:
        return
    oldest = entry.snapshot_lsn - 1  # the snapshot rows' _lsn
    if as_of < oldest:
        raise SinkError(
            f"cannot read shape '{shape}' as of {format_lsn(as_of)}: its table was rebuilt "
            f"from a snapshot at {format_lsn(entry.snapshot_lsn)} (a backfill or resync), "
            f"which replaced the history before it. Read as of {format_lsn(oldest)} or later"
        )


def frontier_of(root: str | Path, shape: str) -> int | None:
    frontiers = load_frontiers(root)
    if frontiers is None or shape not in frontiers.shapes:
        return None
    entry = frontiers.shapes[shape]
    return entry.frontier_lsn if entry.ready else None


def snapshot(
    spark: Any,
    root: str | Path,
    shapes: Sequence[str],
    as_of: int,
    tables: TableFormat | None = None,
) -> dict[str, Any]:
    """Every shape folded as of ``as_of``; refuses an LSN beyond any shape's frontier."""
    behind = []
    for shape in shapes:
        frontier = frontier_of(root, shape)
        if frontier is None or frontier < as_of:
            behind.append(f"{shape} (frontier {format_lsn(frontier) if frontier else 'none'})")
    if behind:
        raise SinkError(
            f"cannot read as of {format_lsn(as_of)}: not every shape is complete that far: "
            f"{', '.join(behind)}. Wait for the frontiers (tidemark wait --lsn) or read "
            "as of an earlier LSN"
        )
    tables = tables or root_format(root)
    return {shape: current(spark, root, shape, as_of, tables) for shape in shapes}


__all__ = ["changelog", "current", "fold", "fold_onto", "frontier_of", "snapshot", "snapshot_rows"]
