"""Shared test configuration: hypothesis profiles and the integration marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _unfenced() -> None:
    """Each test starts with no leader fence in force (``tidemark.fencing`` is
    process-wide: a service run in-process leaves its own, deposed or suspended
    perhaps, which must not refuse the next test's writes)."""
    from tidemark import fencing

    fencing.install(fencing.Fence())


# tests/compose drive podman and build images as root: `make test-compose` runs them, not
# `make test` (which collects tests/ whole)
collect_ignore = [] if os.environ.get("TIDEMARK_COMPOSE_TESTS") == "1" else ["compose"]
