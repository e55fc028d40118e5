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
is what a flush round of 1000 shapes pays 1000 times.

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
import shutil
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from tidemark.durable import publish_new
from tidemark.errors import SinkError, WriterFenced
from tidemark.sink.schema import LSN, OP, primary_key_of, with_primary_key

log = structlog.get_logger("tidemark.sink")

APP_PREFIX = "tidemark:"
GENERATION_PREFIX = "tidemark-generation:"
RETAINED_PREFIX = "tidemark-retained:"
SPOOL_DIR = "_spool"
COMMIT_ATTEMPTS = 5
CHECKPOINT_INTERVAL = 100  # Delta's default delta.checkpointInterval
ENGINE = "tidemark"


def app_id_for(shape: str, epoch: int = 1) -> str:
    return APP_PREFIX + shape if epoch <= 1 else f"{APP_PREFIX}{shape}#{epoch}"


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet file inside a table folder, ready to be added by a commit."""

    path: str  # relative to the table root, '/'-separated
    size: int
    num_rows: int
    modification_time_ms: int
    stats: str  # Delta statistics JSON

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, {}, self.modification_time_ms, True, self.stats)

    def add_entry(self) -> dict[str, Any]:
        """The Delta log's ``add`` action for this file (the appends written directly)."""
        return {
            "path": self.path,
            "partitionValues": {},
            "size": self.size,
            "modificationTime": self.modification_time_ms,
            "dataChange": True,
            "stats": self.stats,
        }


@dataclass(frozen=True, slots=True)
class _Head:
    """What a handle knows of the log's newest version: an append may write the next
    version directly (see the module docstring)."""

    version: int
    app_version: int | None  # our application transaction's version at ``version``
    checkpoint_interval: int


def describe_file(table_root: Path, rel_path: str) -> DataFile:
    """A Parquet file at ``rel_path`` under a table's folder, described for a commit
    (size, time, row count and ``_lsn``/``_op`` statistics from its footer)."""
    path = table_root / rel_path
    st = path.stat()
    rows, stats = _file_stats(path)
    return DataFile(rel_path, st.st_size, rows, int(st.st_mtime * 1000), stats)


def tables_dir(root: str | Path) -> Path:
    return Path(root) / "tables"


def table_path(root: str | Path, shape: str) -> Path:
    return tables_dir(root) / shape


def _file_stats(path: Path) -> tuple[int, str]:
    """Row count and Delta stats (min/max/nulls of ``_lsn``/``_op``) from a footer."""
    meta = pq.read_metadata(path)
    names = meta.schema.names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for column in (LSN, OP):
        if column not in names:
            continue
        idx = names.index(column)
        lo = hi = None
        null_count = 0
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(idx).statistics
            if st is None or not st.has_min_max:
                lo = hi = None
                break
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            null_count += st.null_count or 0
        if lo is not None:
            mins[column], maxs[column], nulls[column] = lo, hi, null_count
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return meta.num_rows, json.dumps(stats)


