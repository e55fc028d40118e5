"""Writers, scheduler and the Delta sink with a real Spark: exactly-once commits,
committed offsets, alignment to the tracker, staging, backpressure, schema
evolution, maintenance, frontiers and reads."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidemark import read
from tidemark.errors import SinkError
from tidemark.pgoutput.messages import UNCHANGED_TOAST
from tidemark.sink import TableFormat
from tidemark.sink.frontiers import Frontiers, ShapeFrontier, load_frontiers, store_frontiers
from tidemark.sink.schema import ColumnSpec
from tidemark.writers.scheduler import FlushPolicy, FlushScheduler

from .sink_support import ITEM_COLUMNS, make_feeder, open_writer, rows_of


@contextlib.asynccontextmanager
async def running(scheduler: FlushScheduler) -> AsyncIterator[FlushScheduler]:
    task = asyncio.create_task(scheduler.run())
    try:
        yield scheduler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def ins(i: int, name: str = "n") -> tuple[str, tuple[object, ...], None]:
    return ("insert", (str(i).encode(), name.encode(), b"big-" + str(i).encode()), None)


async def test_commits_are_aligned_to_transactions_and_read_back_after_restart(
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    sink_format: TableFormat,
) -> None:
    # given two shapes and transactions touching one, both, or neither
    feeder = make_feeder()
    a = open_writer(feeder, str(tmp_path), "a", tables=sink_format)
    b = open_writer(feeder, str(tmp_path), "b", tables=sink_format)
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    scheduler.add(a)
    scheduler.add(b)
    feeder.txn(100, {"a": [ins(1)]})
    feeder.txn(200, {"a": [ins(2)], "b": [ins(2)]})
    feeder.txn(300, {}, total_ops=3)  # touches no shape
    feeder.txn(400, {"b": [ins(4)]})
    # then nothing is durable before a flush
    assert feeder.notified == []
    # when everything is flushed
    async with running(scheduler):
        await scheduler.flush_all()
    # then the boundary reaches the last transaction, and each table has its rows once
    assert feeder.notified[-1] == 400
    assert a.table.committed_lsn() == 200 and b.table.committed_lsn() == 400
    assert sorted((r["id"], r["_lsn"]) for r in rows_of(a.table)) == [(1, 100), (2, 200)]
    assert sorted((r["id"], r["_lsn"]) for r in rows_of(b.table)) == [(2, 200), (4, 400)]
    # and after a restart, replayed transactions are dropped by committed offset
    feeder2 = make_feeder()
    a2 = open_writer(feeder2, str(tmp_path), "a", tables=sink_format)
    assert a2.committed_lsn == 200
    assert a2.begin_txn(200, 1, 0) is False
    assert a2.begin_txn(500, 1, 0) is True


async def test_shapes_due_together_are_written_by_one_round_and_committed_each_on_its_own(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidemark.writers import job

    # given four shapes, one with another column layout, and a value in shape c's rows
    # whose conversion fails until c's rows have been converted on their own once
    feeder = make_feeder()
    wide = [*ITEM_COLUMNS, ColumnSpec("extra", 25)]
    writers = [open_writer(feeder, str(tmp_path), name) for name in ("a", "b", "c")]
    writers.append(open_writer(feeder, str(tmp_path), "d", wide))
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for w in writers:
        scheduler.add(w)
    real_build = job.build_table
    failing = {"c": 1}

    def build_table(schema, specs, rows, shape=None):  # type: ignore[no-untyped-def]
        if failing["c"] and any(b"planted" in v for v in rows.values):
            # (the round converts shapes alike together first, then one by one)
            failing["c"] -= shape is not None
            raise ValueError(f"planted: a value of {shape} does not convert")
        return real_build(schema, specs, rows, shape)

    monkeypatch.setattr(job, "build_table", build_table)
    feeder.txn(100, {"a": [ins(1)], "b": [ins(1)], "c": [ins(1, "planted")]})
    wide_row = ("insert", (b"7", b"n", b"big", b"more"), None)
    feeder.txn(200, {"a": [ins(2)], "c": [ins(2)], "d": [wide_row]})
    # when they are flushed at once
    async with running(scheduler):
        await scheduler.flush_all()
        for _ in range(200):  # c's retry runs after a backoff
            if feeder.notified and feeder.notified[-1] == 200:
                break
            await asyncio.sleep(0.05)
    # then one round wrote them (one Spark job per layout), each table got its own
    # commit, and c, whose conversion failed in the round, was retried on its own
    assert scheduler.stats.rounds == 1 and scheduler.stats.round_shapes == 4
    assert scheduler.stats.job_failures == 1 and failing["c"] == 0
    assert feeder.notified[-1] == 200
    want = {"a": [(1, 100), (2, 200)], "b": [(1, 100)], "c": [(1, 100), (2, 200)], "d": [(7, 200)]}
    for w in writers:
        assert sorted((r["id"], r["_lsn"]) for r in rows_of(w.table)) == want[w.shape]
        assert w.table.committed_lsn() == max(lsn for _, lsn in want[w.shape])
        assert w.failure is None
    assert [r["extra"] for r in rows_of(writers[3].table)] == ["more"]
    # and the round left nothing behind in its staging folder
    assert scheduler.staging is not None
    assert not list(scheduler.staging.rglob("*.parquet"))


async def test_a_round_of_tiny_batches_writes_plain_files_and_one_of_larger_ones_snappy(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    def codecs(w) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
        found: dict[str, set[str]] = {}
        for rel in w.table.active_files():
            meta = pq.ParquetFile(w.table.path / rel).metadata
            found[rel] = {
                meta.row_group(g).column(c).compression
                for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)
            }
        return found

    # given three shapes flushed together twice: first a row each, then 300 rows each
    feeder = make_feeder()
    writers = [open_writer(feeder, str(tmp_path), name) for name in ("a", "b", "c")]
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for w in writers:
        scheduler.add(w)
    feeder.txn(100, {w.shape: [ins(1)] for w in writers})
    async with running(scheduler):
        await scheduler.flush_all()
        tiny = {w.shape: codecs(w) for w in writers}
        big = [ins(i, "n" * 100) for i in range(2, 302)]
        feeder.txn(200, {w.shape: big for w in writers})
        await scheduler.flush_all()
    # then the first round's files are uncompressed, the second's Snappy, and every
    # table has its rows once
    assert scheduler.stats.rounds == 2
    for w in writers:
        assert list(tiny[w.shape].values()) == [{"UNCOMPRESSED"}]
        later = {rel: c for rel, c in codecs(w).items() if rel not in tiny[w.shape]}
        assert list(later.values()) == [{"SNAPPY"}]
        assert sorted(r["id"] for r in rows_of(w.table)) == list(range(1, 302))


async def test_shapes_due_while_a_round_writes_wait_and_go_into_the_next_round_together(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from tidemark.writers import scheduler as scheduler_module

    real_write = scheduler_module.write_round
    release = threading.Event()

    def write_round(*args):  # type: ignore[no-untyped-def]
        release.wait(30)  # the first round's job runs until the test lets it end
        return real_write(*args)

    monkeypatch.setattr(scheduler_module, "write_round", write_round)
    feeder = make_feeder()
    writers = [open_writer(feeder, str(tmp_path), name) for name in ("a", "b", "c", "d")]
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=0.05))
    for w in writers:
        scheduler.add(w)
    async with running(scheduler):
        feeder.txn(100, {"a": [ins(1)], "b": [ins(2)]})
        scheduler.poke()
        for _ in range(100):
            if writers[0].in_flight:
                break
            await asyncio.sleep(0.02)
        # while a and b's round writes, c and then d come due by age, at different times
        feeder.txn(200, {"c": [ins(3)]})
        scheduler.poke()
        await asyncio.sleep(0.3)
        feeder.txn(300, {"d": [ins(4)]})
        scheduler.poke()
        await asyncio.sleep(0.3)
        assert not writers[2].in_flight and not writers[3].in_flight  # they wait
        release.set()
        for _ in range(300):
            if feeder.notified and feeder.notified[-1] == 300:
                break
            await asyncio.sleep(0.05)
    # then c and d went into one round together, not a job each
    assert scheduler.stats.rounds == 2 and scheduler.stats.round_shapes == 4
    want = {"a": [1], "b": [2], "c": [3], "d": [4]}
    for w in writers:
        assert [r["id"] for r in rows_of(w.table)] == want[w.shape]


async def test_a_round_hands_spark_its_rows_as_a_parquet_file_not_through_create_data_frame(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A classic session reads a round's rows from the file the driver wrote (removed
    after the job); ``createDataFrame`` is left for Spark Connect and for roots whose
    path Hadoop cannot read as it is (the test below)."""

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("the rows went through createDataFrame")

    monkeypatch.setattr(type(spark), "createDataFrame", refused)
    feeder = make_feeder()
    writers = [open_writer(feeder, str(tmp_path / "lake"), name) for name in ("a", "b")]
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for w in writers:
        scheduler.add(w)
    feeder.txn(100, {"a": [ins(1), ins(2)], "b": [ins(3)]})
    async with running(scheduler):
        await scheduler.flush_all()
    assert scheduler.stats.rounds == 1 and scheduler.stats.job_failures == 0
    want = {"a": [(1, 100), (2, 100)], "b": [(3, 100)]}
    for w in writers:
        assert sorted((r["id"], r["_lsn"]) for r in rows_of(w.table)) == want[w.shape]
    staging = tmp_path / "lake" / "_rounds"
    assert not [p for p in staging.rglob("*") if p.name.endswith(".in")]  # removed


