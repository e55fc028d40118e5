"""The Apache Iceberg table format behind the sink's port (``tidemark.sink.port``).

Each shape has a changelog (``<namespace>.<shape>``, ``iceberg.table``) and a
current-state table (``<namespace>_current.<shape>``, ``iceberg.current``), both
Iceberg tables (format version 2 by default) registered in one catalog
(``iceberg.catalog``) and committed through pyiceberg; Spark writes every data file,
as for Delta. The leader's epoch is a key of the snapshot summary that a new leader
raises with an empty snapshot (``mark``); upkeep expires snapshots and removes the
files no snapshot names.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from tidemark.errors import SinkError
from tidemark.sink import current, retention
from tidemark.sink.current import current_path
from tidemark.sink.folder import folder_present, move_aside
from tidemark.sink.iceberg import jvm, snapshots
from tidemark.sink.iceberg.catalog import open_catalog
from tidemark.sink.iceberg.current import IcebergCurrent
from tidemark.sink.iceberg.table import IcebergChangelog, expire, remove_unreferenced
from tidemark.sink.port import ChangelogTable
from tidemark.state import fencing, objectstore
from tidemark.state.objectstore import Location, join

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from tidemark.settings.config import IcebergSettings

log = structlog.get_logger("tidemark.sink.iceberg")

MARK_THREADS = 8


class IcebergFormat(current.Refreshing):
    """``TableFormat`` for Apache Iceberg, with the catalog ``settings`` name."""

    name = "iceberg"

    def __init__(self, settings: IcebergSettings | None = None) -> None:
        if settings is None:
            from tidemark.settings.config import IcebergSettings

            settings = IcebergSettings()
        self.settings = settings
        self._spark: Any = None

    def use_engine(self, spark: Any) -> None:
        """The Spark session writing the data files: its driver makes the stream commits
        where it can (``iceberg.jvm``)."""
        self._spark = spark

    def catalog(self, root: str | Path) -> Catalog:
        return open_catalog(root, self.settings)

    def changelog(self, root: str | Path, shape: str, *, epoch: int = 1) -> IcebergChangelog:
        table = IcebergChangelog(
            self.catalog(root), self.settings.namespace, root, shape, epoch=epoch
        )
        table.format_version = self.settings.format_version
        table.max_snapshots = self.settings.max_snapshots
        if self._spark is not None:
            spark, catalog = self._spark, table.catalog
            table.java = lambda: jvm.committer(spark, root, catalog)
        return table

    def current(self, root: str | Path, shape: str) -> IcebergCurrent:
        state = IcebergCurrent(
            self.catalog(root),
            self.settings.namespace,
            root,
            shape,
            self.settings.format_version,
        )
        state.max_snapshots = self.settings.max_snapshots
        return state

    def folders(self, root: str | Path, shape: str) -> tuple[Path | str, Path | str]:
        if objectstore.is_remote(root):
            return (
                objectstore.join(root, "tables", shape),
                objectstore.join(root, current.CURRENT_DIR, shape),
            )
        return Path(root) / "tables" / shape, current_path(root, shape)

    def set_aside(self, table: ChangelogTable) -> Location:
        """Drop the damaged table from the catalog (its files stay) and move its folder
        to ``<root>/damaged/<shape>-<time>/``."""
        assert isinstance(table, IcebergChangelog)
        fencing.check()
        try:
            table.catalog.drop_table(table.ident)
        except Exception as exc:  # (already gone: a restart after a set-aside)
            log.warning("table.drop_failed", table=table.name, error=str(exc))
        aside = join(table.root, "damaged", f"{table.shape}-gone")
        if folder_present(table.path):
            aside = move_aside(table.root, table.shape, table.path)
        table.refresh_handle()
        return aside

    def mark(self, root: str | Path, epoch: int, shapes: Sequence[str], app_id: str) -> int:
        tables: list[IcebergChangelog | IcebergCurrent] = []
        for name in sorted(shapes):
            tables += [self.changelog(root, name), self.current(root, name)]
        # (the catalog's listings first: a load of a table that is not there is a
        # catalog query too, 2,000 of them for 1,000 new shapes)
        found = _listed(tables)
        loaders = [t.loaded for t in tables if found is None or t.ident in found]
        if not loaders:  # (a leader with no shapes yet, or no tables yet)
            return 0
        with ThreadPoolExecutor(min(MARK_THREADS, len(loaders))) as pool:
            return sum(pool.map(lambda load: _mark(load, epoch, app_id), loaders))

    def recover_current(self, root: str | Path, shape: str) -> None:
        if objectstore.is_remote(root):
            return  # (nothing to clear or repair: a refresh's files are put in place)
        fencing.clear(current_path(root, shape) / current.STAGING_DIR)
        self.current(root, shape).recover()

    def vacuum_and_clean(self, root: str | Path, shape: str, floor_hours: int) -> None:
        """The current table's snapshots expired (keeping the one the retained
        changelog starts from) and its unreferenced files removed."""
        state = self.current(root, shape)
        table = state.loaded()
        if table is None:
            return
        retained = self.changelog(root, shape).retained_lsn_now()
        hours = retention.current_vacuum_hours(
            state.points(table), retained, floor_hours, int(time.time() * 1000)
        )
        snapshots.check_fence(snapshots.summary(table), f"the current table of shape '{shape}'")
        table = expire(table, hours)
        remove_unreferenced(table, state.uri if state.remote else state.path, hours)

    def table_stats(self, path: Path | str) -> tuple[int, int] | None:
        """(data files, manifests of the newest snapshot) of a table folder."""
        if objectstore.is_remote(path):
            root, kind, shape = str(path).rsplit("/", 2)
        else:
            path = Path(path)
            root, kind, shape = str(path.parent.parent), path.parent.name, path.name
        if kind == current.CURRENT_DIR:
            table = self.current(root, shape).loaded()
        else:
            table = self.changelog(root, shape).loaded()
        if table is None:
            return None
        snap = table.current_snapshot()
        if snap is None:
            return 0, 0
        return len(snapshots.data_files(table)), len(snap.manifests(table.io))

    def current_base(
        self, root: str | Path, table: ChangelogTable, as_of: int | None
    ) -> tuple[list[str], int] | None:
        generation = table.generation()
        state = self.current(root, table.shape)
        start = current.read_start(
            state, generation, table.identity(), table.retained_lsn(generation), as_of
        )
        if start is None:
            return None
        version, lsn = start
        return state.file_uris(version or None), lsn


def _listed(tables: Sequence[IcebergChangelog | IcebergCurrent]) -> set[tuple[str, str]] | None:
    """The (namespace, name) of every table the catalogs of ``tables`` list in their
    namespaces; None when a listing fails (then each table is loaded)."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    found: set[tuple[str, str]] = set()
    asked: set[tuple[int, str]] = set()
    for table in tables:
        key = (id(table.catalog), table.ident[0])
        if key in asked:
            continue
        asked.add(key)
        try:
            listed = table.catalog.list_tables(table.ident[0])
        except NoSuchNamespaceError:
            continue
        except Exception as exc:  # (a catalog that cannot list: load each table)
            log.debug("iceberg.list_failed", namespace=table.ident[0], error=str(exc))
            return None
        found |= {(".".join(map(str, i[:-1])), str(i[-1])) for i in listed}
    return found


def _mark(load: Any, epoch: int, app_id: str) -> bool:
    """An empty snapshot raising the table's epoch mark (False: marked that far, or no
    such table)."""
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(snapshots.COMMIT_ATTEMPTS):
        table = load()
        if table is None:
            return False
        found = snapshots.summary(table)
        have = snapshots.number(found, app_id)
        if have is not None and have >= epoch:
            return False
        mark = snapshots.carried(found) | {
            "tidemark.operation": "epoch",
            "tidemark.epoch": str(epoch),
            app_id: str(epoch),
        }
        try:
            snapshots.commit(table, mark)
        except CommitFailedException:
            continue  # an old leader's commit landed first: mark on top of it
        return True
    raise SinkError(
        f"cannot mark {table.name()} with the leader epoch {epoch}: "
        f"{snapshots.COMMIT_ATTEMPTS} commits in a row lost a race with another writer"
    )
