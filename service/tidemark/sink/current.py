"""Current-state tables: each shape's changelog folded to one row per key, kept by Spark.

Layout under the sink root, beside the changelog (``<root>/tables/<shape>``)::

    <root>/current/<shape>/...                          the format's metadata
    <root>/current/<shape>/bucket-00007/<uuid>.parquet  the rows of bucket 7
    <root>/current/<shape>/_staging/<uuid>/             a refresh's output before its commit

Columns: the shape's columns (the primary key recorded with the schema, as in the
changelog) and ``_lsn``, the commit LSN of the row's last change. No ``_kind``,
``_op`` or ``_unchanged``: every row is a live row.

A row lives in bucket ``pmod(hash(primary key), buckets)`` (Spark's Murmur3 hash),
one file per bucket. A *refresh* reads the changelog rows past the table's LSN (the
files whose ``_lsn`` statistics reach past it), finds the buckets their keys fall
in, folds them onto those buckets' rows (``tidemark.sink.fold.fold_onto``: the same fold
as ``fold.fold``, TOAST carry included) and writes only those buckets again: one
commit removes their old files and adds the new ones. A truncate in the tail
rewrites every bucket. A changelog rebuilt from a snapshot since (a resync: the
changelog's *generation* moved on) rebuilds the table from the whole changelog;
another bucket count or new columns rewrite every bucket from the table's rows and
the tail; each in one overwrite commit.

A small table (it and its tail at most ``small_table_bytes``) is one bucket, one file,
rewritten whole by each refresh; ``refresh_many`` folds all such shapes of one column
layout in one Spark job (the shape a column, read from each file's path), then
commits each shape on its own. A refresh costs 0.65-0.8 s of Spark jobs however few
rows it writes (``python -m bench read``), so many small shapes cost one job, not
one each.

What a refresh commit records (Delta: its ``commitInfo``; Iceberg: its snapshot
summary), readable by any engine with the table's history: ``tidemark.lsn`` (the
changelog is folded through this LSN), ``tidemark.generation`` (the changelog
generation, see ``ChangelogTable.generation``), ``tidemark.changelogId`` and
``tidemark.buckets``. Reading ``current/<shape>`` with any engine gives the shape's
state as of that LSN. The algorithm here is the format's; what a format provides is
a ``ChangelogView`` of its changelog and a ``CurrentState`` (``tidemark.sink.port``):
the pinned newest version, the refresh points, the commit.

Nothing here holds acknowledgement: a refresh reads committed changelog files of a
pinned table version, while the writers go on appending.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog

from tidemark.errors import SinkError
from tidemark.jvm import DIRECT_COLUMN
from tidemark.lsn import format_lsn
from tidemark.sink import table_format
from tidemark.sink.files import DataFile, describe_file
from tidemark.sink.fold import TRUNCATE, fold, fold_onto, snapshot_rows
from tidemark.sink.folder import describe_remote, writes_in_place
from tidemark.sink.port import (
    ChangelogFile,
    ChangelogView,
    CurrentState,
    Pinned,
    RefreshPoint,
    RefreshResult,
    RetentionResult,
    TableFormat,
)
from tidemark.sink.schema import (
    LSN,
    OP,
    current_schema,
    spark_schema,
)
from tidemark.state import fencing, objectstore

log = structlog.get_logger("tidemark.current")

CURRENT_DIR = "current"
STAGING_DIR = "_staging"
BUCKET_COLUMN = "_tm_bucket"
DEFAULT_BUCKETS = 16
HISTORY_PROBE = 20  # commits read back to find the newest refresh
# A shape whose current table and changelog tail are at most this big is kept as one
# file and refreshed together with the other such shapes in one Spark job (a refresh
# costs 0.65-0.8 s however few rows it writes; 100 small shapes would cost 100 of them).
SMALL_TABLE_BYTES = 32 * 1024 * 1024
BATCH_BYTES = 256 * 1024 * 1024  # at most this much read by one batched job
COMMIT_THREADS = 8
SHAPE_COLUMN = "_tm_shape"
# where a batched job finds each row's shape: the files of a changelog and of a current
# table, as tidemark lays them out (shape names are [a-z_][a-z0-9_]*)
_CHANGELOG_FILE = re.compile(r"data/[^/]+/[^/]+\.parquet")
# (on an object store a refresh's files are in a folder of its own in the bucket's:
# Spark writes them in place, nothing is moved)
_CURRENT_FILE = re.compile(r"bucket-[0-9]{5}/(?:r-[^/]+/)?[^/]+\.parquet")
_SHAPE_IN_PATH = (
    r"/(?:tables|current)/([a-z_][a-z0-9_]*)/(?:data/[^/]+|bucket-[0-9]{5}(?:/r-[^/]+)?)/[^/]+$"
)


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


def point_of(entry: Mapping[str, Any], version: int, timestamp_ms: int) -> RefreshPoint | None:
    """The refresh a commit's recorded properties describe (None: not a refresh)."""
    if "tidemark.lsn" not in entry:
        return None
    return RefreshPoint(
        version,
        int(entry["tidemark.lsn"]),
        int(entry.get("tidemark.generation", 0)),
        int(entry.get("tidemark.buckets", DEFAULT_BUCKETS)),
        timestamp_ms,
        str(entry.get("tidemark.changelogId", "")),
    )


