"""The deploy files against a real Postgres and a real Spark (no Docker engine needed).

The compose stack's database side (deploy/postgres/init/*.sql: a non-superuser role with
REPLICATION, the shop schema, the publication, ``shop.tick()``) is applied to a fresh
database with ``psql``, as the postgres image would; tidemark then runs with
docker-compose.yml's own environment, only the DSN's host, port and database, the sink
and the HTTP port changed:

* in-process, to scrape ``/metrics`` and find every metric that
  deploy/prometheus/alerts.yml and deploy/grafana/tidemark.json name;
* as the container does, through deploy/entrypoint.sh with the Dockerfile's CMD, until
  ``/readyz`` and the image's health check pass and the sample workload's rows are
  committed; then SIGTERM, and a clean exit 0 within the grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from tidemark.app import Service
from tidemark.demo.postgres import free_port
from tidemark.settings.config import Settings, load_settings

from .conftest import PgDatabase

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# the role deploy/postgres/init/10-tidemark-role.sql creates (roles outlive the test
# databases, so the name is fixed and the password set again for every database)
ROLE = "tidemark_deploy"
PASSWORD = secrets.token_hex(12)

# referenced series that exist only after an event; they must still be declared
DECLARED_ONLY = {
    "tidemark_invariant_violations_total": "labelled by kind: a child appears on a violation",
}
PROMQL_BUILTINS = {"up"}


@dataclass
class Shop:
    db: PgDatabase
    dsn: str  # as ROLE, the way the tidemark container connects
    psql: str


@pytest.fixture
def shop(pg_db: PgDatabase) -> Shop:
    """The compose postgres service's init scripts, applied to a fresh database."""
    psql = shutil.which(pg_db.server.bin("psql"))
    if psql is None:
        pytest.skip("no psql client for this server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env |= {"TIDEMARK_DB_USER": ROLE, "TIDEMARK_DB_PASSWORD": PASSWORD}
    for script in sorted((DEPLOY / "postgres" / "init").glob("*.sql")):
        result = subprocess.run(
            [psql, "-X", "-q", "-d", pg_db.dsn, "-f", str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"{script.name}:\n{result.stderr}"
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("alter role {} password {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD))
        )
    return Shop(pg_db, pg_db.server.dsn_for(pg_db.name, ROLE, PASSWORD), psql)


def compose_tidemark_env(shop: Shop, sink: Path, port: int) -> dict[str, str]:
    """docker-compose.yml's tidemark environment, pointed at ``shop``, ``sink``, ``port``."""
    variables = {"TIDEMARK_DB_USER": ROLE, "TIDEMARK_DB_PASSWORD": PASSWORD}

    def substitute(m: re.Match[str]) -> str:  # ${X}, ${X:-default}
        return variables.get(m.group(1)) or (m.group(2) or "")

    spec = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = {
        k: re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", substitute, str(v))
        for k, v in spec["services"]["tidemark"]["environment"].items()
    }
    compose_dsn = urlsplit(env["TIDEMARK_SOURCE__DSN"])
    ours = urlsplit(shop.dsn)
    # credentials come through the same variables the postgres service gets
    assert (compose_dsn.username, compose_dsn.password) == (ours.username, ours.password)
    env["TIDEMARK_SOURCE__DSN"] = urlunsplit(
        compose_dsn._replace(netloc=ours.netloc, path=ours.path)
    )
    env["TIDEMARK_SINK__ROOT"] = str(sink)
    env["TIDEMARK_HTTP__PORT"] = str(port)
    # the container's home: where the entrypoint writes the admin token it generates
    env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"] = str(sink.parent / "admin-token")
    assert env["PYSPARK_PYTHON"] == "/opt/tidemark/bin/python"  # the image's virtualenv
    env["PYSPARK_PYTHON"] = sys.executable  # ... which, here, is ours
    return env


def metric_references() -> set[str]:
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    dashboard = json.loads((DEPLOY / "grafana" / "tidemark.json").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {name for e in exprs for name in re.findall(r"\btidemark_[a-z0-9_]+\b", e)}


def tick(dsn: str, times: int = 1) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(times):
            conn.execute("call shop.tick()")


async def until(condition: Callable[[], bool], task: asyncio.Task[None], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if task.done():
            task.result()  # the service's error, if it stopped
            raise AssertionError("the service stopped")
        assert time.monotonic() < deadline, f"not reached within {timeout}s"
        await asyncio.sleep(0.1)


async def test_every_metric_the_alerts_and_dashboard_use_is_in_a_running_services_metrics(
    shop: Shop, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given tidemark with the compose environment (API on any free loopback port)
    env = compose_tidemark_env(shop, tmp_path / "data", 0)
    env |= {"TIDEMARK_HTTP__HOST": "127.0.0.1", "TIDEMARK_MONITOR__PERIOD_S": "0.5"}
    Path(env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"]).write_text("a-token\n")
    settings = settings_from(env, monkeypatch, tmp_path)
    service = Service(settings, spark=spark)
    task = asyncio.create_task(service.run())
    try:
        await until(
            lambda: (
                service.phase == "streaming"
                and service.monitor is not None
                and service.monitor.state.last is not None
                # backfilled: from here on, rows reach the shapes through the stream
                and bool(service.shapes)
                and all(s.state == "active" for s in service.shapes.values())
            ),
            task,
            120,
        )
        # when the sample workload runs, plus an order every shape selects
        await asyncio.to_thread(tick, shop.db.dsn, 3)
        await asyncio.to_thread(
            shop.db.execute,
            "insert into shop.orders (customer_id, region, status, total) "
            "values (1, 'eu', 'paid', 900)",
        )
        assert service.scheduler is not None
        writers = service.scheduler.writers
        assert set(writers) == {s.name for s in settings.shapes}
        await until(lambda: all(w.rows_committed > 0 for w in writers.values()), task, 60)
        await asyncio.sleep(1.0)  # housekeeping copies the state into the gauges every 0.5 s
        base = f"http://127.0.0.1:{service.http_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/metrics") as response:
                assert response.status == 200
                exposition = await response.text()
            async with http.get(base + "/readyz") as response:
                assert response.status == 200, await response.text()
    finally:
        service.request_stop()
        async with asyncio.timeout(60):
            await task

    # then every referenced series is there (counters as _total, histograms in parts)
    families = list(text_string_to_metric_families(exposition))
    samples = {s.name for f in families for s in f.samples}
    declared = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    referenced = metric_references() - PROMQL_BUILTINS
    assert len(referenced) > 20
    missing = sorted(n for n in referenced - set(DECLARED_ONLY) if n not in samples)
    assert missing == [], f"not in /metrics: {missing}"
    assert set(DECLARED_ONLY) <= declared
    # and per-shape series exist for every shape of the compose file
    shape_series = {
        s.labels["shape"] for f in families for s in f.samples if s.name == "tidemark_changes_total"
    }
    assert shape_series == {s.name for s in settings.shapes}


def settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch, cwd: Path) -> Settings:
    for key in list(os.environ):
        if key.startswith("TIDEMARK_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(cwd)
    return load_settings()


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def http_post(url: str, body: Any, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except OSError:
            pass  # not listening yet
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def test_the_container_entrypoint_serves_the_compose_environment_and_stops_cleanly(
    shop: Shop, tmp_path: Path
) -> None:
    # given the container's environment, command and entrypoint, run here
    port = free_port()
    tidemark_env = compose_tidemark_env(shop, tmp_path / "data", port)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEMARK_", "PG"))}
    base["PATH"] = f"{Path(sys.executable).parent}:{base['PATH']}"  # where `tidemark` is
    env = base | tidemark_env
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None, "the Dockerfile has no CMD in exec form"
    command = json.loads(cmd.group(1))
    log = tmp_path / "tidemark.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(DEPLOY / "entrypoint.sh"), *command],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        # then it becomes ready, and the image's health check says so
        wait_for(lambda: http_get(url + "/readyz")[0] == 200, proc, log, timeout=180)
        check = subprocess.run(
            [sys.executable, str(DEPLOY / "healthcheck.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert check.returncode == 0, check.stdout
        # reads need no token, mutations need the one the entrypoint generated
        token = Path(tidemark_env["TIDEMARK_HTTP__ADMIN_TOKEN_FILE"]).read_text().strip()
        assert len(token) == 32
        assert http_get(url + "/metrics")[0] == 200
        assert http_post(url + "/v1/shapes", {"name": "x"})[0] == 401
        assert http_post(url + "/v1/shapes", {"name": "x"}, "wrong")[0] == 403
        assert http_post(url + "/v1/shapes", {"name": "x"}, token)[0] == 400  # no table

        # (a shape still backfilling would take the ticks' rows into its snapshot:
        # wait until every shape follows the stream)
        def all_active() -> bool:
            shapes = json.loads(http_get(url + "/v1/shapes")[1])["shapes"]
            return bool(shapes) and all(s["state"] == "active" for s in shapes)

        wait_for(all_active, proc, log, timeout=120)
        # when the compose workload script runs a few ticks
        db = urlsplit(shop.db.dsn)
        workload = subprocess.run(
            ["sh", str(DEPLOY / "workload" / "workload.sh")],
            env=base
            | {
                "PATH": f"{Path(shop.psql).parent}:{base['PATH']}",
                "PGHOST": db.hostname or "",
                "PGPORT": str(db.port),
                "PGUSER": db.username or "",
                "PGPASSWORD": db.password or "",
                "PGDATABASE": db.path.lstrip("/"),
                "TICKS": "3",
                "TICK_INTERVAL_S": "0.1",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert workload.returncode == 0, workload.stderr

        # then its customers (one per tick) are committed to the customers shape
        def customers_committed() -> bool:
            shapes = json.loads(http_get(url + "/v1/shapes")[1])["shapes"]
            return {s["name"]: s for s in shapes}["customers"]["rows_committed"] >= 3

        wait_for(customers_committed, proc, log, timeout=60)
        # when docker stops the container
        proc.send_signal(signal.SIGTERM)
        grace = float(tidemark_env["TIDEMARK_SHUTDOWN_GRACE_S"])
        returncode = proc.wait(timeout=grace + 15)
        # then tidemark drained and exited cleanly
        output = log.read_text()
        assert returncode == 0, output[-4000:]
        events = [json.loads(line)["event"] for line in output.splitlines() if line.startswith("{")]
        assert "service.stopping" in events and "service.stopped" in events
        assert "service.crashed" not in events
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
