"""A real Prometheus (Debian's binary) scrapes a running tidemark and postgres_exporter
with the deployed scrape config, and evaluates a test copy of the deployed alerts
(``for`` 1 s, the two byte-lag thresholds at 1 MB), while a workload runs on Postgres:

* every PromQL expression of the Grafana dashboard, and of every alert (comparisons
  made ``bool``, so a quiet alert still shows its selectors match), returns a series
  with a value: a renamed metric or label breaks this test;
* a shape held back past ``monitor.stall_grace_s`` (its writer held exclusively, as
  table maintenance does) fires TidemarkShapeStalled for that shape, and the held
  acknowledgement fires both byte-lag alerts; all resolve once it is released, and
  a busy healthy shape never looks stalled;
* an invariant violation fires TidemarkInvariantViolated. It is planted: the monitor's
  durable-frontier callable is patched to answer one byte below the slot's
  confirmed_flush_lsn, so the real check reports ``ack_beyond_durable``;
* tidemark as a process (``python -m tidemark --config F run``) frozen with SIGSTOP
  while Postgres keeps writing: TidemarkSlotLagAtSource (Postgres's view, through
  postgres_exporter) and TidemarkDown fire, while tidemark's own lag series are gone
  with it; after SIGCONT both resolve and the shapes equal Postgres. This one runs on
  the wheel's PostgreSQL 16 only (its skip on other servers says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import Lsn

from ..promql import REPO, alert_rules, with_bool
from .conftest import PgDatabase
from .prometheus_support import (
    Prometheus,
    binary_version,
    dashboard_exprs,
    postgres_exporter,
    prometheus,
    require_binaries,
    rules_for_test,
)
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

SLOT = "tidemark"  # the slot name the deployed alerts select
SHAPES = [
    {"name": "hot", "table": "public.items", "where": "grp = 0"},
    {"name": "items_all", "table": "public.items", "columns": ["grp"]},
]
TRUTH = {
    "hot": "select id, grp, payload from items where grp = 0",
    "items_all": "select id, grp from items",
}
LAG_BYTES = 1_000_000
THRESHOLDS = {
    "TidemarkReplicationLagHigh": ("> 1024 * 1024 * 1024", f"> {LAG_BYTES}"),
    "TidemarkSlotLagAtSource": ("> 1024 * 1024 * 1024", f"> {LAG_BYTES}"),
}


class Workload(threading.Thread):
    """Small transactions on ``items`` (inserts, updates across groups, deletes)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        next_id = 1_000_000
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    conn.execute("insert into items values (%s, %s, 'w')", (next_id, next_id % 3))
                    conn.execute(
                        "update items set grp = (grp + 1) %% 3 where id = %s", (next_id - 7,)
                    )
                    conn.execute("delete from items where id = %s", (next_id - 50,))
                next_id += 1
                self.transactions += 1
                time.sleep(0.02)


@contextlib.contextmanager
def workload(dsn: str) -> Iterator[Workload]:
    writer = Workload(dsn)
    writer.start()
    try:
        yield writer
    finally:
        writer.stop.set()
        writer.join(timeout=30)