async def test_a_local_round_writes_each_members_files_in_place_under_any_folder_name(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In local mode a round's tasks write each member's file straight into its table
    (``DirectPartitionCommitProtocol``): nothing is moved afterwards, and a sink root
    whose name has characters Spark escapes in partition folders still works."""
    from tidemark.writers import job

    assert job.writes_in_place(spark)

    def no_move(*_: object) -> None:
        raise AssertionError("a member's folder was moved: the files were not written in place")

    monkeypatch.setattr(job, "_adopt", no_move)
    root = tmp_path / "lake =:{x}^[1] ü"
    feeder = make_feeder()
    writers = [open_writer(feeder, str(root), name) for name in ("a", "b", "c")]
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    for w in writers:
        scheduler.add(w)
    feeder.txn(100, {"a": [ins(1)], "b": [ins(1), ins(2)], "c": [ins(3)]})
    feeder.txn(200, {"a": [ins(4)], "c": [ins(5)]})
    async with running(scheduler):
        await scheduler.flush_all()
    assert scheduler.stats.rounds == 1 and scheduler.stats.job_failures == 0
    want = {"a": [(1, 100), (4, 200)], "b": [(1, 100), (2, 100)], "c": [(3, 100), (5, 200)]}
    for w in writers:
        assert sorted((r["id"], r["_lsn"]) for r in rows_of(w.table)) == want[w.shape]
        (data_file,) = w.table.active_files_with_sizes()
        assert data_file[0].startswith("data/") and (w.table.path / data_file[0]).is_file()


def test_local_spark_writes_files_through_tidemarks_filesystem_with_hadoops_modes(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """Local mode sets modes through java.nio (``tidemark.jvm``), not a ``chmod``
    process per file: the same modes Hadoop's own local filesystem gives (its umask
    022: files 0644, folders 0755)."""
    from tidemark import jvm

    uri = spark._jvm.java.net.URI(tmp_path.as_uri())
    fs = spark._jvm.org.apache.hadoop.fs.FileSystem.get(uri, spark._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == jvm.LOCAL_FS_CLASS
    frame = spark.range(40).selectExpr("id", "id % 4 as part")
    frame.coalesce(1).write.partitionBy("part").parquet(str(tmp_path / "out"))
    files = list((tmp_path / "out").rglob("*.parquet"))
    folders = [p for p in (tmp_path / "out").rglob("part=*") if p.is_dir()]
    assert len(files) == 4 and len(folders) == 4
    assert {f.stat().st_mode & 0o7777 for f in files} == {0o644}
    assert {d.stat().st_mode & 0o7777 for d in folders} == {0o755}
    assert spark.read.parquet(str(tmp_path / "out")).count() == 40


def test_a_local_scan_of_thousands_of_pruned_files_keeps_its_tasks_short(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """Spark's file scan goes one call deeper for each file that yields no rows:
    10000 files whose rows a filter pruned, packed into two tasks (``openCostInBytes``
    0), overflowed a task thread's stack and ended the JVM (a bench run lost its JVM
    that way). Each task holds at most 512 files, and the scan ends."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    count = 10_000
    folder = tmp_path / "tail"
    folder.mkdir()
    for i in range(count):
        rows = pa.table({"id": pa.array([i, -i], pa.int64()), "_lsn": pa.array([i, i], pa.int64())})
        pq.write_table(rows, folder / f"{i:05d}.parquet", compression="none")
    paths = [str(folder / f"{i:05d}.parquet") for i in range(count)]
    frame = spark.read.schema("id long, _lsn long").parquet(*paths)
    tasks = frame.rdd.getNumPartitions()
    assert count / tasks <= 512, f"{count} files in {tasks} tasks"
    assert frame.where(F.col("_lsn") >= count).count() == 0  # every file pruned
    assert frame.where(F.col("_lsn") >= count - 3).count() == 6


