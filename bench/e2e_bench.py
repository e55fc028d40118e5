"""End to end: N changes through 10 shapes to committed Delta tables, acknowledged,
next to pg_recvlogical reading the same WAL and PostgreSQL's own subscriber applying
it (a second cluster) in the same run; then the ack lag (source commit -> slot
confirmed_flush_lsn) at a steady 5k rows/s. Two passes in one Spark session: the
first in a JVM that has not run the write path yet, then a warm one.

A first run of tidemark creates the slot and backfills the (still empty) shapes, then
stops; the slot is copied for pg_recvlogical and for the subscriber; then the workload
is written. The readers start at the same confirmed position and read the same WAL to
the same end,
and every row reaches tidemark through the stream (not a snapshot). The Spark
session is started (and runs one trivial job) before timing: its ~10 s start is a
one-off of a long-running service, not a per-change cost. The write path is not warm
then: the JIT compiles it during the timed run (a fresh JVM's first 1M-row flush write
took 8-9 s of the JVM's CPU against ~2 s once warm, docs/benchmarks/history.md), so the
first format's run carries that cost and a later one in the same process does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import cpu_s, jvm_pid, sink_format, sink_sync, sink_sync_method
from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.lsn import Lsn, format_lsn

# the shapes the rows are spread over (``grp = k``); 1 puts every row in one shape, as
# the subscriber has one table
SHAPES = int(os.environ.get("TIDEMARK_BENCH_E2E_SHAPES", "10"))


WIDE_COLUMNS = 30  # text columns of the wide table, ~30 bytes each
WIDE_ROWS = 10_000  # rows of the wide table, backfilled before the updates


def _prepare(pg: EmbeddedPostgres, workload: str) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        if workload == "wide":
            columns = ", ".join(f"c{i} text" for i in range(WIDE_COLUMNS))
            conn.execute(
                f"create table bench_items (id bigint primary key, grp int not null, "
                f"n int not null, {columns})"
            )
            values = ", ".join(f"md5(g::text || '{i}')" for i in range(WIDE_COLUMNS))
            conn.execute(
                f"insert into bench_items select g, g % {SHAPES}, 0, {values}"
                f" from generate_series(1, {WIDE_ROWS}) g"
            )
        else:
            conn.execute(
                "create table bench_items (id bigint primary key, grp int not null,"
                " name text, amount numeric(12,2), created timestamptz)"
            )
        conn.execute("alter table bench_items replica identity full")
        conn.execute("create publication bench_pub for table bench_items")


def _small_transactions(pg: EmbeddedPostgres, rows: int, txn_rows: int = 10) -> int:
    """``rows`` inserts in transactions of ``txn_rows`` rows: one server-side loop that
    commits after each (a client round trip per transaction would pace the WAL)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            "do $$ begin for t in 0.." + str(rows // txn_rows - 1) + " loop"
            " insert into bench_items select g, g % " + str(SHAPES) + ", 'item-' || g,"
            " g % 100000 / 100.0, '2024-01-01'::timestamptz + g * interval '1 s'"
            " from generate_series(t::bigint * " + str(txn_rows) + " + 1,"
            " (t + 1)::bigint * " + str(txn_rows) + ") g; commit; end loop; end $$"
        )
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert end is not None
    return int(Lsn.parse(end[0]))


