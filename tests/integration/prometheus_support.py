"""A real Prometheus (and postgres_exporter) for the tests, from Debian's packages.

``prometheus_config`` is deploy/prometheus/prometheus.yml with its targets pointed at
the test's processes, its intervals at 1 s and its rules at a test copy of
deploy/prometheus/alerts.yml (``rules_for_test``: ``for`` shortened, named thresholds
lowered; a substitution that finds nothing fails, so the copy cannot silently drift
from the deployed rules). ``postgres_exporter`` runs with docker-compose.yml's own
command line and the deployed queries file.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tidemark.demo.postgres import free_port

from ..promql import ALERTS, DEPLOY, REPO

PROMETHEUS = "/usr/bin/prometheus"
EXPORTER = "prometheus-postgres-exporter"


def require_binaries() -> None:
    missing = [b for b in (PROMETHEUS, EXPORTER) if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: `make setup` as root installs Debian's "
            "prometheus and prometheus-postgres-exporter packages"
        )


def binary_version(binary: str) -> str:
    result = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return (result.stdout or result.stderr).splitlines()[0]


def rules_for_test(thresholds: Mapping[str, tuple[str, str]], for_: str = "1s") -> str:
    """alerts.yml with every ``for`` set to ``for_`` and, per alert, ``old`` -> ``new``
    in its expression."""
    data = yaml.safe_load(ALERTS.read_text())
    seen = set()
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["for"] = for_
            change = thresholds.get(rule["alert"])
            if change is not None:
                old, new = change
                assert old in rule["expr"], f"{rule['alert']}: {old!r} not in {rule['expr']!r}"
                rule["expr"] = rule["expr"].replace(old, new)
                seen.add(rule["alert"])
    assert seen == set(thresholds), f"no such alerts: {set(thresholds) - seen}"
    return yaml.safe_dump(data)


def prometheus_config(targets: Mapping[str, str], rules: Path) -> str:
    """The deployed prometheus.yml, each job's target replaced by ``targets[job]``."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "1s",
    }
    config["rule_files"] = [str(rules)]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(targets), f"deployed jobs {sorted(jobs)}, test targets {targets}"
    for name, job in jobs.items():
        job["static_configs"] = [{"targets": [targets[name]]}]
    return yaml.safe_dump(config)


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def finite(self, expr: str) -> list[dict[str, Any]]:
        """The series of ``expr`` whose value is a number (not NaN)."""
        return [s for s in self.query(expr) if not math.isnan(float(s["value"][1]))]

    def alerts(self, name: str, state: str | None = None) -> list[dict[str, Any]]:
        """Alerts named ``name`` that are pending or firing (resolved ones are gone)."""
        return [
            a
            for a in self.api("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == name and state in (None, a["state"])
        ]

    def wait(self, what: str, condition: Any, timeout: float = 60.0) -> Any:
        """Poll ``condition()`` until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                value = condition()
            except (urllib.error.URLError, OSError):
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what}")
            time.sleep(0.5)


@contextlib.contextmanager
def prometheus(tmp: Path, targets: Mapping[str, str], rules: str) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port (the job ``prometheus`` scrapes itself)."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "alerts.yml").write_text(rules)
    config = tmp / "prometheus.yml"
    config.write_text(
        prometheus_config({**targets, "prometheus": f"127.0.0.1:{port}"}, tmp / "alerts.yml")
    )
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        server.wait("Prometheus ready", lambda: _ok(server.url + "/-/ready"), timeout=60)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def postgres_exporter(tmp: Path, dsn: str) -> Iterator[str]:
    """postgres_exporter with the compose file's flags and the deployed queries, on a
    free loopback port; its address."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    service = compose["services"]["postgres-exporter"]
    queries = DEPLOY / "prometheus" / "postgres-exporter-queries.yml"
    args = [
        f"--extend.query-path={queries}" if a.startswith("--extend.query-path=") else a
        for a in service["command"]
    ]
    address = f"127.0.0.1:{free_port()}"
    separator = "&" if "?" in dsn else "?"
    log = tmp / "postgres_exporter.log"
    tmp.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [EXPORTER, *args, f"--web.listen-address={address}"],
            env={"DATA_SOURCE_NAME": f"{dsn}{separator}sslmode=disable"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not _ok(f"http://{address}/metrics"):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "postgres_exporter did not answer"
            time.sleep(0.2)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def dashboard_exprs(rate_interval: str = "5s") -> list[tuple[str, str]]:
    """(panel title, expression) of every dashboard target; Grafana's ``$__rate_interval``
    becomes ``rate_interval`` (Grafana makes it at least four scrape intervals), and the
    dashboard's variables their "All" (``.*``)."""
    dashboard = json.loads((DEPLOY / "grafana" / "tidemark.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            for variable in ("$instance", "$shape", "$slot"):  # each variable's "All"
                expr = expr.replace(variable, ".*")
            assert "$" not in expr, f"{panel['title']}: a Grafana variable left in {expr!r}"
            out.append((panel["title"], expr))
    return out
