from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.writers.cadence import BALANCE_MIN_SHAPES, Cadence, round_share


def test_before_any_job_the_age_is_the_lower_bound() -> None:
    assert Cadence().age_s(0.25, 1.0) == 0.25


def test_quick_jobs_keep_the_age_at_its_minimum_and_slow_ones_raise_it_to_the_maximum() -> None:
    cadence = Cadence()
    for _ in range(5):
        cadence.observe(0.1)
    assert cadence.age_s(0.25, 1.0) == 0.25
    cadence.observe(0.6)
    assert 0.25 < cadence.age_s(0.25, 1.0) < 0.6  # smoothed: one slow job moves it part way
    for _ in range(10):
        cadence.observe(4.0)
    assert cadence.age_s(0.25, 1.0) == 1.0
    for _ in range(20):
        cadence.observe(0.4)
    assert abs(cadence.age_s(0.25, 1.0) - 0.4) < 0.01  # follows the jobs back down


def test_a_minimum_not_below_the_maximum_or_none_fixes_the_age() -> None:
    cadence = Cadence()
    cadence.observe(0.05)
    assert cadence.age_s(None, 60.0) == 60.0
    assert cadence.age_s(2.0, 0.5) == 0.5
    cadence.observe(10.0)
    assert cadence.age_s(0.5, 0.5) == 0.5


@given(
    st.lists(st.floats(min_value=0.0, max_value=1e4), max_size=30),
    st.floats(min_value=1e-3, max_value=100.0),
    st.floats(min_value=1e-3, max_value=100.0),
)
def test_the_age_stays_within_its_bounds(jobs: list[float], low: float, high: float) -> None:
    cadence = Cadence()
    for seconds in jobs:
        cadence.observe(seconds)
    age = cadence.age_s(low, high)
    assert min(low, high) <= age <= high


def test_a_round_takes_every_candidate_when_nothing_commits_or_the_shapes_are_few() -> None:
    assert round_share(900, 0) == 900
    assert round_share(120, 60) == 120  # 180 shapes in all: below the minimum
    assert round_share(300, 400) == 300  # no more than the set that commits


def test_uneven_rounds_become_even_within_two_rounds() -> None:
    # 1000 shapes, all with rows by the time a round forms: the candidates are the
    # shapes that do not commit the previous round's batches
    for first in (100, 30, 700, 999):
        committing, sizes = first, []
        for _ in range(6):
            committing = round_share(1000 - committing, committing)
            sizes.append(committing)
        assert all(abs(size - 500) <= 1 for size in sizes[2:]), (first, sizes)


@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=0, max_value=5000))
def test_a_round_takes_at_least_half_and_at_most_all(candidates: int, committing: int) -> None:
    take = round_share(candidates, committing)
    assert (candidates + 1) // 2 <= take <= candidates
    if candidates + committing < BALANCE_MIN_SHAPES or committing == 0:
        assert take == candidates