def _wide_updates(pg: EmbeddedPostgres, updates: int) -> int:
    """``updates`` transactions, each updating one column of one wide row (replica
    identity full: the walsender sends the old row and the new one)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            "do $$ begin for t in 0.." + str(updates - 1) + " loop"
            " update bench_items set n = n + 1, c0 = md5(t::text)"
            " where id = t % " + str(WIDE_ROWS) + " + 1; commit; end loop; end $$"
        )
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert end is not None
    return int(Lsn.parse(end[0]))


def _workload(pg: EmbeddedPostgres, rows: int, txn_rows: int = 10_000) -> int:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        for start in range(0, rows, txn_rows):
            conn.execute(
                "insert into bench_items select g, g %% %s, 'item-' || g,"
                " g %% 100000 / 100.0, '2024-01-01'::timestamptz + g * interval '1 s'"
                " from generate_series(%s::bigint, %s::bigint) g",
                (SHAPES, start + 1, min(rows, start + txn_rows)),
            )
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert end is not None
    return int(Lsn.parse(end[0]))


async def _backfill_empty(
    pg: EmbeddedPostgres, spark: Any, root: Path | str, extra: dict[str, Any] | None = None
) -> None:
    """First run: creates the slot and backfills the (empty) shapes, then stops."""
    from tidemark.app import Service

    service = Service(_settings(pg, root, extra), spark=spark)
    task = asyncio.create_task(service.run())
    while not service.shapes or any(s.state != "active" for s in service.shapes.values()):
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    service.request_stop()
    await task


class BackendCpu(threading.Thread):
    """The CPU seconds of the server process ``query`` names by pid (``/proc/<pid>/stat``,
    sampled every 50 ms while it runs; a new pid after a reconnect adds to the first)."""

    def __init__(self, dsn: str, query: str, param: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.query, self.param = dsn, query, param
        self.stop = threading.Event()
        self.pid: int | None = None
        self.first = self.last = 0.0
        self.earlier = 0.0  # what walsenders before a reconnect used
        self.pids = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(self.query, (self.param,)).fetchone()
                pid = row[0] if row else None
                if pid is not None and pid != self.pid:
                    self.earlier += self.last - self.first  # (a reconnect: keep it)
                    self.pid, self.pids = pid, self.pids + 1
                    self.first = self.last = cpu_s(pid)
                if self.pid is not None:
                    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                        self.last = cpu_s(self.pid)
                self.stop.wait(0.05)

    def seconds(self) -> float:
        """CPU used since it was first seen (its start, sampled within 50 ms)."""
        self.stop.set()
        self.join()
        return self.earlier + self.last - self.first


class WalsenderCpu(BackendCpu):
    """The CPU of the walsender serving ``slot``: the reference the readers share the
    machine with."""

    def __init__(self, dsn: str, slot: str) -> None:
        query = "select active_pid from pg_replication_slots where slot_name = %s"
        super().__init__(dsn, query, slot)


def _subscriber(
    pg: EmbeddedPostgres, workload: str, slot: str, end_lsn: int
) -> tuple[float, float, float]:
    """PostgreSQL's own subscriber applying the same WAL: a second cluster with the
    table (for the wide workload, with the rows the slot's start already had), a
    subscription on a copy of the slot, enabled once the workload is written. Its
    seconds to the slot's confirmed_flush_lsn at ``end_lsn`` (as tidemark's
    "acknowledged", the apply worker's start included), its apply worker's CPU and the
    walsender's serving it."""
    from psycopg import sql

    with EmbeddedPostgres() as sub:
        _prepare(sub, workload)
        with psycopg.connect(sub.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "create subscription bench_sub connection {} publication bench_pub with"
                    " (create_slot = false, slot_name = {}, copy_data = false, enabled = false)"
                ).format(sql.Literal(pg.dsn()), sql.Literal(slot))
            )
            apply = BackendCpu(
                sub.dsn(),
                "select pid from pg_stat_subscription where subname = %s and relid is null",
                "bench_sub",
            )
            sender = WalsenderCpu(pg.dsn(), slot)
            apply.start()
            sender.start()
            t0 = time.perf_counter()
            conn.execute("alter subscription bench_sub enable")
            while _confirmed(pg.dsn(), slot) < end_lsn:
                time.sleep(0.02)
            took = time.perf_counter() - t0
            applied = apply.seconds(), sender.seconds()
            (count,) = conn.execute("select count(*) from bench_items").fetchone()  # type: ignore[misc]
            conn.execute("alter subscription bench_sub disable")
    if workload != "wide":
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            (expected,) = conn.execute("select count(*) from bench_items").fetchone()  # type: ignore[misc]
        assert count == expected, f"the subscriber has {count} rows, the source {expected}"
    return took, *applied


def _recvlogical(pg: EmbeddedPostgres, slot: str, end_lsn: int) -> tuple[float, float]:
    """pg_recvlogical from the slot to ``end_lsn``: its seconds and its walsender's CPU."""
    args = [
        pg.bin("pg_recvlogical"),
        "-d",
        pg.dsn(),
        "--slot",
        slot,
        "--start",
        "-E",
        str(Lsn(end_lsn)),
        "-o",
        "proto_version=1",
        "-o",
        "publication_names=bench_pub",
        "-f",
        "/dev/null",
        "--no-loop",
        "-s",
        "10",
    ]
    sender = WalsenderCpu(pg.dsn(), slot)
    sender.start()
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    took = time.perf_counter() - t0
    return took, sender.seconds()


def _settings(pg: EmbeddedPostgres, root: Path | str, extra: dict[str, Any] | None = None) -> Any:
    """The bench's settings; ``extra``: sections to add (``s3``, ``current``)."""
    from tidemark.settings.config import Settings

    return Settings.model_validate(
        (extra or {})
        | {
            "source": {"dsn": pg.dsn(), "slot": "tidemark_bench", "publication": "bench_pub"},
            "sink": {
                "root": str(root),
                "sync": sink_sync(),
                "sync_method": sink_sync_method(),
                "format": sink_format(),
            },
            "http": {"port": 0},
            "flush": {"max_age_s": 1.0, "max_rows": 250_000},
            "monitor": {"period_s": 0.2},
            "log_level": "warning",
            "shapes": [
                {"name": f"grp_{k}", "table": "public.bench_items", "where": f"grp = {k}"}
                for k in range(SHAPES)
            ],
        }
    )


