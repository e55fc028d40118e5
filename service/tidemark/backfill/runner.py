"""One backfill: a consistent snapshot of a shape's rows, merged with the stream.

The caller has stopped routing the shape (a resync) or never started (a new shape)
and invalidated its claim. Then:

1. The shape's writer is made quiet: what it buffered is dropped (the snapshot
   will hold those transactions); a running flush job is awaited.
2. The snapshot transaction and the readers' transactions begin and each locks the
   table in ``ACCESS SHARE`` mode (a rewrite would move rows between the ctid
   chunks read below; see ``reader`` for why every connection locks first, and
   why a lock not granted in time starts this step again). With the consumer
   paused between batches, the snapshot is taken and the readers import it, the
   files the table has now are noted, and the shape is routed again from the next
   change with the snapshot's fence: transactions the snapshot holds are skipped,
   later ones applied. Nothing is processed while paused, so no transaction falls
   between the snapshot and the stream.
   The table's columns are read again inside the snapshot: a column added or
   dropped between binding the shape and taking the lock would be missing from
   (or wrongly in) the snapshot's rows while the stream skips the transactions
   that filled it, so the caller binds the shape again and starts over
   (``CatalogMoved``). A type change needs no check here: the stream's Relation
   message for it asks for a resync anyway.
   One more exception is checked: a commit the stream already passed that the
   snapshot does not see (its commit record is in WAL, but it is not visible yet,
   e.g. waiting for a synchronous standby). Neither side would have it, so the
   snapshot is dropped and taken again, until no such commit exists.
3. The snapshot is read in ctid chunks by the readers (two connections; a table of
   at most one chunk, 16 MiB, is read on the snapshot's own connection); each chunk
   is converted (``_kind = snapshot``) and written by pyarrow as a spool file of the
   table while its connection reads the next chunk, and Spark rewrites the spool
   files as the table's Parquet files in rounds of up to ``ROUND_ROWS`` rows while the
   reading goes on (a round starts early, at ``MIN_ROUND_ROWS``, when none runs), with
   lower priority than stream flushes (a round starts only while no flush waits, and
   its tasks run in Spark's background pool: ``tidemark.spark.in_background``).
4. The snapshot transaction ends (the lock is released), and one Delta commit adds
   the snapshot files and removes the files noted in step 2 (older data the
   snapshot supersedes); stream files committed meanwhile stay. When the shape's
   column types or key changed, the commit replaces the table's schema and key as
   well; then the shape's stream commits wait from the snapshot until that commit
   (so every active file is older than the snapshot and is replaced).

A crash at any point leaves either the old table state (nothing committed) or the
new one; the caller records the claim only after the commit, so the next start
finds no claim and backfills again, replacing the same. A backfill whose request
was superseded (another resync, a removal) is cancelled or stops at ``register``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import structlog

from tidemark.backfill import reader
from tidemark.backfill.reader import (
    Chunk,
    CopyReader,
    Reader,
    Snapshot,
    SnapshotConnections,
    ThreadedReader,
    begin_snapshot,
    connect_parallel_reader,
    connect_reader,
    import_snapshot,
    plan_snapshot_chunks,
    take_snapshot,
)
from tidemark.continuity.fence import SnapshotFence
from tidemark.shapes.model import BoundShape
from tidemark.shapes.partitions import fingerprint
from tidemark.sink.files import DataFile
from tidemark.spark import in_background
from tidemark.state import fencing
from tidemark.writers.arrow_batch import snapshot_table
from tidemark.writers.buffer import SpooledTxn
from tidemark.writers.job import rewrite_spooled, spool_arrow
from tidemark.writers.scheduler import FlushScheduler
from tidemark.writers.writer import ShapeWriter

log = structlog.get_logger("tidemark.backfill")

PARALLEL_READERS = 2
SMALL_TABLE_BYTES = reader.PAGES_PER_CHUNK * 8192
ROUND_ROWS = 2_000_000  # snapshot rows Spark rewrites from spool files in one job, at most
# a round starts before ROUND_ROWS when no round is running and this many rows wait:
# Spark rewrites while the readers go on, instead of idling until the last chunk
MIN_ROUND_ROWS = 400_000
RETAKE_FIRST_S = 0.1
RETAKE_MAX_S = 2.0


class BackfillSuperseded(Exception):
    """A newer request for the shape (or its removal) replaced this backfill."""


class CatalogMoved(Exception):
    """The table's columns changed after the shape was bound: bind it again."""


