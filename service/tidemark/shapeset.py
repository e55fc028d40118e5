"""The live set of shapes: activation, claims, backfills, resyncs, removal.

Each shape has a table and a writer from its activation on. A shape follows the
stream only behind a **claim** (``tidemark.continuity``): the fence of its last
committed backfill, on the stream tidemark follows now. Without one (new, removed
and declared again, its claim ended), it is backfilled first.

States (``ShapeStatus.state``):

``backfilling``
    a backfill is queued or running (``backfill.phase``, ``backfill.reason``).
``catching_up``
    the table holds a snapshot, and the shape's own frontier (its committed rows
    and the stream processed) has not reached it yet: no frontier yet (a frontier
    below the snapshot would drop its rows).
``active``
    ready: the claim holds and the frontier covers the snapshot.
``error``
    the shape cannot be followed now: its backfill failed (retried with capped
    backoff: the error says when; a value its lake column cannot hold is not retried
    until a resync or a changed definition), or its definition no longer validates.

What ends a claim, and how (one rule, ``_request_backfill``): a resync asked for
(API, CLI) or needed (a schema change the stream cannot describe exactly, a column
added with a default), a removal, a failed backfill. Routing stops at once (the
shape's part of an open transaction is dropped; the FlushTracker releases it), the
claim is invalidated in the store (durable before any acknowledgement goes out:
``ContinuityStore.before_send``), and the backfill is queued. Every request bumps
the shape's generation: a backfill that finishes for an older generation (another
request came meanwhile) neither records a claim nor activates the shape; a running
one is cancelled. Backfills run one at a time, once the stream runs (the slot must
exist before a snapshot can be merged with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from tidemark.backfill.reader import SnapshotConnections
from tidemark.backfill.runner import (
    BackfillProgress,
    BackfillSuperseded,
    CatalogMoved,
    run_backfill,
)
from tidemark.continuity.store import ContinuityStore
from tidemark.errors import (
    ConfigError,
    ShapeConflict,
    ShapeError,
    TableDamaged,
    UnfitValue,
    failure_text,
)
from tidemark.flush.tracker import FlushTracker
from tidemark.replication.catalog import (
    check_partition_publishing,
    has_rows,
    read_table,
    read_tree,
    validate_shape,
)
from tidemark.replication.slot import add_tables_to_publication
from tidemark.shapes.catalog import CatalogTable, CheckedShape, check_shape
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync
from tidemark.shapes.partitions import Member, fingerprint, tree_changes
from tidemark.shapes.registry import ShapeRegistry
from tidemark.shapes.state import ShapeState, move
from tidemark.sink import table_format
from tidemark.sink.port import ChangelogTable, TableFormat
from tidemark.sink.schema import OP, ColumnSpec, column_specs, table_schema
from tidemark.state import objectstore
from tidemark.state.durable import full_disk
from tidemark.state.instance_state import instance_states, state_dir
from tidemark.state.objectstore import join
from tidemark.stream.collector import ShapeLogCollector
from tidemark.writers.scheduler import FlushScheduler
from tidemark.writers.writer import ShapeWriter, TableState

if TYPE_CHECKING:
    from tidemark.settings.config import Settings

log = structlog.get_logger("tidemark.shapes")

RETRY_FIRST_S = 2.0
RETRY_MAX_S = 300.0
PARTITION_CHECK_S = 5.0  # how often partitioned shapes check their partition tree
BACKFILLS_AT_ONCE = 4  # backfills that run at the same time (new shapes start faster)
# shape tables created at the same time when the service starts: a creation mostly
# waits (for syncs, for the catalog's lock, for Spark's driver), so more at once than
# cores (1000 Iceberg tables four at a time took 15 s)
TABLES_AT_ONCE = 16
# on an object store a creation mostly waits for a few requests' latency, not for the
# cores: 1000 tables four at a time waited 130 s behind 20 ms replies
TABLES_AT_ONCE_REMOTE = 32


def _move(status: ShapeStatus, to: ShapeState) -> ShapeState:
    return move(status.name, status.state, to)


@dataclass
class ShapeStatus:
    definition: ShapeDefinition
    origin: str
    state: ShapeState = ShapeState.BACKFILLING  # the moves: tidemark.shapes.state
    error: str | None = None
    as_text: tuple[tuple[str, str], ...] = ()
    bound: BoundShape | None = None
    domains: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    backfill: BackfillProgress | None = None
    snapshot_lsn: int | None = None  # of the claim the shape follows the stream behind
    # each backfill request bumps ``wanted``; a finished backfill records the request it
    # ran for, so a request made during a backfill is not lost
    backfills_wanted: int = 0
    backfills_done: int = 0
    backfill_attempts: int = 0  # failures in a row of the current request

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A shape checked against the catalog, before its table is created."""

    definition: ShapeDefinition
    catalog: CatalogTable
    checked: CheckedShape
    table: ChangelogTable
    specs: list[ColumnSpec]

    def create(self) -> TableState:
        """Create the shape's table (idempotent) and clear its spool: rows spooled for
        a streamed transaction by an earlier run (Postgres streams any transaction
        still open again, from its start). Returns what its writer reads from it."""
        schema = table_schema(self.specs)
        made = self.table.create(
            schema,
            list(self.checked.shape.primary_key),
            self.definition.model_dump(mode="json"),
        )
        self.table.clear_spool()
        if made:  # empty, of that schema: nothing to read back from its log
            return TableState(schema.field(OP).type, None)
        return TableState.read(self.table)


