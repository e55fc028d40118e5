"""The blocking work of a flush, run in a worker thread: Arrow -> Spark -> Delta.

``write_parquet`` has Spark write rows as Parquet into a fresh ``data/<uuid>/``
folder of the shape's table (the rows handed over as a plain Parquet file the driver
writes, ``arrow_frames``; ``coalesce``) and returns the files; nothing is visible
until ``commit_batch`` adds them in one Delta commit tagged with the batch's end LSN.

Rows of a transaction still being streamed are *spooled* (``write_spool``): the
driver writes them with pyarrow under the table's ``_spool/`` folder (a hidden
folder Delta never reads or vacuums), since their commit LSN is not known yet.
The flush that commits the transaction has Spark read them back, drop the op
ranges aborted subtransactions left, set ``_lsn``/``_commit_ts`` and write them
as the table's files (``rewrite_spooled``); the spool files are deleted once the
commit landed.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog

from tidemark.errors import SinkError
from tidemark.jvm import DIRECT_COLUMN, DIRECT_REPORT
from tidemark.sink.files import DataFile, arrow_stats
from tidemark.sink.folder import Reported, take_reported, write_files, writes_in_place
from tidemark.sink.port import ChangelogTable
from tidemark.sink.schema import COMMIT_TS, LSN, OP, ColumnSpec, spark_schema, table_schema
from tidemark.spark import arrow_parts, is_connect, readable_path
from tidemark.state import fencing, objectstore
from tidemark.state.durable import SyncFailed, SyncSet
from tidemark.writers.arrow_batch import PG_EPOCH_US, build_table
from tidemark.writers.buffer import Batch, Rows, SpooledTxn

log = structlog.get_logger("tidemark.writers")

ROWS_PER_FILE = 2_000_000
SLICE_BYTES = 4 * 1024 * 1024  # rows converted to Arrow at once when spooling
_ONE_SLICE_AT_A_TIME = threading.Lock()


@dataclass(frozen=True, slots=True)
class CommitResult:
    shape: str
    version: int | None  # None: the sink had this batch already (replay)
    rows: int
    files: int
    end_lsn: int
    write_seconds: float
    commit_seconds: float
    kinds: dict[str, int]  # rows by _kind (metrics)


def write_parquet(
    spark: Any, table: ChangelogTable, schema: pa.Schema, specs: Sequence[ColumnSpec], rows: Rows
) -> list[DataFile]:
    return write_arrow(spark, table, schema, build_table(schema, specs, rows, table.shape))


def write_arrow(
    spark: Any,
    table: ChangelogTable,
    schema: pa.Schema,
    arrow: pa.Table,
    *,
    replacing: bool = False,
) -> list[DataFile]:
    """Spark writes ``arrow`` as Parquet into a fresh folder of ``table``; not committed.

    Refuses (``SinkError``) a batch whose column types differ from the table's: a
    table created when tidemark mapped a type otherwise (e.g. interval as text). One
    job, or on Spark Connect one per ``arrow_parts`` slice, all into the folder.
    ``replacing``: the files belong to a backfill whose commit replaces the table's
    schema, so the table's current types do not apply to them."""
    if not replacing:
        check_column_types(table, schema)
    rel, folder = table.new_batch_dir()
    scratch = table.spool_path / table.new_spool_dir()[0]
    written: list[Reported | None] = []
    with arrow_frames(spark, arrow, spark_schema(schema), scratch) as frames:
        for rows, frame in frames:
            files = max(1, -(-rows // ROWS_PER_FILE))
            written.append(write_files(spark, frame.coalesce(files), table, folder))
    # the folder is listed unless every job's files were reported
    whole = bool(written) and all(w is not None for w in written)
    reported = [f for w in written for f in w or ()] if whole else None
    return table.files_in(rel, reported=reported)


@contextmanager
def arrow_frames(
    spark: Any, arrow: pa.Table, target: Any, scratch: Path
) -> Iterator[list[tuple[int, Any]]]:
    """DataFrames over ``arrow`` (with their row counts), for one write each.

    A classic session reads the rows from a plain Parquet file the driver writes with
    pyarrow into the folder ``scratch`` (under the sink root: the executors mount it;
    removed after the write). Fed to ``createDataFrame`` instead, a batch reaches the
    JVM inside its job and is turned into rows there: ``python -m bench parquet``
    measured 5.3 us of the JVM's CPU a row that way against 3.1 us through the file
    (which costs the driver 0.15 us a row). Spark Connect (the server need not share
    the driver's files), and a sink root whose path Hadoop cannot read as it is
    (``readable_path``): ``createDataFrame`` of ``arrow_parts``."""
    if is_connect(spark) or not readable_path(scratch):
        yield [(part.num_rows, spark.createDataFrame(part, schema=target))
               for part in arrow_parts(spark, arrow)]  # fmt: skip
        return
    import pyarrow.parquet as pq

    fencing.check()  # (a deposed leader writes nothing under the root)
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "rows.parquet"
    try:
        pq.write_table(arrow, path, compression="none", use_dictionary=False)
        yield [(arrow.num_rows, spark.read.schema(target).parquet(str(path)))]
    finally:
        # (not by a leader deposed while Spark read it: the next start clears it)
        fencing.clear(scratch)


def write_spool(
    table: ChangelogTable,
    schema: pa.Schema,
    specs: Sequence[ColumnSpec],
    rows: Rows,
    files: list[DataFile],
    folder: str,
) -> None:
    """Write ``rows`` to spool files under ``folder`` (not part of the table), one file
    per slice of about ``SLICE_BYTES``, with pyarrow on the driver: each slice is
    converted and written, and its file appended to ``files``; the rows written leave
    ``rows`` when the job ends or fails. So at most one slice is in memory twice, and a
    job that fails half way goes on from where it stopped when retried. Slices of all
    writers are converted one at a time (the work is the driver's CPU anyway), so the
    memory they need on top of the buffered rows is one slice, not one per writer."""
    if not len(rows):
        return
    n = max(1, SLICE_BYTES // max(1, rows.nbytes // len(rows)))
    written = 0
    try:
        for piece in rows.slices(n):
            with _ONE_SLICE_AT_A_TIME:
                arrow = build_table(schema, specs, piece, table.shape)
                spooled = spool_arrow(table, folder, f"part-{len(files):05d}.parquet", arrow)
                del arrow
            files.append(spooled)
            written += len(piece)
    finally:  # (one cut at the end: cutting the front of the lists at each slice, and
        # walking the runs again each time, cost more than converting the slices)
        if written == len(rows):
            rows.clear()
        else:
            rows.drop_front(written)


def spool_batch_rows(
    table: ChangelogTable, schema: pa.Schema, specs: Sequence[ColumnSpec], batch: Batch
) -> None:
    """Move a large batch's buffered rows to spool files in slices (``write_spool``);
    the flush then has Spark rewrite them into the table like a streamed transaction's.
    The batch records the progress, so a retry goes on with what is left."""
    txn = next((t for t in batch.spooled if t.lsn is None), None)
    if txn is None:
        txn = SpooledTxn([], [], None, 0, 0, 0)
        batch.spooled.append(txn)
    folder = txn.files[0].path.rsplit("/", 1)[0] if txn.files else table.new_spool_dir()[0]
    before = len(txn.files)
    write_spool(table, schema, specs, batch.rows, txn.files, folder)
    txn.rows += sum(f.num_rows for f in txn.files[before:])


def spool_arrow(table: ChangelogTable, folder: str, name: str, arrow: pa.Table) -> DataFile:
    """Write ``arrow`` with pyarrow as the spool file ``folder/name`` (a slice of a
    streamed transaction or a large batch, a backfill's chunk); Spark rewrites spool
    files into the table (``rewrite_spooled``). Spool files are read once, soon, so
    they are written plain: no compression, no dictionaries (1M backfill rows: 0.27 s
    to write 5 files with snappy and dictionaries, 0.10 s plain, and Spark's rewrite
    of them 0.87 s against 0.68 s); the table's files are Spark's, compressed."""
    import pyarrow.parquet as pq

    (table.spool_path / folder).mkdir(parents=True, exist_ok=True)
    rel = f"{folder}/{name}"
    pq.write_table(arrow, table.spool_path / rel, compression="none", use_dictionary=False)
    return table.spool_file_at(rel)


def rewrite_spooled(
    spark: Any,
    table: ChangelogTable,
    schema: pa.Schema,
    txn: SpooledTxn,
    *,
    replacing: bool = False,
    spread: bool = False,
) -> list[DataFile]:
    """Spark reads spool files and writes them as table files: a committed streamed
    transaction's (the dropped op ranges filtered out, its commit LSN and time set)
    or a backfill's chunks, columns in the table's order (a column added since is
    NULL). ``replacing`` as for ``write_arrow``; ``spread``: written by as many tasks
    as Spark runs at once (up to one per spool file), not as few as the rows need."""
    if not txn.files:
        return []
    from pyspark.sql import functions as F

    if not replacing:
        check_column_types(table, schema)
    target = spark_schema(schema)
    frame = spark.read.schema(target).parquet(*[str(table.spool_path / f.path) for f in txn.files])
    for lo, hi in txn.dropped:
        frame = frame.where((F.col(OP) < lo) | (F.col(OP) >= hi))
    if txn.lsn is not None:
        frame = frame.withColumn(LSN, F.lit(txn.lsn).cast("long")).withColumn(
            COMMIT_TS, F.timestamp_micros(F.lit(txn.commit_ts + PG_EPOCH_US))
        )
    rel, folder = table.new_batch_dir()
    files = max(1, -(-txn.rows // ROWS_PER_FILE))
    if spread:
        files = max(files, min(len(txn.files), default_parallelism(spark)))
    reported = write_files(spark, frame.select(*target.fieldNames()).coalesce(files), table, folder)
    return table.files_in(rel, reported=reported)


def check_column_types(table: ChangelogTable, schema: pa.Schema) -> None:
    """Every column of ``schema`` the table has must have the table's type, as Spark
    sees both: files of another type would be unreadable through the table."""
    existing = {f.name: f for f in spark_schema(table.arrow_schema()).fields}
    for wanted in spark_schema(schema).fields:
        have = existing.get(wanted.name)
        if have is not None and have.dataType != wanted.dataType:
            raise SinkError(
                f"shape '{table.shape}': column {wanted.name} is "
                f"{have.dataType.simpleString()} in the lake table but tidemark now writes "
                f"it as {wanted.dataType.simpleString()} (the table was created with "
                "another type mapping or another declared type): add the shape again under "
                "a new name, which builds a new table from a snapshot, and remove this one"
            )


def fit_table(table: ChangelogTable, schema: pa.Schema) -> None:
    """``ensure_columns`` and ``check_column_types``, once per writer schema: the
    table's schema changes only through its ``ChangelogTable``, which then forgets what
    fitted (a round of 1000 shapes spent ~0.25 s converting schemas otherwise)."""
    fitted = table.fitted
    if fitted is not None and (fitted is schema or fitted.equals(schema)):
        return
    table.ensure_columns(schema)
    check_column_types(table, schema)
    table.fitted = schema


def commit_batch(
    spark: Any, table: ChangelogTable, schema: pa.Schema, specs: Sequence[ColumnSpec], batch: Batch
) -> CommitResult:
    """One shape's flush on its own: Spark writes the batch, then its Delta commit."""
    started = time.perf_counter()
    table.ensure_columns(schema)
    if batch.kinds is None:  # (a retry finds the rows moved to spool files)
        batch.kinds = dict(Counter(batch.rows.kinds))
    files = list(batch.staged)
    if batch.rows.nbytes >= SLICE_BYTES:
        # large: converted in slices on the driver, then read and written by Spark,
        # instead of one Arrow table and a local relation as big as the batch
        spool_batch_rows(table, schema, specs, batch)
    if len(batch.rows):
        files += write_parquet(spark, table, schema, specs, batch.rows)
    for txn in batch.spooled:
        files += rewrite_spooled(spark, table, schema, txn)
    return commit_files(table, batch, files, time.perf_counter() - started)


def sync_batch_files(table: ChangelogTable, batch: Batch, synced: SyncSet) -> None:
    """Sync the files a batch's commit will name (``synced``: ``ChangelogTable.files_sync``
    of them)."""
    if batch.lost is not None:
        raise SinkError(batch.lost)
    try:
        synced.sync()
    except SyncFailed as exc:
        raise _sync_error(table, batch, exc) from exc


def _sync_error(table: ChangelogTable, batch: Batch, exc: SyncFailed) -> SinkError:
    """A failed sync of a batch's files: retried like any failed flush (Spark writes
    the rows again, into new files), unless a staged file failed: its rows are not in
    memory to be written again, and syncing it again could report success for bytes
    the kernel dropped, so the batch is lost (``Batch.lost``) until a restart."""
    if not {Path(table.path) / f.path for f in batch.staged} & exc.paths:
        return exc
    batch.lost = (
        f"shape '{table.shape}': a file of a transaction staged to disk before its commit "
        f"cannot be made durable ({exc}); its rows are no longer in memory, so this batch "
        "is never committed and nothing past it is acknowledged. Restart tidemark once the "
        "disk is healthy: Postgres sends the transaction again"
    )
    return SinkError(batch.lost)


def sync_group(parts: Sequence[tuple[ChangelogTable, Batch, SyncSet]]) -> dict[int, SinkError]:
    """Group commit: the sets of several tables' commits synced in one step. Returns
    the failures by index in ``parts``: a part fails only when one of its own paths
    did."""
    together = SyncSet()
    for _, batch, synced in parts:
        if batch.lost is None:
            together.update(synced)
    failed: dict[int, SinkError] = {}
    try:
        together.sync()
    except SyncFailed as exc:
        for i, (table, batch, synced) in enumerate(parts):
            mine = (set(synced.files) | synced.folders) & exc.paths
            if mine:
                failed[i] = _sync_error(table, batch, SyncFailed(str(exc), mine))
    for i, (_, batch, _) in enumerate(parts):
        if batch.lost is not None and i not in failed:
            failed[i] = SinkError(batch.lost)
    return failed


def batch_metadata(batch: Batch) -> dict[str, Any]:
    """What a batch's commit records beside its files (``ChangelogTable.commit``)."""
    metadata: dict[str, Any] = {
        "tidemark.transactions": batch.transactions,
        "tidemark.lastOp": batch.last_offset.op_offset,
    }
    streamed = sum(1 for t in batch.spooled if t.lsn is not None)
    if streamed:  # transactions Postgres streamed while they ran (protocol v2)
        metadata["tidemark.streamedTransactions"] = streamed
    return metadata


def prepared_sync(
    table: ChangelogTable, batch: Batch, files: Sequence[DataFile]
) -> tuple[SyncSet, Path | None]:
    """What a flush round syncs for one member before its commit: its files, and the
    log entry its commit will name, written now (``ChangelogTable.prepare``)."""
    synced = table.files_sync(files)
    prepared = None
    if batch.lost is None:
        try:
            prepared = table.prepare(files, batch.end_lsn, batch_metadata(batch))
        except OSError:  # (a full disk): the commit writes its entry and fails there
            prepared = None
        if prepared is not None:
            synced.file(prepared)
    return synced, prepared


def commit_files(
    table: ChangelogTable,
    batch: Batch,
    files: list[DataFile],
    write_seconds: float,
    *,
    grouped: bool = False,
    prepared: Path | None = None,
) -> CommitResult:
    """The Delta commit of ``batch`` once its files are written (``files`` includes the
    staged ones); then its spool files, now in the table, are deleted.

    Durability: the files are synced before the commit names them, the log entry
    before it is named, and the log folder before this returns, so the batch may be
    acknowledged once it has. ``grouped``: a flush round synced the files already
    (and ``prepared``, the commit's log entry, ``ChangelogTable.prepare``), and syncs the
    log folders of all its tables at once after their commits (``ChangelogTable.log_sync``):
    the batch may be acknowledged only after that."""
    if batch.kinds is None:
        batch.kinds = dict(Counter(batch.rows.kinds))
    kinds = dict(batch.kinds)
    started = time.perf_counter()
    if not grouped:
        sync_batch_files(table, batch, table.files_sync(files))
    metadata = batch_metadata(batch)
    version = table.commit(
        files, batch.end_lsn, metadata, first_lsn=batch.first_lsn, prepared=prepared
    )
    if not grouped:
        # (also after a replay: the entry found may be one a failed sync left behind)
        table.log_sync().sync()
    done = time.perf_counter()
    # the spool files are in the table now (or were already: a replay)
    table.delete_spool([f for txn in batch.spooled for f in txn.files])
    if batch.staged:
        kinds["staged"] = sum(f.num_rows for f in batch.staged)
    streamed = sum(t.rows for t in batch.spooled if t.lsn is not None)
    if streamed:
        kinds["streamed"] = streamed
    return CommitResult(
        table.shape,
        version,
        sum(f.num_rows for f in files),
        len(files),
        batch.end_lsn,
        write_seconds,
        done - started,
        kinds,
    )


# -- flush rounds: the batches of many shapes in one Spark job -------------------------

ROUND_BYTES = 32 * 1024 * 1024  # buffered rows one round job converts and sends at most
PART = "_tm_part"  # the partition column of a round's output: the member's index


@dataclass(slots=True)
class RoundMember:
    table: ChangelogTable
    schema: pa.Schema
    specs: Sequence[ColumnSpec]
    batch: Batch


def joins_round(batch: Batch) -> bool:
    """A batch a round can write: rows in memory, small enough for one local relation.
    Batches with spooled transactions or large rows go through ``commit_batch``."""
    return not batch.spooled and len(batch.rows) > 0 and batch.rows.nbytes < SLICE_BYTES


def write_round(
    spark: Any, members: Sequence[RoundMember], staging: Path
) -> list[list[DataFile] | BaseException]:
    """Spark writes the rows of several shapes' batches: one job per column layout,
    the rows of all its shapes in one DataFrame with the member's index as a
    partition column (``partitionBy``), into a folder under ``staging``; each
    member's files are then moved into a fresh ``data/<uuid>/`` folder of its own
    table. Nothing is committed. Per member: its files (the staged ones first), or
    the error that stopped it (a conversion error stops only that member; a failed
    Spark job every member of its layout)."""
    fencing.check()  # (no job writes under the root for a deposed leader)
    results: list[list[DataFile] | BaseException] = [[] for _ in members]
    direct = writes_in_place(spark)
    layouts: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for i, member in enumerate(members):
        key = tuple((f.name, str(f.type)) for f in member.schema)
        layouts.setdefault(key, []).append(i)
    column = DIRECT_COLUMN if direct else PART
    for indexes in layouts.values():
        parts: list[pa.Table] = []
        ready: list[int] = []
        folders: dict[int, str] = {}  # direct: the member's data/<uuid> folder
        known: dict[int, tuple[int, str]] = {}  # on an object store: what it will hold
        targets: dict[int, str] = {}  # on an object store: the folder's URI
        for i, arrow in _convert(members, indexes, results):
            m = members[i]
            if direct:
                folders[i], target = m.table.new_batch_dir()
                if m.table.remote:
                    known[i] = arrow_stats(arrow)
                    targets[i] = str(target)
                value = pa.repeat(pa.scalar(str(target), pa.string()), arrow.num_rows)
            else:
                value = pa.repeat(pa.scalar(i, pa.int32()), arrow.num_rows)
            parts.append(arrow.append_column(column, value))
            ready.append(i)
        if not ready:
            continue
        try:
            started = time.perf_counter()
            remote = any(members[i].table.remote for i in ready)
            schema = members[ready[0]].schema
            try:
                written = _write_partitioned(spark, parts, schema, staging, column, remote)
            finally:
                reported = take_reported(spark, targets.values())  # (also when it failed)
            spark_s = time.perf_counter() - started
            if direct:
                found = _found_in_place(
                    [
                        (
                            members[i].table,
                            folders[i],
                            known.get(i),
                            reported.get(targets.get(i, "")),
                        )
                        for i in ready
                    ]
                )
            log.debug(
                "round.layout_written",
                shapes=len(ready),
                spark_s=round(spark_s, 3),
                found_s=round(time.perf_counter() - started - spark_s, 3),
            )
            for n, i in enumerate(ready):
                m = members[i]
                files = found[n] if direct else _adopt(m.table, written / f"{PART}={i}")
                results[i] = [*m.batch.staged, *files]
            fencing.clear(written)
        except Exception as exc:  # the job (or a move): every member of the layout
            for i in ready:
                if not isinstance(results[i], BaseException):
                    results[i] = exc
    return results


def _convert(
    members: Sequence[RoundMember],
    indexes: list[int],
    results: list[list[DataFile] | BaseException],
) -> list[tuple[int, pa.Table]]:
    """The members' rows as Arrow, per member. Members whose columns are described
    alike are converted together: one conversion, not one per member (about 0.8 ms
    each, most of it fixed, for batches of a few rows: 0.65 s of a round of 800
    shapes). A group whose conversion fails is converted member by member, so that
    only a member whose value does not fit fails (its error goes into ``results``)."""
    groups: dict[tuple[ColumnSpec, ...], list[int]] = {}
    for i in indexes:
        m = members[i]
        try:
            fit_table(m.table, m.schema)
            if m.batch.kinds is None:
                m.batch.kinds = dict(Counter(m.batch.rows.kinds))
        except Exception as exc:  # this member only: the others go on
            results[i] = exc
            continue
        groups.setdefault(tuple(m.specs), []).append(i)
    converted: list[tuple[int, pa.Table]] = []
    for group in groups.values():
        first = members[group[0]]
        if len(group) > 1:
            rows = Rows()
            for i in group:
                rows.extend(members[i].batch.rows)
            try:
                arrow = build_table(first.schema, first.specs, rows)
            except Exception:  # found below, member by member
                pass
            else:
                offset = 0
                for i in group:
                    n = len(members[i].batch.rows)
                    converted.append((i, arrow.slice(offset, n)))
                    offset += n
                continue
        for i in group:
            m = members[i]
            try:
                converted.append((i, build_table(m.schema, m.specs, m.batch.rows, m.table.shape)))
            except Exception as exc:  # this member only: the others go on
                results[i] = exc
    return converted


def _write_partitioned(
    spark: Any,
    parts: list[pa.Table],
    schema: pa.Schema,
    staging: Path,
    column: str,
    remote: bool = False,
) -> Path:
    members = len(parts)
    combined = pa.concat_tables(parts)
    del parts[:]
    folder = staging / str(uuid.uuid4())
    target = spark_schema(combined.schema)
    # one task writes every member's file, one after the other; with hundreds of
    # members, several tasks (each member's rows in one of them: one file a member)
    # measured 4.5 s -> 3.3 s for 1000 members on 2 cores, and no gain for 100
    tasks = min(default_parallelism(spark), members // MEMBERS_PER_TASK)
    if remote:
        # on an object store a task's time is the requests of each file it writes (a
        # PUT, and the HEAD of Spark's size check), not the CPU: every slot writes
        tasks = min(default_parallelism(spark), members)
    # (the rows' bytes: the partition column repeats a folder path on every row)
    codec = round_codec(combined.nbytes - combined.column(column).nbytes, members)
    with arrow_frames(spark, combined, target, staging / f"{folder.name}.in") as frames:
        for _, frame in frames:
            frame = frame.repartition(tasks, column) if tasks > 1 else frame.coalesce(1)
            writer = frame.write.partitionBy(column).mode("append")
            if codec is not None:
                writer = writer.option("compression", codec)
            if remote:
                writer = writer.option("parquet.block.size", str(REMOTE_ROW_GROUP_BYTES))
                # the tasks report the files they write (taken by ``take_reported``)
                writer = writer.option(DIRECT_REPORT, "true")
            writer.parquet(str(folder))
    return folder


# The row groups of a round's files on an object store. Parquet's writers share one
# memory pool (95% of the heap) and each asks for a row group of ``parquet.block.size``
# (128 MB): the 32 writing tasks of a round outgrew it, and then every writer opened
# shrank all the others and logged a warning ("Scaling row group sizes"), a line a
# file. A round's files are a few rows each; a large one has 16 MB row groups.
REMOTE_ROW_GROUP_BYTES = 16 * 1024 * 1024


# A round whose members hold at most this many bytes of rows each, on average, writes
# its files uncompressed: for a file of a few rows, Snappy saves next to nothing (6
# rows: 2388 bytes plain, 2277 with Snappy; 100 rows: 6741 against 3608), and a
# round of 500 such files took about a third less of the JVM's CPU uncompressed
# (0.49-0.70 s against 0.72-0.86 s).
# Upkeep's compaction (``ChangelogTable.compact``) rewrites small files with ZSTD later.
PLAIN_MEMBER_BYTES = 2048


def round_codec(nbytes: int, members: int) -> str | None:
    """The Parquet codec of a round's files: ``none`` for rounds of tiny batches,
    otherwise None (the session's, Snappy)."""
    return "none" if members and nbytes <= PLAIN_MEMBER_BYTES * members else None


def _found_in_place(
    members: Sequence[tuple[ChangelogTable, str, tuple[int, str] | None, Reported | None]],
) -> list[list[DataFile]]:
    """The files a round's tasks wrote into each member's ``data/<uuid>`` folder. On an
    object store, as the tasks reported them (``take_reported``); a member they did not
    report is listed, a request each: those run at once (``LISTING_THREADS``). A
    member's rows went to one file (the round partitions by member), so its row count
    and stats are known (``arrow_stats``): no footer is read back."""

    def found(member: tuple[ChangelogTable, str, tuple[int, str] | None, Reported | None]) -> Any:
        table, rel, known, reported = member
        return table.files_in(rel, known, reported)

    listed = sum(1 for table, _, _, reported in members if table.remote and reported is None)
    if listed < 2:
        return [found(member) for member in members]
    with ThreadPoolExecutor(min(LISTING_THREADS, listed)) as pool:
        return list(pool.map(found, members))


LISTING_THREADS = 64


MEMBERS_PER_TASK = 250


def default_parallelism(spark: Any) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return 1


def _adopt(table: ChangelogTable, folder: Path) -> list[DataFile]:
    """Move the folder Spark wrote a member's files to into its table, as a fresh
    ``data/<uuid>/`` folder: one rename, not a folder made and a rename per file
    (directory changes cost 0.1-0.5 ms each on the disks measured)."""
    if not folder.is_dir():
        return []
    rel, target = table.new_batch_dir()
    if not isinstance(target, Path):
        raise SinkError(
            f"shape '{table.shape}': a sink root on an object store needs Spark to write "
            "in place (a classic session: not Spark Connect)"
        )
    try:
        os.rename(folder, target)
    except FileNotFoundError:  # the table has no data/ folder yet
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, target)
    return table.files_in(rel)


# What a fresh JVM's first rounds cost: Spark's code runs interpreted until the JVM has
# compiled it, so a service just (re)started (a crash, a deploy, a failover) meets its
# backlog slowly. ``warm_up`` runs a round's write path on made-up rows of common column
# types into a scratch folder outside the root while the service starts, then deletes
# it. Most of the first round's cost is paid once (the write path's code loaded and
# started), so one small round does most of the good: `python -m bench shapes` at 100
# shapes as a fresh JVM's first work, ack lag p99 3.2-4.0 s without, 2.1-2.4 s with it
# (more rounds, still running when the load began, did worse; docs/benchmarks/history).
WARM_COLUMNS: tuple[ColumnSpec, ...] = (
    ColumnSpec("id", 20),  # bigint
    ColumnSpec("n", 23),  # integer
    ColumnSpec("name", 25),  # text
    ColumnSpec("amount", 1700, (12 << 16 | 2) + 4),  # numeric(12,2)
    ColumnSpec("at", 1184),  # timestamptz
    ColumnSpec("flag", 16),  # boolean
)
WARM_ROUNDS, WARM_MEMBERS, WARM_ROWS = 1, 2, 10
# the Spark applications warmed in this process, and where: "disk", or "s3" (the write
# path through S3A, its client and its upload pool: a first round on S3 wrote 5.0 s
# against 3.1 s on disk in `python -m bench object-store`, its later rounds alike)
_WARMED: set[tuple[str, str]] = set()


def warm_rows(count: int, first_op: int = 0) -> Rows:
    """``count`` inserted rows of ``WARM_COLUMNS`` as the stream buffers them."""
    rows = Rows()
    for i in range(count):
        text = str(i).encode()
        values = (
            text,
            text,
            b"item-" + text,
            b"%d.%02d" % (i, i % 100),
            b"2026-11-27 05:00:00.123456+00",
            b"t" if i % 2 else b"f",
        )
        rows.add(first_op + 2 * i, "I", values, None, 64)
    rows.runs.append((first_op + 1, 1, 0, count))
    return rows


def needs_warm_up(spark: Any, remote: bool = False) -> bool:
    """A local-mode session whose JVM this process has not warmed yet for a root on
    disk, or on an object store (``remote``: through S3A, in place); a cluster's
    executors, or a Connect server, keep their own JVMs warm."""
    if is_connect(spark):
        return False
    if remote and not writes_in_place(spark):
        return False
    context = spark.sparkContext
    where = "s3" if remote else "disk"
    return str(context.master).startswith("local") and (context.applicationId, where) not in _WARMED


def warm_up(
    spark: Any,
    scratch: Path,
    stop: threading.Event,
    rounds: int = WARM_ROUNDS,
    members: int = WARM_MEMBERS,
    rows: int = WARM_ROWS,
    remote: str | None = None,
) -> int:
    """Write up to ``rounds`` rounds of ``members`` made-up batches of ``rows`` rows each
    under ``scratch`` (deleted after) as a flush round writes them; stops between rounds
    once ``stop`` is set. With ``remote`` (an ``s3://`` folder: a root's
    ``_tidemark/warm/<uuid>``), the files go there through S3A, in place, as a round on
    an object store writes them, and are deleted after. Returns the rounds written."""
    _WARMED.add((spark.sparkContext.applicationId, "s3" if remote else "disk"))
    schema = table_schema(WARM_COLUMNS)
    direct = writes_in_place(spark)
    column = DIRECT_COLUMN if direct else PART
    done = 0
    try:
        for r in range(rounds):
            if stop.is_set():
                break
            parts = []
            folders = []
            for m in range(members):
                arrow = build_table(schema, WARM_COLUMNS, warm_rows(rows, r * rows * 2))
                if remote is not None:
                    folders.append(objectstore.s3a(objectstore.join(remote, f"t{m}", f"r{r}")))
                    value = pa.scalar(folders[-1], pa.string())
                elif direct:
                    value = pa.scalar(str(scratch / f"t{m}" / f"r{r}"), pa.string())
                else:
                    value = pa.scalar(m, pa.int32())
                parts.append(arrow.append_column(column, pa.repeat(value, arrow.num_rows)))
            try:
                _write_partitioned(
                    spark, parts, schema, scratch / "staging", column, remote is not None
                )
            finally:
                if folders:
                    take_reported(spark, folders)
            done += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if remote is not None:
            _delete_below(remote)
    return done


# Warm-up folders on a store older than this are a killed service's: the next
# warm-up under the same root deletes them (a younger one may be another instance's,
# still writing: a standby warms while the leader runs)
WARM_LEFTOVER_S = 3600


def _delete_below(folder: str, older_than_s: float = 0.0) -> None:
    """Delete the objects below ``folder`` on the store (last modified more than
    ``older_than_s`` ago)."""
    cutoff = (time.time() - older_than_s) * 1000
    objectstore.delete(
        objectstore.join(folder, f.name)
        for f in objectstore.listing(folder)
        if not older_than_s or f.modified_ms < cutoff
    )


def forget_warm_leftovers(warm: str) -> None:
    """Delete what killed services' warm-ups left below ``warm`` (a root's
    ``_tidemark/warm``): the objects older than ``WARM_LEFTOVER_S``."""
    _delete_below(warm, WARM_LEFTOVER_S)
