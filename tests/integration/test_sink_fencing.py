"""One writer per table: a second process can never add a transaction a shape table
already holds.

First what the library does (the fence is built on it): deltalake refuses a commit
carrying an application id when a commit since the version it read carried the
same id, and rebases it over commits of other ids. Then the race itself: two
processes commit overlapping batches to one real Delta table, round after round;
every ``(_lsn, _op)`` is in the table at most once and the committed ranges never
overlap. No Spark and no Postgres: the files are written with pyarrow, the commit
protocol is what is tested.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction

from tidemark.app import Service
from tidemark.errors import WriterFenced
from tidemark.sink import ChangelogTable, table_format
from tidemark.sink.delta.log import recover_log
from tidemark.sink.delta.table import ShapeTable
from tidemark.sink.files import DataFile
from tidemark.sink.schema import ColumnSpec, table_schema

from .conftest import PgDatabase
from .service_support import current_lsn, settings_for, wait_frontiers
from .sink_support import rows_of
from .test_backfill import HIGH_SHAPE, make_items

COLUMNS = [ColumnSpec("id", 23)]
SHAPE = "raced"
ROUNDS = 60
BATCH = 10


def _add(root: str, name: str) -> AddAction:
    path = f"{root}/{name}.parquet"
    pq.write_table(pa.table({"x": pa.array([1], pa.int64())}), path)
    stats = '{"numRecords":1}'
    return AddAction(
        f"{name}.parquet", os.path.getsize(path), {}, int(time.time() * 1000), True, stats
    )


def _commit(dt: DeltaTable, root: str, name: str, app: str, version: int) -> None:
    dt.create_write_transaction(
        [_add(root, name)],
        mode="append",
        schema=dt.schema(),
        commit_properties=CommitProperties(app_transactions=[Transaction(app, version)]),
    )


def test_deltalake_refuses_a_concurrent_commit_with_the_same_app_id(tmp_path: Path) -> None:
    root = str(tmp_path / "t")
    write_deltalake(root, pa.table({"x": pa.array([0], pa.int64())}))
    # given two handles that read the same version
    first, second = DeltaTable(root), DeltaTable(root)
    _commit(first, root, "a", "tidemark:s", 10)
    # then the second commit with the same app id is refused, whatever its version
    with pytest.raises(CommitFailedError):
        _commit(second, root, "b", "tidemark:s", 11)
    # while a commit with another app id is rebased over it
    first, second = DeltaTable(root), DeltaTable(root)
    _commit(first, root, "c", "tidemark:other", 1)
    _commit(second, root, "d", "tidemark:s", 12)
    final = DeltaTable(root)
    assert final.transaction_version("tidemark:s") == 12
    assert final.transaction_version("tidemark:other") == 1


def _batch_files(table: ChangelogTable, first: int, end: int) -> list[DataFile]:
    lsns = list(range(first, end + 1))
    n = len(lsns)
    arrays = [
        pa.array(lsns, pa.int32()),
        pa.array(lsns, pa.int64()),
        pa.array([0] * n, pa.int32()),
        pa.array(["insert"] * n, pa.string()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.list_(pa.string())),
    ]
    schema = table_schema(COLUMNS)
    rel, folder = table.new_batch_dir()
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), folder / "part-0.parquet")
    return table.files_in(rel)


def _race(
    root: str, offset: int, start: multiprocessing.synchronize.Barrier, out: object, fmt: str
) -> None:
    """One process: batches of BATCH transactions, shifted by ``offset`` from the other's.
    Both processes commit each round's batch at the same moment (a barrier): a commit
    takes well under a millisecond, so without it one process can finish all its rounds
    before the other has started."""
    table = table_format(fmt).changelog(root, SHAPE)
    committed, fenced, skipped = [], 0, 0
    for i in range(ROUNDS):
        first = offset + i * BATCH + 1
        end = first + BATCH - 1
        files = _batch_files(table, first, end)
        start.wait()
        try:
            version = table.commit(files, end, {}, first_lsn=first)
        except WriterFenced:
            fenced += 1
            continue
        if version is None:
            skipped += 1
        else:
            committed.append((first, end))
    out.put((offset, committed, fenced, skipped))  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_two_processes_racing_overlapping_batches_commit_each_transaction_once(
    tmp_path: Path, fmt: str
) -> None:
    # given one shape table and two processes whose batches overlap by half
    root = str(tmp_path)
    tables = table_format(fmt)
    tables.changelog(root, SHAPE).create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    workers = [
        ctx.Process(target=_race, args=(root, off, start, out, fmt)) for off in (0, BATCH // 2)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    # then the ranges that landed never overlap, and both processes met the fence
    ranges = sorted(r for _, committed, _, _ in results for r in committed)
    for (_, end), (first, _) in itertools.pairwise(ranges):
        assert first > end, ranges
    assert sum(fenced for _, _, fenced, _ in results) > 0, results
    # and every transaction in the table is there exactly once, and only those
    rows = rows_of(tables.changelog(root, SHAPE))
    pairs = Counter((r["_lsn"], r["_op"]) for r in rows)
    assert max(pairs.values()) == 1
    assert sorted(lsn for lsn, _ in pairs) == [
        lsn for first, end in ranges for lsn in range(first, end + 1)
    ]
    assert tables.changelog(root, SHAPE).committed_lsn() == ranges[-1][1]


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
async def test_a_service_whose_commit_is_fenced_stops_and_restarts_clean(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a running service, and another writer that committed into its table past
    # what this process believes (a zombie or a second leader)
    make_items(pg_db, 100)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE])
    service = Service(settings, spark=spark)
    run = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            while service.phase != "streaming" or "high" not in service.shapes:
                await asyncio.sleep(0.05)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert service.scheduler is not None
        writer = service.scheduler.writers["high"]
        table = ShapeTable(str(tmp_path), "high")
        # (two transactions wait in one batch while the writer is held; the other
        # writer commits between them)
        async with service.scheduler.exclusive(writer):
            pg_db.execute("update items set score = 99 where id <= 10")
            between = current_lsn(pg_db.dsn)
            pg_db.execute("update items set score = 98 where id <= 10")
            await asyncio.sleep(1.0)
            intruder = _batch_files(table, 1, 1)
            assert table.commit(intruder, between, {}, first_lsn=between) is not None
        # when its batch reaches the fence, then it stops with the cause instead of
        # retrying forever
        with pytest.raises(WriterFenced, match="another writer committed"):
            async with asyncio.timeout(60):
                await run
    finally:
        service.request_stop()
        await asyncio.gather(run, return_exceptions=True)


def test_appends_written_directly_are_a_delta_log_the_library_reads(tmp_path: Path) -> None:
    """Stream commits to a table this handle made are written as log entries by
    tidemark itself (``ShapeTable._append``); deltalake must read them as its own:
    files, app version, commit metadata, and a checkpoint every 100 versions."""
    root = str(tmp_path)
    table = ShapeTable(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    log_dir = table.path / "_delta_log"
    # given 105 batches committed one after the other by one handle
    for i in range(105):
        first = i * BATCH + 1
        version = table.commit(
            _batch_files(table, first, first + BATCH - 1),
            first + BATCH - 1,
            {"tidemark.transactions": BATCH},
            first_lsn=first,
        )
        assert version == i + 1
    # then every version was written without the library (engineInfo)
    engines = [
        json.loads(line)["commitInfo"].get("engineInfo")
        for v in range(1, 106)
        for line in (log_dir / f"{v:020d}.json").read_text().splitlines()
        if line.startswith('{"commitInfo"')
    ]
    assert engines == ["tidemark"] * 105
    # and a fresh handle reads them all: rows once each, the app version, the metadata
    fresh = DeltaTable(table.uri)
    assert fresh.version() == 105
    assert fresh.transaction_version(table.app_id) == 105 * BATCH
    lsns = fresh.to_pyarrow_table(columns=["_lsn"]).column("_lsn").to_pylist()
    assert sorted(lsns) == list(range(1, 105 * BATCH + 1))
    newest = fresh.history(1)[0]
    assert newest["tidemark.endLsn"] == str(105 * BATCH)
    assert newest["tidemark.transactions"] == str(BATCH)
    assert newest["tidemark.rows"] == str(BATCH)
    # and a checkpoint was written at version 100, as the library's own hook does
    assert (log_dir / f"{100:020d}.checkpoint.parquet").is_file()
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 100
    assert not list(log_dir.glob("_commit_*"))


def test_a_commit_by_someone_else_between_two_appends_sends_the_next_the_librarys_way(
    tmp_path: Path,
) -> None:
    root = str(tmp_path)
    table = ShapeTable(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    table.commit(_batch_files(table, 1, 10), 10, {}, first_lsn=1)
    table.commit(_batch_files(table, 11, 20), 20, {}, first_lsn=11)
    # given another handle that commits (another app id) after this one's last append
    other = DeltaTable(table.uri)
    _commit(other, table.uri, "intruder", "tidemark:maintenance", 1)
    # when this handle appends again, the version it would write exists: the commit
    # re-reads the log and lands after it, and the next one is direct again
    assert table.commit(_batch_files(table, 21, 30), 30, {}, first_lsn=21) == 4
    assert table.commit(_batch_files(table, 31, 40), 40, {}, first_lsn=31) == 5
    fresh = DeltaTable(table.uri)
    assert fresh.transaction_version(table.app_id) == 40
    assert fresh.transaction_version("tidemark:maintenance") == 1
    assert len(fresh.file_uris()) == 5
    # and when another process committed a batch after this handle's last append, the
    # version this handle would write exists: the batch is found held (skipped) or
    # overlapping (fenced), and nothing of it is written
    stale = ShapeTable(root, SHAPE)
    stale.commit(_batch_files(stale, 41, 50), 50, {}, first_lsn=41)
    assert table.commit(_batch_files(table, 41, 50), 50, {}, first_lsn=41) is None
    with pytest.raises(WriterFenced):
        table.commit(_batch_files(table, 45, 60), 60, {}, first_lsn=45)
    assert DeltaTable(table.uri).version() == 6


def test_a_commit_of_an_older_epoch_is_refused_whichever_way_it_is_written(
    tmp_path: Path,
) -> None:
    """A leader (epoch 1) that knows a table's head commits directly; a newer leader
    (epoch 2) marks the table (``sink.delta.epochs``); every later commit of the old one,
    direct or through the library, is refused before it is written, and the fence
    stays shut for it (``Deposed``)."""
    from tidemark.sink.delta.epochs import mark_tables
    from tidemark.state import fencing

    root = str(tmp_path)
    deposed: list[str] = []
    old = fencing.install(fencing.Fence(root, 1))
    old.on_deposed(deposed.append)
    try:
        (tmp_path / "_tidemark").mkdir()
        (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
        table = ShapeTable(root, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) == 1
        staged = _batch_files(table, BATCH + 1, 2 * BATCH)  # (a round's files, written)
        # when a newer leader takes over: the epoch raised, the table marked
        assert fencing.advance(root, "test") == 2
        fencing.install(fencing.Fence(root, 2))
        assert mark_tables(root, 2) == 1
        fencing.install(old)
        before = DeltaTable(table.uri).version()
        # then the old leader's direct append (its head is stale) is refused
        with pytest.raises(fencing.Deposed, match="newer leader"):
            table.commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
        assert deposed and "epoch 2" in deposed[0]
        # and so is a library commit, and a state write, from then on
        with pytest.raises(fencing.Deposed):
            table.backfill_commit([], staged)
        with pytest.raises(fencing.Deposed):
            fencing.check()
        assert DeltaTable(table.uri).version() == before
        assert not list(table.log_dir.glob("_commit_*"))
        # while a table the old leader reads without the file check (its pause came
        # between the check and the commit) refuses by its mark alone
        fencing.install(fencing.Fence(root, 1))
        (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
        fresh = ShapeTable(root, SHAPE)
        with pytest.raises(fencing.Deposed, match="marked by a newer leader"):
            fresh.commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
        assert DeltaTable(table.uri).version() == before
    finally:
        fencing.install(fencing.Fence())


def test_a_mark_racing_an_older_leaders_commit_makes_it_a_conflict(tmp_path: Path) -> None:
    """The old leader read the snapshot before the mark landed: its commit carries the
    same application id as the mark, so the library refuses it (and the mark, if the
    old commit won the race, goes on top of it)."""
    from tidemark.sink.delta.epochs import mark_table
    from tidemark.state import fencing

    root = str(tmp_path)
    try:
        fencing.install(fencing.Fence(root, 1))
        table = ShapeTable(root, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        stale = DeltaTable(table.uri)  # the old leader's snapshot, read before the mark
        assert mark_table(table.path, 2)
        with pytest.raises(CommitFailedError):
            stale.create_write_transaction(
                [],
                mode="append",
                schema=stale.schema(),
                commit_properties=CommitProperties(
                    app_transactions=fencing.current().app_transactions()
                ),
            )
        assert DeltaTable(table.uri).transaction_version(fencing.EPOCH_APP) == 2
        assert not mark_table(table.path, 2)  # (marked once)
    finally:
        fencing.install(fencing.Fence())


def _deposed_root(tmp_path: Path) -> str:
    """A sink root whose leader (this process) holds epoch 1."""
    from tidemark.state import fencing

    (tmp_path / "_tidemark").mkdir()
    (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
    fencing.install(fencing.Fence(str(tmp_path), 1))
    return str(tmp_path)


def test_a_deposed_leader_writes_no_log_entry_ahead_of_a_commit(tmp_path: Path) -> None:
    """A flush round writes each member's log entry ahead of its commit
    (``ShapeTable.prepare``), as a temp file in ``_delta_log/``; a leader deposed by
    then writes none (a deposed leader's round left three on a CI run)."""
    from tidemark.state import fencing

    try:
        root = _deposed_root(tmp_path)
        table = ShapeTable(root, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) == 1
        staged = _batch_files(table, BATCH + 1, 2 * BATCH)
        # when a newer leader takes over while the old one's round is writing
        assert fencing.advance(root, "test") == 2
        # then the old one's entry is refused before it is written
        with pytest.raises(fencing.Deposed):
            table.prepare(staged, 2 * BATCH)
        assert not list(table.log_dir.glob("_commit_*"))
    finally:
        fencing.install(fencing.Fence())


def test_a_round_deposed_while_it_prepares_leaves_none_of_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The takeover lands between two members' entries: the round fails, no entry is
    named, and the one it had written for the first member stays where it is (a
    deposed leader removes nothing under the root either) until the next start's
    ``recover_log`` removes it."""
    from tidemark.lsn import LogOffset
    from tidemark.state import fencing
    from tidemark.writers import group_commit
    from tidemark.writers.buffer import Batch, Rows

    try:
        root = _deposed_root(tmp_path)
        members = []
        for i, name in enumerate(["first", "second"]):
            table = ShapeTable(root, name)
            table.create(table_schema(COLUMNS), ["id"], {"name": name})
            assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) == 1
            end = (i + 2) * BATCH
            batch = Batch(name, Rows(), [], end, LogOffset(end, 0), 1, 0.0, first_lsn=end)
            members.append((table, batch, _batch_files(table, end - BATCH + 1, end)))
        prepared = group_commit.prepared_sync

        def then_taken_over(*args: Any) -> Any:
            out = prepared(*args)
            fencing.advance(root, "test")  # (after the first member's entry)
            return out

        monkeypatch.setattr(group_commit, "prepared_sync", then_taken_over)
        with pytest.raises(fencing.Deposed):
            asyncio.run(group_commit.group_commit(members, None, 0.0))  # type: ignore[arg-type]
        left = {table.shape: list(table.log_dir.glob("_commit_*")) for table, _, _ in members}
        assert [len(left["first"]), len(left["second"])] == [1, 0]
        for table, _, _ in members:
            assert DeltaTable(table.uri).version() == 1
        fencing.install(fencing.Fence())  # the next start
        for table, _, _ in members:
            recover_log(table.shape, table.path, Path(root))
            assert not list(table.log_dir.glob("_commit_*"))
            assert DeltaTable(table.uri).version() == 1
    finally:
        fencing.install(fencing.Fence())


def test_a_transaction_retention_on_a_delta_table_is_overridden_at_start(tmp_path: Path) -> None:
    """``delta.setTransactionRetentionDuration`` lets a Delta writer forget application
    transactions not updated within it: the committed offsets. A table that has it (set
    by another tool) gets it overridden when tidemark opens it, and a restart after the
    retention replays nothing. (deltalake 1.6 kept the transactions in every trial here,
    checkpoint or not; Spark's Delta drops expired ones from its checkpoints.)"""
    root = str(tmp_path)
    table = ShapeTable(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
    DeltaTable(table.uri).alter.set_table_properties(
        {"delta.setTransactionRetentionDuration": "interval 1 second"}
    )
    time.sleep(1.5)
    # when tidemark starts again on the table
    restarted = ShapeTable(root, SHAPE)
    assert restarted.recover()
    # then the retention is one no offset outlives, and a replay is skipped
    config = DeltaTable(table.uri).metadata().configuration
    assert config["delta.setTransactionRetentionDuration"] == "interval 36500 days"
    DeltaTable(table.uri).create_checkpoint()
    assert restarted.committed_lsn() == BATCH
    assert restarted.commit(_batch_files(restarted, 1, BATCH), BATCH, first_lsn=1) is None
    assert sorted(r["_lsn"] for r in rows_of(restarted)) == list(range(1, BATCH + 1))
