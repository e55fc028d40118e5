"""The sink as a port: what the rest of tidemark asks of a shape's tables.

Above the sink (writers, backfills, the shape set, upkeep, the service, readers)
nothing names a table format. A shape has two tables under the sink root: its
*changelog* (every change, tagged with the transaction range it came from) and its
*current-state* table (the changelog folded, one row per key). A table format
provides both through ``TableFormat``; ``tidemark.sink.table_format`` picks one (the
Delta adapter, ``tidemark.sink.delta``, is the one there is).

What every format must keep, whatever its commit protocol:

- **exactly once**: a commit records the shape's application id and the commit LSN
  of its last transaction atomically with its files; ``committed_lsn`` reads it
  back, and ``commit`` skips a batch at or below it (a replay) and refuses one
  overlapping it (``WriterFenced``);
- **fenced**: every commit carries the leader's epoch (``tidemark.state.fencing``) and is
  refused when the table holds a newer one; a concurrent commit is refused by the
  format's own compare-and-swap, then checked again;
- **durable**: ``commit`` returns once the commit is whole on disk except for what
  ``log_sync`` names, which the caller syncs before acknowledging (a flush round
  syncs all its tables' at once); ``recover`` repairs what a power loss can leave;
- **generations**: a backfill or resync replaces the table's rows in one commit and
  raises its generation; ``retained_lsn`` says from where the history is whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from tidemark.sink.files import DataFile
    from tidemark.state.durable import SyncSet
    from tidemark.state.objectstore import Location


@dataclass(frozen=True, slots=True)
class RefreshResult:
    """What one current-state refresh did."""

    shape: str
    lsn: int | None  # the LSN folded through (None: nothing to fold, no table)
    rebuilt: bool
    buckets_written: int
    rows_folded: int  # changelog rows read past the old LSN
    files_added: int
    files_removed: int
    seconds: float
    skipped: bool = False  # already current

    @classmethod
    def nothing(cls, shape: str, lsn: int | None) -> RefreshResult:
        """A refresh with nothing to do: the table holds ``lsn`` (None: no table)."""
        return cls(shape, lsn, False, 0, 0, 0, 0, 0.0, skipped=True)


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What one changelog retention pass dropped."""

    shape: str
    retained_lsn: int  # rows at or below this are gone from the changelog
    files_removed: int
    files_added: int
    rows_dropped: int


@dataclass(frozen=True, slots=True)
class RefreshPoint:
    """What a refresh commit recorded: the table holds the fold through ``lsn``."""

    version: int  # the current table's version of that commit
    lsn: int
    generation: int
    buckets: int
    timestamp_ms: int
    changelog_id: str = ""  # the changelog's identity (a table made again differs)

    def folds(self, view_generation: int, changelog_id: str) -> bool:
        """Whether this refresh folded the same changelog generation."""
        same_table = not self.changelog_id or self.changelog_id == changelog_id
        return self.generation == view_generation and same_table


@dataclass(frozen=True, slots=True)
class ChangelogFile:
    path: str  # relative to the table folder
    uri: str
    size: int
    min_lsn: int | None  # None: no statistics
    max_lsn: int | None
    rows: int

    def reaches_past(self, lsn: int | None) -> bool:
        """Whether it may hold rows with ``_lsn > lsn`` (without statistics: yes)."""
        return lsn is None or self.max_lsn is None or self.max_lsn > lsn