# -- refresh --------------------------------------------------------------------------------


def bucket_column(primary_key: Sequence[str], buckets: int) -> Any:
    from pyspark.sql import functions as F

    return F.pmod(F.hash(*[F.col(f"`{k}`") for k in primary_key]), F.lit(buckets))


@dataclass(slots=True)
class _Plan:
    """What one shape's refresh starts from: the pinned changelog, the current table and
    the range of changelog rows to fold into it."""

    table: CurrentState
    view: ChangelogView
    target: pa.Schema
    pinned: Pinned | None
    point: RefreshPoint | None
    regenerate: bool  # no table of this changelog generation: fold the whole changelog
    new_columns: bool  # the table's columns differ from the changelog's
    after: int | None  # fold the rows with _lsn > after ...
    upto: int  # ... and <= upto
    old: dict[int, list[tuple[str, int]]]  # the table's files by bucket (-1: no bucket)

    @property
    def tail(self) -> list[ChangelogFile]:
        """The changelog files that may hold rows to fold."""
        return self.view.files_after(self.after)

    @property
    def bytes(self) -> int:
        """What a whole rewrite reads: the table's files and the changelog tail."""
        kept = sum(size for files in self.old.values() for _, size in files)
        return kept + sum(f.size for f in self.tail)

    def rebuilds(self, buckets: int) -> bool:
        assert self.point is not None or self.regenerate
        return self.regenerate or self.new_columns or self.point.buckets != buckets  # type: ignore[union-attr]


def _plan(tables: TableFormat, root: str | Path, shape: str) -> _Plan | RefreshResult:
    """The shape's refresh plan, or the result of a refresh with nothing to do."""
    changelog = tables.changelog(root, shape)
    if not changelog.exists():
        return RefreshResult.nothing(shape, None)
    view = changelog.view()
    target = current_schema(view.schema, view.primary_key)
    table = tables.current(root, shape)
    pinned = table.pinned()
    if pinned is None and not view.files:  # nothing committed yet: no table to make either
        return RefreshResult.nothing(shape, None)
    point = pinned.point if pinned is not None else None
    regenerate = point is None or not point.folds(view.generation, view.table_id)
    new_columns = (
        not regenerate and pinned is not None and _needs_replacement(pinned.schema, target)
    )
    if regenerate and view.retained_lsn is not None:
        raise SinkError(
            f"shape '{shape}': changelog retention dropped rows of its changelog, and its "
            f"current-state table {table.uri} is gone or of another generation, so it "
            "cannot be folded again: resync the shape (POST /shapes/{name}/resync)"
        )
    # folded through the newest committed row (retention may have dropped them all)
    upto = max(view.max_lsn or 0, 0 if point is None or regenerate else point.lsn)
    after = None if regenerate or point is None else point.lsn
    old = {} if pinned is None or regenerate else table.files_by_bucket(pinned)
    return _Plan(table, view, target, pinned, point, regenerate, new_columns, after, upto, old)


def _current(plan: _Plan, buckets: int) -> bool:
    """Whether the table already holds everything (and in this layout)."""
    return not plan.rebuilds(buckets) and plan.point is not None and plan.upto <= plan.point.lsn


