"""The rules that turn the service's state into what a user reads: the state a shape
is shown in, and why the service is not ready. Pure: values in, values out; no clock
(times are given).

``shown_state``: a shape's own state (``tidemark.shapes.state``), except that an active
shape whose writer's flushes fail is shown in ``error`` with the writer's cause: retried
(the attempt and when the next one comes), or, for a value its lake column cannot hold,
not retried until the shape is resynced, changed or removed (the acknowledgement waits
for it; the other shapes go on). A view, not a move: the shape's own state stays.

``not_ready_reasons``: ready means streaming as the leader, connected, nothing violated,
no shape stalled, failed or holding the acknowledgement, and the stream not waiting for
memory longer than the stall grace. A shape being backfilled is normal operation, not a
reason. Each reason says what is wrong and, where there is one, what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidemark.shapes.state import ShapeState


@dataclass(frozen=True, slots=True)
class FlushFailing:
    """A shape's writer's flushes fail (``writers.writer.JobFailure``, as values)."""

    error: str
    attempts: int
    retry_in_s: float  # until the next attempt (inf: not retried)
    refused: bool  # a value the lake column cannot hold


def shown_state(
    name: str, state: ShapeState, error: str | None, failing: FlushFailing | None
) -> tuple[str, str | None]:
    """The state and error a user sees for shape ``name``."""
    if failing is None or state == ShapeState.ERROR:
        return state, error
    if failing.refused:
        return ShapeState.ERROR, (
            f"{failing.error}. Not retried: the same rows would be refused again. "
            "Until the shape is resynced, changed or removed, the slot's "
            "acknowledgement waits for it (the other shapes go on). Fix the value "
            f"in Postgres and resync (tidemark shapes resync {name}), or remove the "
            f"shape (tidemark shapes remove {name})"
        )
    return ShapeState.ERROR, (
        f"flush failed (attempt {failing.attempts}, retrying in "
        f"{max(0.0, failing.retry_in_s):.0f}s): {failing.error}"
    )


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """What readiness is decided on, taken at one moment."""

    role: str  # leader or standby
    lease_holder: str | None  # who holds the lease (a standby's view), described
    phase: str
    connected: bool | None  # the replication connection (None: no client yet)
    last_violation: tuple[str, str] | None  # (kind, message)
    stall_grace_s: float
    memory_wait_s: float | None  # how long the stream has waited for memory
    memory_report: str  # what holds the memory, when it waits
    stalled: Iterable[str]  # shapes holding the flush boundary past the grace
    holder: tuple[str, int] | None  # the shape in error holding the acknowledgement
    errors: Mapping[str, str | None]  # shapes shown in error, with their errors


def not_ready_reasons(health: ServiceHealth) -> list[str]:
    """Why the service is not ready (empty: ready)."""
    h = health
    reasons = []
    if h.role == "standby":
        by = f" (held by {h.lease_holder})" if h.lease_holder else ""
        reasons.append(f"standby: another instance holds the leader lease{by}")
    elif h.phase != "streaming":
        reasons.append(f"not streaming (phase: {h.phase})")
    if h.connected is False:
        reasons.append("replication connection is down")
    if h.last_violation is not None:
        kind, message = h.last_violation
        reasons.append(f"invariant violated: {kind}: {message}")
    grace = h.stall_grace_s
    if h.memory_wait_s is not None and h.memory_wait_s > grace:
        reasons.append(
            f"the stream has waited {h.memory_wait_s:.0f}s for memory: {h.memory_report}"
        )
    for name in h.stalled:
        reasons.append(f"shape {name} has held the flush boundary for over {grace}s")
    if h.holder is not None:
        shape, retained = h.holder
        reasons.append(
            f"the slot's acknowledgement is held by shape {shape} ({retained:,} bytes of "
            f"WAL received past its frontier and retained for it): fix its error, then "
            f"tidemark shapes resync {shape}, or tidemark shapes remove {shape}"
        )
    for name, error in h.errors.items():
        reasons.append(f"shape {name} is in error: {error}")
    return reasons