@dataclass(frozen=True, slots=True)
class ChangelogView:
    """One pinned version of a shape's changelog: its files with their ``_lsn`` range."""

    version: int
    generation: int
    table_id: str
    schema: pa.Schema
    primary_key: list[str]
    files: list[ChangelogFile]
    # rows at or below it were dropped by retention in this generation (None: none)
    retained_lsn: int | None = None

    @property
    def max_lsn(self) -> int | None:
        highs = [f.max_lsn for f in self.files if f.max_lsn is not None]
        return max(highs) if highs else None

    def files_after(self, lsn: int | None) -> list[ChangelogFile]:
        """The files that may hold rows with ``_lsn > lsn``."""
        return [f for f in self.files if f.reaches_past(lsn)]

    def rows_after(self, lsn: int | None) -> int:
        """At most this many rows have ``_lsn > lsn`` (whole files counted)."""
        return sum(f.rows for f in self.files_after(lsn))


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One commit of a changelog, as its history (Delta) or lineage (Iceberg) has it."""

    version: int  # Delta: the table version; Iceberg: the snapshot id
    end_lsn: int | None  # the commit LSN of its last transaction (a stream commit)
    operation: str  # stream, backfill, retention, compaction, epoch, ...
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Pinned:
    """The newest version of a current-state table, as a refresh starts from it."""

    handle: Any  # the format's own (a Delta table, an Iceberg table), for the commit
    version: int
    point: RefreshPoint | None  # the newest refresh it holds (None: never refreshed)
    schema: pa.Schema


class ChangelogTable(Protocol):
    """One shape's changelog table. Thread-safe: commits come from worker threads."""

    shape: str
    uri: str
    # a writer schema found to fit the table (``writers.job.fit_table``); forgotten
    # whenever the table's schema may have changed through this object
    fitted: pa.Schema | None

    @property
    def root(self) -> Path | str:
        """The sink root (a path, or an ``s3://`` URI: ``tidemark.state.objectstore``)."""

    @property
    def path(self) -> Path | str:
        """The table's folder: Spark writes its data files under it."""

    @property
    def remote(self) -> bool:
        """Whether the table is on an object store (``path`` an ``s3://`` URI)."""

    @property
    def name(self) -> str:
        """How an engine names it: its folder (Delta), its catalog name (Iceberg)."""

    # -- existence, schema ----------------------------------------------------------
    def exists(self) -> bool: ...

    def create(
        self,
        schema: pa.Schema,
        primary_key: Sequence[str],
        definition: Mapping[str, Any] | None = None,
    ) -> bool:
        """Create the table, born with this leader's epoch (idempotent when it exists
        with a compatible schema). True when it was made now: empty, of ``schema``."""

    def recover(self) -> bool:
        """At start: repair what a power loss left, make the last run's newest commit
        durable; True when the table exists. ``TableDamaged`` when it cannot be."""

    def arrow_schema(self) -> pa.Schema: ...

    def primary_key(self) -> list[str]: ...

    def op_type(self) -> pa.DataType | None:
        """The type of the table's ``_op`` column (older tables: int32)."""

    def needs_replacement(self, schema: pa.Schema, primary_key: Sequence[str]) -> bool:
        """Whether ``schema`` cannot evolve the table (a type or key change): a resync."""

    def ensure_columns(self, schema: pa.Schema) -> list[str]:
        """Evolve the table by the columns of ``schema`` it lacks; the names added."""

    # -- offsets ----------------------------------------------------------------------
    def committed_lsn(self) -> int | None:
        """The commit LSN of the last transaction committed (None: none yet)."""

    def generation(self) -> int:
        """How many times the table's rows were replaced (a backfill, a resync)."""

    def retained_lsn(self, generation: int) -> int | None:
        """The LSN through which retention dropped rows in ``generation`` (None: whole)."""

    def identity(self) -> str:
        """What tells this table from one made again at the same place."""

    # -- data files ---------------------------------------------------------------------
    def new_batch_dir(self) -> tuple[str, Path | str]:
        """A fresh folder for a batch's files: (relative path, where Spark writes it)."""

    @property
    def spool_path(self) -> Path:
        """The local folder the spool files are under (``new_spool_dir`` is relative)."""

    def new_spool_dir(self) -> tuple[str, Path]:
        """A fresh folder for the files of a transaction still streamed."""

    def spool_file_at(self, rel_path: str) -> DataFile: ...

    def delete_spool(self, files: Sequence[DataFile]) -> None: ...

    def clear_spool(self) -> int: ...

    def file_at(self, rel_path: str) -> DataFile: ...

    def files_in(
        self,
        rel_dir: str,
        known: tuple[int, str] | None = None,
        reported: Sequence[tuple[str, int, int]] | None = None,
    ) -> list[DataFile]:
        """The data files written under ``rel_dir`` (``known``: the row count and stats
        of all of them together, when the writer knows them: ``files.arrow_stats``;
        ``reported``: each file's name, size and modification time (ms) as the writer
        reported them on an object store, so that the folder is not listed)."""

    def delete_files(self, files: Sequence[DataFile]) -> None:
        """Remove files no commit names (a failed job's output)."""

    def active_files_with_sizes(self) -> list[tuple[str, int]]: ...

    def file_uris(self) -> list[str]:
        """The data files of the newest version, for a reader."""

    def view(self) -> ChangelogView:
        """The newest version pinned: its files with their ``_lsn`` range."""

    def commits(self) -> list[CommitRecord]:
        """The commits still readable (time travel reaches them), newest first."""

    # -- commits --------------------------------------------------------------------------
    def files_sync(self, files: Sequence[DataFile]) -> SyncSet:
        """What makes ``files`` durable before a commit names them."""

    def prepare(
        self, files: Sequence[DataFile], end_lsn: int, metadata: Mapping[str, Any] | None = None
    ) -> Path | None:
        """The commit's record written ahead (synced with the files by a flush round),
        or None when the format writes it at commit time."""

    def commit(
        self,
        files: Sequence[DataFile],
        end_lsn: int,
        metadata: Mapping[str, Any] | None = None,
        *,
        first_lsn: int | None = None,
        prepared: Path | None = None,
    ) -> int | None:
        """Add ``files`` as the transactions ``first_lsn..end_lsn``; the new version,
        or None when they were committed already (see the module docstring)."""

    def log_sync(self) -> SyncSet:
        """What is left to sync after commits before they may be acknowledged."""

    def backfill_commit(
        self,
        remove: Sequence[tuple[str, int]],
        files: Sequence[DataFile],
        metadata: Mapping[str, Any] | None = None,
        *,
        replace: tuple[pa.Schema, Sequence[str]] | None = None,
    ) -> int:
        """Replace the table's rows (a backfill or resync) in one commit that adds a
        snapshot's ``files``, removes ``remove`` and raises the generation;
        ``replace=(schema, primary_key)`` replaces the schema and key with them."""

    def retention_commit(
        self, remove: Sequence[tuple[str, int]], files: Sequence[DataFile], retained_lsn: int
    ) -> int:
        """Replace ``remove`` by ``files`` (the same rows without those at or below
        ``retained_lsn``) and record ``retained_lsn`` for the generation, in one commit."""

    # -- upkeep ---------------------------------------------------------------------------
    def compact(self, target_size: int = 128 * 1024 * 1024) -> dict[str, Any]: ...

    def vacuum(self, retention_hours: int = 24, keep: Sequence[DataFile] = ()) -> list[str]: ...


