"""What an operator reads about a shape: why it is not ready, and the status numbers."""

from __future__ import annotations

from typing import Any

from tidemark.api.shape_view import not_ready_reason
from tidemark.cli import human_bytes, human_seconds


def reason(**facts: Any) -> str | None:
    base: dict[str, Any] = {
        "phase": "streaming",
        "state": "active",
        "error": None,
        "backfill": None,
        "stalled_s": None,
        "grace_s": 300.0,
    }
    return not_ready_reason(**(base | facts))


def backfill(done: int, estimated: int, chunks: int = 4) -> dict[str, Any]:
    return {
        "rows_done": done,
        "rows_estimated": estimated,
        "chunks_done": 1,
        "chunks": chunks,
        "elapsed_s": 12.3,
    }


def test_an_active_shape_of_a_streaming_service_has_no_reason() -> None:
    assert reason() is None


def test_a_queued_backfill_says_it_waits_and_a_running_one_how_far_it_is() -> None:
    assert reason(state="backfilling", backfill=None) == (
        "waiting for its backfill (a few shapes at a time, once the stream runs)"
    )
    assert reason(state="backfilling", backfill=backfill(0, 0, chunks=0)).startswith("waiting")
    assert reason(state="backfilling", backfill=backfill(1200, 5000)) == (
        "backfilling: 1,200 of about 5,000 rows copied from its snapshot so far (12s)"
    )
    # the planner's estimate is 0 for a table never analyzed: no "of about 0"
    assert reason(state="backfilling", backfill=backfill(1200, 1200)) == (
        "backfilling: 1,200 rows copied from its snapshot so far (12s)"
    )


def test_failed_and_catching_up_shapes_say_what_happened() -> None:
    assert reason(state="error", error="table public.t does not exist") == (
        "failed: table public.t does not exist"
    )
    said = reason(state="catching_up")
    assert said is not None and said.startswith("its snapshot is in the table")


def test_a_stalled_shape_and_a_service_not_streaming_are_reasons_too() -> None:
    said = reason(stalled_s=412.0)
    assert said is not None
    assert said.startswith("stalled: owes a flush and has made no progress for 412s")
    assert "monitor.stall_grace_s = 300" in said
    assert reason(phase="starting") == "the service is not streaming (phase starting)"


def test_sizes_and_durations_read_as_a_person_would_say_them() -> None:
    assert [human_bytes(n) for n in (None, 0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
        "-",
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]
    assert [human_seconds(s) for s in (None, 0.42, 59.9, 61, 3725)] == [
        "-",
        "0.4s",
        "59.9s",
        "1m 1s",
        "1h 2m",
    ]
