"""Current-state tables: each shape's changelog folded to one row per key, kept by Spark.

Layout under the sink root, beside the changelog (``<root>/tables/<shape>``)::

    <root>/current/<shape>/_delta_log/...            the Delta log
    <root>/current/<shape>/bucket-00007/<uuid>.parquet  the rows of bucket 7
    <root>/current/<shape>/_staging/<uuid>/          a refresh's output before its commit

Columns: the shape's columns (the primary key recorded in the schema, as in the
changelog) and ``_lsn``, the commit LSN of the row's last change. No ``_kind``,
``_op`` or ``_unchanged``: every row is a live row.

A row lives in bucket ``pmod(hash(primary key), buckets)`` (Spark's Murmur3 hash),
one file per bucket. A *refresh* reads the changelog rows past the table's LSN (the
files whose ``_lsn`` statistics reach past it), finds the buckets their keys fall
in, folds them onto those buckets' rows (``tidemark.read.fold_onto``: the same fold
as ``read.fold``, TOAST carry included) and writes only those buckets again: one
Delta commit removes their old files and adds the new ones. A truncate in the tail
rewrites every bucket. A changelog rebuilt from a snapshot since (a resync: the
changelog's *generation* moved on) rebuilds the table from the whole changelog;
another bucket count or new columns rewrite every bucket from the table's rows and
the tail; each in one overwrite commit.

What a refresh commit records (``commitInfo``, readable by any Delta reader with the
table's history): ``tidemark.lsn`` (the changelog is folded through this LSN),
``tidemark.generation`` (the changelog generation, see ``ShapeTable.generation``),
``tidemark.changelogId`` and ``tidemark.buckets``; and the application transaction
``(tidemark-current:<shape>, lsn)``, which deltalake's conflict check also uses so two
refreshes racing on one table cannot both commit. Reading ``current/<shape>`` with
any Delta engine gives the shape's state as of that LSN.

Nothing here holds acknowledgement: a refresh reads committed changelog files of a
pinned table version, while the writers go on appending.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import RemoveAction

from tidemark.errors import SinkError
from tidemark.sink.schema import LSN, METADATA_NAMES, primary_key_of, spark_schema, with_primary_key
from tidemark.sink.table import DataFile, ShapeTable, describe_file

log = structlog.get_logger("tidemark.current")

CURRENT_DIR = "current"
STAGING_DIR = "_staging"
BUCKET_COLUMN = "_tm_bucket"
DEFAULT_BUCKETS = 16
HISTORY_PROBE = 20  # commits read back to find the newest refresh


def current_path(root: str | Path, shape: str) -> Path:
    return Path(root) / CURRENT_DIR / shape


def bucket_dir(bucket: int) -> str:
    return f"bucket-{bucket:05d}"


def bucket_of_path(path: str) -> int | None:
    """The bucket a current-table file belongs to, from its folder (None: not ours)."""
    head = path.split("/", 1)[0]
    if not head.startswith("bucket-"):
        return None
    try:
        return int(head[len("bucket-") :])
    except ValueError:
        return None


def current_schema(changelog: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The current table's schema: the changelog's shape columns, then ``_lsn``."""
    fields = [f for f in changelog if f.name not in METADATA_NAMES]
    fields.append(changelog.field(LSN))
    return with_primary_key(pa.schema(fields), primary_key)


@dataclass(frozen=True, slots=True)
class RefreshPoint:
    """What a refresh commit recorded: the table holds the fold through ``lsn``."""

    version: int  # the current table's version of that commit
    lsn: int
    generation: int
    buckets: int
    timestamp_ms: int
    changelog_id: str = ""  # the changelog's Delta table id (a table made again differs)

    def folds(self, view_generation: int, changelog_id: str) -> bool:
        """Whether this refresh folded the same changelog generation."""
        same_table = not self.changelog_id or self.changelog_id == changelog_id
        return self.generation == view_generation and same_table


@dataclass(frozen=True, slots=True)
class RefreshResult:
    shape: str
    lsn: int | None  # the LSN folded through (None: nothing to fold, no table)
    rebuilt: bool
    buckets_written: int
    rows_folded: int  # changelog rows read past the old LSN
    files_added: int
    files_removed: int
    seconds: float
    skipped: bool = False  # already current


def _point(entry: dict[str, Any]) -> RefreshPoint | None:
    if "tidemark.lsn" not in entry:
        return None
    return RefreshPoint(
        int(entry["version"]),
        int(entry["tidemark.lsn"]),
        int(entry.get("tidemark.generation", 0)),
        int(entry.get("tidemark.buckets", DEFAULT_BUCKETS)),
        int(entry.get("timestamp", 0)),
        str(entry.get("tidemark.changelogId", "")),
    )


