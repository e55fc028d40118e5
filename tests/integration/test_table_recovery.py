"""What a power loss can leave of a table's unsynced commits, and what the start makes
of it (``ShapeTable.recover``): torn entries at the end of the log are removed, a torn
checkpoint hint too, and anything else unreadable is a clear ``TableDamaged`` naming
the shape and what to do. No Spark: files are written with pyarrow, committed by the
table's own commit path."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from tidemark.errors import TableDamaged
from tidemark.sink.delta.table import ShapeTable, set_aside
from tidemark.sink.schema import LSN, OP

SCHEMA = pa.schema([("id", pa.int64()), (LSN, pa.int64()), (OP, pa.int64())])


def _table_with_commits(root: Path, commits: int) -> ShapeTable:
    table = ShapeTable(root, "s")
    table.create(SCHEMA, ["id"])
    for i in range(1, commits + 1):
        rel, folder = table.new_batch_dir()
        folder.mkdir(parents=True)
        rows = pa.table({"id": [i], LSN: [100 * i], OP: [0]}, schema=SCHEMA)
        pq.write_table(rows, folder / "part-0.parquet")
        table.commit([table.file_at(f"{rel}/part-0.parquet")], 100 * i)
    return table


def _entry(table: ShapeTable, version: int) -> Path:
    return table.log_dir / f"{version:020d}.json"


def test_a_torn_last_entry_is_removed_and_its_version_written_again(tmp_path: Path) -> None:
    """Given commits 1..3 where the third entry came back empty after a power loss (it
    was never synced, so never acknowledged), the start removes it: the table holds
    two commits, and the next commit takes version 3 again."""
    table = _table_with_commits(tmp_path, 3)
    _entry(table, 3).write_bytes(b"")
    again = ShapeTable(tmp_path, "s")
    assert again.recover() is True
    assert again.committed_lsn() == 200
    assert not _entry(table, 3).exists()
    rel, folder = again.new_batch_dir()
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": [3], LSN: [300], OP: [0]}, schema=SCHEMA), folder / "p.parquet")
    assert again.commit([again.file_at(f"{rel}/p.parquet")], 300) == 3
    assert sorted(DeltaTable(again.uri).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


def test_a_table_whose_creation_was_never_synced_is_created_again(tmp_path: Path) -> None:
    """The first entry came back half written: there is no table, and ``create`` makes
    one (before this, ``tidemark run`` died on deltalake's "No table metadata")."""
    table = _table_with_commits(tmp_path, 0)
    _entry(table, 0).write_bytes(_entry(table, 0).read_bytes()[:25])
    again = ShapeTable(tmp_path, "s")
    assert again.recover() is False
    again.create(SCHEMA, ["id"])
    assert DeltaTable(again.uri).version() == 0


def test_a_torn_checkpoint_hint_is_removed(tmp_path: Path) -> None:
    table = _table_with_commits(tmp_path, 2)
    (table.log_dir / "_last_checkpoint").write_bytes(b"\0\0\0")
    assert ShapeTable(tmp_path, "s").recover() is True
    assert not (table.log_dir / "_last_checkpoint").exists()


def test_a_torn_entry_before_a_whole_one_is_damage_named_with_what_to_do(
    tmp_path: Path,
) -> None:
    table = _table_with_commits(tmp_path, 3)
    _entry(table, 2).write_bytes(b'{"commitInfo":')
    with pytest.raises(TableDamaged) as damaged:
        ShapeTable(tmp_path, "s").recover()
    text = str(damaged.value)
    assert "shape 's'" in text and "on_stream_gap" in text and "not whole" in text


def test_a_missing_data_file_is_damage_and_the_table_can_be_set_aside(tmp_path: Path) -> None:
    table = _table_with_commits(tmp_path, 2)
    first = json.loads(_entry(table, 1).read_text().splitlines()[1])["add"]["path"]
    (table.path / first).unlink()
    again = ShapeTable(tmp_path, "s")
    with pytest.raises(TableDamaged) as damaged:
        again.create(SCHEMA, ["id"])
    assert "missing" in str(damaged.value) and first in str(damaged.value)
    aside = set_aside(again)
    assert aside.parent == tmp_path / "damaged" and (aside / "_delta_log").is_dir()
    again.create(SCHEMA, ["id"])
    assert DeltaTable(again.uri).version() == 0


def test_compaction_keeps_every_row_and_the_committed_offset(tmp_path: Path) -> None:
    """tidemark's own compaction (synced files, one commit) in place of optimize."""
    table = _table_with_commits(tmp_path, 5)
    before = sorted(DeltaTable(table.uri).to_pyarrow_table().column("id").to_pylist())
    metrics = table.compact()
    assert metrics == {"numFilesAdded": 1, "numFilesRemoved": 5}
    assert len(table.active_files()) == 1
    fresh = DeltaTable(table.uri)
    assert sorted(fresh.to_pyarrow_table().column("id").to_pylist()) == before
    assert fresh.transaction_version("tidemark:s") == 500
    assert ShapeTable(tmp_path, "s").recover() is True


def test_a_prepared_entry_never_named_is_removed_and_a_replay_drops_its_own(
    tmp_path: Path,
) -> None:
    """A flush round writes each commit's entry before syncing (``prepare``): one left
    by a crash is removed at start; one prepared for a batch the table already holds
    (a replay) is removed by the commit that skips it."""
    table = _table_with_commits(tmp_path, 2)
    left = table.prepare([], 900)
    assert left is not None and left.exists()
    assert ShapeTable(tmp_path, "s").recover() is True
    assert not left.exists()
    again = ShapeTable(tmp_path, "s")
    again.recover()
    rel, folder = again.new_batch_dir()
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": [3], LSN: [300], OP: [0]}, schema=SCHEMA), folder / "p.parquet")
    again.commit([again.file_at(f"{rel}/p.parquet")], 300)  # (the handle knows its head)
    replay = again.prepare([], 200)
    assert replay is not None
    assert again.commit([], 200, prepared=replay) is None
    assert not replay.exists()
    assert sorted(p.name for p in again.log_dir.glob("*.tmp")) == []
