"""What the changelog tables of every format share: a folder on the sink root's
filesystem, where Spark writes each batch's Parquet files before a commit names them.

Layout under a changelog's folder (``<root>/tables/<shape>``)::

    data/<batch-uuid>/     the Parquet files of one batch (a flush round, a backfill)
    _spool/<uuid>/         files of a transaction still streamed (named by no commit)

Durability: a batch's files are synced (``fdatasync``, with their ``data/<uuid>/`` and
``data/`` folders) before the commit that names them (``files_sync``).

On an object store (an ``s3://`` root: ``path`` is then a URI, ``tidemark.state.objectstore``)
Spark writes ``data/<uuid>/`` through S3A in place, each file durable once its upload
completed, so there is nothing to sync; the files are found by listing the folder and
described from their footers (in parallel). Spool files stay on local disk
(``spool_path``): no commit names them, and every start clears them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from tidemark.errors import WriterFenced
from tidemark.jvm import DIRECT_COLUMN, DIRECT_COMMIT_CLASS, DIRECT_REPORT
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncSet, make_dirs
from tidemark.state.objectstore import Location, is_remote, join

if TYPE_CHECKING:
    from tidemark.sink.port import ChangelogTable

from tidemark.sink.files import FOOTER_TAIL, DataFile, describe_file, file_stats, tail_stats

log = structlog.get_logger("tidemark.sink")

SPOOL_DIR = "_spool"


def holds(shape: str, done: int | None, first: int, end_lsn: int) -> bool:
    """Whether a table whose committed offset is ``done`` holds the batch ``first..end_lsn``
    already (a replay: skip it); ``WriterFenced`` when it holds a part of it."""
    if done is not None and end_lsn <= done:
        log.info("commit.skipped_replay", shape=shape, end_lsn=end_lsn, committed_lsn=done)
        return True
    if done is not None and first <= done:
        raise WriterFenced(
            f"shape '{shape}': another writer committed its table up to LSN "
            f"{done}, inside this batch ({first}..{end_lsn}): this process stops "
            "committing it. Run one tidemark per slot and sink root"
        )
    return False


def folder_present(path: Location) -> bool:
    """Whether a table's folder is there (on an object store: any object below it)."""
    if is_remote(path):
        return bool(objectstore.listing(path))
    return Path(path).exists()


