"""The live set of shapes: activation, backfill, resync, schema changes, removal.

Each shape has a table and a writer from its activation on. A shape with a
recorded backfill follows the stream at once, behind its snapshot's fence; a new
shape (or one whose backfill was interrupted, or that is resynced) is queued for a
backfill, and backfills run one at a time once the stream runs (the slot must
exist before a snapshot can be merged with it). Until its backfill commits, a
shape is ``backfilling``: not ready, no frontier.

A shape the stream can no longer describe exactly (``ShapeResync``: a type change,
a column added with a default, ...) is resynced automatically, at most once per
``AUTO_RESYNC_EVERY_S``; otherwise it waits in ``resync_needed`` for an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from tidemark.backfill.runner import BackfillProgress, run_backfill
from tidemark.backfill.state import BackfillState
from tidemark.collector import ShapeLogCollector
from tidemark.errors import ShapeError
from tidemark.flush.tracker import FlushTracker
from tidemark.replication.slot import add_tables_to_publication
from tidemark.shapes.catalog import check_shape, read_table, validate_shape
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync
from tidemark.shapes.registry import ShapeRegistry
from tidemark.sink.frontiers import state_dir
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.sink.table import ShapeTable
from tidemark.writers.scheduler import FlushScheduler
from tidemark.writers.writer import ShapeWriter

if TYPE_CHECKING:
    from tidemark.config import Settings

log = structlog.get_logger("tidemark.shapes")

AUTO_RESYNC_EVERY_S = 600.0


def column_specs(shape: BoundShape) -> list[ColumnSpec]:
    return [ColumnSpec(c.name, c.type_oid, c.type_modifier) for c in shape.output_columns]


@dataclass
class ShapeStatus:
    definition: ShapeDefinition
    origin: str
    state: str = "active"  # backfilling | active | error | resync_needed
    error: str | None = None
    as_text: tuple[tuple[str, str], ...] = ()
    bound: BoundShape | None = None
    domains: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    backfill: BackfillProgress | None = None
    last_auto_resync: float = float("-inf")
    # each backfill request bumps ``wanted``; a finished backfill records the request it
    # started for, so a resync asked for during a backfill is not lost
    backfills_wanted: int = 0
    backfills_done: int = 0


class ShapeSet:
    def __init__(
        self,
        settings: Settings,
        tracker: FlushTracker,
        *,
        paused: Callable[[], AbstractAsyncContextManager[None]],
        on_change: Callable[[], None],
    ) -> None:
        self.settings = settings
        root = settings.sink.root
        self.registry = ShapeRegistry.open(state_dir(root) / "shapes.json")
        self.backfills = BackfillState(root)
        self.tracker = tracker
        self.collector = ShapeLogCollector(
            tracker, on_resync=self._on_resync, on_columns_changed=self._on_columns_changed
        )
        self.registry.on_removed(self.collector.remove_shape)
        self.statuses: dict[str, ShapeStatus] = {}
        self.scheduler: FlushScheduler | None = None
        self.spark: Any = None
        self._paused = paused
        self._on_change = on_change
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- activation ----------------------------------------------------------------

    async def _source(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        return await psycopg.AsyncConnection.connect(self.settings.source.dsn, autocommit=True)

    async def start(self) -> list[tuple[str, str]]:
        """Reconcile declared shapes, activate every registered one; their tables."""
        declared = [ShapeDefinition(**s.model_dump()) for s in self.settings.shapes]
        result = self.registry.reconcile(declared)
        if result.added or result.removed or result.changed:
            log.info(
                "shapes.reconciled",
                added=result.added,
                removed=result.removed,
                changed=result.changed,
            )
        for name in result.changed:  # a new definition: rebuild from a snapshot
            self.backfills.forget(name)
        conn = await self._source()
        tables: list[tuple[str, str]] = []
        try:
            for registered in self.registry.shapes():
                definition = registered.definition
                try:
                    await self._activate(definition, registered.origin, conn)
                    tables.append((definition.schema_name, definition.table_name))
                except ShapeError as exc:
                    if registered.origin == "config":
                        raise ShapeError(f"shape '{definition.name}': {exc}") from exc
                    self.statuses[definition.name] = ShapeStatus(
                        definition, registered.origin, state="error", error=str(exc)
                    )
                    log.error("shape.invalid", shape=definition.name, error=str(exc))
        finally:
            await conn.close()
        return sorted(set(tables))

    async def _activate(
        self,
        definition: ShapeDefinition,
        origin: str,
        conn: psycopg.AsyncConnection[tuple[Any, ...]],
    ) -> ShapeStatus:
        """Validate against the catalog, create the table and writer, then follow the
        stream (backfilled before) or queue the backfill."""
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
        status = ShapeStatus(
            definition, origin, as_text=checked.as_text, bound=bound, domains=catalog.domain_bases
        )
        self.statuses[definition.name] = status
        record = self.backfills.get(definition.name)
        if record is not None:
            self.collector.add_shape(bound, writer, catalog.domain_bases, record.fence)
            log.info(
                "shape.active",
                shape=definition.name,
                table=definition.table,
                committed_lsn=writer.committed_lsn,
            )
        else:
            self._queue_backfill(status)
        return status

    def _queue_backfill(self, status: ShapeStatus) -> None:
        status.state, status.error = "backfilling", None
        status.backfill = BackfillProgress(time.time())
        status.backfills_wanted += 1
        self._queue.put_nowait(status.definition.name)
        log.info("shape.backfill_queued", shape=status.definition.name)

    # -- changes at runtime ----------------------------------------------------------------

    async def add(self, definition: ShapeDefinition, *, origin: str = "api") -> ShapeStatus:
        """Validate, persist and activate a shape (its rows arrive by backfill)."""
        conn = await self._source()
        try:
            await validate_shape(conn, definition)  # fails before anything is persisted
            if not self.settings.source.publish_all_tables:
                await add_tables_to_publication(
                    conn,
                    self.settings.source.publication,
                    [(definition.schema_name, definition.table_name)],
                )
            created = self.registry.add(definition, origin=origin)  # type: ignore[arg-type]
            if not created and definition.name in self.statuses:
                return self.statuses[definition.name]
            return await self._activate(definition, origin, conn)
        finally:
            await conn.close()

    def remove(self, name: str) -> None:
        """Stop a shape (its table stays on disk) and release the flush boundary."""
        registered = self.registry.get(name)
        if name not in self.statuses and registered is None:
            raise ShapeError(f"there is no shape {name!r}; see GET /v1/shapes")
        if registered is not None:
            self.registry.remove(name, origin=registered.origin)
        self.collector.remove_shape(name)
        if self.scheduler is not None:
            self.scheduler.remove(name)
        self.statuses.pop(name, None)
        self.backfills.forget(name)
        log.info("shape.removed", shape=name)

    async def resync(self, name: str) -> ShapeStatus:
        """Rebuild a shape from a fresh snapshot while the stream continues."""
        status = self.statuses.get(name)
        if status is None:
            raise ShapeError(f"there is no shape {name!r}; see GET /v1/shapes")
        if status.state == "backfilling" and status.backfills_done < status.backfills_wanted - 1:
            return status  # one is already waiting behind the running one
        await self._rebind(status)
        self.backfills.forget(name)  # a crash mid-resync backfills again at start
        self._queue_backfill(status)
        return status

    async def _rebind(self, status: ShapeStatus) -> None:
        """Bind the shape to its table as the catalog has it now."""
        conn = await self._source()
        try:
            catalog = await read_table(conn, status.definition)
        finally:
            await conn.close()
        checked = check_shape(status.definition, catalog)
        status.bound, status.domains, status.as_text = (
            checked.shape,
            catalog.domain_bases,
            checked.as_text,
        )
        assert self.scheduler is not None
        self.scheduler.writers[status.definition.name].set_columns(column_specs(checked.shape))

    # -- backfills ------------------------------------------------------------------------------

    async def run_backfills(self, streaming: asyncio.Event) -> None:
        """Backfill queued shapes, one at a time, once the stream runs."""
        await streaming.wait()
        while True:
            name = await self._queue.get()
            status = self.statuses.get(name)
            if status is None or status.bound is None:
                continue
            if status.backfills_done >= status.backfills_wanted:
                continue  # an earlier run already served this request
            await self._backfill(name, status)

    async def _backfill(self, name: str, status: ShapeStatus) -> None:
        assert self.scheduler is not None and status.bound is not None
        writer = self.scheduler.writers[name]
        writer.backfill = True
        generation = status.backfills_wanted
        status.state, status.backfill = "backfilling", BackfillProgress(time.time())
        try:
            # bind to the table as it is now: DDL may have run since activation
            await self._rebind(status)
            bound, domains = status.bound, status.domains
            assert bound is not None
            fence, rows = await run_backfill(
                dsn=self.settings.source.dsn,
                shape=bound,
                writer=writer,
                spark=self.spark,
                scheduler=self.scheduler,
                paused=self._paused,
                unregister=lambda: self.collector.remove_shape(name),
                register=lambda fence: self.collector.add_shape(bound, writer, domains, fence),
                progress=status.backfill or BackfillProgress(time.time()),
            )
        except Exception as exc:  # one shape's failure must not stop the others
            status.state, status.error = "error", f"backfill failed: {exc!r}"
            log.error("backfill.failed", shape=name, error=repr(exc), exc_info=exc)
            return
        finally:
            writer.backfill = False
        if self.statuses.get(name) is not status:
            return  # removed meanwhile
        status.backfills_done = generation
        if generation < status.backfills_wanted:
            log.info("backfill.superseded", shape=name)  # another one is queued
            return
        await asyncio.to_thread(self.backfills.done, name, fence, rows)
        status.state, status.error = "active", None
        self._on_change()
        log.info("shape.active", shape=name, backfilled_rows=rows)

    # -- what the stream reports ------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_resync(self, resync: ShapeResync) -> None:
        status = self.statuses.get(resync.shape)
        log.error("shape.resync_needed", shape=resync.shape, reason=resync.reason)
        if status is None:
            return
        status.state, status.error = "resync_needed", resync.reason
        if time.monotonic() - status.last_auto_resync > AUTO_RESYNC_EVERY_S:
            status.last_auto_resync = time.monotonic()
            self._spawn(self._auto_resync(resync.shape))

    async def _auto_resync(self, name: str) -> None:
        with contextlib.suppress(ShapeError, psycopg.Error):
            await self.resync(name)

    def _on_columns_changed(self, shape: BoundShape) -> None:
        assert self.scheduler is not None
        writer = self.scheduler.writers.get(shape.name)
        if writer is None:
            return
        known = {c.name for c in writer.columns}
        added = [c.name for c in shape.output_columns if c.name not in known]
        writer.set_columns(column_specs(shape))
        log.info(
            "shape.columns_changed",
            shape=shape.name,
            columns=[c.name for c in shape.output_columns],
        )
        if added:
            self._spawn(self._check_added_columns(shape, added))

    async def _check_added_columns(self, shape: BoundShape, added: list[str]) -> None:
        """An added column with a default gave every existing row a value no change
        carried (a fast default, or a rewrite the stream does not show): resync."""
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
