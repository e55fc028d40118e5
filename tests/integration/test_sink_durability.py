"""Durability of every kind of commit, crash point by crash point, on crashfs.

The sink root is on ``tests/crashfs`` (it forgets what was not synced). A cycle runs
every kind of write tidemark makes to a table: stream commits of flush rounds, a
current-table refresh, changelog retention (at 0 h: everything folded is dropped),
compaction and vacuum. The power is cut at the N-th sync step of the cycle (the
file system freezes there: nothing after it becomes durable), N drawn at random, and
the next cycle starts from what survived, the way a restarted service does
(``ShapeTable.recover``). After each cut: every table opens, everything the tracker
had acknowledged is in every shape, and each shape's folded rows equal the model as
of its committed offset (nothing half committed, nothing twice).

Also here: a staged file removed before its commit, a failing fsync (EIO) and a full
disk (ENOSPC): each fails the flush with its cause and holds the acknowledgement, and
the shape recovers once the disk does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.crashfs import CrashFS, require_crashfs
from tidemark import read
from tidemark.api.server import shape_json
from tidemark.shapes.model import ShapeDefinition
from tidemark.sink import current, retention
from tidemark.sink.delta.current import CurrentTable
from tidemark.sink.delta.table import ShapeTable
from tidemark.state import durable
from tidemark.writers.scheduler import FlushPolicy, FlushScheduler

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .sink_support import Feeder, make_feeder, open_writer
from .test_backfill import HIGH, HIGH_SHAPE, make_items
from .test_continuity import assert_equal
from .test_sink import running
from .test_writer_faults import LOW, LOW_SHAPE

SHAPES = ("a", "b", "c")
CYCLES = 12


@pytest.fixture
def crashfs(tmp_path: Path) -> Iterator[CrashFS]:
    require_crashfs()
    with CrashFS.mounted(tmp_path) as fs:
        yield fs


class Model:
    """Every transaction fed, and each shape's state after each of them."""

    def __init__(self) -> None:
        self.next_lsn = 1_000
        self.next_id = 1
        self.states: dict[str, list[tuple[int, dict[int, str]]]] = {s: [(0, {})] for s in SHAPES}
        self.sent: list[tuple[int, dict[str, list[Any]]]] = []

    def resend(self, feeder: Feeder, acknowledged: int) -> None:
        """What Postgres sends again after a restart: every transaction past the
        acknowledged LSN (the writers drop those their tables hold)."""
        for lsn, per_shape in self.sent:
            if lsn > acknowledged:
                feeder.txn(lsn, per_shape)

    def transaction(self, feeder: Feeder, rng: random.Random) -> int:
        lsn = self.next_lsn
        self.next_lsn += 1_000
        per_shape: dict[str, list[Any]] = {}
        for shape in SHAPES:
            if rng.random() < 0.3:
                continue
            state = dict(self.states[shape][-1][1])
            rows: list[Any] = []
            for _ in range(rng.randint(1, 5)):
                roll = rng.random()
                if roll < 0.6 or not state:
                    key, name = self.next_id, f"n{lsn}"
                    self.next_id += 1
                    rows.append(("insert", (str(key).encode(), name.encode(), b"x"), None))
                    state[key] = name
                elif roll < 0.85:
                    key = rng.choice(sorted(state))
                    name = f"u{lsn}"
                    rows.append(("update", (str(key).encode(), name.encode(), b"y"), None))
                    state[key] = name
                else:
                    key = rng.choice(sorted(state))
                    rows.append(("delete", (str(key).encode(), None, None), None))
                    del state[key]
            per_shape[shape] = rows
            self.states[shape].append((lsn, state))
        self.sent.append((lsn, per_shape))
        feeder.txn(lsn, per_shape)
        return lsn

    def as_of(self, shape: str, lsn: int) -> dict[int, str]:
        return [state for at, state in self.states[shape] if at <= lsn][-1]

    def last_touching(self, shape: str, lsn: int) -> int:
        return max(at for at, _ in self.states[shape] if at <= lsn)


class PowerCut:
    """Cuts the power (freezes crashfs) just before the N-th sync step from now, and
    keeps what the tracker had acknowledged at that moment."""

    def __init__(self, fs: CrashFS, feeder: Feeder, at: int) -> None:
        self.fs, self.feeder, self.at = fs, feeder, at
        self.calls = 0
        self.acknowledged = 0
        self.cut = False

    def __call__(self, synced: durable.SyncSet, real: Any) -> None:
        self.calls += 1
        if self.calls == self.at and not self.cut:
            self.acknowledged = max(self.feeder.notified, default=0)
            self.fs.freeze()
            self.cut = True
        real(synced)


