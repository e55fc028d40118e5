"""What the API says about a shape: its definition, state, and what an operator asks
first: is it ready, and if not, why; how far behind is it (bytes and seconds); how many
rows did it get; when did it last commit; how far its current-state table is folded.

``not_ready_reason`` is pure (the sentence an operator reads, from the facts); ``shape_json``
gathers the facts from the running service.

Rows: ``rows_backfilled`` is what the shape's last backfill wrote (its snapshot; kept
with its claim, so it survives restarts), ``rows_committed`` the change rows the stream
committed since this process started. ``last_commit`` is the later of the last stream
commit and the backfill's commit. ``continuity`` says since when and from which
snapshot the table is continuous, on which stream, and the last time its claim ended.

Values on the wire have one form each: an LSN is ``{"lsn": "16/B374D848", "value": n}``
(``lsn_json``); a point in time is an ISO 8601 UTC string to the millisecond
(``2026-11-27T05:00:00.123Z``, ``iso_time``) with its Unix time in seconds beside it:
``{"at": ..., "epoch": ...}`` for an event (``time_json``), ``<name>_epoch`` for a
member named after the time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tidemark.lsn import lsn_json
from tidemark.shapes.state import STATES, ShapeState

if TYPE_CHECKING:
    from tidemark.api.port import ServiceView
    from tidemark.stalls import Stall
    from tidemark.status.facts import ContinuityFacts, CurrentFacts


# what ``state`` can be (``ShapeStatus.state``, or ``error`` while flushes fail)
SHAPE_STATES = tuple(str(s) for s in STATES)


def epoch(ts: float) -> float:
    """Unix time to the millisecond, the same millisecond ``iso_time`` writes
    (``round(ts, 3)`` can round the other way from ``round(ts * 1000)``)."""
    return round(ts * 1000) / 1000


def iso_time(ts: float) -> str:
    """Unix time as ISO 8601 UTC to the millisecond: ``2026-11-27T05:00:00.123Z``."""
    millis = round(ts * 1000)
    seconds, ms = divmod(millis, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def time_json(ts: float | None, **more: Any) -> dict[str, Any] | None:
    """An event's time: ``{"at": iso, "epoch": seconds, **more}`` (None: never)."""
    return None if ts is None else {"at": iso_time(ts), "epoch": epoch(ts), **more}


def not_ready_reason(
    *,
    phase: str,
    state: str,
    error: str | None,
    backfill: dict[str, Any] | None,
    stalled_s: float | None,
    grace_s: float,
) -> str | None:
    """Why the shape is not ready, or what holds it back; None when all is well."""
    if state == ShapeState.BACKFILLING:
        why = f" ({backfill['reason']})" if backfill and backfill.get("reason") else ""
        if not backfill or (backfill["chunks"] == 0 and backfill["rows_done"] == 0):
            return f"waiting for its backfill{why} (a few shapes at a time, once the stream runs)"
        done, estimated = backfill["rows_done"], backfill["rows_estimated"]
        of = f" of about {estimated:,}" if estimated > done else ""
        return (
            f"backfilling: {done:,}{of} rows copied from its snapshot so far "
            f"({backfill['elapsed_s']:.0f}s)"
        )
    if state == ShapeState.CATCHING_UP:
        return (
            "its snapshot is in the table; waiting for the stream to be processed and "
            "committed past it before it has a frontier"
        )
    if state == ShapeState.ERROR:
        return f"failed: {error}"
    if phase != "streaming":
        return f"the service is not streaming (phase {phase})"
    if stalled_s is not None:
        return (
            f"stalled: owes a flush and has made no progress for {stalled_s:.0f}s "
            f"(monitor.stall_grace_s = {grace_s:g}); tidemark cannot acknowledge WAL past it"
        )
    return None


def shape_json(
    service: ServiceView, name: str, stalls: dict[str, Stall] | None = None
) -> dict[str, Any]:
    """One shape as ``GET /v1/shapes/{name}`` shows it (``stalls``: computed once per
    request when listing every shape)."""
    now, mono = time.time(), time.monotonic()
    status = service.shapes[name]
    writer = service.writer_facts(name)
    if stalls is None:
        stalls = {s.name: s for s in service.stalled_shapes()}
    stall = stalls.get(name)
    d = status.definition
    frontier = service.frontier(name)
    received = service.received_lsn()
    continuity = service.continuity_facts(name)
    record = continuity.claim
    commits = [t for t in (service.last_commit_at.get(name), record and record.since) if t]
    last_commit = max(commits) if commits else None
    state, error = service.shape_state(name)
    backfill = (
        status.backfill.as_json()
        if status.state != ShapeState.ACTIVE and status.backfill is not None
        else None
    )
    return {
        "name": name,
        "table": d.table,
        "where": d.where,
        "columns": list(d.columns) if d.columns else None,
        "replica": d.replica,
        "origin": status.origin,
        "state": state,
        "error": error,
        "ready": state == ShapeState.ACTIVE,
        "reason": not_ready_reason(
            phase=service.phase,
            state=state,
            error=error,
            backfill=backfill,
            stalled_s=None if stall is None else stall.seconds(mono),
            grace_s=service.settings.monitor.stall_grace_s,
        ),
        "stalled": stall is not None,
        "frontier": lsn_json(frontier),
        "lag_bytes": None if frontier is None or received is None else max(0, received - frontier),
        "lag_s": None if frontier is None else round(service.lag_seconds(frontier), 3),
        "committed": lsn_json(writer.committed_lsn if writer else None),
        "rows_backfilled": record.rows if record else None,
        "rows_committed": writer.rows_committed if writer else 0,
        "pending_rows": writer.pending_rows if writer else 0,
        "last_commit": None
        if last_commit is None
        else time_json(last_commit, age_s=round(max(0.0, now - last_commit), 1)),
        "columns_as_text": [{"column": c, "type": t} for c, t in status.as_text],
        "backfill": backfill,
        "continuity": continuity_json(continuity),
        "current": current_json(service.current_facts(name), frontier),
    }


def current_json(current: CurrentFacts | None, frontier: int | None) -> dict[str, Any] | None:
    """The shape's current-state table: the LSN it is folded through, how far that is
    behind the frontier, and how long the oldest unfolded change has waited."""
    if current is None:
        return None
    folded = current.folded_lsn
    return {
        "folded": lsn_json(folded),
        "lag_bytes": None if folded is None or frontier is None else max(0, frontier - folded),
        "lag_s": None if current.waited_s is None else round(current.waited_s, 1),
        "rows_waiting": current.rows_waiting,
    }


def continuity_json(facts: ContinuityFacts) -> dict[str, Any]:
    """Since when, and from which stream position, the shape's table is continuous;
    the stream it follows; and the last time its claim ended, and why."""
    claim, stream, last = facts.claim, facts.stream, facts.last_invalidation
    return {
        "since": None if claim is None else iso_time(claim.since),
        "since_epoch": None if claim is None else epoch(claim.since),
        "from": lsn_json(None if claim is None else claim.snapshot_lsn),
        "stream": None
        if stream is None
        else {
            "system_id": stream.system_id,
            "timeline": stream.timeline,
            "slot": stream.slot,
            "epoch": stream.epoch,
        },
        "last_invalidation": None if last is None else time_json(last.at, reason=last.reason),
    }