async def test_a_replayed_batch_is_not_committed_twice(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path, sink_format: TableFormat
) -> None:
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a", tables=sink_format)
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    scheduler.add(w)
    feeder.txn(100, {"a": [ins(1)]})
    async with running(scheduler):
        await scheduler.flush_all()
    # when a second writer on the same table (a restarted process that did not read
    # the committed offset) tries to commit the same transaction
    other = make_feeder()
    w2 = open_writer(other, str(tmp_path), "a", tables=sink_format)
    w2.committed_lsn = None
    other.txn(100, {"a": [ins(1)]})
    s2 = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    s2.add(w2)
    async with running(s2):
        await s2.flush_all()
    # then the sink's transaction check refuses it: the row is there once
    assert s2.stats.replays_skipped == 1 and s2.stats.commits == 0
    assert [r["id"] for r in rows_of(w.table)] == [1]
    assert other.notified[-1] == 100  # and it still counts as durable


async def test_age_threshold_flushes_without_being_asked(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=0.2))
    scheduler.add(w)
    async with running(scheduler):
        feeder.txn(100, {"a": [ins(1)]})
        scheduler.poke()
        for _ in range(200):
            if feeder.notified:
                break
            await asyncio.sleep(0.05)
    assert feeder.notified == [100]


async def test_huge_transaction_is_staged_and_never_half_visible(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # given a stage threshold far below the transaction's size
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=0.05, stage_bytes=200_000))
    scheduler.add(w)
    async with running(scheduler):
        feeder.txn(100, {"a": [ins(0)]})
        await scheduler.flush_all()
        # when a 6000-row transaction arrives in pieces, with time for staging between
        assert w.begin_txn(200, 2, 0)
        for i in range(6000):
            w.append(i, "insert", (str(i + 1).encode(), b"x" * 20, b"y"), None, 64)
            if i % 1000 == 999:
                scheduler.poke()
                await asyncio.sleep(0.01)
                while w.in_flight:  # the staging job the poke started
                    await asyncio.sleep(0.01)
                # then while it is open, none of its rows is visible
                assert [r["_lsn"] for r in rows_of(w.table)] == [100]
        assert scheduler.stats.stage_jobs >= 3
        assert w.buffer.open_bytes < 200_000  # RAM holds only the unstaged tail
        from tidemark.flush.tracker import CommitFragment
        from tidemark.lsn import LogOffset

        last = LogOffset(200, 5999)
        feeder.tracker.handle_txn_fragment(CommitFragment(last), ["a"])
        w.end_txn(last)
        await scheduler.flush_all()
    # and after its commit, all of it arrives in one Delta commit
    rows = rows_of(w.table)
    assert sorted(r["_op"] for r in rows if r["_lsn"] == 200) == list(range(6000))
    history = w.table.table().history()
    assert [h.get("tidemark.endLsn") for h in history if "tidemark.endLsn" in h] == ["200", "100"]
    assert feeder.notified[-1] == 200


