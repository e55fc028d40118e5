"""What the scheduler stages to stay within the memory budget (tidemark.writers.memory):
an open transaction spread over many shapes, each part under the staging threshold,
must not fill the budget and wait forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tidemark.writers.memory import OpenPart, parts_to_stage

MB = 1024 * 1024


def test_under_the_budget_only_a_part_over_the_threshold_is_staged() -> None:
    parts = [OpenPart("big", 300 * MB, False), OpenPart("small", 10 * MB, False)]
    assert parts_to_stage(parts, 310 * MB, 1024 * MB, 256 * MB) == ["big"]
    assert parts_to_stage(parts[1:], 10 * MB, 1024 * MB, 256 * MB) == []


def test_one_transaction_over_six_shapes_is_staged_biggest_first_until_under_budget() -> None:
    # given a 1 GiB budget filled by one open transaction: 6 parts of ~200 MiB each
    parts = [OpenPart(f"s{i}", (195 + i) * MB, False) for i in range(6)]
    total = sum(p.open_bytes for p in parts)
    assert total > 1024 * MB and all(p.open_bytes < 256 * MB for p in parts)
    # then the biggest parts go to Parquet until what is left is under the budget
    chosen = parts_to_stage(parts, total, 1024 * MB, 256 * MB)
    assert chosen == ["s5"]
    left = total - sum(p.open_bytes for p in parts if p.shape in chosen)
    assert left < 1024 * MB


def test_busy_writers_and_empty_parts_are_left_alone() -> None:
    parts = [OpenPart("busy", 900 * MB, True), OpenPart("idle", 0, False)]
    assert parts_to_stage(parts, 1100 * MB, 1024 * MB, 256 * MB) == []


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=20),
    busy=st.lists(st.booleans(), min_size=20, max_size=20),
    ready=st.integers(min_value=0, max_value=300),
    budget=st.integers(min_value=50, max_value=2000),
    stage=st.integers(min_value=1, max_value=500),
)
def test_after_staging_the_rest_is_under_budget_unless_only_busy_or_ready_bytes_remain(
    sizes: list[int], busy: list[bool], ready: int, budget: int, stage: int
) -> None:
    parts = [OpenPart(f"s{i}", size, busy[i]) for i, size in enumerate(sizes)]
    total = ready + sum(sizes)
    chosen = parts_to_stage(parts, total, budget, stage)
    assert len(chosen) == len(set(chosen))
    by_name = {p.shape: p for p in parts}
    assert all(not by_name[s].busy and by_name[s].open_bytes > 0 for s in chosen)
    # every part over the threshold is staged
    assert {p.shape for p in parts if not p.busy and p.open_bytes >= stage} <= set(chosen)
    left = total - sum(by_name[s].open_bytes for s in chosen)
    stuck = ready + sum(p.open_bytes for p in parts if p.busy)
    # under the budget, or everything stageable was staged (what is left flushes or
    # waits for a running job)
    assert left < budget or left == stuck


def test_the_service_process_allocates_arrow_memory_with_malloc_and_small_pages() -> None:
    # a fresh interpreter, as `tidemark run` starts: prepare_process before pyarrow loads
    code = (
        "from tidemark.allocators import prepare_process; prepare_process()\n"
        "import pyarrow as pa\n"
        "thp = [l.split()[1] for l in open('/proc/self/status') if l.startswith('THP_enabled')]\n"
        "print(pa.default_memory_pool().backend_name, *thp)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "service")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "system", out
    if sys.platform.startswith("linux") and len(out) > 1:  # THP_enabled: Linux 5.0 and up
        assert out[1] == "0", out