def refresh(
    spark: Any,
    root: str | Path,
    shape: str,
    *,
    buckets: int = DEFAULT_BUCKETS,
    parallelism: int = 2,
    tables: TableFormat | None = None,
) -> RefreshResult:
    """Fold the changelog rows past the current table's LSN into it (see the module
    docstring), in ``buckets`` buckets. Idempotent; safe while the shape's writer
    commits."""
    started = time.perf_counter()
    if buckets < 1:
        raise SinkError(f"current.buckets must be at least 1, not {buckets}")
    plan = _plan(tables or table_format(), root, shape)
    if isinstance(plan, RefreshResult):
        return plan
    if _current(plan, buckets):
        return RefreshResult.nothing(shape, plan.upto)
    return _refresh_bucketed(spark, plan, buckets, parallelism, started)


def _refresh_bucketed(
    spark: Any, plan: _Plan, buckets: int, parallelism: int, started: float
) -> RefreshResult:
    from pyspark.sql import functions as F

    table, view, target, old = plan.table, plan.view, plan.target, plan.old
    rebuild = plan.rebuilds(buckets)
    after, upto = plan.after, plan.upto
    tail_files = [f.uri for f in plan.tail]
    tail = _tail_frame(spark, plan.view.schema, tail_files)
    if after is not None:
        tail = tail.where(F.col(LSN) > F.lit(after))
    tail = tail.where(F.col(LSN) <= F.lit(upto))
    key = view.primary_key
    bucket = bucket_column(key, buckets)
    if rebuild:
        touched = set(range(buckets))
        truncated = plan.regenerate
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
                spark.read.schema(spark_schema(target)).parquet(*_for_spark(base_files)),
                tail.schema,
            )
        state = fold_onto(base, tail, key)
        columns = [f.name for f in target]
        state = state.select(*[F.col(f"`{c}`") for c in columns])
        tasks = max(1, min(len(touched), parallelism))
        if objectstore.is_remote(table.uri):
            run = _new_run()
            dest = F.concat(
                F.lit(f"{objectstore.s3a(table.uri)}/"),
                F.format_string("bucket-%05d", bucket),
                F.lit(f"/{run}"),
            )
            targets = [(table, b) for b in sorted(touched)]
            frame = state.withColumn(DIRECT_COLUMN, dest)
            added = _write_in_place(spark, frame, run, tasks, targets).get(table.name, [])
        else:
            staging = table.path / STAGING_DIR / str(uuid.uuid4())
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
                fencing.clear(staging)
    removed = [(p, n) for b in touched for p, n in old.get(b, [])] + old.get(-1, [])
    return _finish(plan, buckets, touched, rows_folded, removed, added, rebuild, started)


def refresh_many(
    spark: Any,
    root: str | Path,
    shapes: Sequence[str],
    *,
    buckets: int = DEFAULT_BUCKETS,
    parallelism: int = 2,
    small_bytes: int = SMALL_TABLE_BYTES,
    tables: TableFormat | None = None,
) -> dict[str, RefreshResult | Exception]:
    """Refresh several shapes' current tables; each shape's outcome (a failure of one
    is its own). A shape whose table and tail are at most ``small_bytes`` is kept as
    one file (one bucket) and refreshed together with the other such shapes of its
    column layout: one Spark job for them all, a commit each. The others are refreshed
    one by one in ``buckets`` buckets (``refresh``)."""
    fencing.check()  # (no job writes under the root for a deposed leader)
    tables = tables or table_format()
    out: dict[str, RefreshResult | Exception] = {}
    small: dict[tuple[str, str, tuple[str, ...]], list[_Plan]] = {}
    big: list[_Plan] = []
    for shape in dict.fromkeys(shapes):
        try:
            plan = _plan(tables, root, shape)
        except Exception as exc:
            out[shape] = exc
            continue
        if isinstance(plan, RefreshResult):
            out[shape] = plan
        elif _is_small(plan, small_bytes):
            if _current(plan, 1):
                out[shape] = RefreshResult.nothing(shape, plan.upto)
                continue
            layout = (str(plan.view.schema), str(plan.target), tuple(plan.view.primary_key))
            small.setdefault(layout, []).append(plan)
        elif _current(plan, buckets):
            out[shape] = RefreshResult.nothing(shape, plan.upto)
        else:
            big.append(plan)
    for plans in small.values():
        for group in _by_bytes(plans, BATCH_BYTES):
            out.update(_refresh_together(spark, group, parallelism))
    for plan in big:
        try:
            out[plan.table.shape] = _refresh_bucketed(
                spark, plan, buckets, parallelism, time.perf_counter()
            )
        except Exception as exc:
            out[plan.table.shape] = exc
    return out


