"""One shape's changelog as an Iceberg table (``ChangelogTable``).

Layout: the table ``<namespace>.<shape>`` of the catalog (``iceberg.catalog``), at
``<root>/tables/<shape>``: Spark writes each batch's Parquet files under ``data/``
as for Delta (``sink.folder``), pyiceberg writes the table's metadata under
``metadata/``. A stream commit appends exactly the batch's files, read back for their
statistics, in one snapshot whose summary records the transaction range
(``tidemark.firstLsn``, ``tidemark.endLsn``) and the table's state
(``iceberg.snapshots``: the committed offset, the generation, retention, the leader's
epoch).

Exactly once: the replay check reads the committed offset of the snapshot the commit
is built on; the commit asserts that snapshot is still the newest. A batch at or
below the offset is skipped, one overlapping it is refused (``WriterFenced``), and a
commit that lost a race is checked again on the newer snapshot.

The primary key and the shape's definition are table properties
(``tidemark.primary-key``, ``tidemark.shape``); the Arrow types tidemark writes are
kept beside the Iceberg schema (``tidemark.arrow-schema``), so a column Iceberg
widens (``smallint``: int16 to int) reads back with the type the writers give it.

Durable: the batch's files are synced before the commit; the metadata files before
the catalog's pointer moves to them (``iceberg.io``); the catalog syncs the pointer.
A commit is durable when it returns: ``log_sync`` has nothing left.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import structlog

from tidemark.errors import SinkError, TableDamaged
from tidemark.sink.files import DataFile
from tidemark.sink.folder import TableFolder, holds
from tidemark.sink.iceberg import snapshots
from tidemark.sink.iceberg.catalog import refusal
from tidemark.sink.iceberg.rows import pointer
from tidemark.sink.iceberg.snapshots import GENERATION, OFFSET, RETAINED
from tidemark.sink.port import ChangelogFile, ChangelogView, CommitRecord
from tidemark.sink.schema import LSN, OP, primary_key_of, with_primary_key
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncSet, make_dirs
from tidemark.state.objectstore import Location, is_remote, join

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from tidemark.sink.iceberg.jvm import JavaCommits

log = structlog.get_logger("tidemark.sink")

APP_PREFIX = "tidemark:"
KEY_PROPERTY = "tidemark.primary-key"
SHAPE_PROPERTY = "tidemark.shape"
ARROW_PROPERTY = "tidemark.arrow-schema"


def app_id_for(shape: str, epoch: int = 1) -> str:
    return APP_PREFIX + shape if epoch <= 1 else f"{APP_PREFIX}{shape}#{epoch}"


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str | None) -> pa.Schema | None:
    if not text:
        return None
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (ValueError, pa.ArrowInvalid):
        return None


def writer_types(table: Table) -> pa.Schema:
    """The table's columns with the Arrow types tidemark writes them with (see the
    module docstring); a column changed outside tidemark takes Iceberg's type."""
    return _writer_types(snapshots.arrow_schema(table), table.properties.get(ARROW_PROPERTY))


def _writer_types(have: pa.Schema, stored_text: str | None) -> pa.Schema:
    """``writer_types`` of a table whose schema in Arrow is ``have`` and whose
    ``ARROW_PROPERTY`` is ``stored_text``."""
    stored = decode_schema(stored_text)
    if stored is None:
        return have
    fields = []
    for field in have:
        if field.name in stored.names:
            mine = stored.field(field.name)
            if snapshots.round_trip(pa.schema([mine])).field(0).type.equals(field.type):
                fields.append(mine.remove_metadata().with_nullable(field.nullable))
                continue
        fields.append(field)
    return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class _Born:
    """A table as the JVM created it: its metadata file, its schema in Arrow (and as
    ``arrow_schema`` gives it) and its key, as a read of that file would give them."""

    pointer: str
    have: pa.Schema
    schema: pa.Schema
    key: list[str]


