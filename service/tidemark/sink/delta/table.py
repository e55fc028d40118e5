"""One shape's Delta table and its commit protocol.

Layout under the sink root::

    <root>/tables/<shape>/_delta_log/...        the Delta log
    <root>/tables/<shape>/data/<batch-uuid>/     Parquet files written by Spark

A batch is written by Spark into a fresh ``data/<batch-uuid>/`` folder, then one
Delta commit (``deltalake``) adds exactly those files. The commit carries the
application transaction ``(tidemark:<shape>, end_lsn)``, where ``end_lsn`` is the
commit LSN of the batch's last transaction, plus commit metadata (end LSN, row
counts). Files not in the log are invisible to every reader, so a crash before
the commit leaves nothing half-visible; ``vacuum`` later removes such leftovers.

Idempotence: before committing, the table's transaction version for our app id is
checked; a batch at or below it was committed already (a replay) and is skipped.
On start, that version is the shape's committed offset: the collector drops every
transaction at or below it. Commits happen at transaction boundaries only.

One writer (fencing): the check and the commit are one atomic step. The commit is
made on the handle whose log version was checked, and deltalake's conflict
checker refuses a commit carrying our app id when any commit since that version
carried it too (tested in ``test_sink_fencing``: a blind rebase never happens for
our app id). On that conflict the log is re-read and the check made again. A
batch whose first transaction is at or below the table's version while its last
is above it overlaps what another writer committed: ``WriterFenced``, and nothing
of it is committed (one process never produces such a batch: it drops what the
table holds, and its batches follow each other).

The primary key is recorded in the schema itself (field metadata
``tidemark.primary_key`` = the column's position in the key), so a commit that
replaces the schema replaces the key with it, atomically; the metadata
description also holds JSON with the key and the shape definition (the Delta
kernel refuses custom configuration keys), so a reader needs nothing but the
table to fold it (``tidemark.read``).

Appends without the library (the hot path): a stream commit adds files and nothing
else, so when the handle knows the log's newest version ``V`` (it made or read it)
and the table's protocol asks nothing of a writer (``minWriterVersion`` <= 2, no
writer features), the commit is written as the Delta log entry ``V+1`` directly:
a temp file in ``_delta_log`` moved to ``<V+1>.json`` only if that version does not
exist (``durable.publish_new``: put-if-absent, as deltalake does on a local
filesystem). The replay and fence checks use the app version the handle knew at
``V``: nothing can have committed after ``V`` when ``V+1`` did not exist, so check
and commit are still one atomic step. When ``V+1`` exists (another writer, or this
process's own maintenance, committed), the commit goes the library's way: re-read,
check, commit. Every ``checkpointInterval`` versions (100) the library writes a
checkpoint, as its post-commit hook does. A library commit costs 4-7 ms (commit
plus the re-read after it); this one 0.3 ms, most of it creating the file, which
is what a flush round of 1000 shapes pays 1000 times. A backfill commit that removes
nothing and keeps the schema (a new shape's first) is written the same way, with the
generation counted up.

New tables without the library: the library makes the first table of each schema, and
its first log entry (protocol and metadata) is kept; a later table of the same schema
is made by writing that entry with its own id, name, description and time, put only
if absent, and its head is known at once (version 0, no files). Only entries whose
protocol asks nothing of a writer are kept. At 1000 new shapes the library's creation
and backfill commit (with the reads of the log around them) were most of the start.

Durability (``tidemark.state.durable``): a commit's files are synced (``fdatasync``, with
their ``data/<uuid>/`` and ``data/`` folders) before the entry that names them is
written; an entry written directly is synced before it gets its name, and its
``_delta_log/`` folder after (by the caller: a flush round syncs the folders of all
its tables in one step, ``log_sync``); a commit through the library syncs its entries
(and a checkpoint) before it returns, the library itself syncing nothing. Crash
argument: after those syncs, a power loss leaves the commit whole; before them it
leaves no entry (its name was not durable) or, for the library's commits, an empty or
torn entry at the end of the log, which ``recover`` removes at the next start (it
was never synced, so nothing was acknowledged or deleted because of it); the next
commit of a table is made only after the previous one was synced, so a torn entry is
never followed by a whole one. A process crash (the page cache kept) between a
commit and its sync is covered by ``recover`` too: it syncs the newest commit
before the restart acknowledges it.

Stream epochs: the application id is ``tidemark:<shape>`` on the first stream
tidemark follows and ``tidemark:<shape>#<epoch>`` after it adopted another one
(``tidemark.continuity``): a new stream's LSNs may be lower than the old one's,
and Delta refuses to lower an application's version, so a new epoch starts a new
application id instead of reading a stale offset as "already committed".
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import RemoveAction

from tidemark.errors import SinkError, TableDamaged
from tidemark.sink.delta.log import (
    add_action,
    add_entry,
    delta_exists,
    entries_sync,
    recover_log,
)
from tidemark.sink.files import DataFile
from tidemark.sink.folder import TableFolder, holds, move_aside
from tidemark.sink.port import ChangelogFile, ChangelogView, CommitRecord
from tidemark.sink.schema import LSN, OP, primary_key_of, with_primary_key
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncSet, make_dirs, publish_new, write_synced
from tidemark.state.objectstore import Location, is_remote, join

log = structlog.get_logger("tidemark.sink")

APP_PREFIX = "tidemark:"
GENERATION_PREFIX = "tidemark-generation:"
RETAINED_PREFIX = "tidemark-retained:"
COMMIT_ATTEMPTS = 5
CHECKPOINT_INTERVAL = 100  # Delta's default delta.checkpointInterval
TXN_RETENTION_KEY = "delta.setTransactionRetentionDuration"
TRANSACTION_RETENTION = "interval 36500 days"  # (what tidemark puts instead: never)
ENGINE = "tidemark"


def app_id_for(shape: str, epoch: int = 1) -> str:
    return APP_PREFIX + shape if epoch <= 1 else f"{APP_PREFIX}{shape}#{epoch}"


@dataclass(frozen=True, slots=True)
class _Head:
    """What a handle knows of the log's newest version: an append may write the next
    version directly (see the module docstring)."""

    version: int
    app_version: int | None  # our application transaction's version at ``version``
    checkpoint_interval: int
    generation: int  # the table's generation at ``version`` (``ShapeTable.generation``)


@dataclass(frozen=True)
class _Made:
    """What the library wrote as a new table's protocol and metadata for a schema."""

    protocol: dict[str, Any]
    metadata: dict[str, Any]  # (its id, name, description and time are each table's own)
    checkpoint_interval: int
    arrow: pa.Schema  # the schema as the library gives it back (``arrow_schema``)


