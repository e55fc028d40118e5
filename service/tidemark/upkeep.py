"""Keeping each shape's current-state table folded, and its tables cheap to read.

``CurrentKeeper`` runs beside the writers in the service. A shape's current table
(``TableFormat.refresh_current``, ``tidemark.sink.port``) is refreshed when
``[current] refresh_s`` passed since its last refresh and rows were committed since
(a backfill's or resync's snapshot counts: the table is then built or rebuilt from
it; so does a shape's first ``refresh_s`` after start, to find out), or when
``refresh_rows`` rows wait to be folded. The shapes due at one moment are refreshed
in one go (Delta: the small ones in one Spark job per column layout), in
the scheduler's backfill slot: only while no stream flush waits for Spark, so the
stream goes first, and in Spark's background pool, so a flush started meanwhile gets
the task slots first (``tidemark.spark.in_background``); they read committed
changelog files and never hold a flush or the acknowledgement. A shape that is not
ready (its backfill has not committed) is not refreshed: its changelog is not a whole
state yet.

The hourly upkeep (``maintain``) adds, per shape and between its flushes: changelog
retention (``[sink] changelog_retention_hours``: ``TableFormat.compact_changelog``),
vacuum of the current table (keeping the version the retained changelog starts from)
and metadata cleanup of both tables (``TableFormat.vacuum_and_clean``; Delta: log
entries older than the table's ``delta.logRetentionDuration`` and before a
checkpoint), and the upkeep gauges (files per table, log entries since the newest
checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from tidemark.sink import table_format
from tidemark.sink.port import RefreshResult, TableFormat
from tidemark.spark import in_background
from tidemark.state.durable import full_disk
from tidemark.writers.job import default_parallelism

if TYPE_CHECKING:
    from tidemark.observability import Metrics
    from tidemark.settings.config import Settings
    from tidemark.writers.scheduler import FlushScheduler

log = structlog.get_logger("tidemark.upkeep")

TICK_S = 0.5
RETRY_AFTER_S = 30.0


@dataclass(slots=True)
class _Shape:
    rows_waiting: int = 0  # committed to the changelog, not yet folded
    unfolded_since: float | None = None  # wall time of the oldest such commit
    refreshed_at: float = 0.0  # monotonic; the timer starts when tracking does
    folded_lsn: int | None = None
    failed_at: float | None = None
    was_backfilling: bool = False

    def unfolded_for(self, now: float) -> float | None:
        """How long the oldest unfolded commit has waited (None: nothing waits)."""
        return None if self.unfolded_since is None else max(0.0, now - self.unfolded_since)


class CurrentKeeper:
    def __init__(
        self,
        settings: Settings,
        spark: Any,
        scheduler: FlushScheduler,
        metrics: Metrics,
        *,
        frontier: Callable[[str], int | None],
        clock: Callable[[], float] = time.monotonic,
        tables: TableFormat | None = None,
    ) -> None:
        self.settings = settings
        self.tables = tables or table_format()
        self.spark = spark
        self.scheduler = scheduler
        self.metrics = metrics
        self.frontier = frontier  # None while the shape is not ready
        self.clock = clock
        self.shapes: dict[str, _Shape] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # files and log entries since the newest checkpoint, per shape and table kind
        self.table_stats: dict[str, dict[str, tuple[int, int]]] = {}

    @property
    def root(self) -> str:
        return self.settings.sink.root

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def on_commit(self, shape: str, rows: int) -> None:
        """A flush committed ``rows`` changelog rows for ``shape`` (nothing to fold when
        current tables are off)."""
        if not self.settings.current.enabled:
            return
        state = self.track(shape)
        if rows:
            state.rows_waiting += rows
            if state.unfolded_since is None:
                state.unfolded_since = time.time()

    def forget(self, shape: str) -> None:
        self.shapes.pop(shape, None)
        self._locks.pop(shape, None)
        for metric in (
            self.metrics.current_lag_bytes,
            self.metrics.current_lag_seconds,
            self.metrics.current_refreshes,
            self.metrics.current_refresh_failures,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(shape)
        self.table_stats.pop(shape, None)
        self._export_table_stats()

    def track(self, name: str) -> _Shape:
        """The shape's state; its series exist from then on (the table gauges NaN until
        they are measured after its first refresh or upkeep round)."""
        state = self.shapes.get(name)
        if state is None:
            # not known to be folded: looked at once its timer runs out
            state = self.shapes[name] = _Shape(1, time.time(), self.clock())
            self.metrics.current_refreshes.labels(name)
            self.metrics.current_refresh_failures.labels(name)
        return state

    def shapes_waiting(self) -> list[str]:
        """Shapes with committed rows not folded into their current table yet."""
        return [n for n, s in self.shapes.items() if s.rows_waiting]

    def due(self, name: str, now: float) -> bool:
        cfg = self.settings.current
        writer = self.scheduler.writers.get(name)
        if writer is None or self.frontier(name) is None:
            return False
        state = self.track(name)
        backfilling = bool(writer.backfill)
        if state.was_backfilling and not backfilling:
            # a snapshot committed: its rows wait to be folded (a resync: rebuilt)
            state.rows_waiting = max(state.rows_waiting, 1)
            if state.unfolded_since is None:
                state.unfolded_since = time.time()
        state.was_backfilling = backfilling
        if backfilling:
            return False
        if state.failed_at is not None and now - state.failed_at < RETRY_AFTER_S:
            return False
        if state.rows_waiting >= cfg.refresh_rows:
            return True
        return state.rows_waiting > 0 and now - state.refreshed_at >= cfg.refresh_s

    async def run(self) -> None:
        if not self.settings.current.enabled:
            return
        # a refresh killed mid-way left its Spark output (never committed) behind
        await asyncio.to_thread(self.recover_all, list(self.scheduler.writers))
        for name in list(self.scheduler.writers):
            self.track(name)
        while True:
            now = self.clock()
            due = [name for name in list(self.scheduler.writers) if self.due(name, now)]
            if due:
                await self.refresh(*due)
            self.update_gauges()
            await asyncio.sleep(TICK_S)

    async def refresh(self, *names: str) -> dict[str, RefreshResult | None]:
        """Refresh these shapes' current tables (small ones in one Spark job,
        ``TableFormat.refresh_current``); each shape's result, None where it failed (tried
        again after ``RETRY_AFTER_S``)."""
        taken = {}
        for name in names:
            state = self.track(name)
            taken[name] = (state.rows_waiting, state.unfolded_since)
            state.rows_waiting, state.unfolded_since = 0, None
        cfg = self.settings.current
        outcomes: dict[str, RefreshResult | Exception]
        try:
            async with contextlib.AsyncExitStack() as held:
                for name in sorted(names):
                    await held.enter_async_context(self.lock(name))
                await held.enter_async_context(self.scheduler.backfill_slot())
                work = asyncio.ensure_future(
                    asyncio.to_thread(
                        in_background,
                        self.spark,
                        self.tables.refresh_current,
                        self.spark,
                        self.root,
                        list(names),
                        buckets=cfg.buckets,
                        parallelism=default_parallelism(self.spark),
                        small_bytes=cfg.small_table_bytes,
                    )
                )
                try:
                    outcomes = await asyncio.shield(work)
                except asyncio.CancelledError:
                    # stopping: the thread cannot be stopped, let it end first (a
                    # second cancel, the service's last, must not cut this short)
                    while not work.done():
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait({work})
                    raise
        except Exception as exc:  # never stops the stream: tried again later
            outcomes = dict.fromkeys(names, exc)
        results: dict[str, RefreshResult | None] = {}
        for name in names:  # refresh_many has an outcome for every shape
            results[name] = self._refreshed(name, outcomes[name], taken[name])
        for name, result in results.items():
            if result is not None and not result.skipped:
                await asyncio.to_thread(self.measure, name)
        return results

    def _refreshed(
        self,
        name: str,
        outcome: RefreshResult | Exception,
        taken: tuple[int, float | None],
    ) -> RefreshResult | None:
        state = self.track(name)
        if isinstance(outcome, Exception):
            rows, since = taken
            state.rows_waiting += rows  # with what was committed meanwhile
            waiting = [t for t in (since, state.unfolded_since) if t is not None]
            state.unfolded_since = min(waiting, default=None)
            state.failed_at = self.clock()
            self.metrics.current_refresh_failures.labels(name).inc()
            log.warning(
                "current.refresh_failed",
                shape=name,
                error=f"{type(outcome).__name__}: {outcome}",
                disk=full_disk(self.root),
                exc_info=outcome,
            )
            return None
        state.failed_at = None
        state.refreshed_at = self.clock()
        state.folded_lsn = outcome.lsn
        if not outcome.skipped:
            self.metrics.current_refreshes.labels(name).inc()
            self.metrics.current_refresh_seconds.inc(outcome.seconds)
        return outcome

    def update_gauges(self) -> None:
        now = time.time()
        for name, state in self.shapes.items():
            frontier = self.frontier(name)
            if frontier is not None and state.folded_lsn is not None:
                self.metrics.current_lag_bytes.labels(name).set(max(0, frontier - state.folded_lsn))
            self.metrics.current_lag_seconds.labels(name).set(state.unfolded_for(now) or 0.0)

    # -- hourly upkeep ------------------------------------------------------------------

    async def maintain(self, name: str) -> None:
        """Changelog retention, current-table vacuum, log cleanup and the upkeep gauges
        of one shape. The caller holds the shape's upkeep lock (``lock``: no refresh
        runs) and, taken after it, the shape's flushes."""
        sink = self.settings.sink
        hours = sink.changelog_retention_hours
        if hours is not None and self.settings.current.enabled:
            await asyncio.to_thread(
                in_background,
                self.spark,
                self.tables.compact_changelog,
                self.spark,
                self.root,
                name,
                hours,
            )
        await asyncio.to_thread(
            self.tables.vacuum_and_clean, self.root, name, sink.vacuum_retention_hours
        )
        await asyncio.to_thread(self.measure, name)

    def measure(self, name: str) -> None:
        """Files and log entries since the newest checkpoint of both tables (a shape
        whose table does not exist yet gets 0)."""
        changelog, current = self.tables.folders(self.root, name)
        stats = {}
        for kind, path in (("changelog", changelog), ("current", current)):
            stats[kind] = self.tables.table_stats(path) or (0, 0)
        self.table_stats[name] = stats
        self._export_table_stats()

    def _export_table_stats(self) -> None:
        """The worst table of each kind, as the ``_max`` gauges (per shape: the API)."""
        for kind in ("changelog", "current"):
            measured = [s[kind] for s in self.table_stats.values() if kind in s]
            self.metrics.table_files_max.labels(kind).set(max((f for f, _ in measured), default=0))
            self.metrics.table_log_entries_max.labels(kind).set(
                max((e for _, e in measured), default=0)
            )

    def recover_all(self, shapes: list[str]) -> None:
        """At start: what refreshes of an earlier run left uncommitted is deleted, and
        each current table recovered (``TableFormat.recover_current``)."""
        for name in shapes:
            try:
                self.tables.recover_current(self.root, name)
            except Exception as exc:  # the refresh reports it; the stream goes on
                log.error(
                    "current.recover_failed", shape=name, error=f"{type(exc).__name__}: {exc}"
                )
