"""Power loss end to end: the sink root on a filesystem that forgets what was not synced.

``tests/crashfs`` keeps every write and directory change that was not made durable by
``fsync``/``fdatasync`` of the file or ``fsync`` of its folder in a volatile layer; a
power loss freezes it, kills the service and its JVM, and drops that layer. A process
kill (``test_e2e_crash``) cannot show a missing sync: the page cache survives it.

The workload: small transactions into two tables (inserts, updates moving rows between
groups, deletes), streamed big transactions (``logical_decoding_work_mem`` 64 kB),
current tables refreshed every second, and upkeep (retention at 0 h, compaction,
vacuum) every few seconds; during the crashes a shape is added (a backfill commit)
and a column's type changes (a resync replacing the schema). Before each power loss
everything written so far is made durable (``CrashFS.writeback``: the kernel's own
flush every few seconds), so the cut takes the last seconds' unsynced writes, as in
the field. The cuts (``CUTS``) land at a random moment, or, armed with
``CrashFS.freeze_on``, the instant the log entry of a backfill commit, a streamed
(protocol v2) transaction's commit, a resync's schema-replacing commit, a current-table
refresh or a compaction appears, before anything syncs it (a retention cut is armed
in ``CUT_ON`` but not in ``CUTS``: in ``make test`` no retention commit came within
120 s of arming it once; ``test_sink_durability`` cuts inside retention). Before
each cut a *marker* transaction (rows no one changes again) is committed and the test waits
until ``confirmed_flush_lsn`` passed it: Postgres will never send it again, so a lost
marker is a lost acknowledged transaction. At the end every shape's folded table
equals Postgres, every marker is in it, no ``(_lsn, _op)`` is there twice, and every
table opens with deltalake.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from deltalake import DeltaTable

from tests.crashfs import CrashFS, require_crashfs
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import Lsn

from .conftest import PgDatabase, one_server
from .remote_service import service_env, start_service, wait_shapes
from .test_e2e_crash import wait_streaming

SHAPES = [
    {"name": "hot", "table": "public.items", "where": "grp = 0"},
    {"name": "items_all", "table": "public.items", "columns": ["grp"]},
    {"name": "orders", "table": "public.orders"},
]
ADDED = {"name": "late", "table": "public.orders", "where": "qty > 5"}
TRUTH = {
    "hot": "select id, grp, payload from items where grp = 0",
    "items_all": "select id, grp from items",
    "orders": "select id, qty, note from orders",
    "late": "select id, qty, note from orders where qty > 5",
}
MARKER_BASE = 10_000_000
# the cuts, in order: None lands at a random moment; the others the instant a log
# entry of that kind of commit appears (CrashFS.freeze_on), before it is synced
CUTS: list[str | None] = [
    "backfill",
    None,
    "streamed",
    "resync",
    "refresh",
    None,
    None,
    "compaction",
]
CUT_ON = {
    "backfill": ("*/tables/late/_delta_log/*.json", "backfill"),
    "resync": ("*/tables/*/_delta_log/*.json", "schemaReplaced"),
    "streamed": ("*/tables/*/_delta_log/*.json", "tidemark.streamedTransactions"),
    "refresh": ("*/current/*/_delta_log/*.json", "tidemark.bucketsWritten"),
    "retention": ("*/tables/*/_delta_log/*.json", "tidemark.retainedLsn"),  # (not in CUTS)
    "compaction": ("*/tables/*/_delta_log/*.json", "compaction"),
}
CRASHES = int(os.environ.get("TIDEMARK_TEST_POWER_LOSSES", str(len(CUTS))))
# Iceberg: cuts at random moments only (pyiceberg writes its metadata files in place
# and the catalog's pointer is a SQLite row: no file gets a name to arm a cut on)
ICEBERG_CUTS: list[str | None] = [None, None, None, None]


def table_rows(
    root: Path, kind: str, name: str, fmt: str, columns: list[str]
) -> list[dict[str, Any]]:
    """A table's rows as its format's own library reads them ([]: no table)."""
    if fmt == "delta":
        path = root / kind / name
        if not DeltaTable.is_deltatable(str(path)):
            return []
        return DeltaTable(str(path)).to_pyarrow_table(columns=columns).to_pylist()  # type: ignore[no-any-return]
    from tidemark.sink import table_format

    tables = table_format("iceberg")
    if kind == "tables":
        changelog = tables.changelog(root, name)
        if not changelog.exists():
            return []
        loaded = changelog.refresh()  # type: ignore[attr-defined]
    else:
        state = tables.current(root, name)
        if not state.exists():
            return []
        loaded = state.load()  # type: ignore[attr-defined]
    return loaded.scan(selected_fields=tuple(columns)).to_arrow().to_pylist()  # type: ignore[no-any-return]


class Workload(threading.Thread):
    """Small transactions on both tables, and every 60th a big one (streamed)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.transactions = 0
        self.failures = 0
        self.last_error = ""

    def run(self) -> None:
        rng = random.Random(5)
        next_id = 1
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    while not self.stop.is_set():
                        with conn.transaction():
                            if self.transactions % 60 == 59:  # ~120 kB: streamed
                                conn.execute(
                                    "insert into orders select g, g %% 10, repeat('x', 200)"
                                    " from generate_series(%s::int, %s::int) g",
                                    (next_id, next_id + 599),
                                )
                                next_id += 600
                            for _ in range(rng.randint(1, 6)):
                                roll = rng.random()
                                if roll < 0.55 or next_id < 10:
                                    conn.execute(
                                        "insert into items values (%s, %s, %s)",
                                        (next_id, rng.randint(0, 2), "p" * rng.randint(1, 40)),
                                    )
                                    conn.execute(
                                        "insert into orders values (%s, %s, 'o')",
                                        (next_id, rng.randint(0, 9)),
                                    )
                                    next_id += 1
                                elif roll < 0.85:
                                    conn.execute(
                                        "update items set grp = %s, payload = payload || 'u'"
                                        " where id = %s",
                                        (rng.randint(0, 2), rng.randint(1, next_id)),
                                    )
                                else:
                                    victim = rng.randint(1, next_id)
                                    conn.execute("delete from items where id = %s", (victim,))
                                    conn.execute("delete from orders where id = %s", (victim,))
                        self.transactions += 1
                        time.sleep(0.01)
            except psycopg.Error as exc:  # (the type change below holds a lock a moment)
                self.failures += 1
                self.last_error = str(exc)
                time.sleep(0.1)


