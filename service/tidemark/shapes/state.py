"""A shape's lifecycle: its states and the moves between them, in one table.

``backfilling``
    a backfill is queued or running (the shape is not routed, or routed behind the
    fence of the snapshot being taken).
``catching_up``
    the table holds a snapshot; the shape's frontier has not reached it yet.
``active``
    ready: the claim holds and the frontier covers the snapshot.
``error``
    the shape cannot be followed now: its definition does not validate, or its
    backfill failed (retried with backoff, or, for a refused value, when asked).

A shape starts in ``backfilling`` (or in ``error``, when its definition does not
validate). Every request for a backfill (a new shape, a resync asked for or needed, a
retry) moves it to ``backfilling`` from wherever it is; a committed backfill moves it
to ``catching_up``, and the frontier passing its snapshot to ``active``; a failed
backfill moves it to ``error``. ``move`` refuses anything else: a move outside the
table is a bug in the caller, not a state the API or the metrics may show.

(While a shape is ``active``, its writer's failing flushes are shown as ``error`` too,
with the writer's cause: ``Service.shape_state``. That is a view, not a move.)

Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from tidemark.errors import InvariantViolation


class ShapeState(StrEnum):
    BACKFILLING = "backfilling"
    CATCHING_UP = "catching_up"
    ACTIVE = "active"
    ERROR = "error"


_B, _C, _A, _E = (
    ShapeState.BACKFILLING,
    ShapeState.CATCHING_UP,
    ShapeState.ACTIVE,
    ShapeState.ERROR,
)

# state -> the states it may move to
TRANSITIONS: Final[Mapping[ShapeState, frozenset[ShapeState]]] = {
    _B: frozenset({_B, _C, _E}),  # requested again; snapshot committed; backfill failed
    _C: frozenset({_B, _A, _E}),  # a new request; the frontier passed the snapshot
    _A: frozenset({_B, _E}),  # a resync asked for or needed
    _E: frozenset({_B, _E}),  # a retry or a request; failed again
}

STATES: Final[tuple[ShapeState, ...]] = tuple(ShapeState)


def move(shape: str, current: ShapeState, to: ShapeState) -> ShapeState:
    """``to``, if the table allows ``current -> to`` (InvariantViolation otherwise)."""
    if to not in TRANSITIONS[current]:
        raise InvariantViolation(f"shape {shape!r} cannot move from {current} to {to}")
    return to
