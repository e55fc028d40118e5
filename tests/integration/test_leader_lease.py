"""Several instances, one leader: the others stand by, and one takes over when the
leader is killed, with nothing lost or doubled.

The lease itself is tested on a real Postgres first (who holds it, who waits, and
that it dies with its session); then two ``tidemark run`` processes with one
configuration (their HTTP ports apart) share a slot and a sink root: the leader is
SIGKILLed in the middle of a workload, the standby takes over, and every shape,
folded, equals Postgres with no ``(_lsn, _op)`` twice.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from tidemark import cli
from tidemark.app import Service
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn
from tidemark.sink.delta.table import table_path
from tidemark.state.lease import LeaderLease, LeaseLost

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import get_json, service_env, start_service, stop_service, tail, wait_shapes
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_e2e import SCHEMA, SHAPES, TRUTH, mixed_workload


@ONE_SERVER
async def test_the_lease_has_one_holder_names_it_and_dies_with_its_session(
    pg_db: PgDatabase,
) -> None:
    first = LeaderLease(pg_db.dsn, "tm_lease", retry_s=0.1)
    second = LeaderLease(pg_db.dsn, "tm_lease", retry_s=0.1)
    other_slot = LeaderLease(pg_db.dsn, "tm_other", retry_s=0.1)
    try:
        assert await first.try_acquire()
        # a second instance of the same slot waits, and knows whom for
        assert not await second.try_acquire()
        assert second.holder is not None and second.holder.pid > 0
        assert other_slot.holder is None and await other_slot.try_acquire()
        stop = asyncio.Event()
        waiting = asyncio.create_task(second.acquire(stop))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        # when the holder's session ends (its process died), the standby has it
        await first.close()
        async with asyncio.timeout(10):
            assert await waiting
        assert second.held
    finally:
        for lease in (first, second, other_slot):
            await lease.close()


@ONE_SERVER
async def test_a_second_instance_stands_by_says_so_and_leads_when_the_first_stops(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given a leader streaming one shape
    pg_db.execute("create table t (id int primary key, v text)")
    pg_db.execute("insert into t select g, 'x' from generate_series(1, 100) g")
    settings = settings_for(pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "t"}])
    async with running_service(settings, spark) as first:
        assert first.role == "leader" and first.metrics.leader._value.get() == 1
        # when a second instance with the same settings starts
        second = Service(settings, spark=spark)
        task = asyncio.create_task(second.run())
        try:
            async with asyncio.timeout(60):
                while second.http_port is None:
                    await asyncio.sleep(0.05)
            # then it stands by, and its API, metrics and `tidemark status` say so
            assert second.role == "standby" and second.phase == "standby"
            assert second.metrics.leader._value.get() == 0
            ready, reasons = second.readiness()
            assert not ready and reasons[0].startswith("standby: another instance holds")
            capsys.readouterr()
            url = f"http://127.0.0.1:{second.http_port}"
            assert await asyncio.to_thread(cli.main, ["status", "--url", url]) == 0
            assert "standby" in capsys.readouterr().out
            pg_db.execute("update t set v = 'changed while standing by' where id <= 10")
        except BaseException:
            second.request_stop()
            await asyncio.gather(task, return_exceptions=True)
            raise
    # when the first stops, the second leads and follows the stream from there
    try:
        async with asyncio.timeout(60):
            while second.phase != "streaming":
                assert not task.done(), task
                await asyncio.sleep(0.05)
        assert second.role == "leader" and second.metrics.leader._value.get() == 1
        pg_db.execute("delete from t where id > 90")
        await wait_frontiers(second, current_lsn(pg_db.dsn))
    finally:
        second.request_stop()
        await asyncio.wait_for(task, 60)
    result = compare_shape(spark, str(tmp_path), "t_all", "select * from t", pg_db.dsn)
    assert result.equal, result.describe()


@ONE_SERVER
async def test_a_leader_takes_its_lease_back_after_a_cut_unless_another_took_it(
    pg_db: PgDatabase,
) -> None:
    def end_session_of(lease: LeaderLease) -> None:
        assert lease._conn is not None
        pid = lease._conn.info.backend_pid
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("select pg_terminate_backend(%s)", (pid,))

    leader = LeaderLease(pg_db.dsn, "tm_cut", check_s=0.1)
    other = LeaderLease(pg_db.dsn, "tm_cut", check_s=0.1)
    try:
        assert await leader.try_acquire()
        # a cut nobody used (as a source restart): the leader holds it again
        holding = asyncio.create_task(leader.hold())
        end_session_of(leader)
        await asyncio.sleep(1.0)
        assert not holding.done() and leader.held
        assert not await other.try_acquire()
        # a cut another instance used: the old leader stops
        holding.cancel()
        end_session_of(leader)
        await asyncio.sleep(0.2)
        assert await other.try_acquire()
        with pytest.raises(LeaseLost, match="holds it now"):
            async with asyncio.timeout(10):
                await leader.hold()
    finally:
        await leader.close()
        await other.close()


def _wait_role(port: int, role: str, proc: Any, log: Path, timeout: float) -> float:
    """Seconds until the instance on ``port`` is ``role`` and (a leader) streaming."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        assert proc.poll() is None, f"instance exited:\n{tail(log)}"
        try:
            status, body = get_json(port, "/healthz", timeout=2)
            leading = role == "standby" or body["phase"] == "streaming"
            if status == 200 and body["role"] == role and leading:
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no {role} on port {port} within {timeout}s:\n{tail(log)}")


