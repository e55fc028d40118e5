"""Reading shape tables: the changelog, and the state as of an LSN; with plain Spark,
or without Spark into Arrow (``arrow_changelog``, ``arrow_current``, ``arrow_snapshot``:
for pandas, Polars and DuckDB users, and ``tidemark read``).

Works without the table format's Spark connector: the table format
(``tidemark.sink.port``; Delta: ``deltalake``, Iceberg: ``pyiceberg``) names the
snapshot's files and Spark reads exactly those as Parquet. (With the Delta or Iceberg
Spark jar, Spark reads the tables natively; the fold applies the same way.)

The fold ("current state as of LSN L") is ``tidemark.sink.fold`` (Spark) and
``tidemark.sink.fold_arrow`` (Arrow), the same rules.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from tidemark.errors import SinkError
from tidemark.lsn import format_lsn, lsn_json
from tidemark.sink import TableFormat
from tidemark.sink.fold import fold, fold_onto, snapshot_rows
from tidemark.sink.fold_arrow import fold_arrow, fold_arrow_onto
from tidemark.sink.frontiers import load_frontiers
from tidemark.sink.root import root_format
from tidemark.sink.schema import LSN, current_schema, spark_schema
from tidemark.state import objectstore


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
    uris = table.file_uris()
    if objectstore.is_remote(root):
        _reach_store(spark, str(root))
    files = [objectstore.s3a(uri) if uri.startswith("s3://") else uri for uri in uris]
    schema = spark_schema(table.arrow_schema())
    if not files:
        return spark.createDataFrame([], schema)
    # the table's schema is the union of all files' schemas (columns added later)
    return spark.read.schema(schema).parquet(*files)


def _reach_store(spark: Any, root: str) -> None:
    """Give the session's S3A the store of ``root`` (as the service does at start)."""
    from tidemark.spark import configure_s3a

    access = objectstore.s3_access()
    if access is not None:
        configure_s3a(spark, objectstore.split(root)[0], access.hadoop_conf())


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
        spark.read.schema(spark_schema(target)).parquet(
            *[objectstore.s3a(u) if u.startswith("s3://") else u for u in files]
        )
        if files
        else spark.createDataFrame([], spark_schema(target))
    )
    tail = frame.where(F.col(LSN) > F.lit(lsn))
    if as_of is not None:
        tail = tail.where(F.col(LSN) <= F.lit(as_of))
    state = fold_onto(snapshot_rows(base_frame, frame.schema), tail, key)
    return state.select(*[F.col(f"`{f.name}`") for f in target])


def arrow_changelog(root: str | Path, shape: str, tables: TableFormat | None = None) -> pa.Table:
    """The shape's changelog as an Arrow table, read without Spark (every change row;
    ``.to_pandas()``, ``polars.from_arrow``, or query it from DuckDB)."""
    table = (tables or root_format(root)).changelog(root, shape)
    if not table.exists():
        raise SinkError(
            f"shape '{shape}' has no table under {root}: is the name right, "
            "and has tidemark committed anything for it yet?"
        )
    return _read_files(table.file_uris(), table.arrow_schema())


def arrow_current(
    root: str | Path,
    shape: str,
    as_of: int | None = None,
    tables: TableFormat | None = None,
) -> pa.Table:
    """The shape's rows as of ``as_of`` (default: everything committed) as an Arrow
    table, without Spark: the current table where one holds the state at or before
    ``as_of``, with the changelog rows after it folded on (as ``current`` does)."""
    if as_of is not None:
        _check_after_snapshot(root, shape, as_of)
    tables = tables or root_format(root)
    table = tables.changelog(root, shape)
    changes = arrow_changelog(root, shape, tables)
    key = table.primary_key()
    start = tables.current_base(root, table, as_of)
    if start is None:
        return fold_arrow(changes, key, as_of)
    files, lsn = start
    base = _read_files(files, current_schema(table.arrow_schema(), key))
    after = pc.greater(changes[LSN], pa.scalar(lsn, pa.int64()))
    if as_of is not None:
        after = pc.and_(after, pc.less_equal(changes[LSN], pa.scalar(as_of, pa.int64())))
    return fold_arrow_onto(base, changes.filter(after), key)


def arrow_snapshot(
    root: str | Path, shapes: Sequence[str], as_of: int, tables: TableFormat | None = None
) -> dict[str, pa.Table]:
    """Every shape as of one LSN, as Arrow tables; refuses an LSN beyond any shape's
    frontier (as ``snapshot``)."""
    _check_frontiers(root, shapes, as_of)
    tables = tables or root_format(root)
    return {shape: arrow_current(root, shape, as_of, tables) for shape in shapes}


def describe_tables(
    root: str | Path, shape: str, tables: TableFormat | None = None
) -> dict[str, Any]:
    """Where a shape's tables are and what they hold, for pointing an engine at them:
    the format; the changelog's folder, name (Delta: its folder; Iceberg: its catalog
    name), newest version (Delta) or snapshot id (Iceberg), files, schema and primary
    key; the current table's, with the LSN its newest refresh folded through (None
    before the first refresh) and how far that is behind the frontier; and the
    shape's frontier. LSNs as the API gives them (``lsn_json``)."""
    tables = tables or root_format(root)
    table = tables.changelog(root, shape)
    if not table.exists():
        raise SinkError(
            f"shape '{shape}' has no table under {root}: is the name right, "
            "and has tidemark committed anything for it yet?"
        )
    view = table.view()
    state = tables.current(root, shape)
    pinned = state.pinned() if state.exists() else None
    point = None if pinned is None else pinned.point
    frontier = frontier_of(root, shape)
    return {
        "shape": shape,
        "format": tables.name,
        "frontier": lsn_json(frontier),
        "changelog": {
            "path": str(table.path),
            "name": table.name,
            "version": view.version,
            "generation": view.generation,
            "files": len(view.files),
            "primary_key": list(view.primary_key),
            "schema": [{"name": f.name, "type": str(f.type)} for f in view.schema],
        },
        "current": None
        if pinned is None
        else {
            "path": str(state.path),
            "name": state.name,
            "version": pinned.version,
            "folded": lsn_json(None if point is None else point.lsn),
            # WAL between the frontier and the folded LSN, as the metric
            # tidemark_current_lag_bytes has it; and the changelog's rows past the folded
            # LSN (whole files counted): 0 when a plain reader of the current table sees
            # every committed change (`tidemark read` and tidemark.read fold the rest)
            "lag_bytes": None
            if point is None or frontier is None
            else max(0, frontier - point.lsn),
            "rows_waiting": None if point is None else view.rows_after(point.lsn),
        },
    }