class CurrentState(Protocol):
    """One shape's current-state table, as a refresh (``tidemark.sink.current``) and a
    reader see it."""

    shape: str
    path: Path  # Spark's output is moved into its bucket folders
    uri: str

    @property
    def name(self) -> str:
        """As ``ChangelogTable.name``."""

    def exists(self) -> bool: ...

    def recover(self) -> None:
        """At start: repair what a power loss left of the last run's commits."""

    def pinned(self) -> Pinned | None:
        """The newest version (None: no table yet)."""

    def points(self) -> list[RefreshPoint]:
        """Every refresh still readable, newest first."""

    def files_by_bucket(self, pinned: Pinned) -> dict[int, list[tuple[str, int]]]:
        """The files of ``pinned`` (relative path, size) by bucket (-1: no bucket)."""

    def file_uris(self, version: int | None = None) -> list[str]:
        """The data files of ``version`` (None: the newest), for a reader."""

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
        """One refresh commit on ``pinned`` (None: create the table with it): remove
        ``removed``, add ``added`` (synced first), record ``metadata``; ``overwrite``
        replaces every file and the schema. Refused when another refresh or a newer
        leader committed since ``pinned``; durable when it returns."""


class TableFormat(Protocol):
    """A table format: the changelog and current-state tables of every shape."""

    name: str

    def use_engine(self, spark: Any) -> None:
        """The Spark session writing the data files (a format may commit through it)."""

    def changelog(self, root: Path | str, shape: str, *, epoch: int = 1) -> ChangelogTable:
        """The changelog of ``shape`` (``epoch``: the stream epoch its offsets are on)."""

    def current(self, root: str | Path, shape: str) -> CurrentState:
        """The current-state table of ``shape``."""

    def folders(self, root: str | Path, shape: str) -> tuple[Path | str, Path | str]:
        """Where the changelog and the current-state table of ``shape`` live."""

    def set_aside(self, table: ChangelogTable) -> Location:
        """Move a damaged changelog out of the way, durably; where it went."""

    def mark(self, root: str | Path, epoch: int, shapes: Sequence[str], app_id: str) -> int:
        """Mark the tables of ``shapes`` with a new leader's ``epoch``; how many."""

    def recover_current(self, root: str | Path, shape: str) -> None:
        """At start: clear what refreshes of an earlier run left, repair the table."""

    def refresh_current(
        self,
        spark: Any,
        root: str | Path,
        shapes: Sequence[str],
        *,
        buckets: int,
        parallelism: int,
        small_bytes: int,
    ) -> dict[str, RefreshResult | Exception]:
        """Fold each shape's new changelog rows into its current-state table."""

    def compact_changelog(
        self, spark: Any, root: str | Path, shape: str, retention_hours: float
    ) -> RetentionResult | None:
        """Drop changelog rows the current table holds folded and older than that."""

    def vacuum_and_clean(self, root: str | Path, shape: str, floor_hours: int) -> None:
        """Remove files no version still readable needs, and expired metadata."""

    def table_stats(self, path: Path | str) -> tuple[int, int] | None:
        """(data files, log entries since the newest checkpoint) of a table folder."""

    def current_base(
        self, root: str | Path, table: ChangelogTable, as_of: int | None
    ) -> tuple[list[str], int] | None:
        """Where a read of the state as of ``as_of`` (None: the newest) starts: the
        current-state files and the LSN they hold; None: fold the whole changelog.
        Refuses an ``as_of`` older than the retained history."""
