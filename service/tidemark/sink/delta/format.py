"""The Delta Lake table format behind the sink's port (``tidemark.sink.port``).

Each shape has a changelog (``<root>/tables/<shape>``, ``delta.table``) and a
current-state table (``<root>/current/<shape>``, ``delta.current``), both Delta
tables written through ``deltalake`` (and directly, for stream appends); the leader's
epoch is a Delta application transaction (``delta.epochs``); retention rewrites the
changelog (``delta.retention``); upkeep is Delta's vacuum and log cleanup.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from tidemark.sink import current, retention
from tidemark.sink.current import current_path
from tidemark.sink.delta import epochs
from tidemark.sink.delta.current import CurrentTable
from tidemark.sink.delta.log import delta_exists, entries_sync
from tidemark.sink.delta.table import ShapeTable, set_aside, table_path
from tidemark.sink.port import ChangelogTable
from tidemark.state import fencing, objectstore
from tidemark.state.objectstore import Location


class DeltaFormat(current.Refreshing):
    """``TableFormat`` for Delta Lake."""

    name = "delta"

    def use_engine(self, spark: Any) -> None:
        """(Delta commits in Python: a log append is cheap.)"""

    def changelog(self, root: str | Path, shape: str, *, epoch: int = 1) -> ShapeTable:
        return ShapeTable(root, shape, epoch=epoch)

    def current(self, root: str | Path, shape: str) -> CurrentTable:
        return CurrentTable(root, shape)

    def folders(self, root: str | Path, shape: str) -> tuple[Path | str, Path | str]:
        if objectstore.is_remote(root):
            return table_path(root, shape), objectstore.join(root, current.CURRENT_DIR, shape)
        return table_path(root, shape), current_path(root, shape)

    def set_aside(self, table: ChangelogTable) -> Location:
        assert isinstance(table, ShapeTable)
        return set_aside(table)

    def mark(self, root: str | Path, epoch: int, shapes: Sequence[str], app_id: str) -> int:
        if objectstore.is_remote(root):
            # which tables exist, from one listing of each kind's folder (asking each
            # shape's folder would cost a request or more a shape: 2000 of them took
            # most of a start of 1000 shapes on a store 20 ms away)
            changelogs = objectstore.folders(objectstore.join(root, "tables"))
            states = objectstore.folders(objectstore.join(root, current.CURRENT_DIR))
            found: list[Location] = []
            for name in sorted(shapes):
                changelog, state = self.folders(root, name)
                found += [changelog] if name in changelogs else []
                found += [state] if name in states else []
        else:
            folders = [p for name in sorted(shapes) for p in self.folders(root, name)]
            found = [p for p in folders if isinstance(p, Path) and p.is_dir()]
        return epochs.mark_tables(root, epoch, found, app_id)

    def recover_current(self, root: str | Path, shape: str) -> None:
        if not objectstore.is_remote(root):
            fencing.clear(current_path(root, shape) / current.STAGING_DIR)
        CurrentTable(root, shape).recover()

    def vacuum_and_clean(self, root: str | Path, shape: str, floor_hours: int) -> None:
        vacuum_and_clean(root, shape, floor_hours)

    def table_stats(self, path: Path | str) -> tuple[int, int] | None:
        return table_stats(path)

    def current_base(
        self, root: str | Path, table: ChangelogTable, as_of: int | None
    ) -> tuple[list[str], int] | None:
        generation = table.generation()
        start = current.read_start(
            CurrentTable(root, table.shape),
            generation,
            table.identity(),
            table.retained_lsn(generation),
            as_of,
        )
        if start is None:
            return None
        version, lsn = start
        return CurrentTable(root, table.shape).file_uris(version), lsn


DELTA = DeltaFormat()


def vacuum_and_clean(root: str | Path, shape: str, floor_hours: int) -> None:
    """Vacuum the current table (keeping what reads from the retention boundary on
    need) and clean both tables' expired Delta log entries."""
    changelog = ShapeTable(root, shape)
    table = CurrentTable(root, shape)
    if table.exists():
        points = table.points()
        generation = changelog.generation() if changelog.exists() else 0
        retained = changelog.retained_lsn(generation) if changelog.exists() else None
        hours = retention.current_vacuum_hours(
            points, retained, floor_hours, int(time.time() * 1000)
        )
        dt = table.table()
        where = f"the current table of shape '{shape}'"
        fencing.current().check_snapshot(dt, where)
        before = dt.version()
        dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
        dt.update_incremental()  # (the vacuum's own commits, synced like every other)
        if not table.remote:
            entries_sync(table.path / "_delta_log", before + 1, dt.version()).sync()
        dt.cleanup_metadata()
    if changelog.exists():
        fencing.check()
        DeltaTable(
            changelog.uri, storage_options=objectstore.storage_options(changelog.uri)
        ).cleanup_metadata()


def table_stats(path: Path | str) -> tuple[int, int] | None:
    """(active files, log entries after the newest checkpoint) of a Delta table."""
    options = objectstore.storage_options(path)
    if not delta_exists(path, options):
        return None
    dt = DeltaTable(str(path), storage_options=options)
    files = len(dt.file_uris())
    checkpoint = -1
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, objectstore.SinkError):
        last = objectstore.read(objectstore.join(path, "_delta_log", "_last_checkpoint"))
        checkpoint = int(json.loads(last or b"")["version"])
    return files, dt.version() - checkpoint if checkpoint >= 0 else dt.version() + 1