def move_aside(root: Location, shape: str, path: Location) -> Location:
    """Move a damaged table's folder ``path`` to ``<root>/damaged/<shape>-<time>/`` (kept
    for a look, never read by tidemark again), durably; returns where it went. On an
    object store every object below ``path`` is copied there first, then deleted: a
    crash between leaves the table where it was, still damaged, set aside again at the
    next start (an extra copy under ``damaged/``, nothing lost)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    if is_remote(path):
        target = join(root, "damaged", f"{shape}-{stamp}")
        names = [item.name for item in objectstore.listing(path)]
        for name in names:
            objectstore.copy(str(join(path, name)), str(join(target, name)))
        objectstore.delete([join(path, name) for name in names])
        return target
    assert isinstance(root, Path) and isinstance(path, Path)
    aside = root / "damaged" / f"{shape}-{stamp}"
    make_dirs(aside.parent)
    os.rename(path, aside)
    synced = SyncSet()
    synced.new_folder(aside, root)
    synced.folder(path.parent)
    synced.sync()
    return aside


class TableFolder:
    """The files of one changelog table, before and after its commits name them."""

    root: Location
    shape: str
    path: Location  # a Path, or an s3:// URI (``tidemark.state.objectstore``)

    @property
    def remote(self) -> bool:
        """Whether the table is on an object store."""
        return is_remote(self.path)

    @property
    def spool_path(self) -> Path:
        """Where the table's spool files are: its own folder on disk; a local folder for
        a table on an object store (``objectstore.local_dir``)."""
        if isinstance(self.path, Path):
            return self.path
        return objectstore.local_dir(self.root) / "spool" / self.shape

    def location(self, rel: str) -> Location:
        """A file or folder of the table (``rel``: '/'-separated, from its root)."""
        return join(self.path, rel)

    def new_batch_dir(self) -> tuple[str, Path | str]:
        """A fresh ``data/<uuid>`` folder name (relative) and where Spark writes it (a
        path, or an ``s3a://`` URI); a process that may not write under the root any
        more gets none (``fencing``)."""
        fencing.check()
        rel = f"data/{uuid.uuid4()}"
        if isinstance(self.path, Path):
            return rel, self.path / rel
        return rel, objectstore.s3a(join(self.path, rel))

    def new_spool_dir(self) -> tuple[str, Path]:
        """A fresh ``_spool/<uuid>`` folder (relative, absolute) for rows of a transaction
        still being streamed: no commit names them, so readers never see them."""
        fencing.check()
        rel = f"{SPOOL_DIR}/{uuid.uuid4()}"
        return rel, self.spool_path / rel

    def spool_file_at(self, rel: str) -> DataFile:
        """A spool file, described."""
        return describe_file(self.spool_path, rel)

    def delete_spool(self, files: Sequence[DataFile]) -> None:
        """Delete spool files and their folders (best effort)."""
        if not fencing.may_write():
            return
        for f in files:
            with contextlib.suppress(OSError):
                (self.spool_path / f.path).unlink()
        for folder in {(self.spool_path / f.path).parent for f in files}:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def clear_spool(self) -> int:
        """Delete every spool folder (at start: Postgres streams any transaction still
        open again from its start). Returns how many there were."""
        root = self.spool_path / SPOOL_DIR
        if not root.is_dir():
            return 0
        count = 0
        for entry in os.scandir(root):
            shutil.rmtree(entry.path, ignore_errors=True)
            count += 1
        return count

    def file_at(self, rel_path: str) -> DataFile:
        """A Parquet file of this table folder, described for a commit."""
        if isinstance(self.path, Path):
            return describe_file(self.path, rel_path)
        return self._remote_files([objectstore.Listed(rel_path, -1, 0)])[0]

    def files_in(
        self,
        rel_dir: str,
        known: tuple[int, str] | None = None,
        reported: Sequence[tuple[str, int, int]] | None = None,
    ) -> list[DataFile]:
        """The Parquet files Spark wrote under ``rel_dir`` (none when it was not made);
        Spark's .crc files removed. On an object store: ``known``, the row count and
        stats of all the rows written there (``describe_remote``); ``reported``, the
        files (name, size, modified ms) the writing tasks reported, else the folder is
        listed."""
        if not isinstance(self.path, Path):
            found = (
                objectstore.listing(join(self.path, rel_dir))
                if reported is None
                else [objectstore.Listed(*file) for file in reported]
            )
            return describe_remote(
                self.path,
                [
                    objectstore.Listed(f"{rel_dir}/{f.name}", f.size, f.modified_ms)
                    for f in found
                    if f.name.endswith(".parquet")
                    and not f.name.rsplit("/", 1)[-1].startswith((".", "_"))
                ],
                known,
            )
        folder = self.path / rel_dir
        if not folder.is_dir():
            return []
        out = []
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.endswith(".crc"):
                os.unlink(entry.path)
                continue
            if not entry.name.endswith(".parquet") or entry.name.startswith((".", "_")):
                continue
            st = entry.stat()
            rows, stats = file_stats(Path(entry.path))
            if rows == 0:
                continue
            out.append(
                DataFile(
                    f"{rel_dir}/{entry.name}", st.st_size, rows, int(st.st_mtime * 1000), stats
                )
            )
        return out

    def _remote_files(self, listed: Sequence[objectstore.Listed]) -> list[DataFile]:
        return describe_remote(self.path, listed)

    def files_sync(self, files: Sequence[DataFile]) -> SyncSet:
        """What makes ``files`` (under ``data/``, written for a commit) durable: each
        file with the size it was written with, its ``data/<uuid>/`` folder, and
        ``data/``, which gained that folder (``data/`` itself is durable since the
        table was created or recovered). Nothing on an object store (an upload that
        completed is durable)."""
        synced = SyncSet()
        if not isinstance(self.path, Path):
            return synced
        top = self.path / "data"
        for f in files:
            synced.new_file(self.path / f.path, top, f.size)
        return synced

    def delete_files(self, files: Sequence[DataFile]) -> None:
        """Remove written files no commit will ever reference (best effort: vacuum
        removes what is left)."""
        if not fencing.may_write():
            return  # (deposed, or the lease unconfirmed: the leader's vacuum removes them)
        if not isinstance(self.path, Path):
            with contextlib.suppress(objectstore.SinkError):
                objectstore.delete([join(self.path, f.path) for f in files])
            return
        for f in files:
            try:
                (self.path / f.path).unlink()
            except OSError:
                continue

    def _arrow_path(self, rel: str) -> str:
        """A file of the table as pyarrow names it (on a store: ``bucket/key``)."""
        return objectstore.arrow_path(join(self.path, rel))

    def rewrite_small(
        self, active: Sequence[tuple[str, int]], target_size: int, schema: pa.Schema
    ) -> tuple[list[tuple[str, int]], list[DataFile]]:
        """Compaction's files: the ``active`` files smaller than half ``target_size``,
        binned up to it, each bin's rows written as one new file (``schema``'s column
        order). Returns (the files replaced, the files written), both empty when no
        bin holds two files; the caller commits the swap (or deletes what was written)."""
        small = [(p, n) for p, n in active if n < target_size // 2]
        bins: list[list[tuple[str, int]]] = [[]]
        size = 0
        for path, n in sorted(small):
            if bins[-1] and size + n > target_size:
                bins.append([])
                size = 0
            bins[-1].append((path, n))
            size += n
        bins = [b for b in bins if len(b) > 1]
        if not bins:
            return [], []
        rel, folder = self.new_batch_dir()
        # on an object store through pyarrow's S3 client: each file read, and the new
        # one put whole (a multipart upload when large), durable once it completed
        fs = objectstore.arrow_filesystem() if self.remote else None
        if isinstance(folder, Path):
            folder.mkdir(parents=True)
        added: list[DataFile] = []
        try:
            for i, group in enumerate(bins):
                parts = [pq.read_table(self._arrow_path(p), filesystem=fs) for p, _ in group]
                rows = pa.concat_tables(parts, promote_options="default")
                rows = rows.select([n for n in schema.names if n in rows.column_names])
                name = f"{rel}/part-{i:05d}-compacted.parquet"
                fencing.check()
                pq.write_table(rows, self._arrow_path(name), filesystem=fs, compression="zstd")
                added.append(self.file_at(name))
        except BaseException:
            self.delete_files(added)
            raise
        return [item for group in bins for item in group], added


def describe_remote(
    base: Location, listed: Sequence[objectstore.Listed], known: tuple[int, str] | None = None
) -> list[DataFile]:
    """Files under ``base`` on the object store (``listed``: names relative to it)
    described from their footers, read in parallel (a round costs one footer read's
    latency, not one per file); empty files left out. ``known``: the row count and
    stats of everything written there, when the writer knows them (``arrow_stats``):
    a single file listed is described by them, without reading its footer back."""
    if known is not None and len(listed) == 1 and listed[0].size >= 0:
        item = listed[0]
        rows, stats = known
        return [DataFile(item.name, item.size, rows, item.modified_ms, stats)] if rows else []
    fs = objectstore.arrow_filesystem()

    def describe(item: objectstore.Listed) -> DataFile | None:
        where = objectstore.arrow_path(join(base, item.name))
        size, modified = item.size, item.modified_ms
        if size < 0:
            info = fs.get_file_info(where)
            size = int(info.size)
            modified = int(info.mtime.timestamp() * 1000) if info.mtime else 0
        # the footer from one ranged GET of the file's end (its size is listed);
        # else pyarrow's own reads (a HEAD and a ranged GET or two)
        found = None
        if item.size >= 0:
            tail = objectstore.read_tail(join(base, item.name), FOOTER_TAIL)
            found = tail_stats(tail, size)
        if found is None:
            objectstore.note_request("FOOTER")
            found = file_stats(where, fs)
        rows, stats = found
        if rows == 0:
            return None
        return DataFile(item.name, size, rows, modified, stats)

    if len(listed) == 1:
        found = [describe(listed[0])]
    else:
        with ThreadPoolExecutor(min(16, max(1, len(listed)))) as pool:
            found = list(pool.map(describe, listed))
    return [f for f in found if f is not None]


def writes_in_place(spark: Any) -> bool:
    """Whether the session's writes go through ``DirectPartitionCommitProtocol``
    (``tidemark.spark.local_mode_conf``): then a round partitions by ``_tm_dest``, each
    member's table folder, and its tasks write there; otherwise by the member's index
    under ``staging``, and each member's folder is moved into its table (``_adopt``)."""
    try:
        chosen = spark.conf.get("spark.sql.sources.commitProtocolClass", "")
    except Exception:  # (Spark Connect: its server's settings are not tidemark's)
        return False
    return bool(chosen == DIRECT_COMMIT_CLASS)