class CurrentTable:
    """The current-state Delta table of one shape."""

    def __init__(self, root: str | Path, shape: str) -> None:
        self.shape = shape
        self.path = current_path(root, shape)
        self.uri = str(self.path)
        self.app_id = f"tidemark-current:{shape}"

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri)

    def table(self, version: int | None = None) -> DeltaTable:
        if not self.exists():
            raise SinkError(f"shape '{self.shape}' has no current-state table at {self.uri}")
        return DeltaTable(self.uri, version=version)

    def point(self, dt: DeltaTable | None = None) -> RefreshPoint | None:
        """The newest refresh commit (None: no table, or never refreshed)."""
        if dt is None:
            if not self.exists():
                return None
            dt = self.table()
        for entry in dt.history(HISTORY_PROBE):
            found = _point(entry)
            if found is not None:
                return found
        return next((p for e in dt.history() if (p := _point(e)) is not None), None)

    def points(self) -> list[RefreshPoint]:
        """Every refresh commit still in the log, newest first."""
        if not self.exists():
            return []
        return [p for e in self.table().history() if (p := _point(e)) is not None]

    def files_by_bucket(self, dt: DeltaTable) -> dict[int, list[tuple[str, int]]]:
        actions = pa.table(dt.get_add_actions(flatten=False))
        out: dict[int, list[tuple[str, int]]] = {}
        for path, size in zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            strict=True,
        ):
            bucket = bucket_of_path(path)
            out.setdefault(-1 if bucket is None else bucket, []).append((path, size))
        return out

    def file_uris(self, version: int | None = None) -> list[str]:
        return list(self.table(version).file_uris())


# -- the changelog side -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChangelogFile:
    path: str  # relative to the table folder, as the Delta log has it
    uri: str
    size: int
    min_lsn: int | None  # None: no statistics
    max_lsn: int | None
    rows: int

    def reaches_past(self, lsn: int | None) -> bool:
        """Whether it may hold rows with ``_lsn > lsn`` (without statistics: yes)."""
        return lsn is None or self.max_lsn is None or self.max_lsn > lsn


@dataclass(frozen=True, slots=True)
class ChangelogView:
    """One pinned version of a shape's changelog: its files with their ``_lsn`` range."""

    version: int
    generation: int
    table_id: str
    schema: pa.Schema
    primary_key: list[str]
    files: list[ChangelogFile]

    @property
    def max_lsn(self) -> int | None:
        highs = [f.max_lsn for f in self.files if f.max_lsn is not None]
        return max(highs) if highs else None

    def files_after(self, lsn: int | None) -> list[str]:
        """The files that may hold rows with ``_lsn > lsn``."""
        return [f.uri for f in self.files if f.reaches_past(lsn)]

    def rows_after(self, lsn: int | None) -> int:
        """At most this many rows have ``_lsn > lsn`` (whole files counted)."""
        return sum(f.rows for f in self.files if f.reaches_past(lsn))


def changelog_view(table: ShapeTable) -> ChangelogView:
    dt = DeltaTable(table.uri)
    schema = pa.schema(dt.schema().to_arrow())
    actions = pa.table(dt.get_add_actions(flatten=True))
    base = table.uri.rstrip("/") + "/"
    paths = actions.column("path").to_pylist()
    names = actions.column_names
    lows = (
        actions.column(f"min.{LSN}").to_pylist() if f"min.{LSN}" in names else [None] * len(paths)
    )
    highs = (
        actions.column(f"max.{LSN}").to_pylist() if f"max.{LSN}" in names else [None] * len(paths)
    )
    sizes = actions.column("size_bytes").to_pylist()
    rows = actions.column("num_records").to_pylist()
    files = [
        ChangelogFile(p, p if "://" in p or p.startswith("/") else base + p, s, lo, hi, int(n or 0))
        for p, s, lo, hi, n in zip(paths, sizes, lows, highs, rows, strict=True)
    ]
    key = primary_key_of(schema) or table.primary_key()
    return ChangelogView(
        dt.version(), table.generation(dt), str(dt.metadata().id), schema, key, files
    )


# -- refresh --------------------------------------------------------------------------------


def bucket_column(primary_key: Sequence[str], buckets: int) -> Any:
    from pyspark.sql import functions as F

    return F.pmod(F.hash(*[F.col(f"`{k}`") for k in primary_key]), F.lit(buckets))


