"""The last minutes for the status page's sparklines (``tidemark.status.history``):
intervals closed by the clock given, the longest acknowledgement lag in each, the rows
committed a second, and only the last 15 minutes kept."""

from __future__ import annotations

from tidemark.status.history import History, Point


def test_an_interval_closes_with_its_longest_lag_and_its_rate() -> None:
    history = History(interval_s=10, span_s=900)
    history.tick(1000.0, 0)  # the first tick starts the first interval
    history.ack_lag(0.4)
    history.ack_lag(2.5)
    history.ack_lag(1.0)
    history.tick(1009.9, 500)
    assert history.points() == ()  # not 10 s yet
    history.tick(1010.0, 1000)
    assert history.points() == (Point(1010.0, 2.5, 100.0),)
    # nothing acknowledged in the next one: no lag, and no rows
    history.tick(1020.0, 1000)
    assert history.points()[-1] == Point(1020.0, None, 0.0)


def test_a_pause_closes_one_longer_interval_and_only_the_span_is_kept() -> None:
    history = History(interval_s=10, span_s=60)
    history.tick(0.0, 0)
    history.tick(40.0, 400)  # (housekeeping held up 40 s: one interval, its own rate)
    assert history.points() == (Point(40.0, None, 10.0),)
    for i in range(1, 10):
        history.tick(40.0 + 10 * i, 400 + 100 * i)
    points = history.points()
    assert len(points) == 6 and points[0].at == 80.0 and points[-1].at == 130.0
    assert {p.rows_per_s for p in points} == {10.0}
    assert history.facts().interval_s == 10 and history.facts().points == points


def test_a_count_that_goes_back_starts_a_new_interval() -> None:
    """The writers were made again (a new scheduler counts from 0): no negative rate."""
    history = History(interval_s=10)
    history.tick(0.0, 5000)
    history.tick(5.0, 10)
    history.tick(15.0, 110)
    assert history.points() == (Point(15.0, None, 10.0),)
