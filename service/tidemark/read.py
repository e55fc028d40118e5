"""Reading shape tables with plain Spark: the changelog, and the state as of an LSN.

Works without the Delta jar: the Delta snapshot is resolved with ``deltalake``
and Spark reads exactly its files as Parquet. (With the Delta jar, Spark reads
the tables natively; the fold below applies the same way.)

The fold ("current state as of LSN L") of a shape's changelog:

* only rows with ``_lsn <= L``;
* rows ordered by ``(snapshot rows first, _lsn, _op)``;
* a ``truncate`` row removes every row ordered before it;
* per primary key, the last row wins; if it is a ``delete`` the key is gone;
* a column listed in a row's ``_unchanged`` (unchanged TOAST, not sent) takes the
  value of the key's previous row.

``snapshot(shapes, as_of)`` folds several shapes at one LSN and refuses an LSN
beyond any requested shape's frontier (``_tidemark/frontiers.json``), so a
multi-shape read is consistent.

A table rebuilt from a snapshot (a backfill, a resync) no longer holds its history
before that snapshot: reading it as of an earlier LSN is refused (``current`` and
``snapshot``), rather than answered with part of the rows.

``current`` reads mostly pre-folded rows: the shape's current-state table
(``<root>/current/<shape>``, ``tidemark.sink.current``) as of its LSN ``C``, plus the
fold of the changelog rows after ``C`` onto it (``fold_onto``), so it stays exact up
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
from tidemark.sink.current import CurrentTable, current_schema
from tidemark.sink.frontiers import load_frontiers
from tidemark.sink.schema import KIND, LSN, METADATA_NAMES, OP, UNCHANGED, spark_schema
from tidemark.sink.table import ShapeTable

SNAPSHOT = "snapshot"
TRUNCATE = "truncate"
DELETE = "delete"


def changelog(spark: Any, root: str | Path, shape: str) -> Any:
    """The shape's table as a DataFrame of change rows (every version of every row)."""
    table = ShapeTable(root, shape)
    if not table.exists():
        raise SinkError(
            f"shape '{shape}' has no table under {root}: is the name right, "
            "and has tidemark committed anything for it yet?"
        )
    files = table.file_uris()
    schema = spark_schema(table.arrow_schema())
    if not files:
        return spark.createDataFrame([], schema)
    # the Delta schema is the union of all files' schemas (columns added later)
    return spark.read.schema(schema).parquet(*files)


