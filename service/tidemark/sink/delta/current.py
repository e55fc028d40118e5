"""The current-state table of a shape as a Delta table (``tidemark.sink.current`` has
the refresh; this is its Delta side).

Layout: ``<root>/current/<shape>/_delta_log/`` and the bucket folders. A refresh
commit records ``tidemark.lsn``, ``tidemark.generation``, ``tidemark.changelogId`` and
``tidemark.buckets`` in its ``commitInfo``, and the application transaction
``(tidemark-current:<shape>, lsn)``, which deltalake's conflict check also uses so two
refreshes racing on one table cannot both commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import RemoveAction

from tidemark.errors import SinkError
from tidemark.sink.current import CURRENT_DIR, bucket_of_path, current_path, point_of
from tidemark.sink.delta.log import add_action, delta_exists, entries_sync, recover_log
from tidemark.sink.files import DataFile
from tidemark.sink.port import Pinned, RefreshPoint
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncSet, make_dirs

HISTORY_PROBE = 20  # commits read back to find the newest refresh


def _point(entry: Mapping[str, object]) -> RefreshPoint | None:
    return point_of(entry, int(entry["version"]), int(entry.get("timestamp", 0)))  # type: ignore[call-overload]


class CurrentTable:
    """The current-state Delta table of one shape (``CurrentState``)."""

    def __init__(self, root: str | Path, shape: str) -> None:
        self.shape = shape
        self.remote = objectstore.is_remote(root)
        self.path = current_path("." if self.remote else root, shape)
        self.uri = (
            str(objectstore.join(root, CURRENT_DIR, shape)) if self.remote else str(self.path)
        )
        self.app_id = f"tidemark-current:{shape}"
        self.name = str(self.uri)
        self._options = objectstore.storage_options(self.uri) if self.remote else None

    def exists(self) -> bool:
        return delta_exists(self.uri, self._options)

    def recover(self) -> None:
        """At start: ``recover_log`` (torn entries of unsynced commits removed, the last
        run's newest commit made durable). A table damaged otherwise is left for the
        refresh to report: it is rebuilt from the changelog only by a resync. (On an
        object store an entry is one PUT, whole or absent: nothing to repair.)"""
        if not self.remote:
            recover_log(self.shape, self.path, self.path.parent.parent)

    def table(self, version: int | None = None) -> DeltaTable:
        if not self.exists():
            raise SinkError(f"shape '{self.shape}' has no current-state table at {self.uri}")
        return DeltaTable(self.uri, version=version, storage_options=self._options)

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

    def pinned(self) -> Pinned | None:
        if not self.exists():
            return None
        dt = self.table()
        return Pinned(dt, dt.version(), self.point(dt), pa.schema(dt.schema().to_arrow()))

    def points(self) -> list[RefreshPoint]:
        """Every refresh commit still in the log, newest first."""
        if not self.exists():
            return []
        return [p for e in self.table().history() if (p := _point(e)) is not None]

    def files_by_bucket(self, pinned: Pinned) -> dict[int, list[tuple[str, int]]]:
        actions = pa.table(pinned.handle.get_add_actions(flatten=False))
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

    def commit(
        self,
        pinned: Pinned | None,
        removed: Sequence[tuple[str, int]],
        added: Sequence[DataFile],
        schema: pa.Schema,
        metadata: Mapping[str, str],
        *,
        overwrite: bool,
    ) -> None:
        # the LSN as the app transaction's version: deltalake refuses this commit if
        # another refresh committed one since the pinned version (two refreshers never
        # both land)
        fence = fencing.current()
        properties = CommitProperties(
            custom_metadata=dict(metadata) | fence.commit_info(),
            app_transactions=[
                Transaction(self.app_id, int(metadata["tidemark.lsn"])),
                *fence.app_transactions(),  # a newer leader's mark meanwhile: a conflict
            ],
        )
        adds = [add_action(f) for f in added]
        # the files before the entry that names them, the entry before this returns: a
        # refresh is durable before retention drops the changelog rows it folds
        synced = SyncSet()
        for f in added if not self.remote else ():
            synced.new_file(self.path / f.path, self.path, f.size)
        if pinned is None:
            fence.check()
            if not self.remote:
                make_dirs(self.path)
            description = json.dumps({"tidemark": {"current_of": self.shape}}, sort_keys=True)
            dt = DeltaTable.create(
                self.uri,
                schema=schema,
                mode="error",
                name=f"{self.shape} (current)",
                description=description,
                commit_properties=fence.creation(),
                storage_options=self._options,
            )
            if not self.remote:
                synced.update(entries_sync(self.path / "_delta_log", 0, 0))
                synced.new_folder(self.path / "_delta_log", self.path.parent.parent)
            overwrite = False  # a new table: nothing to replace
        else:
            dt = pinned.handle
        synced.sync()
        fence.check_snapshot(dt, f"the current table of shape '{self.shape}'")
        before = dt.version()
        now = int(time.time() * 1000)
        removes = [] if overwrite else [RemoveAction(p, True, now, s, {}) for p, s in removed]
        dt.create_write_transaction(
            [*removes, *adds],
            mode="overwrite" if overwrite else "append",
            schema=schema if overwrite else dt.schema(),
            commit_properties=properties,
        )
        dt.update_incremental()
        if not self.remote:  # (on a store: durable when the PUT returned)
            entries_sync(self.path / "_delta_log", before + 1, dt.version()).sync()