def _is_small(plan: _Plan, small_bytes: int) -> bool:
    """Whether the shape is kept as one file: its table and tail are small, and every
    file is where the batched job can tell its shape from its path. A bucketed table
    goes back to one file only at half the size (no rewrite back and forth)."""
    if plan.point is not None and plan.point.buckets > 1 and not plan.regenerate:
        small_bytes //= 2
    if small_bytes <= 0 or plan.bytes > small_bytes:  # 0: never
        return False
    table_files = [p for files in plan.old.values() for p, _ in files]
    return all(_CHANGELOG_FILE.fullmatch(f.path) for f in plan.tail) and all(
        _CURRENT_FILE.fullmatch(p) for p in table_files
    )


def _by_bytes(plans: list[_Plan], limit: int) -> list[list[_Plan]]:
    groups: list[list[_Plan]] = [[]]
    size = 0
    for plan in plans:
        if groups[-1] and size + plan.bytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(plan)
        size += plan.bytes
    return groups


def _refresh_together(
    spark: Any, plans: list[_Plan], parallelism: int
) -> dict[str, RefreshResult | Exception]:
    """One Spark job folds every plan's table and tail (a whole rewrite of each, kept as
    one file), with the shape as a column; then each shape's commit."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    first = plans[0]
    key = [SHAPE_COLUMN, *first.view.primary_key]
    names = [plan.table.shape for plan in plans]
    remote = objectstore.is_remote(first.table.uri)
    staging = first.table.path / STAGING_DIR / str(uuid.uuid4())
    try:
        # the shape of each row, from its file's path (every path checked by _is_small)
        shape_of = F.regexp_extract(F.col("_metadata.file_path"), _SHAPE_IN_PATH, 1)
        ranges = spark.createDataFrame(
            [(p.table.shape, -1 if p.after is None else p.after, p.upto) for p in plans],
            f"{SHAPE_COLUMN} string, __after long, __upto long",
        )
        tail_files = [f.uri for plan in plans for f in plan.tail]
        tail = _tail_frame(spark, first.view.schema, tail_files)
        if tail_files:
            tail = tail.withColumn(SHAPE_COLUMN, shape_of)
        else:
            tail = tail.withColumn(SHAPE_COLUMN, F.lit(None).cast("string"))
        tail = (
            tail.join(F.broadcast(ranges), SHAPE_COLUMN)
            .where((F.col(LSN) > F.col("__after")) & (F.col(LSN) <= F.col("__upto")))
            .drop("__after", "__upto")
            .withColumn(OP, F.col(OP).cast("long"))
        )
        frame = tail
        base_files = [
            f"{p.table.uri}/{path}" for p in plans for files in p.old.values() for path, _ in files
        ]
        if base_files:
            base = spark.read.schema(spark_schema(first.target)).parquet(*_for_spark(base_files))
            base = snapshot_rows(base.withColumn(SHAPE_COLUMN, shape_of), tail.schema)
            frame = base.unionByName(tail, allowMissingColumns=True)
        state = fold(frame, key, scope=[SHAPE_COLUMN])
        columns = [F.col(f"`{f.name}`") for f in first.target]
        tasks = max(1, min(len(plans), parallelism))
        if remote:
            run = _new_run()
            # every plan's table is <root>/current/<shape>
            prefix = objectstore.s3a(first.table.uri).rsplit("/", 1)[0] + "/"
            dest = F.concat(F.lit(prefix), F.col(SHAPE_COLUMN), F.lit(f"/{bucket_dir(0)}/{run}"))
            written = _write_in_place(
                spark,
                state.select(dest.alias(DIRECT_COLUMN), *columns),
                run,
                tasks,
                [(plan.table, 0) for plan in plans],
            )
            adopted = {plan.table.shape: written.get(plan.table.name, []) for plan in plans}
        else:
            (
                state.select(F.col(SHAPE_COLUMN), *columns)
                .repartition(tasks, SHAPE_COLUMN)
                .write.partitionBy(SHAPE_COLUMN)
                .mode("append")
                .parquet(str(staging))
            )
            adopted = {
                plan.table.shape: _adopt_files(
                    plan.table, staging / f"{SHAPE_COLUMN}={plan.table.shape}", 0
                )
                for plan in plans
            }
    except Exception as exc:
        if not remote:
            fencing.clear(staging)
        return dict.fromkeys(names, exc)
    if not remote:
        fencing.clear(staging)

    def commit(plan: _Plan) -> RefreshResult:
        added = adopted[plan.table.shape]
        removed = [(p, n) for files in plan.old.values() for p, n in files]
        try:
            return _finish(
                plan,
                1,
                {0},
                plan.view.rows_after(plan.after),
                removed,
                added,
                plan.rebuilds(1),
                started,
            )
        except Exception:
            # never referenced by a commit; a deposed leader leaves them to vacuum
            if fencing.may_write() and remote:
                with contextlib.suppress(SinkError):
                    objectstore.delete([objectstore.join(plan.table.uri, f.path) for f in added])
            elif fencing.may_write():
                for data in added:
                    (plan.table.path / data.path).unlink(missing_ok=True)
            raise

    out: dict[str, RefreshResult | Exception] = {}
    with ThreadPoolExecutor(
        max_workers=COMMIT_THREADS, thread_name_prefix="current-commit"
    ) as pool:
        futures = {plan.table.shape: pool.submit(commit, plan) for plan in plans}
        for shape, future in futures.items():
            try:
                out[shape] = future.result()
            except Exception as exc:
                out[shape] = exc
    return out


def _tail_frame(spark: Any, schema: pa.Schema, files: Sequence[str]) -> Any:
    cl_schema = spark_schema(schema)
    if not files:
        return spark.createDataFrame([], cl_schema)
    return spark.read.schema(cl_schema).parquet(*_for_spark(files))


def _for_spark(uris: Sequence[str]) -> list[str]:
    """Files as Spark's filesystems name them (an object store's through S3A)."""
    return [objectstore.s3a(u) for u in uris]


def _new_run() -> str:
    """The folder of one refresh's files in each bucket folder on an object store."""
    return f"r-{uuid.uuid4()}"