class IcebergChangelog(TableFolder):
    """The changelog of one shape as an Iceberg table. Thread-safe."""

    def __init__(
        self, catalog: Catalog, namespace: str, root: Location, shape: str, *, epoch: int = 1
    ) -> None:
        self.root = root if is_remote(root) else Path(root)
        self.shape = shape
        self.path = join(self.root, "tables", shape)
        self.uri = str(self.path)
        self.app_id = app_id_for(shape, epoch)
        self.catalog = catalog
        self.ident = (namespace, shape)
        self.format_version = 2
        self.max_snapshots = snapshots.MAX_SNAPSHOTS
        self._lock = threading.RLock()
        self._table: Table | None = None
        self.fitted: pa.Schema | None = None
        # the stream commits' committer in Spark's driver, where there is one (iceberg.jvm)
        self.java: Callable[[], JavaCommits | None] | None = None
        # what the JVM just created, until the table is read or committed through this
        # object (most of a many-shape start: its backfill asks without parsing it); set
        # only while ``_table`` is None, and every read (``loaded``) drops it
        self._born: _Born | None = None

    @property
    def _where(self) -> str:
        return f"the table of shape '{self.shape}'"

    @property
    def name(self) -> str:
        return ".".join(self.ident)

    # -- existence, schema ----------------------------------------------------------
    def exists(self) -> bool:
        with self._lock:
            if self._table is not None or pointer(self.catalog, self.ident) is not None:
                return True  # (a SQL catalog's row: not read and parsed until needed)
            return self.loaded() is not None

    def table(self) -> Table:
        """The table as last read or committed through this object."""
        with self._lock:
            if self._table is None:
                self._table = self._load()
            return self._table

    def refresh(self) -> Table:
        """The table as the catalog has it now: read again, unless a SQL catalog's
        pointer is still at the metadata last read (a metadata file never changes)."""
        with self._lock:
            cached = self._table
            if cached is not None and cached.metadata_location == pointer(self.catalog, self.ident):
                return cached
            self._table = self._load()
            return self._table

    def refresh_handle(self) -> None:
        with self._lock:
            self._table = None
            self._born = None
            self.fitted = None

    def _load(self) -> Table:
        table = self.loaded()
        if table is None:
            raise SinkError(f"shape '{self.shape}' has no table {self.name} yet")
        return table

    def loaded(self) -> Table | None:
        """The table as the catalog has it now (cached), None when there is none: one
        catalog read (pyiceberg's ``table_exists`` is itself a ``load_table``)."""
        with self._lock:
            self._born = None
            self._table = load_or_none(self.catalog, self.ident, self.name)
            return self._table

    def create(
        self,
        schema: pa.Schema,
        primary_key: Sequence[str],
        definition: Mapping[str, Any] | None = None,
    ) -> bool:
        with self._lock:
            if self.recover():
                self.ensure_columns(schema)
                return False
            fencing.check()
            if isinstance(self.path, Path):
                make_dirs(self.path)
            plain = pa.schema([f.remove_metadata() for f in schema])
            properties = snapshots.TABLE_PROPERTIES | {
                "format-version": str(self.format_version),
                snapshots.MAX_SNAPSHOTS_PROPERTY: str(self.max_snapshots),
                KEY_PROPERTY: json.dumps(list(primary_key)),
                SHAPE_PROPERTY: json.dumps(dict(definition or {}), sort_keys=True, default=str),
                ARROW_PROPERTY: encode_schema(plain),
            }
            iceberg = snapshots.iceberg_schema(plain)
            location = (
                self.path.resolve().as_uri() if isinstance(self.path, Path) else str(self.path)
            )
            # born marked: the first snapshot holds the generation and the epoch
            born = snapshots.marked({}, {GENERATION: "0"})
            java = self.java() if self.java is not None else None
            try:
                if java is not None:  # (Iceberg's Java library: most of a many-shape start)
                    self._table = None
                    iceberg_json = iceberg.model_dump_json()
                    written = java.create(self.ident, location, iceberg_json, properties, born)
                    if written is None:
                        raise SinkError(
                            f"cannot create the Iceberg table {self.name} of shape "
                            f"'{self.shape}': another writer created it meanwhile; start "
                            "again (tidemark takes over a table it created)"
                        )
                    key = tuple(primary_key)
                    have, shaped = _made_schemas(iceberg_json, properties[ARROW_PROPERTY], key)
                    self._born = _Born(written, have, shaped, list(key))
                else:
                    properties["schema.name-mapping.default"] = (
                        iceberg.name_mapping.model_dump_json()
                    )
                    tx = self.catalog.create_table_transaction(
                        self.ident, schema=iceberg, location=location, properties=properties
                    )
                    with tx.update_snapshot(snapshot_properties=born).fast_append():
                        pass
                    self._table, self._born = tx.commit_transaction(), None
            except SinkError:
                raise
            except Exception as exc:
                refused = refusal(exc)
                raise SinkError(
                    f"cannot create the Iceberg table {self.name} of shape '{self.shape}' "
                    f"at {self.uri}: {type(exc).__name__}: {exc}"
                    + ("" if refused is None else f"; {refused}")
                ) from exc
            if isinstance(self.path, Path) and isinstance(self.root, Path):
                (self.path / "data").mkdir(exist_ok=True)
                # (the table's folder holds the two new names, data/ and metadata/; the
                # folders above it were synced when make_dirs made it, and metadata/ with
                # each file written into it, by tidemark's file IOs)
                synced = SyncSet()
                synced.folder(self.path)
                synced.sync()
            log.info("table.created", shape=self.shape, path=self.uri, table=self.name)
            return True

    def recover(self) -> bool:
        """At start: True when the table exists, every data file of its newest snapshot
        is there with its size, and pyiceberg's own retry is off on it."""
        with self._lock:
            if self._absent():
                self._table = self._born = None
                return False
            try:
                table = self.loaded()
                if table is None:
                    return False
                files = snapshots.data_files(table, cached=False)
            except Exception as exc:
                raise TableDamaged(self._damaged(f"its metadata cannot be read: {exc}")) from exc
            if KEY_PROPERTY not in table.properties:
                raise SinkError(
                    f"the Iceberg table {self.name} exists and was not created by tidemark "
                    f"(it has no {KEY_PROPERTY} property): drop it, or set [iceberg] "
                    "namespace to one tidemark may use alone"
                )
            if isinstance(self.path, Path):
                missing = [
                    f.file_path
                    for f in files
                    if not _has_size(self._local(f.file_path), f.file_size_in_bytes)
                ]
            else:  # (one listing of data/, not a request per file)
                sizes = {
                    f"data/{f.name}": f.size for f in objectstore.listing(self.location("data"))
                }
                missing = [
                    f.file_path
                    for f in files
                    if sizes.get(snapshots.relative(table, f.file_path)) != f.file_size_in_bytes
                ]
            if missing:
                raise TableDamaged(
                    self._damaged(
                        f"{len(missing)} data file(s) its snapshot names are missing or cut "
                        f"short, e.g. {missing[0]}"
                    )
                )
            wanted = snapshots.TABLE_PROPERTIES | {
                snapshots.MAX_SNAPSHOTS_PROPERTY: str(self.max_snapshots)
            }
            if any(table.properties.get(k) != v for k, v in wanted.items()):
                fencing.check()
                tx = table.transaction()
                tx.set_properties(wanted)
                self._table = tx.commit_transaction()
            if isinstance(self.path, Path) and not (self.path / "data").is_dir():
                (self.path / "data").mkdir(parents=True)
                synced = SyncSet()
                synced.folder(self.path)
                synced.sync()
            return True

    def _absent(self) -> bool:
        """True when a SQL catalog has no row for the table: one short query, where
        pyiceberg's ``load_table`` goes through its ORM session (most of the check at a
        new table's creation). False when there is a row, when the catalog is another
        kind, or when the query fails (``loaded`` then asks, and reports the error)."""
        if getattr(self.catalog, "engine", None) is None:
            return False
        try:
            return pointer(self.catalog, self.ident) is None
        except Exception:  # (an error ``loaded`` reports clearly)
            return False

    def _local(self, uri: str) -> Path:
        return Path(uri[len("file://") :]) if uri.startswith("file://") else Path(uri)

    def _damaged(self, what: str) -> str:
        return (
            f"shape '{self.shape}': its Iceberg table {self.name} at {self.uri} is damaged "
            f"({what}). Its rows must be rebuilt from a snapshot: start tidemark with "
            '[source] on_stream_gap = "resync" to have the table set aside and rebuilt, or '
            "remove the shape and add it again"
        )

    def arrow_schema(self) -> pa.Schema:
        with self._lock:
            born = self._born
            if born is not None:
                return born.schema
            table = self.table()
        return with_primary_key(writer_types(table), key_of(table))

    def primary_key(self) -> list[str]:
        with self._lock:
            born = self._born
            if born is not None:
                return list(born.key)
            return key_of(self.table())

    def op_type(self) -> pa.DataType | None:
        if not self.exists():
            return None
        schema = self.arrow_schema()
        return schema.field(OP).type if OP in schema.names else None

    def needs_replacement(self, schema: pa.Schema, primary_key: Sequence[str]) -> bool:
        with self._lock:
            born = self._born
            current = born.have if born is not None else snapshots.arrow_schema(self.table())
        wanted = snapshots.round_trip(pa.schema([f.remove_metadata() for f in schema]))
        for field in wanted:
            if field.name in current.names and not current.field(field.name).type.equals(
                field.type
            ):
                return True
        return list(primary_key) != self.primary_key()

    def ensure_columns(self, schema: pa.Schema) -> list[str]:
        with self._lock:
            have = set(self.arrow_schema().names)
            added = [f.remove_metadata() for f in schema if f.name not in have]
            if not added:
                return []
            self.fitted = None

            def build(table: Table, found: Mapping[str, str]) -> Table:
                stored = decode_schema(table.properties.get(ARROW_PROPERTY)) or pa.schema([])
                arrow = pa.schema([*stored, *[f for f in added if f.name not in stored.names]])

                def evolve(update: Any) -> None:
                    update.union_by_name(pa.schema([f.with_nullable(True) for f in added]))

                return snapshots.commit(
                    table,
                    snapshots.marked(found, {"tidemark.operation": "add-columns"}),
                    evolve=evolve,
                    properties={ARROW_PROPERTY: encode_schema(arrow)},
                )

            self._commit_loop(build)
            log.info("table.columns_added", shape=self.shape, columns=[f.name for f in added])
            return [f.name for f in added]

    # -- offsets ----------------------------------------------------------------------
    def _summary(self) -> dict[str, str]:
        table = self.loaded()
        return {} if table is None else snapshots.summary(table)

    def committed_lsn(self) -> int | None:
        return snapshots.number(self._summary(), OFFSET + self.app_id)

    def generation(self) -> int:
        return snapshots.number(self._summary(), GENERATION) or 0

    def retained_lsn(self, generation: int) -> int | None:
        return snapshots.number(self._summary(), f"{RETAINED}{generation}")

    def retained_lsn_now(self) -> int | None:
        """``retained_lsn`` of the table's own generation, from one read."""
        found = self._summary()
        return snapshots.number(found, f"{RETAINED}{snapshots.number(found, GENERATION) or 0}")

    def identity(self) -> str:
        return str(self.table().metadata.table_uuid)

    # -- data files ---------------------------------------------------------------------
    def active_files_with_sizes(self) -> list[tuple[str, int]]:
        with self._lock:
            born = self._born
            if born is not None and pointer(self.catalog, self.ident) == born.pointer:
                return []  # (as created: its one snapshot adds no file)
            table = self.refresh()
            return [
                (snapshots.relative(table, f.file_path), f.file_size_in_bytes)
                for f in snapshots.data_files(table)
            ]

    def file_uris(self) -> list[str]:
        with self._lock:
            return [f.file_path for f in snapshots.data_files(self.refresh())]

    def view(self) -> ChangelogView:
        from pyiceberg.conversions import from_bytes

        with self._lock:
            table = self.refresh()
        found = snapshots.summary(table)
        field = table.schema().find_field(LSN)
        files = []
        for f in snapshots.data_files(table):
            low = (f.lower_bounds or {}).get(field.field_id)
            high = (f.upper_bounds or {}).get(field.field_id)
            files.append(
                ChangelogFile(
                    snapshots.relative(table, f.file_path),
                    f.file_path,
                    f.file_size_in_bytes,
                    None if low is None else int(from_bytes(field.field_type, low)),  # type: ignore[arg-type]
                    None if high is None else int(from_bytes(field.field_type, high)),  # type: ignore[arg-type]
                    int(f.record_count),
                )
            )
        generation = snapshots.number(found, GENERATION) or 0
        snap = table.current_snapshot()
        schema = with_primary_key(writer_types(table), key_of(table))
        return ChangelogView(
            0 if snap is None else snap.snapshot_id,
            generation,
            str(table.metadata.table_uuid),
            schema,
            primary_key_of(schema),
            files,
            snapshots.number(found, f"{RETAINED}{generation}"),
        )

    def commits(self) -> list[CommitRecord]:
        with self._lock:
            table = self.refresh()
        out = []
        snap = table.current_snapshot()
        while snap is not None:
            found = snapshots.summary(table, snap.snapshot_id)
            out.append(
                CommitRecord(
                    snap.snapshot_id,
                    snapshots.number(found, "tidemark.endLsn"),
                    found.get("tidemark.operation", ""),
                    snap.timestamp_ms,
                )
            )
            parent = snap.parent_snapshot_id
            snap = None if parent is None else table.snapshot_by_id(parent)
        return out

    # -- commits --------------------------------------------------------------------------
    def log_sync(self) -> SyncSet:
        return SyncSet()  # (each commit is durable when it returns)

    def prepare(
        self, files: Sequence[DataFile], end_lsn: int, metadata: Mapping[str, Any] | None = None
    ) -> Path | None:
        return None  # (the catalog's commit writes the metadata)

    def _commit_loop(self, build: Any, *, over_others: bool = False) -> Table:
        """``build(table, summary)`` commits on the table as loaded; on a lost race the
        table is read again and ``build`` runs again (its checks with it). Refused when
        another writer changed the table beyond appends (``snapshots.check_others``),
        unless ``over_others`` (a backfill, which replaces every row)."""
        from pyiceberg.exceptions import CommitFailedException

        with self._lock:
            for attempt in range(1, snapshots.COMMIT_ATTEMPTS + 1):
                table = self.table()
                found = snapshots.summary(table)
                snapshots.check_fence(found, self._where)
                if not over_others:
                    snapshots.check_others(table, self.shape, self.name)
                try:
                    done: Table = build(table, found)
                except CommitFailedException as exc:
                    log.warning(
                        "commit.conflict", shape=self.shape, attempt=attempt, error=str(exc)
                    )
                    self._table = None
                    continue
                self._table = done
                self._forget_in_jvm()
                return done
        raise self._lost(snapshots.COMMIT_ATTEMPTS)

    def _lost(self, attempts: int | str) -> SinkError:
        return SinkError(
            f"shape '{self.shape}': {attempts} commits in a row lost a race with another "
            "writer of this table"
        )

    def commit(
        self,
        files: Sequence[DataFile],
        end_lsn: int,
        metadata: Mapping[str, Any] | None = None,
        *,
        first_lsn: int | None = None,
        prepared: Path | None = None,
    ) -> int | None:
        first = end_lsn if first_lsn is None else first_lsn
        extra = {
            "tidemark.operation": "stream",
            "tidemark.firstLsn": str(first),
            "tidemark.endLsn": str(end_lsn),
            "tidemark.files": str(len(files)),
            "tidemark.rows": str(sum(f.num_rows for f in files)),
            **{k: str(v) for k, v in (metadata or {}).items()},
            OFFSET + self.app_id: str(end_lsn),
        }
        synced = [False]
        skipped = [False]

        def build(table: Table, found: Mapping[str, str]) -> Table:
            if holds(self.shape, snapshots.number(found, OFFSET + self.app_id), first, end_lsn):
                skipped[0] = True
                return table
            if not synced[0]:
                self.files_sync(files).sync()  # the files before the commit names them
                synced[0] = True
            fencing.check()
            return snapshots.commit(
                table,
                snapshots.marked(found, extra),
                add=[snapshots.absolute(table, f.path) for f in files],
            )

        java = self.java() if self.java is not None else None
        with self._lock:
            if java is not None:
                return self._commit_in_jvm(java, files, first, end_lsn, extra)
            table = self._commit_loop(build)
            if skipped[0]:
                return None
            snap = table.current_snapshot()
            return 0 if snap is None else int(snap.sequence_number or 0)

    def _commit_in_jvm(
        self,
        java: JavaCommits,
        files: Sequence[DataFile],
        first: int,
        end_lsn: int,
        extra: Mapping[str, str],
    ) -> int | None:
        """``commit`` made by Iceberg's Java library in Spark's driver (``iceberg.jvm``):
        the same checks on the snapshot it builds on, the same snapshot."""
        self.files_sync(files).sync()  # the files before the commit names them
        fencing.check()
        kind, number = java.append(
            self.ident,
            [f.path for f in files],
            first,
            end_lsn,
            OFFSET + self.app_id,
            snapshots.CARRIED,
            extra,
        )
        self._table = self._born = None  # (this object's pyiceberg table is older now)
        if kind == "deposed":
            fencing.current().check_table(int(number), self._where)
        if kind == "others":  # (what, the snapshot, tidemark's newest: snapshots.own)
            what, snapshot_id, own_id = str(number).split(" ")
            raise SinkError(
                snapshots.others_refusal(
                    self.shape,
                    self.name,
                    what,
                    int(snapshot_id),
                    None if own_id == "-" else int(own_id),
                )
            )
        if kind in ("skip", "overlap"):
            holds(self.shape, int(number), first, end_lsn)  # (logs the replay; refuses overlaps)
            return None
        if kind == "lost":
            raise self._lost(number)
        if kind != "done":
            raise SinkError(f"shape '{self.shape}': the Iceberg commit answered {kind!r}")
        return int(number)

    def _forget_in_jvm(self) -> None:
        """After a commit through pyiceberg: the JVM's committer loads the table again."""
        java = self.java() if self.java is not None else None
        if java is not None:
            java.forget(self.ident)

    def backfill_commit(
        self,
        remove: Sequence[tuple[str, int]],
        files: Sequence[DataFile],
        metadata: Mapping[str, Any] | None = None,
        *,
        replace: tuple[pa.Schema, Sequence[str]] | None = None,
    ) -> int:
        self.files_sync(files).sync()
        gone = {p for p, _ in remove}
        java = self.java() if self.java is not None else None
        if java is not None and replace is None and not gone:
            return self._backfill_in_jvm(java, files, metadata)

        def build(table: Table, found: Mapping[str, str]) -> Table:
            generation = (snapshots.number(found, GENERATION) or 0) + 1
            kept = {k: v for k, v in found.items() if not k.startswith(RETAINED)}
            extra = {
                "tidemark.operation": "backfill",
                GENERATION: str(generation),
                **{k: str(v) for k, v in (metadata or {}).items()},
            }
            active = snapshots.data_files(table)
            if replace is None:
                delete = [f for f in active if snapshots.relative(table, f.file_path) in gone]
                return snapshots.commit(
                    table,
                    snapshots.marked(kept, extra),
                    add=[snapshots.absolute(table, f.path) for f in files],
                    delete=delete,
                )
            schema, key = replace
            plain = pa.schema([f.remove_metadata() for f in schema])
            extra["tidemark.schemaReplaced"] = "true"
            self.fitted = None
            return snapshots.commit(
                table,
                snapshots.marked(kept, extra),
                add=[snapshots.absolute(table, f.path) for f in files],
                delete=active,
                schema=snapshots.fresh_schema(plain, table),
                properties={
                    KEY_PROPERTY: json.dumps(list(key)),
                    ARROW_PROPERTY: encode_schema(plain),
                },
            )

        table = self._commit_loop(build, over_others=True)
        snap = table.current_snapshot()
        return 0 if snap is None else int(snap.sequence_number or 0)

    def _backfill_in_jvm(
        self,
        java: JavaCommits,
        files: Sequence[DataFile],
        metadata: Mapping[str, Any] | None,
    ) -> int:
        """``backfill_commit`` adding ``files`` and removing none (a shape's first backfill,
        most of a start with many shapes), made by Iceberg's Java library: the same
        snapshot, built on whatever the table holds."""
        extra = {
            "tidemark.operation": "backfill",
            **{k: str(v) for k, v in (metadata or {}).items()},
        }
        with self._lock:
            fencing.check()
            kind, number = java.append(
                self.ident,
                [f.path for f in files],
                0,
                0,
                "",
                tuple(c for c in snapshots.CARRIED if c != RETAINED),  # (a new generation's)
                extra,
                backfill=GENERATION,
            )
            self._table = self._born = None  # (this object's pyiceberg table is older now)
        if kind == "deposed":
            fencing.current().check_table(int(number), self._where)
        if kind == "lost":
            raise self._lost(number)
        if kind != "done":
            raise SinkError(f"shape '{self.shape}': the Iceberg backfill answered {kind!r}")
        return int(number)

    def retention_commit(
        self, remove: Sequence[tuple[str, int]], files: Sequence[DataFile], retained_lsn: int
    ) -> int:
        self.files_sync(files).sync()
        gone = {p for p, _ in remove}

        def build(table: Table, found: Mapping[str, str]) -> Table:
            delete = self._still_active(table, gone, "retention")
            generation = snapshots.number(found, GENERATION) or 0
            extra = {
                "tidemark.operation": "retention",
                "tidemark.retainedLsn": str(retained_lsn),
                f"{RETAINED}{generation}": str(retained_lsn),
            }
            return snapshots.commit(
                table,
                snapshots.marked(found, extra),
                add=[snapshots.absolute(table, f.path) for f in files],
                delete=delete,
            )

        table = self._commit_loop(build)
        snap = table.current_snapshot()
        return 0 if snap is None else int(snap.sequence_number or 0)

    def _still_active(self, table: Table, gone: set[str], what: str) -> list[Any]:
        """The data files named ``gone`` (relative paths), every one still in the table:
        else another commit changed them while ``what`` rewrote them."""
        active = snapshots.data_files(table)
        delete = [f for f in active if snapshots.relative(table, f.file_path) in gone]
        if len(delete) != len(gone):
            raise SinkError(
                f"shape '{self.shape}': changelog files changed while {what} rewrote "
                "them; the next round tries again"
            )
        return delete

    # -- upkeep ---------------------------------------------------------------------------
    def compact(self, target_size: int = 128 * 1024 * 1024) -> dict[str, Any]:
        with self._lock:
            schema = pa.schema([f.remove_metadata() for f in self.arrow_schema()])
            removed, added = self.rewrite_small(self.active_files_with_sizes(), target_size, schema)
            if not removed:
                return {"numFilesAdded": 0, "numFilesRemoved": 0}
            try:
                self.files_sync(added).sync()
                gone = {p for p, _ in removed}

                def build(table: Table, found: Mapping[str, str]) -> Table:
                    delete = self._still_active(table, gone, "compaction")
                    return snapshots.commit(
                        table,
                        snapshots.marked(found, {"tidemark.operation": "compaction"}),
                        add=[snapshots.absolute(table, f.path) for f in added],
                        delete=delete,
                    )

                self._commit_loop(build)
            except BaseException:
                self.delete_files(added)
                raise
            log.info("table.compacted", shape=self.shape, added=len(added), removed=len(removed))
            return {"numFilesAdded": len(added), "numFilesRemoved": len(removed)}

    def vacuum(self, retention_hours: int = 24, keep: Sequence[DataFile] = ()) -> list[str]:
        """Expire snapshots older than ``retention_hours`` (never the newest, which
        carries the table's state), then delete the files under the table's folder
        that no remaining snapshot names and that are older than that: data files of a
        failed batch or of expired snapshots, their manifests. ``keep``: files a
        pending batch will commit (made young first)."""
        with self._lock:
            now = time.time()
            if isinstance(self.path, Path):  # (on a store: left out by name below)
                for f in keep:
                    try:
                        os.utime(self.path / f.path, (now, now))
                    except FileNotFoundError:
                        continue
            self._commit_loop(lambda t, found: expire(t, retention_hours), over_others=True)
            kept = {f.path for f in keep}
            return remove_unreferenced(self.table(), self.path, retention_hours, kept)


