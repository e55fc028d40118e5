"""A shape removed and declared again while its previous writer's batch is in a flush
round never takes that batch's rows (``FlushScheduler.settled``).

Many shapes on one table (each takes a slice of the rows) make rounds long; a workload
moves rows in and out of one shape's predicate while that shape is removed
(``DELETE``) and added again with the other predicate (``POST``), quickly, again and
again. After each re-definition the workload pauses, the shape catches up, and its
folded table must equal Postgres: an old round committing after the new snapshot was
listed would leave rows of the old predicate (or older versions of rows) in it.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request
from pathlib import Path

import psycopg

from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import get_json, service_env, start_service, stop_service, tail, wait_shapes
from .service_support import current_lsn

OTHERS = int(os.environ.get("TIDEMARK_TEST_REDEFINE_SHAPES", "299"))
REDEFINITIONS = int(os.environ.get("TIDEMARK_TEST_REDEFINITIONS", "8"))
PREDICATES = ["grp < 5", "grp >= 5"]
ROWS = 2000


class Mover(threading.Thread):
    """Transactions moving rows between groups (in and out of both predicates),
    paused while a comparison runs."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.running = threading.Event()
        self.idle = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(11)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                if not self.running.is_set():
                    self.idle.set()
                    self.running.wait(0.1)
                    continue
                self.idle.clear()
                with conn.transaction():
                    for _ in range(rng.randint(1, 8)):
                        conn.execute(
                            "update items set grp = %s, payload = payload || 'm' where id = %s",
                            (rng.randint(0, 9), rng.randint(1, ROWS)),
                        )
                self.transactions += 1
                time.sleep(0.01)

    def pause(self) -> None:
        self.running.clear()
        assert self.idle.wait(30)


def call(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_active(port: int, name: str, proc, log: Path, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, tail(log)
        try:
            status, body = get_json(port, f"/v1/shapes/{name}")
        except OSError:  # (not listening yet)
            status, body = 0, {}
        if status == 200 and body.get("state") == "active":
            return
        time.sleep(0.2)
    raise AssertionError(f"shape {name} not active within {timeout}s:\n{tail(log)}")


@ONE_SERVER
def test_a_shape_redefined_while_its_batch_is_in_a_round_never_takes_its_rows(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    pg_db.execute(
        "create table items (id int primary key, grp int, payload text);"
        "alter table items replica identity full;"
        f"insert into items select g, g % 10, 'p' from generate_series(1, {ROWS}) g"
    )
    shapes = [
        {"name": f"o{i:03d}", "table": "public.items", "where": f"id % {OTHERS} = {i}"}
        for i in range(OTHERS)
    ]
    shapes.append({"name": "s", "table": "public.items", "where": PREDICATES[0]})
    root = tmp_path / "lake"
    port = free_port()
    log = tmp_path / "service.log"
    env = service_env(dsn=pg_db.dsn, root=root, port=port, name="tm_redefine", shapes=shapes)
    env["TIDEMARK_CURRENT__ENABLED"] = "false"
    proc = start_service(env, log)
    mover = Mover(pg_db.dsn)
    wrong: list[str] = []
    try:
        wait_active(port, "s", proc, log, timeout=600)
        mover.start()
        for n in range(1, REDEFINITIONS + 1):
            predicate = PREDICATES[n % 2]
            mover.running.set()
            time.sleep(random.Random(n).uniform(1.0, 3.0))  # rounds in flight
            status, body = call(port, "DELETE", "/v1/shapes/s")
            assert status in (200, 204), (status, body)
            status, body = call(
                port,
                "POST",
                "/v1/shapes",
                {"name": "s", "table": "public.items", "where": predicate},
            )
            assert status in (200, 201, 202), (status, body)
            wait_active(port, "s", proc, log)
            mover.pause()
            wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), ["s"], timeout=180)
            result = compare_shape(
                spark, str(root), "s", f"select * from items where {predicate}", pg_db.dsn
            )
            if not result.equal:
                wrong.append(f"re-definition {n} ({predicate}): {result.describe()}")
    finally:
        mover.stop.set()
        mover.running.set()
        stop_service(proc, log)
    print(f"{REDEFINITIONS} re-definitions among {OTHERS} other shapes, {mover.transactions} moves")
    assert not wrong, "\n".join(wrong)