async def one_cycle(
    spark: Any, root: Path, model: Model, rng: random.Random, cut: PowerCut, acknowledged: int
) -> None:
    """What the service does to its tables, in one go: rounds, refresh, retention,
    compaction, vacuum. Stops at the first error (the power is gone)."""
    feeder = cut.feeder
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for shape in SHAPES:
        scheduler.add(open_writer(feeder, str(root), shape))
    async with running(scheduler):
        model.resend(feeder, acknowledged)
        for _ in range(3):
            for _ in range(rng.randint(1, 3)):
                model.transaction(feeder, rng)
            await scheduler.flush_all()
            if any(w.failure for w in scheduler.writers.values()):
                return
    await asyncio.to_thread(current.refresh_many, spark, root, list(SHAPES), buckets=2)
    for shape in SHAPES:
        await asyncio.to_thread(retention.compact_changelog, spark, root, shape, 0.0)
        table = ShapeTable(root, shape)
        await asyncio.to_thread(table.compact)
        await asyncio.to_thread(table.vacuum, 0)


def check_survivors(spark: Any, root: Path, model: Model, acknowledged: int) -> None:
    """What a restart finds after the cut: recovered tables that open, everything
    acknowledged in every shape, each shape equal to the model at its offset."""
    for shape in SHAPES:
        table = ShapeTable(root, shape)
        assert table.recover(), f"{shape}: the table is gone"
        CurrentTable(root, shape).recover()
        committed = table.committed_lsn() or 0
        needed = model.last_touching(shape, acknowledged)
        assert committed >= needed, (
            f"{shape}: acknowledged through {acknowledged}, but the table holds only "
            f"{committed} of {needed}"
        )
        rows = read.current(spark, str(root), shape).select("id", "name").collect()
        got = {int(r["id"]): r["name"] for r in rows}
        assert len(got) == len(rows), f"{shape}: a key twice"
        assert got == model.as_of(shape, committed), f"{shape}: differs from the model"
        for kind in ("tables", "current"):
            path = root / kind / shape
            if path.exists():
                DeltaTable(str(path)).version()
        stream = DeltaTable(table.uri).to_pyarrow_table(columns=["_lsn", "_op"])
        pairs = list(zip(*(stream.column(c).to_pylist() for c in ("_lsn", "_op")), strict=True))
        assert len(pairs) == len(set(pairs)), f"{shape}: a (_lsn, _op) twice"


async def test_a_power_cut_at_any_sync_step_loses_nothing_acknowledged(
    spark: Any, crashfs: CrashFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = crashfs.root / "lake"
    model = Model()
    rng = random.Random(2026)
    real = durable.SyncSet.sync
    holder: dict[str, PowerCut] = {}
    monkeypatch.setattr(durable.SyncSet, "sync", lambda self: holder["cut"](self, real))
    cuts = acknowledged = 0
    # the sync steps a cycle makes: a first guess, then as many as the last cycle the
    # cut missed made (the cut is drawn among them)
    steps = 40
    for _ in range(CYCLES):
        feeder = make_feeder()
        cut = holder["cut"] = PowerCut(crashfs, feeder, rng.randint(1, steps))
        with contextlib.suppress(Exception):
            await one_cycle(spark, root, model, rng, cut, acknowledged)
        if not cut.cut:  # the cycle needed fewer syncs than drawn: cut now
            steps = max(1, cut.calls)
            cut.acknowledged = max(feeder.notified, default=0)
            crashfs.freeze()
        crashfs.power_loss()
        cuts += cut.cut
        acknowledged = max(acknowledged, cut.acknowledged)
        holder["cut"] = PowerCut(crashfs, feeder, 10**9)  # no cut while checking
        check_survivors(spark, root, model, acknowledged)
    assert cuts >= CYCLES // 2, "most cuts should land inside a cycle"


# -- faults: a staged file gone, fsync failing, a full disk ----------------------------


async def _held_then_recovered(
    scheduler: FlushScheduler, feeder: Feeder, shape: str, words: tuple[str, ...]
) -> None:
    """The shape reports a failure naming one of ``words`` and nothing is
    acknowledged meanwhile."""
    writer = scheduler.writers[shape]
    async with asyncio.timeout(60):
        while writer.failure is None:
            await asyncio.sleep(0.05)
    assert any(w in writer.failure.error for w in words), writer.failure.error
    before = list(feeder.notified)
    await asyncio.sleep(1.5)  # retries come and fail
    assert feeder.notified == before


async def test_a_failing_fsync_holds_the_acknowledgement_until_the_disk_recovers(
    spark: Any, crashfs: CrashFS
) -> None:
    root = crashfs.root / "lake"
    model, rng, feeder = Model(), random.Random(3), make_feeder()
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=0.2))
    for shape in SHAPES:
        scheduler.add(open_writer(feeder, str(root), shape))
    async with running(scheduler):
        crashfs.fail_fsync("*/tables/a/*", errno.EIO)
        lsn = model.transaction(feeder, rng)
        while model.last_touching("a", lsn) != lsn:
            lsn = model.transaction(feeder, rng)
        await _held_then_recovered(scheduler, feeder, "a", ("Input/output error", "EIO"))
        assert max(feeder.notified, default=0) < lsn
        crashfs.clear_faults()
        async with asyncio.timeout(90):
            while max(feeder.notified, default=0) < lsn:
                await asyncio.sleep(0.05)
    crashfs.power_loss()
    check_survivors(spark, root, model, lsn)


