"""A new shape's Delta table without the library: its first entry written as the library
wrote it for the same schema, and its first backfill commit written directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from tidemark.errors import SinkError
from tidemark.sink.delta import table as delta_table
from tidemark.sink.delta.table import GENERATION_PREFIX, ShapeTable
from tidemark.sink.files import DataFile, describe_file
from tidemark.state import fencing

SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("_lsn", pa.int64()), ("_op", pa.int32())]
)


@pytest.fixture(autouse=True)
def _fresh_creations(monkeypatch: pytest.MonkeyPatch) -> None:
    # (what earlier tests taught the process-wide cache must not decide these tests)
    monkeypatch.setattr(delta_table, "_MADE", delta_table._Creations())


@pytest.fixture
def fenced(tmp_path: Path) -> Iterator[fencing.Fence]:
    before = fencing.current()
    fence = fencing.install(fencing.Fence(tmp_path, fencing.advance(tmp_path, "me")))
    try:
        yield fence
    finally:
        fencing.install(before)


def _entry(table: ShapeTable, version: int) -> list[dict[str, object]]:
    text = (table.log_dir / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _data_file(table: ShapeTable, rows: int) -> DataFile:
    rel = "data/snap/part-0.parquet"
    (table.path / "data" / "snap").mkdir(parents=True, exist_ok=True)
    arrow = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "name": pa.array(["x"] * rows),
            "_lsn": pa.array([7] * rows, pa.int64()),
            "_op": pa.array(range(rows), pa.int32()),
        }
    )
    pq.write_table(arrow, table.path / rel)
    return describe_file(table.path, rel)


def test_a_second_table_of_a_schema_is_made_without_the_library(
    tmp_path: Path, fenced: fencing.Fence
) -> None:
    first, second = ShapeTable(tmp_path, "a"), ShapeTable(tmp_path, "b")
    assert first.create(SCHEMA, ["id"], {"name": "a", "table": "public.t"})
    assert second.create(SCHEMA, ["id"], {"name": "b", "table": "public.t"})
    assert _entry(first, 0)[0]["commitInfo"]["engineInfo"] != "tidemark"  # type: ignore[index]
    made = _entry(second, 0)
    assert made[0]["commitInfo"]["engineInfo"] == "tidemark"  # type: ignore[index]
    assert {"txn": {"appId": fenced.app_id, "version": fenced.epoch}} in made  # born marked

    a, b = DeltaTable(first.uri), DeltaTable(second.uri)
    assert b.version() == 0
    assert b.schema() == a.schema()
    assert b.protocol() == a.protocol()
    assert b.metadata().name == "b" and b.metadata().id != a.metadata().id
    assert json.loads(b.metadata().description)["tidemark"]["shape"]["name"] == "b"
    assert fencing.table_epoch(b) == fenced.epoch
    # what the object says without reading the table is what a reader of it finds
    again = ShapeTable(tmp_path, "b")
    assert again.recover()
    assert second.arrow_schema() == again.arrow_schema()
    assert second.primary_key() == again.primary_key() == ["id"]
    assert second.active_files_with_sizes() == again.active_files_with_sizes() == []


def test_a_table_made_directly_refuses_a_second_creation(tmp_path: Path) -> None:
    ShapeTable(tmp_path, "a").create(SCHEMA, ["id"])
    second = ShapeTable(tmp_path, "b")
    second.create(SCHEMA, ["id"])
    made = delta_table._MADE.get(delta_table.with_primary_key(SCHEMA, ["id"]))
    assert made is not None
    with pytest.raises(SinkError, match="exists there already"):
        second._create_directly(made, "{}")
    assert DeltaTable(second.uri).version() == 0


def test_a_schema_the_library_gave_writer_features_is_always_made_by_the_library(
    tmp_path: Path,
) -> None:
    stamped = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us"))])  # timestampNtz
    for name in ("a", "b"):
        ShapeTable(tmp_path, name).create(stamped, ["id"])
        info = _entry(ShapeTable(tmp_path, name), 0)[0]["commitInfo"]
        assert info["engineInfo"] != "tidemark"  # type: ignore[index]
    assert delta_table._MADE.get(delta_table.with_primary_key(stamped, ["id"])) is None


def test_a_new_tables_first_backfill_is_written_directly_and_reads_back(tmp_path: Path) -> None:
    ShapeTable(tmp_path, "first").create(SCHEMA, ["id"])
    table = ShapeTable(tmp_path, "s")
    table.create(SCHEMA, ["id"])
    data = _data_file(table, 3)
    version = table.backfill_commit([], [data], {"tidemark.snapshotLsn": 42})
    assert version == 1
    entry = _entry(table, 1)
    assert entry[0]["commitInfo"]["engineInfo"] == "tidemark"  # type: ignore[index]
    assert entry[0]["commitInfo"]["tidemark.operation"] == "backfill"  # type: ignore[index]

    reader = ShapeTable(tmp_path, "s")
    assert reader.recover()
    assert reader.generation() == 1
    assert reader.committed_lsn() is None  # a backfill leaves the stream's offset alone
    dt = DeltaTable(table.uri)
    assert dt.to_pyarrow_table().num_rows == 3
    assert dt.transaction_version(GENERATION_PREFIX + "s") == 1
    assert table.active_files_with_sizes() == [(data.path, data.size)]

    # the next backfill replaces those files: the library's way, on the same log
    second = table.backfill_commit([(data.path, data.size)], [])
    assert second == 2
    assert ShapeTable(tmp_path, "s").generation() == 2
    assert DeltaTable(table.uri).to_pyarrow_table().num_rows == 0


def test_a_backfill_after_the_stream_committed_keeps_the_offset(tmp_path: Path) -> None:
    table = ShapeTable(tmp_path, "s")
    table.create(SCHEMA, ["id"])
    table.commit([], 500)
    version = table.backfill_commit([], [])
    assert version == 2
    reader = ShapeTable(tmp_path, "s")
    assert reader.committed_lsn() == 500 and reader.generation() == 1


def test_a_deposed_leader_makes_no_table(tmp_path: Path) -> None:
    before = fencing.current()
    ShapeTable(tmp_path, "first").create(SCHEMA, ["id"])
    fencing.install(fencing.Fence(tmp_path, fencing.advance(tmp_path, "old")))
    try:
        table = ShapeTable(tmp_path, "s")
        fencing.advance(tmp_path, "new")
        with pytest.raises(fencing.Deposed):
            table.create(SCHEMA, ["id"])
        assert not table.path.exists()
    finally:
        fencing.install(before)


def test_without_put_if_absent_the_library_makes_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ShapeTable(tmp_path, "first").create(SCHEMA, ["id"])

    def no_links(temp: Path, target: Path) -> bool:
        temp.unlink()
        raise OSError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(delta_table, "publish_new", no_links)
    table = ShapeTable(tmp_path, "s")
    assert table.create(SCHEMA, ["id"])
    assert _entry(table, 0)[0]["commitInfo"]["engineInfo"] != "tidemark"  # type: ignore[index]
    assert DeltaTable(table.uri).version() == 0
    assert not list(table.log_dir.glob("*.tmp"))
