"""``make bench`` section ``takeover``: how long a standby needs to take over a
SIGKILLed leader (docs/guides/high-availability.md), measured ``tries`` times.

Two ``tidemark run`` processes with one configuration (HTTP ports apart) on an
embedded PostgreSQL 16 and one sink root, 2 shapes, a steady trickle of inserts
(about 200 rows/s). Each try: wait until one leads and streams and the other stands
by, SIGKILL the leader, and time

* ``streaming``: until the standby reports ``role = leader, phase = streaming``;
* ``acked``: until the slot's ``confirmed_flush_lsn`` passes the WAL position taken
  at the kill (the first acknowledgement of data the new leader committed).

The killed process is then started again: it becomes the next try's standby.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from tidemark.demo.postgres import EmbeddedPostgres, free_port
from tidemark.lsn import Lsn

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [
    {"name": "all_events", "table": "public.events"},
    {"name": "clicks", "table": "public.events", "where": "kind = 'click'"},
]


def _env(dsn: str, root: Path, port: int) -> dict[str, str]:
    # (not the Spark Connect mode pyspark sets in this process once the cluster
    # section's Connect session was built: the services run classic local Spark)
    connect = {"SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"}
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_") and k not in connect
    }
    env.update(
        {
            "PYTHONPATH": str(ROOT / "service"),
            "PYSPARK_PYTHON": sys.executable,
            "TIDEMARK_CONFIG": str(root.parent / "none.toml"),
            "TIDEMARK_SOURCE__DSN": dsn,
            "TIDEMARK_SOURCE__SLOT": "tm_takeover",
            "TIDEMARK_SOURCE__PUBLICATION": "tm_takeover",
            "TIDEMARK_SINK__ROOT": str(root),
            "TIDEMARK_HTTP__PORT": str(port),
            "TIDEMARK_FLUSH__MAX_AGE_S": "0.3",
            "TIDEMARK_LEASE__RETRY_S": "0.2",
            "TIDEMARK_SHAPES": json.dumps(SHAPES),
            "TIDEMARK_LOG_FORMAT": "json",
            "TIDEMARK_LOG_LEVEL": "warning",
        }
    )
    return env


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tidemark", "run"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def _health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _wait(port: int, role: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = _health(port)
        if h and h.get("role") == role and (role == "standby" or h.get("phase") == "streaming"):
            return
        time.sleep(0.05)
    raise RuntimeError(f"no {role} on port {port} after {timeout}s")


def _lsn(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(Lsn.parse(str(row[0]))) if row and row[0] else 0


def main(tries: int = 5) -> dict[str, float]:
    print(f"== takeover: a standby takes over a SIGKILLed leader, {tries} tries ==")
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-takeover-"))
    streaming, acked = [], []
    with EmbeddedPostgres() as pg:
        dsn = pg.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("create table events (id bigserial primary key, kind text, n int)")
            conn.execute("alter table events replica identity full")  # 'clicks' reads kind
        stop = threading.Event()

        def trickle() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute(
                        "insert into events (kind, n) select (array['click','view'])[g % 2 + 1],"
                        " g from generate_series(1, 20) g"
                    )
                    time.sleep(0.1)

        writer = threading.Thread(target=trickle, daemon=True)
        writer.start()
        ports = [free_port(), free_port()]
        logs = [work / "a.log", work / "b.log"]
        envs = [_env(dsn, work / "lake", p) for p in ports]
        procs = [_start(envs[0], logs[0]), None]
        try:
            _wait(ports[0], "leader")
            procs[1] = _start(envs[1], logs[1])
            leader = 0
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(tries):
                    standby = 1 - leader
                    _wait(ports[standby], "standby")
                    time.sleep(2.0)  # the leader acknowledges steadily
                    mark = _lsn(conn, "select pg_current_wal_lsn()")
                    killed_at = time.monotonic()
                    procs[leader].send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                    _wait(ports[standby], "leader", timeout=120)
                    streaming.append(time.monotonic() - killed_at)
                    while (
                        _lsn(
                            conn,
                            "select confirmed_flush_lsn from pg_replication_slots"
                            " where slot_name = 'tm_takeover'",
                        )
                        < mark
                    ):
                        time.sleep(0.05)
                    acked.append(time.monotonic() - killed_at)
                    print(f"  try: streaming {streaming[-1]:.2f}s, acknowledged {acked[-1]:.2f}s")
                    procs[leader].wait(timeout=30)  # type: ignore[union-attr]
                    procs[leader] = _start(envs[leader], logs[leader])
                    leader = standby
        finally:
            stop.set()
            writer.join(timeout=10)
            for proc in procs:
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    result = {
        "streaming_median_s": statistics.median(streaming),
        "streaming_max_s": max(streaming),
        "acked_median_s": statistics.median(acked),
        "acked_max_s": max(acked),
    }
    print(
        f"SIGKILL -> standby streaming: median {result['streaming_median_s']:.2f}s, "
        f"max {result['streaming_max_s']:.2f}s; -> first acknowledgement past the kill: "
        f"median {result['acked_median_s']:.2f}s, max {result['acked_max_s']:.2f}s "
        "(target: streaming within 15 s)"
    )
    return result


if __name__ == "__main__":
    main()