def refresh(
    spark: Any,
    root: str | Path,
    shape: str,
    *,
    buckets: int = DEFAULT_BUCKETS,
    parallelism: int = 2,
) -> RefreshResult:
    """Fold the changelog rows past the current table's LSN into it (see the module
    docstring). Idempotent; safe while the shape's writer commits."""
    from pyspark.sql import functions as F

    from tidemark.read import TRUNCATE, fold_onto, snapshot_rows

    started = time.perf_counter()
    if buckets < 1:
        raise SinkError(f"current.buckets must be at least 1, not {buckets}")
    changelog = ShapeTable(root, shape)
    if not changelog.exists():
        return RefreshResult(shape, None, False, 0, 0, 0, 0, 0.0, skipped=True)
    view = changelog_view(changelog)
    target = current_schema(view.schema, view.primary_key)
    table = CurrentTable(root, shape)
    dt = table.table() if table.exists() else None
    if dt is None and not view.files:  # nothing committed yet: no table to make either
        return RefreshResult(shape, None, False, 0, 0, 0, 0, 0.0, skipped=True)
    point = table.point(dt) if dt is not None else None
    # regenerate: no table for this changelog generation (new, or a resync since):
    # fold the whole changelog. rebucket: another bucket count or new columns: every
    # bucket is written again from the table's rows and the tail.
    regenerate = point is None or not point.folds(view.generation, view.table_id)
    rebucket = not regenerate and (
        point.buckets != buckets  # type: ignore[union-attr]
        or _needs_replacement(pa.schema(dt.schema().to_arrow()), target)  # type: ignore[union-attr]
    )
    rebuild = regenerate or rebucket
    if regenerate and changelog.retained_lsn(view.generation) is not None:
        raise SinkError(
            f"shape '{shape}': changelog retention dropped rows of its changelog, and its "
            f"current-state table {table.uri} is gone or of another generation, so it "
            "cannot be folded again: resync the shape (POST /shapes/{name}/resync)"
        )
    # folded through the newest committed row (retention may have dropped them all)
    upto = max(view.max_lsn or 0, 0 if point is None or regenerate else point.lsn)
    if not rebuild and point is not None and upto <= point.lsn:
        return RefreshResult(shape, point.lsn, False, 0, 0, 0, 0, 0.0, skipped=True)
    after = None if regenerate or point is None else point.lsn
    cl_schema = spark_schema(view.schema)
    tail_files = view.files_after(after)
    tail = (
        spark.read.schema(cl_schema).parquet(*tail_files)
        if tail_files
        else spark.createDataFrame([], cl_schema)
    )
    if after is not None:
        tail = tail.where(F.col(LSN) > F.lit(after))
    tail = tail.where(F.col(LSN) <= F.lit(upto))
    key = view.primary_key
    bucket = bucket_column(key, buckets)
    old = {} if dt is None or regenerate else table.files_by_bucket(dt)
    if rebuild:
        touched = set(range(buckets))
        truncated = regenerate
        rows_folded = view.rows_after(after)
        base_files = [f"{table.uri}/{p}" for files in old.values() for p, _ in files]
    else:
        summary = (
            tail.select(bucket.alias("b"), (F.col("_kind") == TRUNCATE).cast("int").alias("t"))
            .agg(
                F.collect_set("b").alias("b"),
                F.max("t").alias("t"),
                F.count(F.lit(1)).alias("n"),
            )
            .collect()[0]
        )
        truncated = bool(summary["t"])
        rows_folded = int(summary["n"])
        touched = set(range(buckets)) if truncated else set(summary["b"] or [])
        if -1 in old:  # files of no bucket (not written by a refresh): rewrite everything
            touched = set(range(buckets))
        base_files = [f"{table.uri}/{p}" for b in sorted(touched) for p, _ in old.get(b, [])]
        base_files += [f"{table.uri}/{p}" for p, _ in old.get(-1, [])]
    added: list[DataFile] = []
    if touched and (tail_files or base_files):  # else: nothing to fold, no Spark job
        base = None
        if base_files and not truncated:
            base = snapshot_rows(
                spark.read.schema(spark_schema(target)).parquet(*base_files), tail.schema
            )
        state = fold_onto(base, tail, key)
        columns = [f.name for f in target]
        state = state.select(*[F.col(f"`{c}`") for c in columns])
        staging = table.path / STAGING_DIR / str(uuid.uuid4())
        tasks = max(1, min(len(touched), parallelism))
        (
            state.withColumn(BUCKET_COLUMN, bucket)
            .repartition(tasks, BUCKET_COLUMN)
            .write.partitionBy(BUCKET_COLUMN)
            .mode("append")
            .parquet(str(staging))
        )
        try:
            added = _adopt_buckets(table, staging, touched)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    removed = [(p, n) for b in touched for p, n in old.get(b, [])] + old.get(-1, [])
    metadata = {
        "tidemark.lsn": str(upto),
        "tidemark.generation": str(view.generation),
        "tidemark.changelogId": view.table_id,
        "tidemark.buckets": str(buckets),
        "tidemark.changelogVersion": str(view.version),
        "tidemark.bucketsWritten": str(len(touched)),
        "tidemark.rows": str(sum(f.num_rows for f in added)),
    }
    _commit(table, dt, removed, added, target, metadata, overwrite=rebuild)
    result = RefreshResult(
        shape,
        upto,
        rebuild,
        len(touched),
        rows_folded,
        len(added),
        len(removed),
        time.perf_counter() - started,
    )
    log.info(
        "current.refreshed",
        shape=shape,
        lsn=upto,
        rebuilt=rebuild,
        buckets=len(touched),
        rows_folded=rows_folded,
        seconds=round(result.seconds, 3),
    )
    return result


