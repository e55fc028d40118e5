"""The pure parts of current-state tables: file layout, schema, retention boundary,
vacuum horizon, which tables are kept as one file and batched, and when the keeper
refreshes a shape."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from tidemark.observability import Metrics
from tidemark.settings.config import Settings
from tidemark.sink import current
from tidemark.sink.current import bucket_dir, bucket_of_path
from tidemark.sink.port import ChangelogFile, ChangelogView, RefreshPoint
from tidemark.sink.retention import current_vacuum_hours, retention_boundary
from tidemark.sink.schema import ColumnSpec, current_schema, primary_key_of, table_schema
from tidemark.upkeep import CurrentKeeper

HOUR_MS = 3_600_000


def point(lsn: int, at_ms: int, generation: int = 1) -> RefreshPoint:
    return RefreshPoint(version=lsn, lsn=lsn, generation=generation, buckets=16, timestamp_ms=at_ms)


def test_a_file_belongs_to_the_bucket_its_folder_names() -> None:
    assert bucket_dir(7) == "bucket-00007"
    assert bucket_of_path("bucket-00007/abc.parquet") == 7
    assert bucket_of_path("bucket-04095/x/y.parquet") == 4095
    assert bucket_of_path("data/abc.parquet") is None
    assert bucket_of_path("bucket-xx/abc.parquet") is None


def test_the_current_table_has_the_shape_columns_the_key_and_lsn_only() -> None:
    changelog = table_schema([ColumnSpec("id", 23), ColumnSpec("name", 25)])
    schema = current_schema(changelog, ["id"])
    assert schema.names == ["id", "name", "_lsn"]
    assert schema.field("_lsn").type == pa.int64()
    assert primary_key_of(schema) == ["id"]


def test_retention_drops_through_the_newest_refresh_older_than_the_retention() -> None:
    now = 100 * HOUR_MS
    points = [point(10, now - 50 * HOUR_MS), point(20, now - 30 * HOUR_MS), point(30, now)]
    assert retention_boundary(points, 1, 24, now) == 20
    assert retention_boundary(points, 1, 0, now) == 30
    assert retention_boundary(points, 1, 60, now) is None  # nothing that old yet
    # refreshes of an older generation (before a resync) never count
    assert retention_boundary(points, 2, 0, now) is None


def test_the_current_table_keeps_removed_files_back_to_the_retention_boundary() -> None:
    now = 100 * HOUR_MS
    points = [point(10, now - 50 * HOUR_MS), point(20, now - 30 * HOUR_MS)]
    assert current_vacuum_hours(points, None, 24, now) == 24  # whole changelog: no need
    assert current_vacuum_hours(points, 20, 24, now) == 32  # the version at 20 is 30 h old
    assert current_vacuum_hours(points, 10, 168, now) == 168


def test_the_tail_is_every_file_that_reaches_past_the_lsn() -> None:
    view = ChangelogView(
        3,
        1,
        "table-id",
        pa.schema([]),
        ["id"],
        [
            ChangelogFile(name, name, 100, lo, hi, rows)
            for name, lo, hi, rows in [("a", 1, 10, 5), ("b", 11, 20, 7), ("c", None, None, 2)]
        ],
    )
    assert view.max_lsn == 20
    assert [f.uri for f in view.files_after(10)] == ["b", "c"]  # "c": no statistics, read it
    assert [f.uri for f in view.files_after(None)] == ["a", "b", "c"]
    assert view.rows_after(10) == 9


class FakeWriter:
    def __init__(self) -> None:
        self.backfill: Any = None


def keeper(**current: Any) -> tuple[CurrentKeeper, dict[str, FakeWriter], dict[str, bool]]:
    settings = Settings.model_validate(
        {"current": {"refresh_s": 10, "refresh_rows": 100, **current}}
    )
    writers = {"s": FakeWriter()}
    ready = {"s": True}
    scheduler = SimpleNamespace(writers=writers)
    k = CurrentKeeper(
        settings,
        None,
        scheduler,
        Metrics(),  # type: ignore[arg-type]
        frontier=lambda n: 0 if ready[n] else None,  # no frontier: not ready
        clock=lambda: 0.0,  # tracking starts at 0; the tests pass `now` to due()
    )
    return k, writers, ready


def test_a_shape_is_refreshed_when_ready_then_on_its_timer_or_its_row_count() -> None:
    k, _, ready = keeper()
    ready["s"] = False
    assert not k.due("s", 0.0)  # not ready: its changelog is not a whole state yet
    ready["s"] = True
    assert not k.due("s", 5.0)  # ready since 0: looked at once its timer ran out
    assert k.due("s", 10.0)
    state = k.shapes["s"]
    state.rows_waiting, state.refreshed_at = 0, 10.0  # (what a refresh leaves)
    assert not k.due("s", 30.0)  # nothing committed since
    k.on_commit("s", 10)
    assert not k.due("s", 15.0)  # committed, but its timer has not run out
    assert k.due("s", 20.0)
    k.on_commit("s", 95)
    assert k.due("s", 15.0)  # 105 rows waiting >= refresh_rows


def test_a_backfill_holds_refreshes_and_its_snapshot_waits_to_be_folded() -> None:
    k, writers, _ = keeper()
    assert k.due("s", 10.0)
    state = k.shapes["s"]
    state.rows_waiting, state.refreshed_at = 0, 10.0
    writers["s"].backfill = object()
    assert not k.due("s", 100.0)  # a resync is running: never fold half a snapshot
    k.on_commit("s", 1000)
    assert not k.due("s", 100.0)
    writers["s"].backfill = None
    state.rows_waiting = 0
    assert k.due("s", 100.0)  # its commit changed the changelog: rebuilt from it


def test_bucket_counts_are_bounded() -> None:
    with pytest.raises(ValueError, match="buckets"):
        Settings.model_validate({"current": {"buckets": 0}})
    assert Settings.model_validate({}).current.buckets == 16
    assert Settings.model_validate({}).sink.changelog_retention_hours is None


def test_a_batched_refresh_tells_each_files_shape_from_its_path() -> None:
    shape_in = re.compile(current._SHAPE_IN_PATH)
    paths = {
        "file:/srv/tables/lake/tables/g17/data/1f0c/part-00000-ab.c000.snappy.parquet": "g17",
        "file:///srv/current/x/current/_orders_2/bucket-00000/9e1d.parquet": "_orders_2",
        "/srv/lake/tables/s/data/u/part-0.parquet": "s",
    }
    for path, shape in paths.items():
        found = shape_in.search(path)
        assert found is not None and found.group(1) == shape, path
    # only files laid out as tidemark writes them are batched (else: one by one)
    assert current._CHANGELOG_FILE.fullmatch("data/1f0c/part-00000-ab.c000.snappy.parquet")
    assert current._CURRENT_FILE.fullmatch("bucket-00003/9e1d.parquet")
    for odd in ("part-0.parquet", "data/a/b/c.parquet", "bucket-3/x.parquet", "data/a/x.crc"):
        assert not current._CHANGELOG_FILE.fullmatch(odd)
        assert not current._CURRENT_FILE.fullmatch(odd)


def small_plan(table_bytes: int, tail_bytes: int, buckets: int | None) -> Any:
    view = ChangelogView(
        3,
        1,
        "id",
        pa.schema([]),
        ["id"],
        [
            ChangelogFile("data/a/old.parquet", "", 10**9, 1, 10, 5),  # folded already
            ChangelogFile("data/b/new.parquet", "", tail_bytes, 11, 20, 5),
        ],
    )
    point = None if buckets is None else RefreshPoint(1, 10, 1, buckets, 0, "id")
    return current._Plan(
        table=None,  # type: ignore[arg-type]
        view=view,
        target=pa.schema([]),
        pinned=None,
        point=point,
        regenerate=point is None,
        new_columns=False,
        after=None if point is None else 10,
        upto=20,
        old={} if point is None else {0: [("bucket-00000/f.parquet", table_bytes)]},
    )


def test_a_table_is_one_file_while_it_and_its_tail_are_small() -> None:
    mib = 1024 * 1024
    assert current._is_small(small_plan(20 * mib, 10 * mib, 1), 32 * mib)
    assert not current._is_small(small_plan(20 * mib, 13 * mib, 1), 32 * mib)
    # a bucketed table goes back to one file only at half the size
    assert not current._is_small(small_plan(10 * mib, 7 * mib, 16), 32 * mib)
    assert current._is_small(small_plan(10 * mib, 6 * mib, 16), 32 * mib)
    # a first refresh reads the whole changelog
    assert not current._is_small(small_plan(0, 1, None), 32 * mib)
    assert current._is_small(small_plan(0, 1, None), 2 * 10**9)
    assert not current._is_small(small_plan(0, 0, 1), 0)  # 0: never
    groups = current._by_bytes([small_plan(0, n * mib, 1) for n in (3, 3, 3, 1)], 7 * mib)
    assert [len(g) for g in groups] == [2, 2]
