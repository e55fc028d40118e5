"""A leader deposed while alive writes nothing (``tidemark.state.fencing``).

Two ``tidemark run`` processes share a slot and a sink root. The leader's Python process
is SIGSTOPped while it streams a workload (flush rounds about every 0.3 s, current
tables refreshed every second: a round and a refresh are in flight, or their Spark jobs
are, almost always); its lease session is ended from the server, as a partition from
Postgres would end it; the standby takes over and streams. Then the new leader's whole
process tree is frozen for a moment and the old one is continued: whatever changes
under the root during that window is the old leader's, and nothing may (a file listing
and every state file compared). It must exit with status 1 saying why. At the end every
shape equals Postgres with no ``(_lsn, _op)`` twice, and every commit made after the
takeover carries the new leader's epoch.

The second scenario: the source stops answering the lease connection (its backend
SIGSTOPped): the leader suspends its writes within ``[lease] deadline_s`` and resumes
them once the lease is confirmed again.

A network cut is simulated by ending the session on the server (and by stopping the
backend), not by dropping packets.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn
from tidemark.state.fencing import read_epoch

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import (
    descendants,
    get_json,
    service_env,
    start_service,
    stop_service,
    tail,
    wait_shapes,
)
from .service_support import current_lsn
from .test_backfill import keys_unique

SCHEMA = """
create table items (id int primary key, grp int, payload text);
alter table items replica identity full;
"""
SHAPES = [
    {"name": "hot", "table": "public.items", "where": "grp = 0"},
    {"name": "all_items", "table": "public.items"},
    {"name": "groups", "table": "public.items", "columns": ["grp"]},
]
TRUTH = {
    "hot": "select * from items where grp = 0",
    "all_items": "select * from items",
    "groups": "select id, grp from items",
}


class Workload(threading.Thread):
    """Small transactions: inserts, updates moving rows between groups, deletes."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        rng = random.Random(3)
        next_id = 1
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    for _ in range(rng.randint(1, 5)):
                        roll = rng.random()
                        if roll < 0.6 or next_id < 10:
                            conn.execute(
                                "insert into items values (%s, %s, %s)",
                                (next_id, rng.randint(0, 2), "p" * rng.randint(1, 30)),
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
                time.sleep(0.005)


def lease_backend(dsn: str, slot: str) -> int:
    """The pid of the backend holding the leader lease of ``slot``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select l.pid from pg_locks l where l.locktype = 'advisory' and l.granted"
            " and ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(%s, 0)",
            (f"tidemark:lease:{slot}",),
        ).fetchone()
    assert row is not None, "nobody holds the lease"
    return int(row[0])


def wait_role(port: int, role: str, proc: Any, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"instance exited:\n{tail(log)}"
        try:
            status, body = get_json(port, "/healthz", timeout=2)
            leading = role == "standby" or body["phase"] == "streaming"
            if status == 200 and body["role"] == role and leading:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no {role} on port {port} within {timeout}s:\n{tail(log)}")


# every file under a root: size, mtime and (state files, log entries) content
Listing = dict[str, tuple[int, int, bytes | None]]


def changed_paths(before: Listing, after: Listing) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def is_data_file(path: str) -> bool:
    """A file Spark writes into a table's ``data/`` folder (a part file, its
    ``_temporary`` attempt): what a job started before a suspension may still write."""
    parts = path.split("/")
    return len(parts) > 3 and parts[0] == "tables" and parts[2] == "data"


def data_files_settled(root: Path, quiet_s: float, timeout: float) -> Listing:
    """The listing once no file has changed for ``quiet_s``. Meanwhile only data files
    may change: Spark jobs started before the suspension finish writing (no commit
    names their files; the high-availability guide says so); a log entry, state file,
    spool or round input changing fails at once."""
    deadline = time.monotonic() + timeout
    last, quiet_since = listing(root), time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, f"data files still changing after {timeout:.0f} s"
        time.sleep(0.25)
        now = listing(root)
        moved = changed_paths(last, now)
        others = [p for p in moved if not is_data_file(p)]
        assert not others, f"written while the lease was unconfirmed: {others}"
        if moved:
            last, quiet_since = now, time.monotonic()
    return last


def listing(root: Path) -> Listing:
    """Every file under ``root``: size, mtime and (state files, log entries) content."""
    out: Listing = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            try:
                st = path.stat()
                small = name.endswith(".json") and st.st_size < 1_000_000
                out[str(path.relative_to(root))] = (
                    st.st_size,
                    st.st_mtime_ns,
                    path.read_bytes() if small else None,
                )
            except FileNotFoundError:
                continue
    return out


def _task_output(path: str) -> bool:
    """A file a Spark task writes (data, its checksum, its commit protocol's marks),
    never a log entry or a state file."""
    parts = path.split("/")
    if "_delta_log" in parts or parts[0] == "_tidemark":
        return False
    name = parts[-1]
    return name.endswith((".parquet", ".crc")) or name == "_SUCCESS" or "_temporary" in parts


def signal_tree(pid: int, sig: signal.Signals) -> None:
    for child in [pid, *descendants(pid)]:
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            continue


def catalog_locked(database: Path) -> bool:
    """Whether another process holds a lock on the SQLite catalog that keeps a writer
    out (a write transaction under way, or its commit)."""
    import sqlite3

    conn = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        conn.execute("begin immediate")
        conn.execute("rollback")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return True
    finally:
        conn.close()


def freeze(pid: int, root: Path, fmt: str, *, tree: bool = False) -> None:
    """SIGSTOP ``pid`` (``tree``: with its descendants); with Iceberg, at a moment it
    holds no lock on the catalog's SQLite file. A file lock cannot be fenced: an
    instance frozen inside a catalog commit keeps everyone out of the catalog until it
    runs again (docs/guides/iceberg.md), so a freeze that lands there is taken back and
    tried again."""
    send = signal_tree if tree else os.kill
    for _ in range(100):
        send(pid, signal.SIGSTOP)
        if fmt != "iceberg" or not catalog_locked(root / "_tidemark" / "iceberg.db"):
            return
        send(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"process {pid} held the catalog's lock at every try")


def commits_since(path: Path, versions: int) -> list[dict[str, Any]]:
    """The commitInfo of every log entry of the table at ``path`` after ``versions``."""
    out = []
    for entry in sorted((path / "_delta_log").glob("*.json")):
        if int(entry.stem) <= versions:
            continue
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                out.append(action["commitInfo"])
    return out


def versions_of(root: Path) -> dict[Path, int]:
    out = {}
    for kind in ("tables", "current"):
        if (root / kind).is_dir():
            for path in (root / kind).iterdir():
                if DeltaTable.is_deltatable(str(path)):
                    out[path] = DeltaTable(str(path)).version()
    return out


# each instance an application of its own on the standalone cluster (one core each: the
# worker has two, and the frozen leader's executor keeps its core until it exits)
CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "512m",
    "spark.cores.max": "1",
}


@ONE_SERVER
@pytest.mark.parametrize(
    "engine",
    ["local", "local-iceberg", pytest.param("cluster", marks=pytest.mark.spark_cluster)],
)
def test_a_leader_deposed_while_alive_writes_nothing_and_exits(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    engine: str,
    request: pytest.FixtureRequest,
) -> None:
    pg_db.execute(SCHEMA)
    root = tmp_path / "lake"
    slot = "tm_deposed"
    ports = [free_port(), free_port()]
    logs = [tmp_path / "old.log", tmp_path / "new.log"]
    spark_args: dict[str, str] = {}
    if engine == "cluster":
        cluster = request.getfixturevalue("spark_cluster")
        spark_args = {"master": cluster.master_url, "conf": json.dumps(CLUSTER_CONF)}
    envs = [
        service_env(dsn=pg_db.dsn, root=root, port=port, name=slot, shapes=SHAPES, **spark_args)
        for port in ports
    ]
    fmt = "iceberg" if engine.endswith("iceberg") else "delta"
    for env in envs:
        env["TIDEMARK_CURRENT__REFRESH_S"] = "1"
        env["TIDEMARK_SINK__FORMAT"] = fmt
        if engine == "cluster":
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
    old = start_service(envs[0], logs[0])
    new = None
    workload = Workload(pg_db.dsn)
    try:
        wait_role(ports[0], "leader", old, logs[0], timeout=240)
        new = start_service(envs[1], logs[1])
        wait_role(ports[1], "standby", new, logs[1], timeout=240)
        workload.start()
        time.sleep(6.0)  # rounds, refreshes and their Spark jobs under way
        # when the old leader freezes mid-stream and its lease session ends on the server
        old_epoch = read_epoch(root)
        lease_pid = lease_backend(pg_db.dsn, slot)
        freeze(old.pid, root, fmt)
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("select pg_terminate_backend(%s)", (lease_pid,))
        # then the standby takes over (ending the old walsender) and streams
        wait_role(ports[1], "leader", new, logs[1], timeout=120)
        new_epoch = read_epoch(root)
        assert new_epoch == old_epoch + 1
        time.sleep(3.0)  # the new leader commits and refreshes
        # when the new leader is frozen, whatever changes under the root is the old one's
        freeze(new.pid, root, fmt, tree=True)
        time.sleep(0.5)
        before = listing(root)
        os.kill(old.pid, signal.SIGCONT)
        continued = time.monotonic()
        code = old.wait(timeout=60)
        exited_in = time.monotonic() - continued
        after = listing(root)
        signal_tree(new.pid, signal.SIGCONT)
        # then it exited with status 1, said why, and wrote nothing
        text = logs[0].read_text()
        assert code == 1, tail(logs[0])
        assert "lease.deposed" in text or "was lost" in text, tail(logs[0])
        # promptly: its writes waiting for the lease read the epoch file meanwhile, and
        # the slot the new leader acknowledges is not reported as acknowledged early
        assert exited_in < 20, f"exited {exited_in:.1f} s after it ran again:\n{tail(logs[0])}"
        assert "invariant.violated" not in text, tail(logs[0])
        changed = changed_paths(before, after)
        # data files its Spark tasks were already writing when it froze may still land
        # (new files no commit names: vacuum removes them); nothing else may change
        in_flight = [p for p in changed if p not in before and _task_output(p)]
        wrote = [p for p in changed if p not in in_flight]
        assert not wrote, f"the deposed leader wrote under the root: {wrote}"
        # the stream goes on under the new leader
        workload.stop.set()
        workload.join(timeout=30)
        target = format_lsn(current_lsn(pg_db.dsn))
        wait_shapes(ports[1], target, list(TRUTH), timeout=180)
        deadline = time.monotonic() + 120
        while "current.refreshed" not in logs[1].read_text():
            assert time.monotonic() < deadline, f"no refresh:\n{tail(logs[1])}"
            time.sleep(0.5)
        marked = versions_of(root) if fmt == "delta" else {}
    finally:
        workload.stop.set()
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                signal_tree(proc.pid, signal.SIGCONT)
        if old.poll() is None:
            old.kill()
        if new is not None:
            stop_service(new, logs[1])
    refused = text.count("Deposed")
    print(f"files of tasks in flight that landed after the takeover: {len(in_flight)}")
    print(f"workload: {workload.transactions} transactions; epochs {old_epoch} -> {new_epoch}")
    print(f"the deposed leader's log names the refusal {refused} times")
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
        assert keys_unique(root, shape), shape
    if fmt == "iceberg":
        check_iceberg_epochs(root, new_epoch)
        return
    # every table that existed at the takeover was marked then, and every commit after
    # the mark (in a table made after the takeover: every commit) is the new leader's
    assert any("current" in str(p) for p in marked), "no current table was refreshed"
    for path in marked:
        info = commits_since(path, -1)
        marks = [i for i in info if i.get("tidemark.operation") == "epoch"]
        if marks:
            assert marks[-1].get("tidemark.epoch") == str(new_epoch), path
            info = info[info.index(marks[-1]) + 1 :]
        epochs = {i.get("tidemark.epoch") for i in info if not i["operation"].startswith("VACUUM")}
        assert epochs <= {str(new_epoch)}, (path, epochs)
    assert all(any(t in str(p) for p in marked) for t in TRUTH)


def check_iceberg_epochs(root: Path, new_epoch: int) -> None:
    """Every Iceberg table of the root carries the new leader's mark, and every snapshot
    after it is the new leader's (read with pyiceberg, from the catalog file)."""
    from tidemark.sink.iceberg.catalog import forget_catalogs
    from tidemark.sink.root import root_format

    forget_catalogs()
    tables = root_format(root)
    catalog = tables.catalog(root)  # type: ignore[attr-defined]
    seen = 0
    for namespace in ("tidemark", "tidemark_current"):
        for ident in catalog.list_tables(namespace):
            table = catalog.load_table(ident)
            lineage = []
            snap = table.current_snapshot()
            while snap is not None:
                lineage.append(dict(snap.summary.additional_properties))
                parent = snap.parent_snapshot_id
                snap = None if parent is None else table.snapshot_by_id(parent)
            lineage.reverse()
            assert lineage[-1].get("tidemark-epoch") == str(new_epoch), ident
            marks = [i for i, s in enumerate(lineage) if s.get("tidemark.operation") == "epoch"]
            after = lineage[marks[-1] + 1 :] if marks else lineage
            assert {s.get("tidemark.epoch") for s in after} <= {str(new_epoch)}, ident
            seen += 1
    assert seen >= len(TRUTH), seen
    forget_catalogs()


@ONE_SERVER
def test_a_leader_whose_lease_check_hangs_stops_writing_within_the_deadline(
    pg_db: PgDatabase,
    tmp_path: Path,
) -> None:
    pg_db.execute(SCHEMA)
    root = tmp_path / "lake"
    slot = "tm_hang"
    port = free_port()
    log = tmp_path / "leader.log"
    env = service_env(dsn=pg_db.dsn, root=root, port=port, name=slot, shapes=SHAPES, warm_up="true")
    env["TIDEMARK_LEASE__DEADLINE_S"] = "3"
    proc = start_service(env, log)
    workload = Workload(pg_db.dsn)
    backend = None
    try:
        wait_role(port, "leader", proc, log, timeout=240)
        # the JVM's warm-up done: while it runs, a round's job waits for the cores, and
        # its data files landed 11.5 s after it began (a slow machine), long after the
        # suspension below
        deadline = time.monotonic() + 180
        while not any(e in log.read_text() for e in ("spark.warmed", "spark.warm_up_failed")):
            assert time.monotonic() < deadline and proc.poll() is None, tail(log)
            time.sleep(0.2)
        workload.start()
        time.sleep(3.0)
        # when the source stops answering the lease connection
        backend = lease_backend(pg_db.dsn, slot)
        os.kill(backend, signal.SIGSTOP)
        stopped = time.monotonic()
        # then within the deadline (3 s) the leader suspends its writes, and from then
        # on nothing under the root changes (a round already committing may end; the
        # Spark jobs already running may still write their data files, which took up
        # to 3 s on a slow machine: they settle, and nothing else moves meanwhile)
        while "lease.writes_suspended" not in log.read_text():
            assert time.monotonic() - stopped < 3.0 + 2.0, tail(log)
            time.sleep(0.1)
        suspended_after = time.monotonic() - stopped
        time.sleep(1.5)
        before = data_files_settled(root, quiet_s=5.0, timeout=60)
        time.sleep(4.0)
        changed = changed_paths(before, listing(root))
        assert not changed, f"written while the lease was unconfirmed: {changed}"
    finally:
        if backend is not None:
            os.kill(backend, signal.SIGCONT)
        workload.stop.set()
    try:
        workload.join(timeout=30)
        # when the backend answers again: its session was closed by the leader, the
        # lock is free, the leader takes it back and writes again with the same epoch
        epoch = read_epoch(root)
        target = format_lsn(current_lsn(pg_db.dsn))
        wait_shapes(port, target, list(TRUTH), timeout=180)
        assert "lease.writes_resumed" in log.read_text() or proc.poll() is not None, tail(log)
    finally:
        if proc.poll() is None:
            stop_service(proc, log)
    print(f"writes suspended {suspended_after:.1f}s after the lease backend stopped")
    assert read_epoch(root) == epoch
