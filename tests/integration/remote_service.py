"""``python -m tidemark run`` as its own process, configured by environment, and
waiting on it over its HTTP API.

The suite's own Spark session (``local[2]``, session-scoped) lives in the pytest
process, and one process holds one SparkContext; a Spark Connect client even
switches pyspark's whole process into Connect mode. So a service that writes
through a standalone cluster or a Connect server runs as a child process, the way
an operator runs it (the real CLI path), and the test reads the result afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tidemark.demo.postgres import death_signal_prefix

ROOT = Path(__file__).resolve().parents[2]


def service_env(
    *, dsn: str, root: Path, port: int, name: str, shapes: list[dict[str, Any]], **spark: str
) -> dict[str, str]:
    """The environment of a service on ``dsn`` writing under ``root`` (``spark``:
    ``master=...``/``remote=...``/``conf=<json>``/``app_name=...`` of ``[spark]``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT / "service"),
            "PYSPARK_PYTHON": sys.executable,
            "TIDEMARK_CONFIG": str(root.parent / f"{name}-none.toml"),
            "TIDEMARK_SOURCE__DSN": dsn,
            "TIDEMARK_SOURCE__SLOT": name,
            "TIDEMARK_SOURCE__PUBLICATION": name,
            "TIDEMARK_SINK__ROOT": str(root),
            "TIDEMARK_HTTP__PORT": str(port),
            "TIDEMARK_FLUSH__MAX_AGE_S": "0.3",
            "TIDEMARK_MONITOR__PERIOD_S": "0.5",
            "TIDEMARK_SHAPES": json.dumps(shapes),
            "TIDEMARK_LOG_FORMAT": "json",
            "TIDEMARK_CURRENT__FOLD_ON_STOP": "false",  # (the demo test's)
            # the JVM's warm-up (4-7 s of a core at each start) is test_warm_up's and
            # the lease tests'; elsewhere it only competes with the other worker
            "TIDEMARK_SPARK__WARM_UP": "false",
        }
    )
    for key, value in spark.items():
        env[f"TIDEMARK_SPARK__{key.upper()}"] = value
    return env


def start_service(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``tidemark run``; it gets SIGTERM (a clean stop) if the test process dies."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*death_signal_prefix(signal.SIGTERM), sys.executable, "-m", "tidemark", "run"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def get_json(port: int, path: str, timeout: float = 10) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_streaming(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"service exited during start-up:\n{tail(log)}"
        try:
            if get_json(port, "/healthz", timeout=2)[1]["phase"] == "streaming":
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"service did not start streaming in {timeout}s:\n{tail(log)}")


def wait_shapes(port: int, lsn: str, shapes: list[str], timeout: float) -> None:
    """Until every shape's frontier (and Postgres's replay position) reach ``lsn``."""
    for shape in shapes:
        status, body = get_json(
            port,
            f"/v1/progress/wait?lsn={lsn}&timeout={timeout:.0f}&shape={shape}",
            timeout=timeout + 10,
        )
        assert status == 200, (shape, status, body)


def stop_service(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    """SIGTERM, then the clean exit the service promises (0)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"service did not stop in {timeout}s:\n{tail(log)}") from None
    assert code == 0, f"service exited with {code}:\n{tail(log)}"


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (from /proc), by pid, with its command name."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        names[int(entry.name)] = name
        children.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out[child] = names[child]
        todo += children.get(child, [])
    return out


def tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