class ShapeSet:
    def __init__(
        self,
        settings: Settings,
        tracker: FlushTracker,
        *,
        paused: Callable[[], AbstractAsyncContextManager[None]],
        on_change: Callable[[], None],
        store: ContinuityStore | None = None,
        frontier: Callable[[str], int | None] = lambda _: None,
        tables: TableFormat | None = None,
    ) -> None:
        self.settings = settings
        self.tables = tables or table_format()
        root = settings.sink.root
        self.instance = settings.instance.name
        self.registry = ShapeRegistry.open(join(state_dir(root, self.instance), "shapes.json"))
        self.store = store or ContinuityStore(root, self.instance)
        self.tracker = tracker
        self.collector = ShapeLogCollector(
            tracker, on_resync=self._on_resync, on_columns_changed=self._on_columns_changed
        )
        self.registry.on_removed(self.collector.remove_shape)
        self.statuses: dict[str, ShapeStatus] = {}
        self.scheduler: FlushScheduler | None = None
        self.spark: Any = None
        self.backfill_failures = 0
        self._paused = paused
        self._on_change = on_change
        self._frontier = frontier
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._connections: SnapshotConnections | None = None  # while backfills run
        self._running: dict[str, asyncio.Task[None]] = {}
        self._retries: dict[str, asyncio.TimerHandle] = {}
        self._catching_up: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._catalog_conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._catalog_lock = asyncio.Lock()
        # per table, the catalog read not begun yet that rebinds asking now will share
        self._catalog_next: dict[
            tuple[str, str], tuple[asyncio.Future[CatalogTable], ShapeDefinition]
        ] = {}

    # -- activation ----------------------------------------------------------------

    async def _source(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        return await psycopg.AsyncConnection.connect(self.settings.source.dsn, autocommit=True)

    async def start(self) -> list[tuple[str, str]]:
        """Reconcile declared shapes, end the claims that no longer hold, activate every
        registered shape; returns their tables."""
        declared = [ShapeDefinition(**s.model_dump()) for s in self.settings.shapes]
        self.check_owners([d.name for d in declared] + [r.name for r in self.registry.shapes()])
        result = self.registry.reconcile(declared)
        if result.added or result.removed or result.changed:
            log.info(
                "shapes.reconciled",
                added=result.added,
                removed=result.removed,
                changed=result.changed,
            )
        store = self.store
        for name in result.removed:
            store.invalidate(name, "removed from the configuration")
        for name in result.changed:
            store.invalidate(name, "its definition changed in the configuration")
        for name in store.claimed():
            claim = store.claim(name)
            if name not in self.registry:
                store.invalidate(name, "the shape is no longer registered")
            elif claim is not None and claim.epoch not in (None, store.epoch):
                store.invalidate(name, f"the claim was made on stream epoch {claim.epoch}")
        await asyncio.to_thread(store.write_claims)
        conn = await self._source()
        tables: list[tuple[str, str]] = []
        # shapes of one table share one catalog read; while one shape's Delta table is
        # created (in a thread), the next ones are checked: up to TABLES_AT_ONCE tables
        # are being created, and shapes are installed in their order
        catalogs: dict[tuple[str, str], CatalogTable] = {}
        creating: deque[tuple[str, _Prepared, asyncio.Future[TableState]]] = deque()
        remote = objectstore.is_remote(self.settings.sink.root)
        at_once = TABLES_AT_ONCE_REMOTE if remote else TABLES_AT_ONCE
        # (threads of their own: asyncio's default pool has only a few on two cores)
        creators = ThreadPoolExecutor(at_once, thread_name_prefix="create-table")
        loop = asyncio.get_running_loop()

        def refuse(definition: ShapeDefinition, origin: str, exc: ShapeError) -> None:
            if origin == "config":
                text = str(exc)
                if not text.startswith(f"shape '{definition.name}'"):
                    text = f"shape '{definition.name}': {text}"
                raise ShapeError(text) from exc
            self.statuses[definition.name] = ShapeStatus(
                definition, origin, state=ShapeState.ERROR, error=str(exc)
            )
            log.error("shape.invalid", shape=definition.name, error=str(exc))

        async def install_next() -> None:
            origin, prepared, created = creating.popleft()
            definition = prepared.definition
            state: TableState | None
            try:
                state = await created
            except ShapeError as exc:
                refuse(definition, origin, exc)
                return
            except TableDamaged as exc:
                state = await self._damaged(prepared, origin, exc)
                if state is None:
                    return
            self._install(prepared, origin, state)
            tables.append((definition.schema_name, definition.table_name))

        try:
            for registered in self.registry.shapes():
                definition = registered.definition
                try:
                    prepared = await self._prepare(definition, conn, catalogs)
                except ShapeError as exc:
                    refuse(definition, registered.origin, exc)
                    continue
                created = loop.run_in_executor(creators, prepared.create)
                creating.append((registered.origin, prepared, created))
                if len(creating) >= at_once:
                    await install_next()
            while creating:
                await install_next()
        finally:
            # (after a failure: the creations still running end before start does)
            await asyncio.gather(*(c for _, _, c in creating), return_exceptions=True)
            creators.shutdown(wait=False)
            await conn.close()
        return sorted(set(tables))

    async def _activate(
        self,
        definition: ShapeDefinition,
        origin: str,
        conn: psycopg.AsyncConnection[tuple[Any, ...]],
    ) -> ShapeStatus:
        """Validate against the catalog, create the table and writer, then follow the
        stream behind the shape's claim, or queue its backfill."""
        prepared = await self._prepare(definition, conn)
        state = await asyncio.to_thread(prepared.create)
        return self._install(prepared, origin, state)

    async def _prepare(
        self,
        definition: ShapeDefinition,
        conn: psycopg.AsyncConnection[tuple[Any, ...]],
        catalogs: dict[tuple[str, str], CatalogTable] | None = None,
    ) -> _Prepared:
        """Validate against the catalog (read once per table when ``catalogs`` keeps
        the reads) and say what the shape's table is."""
        key = (definition.schema_name, definition.table_name)
        catalog = catalogs.get(key) if catalogs is not None else None
        if catalog is None:
            catalog = await read_table(conn, definition)
            if catalogs is not None:
                catalogs[key] = catalog
        checked = check_shape(definition, catalog)

        def shaped() -> dict[int, str]:
            return {
                s.bound.relation.oid: s.name
                for s in self.statuses.values()
                if s.bound is not None and s.name != definition.name
            }

        src = self.settings.source
        await check_partition_publishing(
            conn, catalog, shaped, src.publication, publish_all_tables=src.publish_all_tables
        )
        table = self.tables.changelog(
            self.settings.sink.root, definition.name, epoch=self.store.epoch
        )
        return _Prepared(definition, catalog, checked, table, column_specs(checked.shape))

    async def _damaged(
        self, prepared: _Prepared, origin: str, exc: TableDamaged
    ) -> TableState | None:
        """A shape whose table is damaged at start (``ChangelogTable.recover``): its claim
        ends durably (the table no longer holds what it claimed), then, with
        ``on_stream_gap = "resync"``, the table is moved to ``<root>/damaged/`` and
        made again, to be rebuilt from a snapshot (returns the new table's state:
        install it); otherwise the shape reports the damage and takes no part in the
        stream (None). The other shapes go on either way."""
        name = prepared.definition.name
        self.store.invalidate(name, "its table is damaged")
        await asyncio.to_thread(self.store.write_claims)
        if self.settings.source.on_stream_gap == "resync":
            aside = await asyncio.to_thread(self.tables.set_aside, prepared.table)
            log.error("table.damaged_set_aside", shape=name, error=str(exc), moved_to=str(aside))
            try:
                return await asyncio.to_thread(prepared.create)
            except Exception as again:
                exc = TableDamaged(f"shape '{name}': its table cannot be made again: {again}")
        self.statuses[name] = ShapeStatus(
            prepared.definition, origin, state=ShapeState.ERROR, error=str(exc)
        )
        log.error("table.damaged", shape=name, error=str(exc))
        return None

    def _install(self, prepared: _Prepared, origin: str, state: TableState) -> ShapeStatus:
        """Give a shape whose table exists its writer, then follow the stream behind
        its claim, or queue its backfill."""
        definition, catalog, checked = prepared.definition, prepared.catalog, prepared.checked
        bound, table, specs = checked.shape, prepared.table, prepared.specs
        name = definition.name
        writer = ShapeWriter(table, specs, self.tracker.handle_flush_notification, state=state)
        assert self.scheduler is not None
        self.scheduler.add(writer)
        status = ShapeStatus(
            definition, origin, as_text=checked.as_text, bound=bound, domains=catalog.domain_bases
        )
        self.statuses[name] = status
        claim = self.store.claim(name)
        if claim is not None:
            self.collector.add_shape(bound, writer, catalog.domain_bases, claim.fence)
            status.snapshot_lsn = claim.snapshot_lsn
            self._catch_up(status)
            log.info("shape.resumed", shape=name, committed_lsn=writer.committed_lsn)
        else:
            reason = "new shape"
            last = self.store.last_invalidation(name)
            if last is not None:
                reason = f"its claim ended: {last.reason}"
            self._queue_backfill(status, reason)
        return status

    def _queue_backfill(self, status: ShapeStatus, reason: str) -> None:
        status.state, status.error = _move(status, ShapeState.BACKFILLING), None
        status.backfill = BackfillProgress(time.time(), reason=reason)
        status.backfills_wanted += 1
        status.backfill_attempts = 0
        self._catching_up.discard(status.name)
        self._queue.put_nowait(status.name)
        log.info("shape.backfill_queued", shape=status.name, reason=reason)

    def _catch_up(self, status: ShapeStatus) -> None:
        status.state, status.error = _move(status, ShapeState.CATCHING_UP), None
        if status.backfill is not None:
            status.backfill.phase = "catching_up"
        self._catching_up.add(status.name)
        self.promote()

    def promote(self) -> None:
        """Activate the shapes whose frontier now covers their snapshot."""
        for name in list(self._catching_up):
            status = self.statuses.get(name)
            if status is None or status.state != ShapeState.CATCHING_UP:
                self._catching_up.discard(name)
                continue
            frontier = self._frontier(name)
            if frontier is None or status.snapshot_lsn is None:
                continue
            if frontier >= status.snapshot_lsn - 1:
                self._catching_up.discard(name)
                status.state = _move(status, ShapeState.ACTIVE)
                self._on_change()
                log.info("shape.active", shape=name)

    # -- changes at runtime ----------------------------------------------------------------

    def check_owners(self, names: list[str]) -> None:
        """Refuse shape names another instance on this sink root has: its table would
        have two writers."""
        mine = set(names)
        for other, folder in instance_states(self.settings.sink.root).items():
            if other == self.instance:
                continue
            taken = sorted(
                mine & {r.name for r in ShapeRegistry.read(join(folder, "shapes.json")).shapes()}
            )
            if taken:
                who = f"instance '{other}'" if other else "the unnamed instance"
                registry = join(folder, "shapes.json")
                raise ConfigError(
                    f"shape(s) {', '.join(repr(n) for n in taken)} belong to {who} on the sink "
                    f"root {self.settings.sink.root} (its registry: {registry}): "
                    "one table cannot have two writers. Name the shape otherwise here, or "
                    "remove it from that instance first"
                )

    async def add(self, definition: ShapeDefinition, *, origin: str = "api") -> ShapeStatus:
        """Validate, persist and activate a shape (its rows arrive by backfill)."""
        try:
            self.check_owners([definition.name])
        except ConfigError as exc:
            raise ShapeConflict(str(exc)) from None
        conn = await self._source()
        try:
            await validate_shape(conn, definition)  # fails before anything is persisted
            if not self.settings.source.publish_all_tables:
                await add_tables_to_publication(
                    conn,
                    self.settings.source.publication,
                    [(definition.schema_name, definition.table_name)],
                    alter=self.settings.source.create_publication,
                )
            created = self.registry.add(definition, origin=origin)  # type: ignore[arg-type]
            if not created and definition.name in self.statuses:
                return self.statuses[definition.name]
            return await self._activate(definition, origin, conn)
        finally:
            await conn.close()

    def remove(self, name: str) -> None:
        """Stop a shape (its table stays on disk), end its claim, release the flush
        boundary; a backfill running for it is cancelled."""
        registered = self.registry.get(name)
        if name not in self.statuses and registered is None:
            raise ShapeError(f"there is no shape {name!r}; see GET /v1/shapes")
        if registered is not None:
            self.registry.remove(name, origin=registered.origin)
        self._cancel_work(name)
        self.collector.remove_shape(name)
        if self.scheduler is not None:
            self.scheduler.remove(name)
        self.statuses.pop(name, None)
        self._catching_up.discard(name)
        self.store.invalidate(name, "removed")
        log.info("shape.removed", shape=name)

    async def resync(self, name: str) -> ShapeStatus:
        """Rebuild a shape from a fresh snapshot while the stream continues."""
        status = self.statuses.get(name)
        if status is None:
            raise ShapeError(f"there is no shape {name!r}; see GET /v1/shapes")
        if status.bound is None:
            raise ShapeConflict(
                f"shape {name!r} never started ({status.error}): remove it and add it again "
                "(DELETE, then POST /v1/shapes)"
            )
        self._request_backfill(status, "resync requested")
        return status

    def _request_backfill(self, status: ShapeStatus, reason: str) -> None:
        """End the shape's claim now and rebuild it (see the module docstring)."""
        name = status.name
        self.collector.remove_shape(name)
        self.store.invalidate(name, reason)
        self._cancel_work(name)
        self._queue_backfill(status, reason)

    def _cancel_work(self, name: str) -> None:
        retry = self._retries.pop(name, None)
        if retry is not None:
            retry.cancel()
        running = self._running.pop(name, None)
        if running is not None:
            running.cancel()
            log.info("backfill.cancelled", shape=name)

    async def _rebind(self, status: ShapeStatus) -> None:
        """Bind the shape to its table as the catalog has it now."""
        catalog = await self._catalog(status.definition)
        checked = check_shape(status.definition, catalog)
        name = status.definition.name
        writer = self.scheduler.writers.get(name) if self.scheduler is not None else None
        if self.statuses.get(name) is not status or writer is None:
            removed = self.statuses.get(name) is not status
            raise ShapeConflict(
                f"shape {name!r} was removed meanwhile: nothing to rebuild"
                if removed
                else f"shape {name!r} never started ({status.error}): remove it and add it "
                "again (DELETE, then POST /v1/shapes)"
            )
        status.bound, status.domains, status.as_text = (
            checked.shape,
            catalog.domain_bases,
            checked.as_text,
        )
        writer.set_columns(column_specs(checked.shape))

    async def _catalog(self, definition: ShapeDefinition) -> CatalogTable:
        """The catalog of ``definition``'s table, read after this call: the next read of
        that table, shared by every caller until it begins."""
        key = (definition.schema_name, definition.table_name)
        if key not in self._catalog_next:
            task = asyncio.ensure_future(self._read_catalog(key, definition))
            self._tasks.add(task)  # (cancelled by ``stop``: no caller may be left to)
            task.add_done_callback(self._tasks.discard)
            self._catalog_next[key] = (task, definition)
        read, began = self._catalog_next[key]
        try:
            return await asyncio.shield(read)
        except ShapeError:
            if began is definition:
                raise
            # (its message names the shape that began the read: read for this one)
            return await self._read_catalog(key, definition)

    async def _read_catalog(
        self, key: tuple[str, str], definition: ShapeDefinition
    ) -> CatalogTable:
        """Read a table's catalog for ``definition`` and for every rebind of a shape of
        that table that asked before the read began (backfills of shapes of one table
        share it: they wait for each other's reads anyway, one connection serving all)."""
        async with self._catalog_lock:
            if self._catalog_next.get(key, (None,))[0] is asyncio.current_task():
                del self._catalog_next[key]  # a rebind asking from now on reads again
            conn = self._catalog_conn
            if conn is None or conn.closed:
                conn = self._catalog_conn = await self._source()
            try:
                return await read_table(conn, definition)
            except BaseException:
                self._catalog_conn = None
                await conn.close()
                raise

    # -- backfills ------------------------------------------------------------------------------

    async def run_backfills(self, streaming: asyncio.Event) -> None:
        """Backfill queued shapes once the stream runs, ``BACKFILLS_AT_ONCE`` at a time
        (their snapshots are taken one at a time: each pauses the consumer), never two
        of one shape: a cancelled backfill still finishing its commit is awaited first."""
        await streaming.wait()
        slots = asyncio.Semaphore(BACKFILLS_AT_ONCE)
        started: dict[str, asyncio.Task[None]] = {}  # each shape's last backfill, until done
        waiting = False  # a shape taken from the queue waits for a slot

        def more_wait() -> bool:
            return waiting or not self._queue.empty()

        self._connections = SnapshotConnections(
            self.settings.source.dsn, BACKFILLS_AT_ONCE, more_wait
        )
        try:
            while True:
                name = await self._queue.get()
                previous = started.get(name)
                if previous is not None and not previous.done():
                    await asyncio.wait({previous})
                waiting = True
                await slots.acquire()
                waiting = False
                status = self.statuses.get(name)
                if (
                    status is None  # removed
                    or status.backfills_done >= status.backfills_wanted  # request served
                    or name in self._running  # runs now
                    or name in self._retries  # waits for its retry
                ):
                    slots.release()
                    continue
                task = asyncio.create_task(
                    self._backfill(name, status, status.backfills_wanted), name=f"backfill-{name}"
                )
                self._running[name] = task
                started[name] = task

                def done(t: asyncio.Task[None], name: str = name) -> None:
                    slots.release()
                    if self._running.get(name) is t:
                        del self._running[name]
                    if started.get(name) is t:
                        del started[name]

                task.add_done_callback(done)
        finally:
            for task in started.values():
                if not task.done():
                    task.cancel()
            await self._connections.close()

    async def _backfill(self, name: str, status: ShapeStatus, generation: int) -> None:
        assert self.scheduler is not None
        writer = self.scheduler.writers[name]
        writer.backfill = True
        progress = status.backfill or BackfillProgress(time.time())
        progress.started_at, progress.phase = time.time(), "snapshot"
        status.backfill = progress
        try:
            await self.scheduler.settled(name)  # an earlier definition's last round
            async with self.scheduler.exclusive(writer):
                writer.discard_buffered()
            while True:
                # bind to the table as it is now: DDL may have run since activation
                await self._rebind(status)
                bound = status.bound
                assert bound is not None
                if writer.widen_op():  # a table made when _op was int32: int64 from now
                    log.info("backfill.widens_op", shape=name)
                replace = await asyncio.to_thread(
                    writer.table.needs_replacement, writer.schema, list(bound.primary_key)
                )
                try:
                    fence, rows, partitions = await run_backfill(
                        dsn=self.settings.source.dsn,
                        shape=bound,
                        writer=writer,
                        spark=self.spark,
                        scheduler=self.scheduler,
                        paused=self._paused,
                        passed_invisible=self.collector.passed_invisible,
                        register=lambda fence: self._register(status, generation, fence),
                        progress=progress,
                        replace_schema=replace,
                        connections=self._connections,
                    )
                    break
                except CatalogMoved:
                    log.info("backfill.catalog_moved", shape=name)
        except BackfillSuperseded:
            log.info("backfill.superseded", shape=name)
            return
        except Exception as exc:  # one shape's failure must not stop the others
            self._backfill_failed(status, generation, exc)
            return
        finally:
            writer.backfill = False
        if self.statuses.get(name) is not status or generation != status.backfills_wanted:
            log.info("backfill.superseded", shape=name)  # another request came meanwhile
            return
        self.store.record_claim(name, fence, rows, partitions)
        await asyncio.to_thread(self.store.write_claims)
        status.backfills_done, status.backfill_attempts = generation, 0
        status.snapshot_lsn = fence.lsn
        self._catch_up(status)
        self._on_change()

    def _register(self, status: ShapeStatus, generation: int, fence: Any) -> bool:
        """Route the shape behind its new snapshot's fence, unless superseded."""
        name = status.name
        writer = self.scheduler.writers.get(name) if self.scheduler else None
        if self.statuses.get(name) is not status or generation != status.backfills_wanted:
            return False
        if writer is None or status.bound is None:
            return False
        self.collector.add_shape(status.bound, writer, status.domains, fence)
        return True

    def _backfill_failed(self, status: ShapeStatus, generation: int, exc: BaseException) -> None:
        name = status.name
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # parallel readers
            exc = exc.exceptions[0]
        self.collector.remove_shape(name)  # routed behind a fence no commit will follow
        self.backfill_failures += 1
        if self.statuses.get(name) is not status or generation != status.backfills_wanted:
            return
        status.backfill_attempts += 1
        if isinstance(exc, UnfitValue):  # the same snapshot would be refused again
            status.state = _move(status, ShapeState.ERROR)
            status.error = (
                f"backfill refused a value: {exc}. Not retried until the value is fixed in "
                f"Postgres and the shape resynced (tidemark shapes resync {name}), or the "
                "shape is changed or removed"
            )
            log.error("backfill.refused", shape=name, error=str(exc))
            return
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (status.backfill_attempts - 1))
        cause = failure_text(exc).strip()
        full = full_disk(self.settings.sink.root)
        if full is not None:
            cause = f"{full} ({cause})"
        status.state = _move(status, ShapeState.ERROR)
        status.error = (
            f"backfill failed (attempt {status.backfill_attempts}, retrying in {delay:.0f}s): "
            f"{cause}"
        )
        if isinstance(exc, ShapeError):  # the definition no longer fits the table
            status.error += (
                ". The shape's definition no longer fits its table: restore what it needs "
                f"(then tidemark shapes resync {name} tries at once), or remove the shape "
                f"(tidemark shapes remove {name}) and add it again as the table is now"
            )
        log.error(
            "backfill.failed",
            shape=name,
            error=cause,
            attempts=status.backfill_attempts,
            retry_in_s=delay,
            exc_info=exc if status.backfill_attempts == 1 else None,
        )

        def retry() -> None:
            self._retries.pop(name, None)
            if self.statuses.get(name) is status and status.state == ShapeState.ERROR:
                status.state = _move(status, ShapeState.BACKFILLING)
                self._queue.put_nowait(name)

        self._retries[name] = asyncio.get_running_loop().call_later(delay, retry)

    # -- what the stream reports ------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_resync(self, resync: ShapeResync) -> None:
        """The collector stopped routing a shape the stream cannot describe exactly."""
        log.warning("shape.resync_needed", shape=resync.shape, reason=resync.reason)
        status = self.statuses.get(resync.shape)
        if status is not None:
            self._request_backfill(status, resync.reason)

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
            # cannot tell whether existing rows changed: rebuild to be exact
            log.warning("shape.column_check_failed", shape=shape.name, error=str(exc))
            with_default = added
        if with_default:
            self.collector.mark_resync(
                ShapeResync(
                    shape.name,
                    f"column(s) {with_default} of {rel.namespace}.{rel.name} were added with a "
                    "default: existing rows got a value no change carried",
                )
            )

    # -- partitioned tables ------------------------------------------------------------------

    async def watch_partitions(self, every_s: float = PARTITION_CHECK_S) -> None:
        """Compare each partitioned shape's partition tree with the one its claim
        recorded, every ``every_s`` (``tidemark.shapes.partitions``)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.check_partitions()
            except psycopg.Error as exc:  # the source is away: try again next round
                log.warning("partitions.check_failed", error=str(exc))

    async def check_partitions(self) -> None:
        watched = []
        for name, status in self.statuses.items():
            claim = self.store.claim(name)
            if (
                claim is not None
                and claim.partitions is not None
                and status.bound is not None
                and name not in self._running
            ):
                watched.append((name, status, claim))
        if not watched:
            return
        conn = await self._source()
        try:
            for name, status, claim in watched:
                assert status.bound is not None and claim.partitions is not None
                await conn.execute("begin isolation level repeatable read read only")
                try:
                    members = await read_tree(conn, status.bound.relation.oid)
                    changes = tree_changes(claim.partitions, members)
                    filled = [m for m in changes.added if await self._has_rows(conn, m)]
                finally:
                    await conn.execute("rollback")
                reasons = changes.resync + [
                    f"partition {m.qualified_name} was attached with rows (or filled before "
                    "tidemark saw it)"
                    for m in filled
                ]
                if reasons:
                    if self.statuses.get(name) is status and self.store.claim(name) is claim:
                        log.warning("partitions.changed", shape=name, reasons=reasons)
                        self._request_backfill(status, "; ".join(reasons))
                elif changes.added and self.store.accept_partitions(
                    name, claim, fingerprint(members)
                ):
                    await asyncio.to_thread(self.store.write_claims)
                    log.info(
                        "partitions.added_empty",
                        shape=name,
                        partitions=[m.qualified_name for m in changes.added],
                    )
        finally:
            await conn.close()

    @staticmethod
    async def _has_rows(conn: psycopg.AsyncConnection[tuple[Any, ...]], member: Member) -> bool:
        """Whether a new partition has rows; True when that cannot be read (the resync
        that follows says why, e.g. the GRANT the partition needs)."""
        try:
            async with conn.transaction(force_rollback=True):  # a savepoint
                return await has_rows(conn, member)
        except psycopg.errors.InsufficientPrivilege:
            return True

    async def stop(self) -> None:
        """Cancel backfills and retries (shutdown)."""
        for name in list(self._running) + list(self._retries):
            self._cancel_work(name)
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._catalog_conn is not None:
            with contextlib.suppress(Exception):
                await self._catalog_conn.close()
            self._catalog_conn = None
