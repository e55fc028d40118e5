"""The walsender client against a real Postgres: streaming, status updates, idle
acknowledgement, reconnects, the replay_lsn check, and clear errors."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.errors import ReplicationError, SlotLostError
from tidemark.lsn import Lsn
from tidemark.pgoutput import messages as m
from tidemark.replication.client import ReplicationClient, SourceConfig
from tidemark.replication.monitor import ReplicationMonitor

from .conftest import PgDatabase
from .replication_support import eventually, slot_row, streaming


def setup_tables(db: PgDatabase) -> None:
    db.execute(
        "create table items (id int primary key, name text, qty int);"
        "create table scratch (id serial primary key, junk text);"  # not published
        "create publication tm for table items;"
    )


def config(db: PgDatabase, **kw: object) -> SourceConfig:
    kw.setdefault("dsn", db.dsn)
    return SourceConfig(slot="tm_slot", publication="tm", **kw)  # type: ignore[arg-type]


async def test_streams_inserts_updates_deletes_in_order(pg_db: PgDatabase) -> None:
    # given a published table and a running client
    setup_tables(pg_db)
    async with streaming(config(pg_db)) as consumer:
        # when rows are inserted, updated and deleted in three transactions
        pg_db.execute("insert into items values (1, 'apple', 3), (2, 'pear', 5)")
        pg_db.execute("update items set qty = 4 where id = 1")
        pg_db.execute("delete from items where id = 2")
        await eventually(lambda: len(consumer.txns) == 3)
    # then each change arrives decoded, in commit order, with its values as text
    assert consumer.rows("items") == [
        ("Insert", (b"1", b"apple", b"3")),
        ("Insert", (b"2", b"pear", b"5")),
        ("Update", (b"1", b"apple", b"4")),
        ("Delete", (b"2", None, None)),
    ]
    commits = [t.commit_lsn for t in consumer.txns]
    assert commits == sorted(commits) and len(set(commits)) == 3
    # and the slot confirmed the last durable commit, never beyond what was received
    row = slot_row(pg_db.dsn, "tm_slot")
    assert row["confirmed_flush_lsn"] >= commits[-1]


async def test_keepalive_replies_keep_a_paused_consumer_connected(pg_db: PgDatabase) -> None:
    # given a walsender that drops clients silent for 2 s (set for our session only)
    setup_tables(pg_db)
    dsn = pg_db.dsn + "?options=-c%20wal_sender_timeout%3D2s"
    async with streaming(config(pg_db, dsn=dsn), queue_batches=1) as consumer:
        client = consumer.client
        assert client.feedback.started
        assert client.feedback.keepalive_interval_s == pytest.approx(2 / 3)
        pid = client.stats.walsender_pid
        # when the consumer stops taking data for ~7 s while writes keep coming
        consumer.paused.clear()
        for i in range(30):
            pg_db.execute("insert into items values (%s, repeat('x', 2000), 1)", (i,))
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        # then the same walsender is still connected: no timeout, no reconnect
        assert client.stats.reconnects == 0
        assert slot_row(pg_db.dsn, "tm_slot")["active_pid"] == pid
        assert client.stats.status_updates >= 7
        # and once the consumer resumes, nothing is missing
        consumer.paused.set()
        await eventually(lambda: len(consumer.txns) == 30)
    assert client.stats.reconnects == 0


def force_restart_lsn_update(db: PgDatabase) -> None:
    # restart_lsn moves when a running-xacts record is decoded after the ack
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        if conn.info.server_version >= 160000:
            conn.execute("select pg_log_standby_snapshot()")
        else:
            conn.execute("checkpoint")


async def test_idle_database_does_not_grow_retained_wal(pg_db: PgDatabase) -> None:
    # given a client with nothing pending, and writes only to an unpublished table
    setup_tables(pg_db)
    async with streaming(config(pg_db)) as consumer:
        samples = []
        for _ in range(10):
            pg_db.execute(
                "insert into scratch (junk) select repeat('y', 1000) from generate_series(1, 2000)"
            )
            force_restart_lsn_update(pg_db)
            await asyncio.sleep(1.5)
            samples.append(slot_row(pg_db.dsn, "tm_slot")["retained"])
        written = slot_row(pg_db.dsn, "tm_slot")["current"] - consumer.client.start_lsn
    # then retained WAL stays bounded while ~20 MB of unrelated WAL was written
    assert written > 15_000_000
    assert max(samples[-3:]) < 4_000_000, samples
    assert consumer.keepalives > 0


async def test_pending_shape_holds_the_slot_back(pg_db: PgDatabase) -> None:
    # given a writer that never reports its transaction durable
    setup_tables(pg_db)
    async with streaming(config(pg_db), durable=False) as consumer:
        pg_db.execute("insert into items values (1, 'held', 1)")
        await eventually(lambda: len(consumer.txns) == 1)
        held = consumer.txns[0].commit_lsn
        # when lots of unrelated WAL follows and keepalives come and go
        for _ in range(6):
            pg_db.execute(
                "insert into scratch (junk) select repeat('z', 1000) from generate_series(1, 2000)"
            )
            force_restart_lsn_update(pg_db)
            await asyncio.sleep(1.0)
            # then confirmed_flush_lsn never passes the unflushed transaction
            assert slot_row(pg_db.dsn, "tm_slot")["confirmed_flush_lsn"] <= held
        assert consumer.keepalives > 0
        retained_while_held = slot_row(pg_db.dsn, "tm_slot")["retained"]
        assert retained_while_held > 10_000_000
        # and once the writer catches up, the slot moves past it
        consumer.release()
        pg_db.execute("insert into scratch (junk) values ('tick')")
        await eventually(
            lambda: slot_row(pg_db.dsn, "tm_slot")["confirmed_flush_lsn"] > held, timeout=30
        )


async def test_terminated_walsender_reconnects_without_gap(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    async with streaming(config(pg_db, reconnect_initial_s=0.1)) as consumer:
        pg_db.execute("insert into items select g, 'a', 1 from generate_series(1, 100) g")
        await eventually(lambda: len(consumer.txns) == 1)
        # when the walsender is killed twice while writes continue
        for round_ in range(2):
            pid = consumer.client.stats.walsender_pid
            pg_db.execute("select pg_terminate_backend(%s)", (pid,))
            for i in range(20):
                base = 1000 * (round_ + 1) + i * 10
                pg_db.execute(
                    "insert into items select g, 'b', 1 from generate_series(%s::int, %s::int) g",
                    (base, base + 9),
                )
            await eventually(lambda pid=pid: consumer.client.stats.walsender_pid != pid)
        await eventually(lambda: len(consumer.txns) == 41, timeout=30)
    # then every row arrived exactly once, in order
    ids = [int(v[0]) for kind, v in consumer.rows("items") if kind == "Insert"]  # type: ignore[arg-type]
    expected = list(range(1, 101)) + [
        1000 * (r + 1) + i * 10 + k for r in range(2) for i in range(20) for k in range(10)
    ]
    assert ids == expected
    assert consumer.client.stats.reconnects == 2
    assert len(consumer.starts) == 3 and consumer.starts[1].reconnect


async def test_monitor_sees_exactly_what_was_sent(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    async with streaming(config(pg_db)) as consumer:
        client = consumer.client
        pg_db.execute("insert into items values (1, 'a', 1)")
        await eventually(lambda: len(consumer.txns) == 1)
        commit = consumer.txns[0].commit_lsn
        await eventually(lambda: client.feedback.last_sent.flush_lsn >= commit)  # type: ignore[union-attr]
        monitor = ReplicationMonitor(
            pg_db.dsn,
            "tm_slot",
            walsender_pid=lambda: client.stats.walsender_pid,
            sent_history=lambda: client.stats.history,
            durable_frontier=lambda: client.feedback.flush_lsn if client.feedback.started else None,
        )
        # when Postgres has processed our latest status update
        sent = client.stats.history[-1]

        async def caught_up() -> bool:
            s = await monitor.poll_once()
            return s.reply_time is not None and s.reply_time >= client.stats.history[-1][0] - 0.001

        await eventually(caught_up, timeout=15)
        sample = monitor.state.last
        assert sample is not None
        latest = client.stats.history[-1][1]
        # then PG reports exactly the values we sent, and no invariant is violated
        assert (sample.write_lsn, sample.flush_lsn, sample.replay_lsn) == (
            latest.write_lsn,
            latest.flush_lsn,
            latest.apply_lsn,
        )
        assert sample.confirmed_flush_lsn == latest.flush_lsn
        assert monitor.state.violations == 0
        assert sent[1].flush_lsn <= latest.flush_lsn
        # and wait_for_lsn resolves once replay_lsn passes the commit
        reached = await monitor.wait_for_lsn(commit, timeout=10)
        assert reached is not None and reached.replay_lsn is not None
        assert reached.replay_lsn >= commit
        assert await monitor.wait_for_lsn(reached.current_wal_lsn + 10**9, timeout=0.5) is None
        await monitor._close()


async def test_monitor_flags_ack_beyond_durable(pg_db: PgDatabase) -> None:
    # given a durable frontier that (deliberately, for the test) lags what was acknowledged
    setup_tables(pg_db)
    async with streaming(config(pg_db)) as consumer:
        client = consumer.client
        pg_db.execute("insert into items values (1, 'a', 1)")
        await eventually(lambda: len(consumer.txns) == 1)
        commit = consumer.txns[0].commit_lsn
        await eventually(lambda: slot_row(pg_db.dsn, "tm_slot")["confirmed_flush_lsn"] >= commit)
        seen = []
        monitor = ReplicationMonitor(
            pg_db.dsn,
            "tm_slot",
            walsender_pid=lambda: client.stats.walsender_pid,
            sent_history=lambda: client.stats.history,
            durable_frontier=lambda: commit - 8,
            on_violation=seen.append,
        )
        await monitor.poll_once()
        await monitor._close()
    # then the violation is reported with both positions
    assert [v.kind for v in seen] == ["ack_beyond_durable"]
    assert str(Lsn(commit - 8)) in seen[0].message


async def test_large_transaction_is_received_whole(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    async with streaming(config(pg_db)) as consumer:
        pg_db.execute(
            "insert into items select g, repeat('q', 50), g from generate_series(1, 50000) g"
        )
        await eventually(lambda: len(consumer.txns) == 1, timeout=60)
    inserts = [c for c in consumer.txns[0].changes if isinstance(c, m.Insert)]
    assert len(inserts) == 50000
    assert inserts[-1].new == (b"50000", b"q" * 50, b"50000")


# -- clear errors -------------------------------------------------------------


async def test_wrong_password_is_a_clear_error_without_the_password(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    dsn = pg_db.server.dsn_for(pg_db.name, user="tidemark", password="s3cret-wrong")
    client = ReplicationClient(SourceConfig(dsn=dsn, slot="tm_slot", publication="tm"))
    with pytest.raises(ReplicationError) as err:
        await client.run()
    assert "password authentication failed" in str(err.value)
    assert "s3cret-wrong" not in str(err.value)


async def test_role_without_replication_is_told_what_to_grant(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    pg_db.execute("create role plain_user login password 'pw'")
    pg_db.execute("grant select on items to plain_user")
    try:
        dsn = pg_db.server.dsn_for(pg_db.name, user="plain_user", password="pw")
        client = ReplicationClient(SourceConfig(dsn=dsn, slot="tm_slot", publication="tm"))
        with pytest.raises(ReplicationError) as err:
            await client.run()
        assert "REPLICATION" in str(err.value) and "plain_user" in str(err.value)
    finally:
        pg_db.execute("drop owned by plain_user; drop role plain_user")


async def test_slot_of_another_plugin_or_database_is_refused(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    try:
        pg_db.execute("select pg_create_logical_replication_slot('tm_slot', 'test_decoding')")
        expected = ("test_decoding", "pgoutput")
    except psycopg.errors.UndefinedFile:
        # this server ships no other output plugin: take a slot of another database
        with psycopg.connect(pg_db.server.admin_dsn, autocommit=True) as conn:
            conn.execute("select pg_create_logical_replication_slot('tm_slot', 'pgoutput')")
        expected = ("belongs to database 'postgres'", pg_db.name)
    try:
        client = ReplicationClient(config(pg_db))
        with pytest.raises(ReplicationError) as err:
            await client.run()
        assert all(part in str(err.value) for part in expected), str(err.value)
    finally:
        with psycopg.connect(pg_db.server.admin_dsn, autocommit=True) as conn:
            conn.execute("select pg_drop_replication_slot('tm_slot')")


async def test_slot_dropped_while_streaming_is_fatal_not_a_loop(pg_db: PgDatabase) -> None:
    setup_tables(pg_db)
    client = ReplicationClient(config(pg_db, reconnect_initial_s=0.05))
    task = asyncio.create_task(client.run())
    await asyncio.wait_for(client.streaming_started.wait(), 30)
    # when someone terminates our walsender and drops the slot
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("select pg_terminate_backend(%s)", (client.stats.walsender_pid,))
        for _ in range(50):
            try:
                conn.execute("select pg_drop_replication_slot('tm_slot')")
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.05)
    # then the client stops with SlotLostError instead of reconnecting forever
    with pytest.raises(SlotLostError) as err:
        await asyncio.wait_for(task, 30)
    assert "tm_slot" in str(err.value) and "resync" in str(err.value).lower()
    assert client.stats.reconnects <= 2


async def test_wal_level_replica_is_refused() -> None:
    with EmbeddedPostgres(settings={"wal_level": "replica"}) as pg:
        client = ReplicationClient(SourceConfig(dsn=pg.dsn(), slot="s", publication="p"))
        with pytest.raises(ReplicationError) as err:
            await client.run()
    assert "wal_level" in str(err.value) and "logical" in str(err.value)
