"""The compose tests' handle on podman: a compose project, its containers and health."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy" / "podman" / "compose.podman.yml"
PROJECT = "tidemark"  # the compose file's `name`
PG_PORT, API_PORT, STANDBY_PORT, PROMETHEUS_PORT = 25432, 28765, 28766, 29090
PG_PASSWORD, PG_DB = "postgres", "shop"
PG_DSN = f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{PG_PORT}/{PG_DB}"
IMAGE = "localhost/tidemark:0.1.0"


def podman_compose() -> str:
    found = shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    found = found or shutil.which("podman-compose")
    if found is None or shutil.which("podman") is None:
        pytest.fail("podman and podman-compose are needed: run `make test-compose` (as root)")
    return found


def run(argv: Sequence[str], timeout: float = 300, check: bool = True) -> str:
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-3000:]}"
        )
    return result.stdout


class Stack:
    """One compose project: the repository's file, the podman overlay, maybe more."""

    def __init__(self, project: str, extra_files: Sequence[Path] = ()) -> None:
        self.project = project
        self.files = [REPO / "docker-compose.yml", OVERLAY, *extra_files]

    def compose(self, *args: str, profiles: Sequence[str] = (), timeout: float = 300) -> str:
        argv = [podman_compose(), "-p", self.project]
        for f in self.files:
            argv += ["-f", str(f)]
        for p in profiles:
            argv += ["--profile", p]
        return run([*argv, *args], timeout=timeout)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def state(self, service: str) -> dict[str, Any]:
        out = run(["podman", "inspect", "--format", "{{json .State}}", self.container(service)])
        return dict(json.loads(out))

    def logs(self, service: str) -> str:
        result = subprocess.run(
            ["podman", "logs", self.container(service)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result.stdout + result.stderr

    def healthcheck(self, service: str) -> tuple[bool, str]:
        """Run the container's health check now (podman 4.3 runs them on systemd timers
        only, and there is no systemd here) and return (healthy, what it printed)."""
        name = self.container(service)
        done = subprocess.run(
            ["podman", "healthcheck", "run", name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        output = ""
        try:
            log = self.state(service).get("Health", {}).get("Log") or []
            output = log[-1].get("Output", "") if log else ""
        except AssertionError:
            pass
        return done.returncode == 0, output.strip() or done.stderr.strip()

    def wait_healthy(self, service: str, timeout: float) -> float:
        start = time.monotonic()
        said = ""
        while time.monotonic() - start < timeout:
            healthy, said = self.healthcheck(service)
            if healthy:
                return time.monotonic() - start
            time.sleep(1)
        raise AssertionError(
            f"{service} not healthy within {timeout:.0f} s (health check: {said});"
            f" last log lines:\n{self.logs(service)[-4000:]}"
        )

    def address(self, service: str) -> str:
        """The container's address on the compose network (a rootful podman host routes to
        it)."""
        out = run(
            [
                "podman",
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                self.container(service),
            ]
        )
        return out.split()[0]

    def postgres(self, timeout: float = 60) -> psycopg.Connection[Any]:
        """A connection to the stack's Postgres for the tests' own queries: on the port the
        compose file publishes, as a user's psql would; if that fails, on the
        container's own address, and what podman's port forwarding looked like is printed
        (one CI run found the published port refusing while every container was healthy
        and the other published ports answered). Retried while Postgres restarts."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        said = False
        while time.monotonic() < deadline:
            try:
                return psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
            except psycopg.OperationalError as exc:
                last = exc
            if not said:
                said_now = self.port_forwarding()
                print(f"\nthe published port {PG_PORT} did not answer: {last}\n{said_now}")
                said = True
            try:
                return psycopg.connect(
                    host=self.address("postgres"),
                    port=5432,
                    user="postgres",
                    password=PG_PASSWORD,
                    dbname=PG_DB,
                    autocommit=True,
                    connect_timeout=5,
                )
            except (psycopg.OperationalError, AssertionError) as exc:
                last = exc
            time.sleep(1)
        raise AssertionError(
            f"the stack's Postgres answered neither on 127.0.0.1:{PG_PORT} nor on its own"
            f" address within {timeout:.0f} s: {last}; {self.port_forwarding()};"
            f" postgres log:\n{self.logs('postgres')[-3000:]}"
        )

    def port_forwarding(self) -> str:
        """What podman and the kernel say about the published Postgres port."""
        said = []
        for argv in (
            ["podman", "ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Ports}}"],
            ["podman", "port", self.container("postgres")],
            ["podman", "inspect", "--format", "{{json .State}}", self.container("postgres")],
            ["iptables", "-t", "nat", "-S"],
            ["ss", "-ltnp"],
        ):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                said.append(f"$ {' '.join(argv)}: {exc}")
                continue
            lines = (done.stdout + done.stderr).splitlines()
            if argv[0] in ("iptables", "ss"):
                lines = [line for line in lines if str(PG_PORT) in line or "-N " in line]
            said.append(f"$ {' '.join(argv)}\n" + "\n".join(lines[-40:]))
        return "\n".join(said)

    def volumes(self) -> set[str]:
        out = run(["podman", "volume", "ls", "--format", "{{.Name}}"])
        return {v for v in out.split() if v.startswith(f"{self.project}_")}

    def down(self, volumes: bool = False, profiles: Sequence[str] = ()) -> float:
        """``compose down`` as users run it (podman-compose stops every container at
        once: tidemark and Postgres stop together); returns the seconds it took."""
        started = time.monotonic()
        self.compose("down", *(["-v"] if volumes else []), profiles=profiles, timeout=300)
        return time.monotonic() - started

    def running(self, service: str) -> bool:
        result = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Running}}", self.container(service)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result.stdout.strip() == "true"


def http_json(url: str, timeout: float = 10) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def eventually(what: str, check: Callable[[], Any], timeout: float, every: float = 1) -> Any:
    start = time.monotonic()
    last: Any = None
    while time.monotonic() - start < timeout:
        try:
            last = check()
        except (OSError, ValueError) as exc:  # not answering yet
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")
