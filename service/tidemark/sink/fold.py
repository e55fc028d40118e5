"""The fold: the current state of a shape's changelog as of an LSN, in Spark.

The fold ("current state as of LSN L") of a changelog:

* only rows with ``_lsn <= L``;
* rows ordered by ``(snapshot rows first, _lsn, _op)``;
* a ``truncate`` row removes every row ordered before it;
* per primary key, the last row wins; if it is a ``delete`` the key is gone;
* a column listed in a row's ``_unchanged`` (unchanged TOAST, not sent) takes the
  value of the key's previous row.

``fold`` folds a changelog frame; ``snapshot_rows`` turns a folded state back into
changelog rows that fold before any stream row, and ``fold_onto`` applies a tail of
changelog rows to such a state, folding only the keys the tail touches. Readers
(``tidemark.read``) and the current-state tables (``tidemark.sink.delta.current``) use the
same fold, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.sink.schema import KIND, LSN, METADATA_NAMES, OP, UNCHANGED

SNAPSHOT = "snapshot"
TRUNCATE = "truncate"
DELETE = "delete"


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