def _confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
            (slot,),
        ).fetchone()
    return int(Lsn.parse(row[0])) if row and row[0] else 0


async def _through(
    pg: EmbeddedPostgres,
    spark: Any,
    root: Path | str,
    end_lsn: int,
    end_rows: int,
    cpu: dict[str, float] | None = None,
    *,
    with_lag: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, float]:
    """The service from the slot's position to ``end_lsn``: seconds to committed and
    to acknowledged; ``cpu`` gets the CPU seconds of this process and of the JVM."""
    from tidemark.app import Service

    service = Service(_settings(pg, root, extra), spark=spark)
    sender = WalsenderCpu(pg.dsn(), "tidemark_bench")
    sender.start()
    if cpu is not None:
        cpu["python_s"] = time.process_time()
        cpu["jvm_s"] = cpu_s(int(cpu["jvm_pid"]))
    t0 = time.perf_counter()
    task = asyncio.create_task(service.run())
    while True:
        if task.done():
            task.result()
        frontiers = service.progress().frontiers
        if len(frontiers) == SHAPES and min(frontiers.values()) >= end_lsn:
            break
        await asyncio.sleep(0.02)
    committed = time.perf_counter() - t0
    while _confirmed(pg.dsn(), "tidemark_bench") < end_lsn:
        await asyncio.sleep(0.02)
    acked = time.perf_counter() - t0
    rows = sum(w.rows_committed for w in service.scheduler.writers.values())  # type: ignore[union-attr]
    assert rows == end_rows, f"committed {rows} rows through the stream, expected {end_rows}"
    commits = service.scheduler.stats.commits  # type: ignore[union-attr]
    if cpu is not None:
        cpu["python_s"] = time.process_time() - cpu["python_s"]
        cpu["jvm_s"] = cpu_s(int(cpu["jvm_pid"])) - cpu["jvm_s"]
        cpu["walsender_s"] = sender.seconds()
        cpu["walsender_pids"] = sender.pids
    else:
        sender.seconds()
    lag = await _ack_lag(pg, service) if with_lag else {}
    service.request_stop()
    await task
    return {"committed_s": committed, "acked_s": acked, "rows": rows, "commits": commits, **lag}


