"""Shared test configuration: hypothesis profiles and the integration marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Every Spark driver the suite starts (its own sessions, the services and writers it runs as
# processes, the readers' Spark) compiles with C1 alone: each lives seconds to minutes on a
# few thousand rows, where C2's compiling was about half of the JVMs' CPU and the suite is
# bound by the two cores (thread CPU of the drivers in `make test`, 2026-12-02). Users'
# services keep both tiers. spark-submit puts SPARK_SUBMIT_OPTS on the command line of the
# JVM it starts, and child processes inherit it.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_INTEGRATION = Path(__file__).parent / "integration"


# The modules that take longest, longest first (module totals of `make test`'s
# --durations on 2026-11-29). `make test` hands whole modules to two workers in
# collection order (`--dist loadfile`): started first, these end while the other worker
# runs through the short ones, instead of one worker running a six-minute module alone
# at the end.
SLOWEST_FIRST = (
    "test_power_loss",
    "test_sink_crash",
    "test_e2e",
    "test_s3_root",
    "test_streamed_transactions",
    "test_deposed_leader",
    "test_current",
    "test_sink_durability",
    "test_backfill",
    "test_e2e_crash",
    "test_redefined_shape",
    "test_spark_connect",
    "test_prometheus",
    "test_leader_lease",
    "test_reference_readers",
)


def _slowness_rank(item: pytest.Item) -> int:
    name = Path(str(item.fspath)).stem
    return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
    items.sort(key=_slowness_rank)  # stable: a module's own order stays


@pytest.fixture(autouse=True)
def _unfenced() -> None:
    """Each test starts with no leader fence in force (``tidemark.state.fencing`` is
    process-wide: a service run in-process leaves its own, deposed or suspended
    perhaps, which must not refuse the next test's writes)."""
    from tidemark.state import fencing

    fencing.install(fencing.Fence())


# tests/compose drive podman and build images as root: `make test-compose` runs them, not
# `make test` (which collects tests/ whole)
collect_ignore = [] if os.environ.get("TIDEMARK_COMPOSE_TESTS") == "1" else ["compose"]