class _Creations:
    """The first log entry the library wrote for each schema tables were made with: a
    table of the same schema is made by writing that entry directly (a library
    creation cost 15-20 ms of two busy cores at 1000 new shapes, most of the
    start-up). Only entries whose protocol asks nothing of a writer are kept, so
    what the library would decide for a schema is never guessed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[bytes, _Made] = {}

    @staticmethod
    def _key(schema: pa.Schema) -> bytes:
        return bytes(schema.serialize())

    def get(self, schema: pa.Schema) -> _Made | None:
        with self._lock:
            return self._made.get(self._key(schema))

    def learn(self, schema: pa.Schema, dt: DeltaTable, log_dir: Location) -> None:
        """Keep what the library wrote as version 0 of ``dt`` in ``log_dir`` (best
        effort)."""
        try:
            text = objectstore.read(join(log_dir, f"{0:020d}.json"))
            actions = [json.loads(line) for line in (text or b"").splitlines() if line]
        except (OSError, ValueError, SinkError):
            return
        protocol = next((a["protocol"] for a in actions if "protocol" in a), None)
        metadata = next((a["metaData"] for a in actions if "metaData" in a), None)
        if protocol != {"minReaderVersion": 1, "minWriterVersion": 2} or metadata is None:
            return
        interval = int(
            (metadata.get("configuration") or {}).get("delta.checkpointInterval")
            or CHECKPOINT_INTERVAL
        )
        with self._lock:
            self._made[self._key(schema)] = _Made(
                protocol, metadata, interval, pa.schema(dt.schema().to_arrow())
            )


_MADE = _Creations()


def tables_dir(root: Location) -> Location:
    return join(root, "tables")


def table_path(root: Location, shape: str) -> Location:
    return join(root, "tables", shape)


def set_aside(table: ShapeTable) -> Location:
    """Move a damaged table's folder to ``<root>/damaged/<shape>-<time>/`` (kept for a
    look, never read by tidemark again), durably; returns where it went."""
    aside = move_aside(table.root, table.shape, table.path)
    table.refresh_handle()
    return aside


def _custom(
    files: Sequence[DataFile], end_lsn: int, metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What a stream commit records in its commit info."""
    return {"tidemark.endLsn": end_lsn, "tidemark.files": len(files), **(metadata or {})}


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