def expire(table: Table, retention_hours: float) -> Table:
    """Remove the snapshots older than ``retention_hours`` but the newest, tidemark's
    newest (which carries the table's state) and others' after it (the way back to it),
    in a commit built on the newest (``CommitFailedException`` if another landed)."""
    from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotsUpdate

    current = table.current_snapshot()
    if current is None:
        return table
    mine, others = snapshots.own(table)
    kept = {current.snapshot_id, *(s.snapshot_id for s in [mine, *others] if s is not None)}
    cutoff = (time.time() - retention_hours * 3600) * 1000
    old = [
        s.snapshot_id
        for s in table.snapshots()
        if s.timestamp_ms < cutoff and s.snapshot_id not in kept
    ]
    if not old:
        return table
    fencing.check()
    tx = table.transaction()
    tx._apply(
        (RemoveSnapshotsUpdate.model_validate({"snapshot-ids": old}),),
        (AssertRefSnapshotId.model_validate({"snapshot-id": current.snapshot_id, "ref": "main"}),),
    )
    return tx.commit_transaction()


@functools.lru_cache(maxsize=256)
def _made_schemas(
    iceberg_json: str, arrow_text: str, key: tuple[str, ...]
) -> tuple[pa.Schema, pa.Schema]:
    """A new table's schema in Arrow and as ``arrow_schema`` gives it, from the Iceberg
    schema it was made with (JSON) and its ``ARROW_PROPERTY``: made once per schema (the
    shapes of one table share theirs)."""
    from pyiceberg.schema import Schema

    have = snapshots.normalized(Schema.model_validate_json(iceberg_json).as_arrow())
    return have, with_primary_key(_writer_types(have, arrow_text), list(key))


