"""Iceberg's stream commits in Spark's driver, with Iceberg's Java library.

A stream commit (one per shape touched, each flush round) is most of what an Iceberg
sink commits. Through pyiceberg it is 15-40 ms of Python under the GIL (a manifest and
a manifest list encoded in Avro, the table's metadata copied and dumped), ~30 commits a
second whatever the number of commit threads. The JVM that writes the data files
commits them instead (``tidemark/jvm/IcebergStreamCommits.java``): each commit thread's
call runs on a JVM thread of its own (py4j's pinned threads) while the GIL is free.

The Java commit is pyiceberg's commit (``IcebergChangelog.commit``) made elsewhere: the
same checks on the same snapshot (the leader's epoch mark, what other writers did since
tidemark's newest snapshot, the replay check on the committed offset), the same summary
(the carried state, the batch's range and offset, this leader's mark), one snapshot
appending the files, built on exactly the metadata checked; the same cap on snapshots.
Its metadata files are fenced and synced before the catalog's pointer moves
(``SyncedFileIO.java``, as ``iceberg.io`` does for pyiceberg).
The pointer itself stays Python's: the same compare-and-swap pyiceberg's SQL catalog
makes (``UPDATE ... WHERE metadata_location = <the one checked>``), on the catalog's own
connections, so SQLite's locks are taken by one library and its commit is synced as
pyiceberg's is. A swap that finds the pointer moved (pyiceberg's commit in between, a
newer leader's mark) reads the table again and checks again. A new table (its first
metadata written in the JVM, its catalog row inserted here) and a backfill that removes
no file (a shape's first) are made there too: most of what a start with many new shapes
commits. Every other commit (added columns, a backfill that replaces files, retention,
compaction, expiry, a leader's mark) stays pyiceberg's: the two write one table in
turn, each building on what the other committed.

Used when the Spark session is a local one with Iceberg's jars on its class path
(``make setup`` fetches them: ``tidemark.spark.iceberg_jars``), the root is on local
disk and the catalog is a SQL one (SQLite or PostgreSQL); else pyiceberg commits.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import structlog

from tidemark.errors import SinkError, TidemarkError
from tidemark.sink.iceberg.rows import pointer
from tidemark.state import durable, fencing, objectstore

log = structlog.get_logger("tidemark.sink.iceberg")

JAVA_CLASS: Final = "tidemark.iceberg.IcebergStreamCommits"
FILE_IO: Final = "tidemark.iceberg.SyncedFileIO"
COMMIT_ATTEMPTS: Final = 5  # (snapshots.COMMIT_ATTEMPTS)


class JavaCommits:
    """The Java committer of one SQL catalog (``IcebergStreamCommits``)."""

    def __init__(self, java: Any, catalog: Any) -> None:
        self._java = java
        for method in ("append", "create", "swapped", "forget"):
            # (their arguments are strings, numbers and booleans, which py4j sends as they
            # are: without this it asks each of the gateway's converters, pyspark's among
            # them, about each argument, ~0.2 ms of Python under the GIL a commit)
            getattr(java, method).converters = None
        self._catalog = catalog  # pyiceberg's SqlCatalog: its engine makes the swaps
        self._pointers: dict[str, str] = {}  # each table's metadata after our last swap
        self._swaps = GroupedSwaps(catalog)

    def append(
        self,
        ident: tuple[str, str],
        paths: Sequence[str],
        first: int,
        end: int,
        offset_key: str,
        carried: Sequence[str],
        extra: Mapping[str, str],
        *,
        backfill: str | None = None,
    ) -> tuple[str, str]:
        """One stream commit: its outcome and what goes with it, ``deposed`` (the table's
        mark), ``others`` (``snapshots.others_change``'s answer and tidemark's newest
        snapshot or ``-``, space-separated), ``skip`` or ``overlap`` (the committed
        offset), ``done`` (the sequence number) or ``lost`` (attempts). ``Deposed`` when a
        newer leader took over meanwhile; ``SinkError`` for any other failure.

        With ``backfill`` (the generation's key) a backfill's commit that removes no file:
        built on whatever the table holds, its generation one past the newest snapshot's
        (never ``others``, ``skip`` or ``overlap``)."""
        fence, leader, epoch = _fenced()
        mark = dict(fence.commit_info())
        if fence.epoch is not None:
            mark[fence.app_id] = str(fence.epoch)
        name = ".".join(ident)
        asked: dict[str, Any] = {
            "paths": list(paths),
            "carried": list(carried),
            "extra": dict(extra),
            "mark": mark,
        }
        if backfill is not None:
            asked["backfill"] = backfill
        request = json.dumps(asked)
        for _ in range(COMMIT_ATTEMPTS):
            pointer = self._pointers.get(name) or self._pointer(ident)
            try:
                outcome = str(
                    self._java.append(
                        name,
                        pointer,
                        request,
                        first,
                        end,
                        offset_key,
                        fence.app_id,
                        epoch,
                        leader,
                        durable.syncing(),
                    )
                )
            except Exception as exc:
                self._pointers.pop(name, None)
                fence.check()  # (a newer leader: Deposed, as the fenced file IO found)
                raise SinkError(
                    f"the Iceberg commit of {name} failed in Spark's driver: {_java_message(exc)}"
                ) from exc
            kind, rest = outcome.split(" ", 1)
            if kind != "swap":
                return kind, rest
            number, written = rest.split(" ", 1)
            try:
                fence.check()  # (before the pointer moves, as before pyiceberg's swap)
                moved = self._swap(ident, pointer, written)
            except Exception as exc:
                # (the swap's outcome unknown: the file it names stays, the table is read
                # again at the next commit, whose replay check finds what landed)
                self._forget(name)
                if isinstance(exc, TidemarkError):
                    raise
                raise SinkError(
                    f"the Iceberg commit of {name}: the catalog's swap failed: {exc}"
                ) from exc
            self._swapped(name, written, moved, leader, epoch)
            if moved:
                self._pointers[name] = written
                return "done", number
            self._pointers.pop(name, None)  # (moved on: read again, checked again)
            log.warning("commit.conflict", table=name, error="the catalog's pointer moved")
        return "lost", str(COMMIT_ATTEMPTS)

    def create(
        self,
        ident: tuple[str, str],
        location: str,
        schema: str,
        properties: Mapping[str, str],
        summary: Mapping[str, str],
    ) -> str | None:
        """A new table: its first metadata (the schema ``schema``, Iceberg's JSON; one empty
        snapshot of summary ``summary``) written in the JVM, then inserted into the catalog
        as pyiceberg's SQL catalog inserts a new table. Returns that metadata file's
        location; None when a table of that name was there (its file removed);
        ``SinkError`` for any other failure."""
        fence, leader, epoch = _fenced()
        name = ".".join(ident)
        request = json.dumps({"properties": dict(properties), "summary": dict(summary)})
        try:
            written = str(
                self._java.create(name, location, schema, request, leader, epoch, durable.syncing())
            )
        except Exception as exc:
            fence.check()  # (a newer leader: Deposed, as the fenced file IO found)
            raise SinkError(
                f"the Iceberg table {name} could not be created in Spark's driver: "
                f"{_java_message(exc)}"
            ) from exc
        try:
            fence.check()  # (before the catalog names the table)
            made = self._swaps.create(ident, written)
        except Exception as exc:
            self._forget(name)
            if isinstance(exc, TidemarkError):
                raise
            raise SinkError(f"the Iceberg catalog could not add the table {name}: {exc}") from exc
        self._swapped(name, written, made, leader, epoch)
        if not made:
            return None
        self._pointers[name] = written
        return written

    def _swapped(self, name: str, written: str, moved: bool, leader: str, epoch: int) -> None:
        """The swap's outcome to the JVM (not moved: it removes the files it wrote)."""
        try:
            self._java.swapped(name, written, moved, leader, epoch)
        except Exception as exc:
            log.warning("iceberg.java_swapped_failed", table=name, error=_java_message(exc))
            self._forget(name)

    def _pointer(self, ident: tuple[str, str]) -> str:
        found = pointer(self._catalog, ident)
        if found is None:
            raise SinkError(f"the Iceberg catalog has no table {'.'.join(ident)}")
        return found

    def _swap(self, ident: tuple[str, str], old: str, new: str) -> bool:
        """The catalog's pointer from ``old`` to ``new``, if it is still at ``old``."""
        return self._swaps.swap(ident, old, new)

    def forget(self, ident: tuple[str, str]) -> None:
        """The table changed through pyiceberg: read it again at the next commit."""
        self._forget(".".join(ident))

    def _forget(self, name: str) -> None:
        self._pointers.pop(name, None)
        with contextlib.suppress(Exception):  # (a stopped session: nothing to forget)
            self._java.forget(name)


class GroupedSwaps:
    """The pointer swaps of one SQL catalog, made in groups: the commit threads' swaps
    that wait while one group runs go together in the next, one database transaction of
    one ``UPDATE ... WHERE metadata_location = <old>`` each (each swap's own outcome: its
    row count). SQLite takes one writer at a time, each commit synced (a few ``fsync``s),
    and a writer finding the lock taken sleeps in steps of up to 100 ms: eight commit
    threads swapping one by one spent more time there than in the JVM's commits."""

    def __init__(self, catalog: Any) -> None:
        self._catalog = catalog
        self._ready = threading.Condition()
        self._queue: list[_Swap] = []
        self._running = False
        self._statements: tuple[Any, Any] | None = None

    def create(self, ident: tuple[str, str], new: str) -> bool:
        """A new table at ``new``: False when one of that name is there already."""
        return self.swap(ident, None, new)

    def swap(self, ident: tuple[str, str], old: str | None, new: str) -> bool:
        """The pointer from ``old`` to ``new`` (None: a new table's row)."""
        mine = _Swap(ident, old, new)
        with self._ready:
            self._queue.append(mine)
            while self._running and not mine.settled:
                self._ready.wait()
            if not mine.settled:  # (this thread runs the next group: its own and those queued)
                self._running = True
                group, self._queue = self._queue, []
        if not mine.settled:
            try:
                moved = self._run(group)
            except Exception as exc:
                moved = None
                error: Exception | None = exc
            else:
                error = None
            with self._ready:
                for k, item in enumerate(group):
                    item.error = error
                    item.moved = bool(moved[k]) if moved is not None else False
                    item.settled = True
                self._running = False
                self._ready.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.moved

    def _run(self, group: Sequence[_Swap]) -> list[bool]:
        if self._statements is None:
            self._statements = self._made_statements()
        statement, insert = self._statements
        moved = []
        with self._catalog.engine.begin() as conn:
            for item in group:
                result = conn.execute(
                    statement if item.old is not None else insert,
                    {
                        "new": item.new,
                        "old": item.old,
                        "c": self._catalog.name,
                        "ns": item.ident[0],
                        "t": item.ident[1],
                    },
                )
                moved.append(result.rowcount == 1)
        return moved

    def _made_statements(self) -> tuple[Any, Any]:
        """The swap's ``UPDATE`` and a new table's ``INSERT`` (made once: each ``text`` is
        parsed where it is made)."""
        from sqlalchemy import text

        statement = text(
            "UPDATE iceberg_tables SET metadata_location = :new, "
            "previous_metadata_location = :old WHERE catalog_name = :c "
            "AND table_namespace = :ns AND table_name = :t AND metadata_location = :old"
        )
        # (a new table's row as pyiceberg's SQL catalog inserts it; a name taken is no error
        # that would undo the group's other swaps: SQLite and PostgreSQL both skip it)
        typed = getattr(self._catalog, "_schema_version", None) == "v1"
        columns = "catalog_name, table_namespace, table_name, metadata_location"
        values = ":c, :ns, :t, :new"
        if typed:  # (pyiceberg's v1 catalog schema)
            columns, values = f"{columns}, iceberg_type", f"{values}, 'TABLE'"
        insert = text(
            f"INSERT INTO iceberg_tables ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING"
        )
        return statement, insert


class _Swap:
    __slots__ = ("error", "ident", "moved", "new", "old", "settled")

    def __init__(self, ident: tuple[str, str], old: str | None, new: str) -> None:
        self.ident, self.old, self.new = ident, old, new
        self.settled = False
        self.moved = False
        self.error: Exception | None = None


_lock = threading.Lock()
_made: dict[tuple[int, int], tuple[Any, Any, JavaCommits | None]] = {}


def committer(spark: Any, root: str | Path, catalog: Any) -> JavaCommits | None:
    """The Java committer for ``catalog`` (pyiceberg's, of ``root``) in ``spark``'s driver
    (one per session and catalog); None where pyiceberg commits (see the module
    docstring)."""
    if spark is None or objectstore.is_remote(root) or getattr(catalog, "engine", None) is None:
        return None  # (a REST catalog has no engine: its commits are requests)
    try:
        jsc = spark.sparkContext._jsc
    except Exception:  # (a Spark Connect session has no context here)
        return None
    if jsc is None:  # (a session stopped)
        return None
    key = (id(spark), id(catalog))
    with _lock:
        found = _made.get(key)
        if found is None or found[0] is not spark or found[1] is not catalog:
            # (the session and the catalog kept with it: their ids are not reused)
            found = (spark, catalog, _make(spark, jsc, catalog))
            _made[key] = found
        return found[2]


def _make(spark: Any, jsc: Any, catalog: Any) -> JavaCommits | None:
    gateway = spark.sparkContext._gateway
    properties = gateway.jvm.java.util.HashMap()
    try:
        java = gateway.jvm.tidemark.iceberg.IcebergStreamCommits(
            properties, jsc.hadoopConfiguration()
        )
    except Exception as exc:  # (no Iceberg jars on the class path: an older session)
        log.warning(
            "iceberg.java_commits_unavailable",
            error=_java_message(exc),
            hint="pyiceberg commits every Iceberg table; `make setup` fetches Iceberg's jars",
        )
        return None
    log.info("iceberg.java_commits", catalog=catalog.name)
    return JavaCommits(java, catalog)


def close_all() -> None:
    """Close every committer (``catalog.forget_catalogs``)."""
    with _lock:
        made = [m for _, _, m in _made.values() if m is not None]
        _made.clear()
    for commits in made:
        with contextlib.suppress(Exception):  # (its session stopped already)
            commits._java.close()


def _fenced() -> tuple[fencing.Fence, str, int]:
    """This process's fence, and what the JVM's fenced file IO checks: the leader file
    of a local root ("" else) and the epoch (-1: unfenced)."""
    fence = fencing.current()
    leader = ""
    if fence.epoch is not None and isinstance(fence.root, Path):
        leader = str(fencing.leader_path(fence.root, fence.instance))
    return fence, leader, -1 if fence.epoch is None else fence.epoch


def _java_message(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(exc)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString())
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
