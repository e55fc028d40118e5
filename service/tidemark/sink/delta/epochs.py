"""The leader's epoch mark on every table under the sink root (see ``tidemark.state.fencing``):
a Delta commit holding only the application transaction ``tidemark-epoch``, made by a
new leader before it writes anything else, so that a commit of an older leader built
on an earlier snapshot is refused (it carries the same application id: a conflict) and
one built on a later snapshot sees the mark and is refused before it is written."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import structlog
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from tidemark.errors import SinkError
from tidemark.sink.delta.log import entries_sync, recover_log
from tidemark.state import objectstore
from tidemark.state.fencing import EPOCH_APP, table_epoch
from tidemark.state.objectstore import Location

log = structlog.get_logger("tidemark.sink.epochs")

MARK_THREADS: Final = 8
# on an object store a mark waits on a few requests' latency (is it a table, its log,
# the commit): more at once
MARK_THREADS_REMOTE: Final = 32
MARK_ATTEMPTS: Final = 5


def _table_paths(root: Path) -> Iterable[Path]:
    for kind in ("tables", "current"):
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if (path / "_delta_log").is_dir():
                yield path


def mark_table(path: Location, epoch: int, app_id: str = EPOCH_APP) -> bool:
    """Commit the epoch mark to one table (False: no table there, or it is newer)."""
    options = objectstore.storage_options(path)
    try:
        # (what a power loss left at the log's end first: the mark goes after it)
        if isinstance(path, Path) and recover_log(path.name, path, path.parent.parent) is None:
            return False
        # (on a store, opened at once: deltalake's is_deltatable holds the GIL while it
        # asks, and the other tables' marks would wait for it; ShapeTable._open_delta)
        dt = DeltaTable(str(path), storage_options=options)
    except TableNotFoundError:
        return False
    except Exception as exc:  # a damaged table: its shape reports it, the rest go on
        log.warning("lease.mark_failed", table=str(path), error=f"{type(exc).__name__}: {exc}")
        return False
    for attempt in range(MARK_ATTEMPTS):
        if attempt:  # a commit of the old leader landed first: mark on top of it
            dt.update_incremental()
        marked = table_epoch(dt, app_id)
        if marked is not None and marked >= epoch:
            return False
        before = dt.version()
        try:
            dt.create_write_transaction(
                [],
                mode="append",
                schema=dt.schema(),
                commit_properties=CommitProperties(
                    custom_metadata={"tidemark.operation": "epoch", "tidemark.epoch": str(epoch)},
                    app_transactions=[Transaction(app_id, epoch)],
                ),
            )
        except CommitFailedError:
            continue
        dt.update_incremental()
        if isinstance(path, Path):  # (on an object store: durable when the PUT returned)
            entries_sync(path / "_delta_log", before + 1, dt.version()).sync()
        return True
    raise SinkError(
        f"cannot mark the table at {path} with the leader epoch {epoch}: {MARK_ATTEMPTS} "
        "commits in a row lost a race with another writer (is another tidemark writing "
        "this sink root without the lease?)"
    )


def mark_tables(
    root: str | Path,
    epoch: int,
    paths: Sequence[Location] | None = None,
    app_id: str = EPOCH_APP,
) -> int:
    """Mark every table under ``root`` (changelog and current tables) with ``epoch``:
    from now on a commit of an older epoch is refused by each. Returns how many."""
    tables: list[Location] = []
    if paths is not None:
        tables = list(paths)
    elif not objectstore.is_remote(root):
        tables = list(_table_paths(Path(root)))
    if not tables:
        return 0
    threads = MARK_THREADS_REMOTE if objectstore.is_remote(tables[0]) else MARK_THREADS
    with ThreadPoolExecutor(min(threads, len(tables))) as pool:
        return sum(pool.map(lambda p: mark_table(p, epoch, app_id), tables))
