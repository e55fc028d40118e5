"""The ``collector`` bench section's workload reaches every shape's buffer whole, so its
figure is the time of the real path (decode, route, buffer), not of a short cut."""

from __future__ import annotations

import pytest
from bench import collector_bench


@pytest.mark.parametrize("txn_rows", [1, 10, 250])
def test_every_row_is_buffered_once(txn_rows: int) -> None:
    seconds, buffered = collector_bench.one_run(collector_bench.payloads(1000, txn_rows))
    assert buffered == 1000 and seconds > 0
