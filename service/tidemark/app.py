"""The service: every part wired into one asyncio TaskGroup.

Tasks: the replication reader (``ReplicationClient``), the consumer (decoder +
``ShapeLogCollector``), the flush scheduler (Spark jobs), the monitor (checks
against ``pg_stat_replication``), the HTTP API, and housekeeping (frontiers,
metrics, systemd watchdog, table maintenance).

Acknowledgement path: writers commit -> ``FlushTracker`` notifies ``D`` ->
``ReplicationClient.note_durable(D)`` -> status update. When the consumer has
processed the stream up to a keepalive with no transaction open and the tracker
caught up, the keepalive's ``wal_end`` is acknowledged too (re-checked after every
keepalive and every tracker notification, never remembered as a flag).

Stop (SIGTERM/SIGINT or ``request_stop``): the consumer stops taking data,
everything committed-in-source that is buffered is flushed, a final status update
goes out, the connection closes; all within ``shutdown_grace_s``. A crash of any
task is logged with its context and ends ``run()`` with the error (the process
exits non-zero, the supervisor restarts it); nothing is acknowledged that was not
committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import structlog

from tidemark import systemd
from tidemark.aio import wait_event
from tidemark.collector import ShapeLogCollector
from tidemark.config import Settings
from tidemark.conninfo import redact_dsn
from tidemark.errors import ProtocolError, ShapeError, TidemarkError
from tidemark.flush.tracker import FlushTracker
from tidemark.lsn import format_lsn
from tidemark.observability import Metrics, refresh_metrics
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.replication.client import (
    KeepaliveMark,
    ReplicationClient,
    SourceConfig,
    StreamStarted,
    WalBatch,
)
from tidemark.replication.monitor import ReplicationMonitor, Violation
from tidemark.replication.slot import add_tables_to_publication
from tidemark.shapes.catalog import check_shape, read_table, validate_shape
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync
from tidemark.shapes.registry import ShapeRegistry
from tidemark.sink.frontiers import Frontiers, ShapeFrontier, state_dir, store_frontiers
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.sink.table import ShapeTable
from tidemark.writers.job import CommitResult
from tidemark.writers.scheduler import FlushPolicy, FlushScheduler
from tidemark.writers.writer import ShapeWriter

log = structlog.get_logger("tidemark.app")

FRAGMENT_CHANGES = 10_000  # backpressure check at least this often inside a batch


def column_specs(shape: BoundShape) -> list[ColumnSpec]:
    return [ColumnSpec(c.name, c.type_oid, c.type_modifier) for c in shape.output_columns]


@dataclass
class ShapeStatus:
    definition: ShapeDefinition
    origin: str
    state: str = "active"  # active | error | resync_needed
    error: str | None = None
    as_text: tuple[tuple[str, str], ...] = ()


@dataclass
class Progress:
    received_lsn: int = 0
    flushed_lsn: int = 0
    applied_lsn: int = 0
    durable_lsn: int | None = None
    frontiers: dict[str, int] = field(default_factory=dict)


class Service:
    def __init__(self, settings: Settings, *, spark: Any = None, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.spark = spark
        self.phase = "starting"
        self.started_at = time.time()
        self.http_port: int | None = None
        self.shapes: dict[str, ShapeStatus] = {}
        self.violations: list[Violation] = []
        root = settings.sink.root
        self.registry = ShapeRegistry.open(state_dir(root) / "shapes.json")
        self.tracker = FlushTracker(self._on_durable, clock=time.monotonic)
        self.collector = ShapeLogCollector(
            self.tracker, on_resync=self._on_resync, on_columns_changed=self._on_columns_changed
        )
        self.registry.on_removed(self.collector.remove_shape)
        flush = settings.flush
        self.scheduler: FlushScheduler | None = None
        self.policy = FlushPolicy(
            max_rows=flush.max_rows,
            max_bytes=flush.max_bytes,
            max_age_s=flush.max_age_s,
            concurrency=flush.concurrency,
            memory_budget=flush.memory_budget_bytes,
            stage_bytes=flush.stage_bytes,
        )
        self.client: ReplicationClient | None = None
        self.monitor: ReplicationMonitor | None = None
        self._stop = asyncio.Event()
        self._stopped = asyncio.Event()
        self._last_keepalive_end: int | None = None
        self._frontiers_dirty = True
        self._txn_arrivals: list[tuple[int, float]] = []  # (commit lsn, monotonic) for ack lag
        self._background: set[asyncio.Task[None]] = set()

    # -- shapes ------------------------------------------------------------------

    async def _source(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        return await psycopg.AsyncConnection.connect(self.settings.source.dsn, autocommit=True)

    async def _activate(
        self,
        definition: ShapeDefinition,
        origin: str,
        conn: psycopg.AsyncConnection[tuple[Any, ...]],
    ) -> ShapeStatus:
        """Validate against the catalog, create the table and writer, start routing."""
        catalog = await read_table(conn, definition)
        checked = check_shape(definition, catalog)
        bound = checked.shape
        table = ShapeTable(self.settings.sink.root, definition.name)
        specs = column_specs(bound)
        await asyncio.to_thread(
            table.create,
            table_schema(specs),
            list(bound.primary_key),
            definition.model_dump(mode="json"),
        )
        writer = ShapeWriter(table, specs, self.tracker.handle_flush_notification)
        assert self.scheduler is not None
        self.scheduler.add(writer)
        self.collector.add_shape(bound, writer, catalog.domain_bases)
        status = ShapeStatus(definition, origin, as_text=checked.as_text)
        self.shapes[definition.name] = status
        log.info(
            "shape.active",
            shape=definition.name,
            table=definition.table,
            committed_lsn=writer.committed_lsn,
            where=definition.where,
        )
        return status

    async def add_shape(self, definition: ShapeDefinition, *, origin: str = "api") -> ShapeStatus:
        """Add a shape at runtime: validated, persisted, routed from the next change on."""
        conn = await self._source()
        try:
            await validate_shape(conn, definition)  # fails before anything is persisted
            if not self.settings.source.publish_all_tables:
                await add_tables_to_publication(
                    conn, self.settings.source.publication, [definition.table]
                )
            created = self.registry.add(definition, origin=origin)  # type: ignore[arg-type]
            if not created and definition.name in self.shapes:
                return self.shapes[definition.name]
            return await self._activate(definition, origin, conn)
        finally:
            await conn.close()

    async def remove_shape(self, name: str) -> None:
        """Stop a shape (its table stays on disk) and release the flush boundary."""
        if name not in self.shapes and self.registry.get(name) is None:
            raise ShapeError(f"there is no shape {name!r}; see GET /v1/shapes")
        if self.registry.get(name) is not None:
            self.registry.remove(name, origin=self.registry.get(name).origin)  # type: ignore[union-attr]
        self.collector.remove_shape(name)
        if self.scheduler is not None:
            self.scheduler.remove(name)
        self.shapes.pop(name, None)
        for metric in (
            self.metrics.shape_frontier_lsn,
            self.metrics.shape_pending_rows,
            self.metrics.shape_pending_bytes,
            self.metrics.shape_stalled,
            self.metrics.shape_committed_lsn,
            self.metrics.shape_lag_bytes,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(name)
        log.info("shape.removed", shape=name)

    def _on_resync(self, resync: ShapeResync) -> None:
        status = self.shapes.get(resync.shape)
        if status is not None:
            status.state = "resync_needed"
            status.error = resync.reason
        log.error("shape.resync_needed", shape=resync.shape, reason=resync.reason)

    def _on_columns_changed(self, shape: BoundShape) -> None:
        assert self.scheduler is not None
        writer = self.scheduler.writers.get(shape.name)
        if writer is not None:
            added = [
                c.name
                for c in shape.output_columns
                if c.name not in {s.name for s in writer.columns}
            ]
            writer.set_columns(column_specs(shape))
            if added:
                task = asyncio.create_task(self._check_added_columns(shape, added))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            log.info(
                "shape.columns_changed",
                shape=shape.name,
                columns=[c.name for c in shape.output_columns],
            )

    async def _check_added_columns(self, shape: BoundShape, added: list[str]) -> None:
        """An added column with a default gave every existing row a value that no
        change carried (a fast default, or a rewrite the stream does not show): the
        shape's table cannot be completed from the stream and needs a resync."""
        rel = shape.relation
        try:
            conn = await self._source()
            try:
                cur = await conn.execute(
                    "select a.attname from pg_attribute a"
                    " join pg_class c on c.oid = a.attrelid"
                    " join pg_namespace n on n.oid = c.relnamespace"
                    " left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum"
                    " where n.nspname = %s and c.relname = %s and a.attname = any(%s)"
                    " and (a.atthasmissing or d.adbin is not null)",
                    (rel.namespace, rel.name, added),
                )
                with_default = [r[0] for r in await cur.fetchall()]
            finally:
                await conn.close()
        except psycopg.Error as exc:
            log.warning("shape.column_check_failed", shape=shape.name, error=str(exc))
            return
        if with_default:
            self.collector.mark_resync(
                ShapeResync(
                    shape.name,
                    f"column(s) {with_default} of {rel.namespace}.{rel.name} were added with a "
                    "default: existing rows got a value no change carried",
                )
            )

    # -- acknowledgement -----------------------------------------------------------

    def _on_durable(self, lsn: int) -> None:
        """FlushTracker notification: every transaction with commit LSN <= lsn is durable."""
        self._frontiers_dirty = True
        if self.client is not None:
            self.client.note_durable(lsn)
            self._maybe_idle()
        now = time.monotonic()
        arrivals = self._txn_arrivals
        done = 0
        for commit_lsn, at in arrivals:
            if commit_lsn > lsn:
                break
            self.metrics.ack_lag_seconds.observe(now - at)
            done += 1
        if done:
            del arrivals[:done]

    def _maybe_idle(self) -> None:
        end = self._last_keepalive_end
        if end is not None and self.client is not None and self.collector.idle:
            self.client.note_idle(end)

    # -- the consumer ------------------------------------------------------------------

    async def _consume(self) -> None:
        client = self.client
        scheduler = self.scheduler
        assert client is not None and scheduler is not None
        queue = client.queue
        collector = self.collector
        handle = collector.handle
        decoder: PgOutputDecoder | None = None
        metrics = self.metrics
        arrivals = self._txn_arrivals
        while not self._stop.is_set():
            item = await queue.get()
            if self._stop.is_set():
                break
            if type(item) is WalBatch:
                assert decoder is not None
                decode = decoder.decode
                before_txns = collector.stats.transactions
                count = 0
                for payload in item.payloads:
                    try:
                        message = decode(payload)
                    except ProtocolError:
                        metrics.decode_errors.inc()
                        raise
                    handle(message)
                    count += 1
                    if count >= FRAGMENT_CHANGES:
                        count = 0
                        scheduler.poke()
                        await scheduler.wait_for_room()
                metrics.received_bytes.inc(sum(len(p) for p in item.payloads))
                new_txns = collector.stats.transactions - before_txns
                if new_txns and collector.last_commit_lsn is not None:
                    metrics.transactions.inc(new_txns)
                    if len(arrivals) < 100_000:
                        arrivals.append((collector.last_commit_lsn, time.monotonic()))
                scheduler.poke()
                await scheduler.wait_for_room()
            elif type(item) is KeepaliveMark:
                self._last_keepalive_end = item.wal_end
                self._maybe_idle()
            elif type(item) is StreamStarted:
                decoder = PgOutputDecoder(item.proto_version)
                self._last_keepalive_end = None
                if item.reconnect:
                    collector.stream_restarted()
                    metrics.reconnects.inc()
                self.phase = "streaming"
                systemd.notify("READY=1")

    # -- lifecycle -----------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Run until stopped; raises the error that stopped it, if any."""
        settings = self.settings
        self.metrics.up.set(1)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        try:
            if self.spark is None:
                from tidemark.spark import build_session

                spark_cfg = settings.spark
                self.spark = await asyncio.to_thread(
                    build_session, spark_cfg.master, spark_cfg.conf, spark_cfg.app_name
                )
            self.scheduler = FlushScheduler(self.spark, self.policy, on_commit=self._on_commit)
            tables = await self._start_shapes()
            self.client = ReplicationClient(
                SourceConfig(
                    dsn=settings.source.dsn,
                    slot=settings.source.slot,
                    publication=settings.source.publication,
                    publication_tables=None
                    if settings.source.publish_all_tables
                    else tuple(tables),
                    create_publication=settings.source.create_publication,
                    create_slot=settings.source.create_slot,
                    reconnect_max_s=settings.source.reconnect_max_s,
                )
            )
            self.monitor = ReplicationMonitor(
                settings.source.dsn,
                settings.source.slot,
                walsender_pid=lambda: self.client.stats.walsender_pid if self.client else None,
                sent_history=lambda: self.client.stats.history if self.client else [],
                durable_frontier=self._durable_frontier,
                period_s=settings.monitor.period_s,
                on_violation=self._on_violation,
            )
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self.client.run(), name="replication"),
                    group.create_task(self._consume(), name="consumer"),
                    group.create_task(self.scheduler.run(), name="scheduler"),
                    group.create_task(self.monitor.run(), name="monitor"),
                    group.create_task(self._housekeeping(), name="housekeeping"),
                ]
                from tidemark.api.server import serve

                tasks.append(group.create_task(serve(self), name="http"))
                group.create_task(self._shutdown_when_asked(tasks), name="shutdown")
        except* Exception as errors:
            for exc in errors.exceptions:
                log.error(
                    "service.crashed",
                    error=str(exc),
                    type=type(exc).__name__,
                    phase=self.phase,
                    exc_info=exc,
                )
            self.phase = "failed"
            raise errors.exceptions[0] from None
        finally:
            self.metrics.up.set(0)
            self.metrics.streaming.set(0)
            self._stopped.set()

    async def _start_shapes(self) -> list[str]:
        declared = [ShapeDefinition(**s.model_dump()) for s in self.settings.shapes]
        result = self.registry.reconcile(declared)
        if result.added or result.removed or result.changed:
            log.info(
                "shapes.reconciled",
                added=result.added,
                removed=result.removed,
                changed=result.changed,
            )
        conn = await self._source()
        tables: list[str] = []
        try:
            for registered in self.registry.shapes():
                definition = registered.definition
                try:
                    await self._activate(definition, registered.origin, conn)
                    tables.append(definition.table)
                except ShapeError as exc:
                    if registered.origin == "config":
                        raise ShapeError(f"shape '{definition.name}': {exc}") from exc
                    self.shapes[definition.name] = ShapeStatus(
                        definition, registered.origin, state="error", error=str(exc)
                    )
                    log.error("shape.invalid", shape=definition.name, error=str(exc))
        finally:
            await conn.close()
        return sorted(set(tables))

    async def _shutdown_when_asked(self, tasks: list[asyncio.Task[Any]]) -> None:
        await self._stop.wait()
        self.phase = "stopping"
        systemd.notify("STOPPING=1")
        log.info("service.stopping", grace_s=self.settings.shutdown_grace_s)
        consumer = next(t for t in tasks if t.get_name() == "consumer")
        consumer.cancel()
        try:
            async with asyncio.timeout(self.settings.shutdown_grace_s):
                assert self.scheduler is not None and self.client is not None
                # the open transaction (if any) is not committed: Postgres re-sends it
                await self.scheduler.flush_all()
                self._write_frontiers()
                await self.client.stop()
        except TimeoutError:
            log.error("service.shutdown_timeout", grace_s=self.settings.shutdown_grace_s)
        for task in tasks:
            task.cancel()
        self.phase = "stopped"
        log.info(
            "service.stopped",
            flushed_lsn=format_lsn(self.client.feedback.flush_lsn)
            if self.client and self.client.feedback
            else None,
        )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- progress, frontiers, readiness ------------------------------------------------------

    def _durable_frontier(self) -> int | None:
        client = self.client
        return None if client is None or client.feedback is None else client.feedback.flush_lsn

    def frontier(self, shape: str) -> int | None:
        """LSN up to which ``shape`` is complete (commit LSN <= frontier are in its table)."""
        client = self.client
        if client is None or client.feedback is None or shape not in self.shapes:
            return None
        if self.shapes[shape].state != "active":
            writer = self.scheduler.writers.get(shape) if self.scheduler else None
            return writer.committed_lsn if writer else None
        flushed = self.tracker.last_flushed_of(shape)
        if flushed is not None:
            return max(0, flushed.tx_offset - 1)
        return client.feedback.flush_lsn

    def progress(self) -> Progress:
        client = self.client
        fb = client.feedback if client else None
        return Progress(
            received_lsn=fb.received if fb else 0,
            flushed_lsn=fb.flush_lsn if fb else 0,
            applied_lsn=fb.flush_lsn if fb else 0,
            durable_lsn=self.tracker.durable_lsn,
            frontiers={name: f for name in self.shapes if (f := self.frontier(name)) is not None},
        )

    def readiness(self) -> tuple[bool, list[str]]:
        reasons = []
        if self.phase != "streaming":
            reasons.append(f"not streaming (phase: {self.phase})")
        if self.client is not None and not self.client.stats.connected:
            reasons.append("replication connection is down")
        if self.violations:
            last = self.violations[-1]
            reasons.append(f"invariant violated: {last.kind}: {last.message}")
        grace = self.settings.monitor.stall_grace_s
        for stalled in self.tracker.stalled_shapes(time.monotonic(), grace):
            reasons.append(f"shape {stalled.name} has held the flush boundary for over {grace}s")
        for name, status in self.shapes.items():
            if status.state != "active":
                reasons.append(f"shape {name} is {status.state}: {status.error}")
        return not reasons, reasons

    def _on_violation(self, violation: Violation) -> None:
        self.violations.append(violation)
        self.metrics.invariant_violations.labels(violation.kind).inc()

    def _on_commit(self, result: CommitResult) -> None:
        self.metrics.commits.labels(result.shape).inc()
        self.metrics.commit_duration.observe(result.write_seconds + result.commit_seconds)
        for kind, count in result.kinds.items():
            self.metrics.changes.labels(result.shape, kind).inc(count)
        self._frontiers_dirty = True

    def _write_frontiers(self) -> None:
        progress = self.progress()
        shapes = {}
        for name, frontier in progress.frontiers.items():
            writer = self.scheduler.writers.get(name) if self.scheduler else None
            shapes[name] = ShapeFrontier(
                frontier,
                writer.committed_lsn if writer else None,
                self.shapes[name].state == "active",
            )
        store_frontiers(self.settings.sink.root, Frontiers(progress.flushed_lsn, shapes))
        self._frontiers_dirty = False

    async def _housekeeping(self) -> None:
        watchdog = systemd.watchdog_interval()
        last_frontiers = 0.0
        last_maintenance = time.monotonic()
        tick = 0.5 if watchdog is None else min(0.5, watchdog)
        while True:
            now = time.monotonic()
            if self._frontiers_dirty and now - last_frontiers >= 1.0 and self.client:
                await asyncio.to_thread(self._write_frontiers)
                last_frontiers = now
            refresh_metrics(self)
            if self.phase == "streaming":
                systemd.notify(
                    f"WATCHDOG=1\nSTATUS=acknowledged {format_lsn(self.progress().flushed_lsn)}"
                )
            if now - last_maintenance >= self.settings.sink.maintenance_every_s:
                last_maintenance = now
                await self._maintain()
            await wait_event(self._stop, tick)
            if self._stop.is_set():
                return

    async def _maintain(self) -> None:
        """Compact and vacuum each table between its flushes (never during one)."""
        assert self.scheduler is not None
        for name, writer in list(self.scheduler.writers.items()):
            if writer.in_flight:
                continue
            writer.in_flight = True  # keeps the scheduler off this shape meanwhile
            try:
                await asyncio.to_thread(writer.table.compact)
                await asyncio.to_thread(
                    writer.table.vacuum, self.settings.sink.vacuum_retention_hours
                )
            except TidemarkError as exc:
                log.warning("maintenance.failed", shape=name, error=str(exc))
            finally:
                writer.in_flight = False

    def describe_source(self) -> str:
        return redact_dsn(self.settings.source.dsn)


def sink_root(settings: Settings) -> Path:
    return Path(settings.sink.root)