def shapes_at(root: str | Path) -> list[str]:
    """The shapes that have a changelog folder under ``root``."""
    if objectstore.is_remote(root):
        listed = objectstore.listing(objectstore.join(root, "tables"))
        return sorted({f.name.split("/", 1)[0] for f in listed if "/_delta_log/" in f.name})
    folder = Path(root) / "tables"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_"))


def _read_files(uris: Sequence[str], schema: pa.Schema) -> pa.Table:
    """Parquet files (URIs or paths) read as one table of ``schema``: a column a file
    lacks (added later) reads as NULL."""
    if not uris:
        return schema.empty_table()
    parsed = urlparse(uris[0])
    filesystem: pafs.FileSystem
    if parsed.scheme == "s3":
        filesystem = objectstore.arrow_filesystem()
        paths = [objectstore.arrow_path(u) for u in uris]
    elif parsed.scheme in ("", "file"):
        paths = [unquote(urlparse(u).path) if u.startswith("file:") else u for u in uris]
        filesystem = pafs.LocalFileSystem()
    else:
        filesystem, _ = pafs.FileSystem.from_uri(uris[0])
        paths = [pafs.FileSystem.from_uri(u)[1] for u in uris]
    found = pads.dataset(paths, schema=schema, format="parquet", filesystem=filesystem)
    return found.to_table()


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
    _check_frontiers(root, shapes, as_of)
    tables = tables or root_format(root)
    return {shape: current(spark, root, shape, as_of, tables) for shape in shapes}


def _check_frontiers(root: str | Path, shapes: Sequence[str], as_of: int) -> None:
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


_KEYLESS = " (a table without one: each row as many times as its inserts outnumber its deletes)"


@dataclass(frozen=True, slots=True)
class TableVersions:
    """Which versions of a shape's tables hold its state as of one LSN (``versions_at``)."""

    shape: str
    format: str  # delta or iceberg
    lsn: int
    changelog: str  # the table: a folder (Delta) or a catalog name (Iceberg)
    changelog_version: int  # Delta: the version; Iceberg: the snapshot id
    current: str | None
    current_version: int | None  # a refresh at or before ``lsn`` (None: none readable)
    current_lsn: int | None  # the LSN that refresh folded through

    def how(self) -> str:
        """The read, in words any engine can follow."""
        start = f"read {self.changelog} at {self.changelog_version} where _lsn <= {self.lsn}"
        if self.current_version is None:
            return f"{start}, and fold it by the primary key{_KEYLESS}"
        return (
            f"read {self.current} at {self.current_version} (the state at LSN "
            f"{self.current_lsn}), then fold onto it the rows of {self.changelog} at "
            f"{self.changelog_version} with {self.current_lsn} < _lsn <= {self.lsn}; or {start} "
            f"and fold it by the primary key{_KEYLESS}"
        )


def versions_at(
    root: str | Path, shapes: Sequence[str], lsn: int, tables: TableFormat | None = None
) -> dict[str, TableVersions]:
    """For each shape, the version (Delta) or snapshot id (Iceberg) of its changelog that
    holds every transaction at or below ``lsn`` (the oldest that does: read it with
    ``_lsn <= lsn``), and the newest current-table refresh at or before ``lsn``: time
    travel each table there with any engine and every shape is as of the same Postgres
    commit. Refuses an LSN beyond any shape's frontier, or before a shape's snapshot."""
    _check_frontiers(root, shapes, lsn)
    tables = tables or root_format(root)
    out = {}
    for shape in shapes:
        _check_after_snapshot(root, shape, lsn)
        table = tables.changelog(root, shape)
        commits = table.commits()
        if not commits:
            raise SinkError(f"shape '{shape}' has no table under {root} yet")
        chosen = commits[0].version
        for commit in commits:  # newest first
            if commit.end_lsn is not None and commit.end_lsn >= lsn:
                chosen = commit.version
            if commit.operation == "backfill":
                break  # (older versions hold an earlier generation)
        state = tables.current(root, shape)
        generation, identity = table.generation(), table.identity()
        point = next(
            (p for p in state.points() if p.lsn <= lsn and p.folds(generation, identity)), None
        )
        out[shape] = TableVersions(
            shape,
            tables.name,
            lsn,
            table.name,
            chosen,
            state.name if state.exists() else None,
            None if point is None else point.version,
            None if point is None else point.lsn,
        )
    return out


__all__ = [
    "arrow_changelog",
    "arrow_current",
    "arrow_snapshot",
    "changelog",
    "current",
    "describe_tables",
    "fold",
    "fold_onto",
    "frontier_of",
    "shapes_at",
    "snapshot",
    "snapshot_rows",
    "versions_at",
]
