"""Where the suite's time goes: a pytest plugin that records, in the folder
``TIDEMARK_TEST_TIMES`` names (one file per worker), the seconds each fixture's set-up
took (PostgreSQL servers, Spark sessions, S3 servers, crash filesystems) and the seconds
the tests' own code slept (``time.sleep`` and ``asyncio.sleep`` called from a
file under ``tests/``, by call site: fixed sleeps and the pauses of polling loops).
Loaded only when asked for:

    PYTEST_ADDOPTS="-p tests.time_shares" TIDEMARK_TEST_TIMES=/tmp/times make test
    python -m tests.time_shares /tmp/times      # the totals, largest first
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_TESTS = str(Path(__file__).parent)
_FOLDER = os.environ.get("TIDEMARK_TEST_TIMES", "test-times")

fixture_s: defaultdict[str, float] = defaultdict(float)
fixture_n: defaultdict[str, int] = defaultdict(int)
sleep_s: defaultdict[str, float] = defaultdict(float)


def _site() -> str | None:
    frame = sys._getframe(2)
    where = frame.f_code.co_filename
    if not where.startswith(_TESTS):
        return None
    return f"{os.path.relpath(where, _TESTS)}:{frame.f_lineno}"


def _install_sleep_counters() -> None:
    """Each sleep called from the tests, timed as it ran (a sleep cancelled early
    counts for what it slept)."""
    plain, awaited = time.sleep, asyncio.sleep

    def sleep(delay: float) -> None:
        site = _site()
        started = time.perf_counter()
        try:
            plain(delay)
        finally:
            if site is not None:
                sleep_s[site] += time.perf_counter() - started

    async def asleep(delay: float, result: Any = None) -> Any:
        site = _site()
        started = time.perf_counter()
        try:
            return await awaited(delay, result)
        finally:
            if site is not None:
                sleep_s[site] += time.perf_counter() - started

    time.sleep = sleep  # type: ignore[assignment]
    asyncio.sleep = asleep


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any) -> Generator[None, None, None]:
    started = time.perf_counter()
    yield
    name = f"{fixturedef.argname} ({fixturedef.scope})"
    fixture_s[name] += time.perf_counter() - started
    fixture_n[name] += 1


def pytest_configure(config: pytest.Config) -> None:
    _install_sleep_counters()


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(_FOLDER).mkdir(parents=True, exist_ok=True)
    record = {"fixtures": fixture_s, "fixture_counts": fixture_n, "sleeps": sleep_s}
    (Path(_FOLDER) / f"{worker}.json").write_text(json.dumps(record, indent=1))


def summary(folder: Path, top: int = 25) -> str:
    fixtures: defaultdict[str, float] = defaultdict(float)
    counts: defaultdict[str, int] = defaultdict(int)
    sleeps: defaultdict[str, float] = defaultdict(float)
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        for name, seconds in record["fixtures"].items():
            fixtures[name] += seconds
            counts[name] += record["fixture_counts"][name]
        for where, seconds in record["sleeps"].items():
            sleeps[where] += seconds
    lines = [f"fixture set-ups: {sum(fixtures.values()):.0f} s (summed over workers)"]
    for name, seconds in sorted(fixtures.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {seconds:8.1f} s  {counts[name]:5d}x  {name}")
    lines.append(f"sleeps of the tests (as slept): {sum(sleeps.values()):.0f} s")
    fixed = {w: s for w, s in sleeps.items() if s >= 1}
    for where, seconds in sorted(fixed.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {seconds:8.1f} s  {where}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