def fold(
    frame: Any, primary_key: Sequence[str], as_of: int | None = None, scope: Sequence[str] = ()
) -> Any:
    """The current state of a changelog DataFrame (see the module docstring).

    ``scope`` names columns that separate independent changelogs in one frame (e.g.
    several shapes unioned with a shape column): a truncate clears only its own
    scope. The scope columns must be part of ``primary_key``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if as_of is not None:
        frame = frame.where(F.col(LSN) <= F.lit(as_of))
    stream_flag = F.when(F.col(KIND) == SNAPSHOT, F.lit(0)).otherwise(F.lit(1))
    frame = frame.withColumn(
        "__order", F.struct(stream_flag.alias("s"), F.col(LSN).alias("l"), F.col(OP).alias("o"))
    )
    truncates = frame.where(F.col(KIND) == TRUNCATE)
    if scope:
        last_truncate = truncates.groupBy(*scope).agg(F.max("__order").alias("__t"))
        frame = frame.where(F.col(KIND) != TRUNCATE).join(last_truncate, list(scope), "left")
    else:
        last_truncate = truncates.agg(F.max("__order").alias("__t"))
        frame = frame.where(F.col(KIND) != TRUNCATE).join(last_truncate, how="cross")
    frame = frame.where(F.col("__t").isNull() | (F.col("__order") > F.col("__t"))).drop("__t")

    skip = {*METADATA_NAMES, "__order", *primary_key}
    value_columns = [c for c in frame.columns if c not in skip]
    keys = [F.col(k) for k in primary_key]
    history = (
        Window.partitionBy(*keys)
        .orderBy("__order")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    unchanged = F.coalesce(F.col(UNCHANGED), F.array().cast("array<string>"))
    carried = []
    for name in value_columns:
        col = F.col(f"`{name}`")
        is_unchanged = F.array_contains(unchanged, name)
        # struct() keeps real NULLs: only "unchanged" rows are skipped by ignorenulls
        previous = F.last(F.when(~is_unchanged, F.struct(col.alias("v"))), ignorenulls=True)
        carried.append(
            F.when(is_unchanged, previous.over(history).getField("v")).otherwise(col).alias(name)
        )
    latest = Window.partitionBy(*keys).orderBy(F.col("__order").desc())
    out = frame.select(
        *[F.col(f"`{k}`") for k in primary_key],
        *carried,
        F.col(KIND),
        F.col(LSN),
        F.col(OP),
        "__order",
    )
    out = out.withColumn("__rank", F.row_number().over(latest))
    out = out.where((F.col("__rank") == 1) & (F.col(KIND) != DELETE))
    ordered = [c for c in frame.columns if c not in METADATA_NAMES and c != "__order"]
    return out.select(*[F.col(f"`{c}`") for c in ordered], F.col(LSN))


def snapshot_rows(state: Any, like: Any) -> Any:
    """A state (shape columns and ``_lsn``, one row per key) as changelog rows that
    fold before any stream row: ``_kind = snapshot``, ``_op = 0``, nothing unchanged."""
    from pyspark.sql import functions as F

    unchanged = dict((f.name, f.dataType) for f in like.fields).get(UNCHANGED)
    return (
        state.withColumn(OP, F.lit(0).cast("long"))
        .withColumn(KIND, F.lit(SNAPSHOT))
        .withColumn(UNCHANGED, F.lit(None).cast(unchanged or "array<string>"))
    )


def fold_onto(base: Any, tail: Any, primary_key: Sequence[str]) -> Any:
    """The state after the changelog rows ``tail`` are applied to ``base``: a state as
    ``snapshot_rows`` (or None: an empty state). Keys the tail does not touch are
    taken as they are; only the touched keys' rows are folded (``fold``); a truncate
    in the tail drops every base row."""
    from pyspark.sql import functions as F

    key = list(primary_key)
    tail = tail.withColumn(OP, F.col(OP).cast("long"))
    if base is None:
        return fold(tail, key)
    keys = tail.select(*[F.col(f"`{k}`") for k in key]).distinct()
    touched = base.join(keys, key, "left_semi")
    changed = fold(touched.unionByName(tail, allowMissingColumns=True), key)
    truncates = tail.where(F.col(KIND) == TRUNCATE).select(F.lit(1).alias("__t")).limit(1)
    kept = base.join(keys, key, "left_anti").join(truncates, how="left_anti")
    return kept.select(*[F.col(f"`{c}`") for c in changed.columns]).unionByName(changed)


def current(spark: Any, root: str | Path, shape: str, as_of: int | None = None) -> Any:
    """The shape's rows as of ``as_of`` (default: everything committed)."""
    from pyspark.sql import functions as F

    if as_of is not None:
        _check_after_snapshot(root, shape, as_of)
    table = ShapeTable(root, shape)
    frame = changelog(spark, root, shape)
    key = table.primary_key()
    generation = table.generation()
    retained = table.retained_lsn(generation)
    changelog_id = str(table.table().metadata().id)
    start = _current_start(root, shape, generation, changelog_id, retained, as_of)
    if start is None:
        return fold(frame, key, as_of)
    version, lsn = start
    target = current_schema(table.arrow_schema(), key)
    files = CurrentTable(root, shape).file_uris(version)
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


def _current_start(
    root: str | Path,
    shape: str,
    generation: int,
    changelog_id: str,
    retained: int | None,
    as_of: int | None,
) -> tuple[int, int] | None:
    """Which current-table version (and its LSN) a read starts from; None: fold the
    whole changelog. Refuses an ``as_of`` older than the retained history."""
    table = CurrentTable(root, shape)
    point = table.point()
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
        f"cannot read shape '{shape}' as of "
        f"{format_lsn(as_of) if as_of is not None else 'now'}: changelog retention "
        f"dropped the changes at or before {format_lsn(oldest)} (folded into "
        f"{table.uri}), and the current-state table holds no version old enough. "
        f"Read as of {format_lsn(oldest)} or later"
    )


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


def snapshot(spark: Any, root: str | Path, shapes: Sequence[str], as_of: int) -> dict[str, Any]:
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
    return {shape: current(spark, root, shape, as_of) for shape in shapes}
