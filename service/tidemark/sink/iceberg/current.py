"""The current-state table of a shape as an Iceberg table (``CurrentState``; the
refresh itself is ``tidemark.sink.current``).

The table ``<namespace>_current.<shape>`` at ``<root>/current/<shape>``. Each refresh
is one snapshot built on the one the refresh planned from (so two refreshes racing,
or a newer leader's mark, make the later commit fail): it deletes the touched
buckets' files and adds their new ones, and its summary records ``tidemark.lsn``,
``tidemark.generation``, ``tidemark.changelogId`` and ``tidemark.buckets``. Time
travel to that snapshot with any Iceberg engine gives the shape's state at that LSN.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import structlog

from tidemark.errors import SinkError
from tidemark.sink.current import CURRENT_DIR, bucket_of_path, current_path, point_of
from tidemark.sink.files import DataFile
from tidemark.sink.iceberg import snapshots
from tidemark.sink.iceberg.catalog import current_namespace, refusal
from tidemark.sink.iceberg.table import (
    ARROW_PROPERTY,
    KEY_PROPERTY,
    encode_schema,
    key_of,
    load_or_none,
    writer_types,
)
from tidemark.sink.port import Pinned, RefreshPoint
from tidemark.sink.schema import primary_key_of, with_primary_key
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncSet, make_dirs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

log = structlog.get_logger("tidemark.current")


class IcebergCurrent:
    """The current-state Iceberg table of one shape."""

    def __init__(
        self, catalog: Catalog, namespace: str, root: str | Path, shape: str, format_version: int
    ) -> None:
        self.shape = shape
        self.remote = objectstore.is_remote(root)
        self.root = Path(root) if not self.remote else Path(".")
        self.path = current_path(self.root, shape)  # (a local table's folder)
        self.uri = str(objectstore.join(root, CURRENT_DIR, shape) if self.remote else self.path)
        self.catalog = catalog
        self.ident = (current_namespace(namespace), shape)
        self.format_version = format_version
        self.max_snapshots = snapshots.MAX_SNAPSHOTS
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return ".".join(self.ident)

    def exists(self) -> bool:
        return self.loaded() is not None

    def loaded(self) -> Table | None:
        """The table as the catalog has it now; None when there is none."""
        return load_or_none(self.catalog, self.ident, self.name)

    def recover(self) -> None:
        """Nothing to repair: a commit is durable when it returns, files it did not
        name are removed by the vacuum."""

    def load(self) -> Table:
        table = self.loaded()
        if table is None:
            raise SinkError(f"shape '{self.shape}' has no current-state table {self.name}")
        return table

    def pinned(self) -> Pinned | None:
        table = self.loaded()
        if table is None:
            return None
        snap = table.current_snapshot()
        points = self._points(table, snap, first_only=True)
        schema = with_primary_key(writer_types(table), key_of(table))
        return Pinned(
            table, 0 if snap is None else snap.snapshot_id, points[0] if points else None, schema
        )

    def points(self, table: Table | None = None) -> list[RefreshPoint]:
        """The refreshes, newest first, of the table as now (or as ``table`` holds it)."""
        if table is None:
            table = self.loaded()
        if table is None:
            return []
        return self._points(table, table.current_snapshot(), first_only=False)

    @staticmethod
    def _points(table: Table, snap: Snapshot | None, *, first_only: bool) -> list[RefreshPoint]:
        """The refreshes in the lineage of ``snap``, newest first (marks are skipped)."""
        out: list[RefreshPoint] = []
        while snap is not None:
            found = snapshots.summary(table, snap.snapshot_id)
            point = point_of(found, snap.snapshot_id, snap.timestamp_ms)
            if point is not None:
                out.append(point)
                if first_only:
                    break
            parent = snap.parent_snapshot_id
            snap = None if parent is None else table.snapshot_by_id(parent)
        return out

    def files_by_bucket(self, pinned: Pinned) -> dict[int, list[tuple[str, int]]]:
        table = pinned.handle
        out: dict[int, list[tuple[str, int]]] = {}
        for f in snapshots.data_files(table, pinned.version or None):
            rel = snapshots.relative(table, f.file_path)
            bucket = bucket_of_path(rel)
            out.setdefault(-1 if bucket is None else bucket, []).append((rel, f.file_size_in_bytes))
        return out

    def file_uris(self, version: int | None = None) -> list[str]:
        return [f.file_path for f in snapshots.data_files(self.load(), version)]

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
        from pyiceberg.exceptions import CommitFailedException

        synced = SyncSet()
        for f in added if not self.remote else ():  # (on a store: durable once put)
            synced.new_file(self.path / f.path, self.path, f.size)
        synced.sync()  # the files before the commit that names them
        plain = pa.schema([f.remove_metadata() for f in schema])
        with self._lock:
            if pinned is None:
                self._create(plain, primary_key_of(schema), added, metadata)
                return
            table: Table = pinned.handle
            found = snapshots.summary(table)
            where = f"the current table of shape '{self.shape}'"
            snapshots.check_fence(found, where)
            fencing.check()
            active = snapshots.data_files(table)
            if overwrite:
                delete = active
            else:
                gone = {p for p, _ in removed}
                delete = [f for f in active if snapshots.relative(table, f.file_path) in gone]
            replace = overwrite and not writer_types(table).equals(plain)
            try:
                snapshots.commit(
                    table,
                    snapshots.marked(found, metadata),
                    add=[snapshots.absolute(table, f.path) for f in added],
                    delete=delete,
                    schema=snapshots.fresh_schema(plain, table) if replace else None,
                    properties={
                        ARROW_PROPERTY: encode_schema(plain),
                        KEY_PROPERTY: json.dumps(primary_key_of(schema)),
                    }
                    if replace
                    else None,
                )
            except CommitFailedException as exc:
                # a newer leader's mark: Deposed; else another refresh won the race
                snapshots.check_fence(snapshots.summary(self.load()), where)
                raise SinkError(
                    f"shape '{self.shape}': another commit reached {self.name} while this "
                    "refresh ran; the next refresh folds again"
                ) from exc

    def _create(
        self,
        schema: pa.Schema,
        key: list[str],
        added: Sequence[DataFile],
        metadata: Mapping[str, str],
    ) -> None:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        fencing.check()
        if not self.remote:
            make_dirs(self.path)
        location = self.uri if self.remote else self.path.resolve().as_uri()
        iceberg = snapshots.iceberg_schema(schema)
        properties = snapshots.TABLE_PROPERTIES | {
            "format-version": str(self.format_version),
            snapshots.MAX_SNAPSHOTS_PROPERTY: str(self.max_snapshots),
            KEY_PROPERTY: json.dumps(key),
            ARROW_PROPERTY: encode_schema(schema),
            "schema.name-mapping.default": iceberg.name_mapping.model_dump_json(),
        }
        try:
            tx = self.catalog.create_table_transaction(
                self.ident,
                schema=iceberg,
                location=location,
                properties=properties,
            )
            io = tx._table.io
            with tx.update_snapshot(
                snapshot_properties=snapshots.marked({}, metadata)
            ).fast_append() as files:
                for f in added:
                    uri = f"{location.rstrip('/')}/{f.path}"
                    files.append_data_file(parquet_file_to_data_file(io, tx.table_metadata, uri))
            tx.commit_transaction()
        except Exception as exc:
            refused = refusal(exc)
            raise SinkError(
                f"cannot create the Iceberg table {self.name} (current state of shape "
                f"'{self.shape}'): {type(exc).__name__}: {exc}"
                + ("" if refused is None else f"; {refused}")
            ) from exc
        if not self.remote:
            synced = SyncSet()
            synced.new_folder(self.path / "metadata", self.root)
            synced.sync()
