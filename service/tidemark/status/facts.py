"""What the running service tells its readers (the HTTP API, the metrics), as values.

``tidemark.app.Service`` builds these from its engine objects (the replication client,
the flush scheduler and its writers, the collector, the current-table keeper, the
continuity store, the monitor); the API (``tidemark.api.port.ServiceView``) and the
gauges (``tidemark.observability.refresh_metrics``) read only these, so neither reaches
into an object that moves on while it reads, and both are tested with values made by
hand. Pure: no IO, nothing but frozen dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemark.continuity.guard import StreamRecord
    from tidemark.continuity.store import Claim, Invalidation
    from tidemark.replication.monitor import ReplicationSample


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the stream is: received, acknowledged (flushed and applied), durable in
    every shape, and each ready shape's frontier."""

    received_lsn: int = 0
    flushed_lsn: int = 0
    applied_lsn: int = 0
    durable_lsn: int | None = None
    frontiers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """The replication connection (the client's counters)."""

    connected: bool
    status_updates: int
    bytes_received: int


@dataclass(frozen=True, slots=True)
class WriterFacts:
    """One shape's writer: what it committed, and what it holds."""

    committed_lsn: int | None
    rows_committed: int
    pending_rows: int  # buffered, ready to flush or in an open transaction
    pending_bytes: int  # buffered and being written


@dataclass(frozen=True, slots=True)
class FlushFacts:
    """The writers together: memory against the budget, and what the rounds did."""

    buffered_bytes: int
    memory_budget: int
    flush_age_s: float
    waiting_s: float | None  # how long the stream has waited for memory (None: not)
    backpressure_waits: int
    blocked_seconds: float
    stage_jobs: int
    spooled_bytes: int
    rounds: int
    round_shapes: int
    job_failures: int


@dataclass(frozen=True, slots=True)
class CollectorFacts:
    """The changes routed, and the streamed transactions open and ended."""

    changes: int
    open_streams: int
    streamed_commits: int
    streamed_aborts: int


@dataclass(frozen=True, slots=True)
class CurrentFacts:
    """A shape's current-state table: the LSN it is folded through, how long the oldest
    unfolded change has waited, and how many committed rows wait to be folded."""

    folded_lsn: int | None
    waited_s: float | None
    rows_waiting: int


@dataclass(frozen=True, slots=True)
class ContinuityFacts:
    """Since when the shape's table is continuous (its claim), the stream it follows,
    and the last time its claim ended."""

    claim: Claim | None
    stream: StreamRecord | None
    last_invalidation: Invalidation | None


@dataclass(frozen=True, slots=True)
class BackfillFacts:
    """A backfill's counts, as the gauges sum them."""

    chunks: int
    rows_done: int
    rows_estimated: int


@dataclass(frozen=True, slots=True)
class ServiceFacts:
    """Everything the gauges show, taken at one moment (``Service.facts``)."""

    phase: str
    progress: Progress
    stream: StreamFacts | None  # None before the replication client exists
    flush: FlushFacts | None  # None before the writers exist
    writers: Mapping[str, WriterFacts]  # empty when [metrics] per_shape is off
    lag_s: Mapping[str, float]  # each shape with a frontier (per_shape on): its lag in s
    states: Mapping[str, str]  # each shape's state as shown (``Service.shape_state``)
    backfills: Mapping[str, BackfillFacts]  # the shapes with a backfill on record
    stalled: frozenset[str]
    holder: tuple[str, int] | None  # the shape holding the acknowledgement, its bytes
    backfill_failures: int
    claim_invalidations: int
    collector: CollectorFacts
    postgres: ReplicationSample | None  # the monitor's last sample
