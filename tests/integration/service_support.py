"""Run the real service in-process (sharing the test Spark session) and wait on it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from tidemark.app import Service
from tidemark.lsn import Lsn
from tidemark.settings.config import Settings


def settings_for(dsn: str, root: str, shapes: list[dict[str, Any]], **extra: Any) -> Settings:
    data: dict[str, Any] = {
        "source": {"dsn": dsn, "slot": "tm_e2e", "publication": "tm_e2e"},
        "sink": {"root": root},
        "http": {"port": 0},
        "flush": {"max_age_s": 0.2},
        "monitor": {"period_s": 0.5},
        # (a clean stop's fold is the demo test's; the others stop without paying for it)
        "current": {"fold_on_stop": False},
        "shapes": shapes,
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return Settings.model_validate(data)


@contextlib.asynccontextmanager
async def running_service(
    settings: Settings, spark: Any, config_path: str | None = None
) -> AsyncIterator[Service]:
    service = Service(settings, spark=spark, config_path=config_path)
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            while service.phase != "streaming" or service.http_port is None:
                if task.done():
                    task.result()
                    raise AssertionError("service stopped before streaming")
                await asyncio.sleep(0.05)
        yield service
    finally:
        service.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)


def current_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return int(Lsn.parse(row[0]))


def confirmed_flush(dsn: str, slot: str = "tm_e2e") -> int:
    """The slot's ``confirmed_flush_lsn``: what Postgres holds as acknowledged."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] is not None, f"no slot {slot} with a confirmed flush"
    return int(Lsn.parse(row[0]))


async def wait_frontiers(service: Service, lsn: int, timeout: float = 120.0) -> None:
    """Until every shape is ready (backfilled) and its frontier is at or past ``lsn``."""
    async with asyncio.timeout(timeout):
        while True:
            failed = {n: s.error for n, s in service.shapes.items() if s.state == "error"}
            assert not failed, failed
            frontiers = service.progress().frontiers
            if service.shapes and all(frontiers.get(n, -1) >= lsn for n in service.shapes):
                return
            await asyncio.sleep(0.05)


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``tidemark <argv>`` in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tidemark", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