async def test_a_full_disk_holds_the_acknowledgement_until_there_is_room(
    spark: Any, crashfs: CrashFS
) -> None:
    root = crashfs.root / "lake"
    model, rng, feeder = Model(), random.Random(4), make_feeder()
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=0.2))
    for shape in SHAPES:
        scheduler.add(open_writer(feeder, str(root), shape))
    async with running(scheduler):
        crashfs.set_capacity(0)
        lsn = model.transaction(feeder, rng)
        await _held_then_recovered(
            scheduler,
            feeder,
            next(s for s in SHAPES if model.last_touching(s, lsn) == lsn),
            ("is full",),
        )
        assert max(feeder.notified, default=0) < lsn
        crashfs.set_capacity(None)
        async with asyncio.timeout(90):
            while max(feeder.notified, default=0) < lsn:
                await asyncio.sleep(0.05)
    crashfs.power_loss()
    check_survivors(spark, root, model, lsn)


async def test_a_staged_file_removed_before_its_commit_is_an_error_that_holds_the_ack(
    spark: Any, tmp_path: Path
) -> None:
    """An open transaction staged to disk (memory pressure), its file removed before
    the transaction ends: the flush fails naming the file, nothing is acknowledged,
    and the batch is never committed without it."""
    feeder = make_feeder()
    scheduler = FlushScheduler(
        spark, FlushPolicy(max_age_s=0.2, memory_budget=1 << 30, stage_bytes=1)
    )
    writer = open_writer(feeder, str(tmp_path), "a")
    scheduler.add(writer)
    async with running(scheduler):
        writer.begin_txn(5_000, 1, 0)
        for i in range(50):
            writer.append(i, "insert", (str(i).encode(), b"n", b"x"), None, 32)  # type: ignore[arg-type]
        scheduler.poke()
        async with asyncio.timeout(60):
            while not writer.buffer.staged_files():
                await asyncio.sleep(0.05)
        staged = writer.buffer.staged_files()[0]
        (writer.table.path / staged.path).unlink()
        from tidemark.flush.tracker import CommitFragment
        from tidemark.lsn import LogOffset

        last = LogOffset(5_000, 50)
        feeder.tracker.handle_txn_fragment(CommitFragment(last), ["a"])
        writer.end_txn(last)
        await _held_then_recovered(scheduler, feeder, "a", ("missing",))
        assert staged.path in (writer.failure.error if writer.failure else "")
    assert writer.table.committed_lsn() is None


# -- a table damaged beyond repair at start --------------------------------------------


