"""The progress rules (``tidemark.flush.progress``) on plain values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.flush import progress

lsns = st.integers(0, 2**40)


def test_processed_is_the_furthest_of_start_last_commit_and_an_idle_keepalive() -> None:
    assert progress.processed(100, None, None) == 100
    assert progress.processed(100, 300, 200) == 300
    assert progress.processed(100, 300, 900) == 900


@given(lsns, st.lists(lsns, max_size=5))
def test_acknowledgeable_stays_below_every_held_transaction(
    processed: int, held: list[int]
) -> None:
    ack = progress.acknowledgeable(processed, held)
    assert ack <= processed
    assert all(ack < h for h in held)
    assert ack == (min(processed, min(held) - 1) if held else processed)


def test_a_shape_that_owes_a_flush_is_complete_just_below_it_whatever_was_processed() -> None:
    assert progress.frontier(owed_from=500, flush_lsn=100, processed=900) == 499


def test_a_shape_that_owes_nothing_is_not_held_by_the_acknowledgement_of_others() -> None:
    # another shape in error holds the acknowledgement (flush) at 100: this one is
    # complete up to what the stream processed
    assert progress.frontier(owed_from=None, flush_lsn=100, processed=900) == 900
    # an idle keepalive acknowledged past the last commit: never below the acknowledgement
    assert progress.frontier(owed_from=None, flush_lsn=1200, processed=900) == 1200