@dataclass
class BackfillProgress:
    started_at: float
    rows_done: int = 0
    rows_estimated: int = 0
    chunks_done: int = 0
    chunks: int = 0
    snapshot_lsn: int | None = None
    finished_at: float | None = None
    phase: str = "queued"  # queued | snapshot | reading | committing | catching_up
    reason: str = ""  # why the shape is being backfilled
    retakes: int = 0  # snapshots dropped because the stream had passed a commit they miss

    def as_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "reason": self.reason,
            "rows_done": self.rows_done,
            "rows_estimated": max(self.rows_estimated, self.rows_done),
            "chunks_done": self.chunks_done,
            "chunks": self.chunks,
            "snapshot_retakes": self.retakes,
            "elapsed_s": round((self.finished_at or time.time()) - self.started_at, 1),
        }


Register = Callable[[SnapshotFence], bool]
PassedInvisible = Callable[[Callable[[int], bool], int], list[int]]


async def run_backfill(
    *,
    dsn: str,
    shape: BoundShape,
    writer: ShapeWriter,
    spark: Any,
    scheduler: FlushScheduler,
    paused: Callable[[], AbstractAsyncContextManager[None]],
    passed_invisible: PassedInvisible,
    register: Register,
    progress: BackfillProgress,
    replace_schema: bool = False,
    connections: SnapshotConnections | None = None,
) -> tuple[SnapshotFence, int, dict[str, list[Any]] | None]:
    """Run the backfill; returns the fence, the number of snapshot rows and, for a
    partitioned table, the fingerprint of the partition tree the snapshot read.

    ``register(fence)`` routes the shape behind the fence, or returns False when the
    request was superseded meanwhile (then ``BackfillSuperseded`` is raised).
    ``connections``: where the snapshot connection comes from and goes back to after a
    backfill that committed (default: a connection of its own, closed at the end).
    """
    name = shape.name
    async with scheduler.exclusive(writer):
        writer.discard_buffered()
    conn = await connections.take() if connections is not None else await connect_reader(dsn)
    readers: list[CopyReader | ThreadedReader] = []
    back_to: SnapshotConnections | None = None  # set once the backfill has committed
    try:
        # a table of one chunk or less is read on the snapshot's own connection: two
        # reader connections fewer (most of an empty shape's start-up); one that grew
        # meanwhile is still read whole, only not in parallel
        if await reader.heap_bytes(conn, shape.relation.oid) > SMALL_TABLE_BYTES:
            readers = [await connect_parallel_reader(dsn) for _ in range(PARALLEL_READERS)]
        progress.phase = "snapshot"
        snapshot, superseded = await _snapshot(
            conn,
            readers,
            shape,
            writer,
            paused,
            passed_invisible,
            register,
            progress,
            replace_schema,
        )
        progress.snapshot_lsn = snapshot.fence.lsn
        progress.rows_estimated = snapshot.estimated_rows
        chunks = plan_snapshot_chunks(snapshot, reader.PAGES_PER_CHUNK)
        progress.chunks = len(chunks)
        progress.phase = "reading"
        log.info(
            "backfill.started",
            shape=name,
            snapshot_lsn=snapshot.fence.lsn,
            estimated_rows=snapshot.estimated_rows,
            chunks=len(chunks),
            superseded_files=len(superseded),
            replace_schema=replace_schema,
        )
        files = await _read_chunks(
            readers or [conn],
            shape,
            writer,
            spark,
            scheduler,
            snapshot,
            chunks,
            progress,
            replace_schema,
        )
        for c in _every(conn, readers):  # releases the locks: the table may be rewritten now
            await c.execute("commit")
        progress.phase = "committing"
        async with scheduler.exclusive(writer):
            if not replace_schema:
                await asyncio.to_thread(writer.table.ensure_columns, writer.schema)
            commit = asyncio.ensure_future(
                asyncio.to_thread(
                    writer.table.backfill_commit,
                    superseded,
                    files,
                    {"tidemark.snapshotLsn": snapshot.fence.lsn},
                    replace=(writer.schema, list(shape.primary_key)) if replace_schema else None,
                )
            )
            try:
                version = await asyncio.shield(commit)
            except asyncio.CancelledError:
                # superseded while committing: the thread cannot be stopped, so let the
                # commit land before the writer is released (a newer backfill then sees
                # it among the files it replaces), and only then give up
                await asyncio.wait({commit})
                raise
        writer.hold_commits = False  # the stream's rows may join the new schema now
        progress.finished_at = time.time()
        log.info(
            "backfill.committed",
            shape=name,
            rows=progress.rows_done,
            files=len(files),
            version=version,
            seconds=round(progress.finished_at - progress.started_at, 2),
        )
        partitions = fingerprint(snapshot.partitions) if snapshot.partitioned else None
        back_to = connections
        return snapshot.fence, progress.rows_done, partitions
    finally:
        # (a backfill that did not commit leaves hold_commits set: its shape is no longer
        # routed, and the next backfill discards what it buffered)
        for reader_conn in readers:
            await reader_conn.close()
        if back_to is not None:
            await back_to.give_back(conn)
        else:
            await conn.close()