def add_shape(port: int, definition: dict[str, str]) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/shapes",
        data=json.dumps(definition).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"adding a shape: {exc.code} {exc.read()!r}") from exc


def wait_frozen(crashfs: CrashFS, cut: str, proc: Any, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not crashfs.frozen():
        assert proc.poll() is None, f"the service exited before the {cut} cut"
        assert time.monotonic() < deadline, (
            f"no {cut} commit within {timeout:.0f} s:\n{log.read_text()[-2000:]}"
        )
        time.sleep(0.05)


def confirmed_flush(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
            (slot,),
        ).fetchone()
    return 0 if row is None or row[0] is None else int(Lsn.parse(row[0]))


def commit_marker(dsn: str, n: int) -> int:
    """A transaction no one changes again, in every table; its commit's end LSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("insert into items values (%s, 0, 'marker')", (MARKER_BASE + n,))
            conn.execute("insert into orders values (%s, 7, 'marker')", (MARKER_BASE + n,))
        row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return int(Lsn.parse(row[0]))


def wait_acknowledged(dsn: str, slot: str, lsn: int, log: Path, timeout: float = 240) -> None:
    """Until the slot's confirmed_flush_lsn reaches ``lsn``. The filesystem is a FUSE
    process in Python and the current tables refresh every second: a restarted service
    took 9 s on average to get there (8 cuts, 70 s in all, 2026-11-27), a loaded
    machine can take much longer."""
    deadline = time.monotonic() + timeout
    while (confirmed := confirmed_flush(dsn, slot)) < lsn:
        assert time.monotonic() < deadline, (
            f"confirmed_flush_lsn {Lsn(confirmed)} did not reach {Lsn(lsn)} in "
            f"{timeout:.0f} s; the service's log ends:\n{log.read_text()[-4000:]}"
        )
        time.sleep(0.1)


def check_acknowledged_survived(root: Path, markers: list[int], fmt: str = "delta") -> int:
    """On what a power loss left (before tidemark starts again, so a backfill cannot
    hide a loss): every shape the durable claims say is continuous holds every marker
    acknowledged so far (markers are never changed, so each is a row of the changelog,
    or of the current table once retention dropped it from the changelog). Tables are
    recovered as the service does at start. Returns how many shapes were checked."""
    from tidemark.continuity.store import ContinuityStore
    from tidemark.sink import table_format
    from tidemark.sink.iceberg.catalog import forget_catalogs

    forget_catalogs()  # (the catalog file was cut too: read it afresh)
    tables = table_format(fmt)
    store = ContinuityStore(root)
    wanted = {MARKER_BASE + n for n in markers}
    checked = 0
    for name in store.claimed():
        assert tables.changelog(root, name).recover(), f"{name}: claimed, but its table is gone"
        tables.current(root, name).recover()
        got: set[int] = set()
        for kind in ("tables", "current"):
            ids = [r["id"] for r in table_rows(root, kind, name, fmt, ["id"])]
            got |= {i for i in ids if i >= MARKER_BASE}
        assert got >= wanted, f"{name}: acknowledged markers lost: {sorted(wanted - got)}"
        checked += 1
    return checked


@pytest.fixture
def crashfs(tmp_path: Path) -> Iterator[CrashFS]:
    require_crashfs()
    with CrashFS.mounted(tmp_path / "crashfs") as fs:
        yield fs


@one_server()
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_power_loss_loses_no_acknowledged_transaction(
    pg_db: PgDatabase,
    tmp_path: Path,
    crashfs,  # type: ignore[no-untyped-def]
    spark,  # type: ignore[no-untyped-def]
    fmt: str,
) -> None:
    cuts = CUTS if fmt == "delta" else ICEBERG_CUTS
    crashes = min(CRASHES, len(cuts))
    pg_db.execute(
        "create table items (id int primary key, grp int, payload text);"
        "alter table items replica identity full;"
        "create table orders (id int primary key, qty int, note text);"
        "alter table orders replica identity full"
    )
    port = free_port()
    root = Path(crashfs.root) / "lake"
    slot = "tm_power"
    sep = "&" if "?" in pg_db.dsn else "?"
    dsn = f"{pg_db.dsn}{sep}options={quote('-c logical_decoding_work_mem=64kB')}"
    env = service_env(dsn=dsn, root=root, port=port, name=slot, shapes=SHAPES)
    env.update(
        {
            "TIDEMARK_CONFIG": str(tmp_path / "none.toml"),
            "TIDEMARK_CURRENT__REFRESH_S": "1",
            "TIDEMARK_SINK__CHANGELOG_RETENTION_HOURS": "0",
            "TIDEMARK_SINK__MAINTENANCE_EVERY_S": "3",
            "TIDEMARK_SOURCE__ON_STREAM_GAP": "fail",
            "TIDEMARK_SINK__FORMAT": fmt,
        }
    )
    log = tmp_path / "service.log"
    workload = Workload(pg_db.dsn)
    rng = random.Random(17)
    markers: list[int] = []
    checked = 0
    landed: list[str] = []
    timings: Counter[str] = Counter()
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc)
        # every declared shape backfilled and claimed before the first cut, however slow
        # the machine is: each cut then has them to check (the count asserted at the end;
        # on a loaded machine the first cuts came before the backfills, 2026-11-29)
        with psycopg.connect(pg_db.dsn) as conn:
            now = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        wait_shapes(port, now, [s["name"] for s in SHAPES], timeout=240)
        workload.start()
        for crash in range(crashes):
            cut = cuts[crash % len(cuts)]
            # what was written until now reaches the disk on its own (the kernel's
            # writeback); the cut below takes what is written from here on, unsynced
            phase = time.monotonic()
            crashfs.writeback()
            timings["writeback"] += time.monotonic() - phase
            markers.append(len(markers))
            marker = commit_marker(pg_db.dsn, markers[-1])
            phase = time.monotonic()
            wait_acknowledged(pg_db.dsn, slot, marker, log)
            timings["acknowledged"] += time.monotonic() - phase
            phase = time.monotonic()
            if cut is None:
                if fmt != "delta" and crash == 1:  # (a backfill under way, or just done)
                    add_shape(port, ADDED)
                time.sleep(rng.uniform(0.0, 2.0))
            else:  # the instant a commit of that kind appears, before its sync
                pattern, contains = CUT_ON[cut]
                crashfs.freeze_on(pattern, contains)
                if cut == "backfill":
                    add_shape(port, ADDED)
                elif cut == "resync":
                    pg_db.execute("alter table orders alter column qty type bigint")
                wait_frozen(crashfs, cut, proc, log)
                landed.append(cut)
            timings["to the cut"] += time.monotonic() - phase
            phase = time.monotonic()
            crashfs.power_loss(kill=[proc.pid])
            proc.wait(timeout=30)
            timings["power_loss"] += time.monotonic() - phase
            phase = time.monotonic()
            checked += check_acknowledged_survived(root, markers, fmt)
            timings["check"] += time.monotonic() - phase
            phase = time.monotonic()
            proc = start_service(env, log)
            wait_streaming(port, proc)
            timings["restart"] += time.monotonic() - phase
        time.sleep(2.0)
        workload.stop.set()
        workload.join(timeout=30)
        with psycopg.connect(pg_db.dsn) as conn:
            target = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        for name in TRUTH:
            url = f"http://127.0.0.1:{port}/v1/progress/wait?lsn={target}&timeout=180&shape={name}"
            with urllib.request.urlopen(url, timeout=190) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        workload.stop.set()
        if proc.poll() is None:
            proc.kill()
    print("power-loss phases (s):", {k: round(v, 1) for k, v in timings.items()})
    assert sorted(landed) == sorted(c for c in cuts[:crashes] if c is not None)
    assert workload.transactions > 15 * crashes, (workload.failures, workload.last_error)
    assert checked >= 2 * crashes, "too few claimed shapes were checked after the crashes"
    stats = crashfs.stats()
    assert stats["fdatasync"] + stats["fsync"] > 0 and stats["fsyncdir"] > 0
    from tidemark.sink.iceberg.catalog import forget_catalogs

    forget_catalogs()
    for name, query in TRUTH.items():
        result = compare_shape(spark, str(root), name, query, pg_db.dsn)
        assert result.equal, result.describe()
        rows = table_rows(root, "tables", name, fmt, ["_lsn", "_op"])  # (opens)
        counts = Counter((r["_lsn"], r["_op"]) for r in rows)
        # (retention at 0 h may have dropped every row a current table folded: then
        # there is nothing to appear twice, and compare_shape read the current table)
        assert max(counts.values(), default=1) == 1, f"{name}: a (_lsn, _op) appears twice"
        table_rows(root, "current", name, fmt, ["id"])  # opens
    from tidemark import read

    wanted = {MARKER_BASE + n for n in markers}
    for name in TRUTH:
        frame = read.current(spark, str(root), name).where(f"id >= {MARKER_BASE}")
        got = {row["id"] for row in frame.select("id").collect()}
        assert got == wanted, f"{name}: acknowledged markers lost: {sorted(wanted - got)}"
