"""A shape's lifecycle table (``tidemark.shapes.state``): the moves the service makes
are allowed, the others refused, and every state can get back to ``active``."""

from __future__ import annotations

import pytest

from tidemark.errors import InvariantViolation
from tidemark.shapes.state import STATES, TRANSITIONS, ShapeState, move

B, C, A, E = ShapeState.BACKFILLING, ShapeState.CATCHING_UP, ShapeState.ACTIVE, ShapeState.ERROR


@pytest.mark.parametrize(
    ("current", "to"),
    [(B, C), (C, A), (A, B), (C, B), (E, B), (B, E), (B, B), (E, E), (A, E), (C, E)],
)
def test_the_moves_the_service_makes_are_allowed(current: ShapeState, to: ShapeState) -> None:
    assert move("s", current, to) is to


@pytest.mark.parametrize(("current", "to"), [(B, A), (E, A), (E, C), (A, C), (A, A)])
def test_a_shortcut_past_the_snapshot_is_refused(current: ShapeState, to: ShapeState) -> None:
    with pytest.raises(InvariantViolation, match=f"shape 's' cannot move from {current} to {to}"):
        move("s", current, to)


def test_every_state_reaches_active_and_the_names_are_the_apis() -> None:
    for start in STATES:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert A in seen, start
    assert [str(s) for s in STATES] == ["backfilling", "catching_up", "active", "error"]
    assert ShapeState.ACTIVE == "active"  # compared with the API's JSON as it is