class ShapeTable:
    """The Delta table of one shape. Thread-safe: Spark jobs commit from worker threads."""

    def __init__(self, root: str | Path, shape: str, *, epoch: int = 1) -> None:
        self.root = Path(root)
        self.shape = shape
        self.path = table_path(root, shape)
        self.uri = str(self.path)
        self.app_id = app_id_for(shape, epoch)
        self._lock = threading.RLock()
        self._dt: DeltaTable | None = None
        self._head: _Head | None = None
        self._direct = True  # appends may be written directly (see _append)
        self._behind = False  # the handle has not read appends written directly
        # a writer schema found to fit the table (``writers.job.fit_table``); forgotten
        # whenever the table's schema may have changed through this object
        self.fitted: pa.Schema | None = None

    # -- existence and creation -------------------------------------------

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri)

    def create(
        self,
        schema: pa.Schema,
        primary_key: Sequence[str],
        definition: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the table (idempotent when it exists with a compatible schema)."""
        with self._lock:
            if self.exists():
                self.ensure_columns(schema)
                return
            self.path.mkdir(parents=True, exist_ok=True)
            description = json.dumps(
                {"tidemark": {"primary_key": list(primary_key), "shape": dict(definition or {})}},
                sort_keys=True,
            )
            try:
                self._dt = DeltaTable.create(
                    self.uri,
                    schema=with_primary_key(schema, primary_key),
                    mode="error",
                    name=self.shape,
                    description=description,
                )
            except Exception as exc:
                raise SinkError(
                    f"cannot create the Delta table of shape '{self.shape}' at {self.uri}: {exc}"
                ) from exc
            log.info("table.created", shape=self.shape, path=self.uri)

    def table(self) -> DeltaTable:
        """The library's handle, current with every commit made through this object."""
        with self._lock:
            dt = self._handle()
            if self._behind:  # appends written directly since it last read the log
                dt.update_incremental()
                self._behind = False
            return dt

    def _handle(self) -> DeltaTable:
        """The handle as it is: its schema and metadata are the table's (appends
        written directly change neither), its files and versions may be behind."""
        with self._lock:
            if self._dt is None:
                if not self.exists():
                    raise SinkError(f"shape '{self.shape}' has no table at {self.uri} yet")
                self._dt = DeltaTable(self.uri)
                self._behind = False
            return self._dt

    def refresh(self) -> DeltaTable:
        with self._lock:
            self._dt = None
            self._head = None
            self.fitted = None
            return self.table()

    # -- what is committed --------------------------------------------------

    def committed_lsn(self) -> int | None:
        """The end LSN of the last committed batch (the shape's committed offset)."""
        return self._app_version(self.app_id)

    def generation(self, dt: DeltaTable | None = None) -> int:
        """How many times the table was rebuilt from a snapshot (a backfill or resync
        commit counts one up): a current-state table folded from an older generation
        is rebuilt (``tidemark.sink.current``). 0 for tables made before it was kept."""
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
        return pa.schema(self._handle().schema().to_arrow())

    def ensure_columns(self, schema: pa.Schema) -> list[str]:
        """Add the fields of ``schema`` the table lacks; returns their names."""
        with self._lock:
            current = set(self.arrow_schema().names)
            added = [f for f in schema if f.name not in current]
            if added:
                from deltalake.schema import Field

                self.fitted = None
                self.table().alter.add_columns([Field.from_arrow(f) for f in added])
                log.info("table.columns_added", shape=self.shape, columns=[f.name for f in added])
            return [f.name for f in added]

    # -- writing ------------------------------------------------------------

    def new_batch_dir(self) -> tuple[str, Path]:
        """A fresh ``data/<uuid>`` folder name (relative) and its absolute path."""
        rel = f"data/{uuid.uuid4()}"
        return rel, self.path / rel

    def new_spool_dir(self) -> tuple[str, Path]:
        """A fresh ``_spool/<uuid>`` folder (relative, absolute) for rows of a transaction
        still being streamed: hidden from Delta readers and vacuum."""
        rel = f"{SPOOL_DIR}/{uuid.uuid4()}"
        return rel, self.path / rel

    def delete_spool(self, files: Sequence[DataFile]) -> None:
        """Delete spool files and their folders (best effort)."""
        self.delete_files(files)
        for folder in {(self.path / f.path).parent for f in files}:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def clear_spool(self) -> int:
        """Delete every spool folder (at start: Postgres streams any transaction still
        open again from its start). Returns how many there were."""
        root = self.path / SPOOL_DIR
        if not root.is_dir():
            return 0
        count = 0
        for entry in os.scandir(root):
            shutil.rmtree(entry.path, ignore_errors=True)
            count += 1
        return count

    def file_at(self, rel_path: str) -> DataFile:
        """A Parquet file of this table folder, described for a commit."""
        return describe_file(self.path, rel_path)

    def files_in(self, rel_dir: str) -> list[DataFile]:
        """The Parquet files Spark wrote under ``rel_dir``; Spark's .crc files removed."""
        folder = self.path / rel_dir
        out = []
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.endswith(".crc"):
                os.unlink(entry.path)
                continue
            if not entry.name.endswith(".parquet") or entry.name.startswith((".", "_")):
                continue
            st = entry.stat()
            rows, stats = _file_stats(Path(entry.path))
            if rows == 0:
                continue
            out.append(
                DataFile(
                    f"{rel_dir}/{entry.name}", st.st_size, rows, int(st.st_mtime * 1000), stats
                )
            )
        return out

    def commit(
        self,
        files: Sequence[DataFile],
        end_lsn: int,
        metadata: Mapping[str, Any] | None = None,
        *,
        first_lsn: int | None = None,
    ) -> int | None:
        """Add ``files`` in one commit tagged ``(app_id, end_lsn)``; ``first_lsn`` is the
        commit LSN of the batch's first transaction (default: ``end_lsn``).

        Returns the new table version, or None when ``end_lsn`` was committed already.
        Raises ``WriterFenced`` when another writer committed part of the batch.
        """
        first = end_lsn if first_lsn is None else first_lsn
        custom = {"tidemark.endLsn": end_lsn, "tidemark.files": len(files), **(metadata or {})}
        with self._lock:
            head = self._head
            if head is not None:
                if self._holds(head.app_version, first, end_lsn):
                    return None
                version = self._append(head, files, custom, end_lsn)
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
                    log.warning(
                        "commit.conflict", shape=self.shape, attempt=attempt, error=str(exc)
                    )
            raise SinkError(
                f"shape '{self.shape}': {COMMIT_ATTEMPTS} commits in a row lost a race with "
                "another writer of this table"
            )

    def _holds(self, done: int | None, first: int, end_lsn: int) -> bool:
        """Whether the table, at app version ``done``, holds the batch ``first..end_lsn``
        already (a replay: skip it); ``WriterFenced`` when it holds a part of it."""
        if done is not None and end_lsn <= done:
            log.info("commit.skipped_replay", shape=self.shape, end_lsn=end_lsn, committed_lsn=done)
            return True
        if done is not None and first <= done:
            raise WriterFenced(
                f"shape '{self.shape}': another writer committed its table up to LSN "
                f"{done}, inside this batch ({first}..{end_lsn}): this process stops "
                "committing it. Run one tidemark per slot and sink root"
            )
        return False

    def _append(
        self, head: _Head, files: Sequence[DataFile], custom: Mapping[str, Any], end_lsn: int
    ) -> int | None:
        """Write log version ``head.version + 1``, adding ``files`` tagged ``(app_id,
        end_lsn)``; None when that version exists (someone committed since ``head``:
        the caller takes the library's way, which re-reads the log)."""
        version = head.version + 1
        now = int(time.time() * 1000)
        info: dict[str, Any] = {
            "timestamp": now,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": "[]"},
            "engineInfo": ENGINE,
            "tidemark.rows": str(sum(f.num_rows for f in files)),
        }
        info |= {k: str(v) for k, v in custom.items()}
        lines = [json.dumps({"commitInfo": info}, separators=(",", ":"))]
        lines += [json.dumps({"add": f.add_entry()}, separators=(",", ":")) for f in files]
        txn = {"appId": self.app_id, "version": end_lsn, "lastUpdated": now}
        lines.append(json.dumps({"txn": txn}, separators=(",", ":")))
        log_dir = self.path / "_delta_log"
        temp = log_dir / f"_commit_{uuid.uuid4()}.json.tmp"
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as fh:
            fh.write(("\n".join(lines) + "\n").encode())
        try:
            published = publish_new(temp, log_dir / f"{version:020d}.json")
        except OSError as exc:  # e.g. a filesystem without hard links: the library's way
            log.warning("commit.direct_unavailable", shape=self.shape, error=str(exc))
            self._head, self._direct = None, False  # (publish_new removed the temp file)
            return None
        if not published:
            self._head = None
            return None
        self._head = _Head(version, end_lsn, head.checkpoint_interval)
        self._behind = True
        if version % head.checkpoint_interval == 0:
            # the commit has landed: a checkpoint that fails is only a slower read
            # (the next interval writes one), never a failed commit
            try:
                dt = self.table()
                dt.create_checkpoint()
                self._know(dt)
            except Exception as exc:
                log.warning("commit.checkpoint_failed", shape=self.shape, error=str(exc))
                self._head = None
        return version

    def _know(self, dt: DeltaTable) -> None:
        """Remember ``dt``'s version as the newest the handle knows (just updated or
        committed through it), if the table lets appends be written directly."""
        protocol = dt.protocol()
        if not self._direct or protocol.min_writer_version > 2 or protocol.writer_features:
            self._head = None
            return
        config = dt.metadata().configuration
        interval = int(config.get("delta.checkpointInterval") or CHECKPOINT_INTERVAL)
        self._head = _Head(dt.version(), dt.transaction_version(self.app_id), interval)

    def active_files_with_sizes(self) -> list[tuple[str, int]]:
        with self._lock:
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
        every active file is older than the snapshot."""
        with self._lock:
            dt = self.table()
            dt.update_incremental()
            custom = {"tidemark.operation": "backfill", **(metadata or {})}
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
    ) -> int:
        """One Delta commit: remove, add ``files``, tag ``(app_id, app_version)`` and
        the ``extra`` application transactions; with ``schema``, an overwrite that
        replaces every file and the schema."""
        adds = [f.add_action() for f in files]
        custom = {"tidemark.rows": str(sum(f.num_rows for f in files))}
        custom |= {k: str(v) for k, v in metadata.items()}
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
                or None,
            ),
        )
        dt.update_incremental()
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

    def delete_files(self, files: Sequence[DataFile]) -> None:
        """Remove written files no commit will ever reference (best effort: vacuum
        removes what is left)."""
        for f in files:
            try:
                (self.path / f.path).unlink()
            except OSError:
                continue

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

    # -- maintenance --------------------------------------------------------

    def compact(self, target_size: int = 128 * 1024 * 1024) -> dict[str, Any]:
        """Rewrite small files into larger ones (one commit; data unchanged)."""
        with self._lock:
            metrics = self.table().optimize.compact(target_size=target_size)
            log.info(
                "table.compacted",
                shape=self.shape,
                added=metrics.get("numFilesAdded"),
                removed=metrics.get("numFilesRemoved"),
            )
            return metrics

    def vacuum(self, retention_hours: int = 24) -> list[str]:
        """Delete files no commit references (failed batches) and tombstones older than
        ``retention_hours``. In-flight batches are younger than that."""
        with self._lock:
            deleted = self.table().vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
                full=True,
            )
            if deleted:
                log.info("table.vacuumed", shape=self.shape, files=len(deleted))
            return list(deleted)
