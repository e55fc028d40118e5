"""Changelog retention: rows the current-state table holds folded, older than
``[sink] changelog_retention_hours``, leave the changelog.

The boundary (``retention_boundary``) is the newest refresh of the changelog's
generation committed at least that long ago: its rows are in the current table,
whose version at that refresh stays readable (``current_vacuum_hours`` keeps its
files that long), so a read as of any LSN after the boundary is still exact.
``compact_changelog`` rewrites the changelog files holding rows at or below the
boundary without them and records the boundary in the same commit
(``ChangelogTable.retained_lsn``); a read before it is refused, naming it. The same
for every table format: what a format provides is ``ChangelogTable.view`` and
``retention_commit``, and the current table's refresh points.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from tidemark.sink import table_format
from tidemark.sink.files import DataFile
from tidemark.sink.folder import write_files
from tidemark.sink.port import RefreshPoint, RetentionResult, TableFormat
from tidemark.sink.schema import LSN, spark_schema
from tidemark.state import objectstore

log = structlog.get_logger("tidemark.current")


def retention_boundary(
    points: Sequence[RefreshPoint], generation: int, retention_hours: float, now_ms: int
) -> int | None:
    """The LSN changelog rows may be dropped through: the newest refresh of this
    generation committed at least ``retention_hours`` ago (its rows are folded into
    the current table, whose version there stays readable). None: nothing yet."""
    cutoff = now_ms - int(retention_hours * 3_600_000)
    eligible = [p.lsn for p in points if p.generation == generation and p.timestamp_ms <= cutoff]
    return max(eligible) if eligible else None


def compact_changelog(
    spark: Any,
    root: str | Path,
    shape: str,
    retention_hours: float,
    *,
    now_ms: int | None = None,
    tables: TableFormat | None = None,
) -> RetentionResult | None:
    """Drop the changelog rows older than the retention that the current table holds
    folded: Spark rewrites the files holding rows at or below the boundary without
    them, and one commit removes the old files, adds the new ones and records the
    boundary (``ChangelogTable.retained_lsn``). The caller holds the shape's flushes.
    None: nothing to drop."""
    from pyspark.sql import functions as F

    tables = tables or table_format()
    changelog = tables.changelog(root, shape)
    table = tables.current(root, shape)
    if not changelog.exists() or not table.exists():
        return None
    view = changelog.view()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    boundary = retention_boundary(table.points(), view.generation, retention_hours, now)
    done = view.retained_lsn
    if boundary is None or (done is not None and boundary <= done):
        return None
    old = [f for f in view.files if f.min_lsn is None or f.min_lsn <= boundary]
    rows_before = sum(f.rows for f in old)
    added: list[DataFile] = []
    if old:
        uris = [objectstore.s3a(f.uri) for f in old]
        frame = spark.read.schema(spark_schema(view.schema)).parquet(*uris)
        rel, folder = changelog.new_batch_dir()
        files = max(1, -(-rows_before // 2_000_000))
        # (on an object store in place: no _temporary folder, no renames)
        reported = write_files(
            spark, frame.where(F.col(LSN) > F.lit(boundary)).coalesce(files), changelog, folder
        )
        added = changelog.files_in(rel, reported=reported)
    removed = [(f.path, f.size) for f in old]
    try:
        changelog.retention_commit(removed, added, boundary)
    except Exception:
        changelog.delete_files(added)
        raise
    dropped = rows_before - sum(f.num_rows for f in added)
    log.info(
        "changelog.retained",
        shape=shape,
        retained_lsn=boundary,
        files_removed=len(removed),
        files_added=len(added),
        rows_dropped=dropped,
    )
    return RetentionResult(shape, boundary, len(removed), len(added), dropped)


def current_vacuum_hours(
    points: Sequence[RefreshPoint], retained: int | None, floor_hours: int, now_ms: int
) -> int:
    """How long a current table's removed files must be kept: long enough that the
    version at the changelog's retention boundary stays readable (reads as of an LSN
    between it and the newest refresh start there), and at least ``floor_hours``."""
    if retained is None:
        return floor_hours
    at = [p.timestamp_ms for p in points if p.lsn == retained]
    if not at:
        return floor_hours
    age_hours = (now_ms - min(at)) / 3_600_000
    return max(floor_hours, int(age_hours) + 2)
