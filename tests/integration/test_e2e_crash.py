"""Crash safety end to end: the service (a real process, real Spark) is SIGKILLed
at random points of a running workload, several times. After the final restart no
row is lost or duplicated, and, sampled throughout, the slot's confirmed_flush_lsn
never passed what the sinks had committed: every row the tables finally hold with a
commit LSN below a sampled confirmed position was already in the tables when that
sample was taken."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable

from tidemark import read
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.errors import SinkError
from tidemark.lsn import Lsn
from tidemark.sink.delta.table import table_path
from tidemark.sink.root import root_format
from tidemark.state import objectstore

from .conftest import PgDatabase
from .remote_service import start_service

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [
    {"name": "hot", "table": "public.items", "where": "grp = 0"},
    {"name": "items_all", "table": "public.items", "columns": ["grp"]},
]
TRUTH = {
    "hot": "select * from items where grp = 0",
    "items_all": "select id, grp from items",
}


class Workload(threading.Thread):
    """Small transactions of inserts, updates moving rows between groups, deletes."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(11)
        next_id = 1
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    for _ in range(rng.randint(1, 8)):
                        roll = rng.random()
                        if roll < 0.6 or next_id < 10:
                            conn.execute(
                                "insert into items values (%s, %s, %s)",
                                (next_id, rng.randint(0, 2), "p" * rng.randint(1, 50)),
                            )
                            next_id += 1
                        elif roll < 0.9:
                            conn.execute(
                                "update items set grp = %s, payload = payload || 'u' where id = %s",
                                (rng.randint(0, 2), rng.randint(1, next_id)),
                            )
                        else:
                            conn.execute(
                                "delete from items where id = %s", (rng.randint(1, next_id),)
                            )
                self.transactions += 1
                time.sleep(0.01)


def committed_lsns(
    root: Path | str, shape: str, stream_only: bool = False
) -> list[tuple[int, int]]:
    """(_lsn, _op) of every committed row; ``stream_only`` leaves out backfill rows,
    which come from a snapshot, not from the acknowledged stream."""
    if root_format(root).name == "iceberg":
        try:
            table = read.arrow_changelog(root, shape)
        except SinkError:  # (no table yet)
            return []
        table = table.select(["_lsn", "_op", "_kind"])
    else:
        table = _delta_changes(root, shape)
        if table is None:
            return []
    return [
        (lsn, op)
        for lsn, op, kind in zip(
            *(table.column(c).to_pylist() for c in ("_lsn", "_op", "_kind")), strict=True
        )
        if not (stream_only and kind == "snapshot")
    ]


def _delta_changes(root: Path | str, shape: str) -> Any:
    """The Delta changelog's rows as deltalake reads them (None: no table yet)."""
    path = str(table_path(root, shape))
    options = objectstore.storage_options(path)
    if not DeltaTable.is_deltatable(path, storage_options=options):
        return None
    return DeltaTable(path, storage_options=options).to_pyarrow_table(
        columns=["_lsn", "_op", "_kind"]
    )


class Sampler(threading.Thread):
    """(confirmed_flush_lsn, then each shape's committed (lsn, op) set) every 0.5 s."""

    def __init__(self, dsn: str, root: Path | str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.root = dsn, root
        self.stop = threading.Event()
        self.samples: list[tuple[int, dict[str, set[int]]]] = []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.5):
                row = conn.execute(
                    "select confirmed_flush_lsn::text from pg_replication_slots"
                    " where slot_name = 'tm_crash'"
                ).fetchone()
                if row is None:
                    continue
                confirmed = int(Lsn.parse(row[0]))
                # read the sinks *after* the confirmed position: anything acknowledged
                # must already be committed, so it must be in what we read now
                tables = {
                    s["name"]: {lsn for lsn, _ in committed_lsns(self.root, s["name"])}
                    for s in SHAPES
                }
                self.samples.append((confirmed, tables))


def wait_streaming(port: int, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "service exited during start-up"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if json.loads(r.read())["phase"] == "streaming":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("service did not start streaming")


def test_sigkilled_service_loses_and_duplicates_nothing_and_never_acks_early(
    pg_db: PgDatabase,
    tmp_path: Path,
    spark,  # type: ignore[no-untyped-def]
) -> None:
    killed_runs(pg_db, tmp_path, spark, tmp_path / "lake", {}, kills=3)


def killed_runs(
    pg_db: PgDatabase,
    tmp_path: Path,
    spark: Any,
    root: Path | str,
    extra_env: dict[str, str],
    kills: int,
) -> None:
    """The service SIGKILLed ``kills`` times at random points of a workload, then every
    shape compared with Postgres, and every sampled acknowledgement with the tables."""
    pg_db.execute(
        "create table items (id int primary key, grp int, payload text);"
        "alter table items replica identity full"
    )
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "service"),
        "TIDEMARK_SOURCE__DSN": pg_db.dsn,
        "TIDEMARK_SOURCE__SLOT": "tm_crash",
        "TIDEMARK_SOURCE__PUBLICATION": "tm_crash",
        "TIDEMARK_SINK__ROOT": str(root),
        "TIDEMARK_HTTP__PORT": str(port),
        "TIDEMARK_FLUSH__MAX_AGE_S": "0.3",
        "TIDEMARK_MONITOR__PERIOD_S": "0.5",
        "TIDEMARK_SHAPES": json.dumps(SHAPES),
        "TIDEMARK_LOG_FORMAT": "json",
        "TIDEMARK_CONFIG": str(tmp_path / "none.toml"),
        **extra_env,
    }
    log = tmp_path / "service.log"
    workload = Workload(pg_db.dsn)
    sampler = Sampler(pg_db.dsn, root)
    rng = random.Random(3)
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc)
        workload.start()
        sampler.start()
        for _ in range(kills):
            time.sleep(rng.uniform(2.0, 6.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            time.sleep(rng.uniform(0.0, 1.0))
            proc = start_service(env, log)
            wait_streaming(port, proc)
        time.sleep(2.0)
        workload.stop.set()
        workload.join(timeout=30)
        with psycopg.connect(pg_db.dsn) as conn:
            target = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        for shape in SHAPES:
            url = (
                f"http://127.0.0.1:{port}/v1/progress/wait?lsn={target}&timeout=120"
                f"&shape={shape['name']}"
            )
            with urllib.request.urlopen(url, timeout=130) as r:
                assert r.status == 200
        sampler.stop.set()
        sampler.join(timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        workload.stop.set()
        sampler.stop.set()
        if proc.poll() is None:
            proc.kill()
    assert workload.transactions > 200
    # no row lost, none duplicated
    for name, query in TRUTH.items():
        result = compare_shape(spark, str(root), name, query, pg_db.dsn)
        assert result.equal, result.describe()
        counts = Counter(committed_lsns(root, name))
        assert max(counts.values()) == 1, f"{name}: a (_lsn, _op) appears twice"
    # never acknowledged early, at any sampled moment
    finals = {
        s["name"]: {lsn for lsn, _ in committed_lsns(root, s["name"], stream_only=True)}
        for s in SHAPES
    }
    assert len(sampler.samples) > 20
    for confirmed, tables in sampler.samples:
        for name, lsns in finals.items():
            early = {lsn for lsn in lsns if lsn < confirmed} - tables[name]
            assert not early, (
                f"{name}: confirmed_flush_lsn {Lsn(confirmed)} passed "
                f"uncommitted transactions {sorted(map(Lsn, early))[:5]}"
            )