def _needs_replacement(have: pa.Schema, want: pa.Schema) -> bool:
    if [f.name for f in have] != [f.name for f in want]:
        return True
    return any(not a.type.equals(b.type) for a, b in zip(have, want, strict=True))


def _adopt_buckets(table: CurrentTable, staging: Path, touched: set[int]) -> list[DataFile]:
    """Move each bucket's file Spark wrote into ``bucket-NNNNN/`` of the table."""
    added = []
    for b in sorted(touched):
        folder = staging / f"{BUCKET_COLUMN}={b}"
        if not folder.is_dir():
            continue  # every row of the bucket is gone
        target = table.path / bucket_dir(b)
        target.mkdir(parents=True, exist_ok=True)
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if not entry.name.endswith(".parquet") or entry.name.startswith((".", "_")):
                continue
            rel = f"{bucket_dir(b)}/{uuid.uuid4()}.parquet"
            os.rename(entry.path, table.path / rel)
            data = describe_file(table.path, rel)
            if data.num_rows:
                added.append(data)
    return added


def _commit(
    table: CurrentTable,
    dt: DeltaTable | None,
    removed: Sequence[tuple[str, int]],
    added: Sequence[DataFile],
    schema: pa.Schema,
    metadata: dict[str, str],
    *,
    overwrite: bool,
) -> None:
    # the LSN as the app transaction's version: deltalake refuses this commit if another
    # refresh committed one since ``dt``'s version (two refreshers never both land)
    properties = CommitProperties(
        custom_metadata=metadata,
        app_transactions=[Transaction(table.app_id, int(metadata["tidemark.lsn"]))],
    )
    adds = [f.add_action() for f in added]
    if dt is None:
        table.path.mkdir(parents=True, exist_ok=True)
        description = json.dumps({"tidemark": {"current_of": table.shape}}, sort_keys=True)
        dt = DeltaTable.create(
            table.uri,
            schema=schema,
            mode="error",
            name=f"{table.shape} (current)",
            description=description,
        )
        overwrite = False  # a new table: nothing to replace
    now = int(time.time() * 1000)
    removes = [] if overwrite else [RemoveAction(p, True, now, s, {}) for p, s in removed]
    dt.create_write_transaction(
        [*removes, *adds],
        mode="overwrite" if overwrite else "append",
        schema=schema if overwrite else dt.schema(),
        commit_properties=properties,
    )


# -- changelog retention ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetentionResult:
    shape: str
    retained_lsn: int  # rows at or below this are gone from the changelog
    files_removed: int
    files_added: int
    rows_dropped: int


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
) -> RetentionResult | None:
    """Drop the changelog rows older than the retention that the current table holds
    folded: Spark rewrites the files holding rows at or below the boundary without
    them, and one commit removes the old files, adds the new ones and records the
    boundary (``ShapeTable.retained_lsn``). The caller holds the shape's flushes.
    None: nothing to drop."""
    from pyspark.sql import functions as F

    changelog = ShapeTable(root, shape)
    table = CurrentTable(root, shape)
    if not changelog.exists() or not table.exists():
        return None
    view = changelog_view(changelog)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    boundary = retention_boundary(table.points(), view.generation, retention_hours, now)
    done = changelog.retained_lsn(view.generation)
    if boundary is None or (done is not None and boundary <= done):
        return None
    old = [f for f in view.files if f.min_lsn is None or f.min_lsn <= boundary]
    rows_before = sum(f.rows for f in old)
    added: list[DataFile] = []
    if old:
        frame = spark.read.schema(spark_schema(view.schema)).parquet(*[f.uri for f in old])
        rel, folder = changelog.new_batch_dir()
        files = max(1, -(-rows_before // 2_000_000))
        frame.where(F.col(LSN) > F.lit(boundary)).coalesce(files).write.mode("append").parquet(
            str(folder)
        )
        added = changelog.files_in(rel) if folder.is_dir() else []
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
