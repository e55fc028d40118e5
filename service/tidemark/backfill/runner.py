"""One backfill: a consistent snapshot of a shape's rows, merged with the stream.

1. The shape's writer is made quiet: if the shape was following the stream (a
   resync), it stops being routed and what it buffered is dropped (the snapshot
   will hold those transactions); a running flush job is awaited.
2. With the consumer paused between batches, the snapshot is taken, the files the
   table has now are noted, and the shape is routed again from the next change
   with the snapshot's fence: transactions the snapshot holds are skipped, later
   ones applied. Nothing is processed while paused, so no transaction falls
   between the snapshot and the stream.
3. The snapshot is read in ctid chunks, two at a time, over connections that import
   it; Spark writes each chunk as staged Parquet (``_kind = snapshot``), with lower
   priority than stream flushes, so acknowledgements are not delayed.
4. One Delta commit adds the snapshot files and removes the files noted in step 2
   (older data the snapshot supersedes); stream files committed meanwhile stay.
   Then the fence is recorded (``BackfillState``) and the shape is ready.

A crash at any point leaves either the old table state (nothing committed) or the
new one; the next start finds no record and backfills again, replacing the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from tidemark.backfill import reader
from tidemark.backfill.fence import SnapshotFence
from tidemark.backfill.reader import Chunk, open_snapshot, plan_chunks, read_chunk
from tidemark.replication.client import session_options
from tidemark.shapes.model import BoundShape
from tidemark.sink.table import DataFile
from tidemark.writers.arrow_batch import snapshot_table
from tidemark.writers.job import write_arrow
from tidemark.writers.scheduler import FlushScheduler
from tidemark.writers.writer import ShapeWriter

log = structlog.get_logger("tidemark.backfill")

PARALLEL_READERS = 2


@dataclass
class BackfillProgress:
    started_at: float
    rows_done: int = 0
    rows_estimated: int = 0
    chunks_done: int = 0
    chunks: int = 0
    snapshot_lsn: int | None = None
    finished_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "rows_done": self.rows_done,
            "rows_estimated": max(self.rows_estimated, self.rows_done),
            "chunks_done": self.chunks_done,
            "chunks": self.chunks,
            "elapsed_s": round((self.finished_at or time.time()) - self.started_at, 1),
        }


Register = Callable[[SnapshotFence], None]


async def run_backfill(
    *,
    dsn: str,
    shape: BoundShape,
    writer: ShapeWriter,
    spark: Any,
    scheduler: FlushScheduler,
    paused: Callable[[], AbstractAsyncContextManager[None]],
    unregister: Callable[[], None],
    register: Register,
    progress: BackfillProgress,
) -> tuple[SnapshotFence, int]:
    """Run the backfill; returns the fence and the number of snapshot rows."""
    name = shape.name
    unregister()  # a resync: stop routing; the snapshot will hold what it had
    async with scheduler.exclusive(writer):
        writer.discard_buffered()
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=session_options(dsn))
    try:
        async with paused():
            snapshot = await open_snapshot(conn, shape)
            superseded = await asyncio.to_thread(writer.table.active_files_with_sizes)
            register(snapshot.fence)
        progress.snapshot_lsn = snapshot.fence.lsn
        progress.rows_estimated = snapshot.estimated_rows
        chunks = plan_chunks(snapshot.relpages, reader.PAGES_PER_CHUNK)
        progress.chunks = len(chunks)
        log.info(
            "backfill.started",
            shape=name,
            snapshot_lsn=snapshot.fence.lsn,
            estimated_rows=snapshot.estimated_rows,
            chunks=len(chunks),
            superseded_files=len(superseded),
        )
        files: list[DataFile] = []
        next_op = 0
        lock = asyncio.Lock()

        async def one(chunk: Chunk) -> None:
            nonlocal next_op
            text = await read_chunk(dsn, snapshot.snapshot_id, shape, chunk)
            async with lock:  # op ranges are handed out as chunks finish
                first_op, next_op = next_op, next_op + text.num_rows
            if text.num_rows:
                arrow = await asyncio.to_thread(
                    snapshot_table,
                    writer.schema,
                    writer.columns,
                    text,
                    snapshot.fence.lsn - 1,
                    first_op,
                )
                async with scheduler.backfill_slot():
                    files.extend(
                        await asyncio.to_thread(
                            write_arrow, spark, writer.table, writer.schema, arrow
                        )
                    )
            progress.rows_done += text.num_rows
            progress.chunks_done += 1

        for start in range(0, len(chunks), PARALLEL_READERS):
            async with asyncio.TaskGroup() as group:
                for chunk in chunks[start : start + PARALLEL_READERS]:
                    group.create_task(one(chunk))
        await conn.execute("commit")
        async with scheduler.exclusive(writer):
            await asyncio.to_thread(writer.table.ensure_columns, writer.schema)
            version = await asyncio.to_thread(
                writer.table.backfill_commit,
                superseded,
                files,
                {"tidemark.snapshotLsn": snapshot.fence.lsn},
            )
        progress.finished_at = time.time()
        log.info(
            "backfill.committed",
            shape=name,
            rows=progress.rows_done,
            files=len(files),
            version=version,
            seconds=round(progress.finished_at - progress.started_at, 2),
        )
        return snapshot.fence, progress.rows_done
    finally:
        await conn.close()
