"""The source stops while tidemark streams (``docker compose down``, ``systemctl restart
postgresql``, a maintenance window): neither holds the other up, and nothing is lost.

PostgreSQL's fast shutdown ends every session but the walsenders, and a logical
walsender stays until its client confirmed everything it was sent. tidemark confirms
only what it committed, and it commits only under its leader lease, whose session the
shutdown just ended: each waited for the other until ``wal_sender_timeout`` (the server
never stopped within 40 s here) and a SIGTERM to tidemark then waited its grace period
for a commit that could not come, and a worker thread after it (19-54 s). Now tidemark
ends its stream when the lease tells it the source is shutting down, and a stop gives
up the commits that wait for the lease (the source sends those changes again).

Runs ``tidemark run`` as a process, against a server of its own (it is stopped).
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
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tidemark.demo.postgres import EmbeddedPostgres, free_port
from tidemark.read import arrow_current
from tidemark.sink.schema import METADATA_NAMES


def get_json(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_for(
    what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"tidemark exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within 180 s\n{log.read_text()[-4000:]}")


def start_tidemark(dsn: str, root: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env |= {
        "TIDEMARK_SOURCE__DSN": dsn,
        "TIDEMARK_SINK__ROOT": str(root),
        "TIDEMARK_HTTP__PORT": str(port),
        "TIDEMARK_SHAPES": json.dumps([{"name": "t", "table": "public.t"}]),
        "TIDEMARK_SHUTDOWN_GRACE_S": "30",
        "TIDEMARK_LOG_FORMAT": "json",
    }
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "tidemark", "run"], env=env, stdout=out, stderr=subprocess.STDOUT
    )


def insert(dsn: str, first: int, count: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first, first + count):  # one transaction each
            conn.execute("insert into t values (%s, %s)", (i, f"row {i}"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("order", ["source first", "together"])
def test_a_source_shutdown_is_neither_held_up_nor_holds_tidemark_up(
    tmp_path: Path, order: str
) -> None:
    """``source first``: the server stops, then tidemark is asked to; ``together``: as
    ``compose down`` does, tidemark's final flush meets the server's shutdown."""
    pg = EmbeddedPostgres("wheel").start()
    proc: subprocess.Popen[bytes] | None = None
    log = tmp_path / "tidemark.log"
    try:
        dsn = pg.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("create table t (id int primary key, v text)")
        insert(dsn, 1, 50)
        root, port = tmp_path / "lake", free_port()
        proc = start_tidemark(dsn, root, port, log)
        shape = f"http://127.0.0.1:{port}/v1/shapes/t"
        wait_for("shape t active", lambda: get_json(shape)[1].get("state") == "active", proc, log)
        # changes tidemark has received but not committed yet when the server stops
        insert(dsn, 100, 20)
        time.sleep(0.2)
        stopping = time.monotonic()
        assert pg._process is not None
        if order == "together":
            proc.send_signal(signal.SIGTERM)
            terminated = time.monotonic()
        pg._process.send_signal(signal.SIGINT)  # fast shutdown, as `pg_ctl stop` does
        try:
            pg._process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail(f"PostgreSQL did not stop within 40 s:\n{log.read_text()[-3000:]}")
        stopped_s = time.monotonic() - stopping
        pg._process = None
        if order == "source first":
            time.sleep(1)
            terminated = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        exited_s = time.monotonic() - terminated
        proc = None
        print(f"\nsource stopped in {stopped_s:.1f} s; tidemark exited {exited_s:.1f} s later")
        assert stopped_s <= 10, f"the server's shutdown waited {stopped_s:.1f} s for tidemark"
        assert code == 0 and exited_s <= 10, f"tidemark exited {code} after {exited_s:.1f} s"
        # the server back, tidemark again: what was not committed came again
        pg.restart()
        proc = start_tidemark(dsn, root, port, log)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            expected = {(i, v) for i, v in conn.execute("select id, v from t").fetchall()}
        wait = f"http://127.0.0.1:{port}/v1/progress/wait?lsn={row[0]}&shape=t&timeout=120"
        wait_for("t reaches the source's LSN", lambda: get_json(wait)[0] == 200, proc, log)
        lake = arrow_current(root, "t")
        columns = [c for c in lake.column_names if c not in METADATA_NAMES]
        assert columns == ["id", "v"]
        assert {(r["id"], r["v"]) for r in lake.to_pylist()} == expected
        assert len(expected) == 70
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        pg.stop()