class ShapeTable(TableFolder):
    """The Delta table of one shape. Thread-safe: Spark jobs commit from worker threads."""

    def __init__(self, root: Location, shape: str, *, epoch: int = 1) -> None:
        self.root = root if is_remote(root) else Path(root)
        self.shape = shape
        self.path = table_path(self.root, shape)
        self.uri = str(self.path)
        self._options = objectstore.storage_options(self.path)
        self.app_id = app_id_for(shape, epoch)
        self.name = self.uri
        self._lock = threading.RLock()
        self._dt: DeltaTable | None = None
        self._head: _Head | None = None
        # the schema of a table made directly (``_create_directly``), until the handle is
        # read: its schema changes only through the handle
        self._schema0: pa.Schema | None = None
        self._direct = True  # appends may be written directly (see _append)
        self._behind = False  # the handle has not read appends written directly
        # a writer schema found to fit the table (``writers.job.fit_table``); forgotten
        # whenever the table's schema may have changed through this object
        self.fitted: pa.Schema | None = None

    # -- existence and creation -------------------------------------------

    def exists(self) -> bool:
        return delta_exists(self.uri, self._options)

    def _open_delta(self) -> DeltaTable | None:
        """The table opened, or None when it has none. Not ``exists`` first:
        deltalake's ``is_deltatable`` holds the GIL while it asks the store (a LIST, 20+
        ms on S3), so every other thread, and the event loop, waits for it; opening
        lets them run (10 tables opened by 10 threads: 0.33 s with ``is_deltatable``
        first, against 0.21 s without it, on S3Proxy 20 ms away, 2026-11-30)."""
        try:
            return DeltaTable(self.uri, storage_options=self._options)
        except TableNotFoundError:
            return None

    def create(
        self,
        schema: pa.Schema,
        primary_key: Sequence[str],
        definition: Mapping[str, Any] | None = None,
    ) -> bool:
        """Create the table (idempotent when it exists with a compatible schema); True
        when it was made now."""
        with self._lock:
            if self.recover():
                self.ensure_columns(schema)
                return False
            fencing.check()
            if isinstance(self.path, Path):
                make_dirs(self.path)
            description = json.dumps(
                {"tidemark": {"primary_key": list(primary_key), "shape": dict(definition or {})}},
                sort_keys=True,
            )
            keyed = with_primary_key(schema, primary_key)
            made = _MADE.get(keyed) if self._direct else None
            if made is None or not self._create_directly(made, description):
                self._create_library(keyed, description)
            self._created()
            if self._dt is not None:
                # the first commits (a new shape's backfill, then the stream's) may be
                # written directly: the handle made the log's only version
                self._know(self._dt)
            log.info("table.created", shape=self.shape, path=self.uri)
            return True

    def _create_library(self, schema: pa.Schema, description: str) -> None:
        try:
            self._dt = DeltaTable.create(
                self.uri,
                schema=schema,
                mode="error",
                name=self.shape,
                description=description,
                commit_properties=fencing.current().creation(),
                storage_options=self._options,
            )
        except Exception as exc:
            raise SinkError(
                f"cannot create the Delta table of shape '{self.shape}' at {self.uri}: {exc}"
            ) from exc
        _MADE.learn(schema, self._dt, self.log_dir)

    def _create_directly(self, made: _Made, description: str) -> bool:
        """Write the new table's first log entry as the library wrote it for a table of
        the same schema (``_MADE``), with this table's id, name and description; its
        head is then known without reading it back. ``SinkError`` when the folder has
        a first entry already (as the library's ``mode="error"``); False (nothing
        written) when the filesystem cannot put a file only if absent."""
        now = int(time.time() * 1000)
        metadata = {
            **made.metadata,
            "id": str(uuid.uuid4()),
            "name": self.shape,
            "description": description,
            "createdTime": now,
        }
        info: dict[str, Any] = {
            "timestamp": now,
            "operation": "CREATE TABLE",
            "operationParameters": {
                "location": (self.path.as_uri() if isinstance(self.path, Path) else self.uri) + "/",
                "mode": "ErrorIfExists",
                "metadata": json.dumps(metadata, separators=(",", ":")),
                "protocol": json.dumps(made.protocol, separators=(",", ":")),
            },
            "engineInfo": ENGINE,
            **fencing.current().commit_info(),
        }
        lines = [{"commitInfo": info}, {"protocol": made.protocol}, {"metaData": metadata}]
        epoch = fencing.current().epoch
        if epoch is not None:  # born marked, as ``Fence.creation`` has the library do
            lines.append({"txn": {"appId": fencing.current().app_id, "version": epoch}})
        entry = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        if isinstance(self.log_dir, Path):
            self.log_dir.mkdir(exist_ok=True)
        published = self._put_entry(entry.encode(), 0)
        if published is None:
            return False
        if not published:
            raise SinkError(
                f"cannot create the Delta table of shape '{self.shape}' at {self.uri}: "
                "a table exists there already"
            )
        self._dt = None
        self._head = _Head(0, None, made.checkpoint_interval, 0)
        self._schema0 = made.arrow
        return True

    def _created(self) -> None:
        """A new table's first log entry, its ``data/`` folder and the folders up to the
        sink root made durable: a commit's files then need only their own folders
        (nothing to make on an object store: its folders are names)."""
        if not isinstance(self.path, Path) or not isinstance(self.root, Path):
            return
        (self.path / "data").mkdir(exist_ok=True)
        synced = SyncSet()
        synced.new_folder(self.path / "data", self.root)
        self._sync_entries(synced, 0, 0)
        synced.sync()

    def table(self) -> DeltaTable:
        """The library's handle, current with every commit made through this object."""
        with self._lock:
            dt = self._handle()
            if self._behind:  # appends written directly since it last read the log
                dt.update_incremental()
                self._behind = False
            return dt

    @property
    def _where(self) -> str:
        return f"the table of shape '{self.shape}'"

    def _handle(self) -> DeltaTable:
        """The handle as it is: its schema and metadata are the table's (appends
        written directly change neither), its files and versions may be behind."""
        with self._lock:
            if self._dt is None:
                opened = self._open_delta()
                if opened is None:
                    raise SinkError(f"shape '{self.shape}' has no table at {self.uri} yet")
                self._dt = opened
                self._behind = False
                self._schema0 = None
            return self._dt

    def refresh_handle(self) -> None:
        """Forget what the handle knew of the table (its folder was replaced)."""
        with self._lock:
            self._dt = self._head = self._schema0 = None
            self.fitted = None

    def refresh(self) -> DeltaTable:
        with self._lock:
            self._dt = self._head = self._schema0 = None
            self.fitted = None
            return self.table()

    # -- what is committed --------------------------------------------------

    def committed_lsn(self) -> int | None:
        """The end LSN of the last committed batch (the shape's committed offset)."""
        return self._app_version(self.app_id)

    def generation(self, dt: DeltaTable | None = None) -> int:
        """How many times the table was rebuilt from a snapshot (a backfill or resync
        commit counts one up): a current-state table folded from an older generation
        is rebuilt (``tidemark.sink.delta.current``). 0 for tables made before it was kept."""
        return self._app_version(GENERATION_PREFIX + self.shape, dt) or 0

    def retained_lsn(self, generation: int, dt: DeltaTable | None = None) -> int | None:
        """Rows with ``_lsn`` at or below this were dropped by changelog retention
        (``compact_changelog``) in this generation; None: the history is whole."""
        return self._app_version(f"{RETAINED_PREFIX}{self.shape}@{generation}", dt)

    def _app_version(self, app_id: str, dt: DeltaTable | None = None) -> int | None:
        """The version of an application transaction, in ``dt`` (a pinned version) or
        in the table as it is now (None: no table, or never set)."""
        if dt is not None:
            return dt.transaction_version(app_id)
        if not self.exists():
            return None
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            return dt.transaction_version(app_id)

    def op_type(self) -> pa.DataType | None:
        """The type of the table's ``_op`` column (None: no table yet)."""
        if not self.exists():
            return None
        schema = self.arrow_schema()
        return schema.field(OP).type if OP in schema.names else None

    def described(self) -> dict[str, Any]:
        """What tidemark recorded about the shape when it created the table."""
        text = self._handle().metadata().description or "{}"
        try:
            return dict(json.loads(text).get("tidemark") or {})
        except (ValueError, AttributeError) as exc:
            raise SinkError(
                f"table {self.uri} was not created by tidemark "
                "(its description is not tidemark's JSON)"
            ) from exc

    def identity(self) -> str:
        """The Delta table's id (a table made again at the same place has another)."""
        return str(self.table().metadata().id)

    def primary_key(self) -> list[str]:
        """The key the table's rows are folded by: from the schema (see the module
        docstring), or the description of a table created before keys lived there."""
        return primary_key_of(self.arrow_schema()) or list(
            self.described().get("primary_key") or []
        )

    def needs_replacement(self, schema: pa.Schema, primary_key: Sequence[str]) -> bool:
        """Whether a table with ``schema`` and ``primary_key`` cannot be reached from this
        one by adding columns (a column's type or the key changed)."""
        current = self.arrow_schema()
        for field in schema:
            if field.name in current.names and not current.field(field.name).type.equals(
                field.type
            ):
                return True
        return list(primary_key) != self.primary_key()

    def arrow_schema(self) -> pa.Schema:
        with self._lock:
            if self._dt is None and self._schema0 is not None:
                return self._schema0
            return pa.schema(self._handle().schema().to_arrow())

    def ensure_columns(self, schema: pa.Schema) -> list[str]:
        """Add the fields of ``schema`` the table lacks; returns their names."""
        with self._lock:
            current = set(self.arrow_schema().names)
            added = [f for f in schema if f.name not in current]
            if added:
                from deltalake.schema import Field

                self.fitted = None
                dt = self.table()
                before = dt.version()
                dt.alter.add_columns([Field.from_arrow(f) for f in added])
                self._synced_library_commit(before, dt.version())
                log.info("table.columns_added", shape=self.shape, columns=[f.name for f in added])
            return [f.name for f in added]

    # -- writing ------------------------------------------------------------

    def commit(
        self,
        files: Sequence[DataFile],
        end_lsn: int,
        metadata: Mapping[str, Any] | None = None,
        *,
        first_lsn: int | None = None,
        prepared: Path | None = None,
    ) -> int | None:
        """Add ``files`` in one commit tagged ``(app_id, end_lsn)``; ``first_lsn`` is the
        commit LSN of the batch's first transaction (default: ``end_lsn``);
        ``prepared``: its log entry, written and synced already (``prepare``).

        Returns the new table version, or None when ``end_lsn`` was committed already.
        Raises ``WriterFenced`` when another writer committed part of the batch.
        """
        first = end_lsn if first_lsn is None else first_lsn
        custom = _custom(files, end_lsn, metadata)
        with self._lock:
            try:
                return self._commit(files, custom, first, end_lsn, prepared)
            finally:
                if prepared is not None:  # (not published: the library's way, a replay)
                    fencing.remove_own(prepared)

    def prepare(
        self, files: Sequence[DataFile], end_lsn: int, metadata: Mapping[str, Any] | None = None
    ) -> Path | None:
        """The log entry a direct append of ``files`` would publish, written now as a
        temp file in ``_delta_log/`` and not synced: a flush round syncs the entries of
        all its tables with their files in one step, then ``commit(prepared=...)``
        names each (an entry is synced before it gets its name either way). None when
        the next commit cannot be a direct append (see the module docstring)."""
        with self._lock:
            if self._head is None or not isinstance(self.log_dir, Path):
                return None  # (on an object store an entry is one PUT: nothing to sync)
        fencing.check()  # (a deposed leader leaves not even a temp file behind)
        temp = self.log_dir / f"_commit_{uuid.uuid4()}.json.tmp"
        with open(temp, "xb") as fh:
            fh.write(self._entry(files, _custom(files, end_lsn, metadata), end_lsn))
        return temp

    def _commit(
        self,
        files: Sequence[DataFile],
        custom: Mapping[str, Any],
        first: int,
        end_lsn: int,
        prepared: Path | None,
    ) -> int | None:
        head = self._head
        if head is not None:
            if self._holds(head.app_version, first, end_lsn):
                return None
            version = self._append(head, files, custom, end_lsn, prepared)
            if version is not None:
                return version
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            dt = self.table()
            dt.update_incremental()
            if self._holds(dt.transaction_version(self.app_id), first, end_lsn):
                return None
            try:
                return self._write(dt, [], files, custom, end_lsn)
            except CommitFailedError as exc:
                # a commit with our app id landed since the check: check again
                log.warning("commit.conflict", shape=self.shape, attempt=attempt, error=str(exc))
        raise SinkError(
            f"shape '{self.shape}': {COMMIT_ATTEMPTS} commits in a row lost a race with "
            "another writer of this table"
        )

    def _holds(self, done: int | None, first: int, end_lsn: int) -> bool:
        return holds(self.shape, done, first, end_lsn)

    def _entry(
        self,
        files: Sequence[DataFile],
        custom: Mapping[str, Any],
        end_lsn: int | None,
        extra: Mapping[str, int] | None = None,
    ) -> bytes:
        """The log entry of a direct append: commit info, the adds, our transaction
        (``end_lsn``; None: not set, as when a backfill commits) and the ``extra``
        application transactions (id -> version)."""
        now = int(time.time() * 1000)
        info: dict[str, Any] = {
            "timestamp": now,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": "[]"},
            "engineInfo": ENGINE,
            "tidemark.rows": str(sum(f.num_rows for f in files)),
        }
        info |= {k: str(v) for k, v in custom.items()}
        info |= fencing.current().commit_info()
        lines = [json.dumps({"commitInfo": info}, separators=(",", ":"))]
        lines += [json.dumps({"add": add_entry(f)}, separators=(",", ":")) for f in files]
        txns = {} if end_lsn is None else {self.app_id: end_lsn}
        for app_id, version in {**txns, **(extra or {})}.items():
            txn = {"appId": app_id, "version": version, "lastUpdated": now}
            lines.append(json.dumps({"txn": txn}, separators=(",", ":")))
        epoch = fencing.current().epoch
        if epoch is not None:  # the leader's mark (tidemark.state.fencing)
            mark = {"appId": fencing.current().app_id, "version": epoch, "lastUpdated": now}
            lines.append(json.dumps({"txn": mark}, separators=(",", ":")))
        return ("\n".join(lines) + "\n").encode()

    def _append(
        self,
        head: _Head,
        files: Sequence[DataFile],
        custom: Mapping[str, Any],
        end_lsn: int,
        prepared: Path | None,
    ) -> int | None:
        """Write log version ``head.version + 1``, adding ``files`` tagged ``(app_id,
        end_lsn)`` (``prepared``: that entry, written and synced already); None when
        that version exists (someone committed since ``head``: the caller takes the
        library's way, which re-reads the log)."""
        if prepared is None:
            fencing.check()
            entry: bytes | Path = self._entry(files, custom, end_lsn)
        else:
            entry = prepared
        return self._publish(head, entry, end_lsn, head.generation)

    def _publish(
        self, head: _Head, entry: bytes | Path, app_version: int | None, generation: int
    ) -> int | None:
        """Publish ``entry`` (bytes, or a temp file in the log written and synced
        already) as log version ``head.version + 1``; the new head has ``app_version``
        and ``generation``. None when that version exists."""
        version = head.version + 1
        # (a newer leader's epoch mark takes version ``head + 1`` first: the publication
        # then fails, and the library's way checks the mark)
        if not self._put_entry(entry, version):
            self._head = None
            return None
        self._head = _Head(version, app_version, head.checkpoint_interval, generation)
        self._behind = True
        if version % head.checkpoint_interval == 0:
            # the commit has landed: a checkpoint that fails is only a slower read
            # (the next interval writes one), never a failed commit
            try:
                dt = self.table()
                dt.create_checkpoint()
                synced = SyncSet()
                self._sync_entries(synced, version, version)
                synced.sync()
                self._know(dt)
            except Exception as exc:
                log.warning("commit.checkpoint_failed", shape=self.shape, error=str(exc))
                self._head = None
        return version

    def _put_entry(self, entry: bytes | Path, version: int) -> bool | None:
        """Name ``entry`` (bytes, or a temp file in the log written and synced already)
        log version ``version`` unless that version exists (False): synced before it
        gets its name, so an entry on disk is always whole (the log folder is synced by
        the caller), and the fence checked right before. None: this filesystem cannot
        put a file only if absent (e.g. no hard links): the library's way from now on.
        On an object store: one conditional PUT (``If-None-Match: *``), durable when it
        returns."""
        if not isinstance(self.log_dir, Path):
            assert isinstance(entry, bytes)
            fencing.check()
            return objectstore.put_if_absent(self._entry_path(version), entry)
        if isinstance(entry, Path):
            temp = entry
        else:
            temp = self.log_dir / f"_commit_{uuid.uuid4()}.json.tmp"
            write_synced(temp, entry)
        try:
            fencing.check()
        except BaseException:
            fencing.remove_own(temp)
            raise
        try:
            return publish_new(temp, self.log_dir / f"{version:020d}.json")
        except OSError as exc:  # (publish_new removed the temp file)
            log.warning("commit.direct_unavailable", shape=self.shape, error=str(exc))
            self._direct = False
            return None

    def _know(self, dt: DeltaTable) -> None:
        """Remember ``dt``'s version as the newest the handle knows (just updated or
        committed through it), if the table lets appends be written directly; a
        version marked by a newer leader is never known (``Deposed``)."""
        fencing.current().check_snapshot(dt, self._where)
        protocol = dt.protocol()
        if not self._direct or protocol.min_writer_version > 2 or protocol.writer_features:
            self._head = None
            return
        config = dt.metadata().configuration
        interval = int(config.get("delta.checkpointInterval") or CHECKPOINT_INTERVAL)
        self._head = _Head(
            dt.version(), dt.transaction_version(self.app_id), interval, self.generation(dt)
        )

    # -- durability -----------------------------------------------------------

    @property
    def log_dir(self) -> Location:
        return join(self.path, "_delta_log")

    def _entry_path(self, version: int) -> Location:
        return join(self.log_dir, f"{version:020d}.json")

    def log_sync(self) -> SyncSet:
        """What makes the entries committed by direct appends durable: the log folder
        (the entries' bytes were synced before they were named); nothing on an object
        store."""
        synced = SyncSet()
        if isinstance(self.log_dir, Path):
            synced.folder(self.log_dir)
        return synced

    def _sync_entries(self, synced: SyncSet, first: int, last: int) -> None:
        if isinstance(self.log_dir, Path):
            synced.update(entries_sync(self.log_dir, first, last))

    def _synced_library_commit(self, before: int, after: int) -> None:
        """The entries a library commit (or several) wrote, synced (on an object store
        they were durable when the library's PUTs returned)."""
        if isinstance(self.log_dir, Path):
            entries_sync(self.log_dir, before + 1, after).sync()

    def recover(self) -> bool:
        """At start, before anything reads the table: ``recover_log``, then the table
        opened and every file its log names checked (present, with its size). Returns
        whether a table exists; ``TableDamaged`` when it cannot be used."""
        with self._lock:
            if not isinstance(self.path, Path) or not isinstance(self.root, Path):
                return self._recover_remote()
            try:
                newest = recover_log(self.shape, self.path, self.root)
            except SinkError as exc:
                raise TableDamaged(self._damaged(str(exc))) from exc
            if newest is None:
                return False
            data = self.path / "data"
            if not data.is_dir():  # made here, not by the first round: durable from now
                data.mkdir()
                synced = SyncSet()
                synced.folder(self.path)
                synced.sync()
            folder = self.path
            self._open_checked(lambda p, size: _has_size(folder / p, size))
            return True

    def _recover_remote(self) -> bool:
        """``recover`` on an object store: an entry is one PUT, whole or absent, so
        there is no torn tail to remove; every file the log names is checked against a
        listing of ``data/`` (one LIST, not a request per file)."""
        self._dt = self._head = self._schema0 = None
        try:
            opened = self._open_delta()
        except Exception as exc:
            raise TableDamaged(self._damaged(f"its Delta log cannot be read: {exc}")) from exc
        if opened is None:
            return False
        sizes = {f"data/{f.name}": f.size for f in objectstore.listing(self.location("data"))}
        self._open_checked(lambda p, size: sizes.get(p) == size, opened)
        return True

    def _open_checked(
        self, whole: Callable[[str, int], bool], opened: DeltaTable | None = None
    ) -> None:
        """The table opened afresh (or as just ``opened``), and every file its log names
        ``whole`` (there, with its size); ``TableDamaged`` otherwise. Then
        ``_keep_transactions``."""
        self._dt = self._head = self._schema0 = None
        if opened is not None:
            self._dt, self._behind = opened, False
        try:
            active = self._active_files(self._handle())
        except Exception as exc:
            raise TableDamaged(self._damaged(f"its Delta log cannot be read: {exc}")) from exc
        missing = [p for p, size in active if not whole(p, size)]
        if missing:
            raise TableDamaged(
                self._damaged(
                    f"{len(missing)} data file(s) its log names are missing or cut short, "
                    f"e.g. {missing[0]}"
                )
            )
        self._keep_transactions()

    def _keep_transactions(self) -> None:
        """The committed offsets, the generation and the epoch marks are application
        transactions: a table property ``delta.setTransactionRetentionDuration`` lets a
        Delta writer drop those not updated within it from its checkpoints, and a
        restart would then replay committed transactions. Set on a tidemark table (by
        hand, or by another tool), it is overridden with ``TRANSACTION_RETENTION``."""
        dt = self._handle()
        found = dt.metadata().configuration.get(TXN_RETENTION_KEY)
        if found is None or found == TRANSACTION_RETENTION:
            return
        fencing.current().check_snapshot(dt, self._where)
        before = dt.version()
        dt.alter.set_table_properties({TXN_RETENTION_KEY: TRANSACTION_RETENTION})
        self._synced_library_commit(before, dt.version())
        self._dt = self._head = self._schema0 = None
        log.warning(
            "table.transaction_retention_overridden",
            shape=self.shape,
            found=found,
            now=TRANSACTION_RETENTION,
            meaning="the committed offsets must never expire",
        )

    def _damaged(self, what: str) -> str:
        return (
            f"shape '{self.shape}': its table {self.uri} is damaged ({what}). Its rows must "
            "be rebuilt from a snapshot: start tidemark with [source] on_stream_gap = "
            '"resync" to have the table set aside and rebuilt, or remove the shape and add '
            "it again"
        )

    def active_files_with_sizes(self) -> list[tuple[str, int]]:
        with self._lock:
            head = self._head
            if (
                head is not None
                and head.version == 0
                and not objectstore.exists(self._entry_path(1))
            ):
                return []  # made by ``create`` (no files), nothing committed since
            dt = self.table()
            dt.update_incremental()
            return self._active_files(dt)

    def backfill_commit(
        self,
        remove: Sequence[tuple[str, int]],
        files: Sequence[DataFile],
        metadata: Mapping[str, Any] | None = None,
        *,
        replace: tuple[pa.Schema, Sequence[str]] | None = None,
    ) -> int:
        """One commit that adds a snapshot's files and removes ``remove``: the files that
        were active when the snapshot was taken (their data is in the snapshot). Files
        committed by the stream since then stay. The committed offset is unchanged.

        ``replace=(schema, primary_key)``: the commit also replaces the table's schema
        and key (a resync after a type or key change). It then removes *every* active
        file: the caller holds the shape's stream commits from the snapshot on, so
        every active file is older than the snapshot.

        A commit that removes nothing and keeps the schema is written directly when the
        handle knows the newest version (a new shape's first backfill: see the module
        docstring); the library's way otherwise."""
        with self._lock:
            custom = {"tidemark.operation": "backfill", **(metadata or {})}
            head = self._head
            if replace is None and not remove and head is not None:
                version = self._backfill_directly(head, files, custom)
                if version is not None:
                    return version
            dt = self.table()
            dt.update_incremental()
            version = dt.transaction_version(self.app_id)
            generation = [Transaction(GENERATION_PREFIX + self.shape, self.generation(dt) + 1)]
            if replace is not None:
                schema = with_primary_key(replace[0], replace[1])
                custom["tidemark.schemaReplaced"] = "true"
                return self._write(dt, [], files, custom, version, schema=schema, extra=generation)
            active = {p for p, _ in self._active_files(dt)}
            now = int(time.time() * 1000)
            removes = [RemoveAction(p, True, now, size, {}) for p, size in remove if p in active]
            return self._write(dt, removes, files, custom, version, extra=generation)

    def _backfill_directly(
        self, head: _Head, files: Sequence[DataFile], custom: Mapping[str, Any]
    ) -> int | None:
        """``backfill_commit`` adding ``files`` as log version ``head.version + 1``,
        synced before it returns; None when that version exists."""
        fencing.check()
        self.files_sync(files).sync()  # the files before the entry that names them
        generation = head.generation + 1
        entry = self._entry(
            files,
            custom,
            None,
            {GENERATION_PREFIX + self.shape: generation},
        )
        version = self._publish(head, entry, head.app_version, generation)
        if version is not None:
            self.log_sync().sync()
        return version

    def retention_commit(
        self, remove: Sequence[tuple[str, int]], files: Sequence[DataFile], retained_lsn: int
    ) -> int:
        """One commit that replaces ``remove`` by ``files`` (the same rows without those
        at or below ``retained_lsn``) and records ``retained_lsn`` for the table's
        generation. The committed offset is unchanged. The caller holds the shape's
        flushes (the removed files must still be active)."""
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            active = {p for p, _ in self._active_files(dt)}
            missing = [p for p, _ in remove if p not in active]
            if missing:
                raise SinkError(
                    f"shape '{self.shape}': changelog files changed while retention "
                    f"rewrote them ({missing[0]} is gone); the next round tries again"
                )
            generation = self.generation(dt)
            marker = Transaction(f"{RETAINED_PREFIX}{self.shape}@{generation}", retained_lsn)
            now = int(time.time() * 1000)
            removes = [RemoveAction(p, True, now, size, {}) for p, size in remove]
            custom = {"tidemark.operation": "retention", "tidemark.retainedLsn": retained_lsn}
            version = dt.transaction_version(self.app_id)
            return self._write(dt, removes, files, custom, version, extra=[marker])

    def _write(
        self,
        dt: DeltaTable,
        removes: Sequence[RemoveAction],
        files: Sequence[DataFile],
        metadata: Mapping[str, Any],
        app_version: int | None,
        *,
        schema: pa.Schema | None = None,
        extra: Sequence[Transaction] = (),
        data_change: bool = True,
    ) -> int:
        """One Delta commit through the library: remove, add ``files``, tag ``(app_id,
        app_version)`` and the ``extra`` application transactions; with ``schema``, an
        overwrite that replaces every file and the schema. ``files`` are synced before
        the commit, its log entries after it, before this returns (the library's own
        writes reach the page cache only)."""
        adds = [add_action(f, data_change=data_change) for f in files]
        custom = {"tidemark.rows": str(sum(f.num_rows for f in files))}
        custom |= {k: str(v) for k, v in metadata.items()}
        custom |= fencing.current().commit_info()
        self.files_sync(files).sync()  # the files before the entry that names them
        fence = fencing.current()
        # refused when a newer leader marked the snapshot this commit is built on; the
        # commit carries our mark, so a mark that lands meanwhile makes it a conflict
        fence.check_snapshot(dt, self._where)
        before = dt.version()
        dt.create_write_transaction(
            [*removes, *adds],
            mode="append" if schema is None else "overwrite",
            schema=dt.schema() if schema is None else schema,
            commit_properties=CommitProperties(
                custom_metadata=custom,
                app_transactions=(
                    [] if app_version is None else [Transaction(self.app_id, app_version)]
                )
                + list(extra)
                + fence.app_transactions()
                or None,
            ),
        )
        dt.update_incremental()
        self._synced_library_commit(before, dt.version())
        if schema is not None:
            self.fitted = None
        self._know(dt)
        return dt.version()

    @staticmethod
    def _active_files(dt: DeltaTable) -> list[tuple[str, int]]:
        actions = pa.table(dt.get_add_actions(flatten=False))
        return list(
            zip(
                actions.column("path").to_pylist(),
                actions.column("size_bytes").to_pylist(),
                strict=True,
            )
        )

    def active_files(self) -> list[str]:
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            return [p for p, _ in self._active_files(dt)]

    def file_uris(self) -> list[str]:
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            return list(dt.file_uris())

    def view(self) -> ChangelogView:
        """The newest version pinned: its files with the ``_lsn`` statistics of their
        add actions."""
        dt = DeltaTable(self.uri, storage_options=self._options)
        schema = pa.schema(dt.schema().to_arrow())
        actions = pa.table(dt.get_add_actions(flatten=True))
        base = self.uri.rstrip("/") + "/"
        paths = actions.column("path").to_pylist()
        names = actions.column_names
        lows = (
            actions.column(f"min.{LSN}").to_pylist()
            if f"min.{LSN}" in names
            else [None] * len(paths)
        )
        highs = (
            actions.column(f"max.{LSN}").to_pylist()
            if f"max.{LSN}" in names
            else [None] * len(paths)
        )
        sizes = actions.column("size_bytes").to_pylist()
        rows = actions.column("num_records").to_pylist()
        files = [
            ChangelogFile(
                p, p if "://" in p or p.startswith("/") else base + p, s, lo, hi, int(n or 0)
            )
            for p, s, lo, hi, n in zip(paths, sizes, lows, highs, rows, strict=True)
        ]
        key = primary_key_of(schema) or self.primary_key()
        generation = self.generation(dt)
        return ChangelogView(
            dt.version(),
            generation,
            str(dt.metadata().id),
            schema,
            key,
            files,
            self.retained_lsn(generation, dt),
        )

    def commits(self) -> list[CommitRecord]:
        out = []
        for entry in DeltaTable(self.uri, storage_options=self._options).history():
            end = entry.get("tidemark.endLsn")
            operation = entry.get("tidemark.operation") or ("stream" if end else "")
            out.append(
                CommitRecord(
                    int(entry["version"]),
                    None if end is None else int(end),
                    str(operation or entry.get("operation", "")),
                    int(entry.get("timestamp", 0)),
                )
            )
        return out

    # -- maintenance --------------------------------------------------------

    def compact(self, target_size: int = 128 * 1024 * 1024) -> dict[str, Any]:
        """Rewrite small files into larger ones: one commit that removes them and adds
        their rows in fewer files (``dataChange`` false: the same rows). Written here,
        not by deltalake's ``optimize``, so that the new files are synced before the
        commit that names them (the library's writes reach the page cache only: a power
        loss after its commit could leave a log naming empty files). The caller holds
        the shape's flushes."""
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            fencing.current().check_snapshot(dt, self._where)
            schema = pa.schema([f.remove_metadata() for f in self.arrow_schema()])
            removed, added = self.rewrite_small(self._active_files(dt), target_size, schema)
            if not removed:
                return {"numFilesAdded": 0, "numFilesRemoved": 0}
            try:
                now = int(time.time() * 1000)
                removes = [RemoveAction(p, False, now, n, {}) for p, n in removed]
                custom = {"tidemark.operation": "compaction"}
                version = dt.transaction_version(self.app_id)
                self._write(dt, removes, added, custom, version, data_change=False)
            except BaseException:
                self.delete_files(added)
                raise
            metrics = {"numFilesAdded": len(added), "numFilesRemoved": len(removed)}
            log.info("table.compacted", shape=self.shape, added=len(added), removed=len(removed))
            return metrics

    def vacuum(self, retention_hours: int = 24, keep: Sequence[DataFile] = ()) -> list[str]:
        """Delete files no commit references (failed batches) and tombstones older than
        ``retention_hours``. ``keep``: files a pending batch will commit (staged for a
        transaction still open, or in a batch waiting for its retry); they are made
        young first, so that however old they are, vacuum leaves them. Removed files
        are deleted only after the commits that removed them were synced (every commit
        here is, before it returns)."""
        with self._lock:
            now = time.time()
            if isinstance(self.path, Path):
                for f in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.utime(self.path / f.path, (now, now))
            dt = self.table()
            fencing.current().check_snapshot(dt, self._where)
            before = dt.version()
            deleted = dt.vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
                # on an object store a pending batch's files cannot be made young: only
                # what commits removed is deleted there, not files no commit names
                full=isinstance(self.path, Path),
            )
            dt.update_incremental()  # (vacuum's own commits, synced like every other)
            self._synced_library_commit(before, dt.version())
            self._know(dt)
            if deleted:
                log.info("table.vacuumed", shape=self.shape, files=len(deleted))
            return list(deleted)