def write_wal(dsn: str, megabytes: int) -> None:
    """About ``megabytes`` MB of WAL, in rows of the held shape (grp = 0)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(megabytes):
            conn.execute(
                "insert into items select nextval('bulk_ids'), 0, repeat(md5(g::text), 50)"
                " from generate_series(1, 600) g"
            )


@pytest.fixture
def items(pg_db: PgDatabase) -> PgDatabase:
    require_binaries()
    pg_db.execute(
        "create table items (id int primary key, grp int, payload text);"
        "alter table items replica identity full;"
        "create sequence bulk_ids start 2000000"
    )
    return pg_db


# Dashboard expressions that filter their series on a value the test server cannot
# have, with the value it has instead (checked): the bool form must still find data.
# The embedded servers run with max_slot_wal_keep_size=-1 on their command line (ALTER
# SYSTEM cannot override it), so safe_wal_size is "unlimited", which the panel hides.
FILTERED_HERE = {
    'tidemark_slot_safe_wal_size_bytes{instance=~".*"} >= 0': (
        "tidemark_slot_safe_wal_size_bytes == -1"
    )
}


def every_expression() -> list[tuple[str, str]]:
    """The dashboard's expressions, and the alerts' in their bool form; an alert of the
    form ``A unless on(...) B`` is checked as its two sides (a healthy service makes B
    true, so the whole is empty by design)."""
    out = dashboard_exprs()
    for rule in alert_rules():
        sides = re.split(r"\bunless\s+on\s*\([^)]*\)", " ".join(rule["expr"].split()))
        out += [(rule["alert"], with_bool(side.strip())) for side in sides]
    return out


def empty_expressions(prom: Prometheus) -> list[tuple[str, str]]:
    empty = []
    for where, expr in every_expression():
        if expr in FILTERED_HERE:
            found = prom.finite(with_bool(expr)) and prom.finite(FILTERED_HERE[expr])
        else:
            found = bool(prom.finite(expr))
        if not found:
            empty.append((where, expr))
    return empty


def names(alerts: list[dict[str, Any]], label: str) -> set[str]:
    return {a["labels"].get(label, "") for a in alerts}


async def test_dashboard_and_alert_queries_return_data_and_stalls_and_violations_fire(
    items: PgDatabase, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items.execute("insert into items select g, g % 3, 'seed' from generate_series(1, 300) g")
    settings = settings_for(
        items.dsn,
        str(tmp_path / "lake"),
        SHAPES,
        source={"slot": SLOT, "publication": "tm_prom"},
        monitor={"period_s": 0.5, "stall_grace_s": 2.0},
    )
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(items.dsn))
        rules = rules_for_test(THRESHOLDS)
        with (
            postgres_exporter(tmp_path / "exporter", items.dsn) as exporter,
            prometheus(
                tmp_path / "prometheus",
                {"tidemark": f"127.0.0.1:{service.http_port}", "postgres": exporter},
                rules,
            ) as prom,
            workload(items.dsn) as writer,
        ):
            print("prometheus:", binary_version("/usr/bin/prometheus"))

            # every expression of the dashboard and of the alerts finds data
            def all_found() -> bool:
                all_found.missing = empty_expressions(prom)  # type: ignore[attr-defined]
                return not all_found.missing  # type: ignore[attr-defined]

            with contextlib.suppress(AssertionError):
                await asyncio.to_thread(prom.wait, "every expression", all_found, 90)
            assert all_found.missing == [], "expressions without data"  # type: ignore[attr-defined]

            # a busy shape that flushes on time is not stalled (grace 2 s, 6 s of load)
            for _ in range(12):
                assert await asyncio.to_thread(prom.alerts, "TidemarkShapeStalled") == []
                await asyncio.sleep(0.5)
            for name in ("TidemarkReplicationLagHigh", "TidemarkSlotLagAtSource"):
                assert await asyncio.to_thread(prom.alerts, name) == [], name
            assert writer.transactions > 100

            # (a shape flushing back to back can keep exclusive() waiting: quiet it first)
            writer.stop.set()
            await asyncio.to_thread(writer.join, 30)

            # when shape "hot" is held back (no flush can start for it) while WAL grows
            assert service.scheduler is not None
            held = service.scheduler.writers["hot"]
            async with service.scheduler.exclusive(held):
                await asyncio.to_thread(write_wal, items.dsn, 3)
                stalled = await asyncio.to_thread(
                    prom.wait,
                    "TidemarkShapeStalled firing",
                    lambda: prom.alerts("TidemarkShapeStalled", "firing"),
                )
                assert names(stalled, "shape") == {"hot"}
                assert stalled[0]["annotations"]["summary"] == "shape hot holds the flush boundary"
                ready, reasons = service.readiness()
                assert not ready and any("shape hot" in r for r in reasons), reasons
                # the acknowledgement waits for "hot": the slot's lag passes the threshold
                for name in ("TidemarkReplicationLagHigh", "TidemarkSlotLagAtSource"):
                    await asyncio.to_thread(
                        prom.wait, f"{name} firing", lambda n=name: prom.alerts(n, "firing")
                    )
            # then, released, it catches up and every alert resolves
            for name in (
                "TidemarkShapeStalled",
                "TidemarkReplicationLagHigh",
                "TidemarkSlotLagAtSource",
            ):
                await asyncio.to_thread(
                    prom.wait, f"{name} resolved", lambda n=name: not prom.alerts(n), 90
                )
            await wait_frontiers(service, current_lsn(items.dsn))
            for shape, query in TRUTH.items():
                result = compare_shape(spark, settings.sink.root, shape, query, items.dsn)
                assert result.equal, result.describe()

            # an invariant violation (planted: the durable frontier the monitor is told
            # is one byte below the slot's confirmed_flush_lsn) fires its alert
            assert await asyncio.to_thread(prom.alerts, "TidemarkInvariantViolated") == []
            monitor = service.monitor
            assert monitor is not None and monitor.state.last is not None
            confirmed = monitor.state.last.confirmed_flush_lsn
            assert confirmed is not None
            monkeypatch.setattr(monitor, "_durable", lambda: confirmed - 1)
            violated = await asyncio.to_thread(
                prom.wait,
                "TidemarkInvariantViolated firing",
                lambda: prom.alerts("TidemarkInvariantViolated", "firing"),
            )
            assert names(violated, "kind") == {"ack_beyond_durable"}
            ready, reasons = service.readiness()
            assert not ready and any("ack_beyond_durable" in r for r in reasons)


def start_tidemark(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env["PYTHONPATH"] = str(REPO / "service")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tidemark", "--config", str(config), "run"],
            cwd=config.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def http_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def test_slot_lag_alert_fires_while_tidemark_is_frozen_and_resolves_after(
    items: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    embedded = items.server.embedded
    if embedded is not None and embedded.flavor != "wheel":
        pytest.skip(
            "runs on one server (the wheel's PostgreSQL 16): what it adds to the test above "
            "is tidemark as a frozen process, and the only Postgres in it is the exporter's "
            "pg_replication_slots query, which the test above runs on every server"
        )
    # given tidemark running from a config file (an empty table: the backfills write
    # nothing), scraped with postgres_exporter
    port = free_port()
    root = tmp_path / "lake"
    config = tmp_path / "tidemark.toml"
    shapes = "".join(
        f'[[shapes]]\nname = "{s["name"]}"\ntable = "{s["table"]}"\n'
        + (f'where = "{s["where"]}"\n' if "where" in s else "")
        + (f"columns = {json.dumps(s['columns'])}\n" if "columns" in s else "")
        for s in SHAPES
    )
    config.write_text(
        f'log_format = "json"\n[source]\ndsn = "{items.dsn}"\nslot = "{SLOT}"\n'
        f'publication = "tm_prom"\n[sink]\nroot = "{root}"\n[http]\nport = {port}\n'
        f"[flush]\nmax_age_s = 0.3\n[monitor]\nperiod_s = 0.5\n{shapes}"
    )
    log = tmp_path / "tidemark.log"
    proc = start_tidemark(config, log)
    base = f"http://127.0.0.1:{port}"
    try:
        rules = rules_for_test(THRESHOLDS)
        with (
            postgres_exporter(tmp_path / "exporter", items.dsn) as exporter,
            prometheus(
                tmp_path / "prometheus",
                {"tidemark": f"127.0.0.1:{port}", "postgres": exporter},
                rules,
            ) as prom,
            workload(items.dsn),
        ):

            def backfilled() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    shapes = http_json(base + "/v1/shapes")["shapes"]
                    return http_json(base + "/readyz")["ready"] and all(s["ready"] for s in shapes)
                except OSError:
                    return False

            prom.wait("tidemark ready, its shapes backfilled", backfilled, timeout=180)
            prom.wait("a lag series from each side", lambda: (
                prom.finite(f'pg_slot_lag_bytes{{slot_name="{SLOT}"}}')
                and prom.finite('tidemark_replication_lag_bytes{job="tidemark"}')
            ))  # fmt: skip
            assert prom.alerts("TidemarkSlotLagAtSource") == []

            # when tidemark freezes while Postgres keeps writing
            proc.send_signal(signal.SIGSTOP)
            try:
                write_wal(items.dsn, 3)
                firing = prom.wait(
                    "TidemarkSlotLagAtSource firing",
                    lambda: prom.alerts("TidemarkSlotLagAtSource", "firing"),
                )
                assert names(firing, "slot_name") == {SLOT}
                assert firing[0]["annotations"]["summary"].startswith(f"slot {SLOT} is ")
                prom.wait("TidemarkDown firing", lambda: prom.alerts("TidemarkDown", "firing"))
                # tidemark's own view is gone with it: its lag alert cannot fire
                assert prom.query('tidemark_replication_lag_bytes{job="tidemark"}') == []
                assert prom.alerts("TidemarkReplicationLagHigh") == []
            finally:
                proc.send_signal(signal.SIGCONT)

            # then, thawed, it catches up and both alerts resolve
            for name in ("TidemarkSlotLagAtSource", "TidemarkDown"):
                prom.wait(f"{name} resolved", lambda n=name: not prom.alerts(n), timeout=90)
        target = Lsn(current_lsn(items.dsn))
        for shape in TRUTH:
            waited = http_json(
                f"{base}/v1/progress/wait?lsn={target}&timeout=120&shape={shape}", 130
            )
            assert waited["reached"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, items.dsn)
        assert result.equal, result.describe()
