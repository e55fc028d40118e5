"""The fold: the current state of a shape's changelog as of an LSN, in Spark.

The fold ("current state as of LSN L") of a changelog:

* only rows with ``_lsn <= L``;
* rows ordered by ``(snapshot rows first, _lsn, _op)``;
* a ``truncate`` row removes every row ordered before it;
* per primary key, the last row wins; if it is a ``delete`` the key is gone;
* a column listed in a row's ``_unchanged`` (unchanged TOAST, not sent) takes the
  value of the key's previous row.

A shape whose key is every one of its columns (a table without a primary key, under
REPLICA IDENTITY FULL: the whole row is the key) may hold a row several times, as
Postgres does; its fold is a multiset: each distinct row as many times as its snapshot
rows and inserts outnumber its deletes (an update of such a row is a delete and an
insert; an ``update`` row that kept the whole row changes nothing), every copy with the
``_lsn`` of the row's last change. Where the key is a real primary key, no key is ever
there twice, and the two rules give the same state.

``fold`` folds a changelog frame; ``snapshot_rows`` turns a folded state back into
changelog rows that fold before any stream row, and ``fold_onto`` applies a tail of
changelog rows to such a state, folding only the keys the tail touches. Readers
(``tidemark.read``) and the current-state tables (``tidemark.sink.delta.current``) use the
same fold, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.sink.schema import KIND, LSN, METADATA_NAMES, OP, UNCHANGED, is_row_key

SNAPSHOT = "snapshot"
TRUNCATE = "truncate"
DELETE = "delete"
UPDATE = "update"


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
    keys = [F.col(f"`{k}`") for k in primary_key]
    ordered = [c for c in frame.columns if c not in METADATA_NAMES and c != "__order"]
    if is_row_key(ordered, primary_key):
        return _copies(frame, keys, ordered)
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
    return out.select(*[F.col(f"`{c}`") for c in ordered], F.col(LSN))


def _copies(frame: Any, keys: list[Any], ordered: Sequence[str]) -> Any:
    """The multiset fold of a frame whose key is every column (see the module
    docstring); grouping sees NULL as NULL, as Postgres's rows do."""
    from pyspark.sql import functions as F

    step = (
        F.when(F.col(KIND) == DELETE, F.lit(-1))
        .when(F.col(KIND) == UPDATE, F.lit(0))
        .otherwise(F.lit(1))
    )
    counted = frame.groupBy(*keys).agg(
        F.sum(step).cast("int").alias("__n"), F.max("__order").getField("l").alias(LSN)
    )
    copies = counted.where(F.col("__n") > 0).withColumn(
        "__copy", F.explode(F.sequence(F.lit(1), F.col("__n")))
    )
    return copies.select(*[F.col(f"`{c}`") for c in ordered], F.col(LSN))


def _key_match(left: Any, right: Any, primary_key: Sequence[str]) -> tuple[Any, Any]:
    """``right`` with its key columns renamed, and the condition that its key equals
    ``left``'s, NULL matching NULL (a keyless row's columns may be NULL)."""
    renamed = right.select(*[_column(k).alias(f"__k{i}") for i, k in enumerate(primary_key)])
    condition = None
    for i, k in enumerate(primary_key):
        term = left[f"`{k}`"].eqNullSafe(renamed[f"__k{i}"])
        condition = term if condition is None else condition & term
    return renamed, condition


def _column(name: str) -> Any:
    """A column by name, quoted."""
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


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
    keys, same_key = _key_match(base, tail.select(*[_column(k) for k in key]).distinct(), key)
    touched = base.join(keys, same_key, "left_semi")
    changed = fold(touched.unionByName(tail, allowMissingColumns=True), key)
    truncates = tail.where(F.col(KIND) == TRUNCATE).select(F.lit(1).alias("__t")).limit(1)
    kept = base.join(keys, same_key, "left_anti").join(truncates, how="left_anti")
    return kept.select(*[F.col(f"`{c}`") for c in changed.columns]).unionByName(changed)
