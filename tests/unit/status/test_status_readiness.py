"""The readiness rules and the state a shape is shown in, from values alone (no
Postgres, no Spark): ``tidemark.status.readiness``."""

from __future__ import annotations

import dataclasses
import math

from tidemark.shapes.state import ShapeState
from tidemark.status.readiness import (
    FlushFailing,
    ServiceHealth,
    not_ready_reasons,
    shown_state,
)

READY = ServiceHealth(
    role="leader",
    lease_holder=None,
    phase="streaming",
    connected=True,
    last_violation=None,
    stall_grace_s=60.0,
    memory_wait_s=None,
    memory_report="",
    stalled=(),
    holder=None,
    errors={},
)


def test_a_leader_streaming_with_nothing_wrong_is_ready() -> None:
    assert not_ready_reasons(READY) == []
    # a wait for memory within the grace, and no client yet, are no reasons either
    assert not_ready_reasons(dataclasses.replace(READY, memory_wait_s=59.0)) == []
    assert not_ready_reasons(dataclasses.replace(READY, connected=None)) == []


def test_each_reason_is_named_and_says_what_to_do() -> None:
    health = dataclasses.replace(
        READY,
        phase="starting",
        connected=False,
        last_violation=("ack_beyond_durable", "slot at 0/20 past durable 0/10"),
        memory_wait_s=75.0,
        memory_report="shape big holds 900 MB",
        stalled=("slow",),
        holder=("money", 4096),
        errors={"money": "value out of range"},
    )
    reasons = not_ready_reasons(health)
    assert reasons == [
        "not streaming (phase: starting)",
        "replication connection is down",
        "invariant violated: ack_beyond_durable: slot at 0/20 past durable 0/10",
        "the stream has waited 75s for memory: shape big holds 900 MB",
        "shape slow has held the flush boundary for over 60.0s",
        "the slot's acknowledgement is held by shape money (4,096 bytes of WAL received "
        "past its frontier and retained for it): fix its error, then tidemark shapes "
        "resync money, or tidemark shapes remove money",
        "shape money is in error: value out of range",
    ]


def test_a_standby_says_who_leads_and_not_its_phase() -> None:
    standby = dataclasses.replace(READY, role="standby", phase="standby", lease_holder="b@host")
    assert not_ready_reasons(standby) == [
        "standby: another instance holds the leader lease (held by b@host)"
    ]
    unknown = dataclasses.replace(standby, lease_holder=None)
    assert not_ready_reasons(unknown) == ["standby: another instance holds the leader lease"]


def test_a_shape_is_shown_as_it_is_unless_its_flushes_fail() -> None:
    assert shown_state("s", ShapeState.ACTIVE, None, None) == (ShapeState.ACTIVE, None)
    assert shown_state("s", ShapeState.BACKFILLING, None, None) == (ShapeState.BACKFILLING, None)
    retried = FlushFailing("disk full", attempts=3, retry_in_s=4.4, refused=False)
    assert shown_state("s", ShapeState.ACTIVE, None, retried) == (
        ShapeState.ERROR,
        "flush failed (attempt 3, retrying in 4s): disk full",
    )
    late = dataclasses.replace(retried, retry_in_s=-2.0)  # (the retry is due)
    assert "retrying in 0s" in str(shown_state("s", ShapeState.ACTIVE, None, late)[1])


def test_a_refused_value_is_not_retried_and_says_how_to_unblock() -> None:
    refused = FlushFailing("value 1e400 out of range", 1, math.inf, refused=True)
    state, error = shown_state("money", ShapeState.ACTIVE, None, refused)
    assert state == ShapeState.ERROR
    assert error is not None and error.startswith("value 1e400 out of range. Not retried")
    assert "tidemark shapes resync money" in error and "tidemark shapes remove money" in error


def test_a_shape_in_error_keeps_its_own_error_over_its_writers() -> None:
    failing = FlushFailing("disk full", 1, 1.0, refused=False)
    assert shown_state("s", ShapeState.ERROR, "backfill failed", failing) == (
        ShapeState.ERROR,
        "backfill failed",
    )