async def _ack_lag(pg: EmbeddedPostgres, service: Any, rate: int = 5_000,
                   seconds: float = 20.0, txn_rows: int = 100) -> dict[str, float]:  # fmt: skip
    """Commit -> confirmed_flush_lsn for transactions written at a steady rate."""
    dsn = pg.dsn()
    commits: list[tuple[int, float]] = []  # (LSN just before the commit record, wall time)
    acks: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "select confirmed_flush_lsn::text from pg_replication_slots"
                    " where slot_name = 'tidemark_bench'"
                ).fetchone()
                acks.append((time.time(), int(Lsn.parse(row[0]))))  # type: ignore[index]
                time.sleep(0.01)

    def write() -> None:
        interval = txn_rows / rate
        next_id = 10**9
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + seconds
            due = time.monotonic()
            while time.monotonic() < deadline:
                with conn.transaction():
                    conn.execute(
                        "insert into bench_items select g, g %% 10, 'lag', 1, now()"
                        " from generate_series(%s::bigint, %s::bigint) g",
                        (next_id, next_id + txn_rows - 1),
                    )
                    before = conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()
                commits.append((int(Lsn.parse(before[0])), time.time()))  # type: ignore[index]
                next_id += txn_rows
                due += interval
                time.sleep(max(0.0, due - time.monotonic()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    await asyncio.to_thread(write)
    await asyncio.sleep(8)
    stop.set()
    sampler.join()
    lags = []
    j = 0
    for lsn, at in commits:
        while j < len(acks) and acks[j][1] <= lsn:
            j += 1
        if j < len(acks):
            lags.append(acks[j][0] - at)
    lags.sort()
    return {
        "lag_txns": len(lags),
        "lag_p50_s": statistics.median(lags) if lags else float("nan"),
        "lag_p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else float("nan"),
        "lag_rate_rows_s": rate,
    }


WORKLOADS = {
    "bulk": "inserts in transactions of 10,000 rows",
    "small": "inserts in transactions of 10 rows",
    "wide": f"single-row updates of a {WIDE_COLUMNS + 3}-column row, one per transaction",
}


def main(rows: int = 1_000_000, workload: str = "bulk", passes: int = 2) -> dict[str, float]:
    """``passes`` runs of ``workload`` (``WORKLOADS``): ``rows`` changes through the
    stream each, in one Spark session: the first in a JVM that has not run the write
    path yet (the first format's; the second format's runs after it), the others
    warm, as a service is after its first minutes. Returns the last pass's figures,
    the first's beside them as ``first_<name>``; the ack lag in the last pass only."""
    from tidemark.spark import build_session

    print(
        f"== end to end, {workload}: {rows:,} {WORKLOADS[workload]} through {SHAPES} shapes"
        f" to committed {sink_format()} tables, {passes} pass(es) =="
    )
    spark = build_session()
    spark.createDataFrame([(1,)], "a int").collect()  # warm the JVM
    first: dict[str, float] = {}
    for n in range(passes):
        label = "first pass" if n == 0 else "warm pass"
        out = _one_pass(spark, rows, workload, label, with_lag=n == passes - 1)
        if n == 0:
            first = out
    out |= {f"first_{k}": v for k, v in first.items() if not k.startswith("lag_")}
    return out


def _one_pass(
    spark: Any, rows: int, workload: str, label: str, *, with_lag: bool
) -> dict[str, float]:
    print(f"-- {label}")
    cpu = {"jvm_pid": float(jvm_pid(spark))}
    root = Path(tempfile.mkdtemp(prefix="tidemark-bench-e2e-"))
    try:
        with EmbeddedPostgres() as pg:
            _prepare(pg, workload)
            # shapes exist (backfilled) before the workload: every change then comes
            # through the stream, which is what this measures
            asyncio.run(_backfill_empty(pg, spark, root))
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                conn.execute("select pg_copy_logical_replication_slot('tidemark_bench', 'rl')")
                conn.execute("select pg_copy_logical_replication_slot('tidemark_bench', 'sub')")
            if workload == "small":
                end = _small_transactions(pg, rows)
            elif workload == "wide":
                end = _wide_updates(pg, rows)
            else:
                end = _workload(pg, rows)
            recv, recv_sender = _recvlogical(pg, "rl", end)
            subscriber, apply_cpu, sub_sender = _subscriber(pg, workload, "sub", end)
            out = asyncio.run(
                _through(pg, spark, root, end, rows, cpu, with_lag=with_lag and workload == "bulk")
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["recvlogical_s"] = recv
    out["ratio_committed"] = recv / out["committed_s"]
    out["ratio_acked"] = recv / out["acked_s"]
    out["python_cpu_s"], out["jvm_cpu_s"] = cpu["python_s"], cpu["jvm_s"]
    out["walsender_cpu_s"], out["recvlogical_walsender_cpu_s"] = cpu["walsender_s"], recv_sender
    out["subscriber_s"], out["ratio_subscriber"] = subscriber, subscriber / out["acked_s"]
    out["subscriber_apply_cpu_s"], out["subscriber_walsender_cpu_s"] = apply_cpu, sub_sender
    print(f"end LSN {format_lsn(end)}")
    print(f"pg_recvlogical           {recv:7.2f}s  {rows / recv:>10,.0f} rows/s")
    print(
        f"PostgreSQL subscriber    {subscriber:7.2f}s  {rows / subscriber:>10,.0f} rows/s"
        f"  (apply worker CPU {apply_cpu:.1f}s, its walsender's {sub_sender:.1f}s)"
    )
    print(
        f"tidemark, committed      {out['committed_s']:7.2f}s  {rows / out['committed_s']:>10,.0f}"
        f" rows/s  = {out['ratio_committed']:.2f}x pg_recvlogical ({out['commits']:.0f} commits)"
    )
    print(
        f"tidemark, acknowledged   {out['acked_s']:7.2f}s  {rows / out['acked_s']:>10,.0f} rows/s"
        f"  = {out['ratio_acked']:.2f}x pg_recvlogical (target >= 1.0x),"
        f" {out['ratio_subscriber']:.2f}x the subscriber"
    )
    print(
        f"CPU to acknowledged: Python {cpu['python_s']:.1f}s"
        f" ({cpu['python_s'] / rows * 1e6:.1f} us/row), JVM {cpu['jvm_s']:.1f}s"
        f" ({cpu['jvm_s'] / rows * 1e6:.1f} us/row)"
    )
    print(
        f"walsender CPU: {recv_sender:.1f}s serving pg_recvlogical, {cpu['walsender_s']:.1f}s"
        f" serving tidemark ({cpu['walsender_pids']:.0f} connection(s);"
        f" on {os.cpu_count()} cores: pg_recvlogical's pace is the"
        " walsender's, and tidemark's Python and JVM share the cores with it)"
    )
    if "lag_txns" in out:
        print(
            f"ack lag at {out['lag_rate_rows_s']:,.0f} rows/s ({out['lag_txns']:.0f} txns): "
            f"p50 {out['lag_p50_s']:.2f}s  p99 {out['lag_p99_s']:.2f}s"
        )
    return out


if __name__ == "__main__":
    main()