@one_server()
async def test_a_damaged_table_fails_its_shape_alone_and_resync_rebuilds_it(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """Given a shape whose table lost a data file its log names (damage no power loss
    under tidemark's syncing leaves), a start reports that shape in error with what to
    do while the other shape streams on; with ``on_stream_gap = "resync"`` the table
    is set aside under ``<root>/damaged/`` and rebuilt from a snapshot."""
    make_items(pg_db, 300)
    shapes = [HIGH_SHAPE, LOW_SHAPE]
    settings = settings_for(pg_db.dsn, str(tmp_path), shapes)
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    table = ShapeTable(tmp_path, "high")
    victim = table.active_files()[0]
    (table.path / victim).unlink()
    pg_db.execute("update items set score = 95 where id <= 20")
    async with running_service(settings, spark) as service:
        high = shape_json(service, "high")
        assert high["state"] == "error"
        assert "damaged" in high["error"] and "on_stream_gap" in high["error"]
        assert victim in high["error"]
        async with asyncio.timeout(60):
            while shape_json(service, "low")["state"] != "active":
                await asyncio.sleep(0.05)
        lsn = current_lsn(pg_db.dsn)
        async with asyncio.timeout(60):
            while service.progress().frontiers.get("low", -1) < lsn:
                await asyncio.sleep(0.05)
    assert_equal(spark, tmp_path, "low", LOW, pg_db.dsn)
    resync = settings_for(pg_db.dsn, str(tmp_path), shapes, source={"on_stream_gap": "resync"})
    async with running_service(resync, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert [p.name.split("-")[0] for p in (tmp_path / "damaged").iterdir()] == ["high"]
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)
    assert_equal(spark, tmp_path, "low", LOW, pg_db.dsn)


@one_server()
async def test_a_full_disk_fails_a_backfill_and_a_refresh_until_there_is_room(
    pg_db: PgDatabase, spark: Any, crashfs: CrashFS
) -> None:
    """A shape added while the sink's disk is full: its backfill fails saying the disk
    is full, nothing of it is claimed, and it completes by itself once there is room;
    a current-table refresh on the full disk fails and succeeds later, the changelog
    untouched meanwhile."""
    make_items(pg_db, 20_000)
    root = crashfs.root / "lake"
    settings = settings_for(pg_db.dsn, str(root), [LOW_SHAPE])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # room for the registry and state files, not for the snapshot's files
        crashfs.set_capacity(64 * 1024)
        try:
            await service.add_shape(ShapeDefinition(**HIGH_SHAPE))
            async with asyncio.timeout(60):
                while shape_json(service, "high")["state"] != "error":
                    await asyncio.sleep(0.05)
            assert "is full" in (shape_json(service, "high")["error"] or "")
            assert "high" not in service.store.claimed()
            refreshed = await asyncio.to_thread(current.refresh_many, spark, root, ["low"])
            assert isinstance(refreshed["low"], Exception)
        finally:
            crashfs.set_capacity(None)
        async with asyncio.timeout(90):  # the backfill's next retry succeeds
            while shape_json(service, "high")["state"] != "active":
                await asyncio.sleep(0.1)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        refreshed = await asyncio.to_thread(current.refresh_many, spark, root, ["low"])
        assert not isinstance(refreshed["low"], Exception), refreshed["low"]
    assert_equal(spark, root, "high", HIGH, pg_db.dsn)
    assert_equal(spark, root, "low", LOW, pg_db.dsn)


async def test_a_commit_durable_but_not_yet_acknowledged_is_acknowledged_once_after_restart(
    spark: Any, crashfs: CrashFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The power is cut between a round's commits (synced) and the acknowledgement:
    after the restart Postgres sends those transactions again, the tables hold them
    already, so they are acknowledged without a second copy."""
    root = crashfs.root / "lake"
    model, rng, feeder = Model(), random.Random(6), make_feeder()
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for shape in SHAPES:
        scheduler.add(open_writer(feeder, str(root), shape))

    def cut_before_acknowledging(*args: Any) -> None:
        crashfs.freeze()
        raise OSError("the power is off")

    monkeypatch.setattr(FlushScheduler, "_committed", cut_before_acknowledging)
    async with running(scheduler):
        for _ in range(4):
            last = model.transaction(feeder, rng)
        with contextlib.suppress(Exception):
            await scheduler.flush_all()
    assert feeder.notified == []  # nothing acknowledged
    crashfs.power_loss()
    monkeypatch.undo()
    for shape in SHAPES:  # yet every commit was durable
        assert (ShapeTable(root, shape).committed_lsn() or 0) == model.last_touching(shape, last)
    feeder = make_feeder()
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for shape in SHAPES:
        scheduler.add(open_writer(feeder, str(root), shape))
    async with running(scheduler):
        model.resend(feeder, 0)
        await scheduler.flush_all()
    assert max(feeder.notified) >= last
    check_survivors(spark, root, model, last)
