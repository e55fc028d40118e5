"""Logs and metrics.

Logs are structlog events, one event name per fact (``flush.committed``,
``slot.created``): JSON lines by default, a console renderer on a TTY. Any
string that looks like a DSN with a password is redacted before it is written.

Metrics (prometheus-client, one registry per service) are named
``tidemark_<what>_<unit>``. Positions are exported as numbers (LSNs fit a float
exactly up to 2^53, i.e. 8 PiB of WAL); lags in bytes and seconds.

A scrape stays small at 1000 shapes: every per-shape family has one series per shape
(``PER_SHAPE``, at most 12 a shape; a backfilling shape two more, ``WHILE_BACKFILLING``,
gone when its backfill ends), no ``_created`` series, and what a shape needs
only on demand (its frontier, its tables' files) is in the API, not in per-shape
series: the metrics keep per-shape lag in bytes and seconds and, across shapes, the
worst table's files. ``[metrics] per_shape = false`` drops the per-shape families for
deployments that chart the totals only.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

from tidemark import version as package_version
from tidemark.conninfo import redact_dsn
from tidemark.shapes.state import STATES, ShapeState

if TYPE_CHECKING:
    from tidemark.status.facts import ServiceFacts

# one ``_created`` series per counter and label set doubles the counters' series for
# nothing a dashboard or alert uses
disable_created_metrics()


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event.items():
        if isinstance(value, str) and ("://" in value or "password" in value.lower()):
            event[key] = redact_dsn(value)
    return event


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Route structlog (and stdlib logging) to stderr, as JSON or for a console."""
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    numeric = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # sys.stderr looked up at each use, not bound once (it may be replaced later)
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    for noisy in ("py4j", "pyspark", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _Off:
    """A per-shape family switched off (``[metrics] per_shape = false``): every call a
    no-op, so the code that keeps it need not ask."""

    def labels(self, *_: Any) -> _Off:
        return self

    def set(self, _: float) -> None:
        pass

    def inc(self, _: float = 1) -> None:
        pass

    def remove(self, *_: Any) -> None:
        pass


OFF: Any = _Off()


class Metrics:
    """Every metric tidemark exports, in one registry. ``per_shape``: whether the
    families labelled by shape exist (``PER_SHAPE``)."""

    PER_SHAPE = (
        "tidemark_shape_lag_bytes",
        "tidemark_shape_lag_seconds",
        "tidemark_shape_pending_rows",
        "tidemark_shape_pending_bytes",
        "tidemark_shape_stalled",
        "tidemark_shape_failing",
        "tidemark_changes_total",
        "tidemark_commits_total",
        "tidemark_current_lag_bytes",
        "tidemark_current_lag_seconds",
        "tidemark_current_refreshes_total",
        "tidemark_current_refresh_failures_total",
    )
    #: labelled by shape too, but only while the shape backfills (removed when it ends):
    #: a steady state costs nothing, a backfill two series
    WHILE_BACKFILLING = (
        "tidemark_shape_backfill_rows_done",
        "tidemark_shape_backfill_rows_estimated",
    )

    def __init__(self, per_shape: bool = True, version: str = "") -> None:
        r = self.registry = CollectorRegistry()
        self.per_shape = per_shape
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, fds

        def by_shape(kind: Any, name: str, documentation: str) -> Any:
            return kind(name, documentation, ["shape"], registry=r) if per_shape else OFF

        self.build_info = Gauge(
            "tidemark_build_info",
            "1, labelled with tidemark's version and its Python and pyspark versions",
            ["version", "python", "pyspark"],
            registry=r,
        )
        self.build_info.labels(version or package_version(), _python(), _pyspark()).set(1)
        # positions
        self.received_lsn = Gauge("tidemark_received_lsn", "Last WAL position received", registry=r)
        self.flushed_lsn = Gauge(
            "tidemark_flushed_lsn", "WAL position acknowledged as flushed (durable)", registry=r
        )
        self.applied_lsn = Gauge(
            "tidemark_applied_lsn", "WAL position visible to readers", registry=r
        )
        self.pg_replay_lsn = Gauge(
            "tidemark_pg_replay_lsn", "replay_lsn Postgres reports for our walsender", registry=r
        )
        self.pg_confirmed_flush_lsn = Gauge(
            "tidemark_pg_confirmed_flush_lsn", "The slot's confirmed_flush_lsn", registry=r
        )
        self.pg_current_wal_lsn = Gauge(
            "tidemark_pg_current_wal_lsn", "pg_current_wal_lsn() on the source", registry=r
        )
        self.replication_lag_bytes = Gauge(
            "tidemark_replication_lag_bytes",
            "Source WAL end minus the slot's confirmed_flush_lsn",
            registry=r,
        )
        self.replication_lag_seconds = Gauge(
            "tidemark_replication_lag_seconds",
            "replay_lag Postgres reports for our walsender",
            registry=r,
        )
        self.slot_retained_wal_bytes = Gauge(
            "tidemark_slot_retained_wal_bytes",
            "WAL the slot keeps: current WAL LSN minus restart_lsn",
            registry=r,
        )
        self.slot_safe_wal_size_bytes = Gauge(
            "tidemark_slot_safe_wal_size_bytes",
            "Bytes of WAL that can still be written before the slot is lost (-1: unlimited)",
            registry=r,
        )
        self.slot_wal_status = Gauge(
            "tidemark_slot_wal_status",
            "1 for the slot's current wal_status",
            ["status"],
            registry=r,
        )
        # shapes
        self.shape_lag_bytes = by_shape(
            Gauge, "tidemark_shape_lag_bytes", "Received LSN minus a shape's frontier"
        )
        self.shape_lag_seconds = by_shape(
            Gauge,
            "tidemark_shape_lag_seconds",
            "How long the oldest received transaction past a shape's frontier has waited",
        )
        self.shape_pending_rows = by_shape(
            Gauge, "tidemark_shape_pending_rows", "Rows buffered for a shape, not yet committed"
        )
        self.shape_pending_bytes = by_shape(
            Gauge, "tidemark_shape_pending_bytes", "Bytes buffered for a shape, not yet committed"
        )
        self.shape_stalled = by_shape(
            Gauge,
            "tidemark_shape_stalled",
            "1 when a shape holds the flush boundary past the grace period",
        )
        self.shapes_stalled = Gauge(
            "tidemark_shapes_stalled",
            "Shapes holding the flush boundary past the grace period",
            registry=r,
        )
        self.shapes = Gauge("tidemark_shapes", "Shapes by state", ["state"], registry=r)
        self.changes = by_shape(
            Counter, "tidemark_changes_total", "Change rows committed to a shape's table"
        )
        self.changes_by_kind = Counter(
            "tidemark_committed_changes_total",
            "Change rows committed to shape tables, by kind (insert, update, delete, truncate)",
            ["kind"],
            registry=r,
        )
        self.commits = by_shape(
            Counter, "tidemark_commits_total", "Stream commits to a shape's table"
        )
        self.commit_duration = Histogram(
            "tidemark_commit_duration_seconds",
            "Time to write and commit one batch (Spark job and table commit)",
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.ack_lag_seconds = Histogram(
            "tidemark_ack_lag_seconds",
            "From a transaction's arrival to the acknowledgement covering it",
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        # stream
        self.transactions = Counter(
            "tidemark_transactions_total", "Source transactions received", registry=r
        )
        self.source_changes = Counter(
            "tidemark_source_changes_total", "Source row changes received", registry=r
        )
        self.received_bytes = Counter(
            "tidemark_received_bytes_total",
            "Replication bytes received (XLogData messages, headers included)",
            registry=r,
        )
        self.decode_errors = Counter(
            "tidemark_decode_errors_total", "Messages that could not be decoded", registry=r
        )
        self.unknown_type_values = Gauge(
            "tidemark_unknown_type_values",
            "Values of types without an exact mapping, kept as text",
            registry=r,
        )
        self.reconnects = Counter(
            "tidemark_reconnects_total", "Replication connection re-establishments", registry=r
        )
        self.status_updates = Counter(
            "tidemark_status_updates_total", "Standby status updates sent", registry=r
        )
        self.invariant_violations = Counter(
            "tidemark_invariant_violations_total",
            "Checks against Postgres that failed (e.g. ack beyond durable)",
            ["kind"],
            registry=r,
        )
        self.maintenance_failures = Counter(
            "tidemark_maintenance_failures_total",
            "Compactions or vacuums that failed (retried at the next round; the log names "
            "the shape)",
            registry=r,
        )
        # current-state tables and table upkeep
        self.current_refreshes = by_shape(
            Counter,
            "tidemark_current_refreshes_total",
            "Refreshes of a shape's current-state table (changelog rows folded into it)",
        )
        self.current_refresh_failures = by_shape(
            Counter,
            "tidemark_current_refresh_failures_total",
            "Refreshes of a current-state table that failed (tried again later)",
        )
        self.current_refresh_seconds = Counter(
            "tidemark_current_refresh_seconds_total",
            "Time spent refreshing current-state tables (a refresh of several shapes in one "
            "Spark job counts once)",
            registry=r,
        )
        self.current_lag_bytes = by_shape(
            Gauge,
            "tidemark_current_lag_bytes",
            "WAL between a shape's frontier and the LSN its current-state table is folded through",
        )
        self.current_lag_seconds = by_shape(
            Gauge,
            "tidemark_current_lag_seconds",
            "Age of the oldest committed change not yet folded into the current-state table",
        )
        self.table_files_max = Gauge(
            "tidemark_table_files_max",
            "Active data files of the shape table with the most (table: changelog or "
            "current; measured at each upkeep round; GET /v1/shapes/{name} has each's)",
            ["table"],
            registry=r,
        )
        self.table_log_entries_max = Gauge(
            "tidemark_table_log_entries_since_checkpoint_max",
            "Delta log entries a reader replays after the newest checkpoint, in the shape "
            "table with the most",
            ["table"],
            registry=r,
        )
        for kind in ("changelog", "current"):  # NaN until the first upkeep round measures
            self.table_files_max.labels(kind).set(float("nan"))
            self.table_log_entries_max.labels(kind).set(float("nan"))
        self.flush_failures = Counter(
            "tidemark_flush_failures_total",
            "Flush or staging jobs that failed (retried with backoff)",
            registry=r,
        )
        self.backfill_failures = Counter(
            "tidemark_backfill_failures_total",
            "Backfills that failed (retried with backoff)",
            registry=r,
        )
        self.acknowledgement_held = Gauge(
            "tidemark_acknowledgement_held_bytes",
            "Bytes of received WAL past the frontier of the shape in error that holds the "
            "slot's acknowledgement (label held_by: that shape; no series when none does)",
            ["held_by"],
            registry=r,
        )
        self.shape_failing = by_shape(
            Gauge,
            "tidemark_shape_failing",
            "1 while a shape's flushes or backfill fail (retried; see /v1/shapes)",
        )
        # backfills: what runs, what waits, how far
        self.backfills_running = Gauge(
            "tidemark_backfills_running", "Backfills copying their snapshot now", registry=r
        )
        self.backfills_waiting = Gauge(
            "tidemark_backfills_waiting",
            "Shapes waiting for their backfill to start (a few run at a time)",
            registry=r,
        )
        self.backfill_rows_done = Gauge(
            "tidemark_backfill_rows_done",
            "Rows the running backfills have copied from their snapshots",
            registry=r,
        )
        self.backfill_rows_estimated = Gauge(
            "tidemark_backfill_rows_estimated",
            "Rows the running backfills' snapshots hold, as the catalog estimates them",
            registry=r,
        )
        self.shape_backfill_done = by_shape(
            Gauge,
            "tidemark_shape_backfill_rows_done",
            "Rows a shape's backfill has copied from its snapshot (only while it backfills)",
        )
        self.shape_backfill_estimated = by_shape(
            Gauge,
            "tidemark_shape_backfill_rows_estimated",
            "Rows a backfilling shape's snapshot holds, as the catalog estimates them "
            "(only while it backfills)",
        )
        self.backfilling: set[str] = set()  # the shapes with backfill series now
        self.claim_invalidations = Counter(
            "tidemark_claim_invalidations_total",
            "Shape claims ended (removed, resync, stream gap): each is rebuilt",
            registry=r,
        )
        self.buffered_bytes = Gauge(
            "tidemark_buffered_bytes", "Bytes buffered across all writers", registry=r
        )
        self.backpressure_waits = Counter(
            "tidemark_backpressure_waits_total", "Times the stream waited for memory", registry=r
        )
        self.memory_budget = Gauge(
            "tidemark_memory_budget_bytes",
            "The budget tidemark_buffered_bytes stays under",
            registry=r,
        )
        self.blocked_seconds = Counter(
            "tidemark_stream_blocked_seconds_total",
            "Time the replication reader waited for memory (staging or flush jobs)",
            registry=r,
        )
        self.stage_jobs = Counter(
            "tidemark_stage_jobs_total",
            "Jobs that wrote open transactions' rows out of memory (staged or spooled)",
            registry=r,
        )
        self.flush_age = Gauge(
            "tidemark_flush_age_seconds",
            "How old a shape's oldest committed row gets before it is flushed: follows"
            " recent flush jobs' duration between flush.min_age_s and flush.max_age_s",
            registry=r,
        )
        self.flush_rounds = Counter(
            "tidemark_flush_rounds_total",
            "Spark jobs that wrote the batches of several shapes at once (flush rounds)",
            registry=r,
        )
        self.round_batches = Counter(
            "tidemark_flush_round_batches_total",
            "Shape batches written by flush rounds (divided by the rounds: shapes per job)",
            registry=r,
        )
        self.spooled_bytes = Counter(
            "tidemark_spooled_bytes_total",
            "Parquet bytes spooled for transactions Postgres streams before their commit",
            registry=r,
        )
        self.open_streamed = Gauge(
            "tidemark_open_streamed_transactions",
            "Transactions Postgres is streaming (begun, not yet committed or aborted)",
            registry=r,
        )
        self.streamed_transactions = Counter(
            "tidemark_streamed_transactions_total",
            "Streamed transactions by outcome",
            ["outcome"],
            registry=r,
        )
        self.streaming = Gauge(
            "tidemark_streaming", "1 while the replication stream is up", registry=r
        )
        self.up = Gauge("tidemark_up", "1 while the service runs", registry=r)
        self.leader = Gauge(
            "tidemark_leader",
            "1 while this instance holds the leader lease (streams and writes), 0 on a standby",
            registry=r,
        )
        # series that exist from the start, so rate()/increase() and alerts see them
        from tidemark.replication.monitor import VIOLATION_KINDS

        for kind in VIOLATION_KINDS:
            self.invariant_violations.labels(kind)
        # Postgres's view is unknown until the monitor's first sample: NaN, not 0
        for gauge in (
            self.pg_replay_lsn,
            self.pg_confirmed_flush_lsn,
            self.pg_current_wal_lsn,
            self.replication_lag_bytes,
            self.replication_lag_seconds,
            self.slot_retained_wal_bytes,
            self.slot_safe_wal_size_bytes,
        ):
            gauge.set(float("nan"))


_WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


def _backfill_series(m: Metrics, facts: ServiceFacts) -> None:
    """Each backfilling shape's rows done and estimated; a shape's two series go when
    its backfill ends (or the shape does)."""
    now = set()
    for name, state in facts.states.items():
        backfill = facts.backfills.get(name)
        if state != ShapeState.BACKFILLING or backfill is None:
            continue
        now.add(name)
        m.shape_backfill_done.labels(name).set(backfill.rows_done)
        m.shape_backfill_estimated.labels(name).set(
            max(backfill.rows_estimated, backfill.rows_done)
        )
    for name in m.backfilling - now:
        m.shape_backfill_done.remove(name)
        m.shape_backfill_estimated.remove(name)
    m.backfilling = now


def refresh_metrics(m: Metrics, facts: ServiceFacts) -> None:
    """Copy the service's state, taken as values (``Service.facts``), into the gauges
    (``Service.update_metrics``, before each scrape)."""
    from tidemark.pgoutput.values import unknown_type_counts

    progress = facts.progress
    m.received_lsn.set(progress.received_lsn)
    m.flushed_lsn.set(progress.flushed_lsn)
    m.applied_lsn.set(progress.applied_lsn)
    stream = facts.stream
    if stream is not None:
        m.streaming.set(1 if stream.connected and facts.phase == "streaming" else 0)
        _set_counter(m.status_updates, stream.status_updates)
        _set_counter(m.received_bytes, stream.bytes_received)
    flush = facts.flush
    if flush is not None:
        m.buffered_bytes.set(flush.buffered_bytes)
        m.memory_budget.set(flush.memory_budget)
        m.flush_age.set(flush.flush_age_s)
        _set_counter(m.backpressure_waits, flush.backpressure_waits)
        _set_counter(m.blocked_seconds, flush.blocked_seconds)
        _set_counter(m.stage_jobs, flush.stage_jobs)
        _set_counter(m.flush_rounds, flush.rounds)
        _set_counter(m.round_batches, flush.round_shapes)
        _set_counter(m.spooled_bytes, flush.spooled_bytes)
        _set_counter(m.flush_failures, flush.job_failures)
    if m.per_shape:
        for name, writer in facts.writers.items():
            m.shape_pending_rows.labels(name).set(writer.pending_rows)
            m.shape_pending_bytes.labels(name).set(writer.pending_bytes)
        for name, frontier in progress.frontiers.items():
            m.shape_lag_bytes.labels(name).set(max(0, progress.received_lsn - frontier))
            m.shape_lag_seconds.labels(name).set(facts.lag_s.get(name, 0.0))
    stalled = facts.stalled
    m.shapes_stalled.set(len(stalled))
    holder = facts.holder
    m.acknowledgement_held.clear()
    if holder is not None:
        m.acknowledgement_held.labels(holder[0]).set(holder[1])
    states: dict[str, int] = dict.fromkeys(map(str, STATES), 0)
    running = waiting = done = estimated = 0
    for name, state in facts.states.items():
        states[state] = states.get(state, 0) + 1
        if m.per_shape:
            m.shape_stalled.labels(name).set(1 if name in stalled else 0)
            m.shape_failing.labels(name).set(1 if state == ShapeState.ERROR else 0)
        if state != ShapeState.BACKFILLING:
            continue
        backfill = facts.backfills.get(name)
        if backfill is None or (backfill.chunks == 0 and backfill.rows_done == 0):
            waiting += 1
        else:
            running += 1
            done += backfill.rows_done
            estimated += max(backfill.rows_estimated, backfill.rows_done)
    if m.per_shape:
        _backfill_series(m, facts)
    m.backfills_running.set(running)
    m.backfills_waiting.set(waiting)
    m.backfill_rows_done.set(done)
    m.backfill_rows_estimated.set(estimated)
    _set_counter(m.backfill_failures, facts.backfill_failures)
    _set_counter(m.claim_invalidations, facts.claim_invalidations)
    for state, count in states.items():
        m.shapes.labels(state).set(count)
    collector = facts.collector
    _set_counter(m.source_changes, collector.changes)
    m.open_streamed.set(collector.open_streams)
    _set_counter(m.streamed_transactions.labels("committed"), collector.streamed_commits)
    _set_counter(m.streamed_transactions.labels("aborted"), collector.streamed_aborts)
    m.unknown_type_values.set(sum(unknown_type_counts().values()))
    sample = facts.postgres
    if sample is not None:
        m.pg_current_wal_lsn.set(sample.current_wal_lsn)
        if sample.replay_lsn is not None:
            m.pg_replay_lsn.set(sample.replay_lsn)
        if sample.confirmed_flush_lsn is not None:
            m.pg_confirmed_flush_lsn.set(sample.confirmed_flush_lsn)
        if sample.lag_bytes is not None:
            m.replication_lag_bytes.set(sample.lag_bytes)
        if sample.replay_lag_s is not None:
            m.replication_lag_seconds.set(sample.replay_lag_s)
        if sample.retained_wal_bytes is not None:
            m.slot_retained_wal_bytes.set(sample.retained_wal_bytes)
        m.slot_safe_wal_size_bytes.set(-1 if sample.safe_wal_size is None else sample.safe_wal_size)
        for status in _WAL_STATUSES:
            m.slot_wal_status.labels(status).set(1 if sample.wal_status == status else 0)


def _python() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def _pyspark() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError:  # pragma: no cover - pyspark is a dependency
        return "unknown"


def _set_counter(counter: Counter, value: float) -> None:
    """Move a counter up to ``value`` (our own stats are the source of truth)."""
    current = counter._value.get()
    if value > current:
        counter.inc(value - current)