async def test_backpressure_blocks_until_a_flush_makes_room(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60, memory_budget=50_000))
    scheduler.add(w)
    async with running(scheduler):
        feeder.txn(100, {"a": [ins(i) for i in range(1000)]})  # ~128 kB buffered
        assert scheduler.buffered_bytes > 50_000
        waiter = asyncio.create_task(scheduler.wait_for_room())
        await asyncio.wait_for(waiter, 60)  # returns only once the flush freed memory
        assert scheduler.buffered_bytes < 50_000
        assert scheduler.stats.backpressure_waits == 1
    assert len(rows_of(w.table)) == 1000


async def test_rows_appended_since_the_last_sum_make_the_stream_wait(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The total is summed over the writers only near the budget (``Charge``): what
    was appended since the last sum must count, streamed rows included."""
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60, memory_budget=50_000))
    scheduler.add(w)
    assert scheduler.buffered_bytes == 0  # the last sum: nothing buffered
    # given ~64 kB of a transaction still being streamed, appended after that sum
    for i in range(500):
        w.stream_append(7, i, "insert", (str(i).encode(), b"n", b"big"), None, 32)
    # then the stream waits for room, though nobody summed since
    waiter = asyncio.create_task(scheduler.wait_for_room())
    await asyncio.sleep(0.2)
    assert not waiter.done() and scheduler.stats.backpressure_waits == 1
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    # and once the streamed rows are dropped and ~64 kB of ordinary rows arrive, the
    # same holds for them, and a flush lets the stream go on
    w.stream_discard(7)
    assert scheduler.buffered_bytes == 0
    feeder.txn(100, {"a": [ins(i) for i in range(500)]})
    waiter = asyncio.create_task(scheduler.wait_for_room())
    await asyncio.sleep(0.2)
    assert not waiter.done() and scheduler.stats.backpressure_waits == 2
    async with running(scheduler):
        await asyncio.wait_for(waiter, 60)
    assert len(rows_of(w.table)) == 500


async def test_added_column_evolves_the_table_schema(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    scheduler.add(w)
    async with running(scheduler):
        feeder.txn(100, {"a": [ins(1)]})
        await scheduler.flush_all()
        w.set_columns([*ITEM_COLUMNS, ColumnSpec("qty", 23)])
        feeder.txn(200, {"a": [("insert", (b"2", b"n", b"b", b"7"), None)]})
        await scheduler.flush_all()
    assert "qty" in w.table.refresh().schema().to_arrow().names  # type: ignore[attr-defined]
    state = {r["id"]: r["qty"] for r in read.current(spark, tmp_path, "a").collect()}
    assert state == {1: None, 2: 7}


async def test_compaction_and_vacuum_keep_the_data_and_drop_leftovers(
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    feeder = make_feeder()
    w = open_writer(feeder, str(tmp_path), "a")
    scheduler = FlushScheduler(spark, FlushPolicy(max_age_s=60))
    scheduler.add(w)
    async with running(scheduler):
        for lsn in range(100, 600, 100):
            feeder.txn(
                lsn,
                {
                    "a": [
                        ins(lsn // 100),
                        ("update", (b"1", f"v{lsn}".encode(), UNCHANGED_TOAST), ["big"]),
                    ]
                },
            )
            await scheduler.flush_all()
    before = sorted(map(tuple, read.current(spark, tmp_path, "a").collect()))
    # a batch Spark wrote but a crash never committed
    leftover = w.table.path / "data" / "crashed-batch"
    leftover.mkdir()
    (leftover / "part-0.parquet").write_bytes(b"PAR1 junk")
    os.utime(leftover / "part-0.parquet", (0, 0))
    w.table.compact()
    deleted = w.table.vacuum(retention_hours=1)
    assert any("crashed-batch" in d for d in deleted)
    assert len(w.table.active_files()) == 1
    after = sorted(map(tuple, read.current(spark, tmp_path, "a").collect()))
    assert after == before
    assert w.table.committed_lsn() == 500


def test_frontiers_round_trip_and_snapshot_refuses_beyond_them(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store_frontiers(
        tmp_path, Frontiers(500, {"a": ShapeFrontier(500, 300), "b": ShapeFrontier(200, 200)})
    )
    loaded = load_frontiers(tmp_path)
    assert loaded is not None and loaded.shapes["b"].frontier_lsn == 200
    assert loaded.updated_at > 0
    with pytest.raises(SinkError, match=r"b \(frontier 0/C8\)"):
        read.snapshot(spark, tmp_path, ["a", "b"], as_of=300)


def test_reading_an_unknown_shape_says_so(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SinkError, match="shape 'nope' has no table"):
        read.changelog(spark, tmp_path, "nope")
