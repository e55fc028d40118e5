"""What the HTTP API needs of the running service: the facts it reads and the three
mutations it calls, as a protocol. ``tidemark.app.Service`` provides it and hands
itself to ``serve``; the API never imports the service, so the wiring runs one way
(``app`` -> ``api``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tidemark.config import Settings
    from tidemark.continuity.store import ContinuityStore
    from tidemark.observability import Metrics
    from tidemark.replication.client import ReplicationClient
    from tidemark.replication.monitor import ReplicationMonitor, Violation
    from tidemark.shapes.model import ShapeDefinition
    from tidemark.shapeset import ShapeStatus
    from tidemark.sink.port import TableFormat
    from tidemark.stalls import Stall
    from tidemark.stream.collector import ShapeLogCollector
    from tidemark.upkeep import CurrentKeeper
    from tidemark.writers.scheduler import FlushScheduler


@dataclass
class Progress:
    """How far the stream is: received, acknowledged (flushed and applied), durable in
    every shape, and each ready shape's frontier."""

    received_lsn: int = 0
    flushed_lsn: int = 0
    applied_lsn: int = 0
    durable_lsn: int | None = None
    frontiers: dict[str, int] = field(default_factory=dict)


class ServiceView(Protocol):
    """The service as the API sees it (``tidemark.app.Service``)."""

    settings: Settings
    metrics: Metrics
    phase: str  # starting, streaming, failed, ...
    role: str  # leader or standby
    started_at: float  # wall time
    http_port: int | None  # set by ``serve`` once it listens
    violations: list[Violation]
    store: ContinuityStore
    collector: ShapeLogCollector
    scheduler: FlushScheduler | None
    keeper: CurrentKeeper | None
    client: ReplicationClient | None
    monitor: ReplicationMonitor | None
    last_commit_at: dict[str, float]  # shape -> wall time of its last commit
    tables: TableFormat  # the sink root's table format

    @property
    def shapes(self) -> dict[str, ShapeStatus]: ...

    @property
    def registry(self) -> Any: ...

    def shape_state(self, name: str) -> tuple[str, str | None]: ...

    def frontier(self, shape: str) -> int | None: ...

    def lag_seconds(self, frontier: int) -> float: ...

    def progress(self) -> Progress: ...

    def readiness(self) -> tuple[bool, list[str]]: ...

    def stalled_shapes(self) -> list[Stall]: ...

    def acknowledgement_holder(self) -> tuple[str, int] | None: ...

    async def add_shape(self, definition: ShapeDefinition, *, origin: str = "api") -> Any: ...

    async def resync_shape(self, name: str) -> Any: ...

    async def remove_shape(self, name: str) -> None: ...
