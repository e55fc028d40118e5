from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.writers.cadence import Cadence


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