def _every(conn: Reader, readers: Sequence[Reader]) -> list[Reader]:
    return [conn, *readers]


async def _snapshot(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    readers: list[CopyReader | ThreadedReader],
    shape: BoundShape,
    writer: ShapeWriter,
    paused: Callable[[], AbstractAsyncContextManager[None]],
    passed_invisible: PassedInvisible,
    register: Register,
    progress: BackfillProgress,
    replace_schema: bool,
) -> tuple[Snapshot, list[tuple[str, int]]]:
    """Take a snapshot the stream has not overtaken, with every connection holding its
    lock, and route the shape behind it."""
    delay = RETAKE_FIRST_S
    while True:
        begun: list[Reader] = []
        try:
            for c in _every(conn, readers):  # not paused: a lock may wait for a rewrite
                await begin_snapshot(c, shape)
                begun.append(c)
        except psycopg.errors.LockNotAvailable:
            for c in begun:
                await c.execute("rollback")
            log.info("backfill.lock_waiting", shape=shape.name, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(RETAKE_MAX_S, delay * 2)
            continue
        async with paused():
            snapshot = await take_snapshot(conn, shape)
            if list(snapshot.columns) != [c.name for c in shape.relation.columns]:
                for c in _every(conn, readers):
                    await c.execute("rollback")
                raise CatalogMoved(shape.name)
            missed = passed_invisible(snapshot.fence.visible, shape.relation.oid)
            if not missed:
                for reader_conn in readers:
                    await import_snapshot(reader_conn, snapshot.snapshot_id)
                superseded = await asyncio.to_thread(writer.table.active_files_with_sizes)
                writer.hold_commits = replace_schema
                if not register(snapshot.fence):
                    raise BackfillSuperseded(shape.name)
                return snapshot, superseded
        for c in _every(conn, readers):
            await c.execute("rollback")
        progress.retakes += 1
        log.warning(
            "backfill.snapshot_retaken",
            shape=shape.name,
            reason="the stream passed commits the snapshot does not see yet",
            xids=missed[:10],
            retry_in_s=delay,
        )
        await asyncio.sleep(delay)
        delay = min(RETAKE_MAX_S, delay * 2)


async def _read_chunks(
    readers: Sequence[Reader],
    shape: BoundShape,
    writer: ShapeWriter,
    spark: Any,
    scheduler: FlushScheduler,
    snapshot: Snapshot,
    chunks: list[Chunk],
    progress: BackfillProgress,
    replace_schema: bool,
) -> list[DataFile]:
    """Read the chunks (one reader connection each at a time), convert each and write
    it with pyarrow as a spool file of the table; Spark rewrites the spool files
    into table files in rounds of ``ROUND_ROWS`` while reading goes on (one job
    per round, not per chunk: a Spark job's fixed cost and the local relation of
    ``createDataFrame`` were most of a backfill's time). Returns the table files,
    not committed; the spool folder is removed whatever happens."""
    table = writer.table
    schema, columns = writer.schema, list(writer.columns)
    spool, _ = table.new_spool_dir()
    files: list[DataFile] = []
    pending: list[DataFile] = []  # spool files no round has taken yet
    pending_rows = 0
    rounds: list[asyncio.Future[None]] = []
    running = 0  # rounds not finished
    next_op = 0
    todo = list(reversed(chunks))

    async def rewrite(spooled: list[DataFile], rows: int) -> None:
        nonlocal running
        txn = SpooledTxn(spooled, [], None, 0, 0, rows)
        try:
            async with scheduler.backfill_slot():
                written = await asyncio.to_thread(
                    in_background,
                    spark,
                    rewrite_spooled,
                    spark,
                    table,
                    schema,
                    txn,
                    replacing=replace_schema,
                    spread=True,
                )
        finally:
            running -= 1
        files.extend(written)
        await asyncio.to_thread(table.delete_files, spooled)

    def start_round() -> None:
        nonlocal pending, pending_rows, running
        if pending:
            running += 1
            rounds.append(asyncio.ensure_future(rewrite(pending, pending_rows)))
        pending, pending_rows = [], 0

    def convert_and_spool(text: pa.Table, first_op: int) -> DataFile:
        arrow = snapshot_table(schema, columns, text, snapshot.fence.lsn - 1, first_op, shape.name)
        return spool_arrow(table, spool, f"chunk-{first_op:012d}.parquet", arrow)

    async def spool_chunk(text: pa.Table, first_op: int) -> None:
        nonlocal pending_rows
        pending.append(await asyncio.to_thread(convert_and_spool, text, first_op))
        pending_rows += text.num_rows
        if pending_rows >= ROUND_ROWS or (not running and pending_rows >= MIN_ROUND_ROWS):
            start_round()
        progress.rows_done += text.num_rows
        progress.chunks_done += 1

    async def read_with(conn: Reader, group: asyncio.TaskGroup) -> None:
        nonlocal next_op
        # a chunk is converted and spooled while the connection reads the next one
        # (one chunk each way: at most two of this reader's chunks in memory)
        spooling: asyncio.Task[None] | None = None
        while todo:
            chunk = todo.pop()
            text = await reader.read_chunk(conn, shape, chunk)
            # op ranges are handed out as chunks finish (no await in between)
            first_op, next_op = next_op, next_op + text.num_rows
            if not text.num_rows:
                progress.chunks_done += 1
                continue
            if spooling is not None:
                await spooling
            spooling = group.create_task(spool_chunk(text, first_op))
        if spooling is not None:
            await spooling

    try:
        async with asyncio.TaskGroup() as group:
            for conn in readers:
                group.create_task(read_with(conn, group))
        start_round()
        await asyncio.gather(*rounds)
        return files
    finally:
        for job in rounds:
            job.cancel()
        await asyncio.gather(*rounds, return_exceptions=True)
        if (table.spool_path / spool).exists():  # (made by the first chunk that had rows)
            await asyncio.to_thread(fencing.clear, table.spool_path / spool)