async def test_a_standby_takes_over_a_killed_leader_without_loss_or_duplicates(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # given two instances with one configuration: the first leads, the second stands by
    pg_db.execute(SCHEMA)
    root = tmp_path / "lake"
    ports = [free_port(), free_port()]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    envs = [
        service_env(
            dsn=pg_db.dsn, root=root, port=port, name="tm_ha", shapes=SHAPES, warm_up="true"
        )
        for port in ports
    ]
    leader = start_service(envs[0], logs[0])
    standby = None
    try:
        _wait_role(ports[0], "leader", leader, logs[0], timeout=240)
        standby = start_service(envs[1], logs[1])
        _wait_role(ports[1], "standby", standby, logs[1], timeout=240)
        status, ready = get_json(ports[1], "/readyz")
        assert status == 503 and ready["role"] == "standby", ready
        assert any("leader lease" in r for r in ready["reasons"]), ready
        # (and it warms its JVM's write path while it waits)
        deadline = time.monotonic() + 60
        while '"spark.warmed"' not in logs[1].read_text():
            assert time.monotonic() < deadline, tail(logs[1])
            time.sleep(0.2)
        assert get_json(ports[1], "/readyz")[1]["role"] == "standby"
        # when the workload runs and the leader is SIGKILLed in the middle of it
        workload = asyncio.create_task(mixed_workload(pg_db))
        await asyncio.sleep(1.5)
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=30)
        took_over_s = await asyncio.to_thread(_wait_role, ports[1], "leader", standby, logs[1], 120)
        await workload
        pg_db.execute("insert into accounts values (9100, 'after', 3000, 'gold', 'x', null)")
        target = format_lsn(current_lsn(pg_db.dsn))
        wait_shapes(ports[1], target, [s["name"] for s in SHAPES], timeout=180)
        status, ready = get_json(ports[1], "/readyz")
        assert status == 200 and ready["role"] == "leader", ready
        print(f"takeover: the standby streamed {took_over_s:.1f}s after the leader's SIGKILL")
    finally:
        if leader.poll() is None:
            leader.kill()
        if standby is not None:
            stop_service(standby, logs[1])
    # then every shape, folded, equals Postgres, and no change was written twice
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
        table = DeltaTable(str(table_path(root, shape))).to_pyarrow_table(columns=["_lsn", "_op"])
        pairs = Counter(
            zip(table.column("_lsn").to_pylist(), table.column("_op").to_pylist(), strict=True)
        )
        assert not pairs or max(pairs.values()) == 1, shape
    # and the slot is free again once the new leader stopped
    with psycopg.connect(pg_db.dsn) as conn:
        active = conn.execute(
            "select active from pg_replication_slots where slot_name = 'tm_ha'"
        ).fetchone()
    assert active == (False,)