def _write_in_place(
    spark: Any, frame: Any, run: str, tasks: int, targets: Sequence[tuple[CurrentState, int]]
) -> dict[str, list[DataFile]]:
    """A refresh on an object store: Spark writes ``frame`` straight into the folder
    its ``_tm_dest`` column names (``<table>/bucket-NNNNN/<run>``), with no staging
    folder and no rename (S3A's rename is a copy and a delete). Then each of
    ``targets`` (a table and a bucket) is listed for what landed in its run's folder
    and the files described from their footers; the files by table name."""
    if not writes_in_place(spark):
        raise SinkError(
            "current-state tables on an object store need Spark to write in place (a "
            "classic session: not Spark Connect)"
        )
    scratch = objectstore.local_dir(targets[0][0].uri) / "_writes" / run
    try:
        (
            frame.repartition(tasks, DIRECT_COLUMN)
            .write.partitionBy(DIRECT_COLUMN)
            .mode("append")
            .parquet(str(scratch))
        )
    finally:
        fencing.clear(scratch)

    def found(target: tuple[CurrentState, int]) -> tuple[str, list[DataFile]]:
        table, bucket = target
        folder = f"{bucket_dir(bucket)}/{run}"
        listed = [
            objectstore.Listed(f"{folder}/{f.name}", f.size, f.modified_ms)
            for f in objectstore.listing(objectstore.join(table.uri, folder))
            if f.name.endswith(".parquet") and not f.name.startswith((".", "_"))
        ]
        return table.name, describe_remote(table.uri, listed)

    out: dict[str, list[DataFile]] = {}
    with ThreadPoolExecutor(min(COMMIT_THREADS, len(targets))) as pool:
        for name, files in pool.map(found, targets):
            out.setdefault(name, []).extend(files)
    return out


