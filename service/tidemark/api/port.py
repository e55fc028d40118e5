"""What the HTTP API needs of the running service: the facts it reads and the three
mutations it calls, as a protocol. ``tidemark.app.Service`` provides it and hands
itself to ``serve``; the API never imports the service, so the wiring runs one way
(``app`` -> ``api``). The facts are values (``tidemark.status.facts``), never the engine's
objects: the API cannot reach into the client, the writers or the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tidemark.status.facts import (
    CollectorFacts,
    ContinuityFacts,
    CurrentFacts,
    FlushFacts,
    Progress,
    WriterFacts,
)

if TYPE_CHECKING:
    from tidemark.observability import Metrics
    from tidemark.replication.monitor import ReplicationSample, Violation
    from tidemark.settings.config import Settings
    from tidemark.shapes.model import ShapeDefinition
    from tidemark.shapeset import ShapeStatus
    from tidemark.stalls import Stall
    from tidemark.status.history import HistoryFacts

__all__ = ["Progress", "ServiceView"]


class ServiceView(Protocol):
    """The service as the API sees it (``tidemark.app.Service``)."""

    settings: Settings
    metrics: Metrics
    phase: str  # starting, streaming, failed, ...
    role: str  # leader or standby
    started_at: float  # wall time
    http_port: int | None  # set by ``serve`` once it listens
    violations: list[Violation]
    last_commit_at: dict[str, float]  # shape -> wall time of its last commit

    @property
    def shapes(self) -> dict[str, ShapeStatus]: ...

    def registered(self, name: str) -> ShapeDefinition | None:
        """The shape's definition in the registry (also while it is being removed)."""
        ...

    def received_lsn(self) -> int | None:
        """The last WAL position received (None before the stream is connected)."""
        ...

    def writer_facts(self, name: str) -> WriterFacts | None: ...

    def update_metrics(self) -> None:
        """Set the gauges from the service's state now (before a scrape)."""
        ...

    def flush_facts(self) -> FlushFacts | None:
        """The writers together (None before they exist)."""
        ...

    def collector_facts(self) -> CollectorFacts: ...

    def current_facts(self, name: str) -> CurrentFacts | None:
        """The shape's current-state table (None when current tables are off)."""
        ...

    def continuity_facts(self, name: str) -> ContinuityFacts: ...

    def history_facts(self) -> HistoryFacts:
        """The last minutes: acknowledgement lag and rows a second, by interval."""
        ...

    def postgres_sample(self) -> ReplicationSample | None:
        """The monitor's last look at Postgres (None before the first)."""
        ...

    @property
    def monitoring(self) -> bool:
        """Whether the monitor runs (not yet while the service starts)."""
        ...

    async def wait_replayed(self, lsn: int, timeout: float) -> bool:
        """Whether Postgres's replay reaches ``lsn`` within ``timeout`` seconds (the
        monitor's wait; only once ``monitoring``)."""
        ...

    def describe_tables(self, name: str) -> dict[str, Any] | None:
        """Where the shape's tables are, read from the tables (None before its first
        commit)."""
        ...

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
