"""The process settings a service makes at start: the garbage collector's thresholds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tidemark.allocators import GC_THRESHOLDS, tune_collector


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_a_service_raises_pythons_default_collector_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    tune_collector()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # (fewer passes over the buffered rows)
    tune_collector()  # a second service in the process: unchanged
    assert gc.get_threshold() == GC_THRESHOLDS


@pytest.mark.usefixtures("thresholds")
def test_thresholds_the_operator_set_are_kept() -> None:
    gc.set_threshold(2000, 5, 5)
    tune_collector()
    assert gc.get_threshold() == (2000, 5, 5)
