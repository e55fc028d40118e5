"""The service: every part wired into one asyncio TaskGroup.

Tasks: the replication reader (``ReplicationClient``), the consumer (``StreamConsumer``:
decoder + ``ShapeLogCollector``), the flush scheduler (Spark jobs), backfills, the monitor
(checks against ``pg_stat_replication``), the HTTP API, and housekeeping
(frontiers, metrics, systemd watchdog, table maintenance).

Acknowledgement path: writers commit -> ``FlushTracker`` notifies ``D`` to the
acknowledgement, ``Feedback.note_durable(D)`` (the service owns it; then the
tracker's other listener, ``_after_durable``, promotes shapes and records the ack
lag) -> the replication client asks ``Feedback`` what to send -> status update, sent
only after ``ContinuityStore.before_send`` made ``D`` (and any claim invalidation)
durable. When the consumer has processed the stream up to a keepalive with no
transaction open and the tracker caught up, the keepalive's ``wal_end`` is
acknowledged too (``Feedback``'s idle rule, re-checked after every keepalive and
every tracker notification, never remembered as a flag).

Start: the stream the shapes' claims were made on is checked against the source
(``tidemark.continuity``) before any shape is activated; a gap stops the service
or rebuilds the claimed shapes, as ``[source] on_stream_gap`` says.

The monitor checks Postgres's ``confirmed_flush_lsn`` against a bound computed
from the writers' own state (``acknowledgeable``: the oldest transaction any
writer still holds uncommitted, and how far the consumer got), not from what
tidemark sent: an acknowledgement bug shows up as a violation.

Stop (SIGTERM/SIGINT or ``request_stop``): the consumer stops taking data,
everything committed-in-source that is buffered is flushed, a final status update
goes out, the connection closes; then the current tables with rows not yet folded
are folded; all within ``shutdown_grace_s``. A crash of any
task is logged with its context and ends ``run()`` with the error (the process
exits non-zero, the supervisor restarts it); nothing is acknowledged that was not
committed.

Reload (SIGHUP or ``reload()``): the config file is read again and ``tidemark.reload``
decides what changes; shapes change through ``add_shape``/``remove_shape`` as from the
API, the flush policy is swapped in the scheduler, and keys read only at start are
logged (``config.reload_needs_restart``). A file that does not load changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Coroutine
from pathlib import Path
from typing import Any

import psycopg
import structlog

from tidemark import systemd
from tidemark.aio import wait_event
from tidemark.allocators import return_freed_memory, tune_collector
from tidemark.api.server import serve
from tidemark.continuity.guard import ContinuityGuard
from tidemark.continuity.store import ContinuityStore
from tidemark.errors import ReplicationError, TidemarkError
from tidemark.flush import progress as rules
from tidemark.flush.tracker import FlushTracker
from tidemark.lsn import format_lsn
from tidemark.observability import Metrics, refresh_metrics
from tidemark.reload import ReloadPlan, plan_reload
from tidemark.replication import slot as slots
from tidemark.replication.client import ReplicationClient, SourceConfig
from tidemark.replication.feedback import Feedback
from tidemark.replication.monitor import ReplicationMonitor, ReplicationSample, Violation
from tidemark.replication.observe import observe_stream
from tidemark.replication.protocol import StreamStarted
from tidemark.settings.config import Settings, load_settings
from tidemark.shapes.model import ShapeDefinition
from tidemark.shapes.state import ShapeState
from tidemark.shapeset import ShapeSet, ShapeStatus
from tidemark.sink import table_format
from tidemark.sink.frontiers import Frontiers, ShapeFrontier, store_frontiers
from tidemark.sink.root import claim_root
from tidemark.spark import (
    configure_s3a,
    in_background,
    object_store_master,
    s3a_jars,
    with_s3a,
)
from tidemark.stalls import Stall, StallWatch
from tidemark.state import durable, fencing, objectstore
from tidemark.state.instance_state import warm_dir
from tidemark.state.lease import LeaderLease
from tidemark.status.facts import (
    BackfillFacts,
    CollectorFacts,
    ContinuityFacts,
    CurrentFacts,
    FlushFacts,
    Progress,
    ServiceFacts,
    StreamFacts,
    WriterFacts,
)
from tidemark.status.history import History, HistoryFacts
from tidemark.status.readiness import (
    FlushFailing,
    ServiceHealth,
    not_ready_reasons,
    shown_state,
)
from tidemark.stream.consumer import StreamConsumer
from tidemark.upkeep import CurrentKeeper
from tidemark.writers.job import CommitResult, forget_warm_leftovers, needs_warm_up, warm_up
from tidemark.writers.scheduler import FlushPolicy, FlushScheduler

log = structlog.get_logger("tidemark.app")

# errors whose message says what happened and what to do: logged without a traceback
EXPLAINED = (TidemarkError, psycopg.OperationalError)

AUDIT_EVERY_S = 30.0  # tables' transaction versions checked against the writers
AUDIT_TABLES_PER_ROUND = 50
# a deposed leader whose event loop has not stopped the service by then exits at once
DEPOSED_EXIT_S = 15.0
# a stopping service waits this long for a warm-up on an object store to delete its files
WARM_STOP_WAIT_S = 20.0


# commits of a round at once on an s3:// root (8 on disk): each is a few requests
OBJECT_STORE_COMMITS = 64


class Service:
    def __init__(
        self,
        settings: Settings,
        *,
        spark: Any = None,
        metrics: Metrics | None = None,
        config_path: str | None = None,
    ):
        self.settings = settings
        durable.configure(enabled=settings.sink.sync, method=settings.sink.sync_method)
        # an s3:// root's store, before anything reads the state under the root
        remote = objectstore.is_remote(settings.sink.root)
        objectstore.configure(objectstore.S3Access.from_settings(settings.s3) if remote else None)
        if not settings.sink.sync:
            log.warning(
                "sink.sync_off",
                meaning="acknowledged transactions can be lost for good by a power loss",
            )
        self.config_path = config_path  # what reload() reads (None: $TIDEMARK_CONFIG or ./)
        self.metrics = metrics or Metrics(per_shape=settings.metrics.per_shape)
        self.spark = spark
        self.phase = "starting"
        self.started_at = time.time()
        self.http_port: int | None = None
        self.violations: list[Violation] = []
        # the acknowledgement (tidemark.replication.feedback): the tracker tells it of
        # every durable position; the replication client starts it and asks it
        self.feedback = Feedback(txn_open=lambda: self.collector.in_txn)
        self.tracker = FlushTracker(
            self.feedback.note_durable, self._after_durable, clock=time.monotonic
        )
        self.store = ContinuityStore(settings.sink.root, settings.instance.name)
        self.guard = ContinuityGuard(self.store, settings.source.on_stream_gap, held=self._held_lsn)
        # the sink's table format (tidemark.sink.port); the root's claimed at start
        self.tables = table_format(settings.sink.format, settings.iceberg)
        self.shapeset = ShapeSet(
            settings,
            self.tracker,
            paused=self._paused,
            on_change=self._frontiers_changed,
            store=self.store,
            frontier=self._raw_frontier,
            tables=self.tables,
        )
        self.collector = self.shapeset.collector
        flush = settings.flush
        self.policy = FlushPolicy(
            max_rows=flush.max_rows,
            max_bytes=flush.max_bytes,
            max_age_s=flush.max_age_s,
            min_age_s=flush.min_age_s,
            concurrency=flush.concurrency,
            memory_budget=flush.memory_budget_bytes,
            stage_bytes=flush.stage_bytes,
            # a commit on an object store waits on requests, not on the CPU
            **({"commit_concurrency": OBJECT_STORE_COMMITS} if remote else {}),
        )
        lease = settings.lease
        self.lease: LeaderLease | None = (
            LeaderLease(
                settings.source.dsn,
                settings.source.slot,
                retry_s=lease.retry_s,
                check_s=lease.check_s,
                deadline_s=lease.deadline_s,
            )
            if lease.enabled
            else None
        )
        self.role = "standby" if self.lease is not None else "leader"
        self.scheduler: FlushScheduler | None = None
        self.keeper: CurrentKeeper | None = None
        self.client: ReplicationClient | None = None
        self.monitor: ReplicationMonitor | None = None
        self._stop = asyncio.Event()
        self._warm_stop = threading.Event()  # ends the warm-up (a stop, a failure)
        # set while the leader lease is unconfirmed (writes suspended): a final flush
        # that meets it gives up instead of waiting out the grace period
        self._lease_unconfirmed = asyncio.Event()
        self._fence = fencing.current()
        self._deposed = asyncio.Event()  # a newer leader took over (tidemark.state.fencing)
        self._deposed_exit: threading.Timer | None = None
        self.consumer = StreamConsumer(
            self.collector, self.metrics, feedback=self.feedback, on_started=self._started
        )
        self._consume_lock = self.consumer.lock
        self._frontiers_dirty = True
        self._audit_next = 0
        self._stalls = StallWatch()
        self._reload_lock = asyncio.Lock()
        self._reloads: set[asyncio.Task[Any]] = set()
        self.last_commit_at: dict[str, float] = {}  # shape -> wall time of its last commit
        self.history = History()  # the status page's sparklines

    # -- shapes (see tidemark.shapeset) ---------------------------------------------

    @property
    def shapes(self) -> dict[str, ShapeStatus]:
        return self.shapeset.statuses

    @property
    def registry(self) -> Any:
        return self.shapeset.registry

    async def add_shape(self, definition: ShapeDefinition, *, origin: str = "api") -> ShapeStatus:
        return await self.shapeset.add(definition, origin=origin)

    async def resync_shape(self, name: str) -> ShapeStatus:
        return await self.shapeset.resync(name)

    async def remove_shape(self, name: str) -> None:
        self.shapeset.remove(name)
        for metric in (
            self.metrics.shape_lag_bytes,
            self.metrics.shape_lag_seconds,
            self.metrics.shape_pending_rows,
            self.metrics.shape_pending_bytes,
            self.metrics.shape_stalled,
            self.metrics.shape_failing,
            self.metrics.changes,
            self.metrics.commits,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(name)
        self.last_commit_at.pop(name, None)
        if self.keeper is not None:
            self.keeper.forget(name)
        self._frontiers_dirty = True

    @contextlib.asynccontextmanager
    async def _paused(self) -> AsyncIterator[None]:
        """No stream message is processed inside (the consumer waits between batches)."""
        async with self._consume_lock:
            yield

    def _frontiers_changed(self) -> None:
        self._frontiers_dirty = True

    # -- acknowledgement -----------------------------------------------------------

    def _after_durable(self, lsn: int, _caught_up: bool) -> None:
        """FlushTracker notification, after the acknowledgement's: every transaction with
        commit LSN <= lsn is durable. What follows durability: the frontiers file is
        due, shapes whose backfill it reached go live, the ack lag is recorded."""
        self._frontiers_dirty = True
        self.shapeset.promote()
        lag = self.consumer.acknowledged(lsn)
        if lag is not None:
            self.history.ack_lag(lag)

    # -- the consumer (tidemark.stream.consumer) ------------------------------------------------

    def _started(self, started: StreamStarted) -> None:
        """The client (re)started the stream: the service streams."""
        if started.reconnect:
            self.metrics.reconnects.inc()
        self.phase = "streaming"
        systemd.notify("READY=1")

    # -- lifecycle -----------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Run until stopped; raises the error that stopped it, if any."""
        settings = self.settings
        failure: Exception | None = None
        warming: asyncio.Task[None] | None = None
        return_freed_memory()
        tune_collector()
        self.metrics.up.set(1)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self._reload_on_signal)
        try:
            if self.spark is None:
                from tidemark.spark import build_session

                spark_cfg = settings.spark
                conf = dict(spark_cfg.conf)
                master = spark_cfg.master
                if objectstore.is_remote(settings.sink.root):
                    conf = with_s3a(conf, s3a_jars())
                    master = object_store_master(master)
                self.spark = await asyncio.to_thread(
                    build_session,
                    master,
                    conf,
                    spark_cfg.app_name,
                    spark_cfg.remote,
                )
            self.tables.use_engine(self.spark)
            if objectstore.is_remote(settings.sink.root):
                access = objectstore.s3_access()
                assert access is not None
                bucket = objectstore.split(str(settings.sink.root))[0]
                configure_s3a(self.spark, bucket, access.hadoop_conf())
            remote = objectstore.is_remote(settings.sink.root)
            if not remote:
                warming = asyncio.create_task(self._warm_up(), name="warm-up")
            await asyncio.to_thread(
                claim_root, settings.sink.root, settings.sink.format, settings.iceberg
            )
            if remote:  # (once the store answered: its settings and bucket are right)
                warming = asyncio.create_task(self._warm_up(), name="warm-up")
            if self.lease is None:
                # no lease, no epoch: nothing is fenced (and nothing of an earlier
                # service in this process, deposed or suspended, stays in force)
                fencing.install(fencing.Fence())
                self.metrics.leader.set(1)
            elif not await self._stand_by():
                return  # stopped while standing by
            src = settings.source
            # the claims hold only on the stream they were made on: check it first
            observed = await observe_stream(src.dsn, src.slot)
            self.guard.decide_at_start(observed)
            if observed.slot_lost:  # (no claim holds on it any more: see decide_at_start)
                await self._replace_lost_slot()
            self.scheduler = FlushScheduler(
                self.spark,
                self.policy,
                on_commit=self._on_commit,
                staging=objectstore.local_dir(settings.sink.root) / "_rounds" / src.slot,
            )
            self.scheduler.clear_staging()  # a killed run's round files, never committed
            self.keeper = CurrentKeeper(
                settings,
                self.spark,
                self.scheduler,
                self.metrics,
                frontier=self.frontier,
                tables=self.tables,
            )
            self.shapeset.scheduler, self.shapeset.spark = self.scheduler, self.spark
            tables = await self.shapeset.start()
            self.client = ReplicationClient(
                SourceConfig(
                    dsn=src.dsn,
                    slot=src.slot,
                    publication=src.publication,
                    publication_tables=None if src.publish_all_tables else tuple(tables),
                    create_publication=src.create_publication,
                    create_slot=src.create_slot,
                    failover_slot=src.failover_slot,
                    streaming=src.stream_large_transactions,
                    reconnect_max_s=src.reconnect_max_s,
                ),
                guard=self.guard,
                feedback=self.feedback,
            )
            self.monitor = ReplicationMonitor(
                src.dsn,
                src.slot,
                walsender_pid=lambda: self.client.stats.walsender_pid if self.client else None,
                sent_history=lambda: self.client.stats.history if self.client else [],
                durable_frontier=self.acknowledgeable,
                explain_frontier=self._explain_acknowledgeable,
                slot_ours=lambda: not fencing.current().taken_over(),
                period_s=settings.monitor.period_s,
                on_violation=self._on_violation,
            )

            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self.client.run(), name="replication"),
                    group.create_task(
                        self.consumer.run(self.client, self.scheduler, self._stop), name="consumer"
                    ),
                    group.create_task(self.scheduler.run(), name="scheduler"),
                    group.create_task(
                        self.shapeset.run_backfills(self.client.streaming_started),
                        name="backfill",
                    ),
                    group.create_task(self.monitor.run(), name="monitor"),
                    group.create_task(self.shapeset.watch_partitions(), name="partitions"),
                    group.create_task(self._housekeeping(), name="housekeeping"),
                    group.create_task(self.keeper.run(), name="current"),
                    group.create_task(serve(self), name="http"),
                ]
                if self.lease is not None:
                    self._fence = fencing.current()  # the one this leadership installed
                    hold = self.lease.hold(
                        suspend=self._suspend_writes,
                        resume=self._resume_writes,
                        stopping=self._source_stopping,
                    )
                    tasks.append(group.create_task(hold, name="lease"))
                    tasks.append(group.create_task(self._watch_fence(), name="fence"))
                group.create_task(self._shutdown_when_asked(tasks), name="shutdown")
        except* Exception as errors:
            for exc in errors.exceptions:
                log.error(
                    "service.crashed",
                    error=str(exc),
                    type=type(exc).__name__,
                    phase=self.phase,
                    # an error tidemark explains, or a connection refused, needs its
                    # message (the CLI prints it with what to do), not a traceback
                    exc_info=None if isinstance(exc, EXPLAINED) else exc,
                )
            self.phase = "failed"
            # raised below, not here: Python before 3.11.4 wraps what an except* block
            # raises in a new group, and the CLI would show a traceback, not the message
            failure = errors.exceptions[0]
        finally:
            self._warm_stop.set()
            if warming is not None:
                if objectstore.is_remote(settings.sink.root):
                    # its files are under the root: deleted before the service is done
                    # (one round's write; bounded, as a store that hangs would hold it)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(warming), WARM_STOP_WAIT_S)
                warming.cancel()
                await asyncio.gather(warming, return_exceptions=True)
            if self._deposed_exit is not None:  # (stopping on its own: no forced exit)
                self._deposed_exit.cancel()
            self.metrics.up.set(0)
            self.metrics.streaming.set(0)
            if self.lease is not None:  # after the walsender stopped: a standby may lead now
                await self.lease.close()
                self.metrics.leader.set(0)
        if failure is not None:
            raise failure from None

    async def _warm_up(self) -> None:
        """Warm a fresh local JVM's write path in Spark's background pool while the
        service starts (``writers.job.warm_up``); a standby warms while it waits, so a
        takeover meets the backlog with compiled code. A root on an object store is
        warmed there, through S3A, under ``<root>/_tidemark/warm/<uuid>`` (deleted
        after, and what a killed service left there after an hour). Never a reason
        to stop."""
        spark = self.spark
        root = self.settings.sink.root
        remote = objectstore.is_remote(root)
        if not self.settings.spark.warm_up or not needs_warm_up(spark, remote):
            return
        started = time.monotonic()
        folder = None
        try:
            if remote:
                warm = warm_dir(root)
                await asyncio.to_thread(forget_warm_leftovers, str(warm))
                folder = str(objectstore.join(warm, str(uuid.uuid4())))
            scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="tidemark-warm-"))
            rounds = await asyncio.to_thread(
                in_background, spark, warm_up, spark, scratch, self._warm_stop, remote=folder
            )
        except Exception as exc:  # only ever slower without it
            log.warning("spark.warm_up_failed", error=str(exc), type=type(exc).__name__)
            return
        log.info(
            "spark.warmed",
            rounds=rounds,
            seconds=round(time.monotonic() - started, 2),
            on="s3" if remote else "disk",
        )

    async def _stand_by(self) -> bool:
        """Serve the API as a standby until the leader lease is ours (see tidemark.state.lease);
        then end the old leader's walsender and read the state it left. False if
        stopped meanwhile."""
        assert self.lease is not None

        if await self.lease.try_acquire():  # the usual case: nobody else runs
            log.info("lease.acquired", slot=self.settings.source.slot)
            return await self._lead()
        self.phase, self.role = "standby", "standby"
        self.metrics.leader.set(0)
        systemd.notify("READY=1\nSTATUS=standby: waiting for the leader lease")
        http = asyncio.create_task(serve(self), name="http-standby")
        watchdog = asyncio.create_task(self._standby_watchdog(), name="watchdog-standby")
        try:
            if not await self.lease.acquire(self._stop):
                self.phase = "stopped"
                return False
        finally:
            for task in (http, watchdog):
                task.cancel()
            await asyncio.gather(http, watchdog, return_exceptions=True)
        return await self._lead()

    async def _lead(self) -> bool:
        assert self.lease is not None
        await self.lease.take_over_slot()
        # before anything else is read or written: a leader deposed while alive must
        # find every table marked with a newer epoch than its own (tidemark.state.fencing)
        root, instance = self.settings.sink.root, self.settings.instance.name
        epoch = await asyncio.to_thread(fencing.advance, root, _holder_name(), instance)
        # this epoch's fence before the marks: a format whose writes check the fence
        # (Iceberg's file IO) checks them against it, not against an earlier service's
        fence = fencing.install(fencing.Fence(root, epoch, instance))
        # the old leader may have changed shapes, claims and the stream record
        self.shapeset.registry.reload()
        names = {r.name for r in self.registry.shapes()} | {s.name for s in self.settings.shapes}
        marked = await asyncio.to_thread(
            self.tables.mark, root, epoch, sorted(names), fencing.epoch_app(instance)
        )
        loop = asyncio.get_running_loop()
        fence.on_deposed(lambda _reason: self._deposed_from(loop))
        self.store.reload()
        self.phase, self.role = "starting", "leader"
        self.metrics.leader.set(1)
        log.info("lease.leading", slot=self.settings.source.slot, epoch=epoch, tables_marked=marked)
        return True

    async def _replace_lost_slot(self) -> None:
        """An invalidated slot can never stream again. Past ``decide_at_start`` no claim
        holds on it (``on_stream_gap = "resync"`` ended them, or there were none): it is
        dropped, and the replication client creates it again."""
        src = self.settings.source
        if not src.create_slot:
            raise ReplicationError(
                f"replication slot '{src.slot}' was invalidated and [source] create_slot is "
                f"false: drop it (SELECT pg_drop_replication_slot('{src.slot}')) and create it "
                "again, or allow tidemark to"
            )
        conn = await psycopg.AsyncConnection.connect(src.dsn, autocommit=True)
        try:
            await slots.drop_slot(conn, src.slot)
        finally:
            await conn.close()
        log.warning("slot.dropped_invalidated", slot=src.slot)

    def _held_lsn(self) -> int:
        """The highest LSN of the stream this process received and holds: the newest
        transaction seen, and each claimed shape's committed offset (from its table
        at start). Compared with where a new timeline forked (``continuity.rule``)."""
        held = max(0, self.tracker.last_seen_offset.tx_offset)
        writers = self.scheduler.writers if self.scheduler is not None else {}
        for name in self.store.claimed():
            writer = writers.get(name)
            if writer is not None:
                committed = writer.committed_lsn
            else:
                table = self.tables.changelog(self.settings.sink.root, name)
                committed = table.committed_lsn() if table.exists() else None
            held = max(held, committed or 0)
        return held

    def _deposed_from(self, loop: asyncio.AbstractEventLoop) -> None:
        """A write found a newer leader (any thread): the service stops (exit status 1).
        Should the event loop not get to it within ``DEPOSED_EXIT_S`` (blocked, or its
        tasks waiting on what the new leader holds), the process exits from a timer
        thread: a deposed leader must stop whatever its loop does."""
        loop.call_soon_threadsafe(self._deposed.set)
        if self._deposed_exit is None:
            self._deposed_exit = threading.Timer(DEPOSED_EXIT_S, _exit_deposed)
            self._deposed_exit.daemon = True
            self._deposed_exit.start()

    async def _watch_fence(self) -> None:
        """Stop the service (exit status 1) once a write found a newer leader."""
        await self._deposed.wait()
        raise fencing.Deposed(fencing.current().deposed or "a newer leader took over")

    async def _standby_watchdog(self) -> None:
        interval = systemd.watchdog_interval()
        if interval is None:
            return
        while True:
            systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _suspend_writes(self, reason: str) -> None:
        self._fence.suspend(reason)
        self._lease_unconfirmed.set()

    def _resume_writes(self) -> None:
        self._fence.resume()
        if self._fence.suspended is None:
            self._lease_unconfirmed.clear()

    def _source_stopping(self, reason: str) -> None:
        """The source is shutting down (tidemark.state.lease saw it): end the stream, whose
        walsender would otherwise hold the server's shutdown until wal_sender_timeout;
        the client connects again once the server is back."""
        if self.client is not None:
            self.client.drop_stream(f"the source is shutting down ({reason})")

    async def _flush_unless_unconfirmed(self, flush: Coroutine[Any, Any, Any]) -> bool:
        """Run the final flush unless the lease is or becomes unconfirmed meanwhile;
        True if it ran to the end."""
        flushing = asyncio.ensure_future(flush)
        unconfirmed = asyncio.ensure_future(self._lease_unconfirmed.wait())
        try:
            await asyncio.wait({flushing, unconfirmed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unconfirmed.cancel()
        if flushing.done():
            flushing.result()
            return True
        flushing.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await flushing
        log.warning("service.stopping_unflushed", reason=fencing.current().suspended)
        return False

    async def _shutdown_when_asked(self, tasks: list[asyncio.Task[Any]]) -> None:
        await self._stop.wait()
        self.phase = "stopping"
        systemd.notify("STOPPING=1")
        log.info("service.stopping", grace_s=self.settings.shutdown_grace_s)
        for task in tasks:
            if task.get_name() in ("consumer", "backfill", "current"):
                task.cancel()
        await self.shapeset.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_grace_s
        flushed = False
        try:
            async with asyncio.timeout(self.settings.shutdown_grace_s):
                assert self.scheduler is not None and self.client is not None
                # the open transaction (if any) is not committed: Postgres re-sends it.
                # Nothing can be committed without the lease either (the source stops,
                # say): what is buffered then is not acknowledged, and is sent again
                if await self._flush_unless_unconfirmed(self.scheduler.flush_all()):
                    self._write_frontiers()
                    flushed = True
                await self.client.stop()
        except TimeoutError:
            log.error("service.shutdown_timeout", grace_s=self.settings.shutdown_grace_s)
            flushed = False
        # a commit still waiting for the lease in a worker thread gives up now: the
        # process would wait for that thread before it exits (the fold's commits too:
        # a lease lost while stopping, the source going down with us, costs no wait)
        fencing.current().stop_waiting()
        if flushed:
            await self._fold_on_stop(deadline - loop.time())
        for task in tasks:
            task.cancel()
        self.phase = "stopped"
        fb = self.feedback
        log.info("service.stopped", flushed_lsn=format_lsn(fb.flush_lsn) if fb.started else None)

    async def _fold_on_stop(self, seconds: float) -> None:
        """A clean stop folds the current tables that have committed rows not yet folded
        (everything buffered was just committed), so a plain reader of
        ``current/<shape>`` gets the shape's state as of its last commit, not of the last
        timed refresh. Within what is left of the grace; a refresh already running ends
        first. A failure is logged: the tables stay readable as of their last refresh."""
        keeper = self.keeper
        current = self.settings.current
        if keeper is None or seconds <= 0 or not (current.enabled and current.fold_on_stop):
            return
        fence = fencing.current()
        if fence.suspended is not None or fence.deposed is not None:
            return  # (nothing may be written without the lease)
        waiting = [n for n in keeper.shapes_waiting() if n in self.shapes]
        if not waiting:
            return
        log.info("current.fold_on_stop", shapes=len(waiting), seconds=round(seconds, 1))
        try:
            async with asyncio.timeout(seconds):
                await keeper.refresh(*waiting)
        except TimeoutError:
            log.warning("current.fold_on_stop_timeout", shapes=len(waiting))

    # -- configuration reload (SIGHUP; the decision is tidemark.reload's) -------------------

    def _reload_on_signal(self) -> None:
        task = asyncio.create_task(self.reload(), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def reload(self) -> ReloadPlan | None:
        """Read the config file again: apply shape and flush changes through the same
        operations as the API, log the keys that need a restart. A file that does not
        load is logged and ignored (the service keeps its settings). One at a time."""
        async with self._reload_lock:
            if self.phase != "streaming" or self.scheduler is None:
                log.warning("config.reload_ignored", phase=self.phase, reason="not streaming")
                return None
            try:
                new = await asyncio.to_thread(load_settings, self.config_path)
                registered = {r.name: r for r in self.registry.shapes()}
                plan = plan_reload(self.settings, new, registered, self.policy)
            except TidemarkError as exc:
                log.error("config.reload_failed", error=str(exc), path=self.config_path)
                return None
            failed: list[str] = []
            for name in plan.remove:
                await self._reload_step(failed, name, self.remove_shape(name))
            for definition in plan.replace:  # a new definition: rebuilt from a snapshot
                await self._reload_step(failed, definition.name, self.remove_shape(definition.name))
            for definition in (*plan.replace, *plan.add):
                await self._reload_step(
                    failed, definition.name, self.add_shape(definition, origin="config")
                )
            if plan.adopt:
                configured = [r.definition for r in self.registry.shapes() if r.origin == "config"]
                self.registry.reconcile([*configured, *plan.adopt])
            if plan.flush is not None:
                self.policy = self.scheduler.policy = plan.flush
                self.scheduler.poke()
            assert plan.settings is not None
            self.settings = plan.settings
            if plan.needs_restart:
                log.warning("config.reload_needs_restart", keys=list(plan.needs_restart))
            log.info(
                "config.reloaded",
                added=[d.name for d in plan.add],
                removed=list(plan.remove),
                replaced=[d.name for d in plan.replace],
                adopted=[d.name for d in plan.adopt],
                changed=list(plan.changed),
                failed=failed,
            )
            return plan

    async def _reload_step(self, failed: list[str], name: str, step: Awaitable[Any]) -> None:
        try:
            await step
        except (TidemarkError, psycopg.Error) as exc:  # one shape must not stop the others
            failed.append(name)
            log.error("config.reload_shape_failed", shape=name, error=str(exc))

    # -- progress, frontiers, readiness ------------------------------------------------------

    def _held_lsns(self) -> list[int]:
        """The oldest uncommitted transaction of each writer whose shape is routed (a
        shape that stopped being routed lost its claim: what it still buffers is
        superseded by its coming backfill, and nothing waits for it)."""
        writers = self.scheduler.writers.values() if self.scheduler else ()
        routes = self.collector.routes
        return [lsn for w in writers if (lsn := w.oldest_held_lsn) is not None and routes(w.shape)]

    def acknowledgeable(self) -> int | None:
        """The highest LSN the writers' own state allows Postgres to have confirmed:
        below the oldest transaction any writer still holds uncommitted, and not past
        what the consumer processed (where it started, the last commit it handled, a
        keepalive it reached with nothing held). Independent of the FlushTracker and
        of what was sent, so the monitor can catch an acknowledgement bug."""
        client = self.client
        if client is None or client.start_lsn is None:
            return None
        return rules.acknowledgeable(self._processed(), self._held_lsns())

    def _processed(self) -> int:
        """How far the consumer has processed the stream: every transaction whose
        commit LSN is at or below it has been routed to its shapes (where it started,
        the last commit it handled, a keepalive it reached with no transaction open)."""
        client = self.client
        return rules.processed(
            client.start_lsn if client is not None and client.start_lsn is not None else 0,
            self.collector.last_commit_lsn,
            self.consumer.idle_processed,
        )

    def _explain_acknowledgeable(self) -> str:
        client = self.client
        writers = self.scheduler.writers.values() if self.scheduler else ()
        held = sorted(
            (lsn, w.shape)
            for w in writers
            if (lsn := w.oldest_held_lsn) is not None and self.collector.routes(w.shape)
        )[:3]
        return (
            f"started at {format_lsn(client.start_lsn) if client and client.start_lsn else '-'}, "
            f"last commit processed {format_lsn(self.collector.last_commit_lsn or 0)}, "
            f"idle keepalive {format_lsn(self.consumer.idle_processed or 0)}, oldest held: "
            + (", ".join(f"{s} at {format_lsn(lsn)}" for lsn, s in held) or "none")
        )

    def _raw_frontier(self, shape: str) -> int | None:
        """How far ``shape``'s table is complete, whatever its state: from its own state
        alone, never another shape's. A shape that owes a flush is complete below the
        oldest transaction it has not committed; one that owes nothing is complete up
        to what the stream has processed (and what was acknowledged), even while
        another shape holds the acknowledgement back."""
        if not self.feedback.started:
            return None
        flushed = self.tracker.last_flushed_of(shape)
        owed_from = None if flushed is None else flushed.tx_offset
        return rules.frontier(owed_from, self.feedback.flush_lsn, self._processed())

    def shape_state(self, name: str) -> tuple[str, str | None]:
        """The state and error a user sees: the shape's own, or ``error`` while its
        flushes fail (``status.readiness.shown_state``)."""
        status = self.shapes[name]
        writer = self.scheduler.writers.get(name) if self.scheduler else None
        failure = writer.failure if writer is not None else None
        failing = (
            None
            if failure is None
            else FlushFailing(
                failure.error,
                failure.attempts,
                failure.retry_at - time.monotonic(),
                failure.refused,
            )
        )
        return shown_state(name, status.state, status.error, failing)

    def frontier(self, shape: str) -> int | None:
        """LSN up to which ``shape`` is complete (commit LSN <= frontier are in its
        table); None while it is not ready (backfilling, catching up to its snapshot,
        or not following the stream). Once ready it is never below its snapshot."""
        status = self.shapes.get(shape)
        if status is None or status.state != ShapeState.ACTIVE:
            return None
        return self._raw_frontier(shape)

    def lag_seconds(self, frontier: int) -> float:
        """How long the oldest transaction received past ``frontier`` has waited (0 when
        none has): a shape's lag in seconds, given its frontier."""
        return self.consumer.waited_since(frontier)

    def progress(self) -> Progress:
        fb = self.feedback  # (0 each before the first connection)
        return Progress(
            received_lsn=fb.received,
            flushed_lsn=fb.flush_lsn,
            applied_lsn=fb.flush_lsn,
            durable_lsn=self.tracker.durable_lsn,
            frontiers={name: f for name in self.shapes if (f := self.frontier(name)) is not None},
        )

    # -- facts: what the API and the gauges read, as values (tidemark.status.facts) ----------

    def registered(self, name: str) -> ShapeDefinition | None:
        record = self.shapeset.registry.get(name)
        return None if record is None else record.definition

    def received_lsn(self) -> int | None:
        return self.feedback.received if self.feedback.started else None

    def writer_facts(self, name: str) -> WriterFacts | None:
        writer = self.scheduler.writers.get(name) if self.scheduler else None
        if writer is None:
            return None
        buffer = writer.buffer
        return WriterFacts(
            committed_lsn=writer.committed_lsn,
            rows_committed=writer.rows_committed,
            pending_rows=buffer.ready_rows + buffer.open_rows,
            pending_bytes=buffer.nbytes + writer.in_flight_bytes,
        )

    def flush_facts(self) -> FlushFacts | None:
        scheduler = self.scheduler
        if scheduler is None:
            return None
        stats, waiting = scheduler.stats, scheduler.waiting_since
        return FlushFacts(
            buffered_bytes=scheduler.buffered_bytes,
            memory_budget=scheduler.policy.memory_budget,
            flush_age_s=scheduler.flush_age_s,
            waiting_s=None if waiting is None else max(0.0, time.monotonic() - waiting),
            backpressure_waits=stats.backpressure_waits,
            blocked_seconds=stats.blocked_seconds,
            stage_jobs=stats.stage_jobs,
            spooled_bytes=stats.spooled_bytes,
            rounds=stats.rounds,
            round_shapes=stats.round_shapes,
            job_failures=stats.job_failures,
        )

    def collector_facts(self) -> CollectorFacts:
        collector = self.collector
        stats = collector.stats
        return CollectorFacts(
            changes=stats.changes,
            open_streams=collector.open_streams,
            streamed_commits=stats.streamed_commits,
            streamed_aborts=stats.streamed_aborts,
        )

    def current_facts(self, name: str) -> CurrentFacts | None:
        keeper = self.keeper
        if keeper is None or not self.settings.current.enabled:
            return None
        state = keeper.shapes.get(name)
        if state is None:
            return CurrentFacts(folded_lsn=None, waited_s=None, rows_waiting=0)
        return CurrentFacts(state.folded_lsn, state.unfolded_for(time.time()), state.rows_waiting)

    def continuity_facts(self, name: str) -> ContinuityFacts:
        store = self.store
        return ContinuityFacts(store.claim(name), store.stream, store.last_invalidation(name))

    def history_facts(self) -> HistoryFacts:
        return self.history.facts()

    def postgres_sample(self) -> ReplicationSample | None:
        return self.monitor.state.last if self.monitor is not None else None

    @property
    def monitoring(self) -> bool:
        return self.monitor is not None

    async def wait_replayed(self, lsn: int, timeout: float) -> bool:
        assert self.monitor is not None
        return await self.monitor.wait_for_lsn(lsn, timeout) is not None

    def describe_tables(self, name: str) -> dict[str, Any] | None:
        from tidemark.read import describe_tables  # (pyarrow's dataset: when asked)

        return describe_tables(self.settings.sink.root, name, self.tables)

    def update_metrics(self) -> None:
        """Set the gauges from the service's state now: before each scrape, not on a
        timer (at 1000 shapes a refresh took a quarter of the event loop's time at two
        a second, scraped or not)."""
        refresh_metrics(self.metrics, self.facts())

    def facts(self) -> ServiceFacts:
        """Everything the gauges show, taken now (``observability.refresh_metrics``)."""
        progress = self.progress()
        client = self.client
        stats = client.stats if client is not None else None
        states: dict[str, str] = {}
        backfills: dict[str, BackfillFacts] = {}
        for name, status in self.shapes.items():
            states[name] = self.shape_state(name)[0]
            backfill = status.backfill
            if backfill is not None:
                backfills[name] = BackfillFacts(
                    backfill.chunks, backfill.rows_done, backfill.rows_estimated
                )
        # the per-shape gauges only: at 1000 shapes not worth gathering when they are off
        per_shape = self.metrics.per_shape
        writers = self.scheduler.writers if self.scheduler is not None and per_shape else {}
        return ServiceFacts(
            phase=self.phase,
            progress=progress,
            stream=None
            if stats is None
            else StreamFacts(stats.connected, stats.status_updates, stats.bytes_received),
            flush=self.flush_facts(),
            writers={n: w for n in writers if (w := self.writer_facts(n)) is not None},
            lag_s={n: self.lag_seconds(f) for n, f in progress.frontiers.items()}
            if per_shape
            else {},
            states=states,
            backfills=backfills,
            stalled=frozenset(s.name for s in self.stalled_shapes()),
            holder=self.acknowledgement_holder(),
            backfill_failures=self.shapeset.backfill_failures,
            claim_invalidations=self.store.invalidations_total,
            collector=self.collector_facts(),
            postgres=self.postgres_sample(),
        )

    def readiness(self) -> tuple[bool, list[str]]:
        """Ready, and if not, why (``status.readiness.not_ready_reasons``)."""
        holder = self.lease.holder if self.role == "standby" and self.lease is not None else None
        last = self.violations[-1] if self.violations else None
        grace = self.settings.monitor.stall_grace_s
        scheduler = self.scheduler
        waiting = scheduler.waiting_since if scheduler is not None else None
        waited = None if waiting is None else time.monotonic() - waiting
        errors = {}
        for name in self.shapes:
            state, error = self.shape_state(name)
            if state == ShapeState.ERROR:
                errors[name] = error
        reasons = not_ready_reasons(
            ServiceHealth(
                role=self.role,
                lease_holder=holder.describe() if holder else None,
                phase=self.phase,
                connected=None if self.client is None else self.client.stats.connected,
                last_violation=None if last is None else (last.kind, last.message),
                stall_grace_s=grace,
                memory_wait_s=waited,
                memory_report=scheduler.memory_report()
                if scheduler is not None and waited is not None and waited > grace
                else "",
                stalled=[s.name for s in self.stalled_shapes()],
                holder=self.acknowledgement_holder(),
                errors=errors,
            )
        )
        return not reasons, reasons

    def acknowledgement_holder(self) -> tuple[str, int] | None:
        """The shape in error that holds the acknowledgement back (the pending shape
        with the oldest uncommitted transaction, when it is failing), and how many bytes
        of received WAL lie past its frontier: what the slot keeps for it alone."""
        name = self.tracker.holding_shape()
        if name is None or name not in self.shapes or self.shape_state(name)[0] != ShapeState.ERROR:
            return None
        frontier = self._raw_frontier(name)
        received = self.feedback.received  # (0 before the first connection)
        return name, max(0, received - (frontier or 0))

    def stalled_shapes(self) -> list[Stall]:
        """Shapes owing a flush without progress for ``monitor.stall_grace_s`` (a busy
        shape that keeps committing is not stalled; see tidemark.stalls)."""
        now = time.monotonic()
        pending = self.tracker.stalled_shapes(now, 0.0)
        return self._stalls.observe(pending, now, self.settings.monitor.stall_grace_s)

    def _on_violation(self, violation: Violation) -> None:
        self.violations.append(violation)
        self.metrics.invariant_violations.labels(violation.kind).inc()

    async def _audit_tables(self) -> None:
        """Check a few tables' own record against the writers': a table whose Delta
        transaction version is below what its writer believes committed would let the
        acknowledgement pass rows the lake does not hold (a lost or foreign commit)."""
        assert self.scheduler is not None
        writers = list(self.scheduler.writers.values())
        if not writers:
            return
        start = self._audit_next % len(writers)
        batch = (writers[start:] + writers[:start])[:AUDIT_TABLES_PER_ROUND]
        self._audit_next = start + len(batch)
        for writer in batch:
            believed = writer.committed_lsn
            if believed is None or writer.in_flight:
                continue
            try:
                held = await asyncio.to_thread(writer.table.committed_lsn)
            except Exception as exc:  # an unreadable table is logged, not fatal
                log.warning("audit.failed", shape=writer.shape, error=str(exc))
                continue
            if held is None or held < believed:
                violation = Violation(
                    "committed_not_in_table",
                    f"shape {writer.shape}: its writer committed up to "
                    f"{format_lsn(believed)} but its table's transaction version is "
                    f"{format_lsn(held) if held is not None else 'none'}",
                )
                # (the monitor logs its own violations the same way)
                log.error("invariant.violated", kind=violation.kind, detail=violation.message)
                self._on_violation(violation)

    def _on_commit(self, result: CommitResult) -> None:
        self.last_commit_at[result.shape] = time.time()
        if self.keeper is not None and result.version is not None:
            self.keeper.on_commit(result.shape, result.rows)
        self.metrics.commits.labels(result.shape).inc()
        self.metrics.commit_duration.observe(result.write_seconds + result.commit_seconds)
        self.metrics.changes.labels(result.shape).inc(sum(result.kinds.values()))
        for kind, count in result.kinds.items():
            self.metrics.changes_by_kind.labels(kind).inc(count)
        self._frontiers_dirty = True

    def _write_frontiers(self) -> None:
        progress = self.progress()
        writers = self.scheduler.writers if self.scheduler else {}
        shapes = {}
        for name in self.shapes:
            writer = writers.get(name)
            committed = writer.committed_lsn if writer else None
            frontier = progress.frontiers.get(name)
            status = self.shapes[name]
            shapes[name] = ShapeFrontier(
                frontier or 0, committed, frontier is not None, status.snapshot_lsn
            )
        try:
            store_frontiers(
                self.settings.sink.root,
                Frontiers(progress.flushed_lsn, shapes),
                self.settings.instance.name,
            )
        except OSError as exc:  # (a full disk): readers see older frontiers meanwhile
            log.warning(
                "frontiers.write_failed",
                error=str(exc),
                disk=durable.full_disk(self.settings.sink.root),
            )
            return
        except objectstore.StoreUnavailable as exc:  # (written again next time)
            log.warning("frontiers.write_failed", error=str(exc))
            return
        except fencing.LeaseUnconfirmed:
            return  # (written once the lease is confirmed again)
        except fencing.Deposed:
            return  # (the fence task stops the service)
        self._frontiers_dirty = False

    async def _housekeeping(self) -> None:
        watchdog = systemd.watchdog_interval()
        last_frontiers = 0.0
        last_maintenance = last_audit = time.monotonic()
        tick = 0.5 if watchdog is None else min(0.5, watchdog)
        # upkeep runs beside this loop: it can wait minutes (for a current table's
        # refresh, a compaction), and the watchdog pings must not wait with it
        upkeep: asyncio.Task[None] | None = None
        try:
            while True:
                now = time.monotonic()
                if self._frontiers_dirty and now - last_frontiers >= 1.0 and self.client:
                    await asyncio.to_thread(self._write_frontiers)
                    last_frontiers = now
                self.shapeset.promote()
                # the stall watch's look (the gauges are set when scraped: update_metrics)
                self.stalled_shapes()
                rows = self.scheduler.stats.rows_committed if self.scheduler is not None else 0
                self.history.tick(time.time(), rows)
                if self.phase == "streaming":
                    acked = format_lsn(self.progress().flushed_lsn)
                    systemd.notify(f"WATCHDOG=1\nSTATUS=acknowledged {acked}")
                if now - last_audit >= AUDIT_EVERY_S and self.phase == "streaming":
                    last_audit = now
                    await self._audit_tables()
                if upkeep is not None and upkeep.done():
                    upkeep.result()  # (a table's failure is logged inside; not this)
                    upkeep = None
                every = self.settings.sink.maintenance_every_s
                if upkeep is None and now - last_maintenance >= every:
                    last_maintenance = now
                    upkeep = asyncio.create_task(self._maintain(), name="maintenance")
                await wait_event(self._stop, tick)
                if self._stop.is_set():
                    return
        finally:
            if upkeep is not None:
                # a stop lets upkeep end as when it ran in this loop; a cancel (the
                # service's last step, or a crash) cancels it through the gather
                await asyncio.gather(upkeep, return_exceptions=True)

    async def _maintain(self) -> None:
        """Compact and vacuum each table between its flushes (never during one). A
        failure is logged and counted, and the next round tries again: upkeep never
        stops the stream.

        The shape's upkeep lock (held by a current-table refresh, which can take
        minutes) is taken before its flushes are held: waiting for a refresh with the
        flushes held would stop the shape's commits, and so the acknowledgement, for
        as long as the refresh runs."""
        assert self.scheduler is not None
        for name, writer in list(self.scheduler.writers.items()):
            if writer.backfill:
                continue  # its staged snapshot files must not be vacuumed mid-backfill
            async with contextlib.AsyncExitStack() as held:
                if self.keeper is not None:
                    await held.enter_async_context(self.keeper.lock(name))
                if writer.backfill or self.scheduler.writers.get(name) is not writer:
                    continue  # (a backfill began, or the shape went or changed, meanwhile)
                await held.enter_async_context(self.scheduler.exclusive(writer))
                try:
                    await asyncio.to_thread(writer.table.compact)
                    await asyncio.to_thread(
                        writer.table.vacuum,
                        self.settings.sink.vacuum_retention_hours,
                        writer.pending_files(),
                    )
                    if self.keeper is not None:
                        await self.keeper.maintain(name)
                except Exception as exc:  # upkeep must never stop the stream
                    self.metrics.maintenance_failures.inc()
                    log.warning(
                        "maintenance.failed",
                        shape=name,
                        error=f"{type(exc).__name__}: {exc}",
                        exc_info=exc,
                    )


def _exit_deposed() -> None:
    log.error(
        "lease.deposed_exit_forced",
        waited_s=DEPOSED_EXIT_S,
        meaning="deposed, and the service did not stop on its own: the process exits",
    )
    os._exit(1)


def _holder_name() -> str:
    """Who took the lease, for ``leader.json``: host and process."""
    import socket

    return f"{socket.gethostname()} pid {os.getpid()}"