def key_of(table: Table) -> list[str]:
    """The primary key tidemark recorded on ``table`` ([]: none)."""
    try:
        return list(json.loads(table.properties.get(KEY_PROPERTY) or "[]"))
    except ValueError:
        return []


def load_or_none(catalog: Catalog, ident: tuple[str, str], name: str) -> Table | None:
    """``ident`` loaded from ``catalog``; None when the catalog has no such table."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        return None
    except Exception as exc:
        refused = refusal(exc)
        if refused is not None:
            raise SinkError(
                f"shape '{ident[1]}': the Iceberg catalog would not give {name} "
                f"({type(exc).__name__}: {exc}); {refused}"
            ) from exc
        raise SinkError(f"cannot ask the Iceberg catalog for {name}: {exc}") from exc


def remove_unreferenced(
    table: Table, folder: Location, retention_hours: float, keep: set[str] | None = None
) -> list[str]:
    """Delete the data and manifest files under ``folder`` no snapshot of ``table``
    names, older than ``retention_hours`` (nor in ``keep``); the paths removed
    (relative)."""
    named: set[str] = set()
    for snap in table.snapshots():
        named.add(snapshots.relative(table, snap.manifest_list))
        for manifest in snap.manifests(table.io):
            named.add(snapshots.relative(table, manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                named.add(snapshots.relative(table, entry.data_file.file_path))
    named |= keep or set()
    cutoff = time.time() - retention_hours * 3600
    if not isinstance(folder, Path):
        return _remove_unreferenced_remote(folder, named, cutoff)
    removed = []
    for dirpath, _, names in os.walk(folder):
        rel_dir = os.path.relpath(dirpath, folder)
        if not rel_dir.startswith(("data", "bucket", "metadata")):
            continue
        for name in names:
            rel = f"{rel_dir}/{name}"
            if not name.endswith((".parquet", ".avro")) or rel in named:
                continue
            path = Path(dirpath) / name
            try:
                if path.stat().st_mtime >= cutoff:
                    continue
                fencing.check()
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(rel)
    if removed:
        log.info("table.vacuumed", table=str(folder), files=len(removed))
    return removed


def _remove_unreferenced_remote(folder: Location, named: set[str], cutoff: float) -> list[str]:
    """``remove_unreferenced`` on an object store: one listing, one batched delete."""
    gone = [
        f.name
        for f in objectstore.listing(folder)
        if f.name.startswith(("data/", "bucket", "metadata/"))
        and f.name.endswith((".parquet", ".avro"))
        and f.name not in named
        and f.modified_ms < cutoff * 1000
    ]
    if gone:
        fencing.check()
        objectstore.delete([join(folder, name) for name in gone])
        log.info("table.vacuumed", table=str(folder), files=len(gone))
    return gone


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False