def _finish(
    plan: _Plan,
    buckets: int,
    touched: set[int],
    rows_folded: int,
    removed: Sequence[tuple[str, int]],
    added: Sequence[DataFile],
    rebuild: bool,
    started: float,
) -> RefreshResult:
    """Commit a refresh's files and report it."""
    metadata = {
        "tidemark.lsn": str(plan.upto),
        "tidemark.generation": str(plan.view.generation),
        "tidemark.changelogId": plan.view.table_id,
        "tidemark.buckets": str(buckets),
        "tidemark.changelogVersion": str(plan.view.version),
        "tidemark.bucketsWritten": str(len(touched)),
        "tidemark.rows": str(sum(f.num_rows for f in added)),
    }
    plan.table.commit(plan.pinned, removed, added, plan.target, metadata, overwrite=rebuild)
    result = RefreshResult(
        plan.table.shape,
        plan.upto,
        rebuild,
        len(touched),
        rows_folded,
        len(added),
        len(removed),
        time.perf_counter() - started,
    )
    log.info(
        "current.refreshed",
        shape=plan.table.shape,
        lsn=plan.upto,
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


def _adopt_buckets(table: CurrentState, staging: Path, touched: set[int]) -> list[DataFile]:
    """Move each bucket's file Spark wrote into ``bucket-NNNNN/`` of the table."""
    added = []
    for b in sorted(touched):
        added += _adopt_files(table, staging / f"{BUCKET_COLUMN}={b}", b)
    return added


def _adopt_files(table: CurrentState, folder: Path, bucket: int) -> list[DataFile]:
    """Move the Parquet files Spark wrote into ``folder`` into the table's bucket
    folder; no folder: every row of the bucket is gone."""
    if not folder.is_dir():
        return []
    target = table.path / bucket_dir(bucket)
    target.mkdir(parents=True, exist_ok=True)
    added = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.name.endswith(".parquet") or entry.name.startswith((".", "_")):
            continue
        rel = f"{bucket_dir(bucket)}/{uuid.uuid4()}.parquet"
        os.rename(entry.path, table.path / rel)
        data = describe_file(table.path, rel)
        if data.num_rows:
            added.append(data)
    return added


def read_start(
    table: CurrentState,
    generation: int,
    changelog_id: str,
    retained: int | None,
    as_of: int | None,
) -> tuple[int, int] | None:
    """Which current-table version (and its LSN) a read starts from; None: fold the
    whole changelog. Refuses an ``as_of`` older than the retained history."""
    pinned = table.pinned()
    point = None if pinned is None else pinned.point
    if point is not None and point.folds(generation, changelog_id):
        if as_of is None or as_of >= point.lsn:
            return point.version, point.lsn
        if retained is None:
            return None  # the changelog is whole: fold it
        older = [
            p
            for p in table.points()
            if p.folds(generation, changelog_id) and retained <= p.lsn <= as_of
        ]
        if older:
            best = max(older, key=lambda p: p.lsn)
            return best.version, best.lsn
    elif retained is None:
        return None  # no current table of this changelog: fold the whole changelog
    oldest = retained  # (every way here has dropped history)
    raise SinkError(
        f"cannot read shape '{table.shape}' as of "
        f"{format_lsn(as_of) if as_of is not None else 'now'}: changelog retention "
        f"dropped the changes at or before {format_lsn(oldest)} (folded into "
        f"{table.uri}), and the current-state table holds no version old enough. "
        f"Read as of {format_lsn(oldest)} or later"
    )


class Refreshing:
    """What every table format does the same way: the current-state refresh (this
    module) and changelog retention (``sink.retention``) over its own tables
    (``TableFormat.refresh_current``, ``compact_changelog``)."""

    def refresh_current(
        self,
        spark: Any,
        root: str | Path,
        shapes: Sequence[str],
        *,
        buckets: int,
        parallelism: int,
        small_bytes: int,
    ) -> dict[str, RefreshResult | Exception]:
        return refresh_many(
            spark,
            root,
            list(shapes),
            buckets=buckets,
            parallelism=parallelism,
            small_bytes=small_bytes,
            tables=self,  # type: ignore[arg-type]
        )

    def compact_changelog(
        self, spark: Any, root: str | Path, shape: str, retention_hours: float
    ) -> RetentionResult | None:
        from tidemark.sink.retention import compact_changelog

        return compact_changelog(spark, root, shape, retention_hours, tables=self)  # type: ignore[arg-type]
