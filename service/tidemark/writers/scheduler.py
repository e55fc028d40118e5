"""When shapes flush, how many Spark jobs run at once, and backpressure.

A shape is *due* when its ready rows reach ``max_rows``, its ready bytes reach
``max_bytes``, or its oldest ready row is ``max_age_s`` old. When one shape is
due, every other shape with ready rows older than ``coalesce_age_s`` joins the
round, so the global boundary moves in steps rather than one shape at a time; a
round's members are written by one Spark job and committed together
(``tidemark.writers.group_commit``).
Jobs run in worker threads (``asyncio.to_thread``) with at most ``concurrency``
at once and at most one per shape (a shape's commits stay in order); stream
flushes go before backfill work.

Memory: buffered bytes across all writers are bounded by ``memory_budget``. Above
it, ``wait_for_room`` blocks the consumer (so the replication reader stops
reading the socket), the biggest writers flush first, and open transactions are
staged to Parquet (written, not committed) by ``tidemark.writers.memory``'s rule:
a part over ``stage_bytes`` always, and the biggest parts of all writers while the
total is over the budget, so a wait always has a job that frees memory.
``waiting_since`` tells readiness how long the stream has waited.

A commit refused by the sink's fence (``WriterFenced``: another process committed
into the batch) is not retried: ``run`` raises it and the service stops, to be
restarted with the table's offsets read again. Any other job that fails (Spark,
the Delta commit, a value that cannot be converted) is retried in process, the
same batch again, with capped exponential backoff (but a value its lake column
cannot hold, ``UnfitValue``: the same batch would be refused again, so it waits for a
resync or a changed definition, which drop it); the shape reports the failure
(``ShapeWriter.failure``: readiness, metrics, API) and takes no new batch
meanwhile. Nothing of the batch is acknowledged until a retry
commits it, so a failure that always repeats holds the acknowledgement (and the
slot's WAL) with a clear cause instead of crash-looping the process. A retried
commit that had in fact landed is recognised by the table's transaction version
and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from tidemark.aio import wait_event
from tidemark.errors import UnfitValue, WriterFenced, failure_text
from tidemark.sink.files import DataFile
from tidemark.state import fencing, objectstore
from tidemark.state.durable import full_disk
from tidemark.writers.buffer import Batch, Delivery, Rows, Spooled, StreamPart
from tidemark.writers.cadence import Cadence, round_share
from tidemark.writers.group_commit import group_commit
from tidemark.writers.job import (
    ROUND_BYTES,
    CommitResult,
    RoundMember,
    commit_batch,
    joins_round,
    write_parquet,
    write_round,
    write_spool,
)
from tidemark.writers.memory import Charge, OpenPart, parts_to_stage
from tidemark.writers.writer import JobFailure, ShapeWriter

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 60.0
# the least time between two of the loop's passes, for each shape: a pass looks at every
# shape (0.4-1 ms at 1000), and pokes come by the hundred a second at many shapes (each
# received batch, each job's end, each backfill's turn; ~210 passes a second while 1000
# new shapes start, 11% of the Python of their start). 1000 shapes: 20 ms between passes
# at most, against flush ages of 0.25 s and more; 10 shapes: 0.2 ms
TICK_PER_SHAPE_S = 20e-6

Job = Callable[[], Coroutine[Any, Any, None]]

log = structlog.get_logger("tidemark.writers")


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    max_rows: int = 200_000
    max_bytes: int = 128 * 1024 * 1024
    max_age_s: float = 1.0
    # the flush age adapts between these to how long recent flush jobs took (cadence);
    # None: fixed at max_age_s
    min_age_s: float | None = None
    coalesce_age_s: float = 0.25
    concurrency: int = 4
    commit_concurrency: int = 8  # Delta commits of one round at once
    memory_budget: int = 1024 * 1024 * 1024
    stage_bytes: int = 256 * 1024 * 1024


@dataclass(slots=True)
class SchedulerStats:
    commits: int = 0
    rows_committed: int = 0
    rounds: int = 0  # Spark jobs that wrote the batches of several shapes at once
    round_shapes: int = 0  # batches those jobs wrote
    stage_jobs: int = 0
    spooled_bytes: int = 0  # Parquet bytes written for transactions still streamed
    job_failures: int = 0
    replays_skipped: int = 0
    backpressure_waits: int = 0
    blocked_seconds: float = 0.0  # time the stream spent waiting for memory
    last_results: list[CommitResult] = field(default_factory=list)


class FlushScheduler:
    def __init__(
        self,
        spark: Any,
        policy: FlushPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_commit: Callable[[CommitResult], None] | None = None,
        staging: Path | None = None,
    ) -> None:
        self.spark = spark
        self.policy = policy or FlushPolicy()
        # where round jobs write before their files move into the tables (on the same
        # filesystem as the tables); default: ``<root>/_rounds/<uuid>`` of the first table
        self.staging = staging
        self._commits = ThreadPoolExecutor(
            max_workers=self.policy.commit_concurrency, thread_name_prefix="delta-commit"
        )
        self.writers: dict[str, ShapeWriter] = {}
        # removed writers whose last job still runs, by shape: a shape declared again
        # under that name waits for them before its snapshot (``settled``)
        self._retired: dict[str, list[ShapeWriter]] = {}
        # buffered bytes at the last exact sum, and what writers appended since
        self._summed = 0
        self._charge = Charge()
        self.cadence = Cadence()
        # rounds launched whose Spark job has not ended (waiting for a slot or running):
        # meanwhile shapes due by age wait and go together into the next round
        self._rounds_writing: set[asyncio.Task[Any]] = set()
        self.stats = SchedulerStats()
        self._clock = clock
        self._on_commit = on_commit
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._slots = asyncio.Semaphore(self.policy.concurrency)
        self._jobs: set[asyncio.Task[Any]] = set()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._flush_all_requested = False
        self.waiting_since: float | None = None  # the stream waits for memory since
        self.fenced: WriterFenced | None = None

    # -- writers ------------------------------------------------------------------

    def add(self, writer: ShapeWriter) -> None:
        self.writers[writer.shape] = writer
        if writer.charge is not self._charge:
            self._charge.added += writer.charge.added  # (what it buffered before)
            writer.charge = self._charge

    def remove(self, shape: str) -> ShapeWriter | None:
        """Stop scheduling the shape's writer; a job of it that runs goes on to its end
        (its commit, or its failure: a removed writer is never retried)."""
        writer = self.writers.pop(shape, None)
        if writer is not None and writer.in_flight:
            self._retired.setdefault(shape, []).append(writer)
        return writer

    async def settled(self, shape: str) -> None:
        """Until no job of a removed writer of ``shape`` runs. A shape removed and
        declared again (API or reload) lists its new snapshot only after this: an old
        round committing after that listing would put rows of the old definition (or
        older versions of rows) after the snapshot's, and the fold would take them."""
        for writer in self._retired.pop(shape, []):
            while writer.in_flight:
                await asyncio.sleep(0.02)

    # -- signals from the stream ----------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        # rows handed to a job stay in memory until it finishes: they count too
        total = sum(w.buffer.nbytes + w.in_flight_bytes for w in self.writers.values())
        self._summed, self._charge.added = total, 0
        return total

    def _reaches(self, limit: int) -> bool:
        """Whether buffered bytes reach ``limit``; summed over the writers only when
        the bound (last sum + bytes appended since, ``Charge``) says they may."""
        if self._summed + self._charge.added < limit:
            return False
        return self.buffered_bytes >= limit

    def memory_report(self, top: int = 3) -> str:
        """Where the buffered bytes are: the total against the budget, and the biggest
        writers' open, ready and in-job bytes."""
        mib = 1024 * 1024
        biggest = sorted(
            self.writers.values(),
            key=lambda w: -(w.buffer.nbytes + w.in_flight_bytes),
        )[:top]
        parts = [
            f"{w.shape} (open {w.buffer.open_bytes / mib:.1f} MiB, ready "
            f"{w.buffer.ready_bytes / mib:.1f} MiB, in a job {w.in_flight_bytes / mib:.1f} MiB"
            f"{', failing: ' + w.failure.error if w.failure else ''})"
            for w in biggest
        ]
        return (
            f"buffered {self.buffered_bytes / mib:.1f} MiB of a "
            f"{self.policy.memory_budget / mib:.1f} MiB budget; biggest: {', '.join(parts)}"
        )

    def poke(self) -> None:
        """Something was appended or committed: re-evaluate soon."""
        self._wake.set()

    async def wait_for_room(self) -> None:
        """Return when buffered bytes are under the memory budget (backpressure)."""
        if not self._reaches(self.policy.memory_budget):
            return
        self.stats.backpressure_waits += 1
        started = self.waiting_since = self._clock()
        try:
            self._room.clear()
            self._wake.set()
            while self._reaches(self.policy.memory_budget):
                self._room.clear()
                await self._room.wait()
        finally:
            self.stats.blocked_seconds += self._clock() - started
            self.waiting_since = None

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Start due jobs (and retries of failed ones) until cancelled; raises
        ``WriterFenced`` when another writer committed into a batch of ours."""
        loop = asyncio.get_running_loop()
        while True:
            if self.fenced is not None:
                raise self.fenced
            passed = loop.time()
            self._start_due_jobs()
            self._wake.clear()
            await wait_event(self._wake, self._next_deadline())
            rest = passed + TICK_PER_SHAPE_S * len(self.writers) - loop.time()
            if rest > 0:  # (what pokes meanwhile is seen by the next pass)
                await asyncio.sleep(rest)

    @property
    def flush_age_s(self) -> float:
        """How old a shape's oldest ready row gets before the shape is due (``cadence``)."""
        return self.cadence.age_s(self.policy.min_age_s, self.policy.max_age_s)

    def _next_deadline(self) -> float:
        now = self._clock()
        soonest = 1.0
        # (while a round writes, the end of its Spark job wakes the loop)
        by_age = self._by_age()
        age = self.flush_age_s
        for writer in self.writers.values():
            since = writer.buffer.ready_since
            if by_age and since is not None and not writer.in_flight:
                soonest = min(soonest, max(0.0, since + age - now))
            if writer.failure is not None and not writer.in_flight:
                soonest = min(soonest, max(0.0, writer.failure.retry_at - now))
        return max(soonest, 0.005)

    def _due(self, writer: ShapeWriter, now: float, pressure: bool, age: float) -> bool:
        """Whether the writer's ready rows should be flushed now, ``age`` being how old
        its oldest ready row may get (the flush age, or inf: not due by age)."""
        buf = writer.buffer
        since = buf.ready_since
        if since is None or writer.hold_commits or writer.retry is not None or writer.awaited:
            return False
        p = self.policy
        return (
            self._flush_all_requested
            or pressure
            or buf.ready_rows >= p.max_rows
            or buf.ready_bytes >= p.max_bytes
            or now - since >= age
        )

    def _by_age(self) -> bool:
        """Whether shapes may be due by age now. Not while a round's Spark job waits or
        runs: the shapes that come due meanwhile wait for it and go into the next
        round together, so rounds grow when Spark is busy instead of splitting the
        shapes into several smaller jobs that share the cores and each pay a job's
        fixed cost (1000 shapes: 310 shapes per job without this). The next round's
        job then runs while the previous one commits."""
        return not self._rounds_writing

    def _start_due_jobs(self) -> None:
        now = self._clock()
        for writer in self.writers.values():  # failed jobs whose backoff is over
            retry, failure = writer.retry, writer.failure
            if (
                retry is not None
                and failure is not None
                and not writer.in_flight
                and now >= failure.retry_at
            ):
                self._launch(writer, retry, writer.in_flight_bytes, writer.in_flight_lsn)
        pressure = self._reaches(self.policy.memory_budget)
        by_age = self._by_age()
        age = self.flush_age_s if by_age else float("inf")
        due = [
            w for w in self.writers.values() if not w.in_flight and self._due(w, now, pressure, age)
        ]
        if due and by_age:
            chosen = set(map(id, due))
            joiners = [
                w
                for w in self.writers.values()
                if not w.in_flight
                and id(w) not in chosen
                and w.retry is None
                and not w.hold_commits
                and not w.awaited
                and w.buffer.ready_since is not None
                and now - w.buffer.ready_since >= min(self.policy.coalesce_age_s, age)
            ]
            due += joiners
            if not pressure and not self._flush_all_requested:
                committing = sum(1 for w in self.writers.values() if w.in_flight)
                share = round_share(len(due), committing)
                if share < len(due):  # the oldest rows go first; the rest next round
                    due.sort(key=lambda w: w.buffer.ready_since or 0.0)
                    del due[share:]
        # stream work first, then backfill; biggest buffers first under pressure
        due.sort(key=lambda w: (w.backfill, -w.buffer.nbytes))
        rounds: list[list[tuple[ShapeWriter, Batch]]] = [[]]
        size = 0
        for writer in due:
            batch = writer.take_batch()
            if batch is None:
                continue
            if not joins_round(batch):
                self._launch(
                    writer, self._flush_job(writer, batch), batch.rows.nbytes, batch.first_lsn
                )
                continue
            if rounds[-1] and size + batch.rows.nbytes > ROUND_BYTES:
                rounds.append([])
                size = 0
            rounds[-1].append((writer, batch))
            size += batch.rows.nbytes
        for members in rounds:
            if len(members) == 1:
                writer, batch = members[0]
                self._launch(
                    writer, self._flush_job(writer, batch), batch.rows.nbytes, batch.first_lsn
                )
            elif members:
                self._launch_round(members)
        # a part is staged when it alone reaches stage_bytes or the total the budget:
        # neither can happen below both
        limit = min(self.policy.memory_budget, self.policy.stage_bytes)
        staging = []
        if self._reaches(limit):
            parts = [
                OpenPart(
                    w.shape,
                    w.buffer.open_bytes + w.buffer.stream_bytes,
                    w.in_flight or w.retry is not None,
                )
                for w in self.writers.values()
            ]
            # (_reaches returned True after summing: _summed is exact)
            staging = parts_to_stage(
                parts, self._summed, self.policy.memory_budget, self.policy.stage_bytes
            )
        for name in staging:
            writer = self.writers[name]
            if not writer.in_flight and writer.retry is None:
                taken = writer.buffer.take_open_rows()
                streamed = writer.buffer.take_stream_rows()
                if taken is not None or streamed:
                    nbytes = sum(rows.nbytes for _, rows in streamed)
                    if taken is not None:
                        nbytes += taken[1].nbytes
                    self._launch(
                        writer,
                        self._stage_job(writer, taken, streamed),
                        nbytes,
                        None if taken is None else taken[0].lsn,
                    )
        self._delete_orphans()

    def _delete_orphans(self) -> None:
        """Spool files no transaction will commit (aborted, dropped, declined)."""
        for writer in self.writers.values():
            if writer.orphans:
                files, writer.orphans = writer.orphans, []
                task = asyncio.create_task(asyncio.to_thread(writer.table.delete_spool, files))
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

    def _launch(self, writer: ShapeWriter, job: Job, nbytes: int, first_lsn: int | None) -> None:
        writer.in_flight = True
        writer.in_flight_bytes = nbytes
        writer.in_flight_lsn = first_lsn
        task = asyncio.create_task(job(), name=f"flush-{writer.shape}")
        self._jobs.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._jobs.discard(t)
            self._finished(writer, job, None if t.cancelled() else t.exception())
            self._job_ended()

        task.add_done_callback(done)

    def _launch_round(self, members: list[tuple[ShapeWriter, Batch]]) -> None:
        """One task for the batches of several shapes: one Spark job per column layout,
        then each shape's own Delta commit. Each shape succeeds or fails on its own; a
        failed one is retried as its own flush (``_flush_job``), the same batch."""
        for writer, batch in members:
            writer.in_flight = True
            writer.in_flight_bytes = batch.rows.nbytes
            writer.in_flight_lsn = batch.first_lsn
        task = asyncio.create_task(self._round(members), name=f"round-{len(members)}")
        self._jobs.add(task)
        self._rounds_writing.add(task)

        def done(t: asyncio.Task[dict[str, BaseException]]) -> None:
            self._jobs.discard(t)
            self._rounds_writing.discard(t)  # (a round cancelled before its job ran)
            crashed = None if t.cancelled() else t.exception()
            errors = {} if crashed is not None or t.cancelled() else t.result()
            for writer, batch in members:
                error = crashed if crashed is not None else errors.get(writer.shape)
                self._finished(writer, self._flush_job(writer, batch), error)
            self._job_ended()

        task.add_done_callback(done)

    def _finished(self, writer: ShapeWriter, job: Job, error: BaseException | None) -> None:
        writer.in_flight = False
        if error is None:
            writer.in_flight_bytes, writer.in_flight_lsn = 0, None
            writer.retry = None
            if writer.failure is not None:
                log.info("flush.recovered", shape=writer.shape, attempts=writer.failure.attempts)
                writer.failure = None
        else:
            self._failed(writer, job, error)

    def _job_ended(self) -> None:
        self._room.set()
        self._wake.set()

    def _failed(self, writer: ShapeWriter, job: Job, error: BaseException) -> None:
        """Keep the job to run it again after a backoff; its bytes stay counted. A
        fenced commit is not retried: what this process holds for the table is stale
        (another writer committed into it), so the service stops and, restarted,
        reads the table's offsets again (``run`` raises it)."""
        if isinstance(error, WriterFenced):
            log.error("flush.fenced", shape=writer.shape, error=str(error))
            self.fenced = error
            return
        previous = writer.failure
        attempts = 1 if previous is None else previous.attempts + 1
        since = time.time() if previous is None else previous.since
        writer.retry = job
        self.stats.job_failures += 1
        if isinstance(error, UnfitValue):  # the same batch would fail the same way
            writer.failure = JobFailure(str(error), attempts, math.inf, since, refused=True)
            log.error("flush.refused", shape=writer.shape, error=str(error))
            return
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (attempts - 1))
        cause = failure_text(error)
        # (S3A's failures, from Spark, get the advice tidemark's own requests give)
        spark_side = writer.table.remote and not isinstance(error, objectstore.SinkError)
        hint = objectstore.hint_for(cause) if spark_side else None
        if hint is not None:
            cause = f"{cause}: {hint}"
        full = full_disk(writer.table.root)
        if full is not None:
            cause = f"{full} ({cause})"
        writer.failure = JobFailure(cause, attempts, self._clock() + delay, since)
        log.error(
            "flush.failed",
            shape=writer.shape,
            error=cause,
            attempts=attempts,
            retry_in_s=round(delay, 2),
            exc_info=error if attempts == 1 else None,
        )

    def _flush_job(self, writer: ShapeWriter, batch: Batch) -> Job:
        return lambda: self._flush(writer, batch)

    async def _flush(self, writer: ShapeWriter, batch: Batch) -> None:
        schema = batch.schema if batch.schema is not None else writer.schema
        columns = batch.columns if batch.columns is not None else writer.columns
        launched = self._clock()
        async with self._slots:
            result = await asyncio.to_thread(
                commit_batch, self.spark, writer.table, schema, columns, batch
            )
        self.cadence.observe(self._clock() - launched)
        self._committed(writer, batch, result)

    async def _round(self, members: list[tuple[ShapeWriter, Batch]]) -> dict[str, BaseException]:
        """Write every member's rows in one Spark job per layout, then commit each
        member's files in its table, the commits in parallel. Returns the members
        that failed, with their errors.

        Group commit: every member's files are synced in one step before the commits,
        and every committed member's log folder in one step after them; a member is
        reported committed (and so acknowledged) only after both. A power loss before
        the second step leaves a member's commit absent or whole, never acknowledged."""
        specs = [
            RoundMember(
                writer.table,
                batch.schema if batch.schema is not None else writer.schema,
                batch.columns if batch.columns is not None else writer.columns,
                batch,
            )
            for writer, batch in members
        ]
        staging = self._staging_dir(members[0][0])
        launched = self._clock()
        started = time.perf_counter()
        try:
            async with self._slots:
                written = await asyncio.to_thread(write_round, self.spark, specs, staging)
        finally:
            self._rounds_writing.discard(asyncio.current_task())
            self._wake.set()  # shapes due by age may form the next round now
        write_s = time.perf_counter() - started
        self.stats.rounds += 1
        self.stats.round_shapes += len(members)
        log.debug("round.written", shapes=len(members), write_s=round(write_s, 3))
        errors: dict[str, BaseException] = {}
        ready: list[tuple[ShapeWriter, Batch, list[DataFile]]] = []
        for (writer, batch), files in zip(members, written, strict=True):
            if isinstance(files, BaseException):
                errors[writer.shape] = files
            else:
                ready.append((writer, batch, files))
        committed, failed = await group_commit(
            [(w.table, b, files) for w, b, files in ready], self._commits, write_s
        )
        log.debug(
            "round.committed",
            shapes=len(ready),
            commit_s=round(time.perf_counter() - started - write_s, 3),
        )
        self.cadence.observe(self._clock() - launched)
        for i, (writer, batch, _) in enumerate(ready):
            if i in failed:
                errors[writer.shape] = failed[i]
            elif i in committed:
                self._committed(writer, batch, committed[i])
        return errors

    def _staging_dir(self, writer: ShapeWriter) -> Path:
        if self.staging is None:
            local = objectstore.local_dir(writer.table.root)
            self.staging = local / "_rounds" / str(uuid.uuid4())
        return self.staging

    def clear_staging(self) -> None:
        """Delete what round jobs of an earlier run left in the staging folder (files
        written but never moved into a table: their batches were not committed)."""
        if self.staging is not None:
            fencing.clear(self.staging)

    def _committed(self, writer: ShapeWriter, batch: Batch, result: CommitResult) -> None:
        writer.batch_committed(batch, result.version)
        stats = self.stats
        if result.version is None:
            stats.replays_skipped += 1
        else:
            stats.commits += 1
            stats.rows_committed += result.rows
        stats.last_results = [*stats.last_results[-63:], result]
        log.debug(
            "flush.committed",
            shape=result.shape,
            rows=result.rows,
            end_lsn=result.end_lsn,
            version=result.version,
            write_s=round(result.write_seconds, 3),
        )
        if self._on_commit is not None:
            self._on_commit(result)

    def _stage_job(
        self,
        writer: ShapeWriter,
        taken: tuple[Delivery, Rows] | None,
        streamed: list[tuple[StreamPart, Rows]],
    ) -> Job:
        """One job that writes a writer's open rows out of memory. It is retried as a
        whole after a failure, so each step is done once: the steps left are kept."""
        schema, columns = writer.schema, list(writer.columns)
        steps: list[Callable[[], Coroutine[Any, Any, None]]] = []
        if taken is not None:
            delivery, rows = taken
            steps.append(lambda: self._stage(writer, delivery, rows, schema, columns))
        for part, rows in streamed:
            chunk = Spooled([], rows.ops[0], rows.ops[-1], len(rows))
            folder = writer.table.new_spool_dir()[0]
            steps.append(
                functools.partial(self._spool, writer, part, rows, chunk, folder, schema, columns)
            )

        async def run() -> None:
            while steps:
                await steps[0]()
                steps.pop(0)

        return run

    async def _stage(
        self, writer: ShapeWriter, delivery: Delivery, rows: Rows, schema: Any, columns: Any
    ) -> None:
        """An ordinary open transaction's rows, written as table files (not committed)."""
        async with self._slots:
            files = await asyncio.to_thread(
                write_parquet, self.spark, writer.table, schema, columns, rows
            )
        orphans = writer.buffer.attach_staged(delivery, files)
        if orphans:  # the delivery was aborted meanwhile: Postgres sends it again
            await asyncio.to_thread(writer.table.delete_files, orphans)
        self.stats.stage_jobs += 1
        log.info(
            "txn.staged",
            shape=writer.shape,
            lsn=delivery.lsn,
            rows=len(rows),
            files=len(files),
            discarded=bool(orphans),
        )

    async def _spool(
        self,
        writer: ShapeWriter,
        part: StreamPart,
        rows: Rows,
        chunk: Spooled,
        folder: str,
        schema: Any,
        columns: Any,
    ) -> None:
        """A streamed transaction's rows, written to spool files (its commit LSN is
        not known yet); ``rows`` empties as slices are written."""
        await asyncio.to_thread(
            write_spool, writer.table, schema, columns, rows, chunk.files, folder
        )
        orphans = writer.buffer.attach_spooled(part, chunk)
        if orphans:
            await asyncio.to_thread(writer.table.delete_spool, orphans)
        self.stats.stage_jobs += 1
        self.stats.spooled_bytes += sum(f.size for f in chunk.files)
        log.info(
            "txn.spooled",
            shape=writer.shape,
            xid=part.xid,
            rows=chunk.rows,
            ops=f"{chunk.first_op}..{chunk.last_op}",
            discarded=bool(orphans),
        )

    # -- backfill ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def exclusive(self, writer: ShapeWriter) -> AsyncIterator[None]:
        """Hold ``writer`` so no flush job runs for it (backfill commits, maintenance).
        No new job starts for it meanwhile: under a steady stream its rounds would
        otherwise follow one another with no gap, and upkeep would wait forever."""
        writer.awaited += 1
        try:
            while writer.in_flight:
                await asyncio.sleep(0.02)
        finally:
            writer.awaited -= 1
        writer.in_flight = True
        try:
            yield
        finally:
            writer.in_flight = False
            self._wake.set()

    @contextlib.asynccontextmanager
    async def backfill_slot(self) -> AsyncIterator[None]:
        """A job slot for backfill work, taken only while no stream flush is waiting."""
        while True:
            now, age = self._clock(), self.flush_age_s
            # (rows as old as the flush age count as waiting even while a round writes)
            waiting = any(
                not w.in_flight and not w.backfill and self._due(w, now, False, age)
                for w in self.writers.values()
            )
            if not waiting and not self._slots.locked():
                break
            await asyncio.sleep(0.02)
        async with self._slots:
            yield

    # -- draining -----------------------------------------------------------------------

    async def flush_all(self) -> None:
        """Commit everything ready now (shutdown, tests); wait for running jobs."""
        self._flush_all_requested = True
        try:
            while True:
                self._start_due_jobs()
                if not self._jobs:
                    if not any(
                        w.buffer.ready_since is not None and not w.hold_commits and w.retry is None
                        for w in self.writers.values()
                    ):
                        return
                    await asyncio.sleep(0)  # a job's done-callback is about to run
                    continue
                await asyncio.wait(set(self._jobs))
        finally:
            self._flush_all_requested = False