def write_files(
    spark: Any, frame: Any, table: ChangelogTable, folder: Path | str
) -> Reported | None:
    """Spark writes ``frame`` as Parquet files into ``folder`` (a batch's new folder).
    For a table on an object store, in place (``DirectPartitionCommitProtocol``: the
    frame partitioned by ``_tm_dest``, the job's own output a local scratch folder), so
    no ``_temporary`` folder is made on the store and no file is renamed there (S3A's
    rename is a copy and a delete of each file); the files written there, as the tasks
    reported them (for ``files_in``: the folder need not be listed), else None."""
    if not table.remote or not writes_in_place(spark):
        frame.write.mode("append").parquet(str(folder))
        return None
    from pyspark.sql import functions as F

    scratch = objectstore.local_dir(table.root) / "_writes" / str(uuid.uuid4())
    try:
        frame.withColumn(DIRECT_COLUMN, F.lit(str(folder))).write.partitionBy(DIRECT_COLUMN).mode(
            "append"
        ).option(DIRECT_REPORT, "true").parquet(str(scratch))
    finally:
        reported = take_reported(spark, [str(folder)])  # (also when the job failed)
        fencing.clear(scratch)
    return reported.get(str(folder))


Reported = list[tuple[str, int, int]]  # a folder's files: (name, size, modified ms)


def take_reported(spark: Any, folders: Iterable[str]) -> dict[str, Reported]:
    """What the tasks of a write with ``DIRECT_REPORT`` wrote into ``folders`` on an
    object store, as they reported it (``DirectPartitionCommitProtocol.take``): per
    folder, each file's name, size and modification time; taken, so forgotten there.
    A folder missing here (no task reported a file into it, or a jar without ``take``)
    is listed by ``files_in``."""
    wanted = list(folders)
    if not wanted:
        return {}
    try:
        protocol = spark._jvm
        for part in DIRECT_COMMIT_CLASS.split("."):
            protocol = getattr(protocol, part)
        text = protocol.take("\n".join(wanted))
    except Exception as exc:  # (an older jar: the folders are listed)
        log.warning("write.reported_unavailable", error=str(exc).splitlines()[0][:200])
        return {}
    out: dict[str, Reported] = {}
    for line in text.splitlines():
        folder, name, size, modified = line.split("\t")
        out.setdefault(folder, []).append((name, int(size), int(modified)))
    return out
