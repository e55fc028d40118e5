"""The Iceberg format's own promises, beside the tests that run on both formats
(``sink_format`` and ``table_format`` parameters elsewhere): a deposed leader's commit
is refused by the epoch in the snapshot summary and by the catalog's compare-and-swap;
expiring snapshots never loses the committed offset; a PostgreSQL database serves as
the catalog; bad catalogs and foreign tables get clear errors. The files are written
with pyarrow, the commit protocol is what is tested: each stream commit made by pyiceberg
and by Iceberg's Java library in Spark's driver (``engine``: ``iceberg.jvm``), the
table's other commits by pyiceberg."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.crashfs import CrashFS, require_crashfs
from tidemark.errors import ConfigError, SinkError, WriterFenced
from tidemark.settings.config import IcebergSettings
from tidemark.sink import table_format
from tidemark.sink.iceberg import snapshots
from tidemark.sink.iceberg.catalog import forget_catalogs
from tidemark.sink.iceberg.format import IcebergFormat
from tidemark.sink.root import claim_root, root_format
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.state import fencing

from .conftest import PgDatabase, PgServer
from .sink_support import rows_of
from .test_sink_fencing import BATCH, COLUMNS, SHAPE, _batch_files


@pytest.fixture(params=["pyiceberg", "java"])
def iceberg(request: pytest.FixtureRequest) -> Iterator[IcebergFormat]:
    """The format, its stream commits made by pyiceberg or by Iceberg's Java library in
    Spark's driver (``iceberg.jvm``)."""
    yield engine_format(request)
    forget_catalogs()


def engine_format(request: pytest.FixtureRequest) -> IcebergFormat:
    made = IcebergFormat()
    if request.param == "java":
        made.use_engine(request.getfixturevalue("spark"))
    return made


@pytest.fixture
def epoch_one(tmp_path: Path) -> Iterator[fencing.Fence]:
    """This process leads ``tmp_path`` with epoch 1."""
    (tmp_path / "_tidemark").mkdir()
    (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
    fence = fencing.install(fencing.Fence(str(tmp_path), 1))
    try:
        yield fence
    finally:
        fencing.install(fencing.Fence())


def test_a_deposed_leaders_commit_is_refused_by_the_mark_and_by_the_swap(
    tmp_path: Path, iceberg: IcebergFormat, epoch_one: fencing.Fence
) -> None:
    root = str(tmp_path)
    deposed: list[str] = []
    epoch_one.on_deposed(deposed.append)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is not None
    staged = _batch_files(table, BATCH + 1, 2 * BATCH)
    # when a newer leader takes over: the epoch raised, the table marked
    assert fencing.advance(root, "test") == 2
    fencing.install(fencing.Fence(root, 2))
    assert iceberg.mark(root, 2, [SHAPE], fencing.EPOCH_APP) == 1
    assert iceberg.mark(root, 2, [SHAPE], fencing.EPOCH_APP) == 0  # (marked once)
    fencing.install(epoch_one)
    snapshots_before = len(iceberg.changelog(root, SHAPE).refresh().snapshots())
    # then the old leader's commit, built on the snapshot before the mark (the swap
    # fails, the table is read again and its mark refuses it), is refused
    with pytest.raises(fencing.Deposed, match="newer leader"):
        table.commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
    assert deposed and "epoch 2" in deposed[0]
    # and a handle that skipped the epoch file (its pause came between the check and
    # the commit) is refused by the table's mark alone
    (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')
    fencing.install(fencing.Fence(root, 1))
    with pytest.raises(fencing.Deposed, match="marked by a newer leader"):
        iceberg.changelog(root, SHAPE).commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
    fresh = iceberg.changelog(root, SHAPE)
    assert len(fresh.refresh().snapshots()) == snapshots_before
    assert fresh.committed_lsn() == BATCH
    assert sorted(r["_lsn"] for r in rows_of(fresh)) == list(range(1, BATCH + 1))


def test_a_new_leaders_mark_is_not_lost_to_a_commit_racing_it(
    tmp_path: Path, iceberg: IcebergFormat, epoch_one: fencing.Fence
) -> None:
    """A commit of the old leader that lands first: the mark goes on top of it, and the
    old leader's next commit is refused."""
    root = str(tmp_path)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    stale = iceberg.changelog(root, SHAPE).refresh()  # the new leader's read
    table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)  # lands first
    from tidemark.sink.iceberg.format import _mark

    loads = iter([stale])

    def load() -> object:  # the stale snapshot first, then the table as it is
        return next(loads, None) or iceberg.changelog(root, SHAPE).refresh()

    assert _mark(load, 2, fencing.EPOCH_APP)
    after = iceberg.changelog(root, SHAPE)
    summary = after.refresh().current_snapshot().summary  # type: ignore[union-attr]
    assert summary.additional_properties[fencing.EPOCH_APP] == "2"
    assert summary.additional_properties["tidemark.operation"] == "epoch"
    assert after.committed_lsn() == BATCH  # (carried forward by the mark)
    with pytest.raises(fencing.Deposed):
        table.commit(_batch_files(table, BATCH + 1, 2 * BATCH), 2 * BATCH, first_lsn=BATCH + 1)


def made_in_the_driver(root: str, spark: Any, *, max_snapshots: int) -> tuple[IcebergFormat, Any]:
    """The format with its stream commits in Spark's driver, and the shape's changelog
    created there, keeping at most ``max_snapshots``."""
    tables = IcebergFormat()
    tables.use_engine(spark)
    table = tables.changelog(root, SHAPE)
    table.max_snapshots = max_snapshots
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    return tables, table


def test_stream_commits_in_sparks_driver_are_pyicebergs_commits(
    tmp_path: Path, spark: Any, epoch_one: fencing.Fence
) -> None:
    """The Java committer makes the stream commits (its snapshots name Iceberg's Java
    library) with the same summary pyiceberg's make: the carried state, the batch's range
    and offset, the leader's mark; a commit through pyiceberg in between (added columns)
    is built on; a table keeps at most ``max_snapshots``; replays are skipped and an
    overlap refused."""
    root = str(tmp_path)
    tables, table = made_in_the_driver(root, spark, max_snapshots=4)
    for k in range(3):
        first, end = k * BATCH + 1, (k + 1) * BATCH
        assert table.commit(_batch_files(table, first, end), end, first_lsn=first)
    summary = snapshots.summary(table.refresh())
    assert summary["iceberg-version"].startswith("Apache Iceberg")  # (made by the JVM)
    assert summary["tidemark.operation"] == "stream"
    assert summary["tidemark.firstLsn"] == str(2 * BATCH + 1)
    assert summary["tidemark.endLsn"] == str(3 * BATCH)
    assert summary[snapshots.OFFSET + table.app_id] == str(3 * BATCH)
    assert summary[snapshots.GENERATION] == "0"  # (carried from the table's birth)
    assert summary[fencing.EPOCH_APP] == "1" and summary["tidemark.epoch"] == "1"
    # pyiceberg commits in between: the next Java commit is built on it
    wider = table_schema([*COLUMNS, ColumnSpec("note", 25)])
    assert table.ensure_columns(wider) == ["note"]
    assert table.commit(
        _batch_files(table, 3 * BATCH + 1, 4 * BATCH), 4 * BATCH, first_lsn=3 * BATCH + 1
    )
    again = tables.changelog(root, SHAPE)
    assert len(again.refresh().snapshots()) <= 4
    assert "note" in again.arrow_schema().names
    assert again.committed_lsn() == 4 * BATCH
    assert sorted(r["_lsn"] for r in rows_of(again)) == list(range(1, 4 * BATCH + 1))
    # a replay is skipped, a batch overlapping the offset refused
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is None
    with pytest.raises(WriterFenced):
        table.commit(_batch_files(table, 4 * BATCH, 5 * BATCH), 5 * BATCH, first_lsn=4 * BATCH)
    assert tables.changelog(root, SHAPE).committed_lsn() == 4 * BATCH
    forget_catalogs()


def test_the_manifests_a_commit_hands_on_are_those_its_list_file_has(
    tmp_path: Path, spark: Any, epoch_one: fencing.Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast append's snapshot is given its manifest list as the list file has it (so
    the next commit reads nothing back): field by field the same as the file read anew,
    over commits that fill it, merge appends (``commit.manifest.min-count-to-merge``) and
    expired snapshots; the rows are every batch's."""
    monkeypatch.setattr(
        snapshots,
        "TABLE_PROPERTIES",
        snapshots.TABLE_PROPERTIES | {"commit.manifest.min-count-to-merge": "4"},
    )
    root = str(tmp_path)
    tables, table = made_in_the_driver(root, spark, max_snapshots=3)
    assert table.java is not None
    java = table.java()
    assert java is not None
    name = ".".join(table.ident)
    born = str(java._java.listedManifests(name))
    assert born == "filled\n--\n", born  # (a new table's snapshot lists none)
    seen = []
    for k in range(11):
        first, end = k * BATCH + 1, (k + 1) * BATCH
        assert table.commit(_batch_files(table, first, end), end, first_lsn=first)
        held, listed = str(java._java.listedManifests(name)).split("\n", 1)
        as_held, as_read = listed.split("--\n")
        assert as_held == as_read, f"commit {k}: the list held differs from its file"
        seen.append((held, len(as_read.splitlines())))
    # fast appends grow the list and hand it on; at four the merge append merges it (and
    # reads its new snapshot's list back, as Iceberg's merge append does)
    assert seen == [
        ("filled", 1), ("filled", 2), ("filled", 3), ("read", 1),
        ("filled", 2), ("filled", 3), ("read", 1),
        ("filled", 2), ("filled", 3), ("read", 1), ("filled", 2),
    ]  # fmt: skip
    again = tables.changelog(root, SHAPE)
    assert len(again.refresh().snapshots()) <= 3
    assert again.committed_lsn() == 11 * BATCH
    assert sorted(r["_lsn"] for r in rows_of(again)) == list(range(1, 11 * BATCH + 1))
    forget_catalogs()


def test_the_avro_files_a_driver_commit_writes_are_read_by_avros_own_reader(
    tmp_path: Path, spark: Any, epoch_one: fencing.Fence
) -> None:
    """The manifests and manifest lists of the driver's commits (``MetadataAvro.java``:
    Avro's container format written by tidemark, the records by Iceberg's writers) are
    read by Avro's own Java reader: the header Iceberg's writer gives (its keys, both
    schemas, the deflate codec), every record pyiceberg reads, a manifest of more than
    one block (a commit of 600 files) too."""
    root = str(tmp_path)
    tables, table = made_in_the_driver(root, spark, max_snapshots=10)
    for k in range(2):
        first, end = k * BATCH + 1, (k + 1) * BATCH
        assert table.commit(_batch_files(table, first, end), end, first_lsn=first)
    rel, folder = table.new_batch_dir()
    folder.mkdir(parents=True)
    for n in range(600):  # (one row each, as _batch_files writes them)
        lsn = 2 * BATCH + 1 + n
        row = [[lsn], [lsn], [0], ["insert"], [None], [None], [None]]
        pq.write_table(
            pa.Table.from_arrays(
                [pa.array(v, t) for v, t in zip(row, table_schema(COLUMNS).types, strict=True)],
                schema=table_schema(COLUMNS),
            ),
            folder / f"part-{n:04d}.parquet",
        )
    end = 2 * BATCH + 600
    assert table.commit(table.files_in(rel), end, first_lsn=2 * BATCH + 1)
    snapshot = tables.changelog(root, SHAPE).refresh().current_snapshot()
    io = table.refresh().io
    jvm = spark._jvm

    def read(path: str) -> tuple[dict[str, str], int, int]:
        """The file's header and its records and blocks, as Avro's DataFileReader reads."""
        reader = jvm.org.apache.avro.file.DataFileReader(
            jvm.java.io.File(path.removeprefix("file://")),
            jvm.org.apache.avro.generic.GenericDatumReader(),
        )
        try:
            meta = {str(k): str(reader.getMetaString(k)) for k in reader.getMetaKeys()}
            records = blocks = 0
            while reader.hasNext():
                reader.nextBlock()
                records += reader.getBlockCount()
                blocks += 1
            return meta, records, blocks
        finally:
            reader.close()

    meta, records, _ = read(snapshot.manifest_list)
    manifests = snapshot.manifests(io)
    assert records == len(manifests) == 3
    assert set(meta) == {
        "snapshot-id", "parent-snapshot-id", "sequence-number", "format-version",
        "iceberg.schema", "avro.schema", "avro.codec",
    }  # fmt: skip
    assert meta["avro.codec"] == "deflate"
    assert meta["snapshot-id"] == str(snapshot.snapshot_id)
    assert json.loads(meta["avro.schema"])["name"] == "manifest_file"
    assert json.loads(meta["iceberg.schema"])["type"] == "struct"
    sizes = []
    for manifest in manifests:
        meta, records, blocks = read(manifest.manifest_path)
        assert set(meta) == {
            "schema", "partition-spec", "partition-spec-id", "format-version", "content",
            "iceberg.schema", "avro.schema", "avro.codec",
        }  # fmt: skip
        assert json.loads(meta["avro.schema"])["name"] == "manifest_entry"
        assert records == len(manifest.fetch_manifest_entry(io)) == manifest.added_files_count
        local = Path(manifest.manifest_path.removeprefix("file:"))
        assert manifest.manifest_length == local.stat().st_size, manifest.manifest_path
        sizes.append((records, blocks))
    sizes.sort()
    assert sizes[:2] == [(1, 1), (1, 1)] and sizes[2][0] == 600 and sizes[2][1] >= 2, sizes
    assert sorted(r["_lsn"] for r in rows_of(tables.changelog(root, SHAPE))) == list(
        range(1, end + 1)
    )
    forget_catalogs()


def test_tables_made_and_backfilled_in_sparks_driver_are_pyicebergs(
    tmp_path: Path, spark: Any, epoch_one: fencing.Fence
) -> None:
    """A new table and a backfill that removes no file (most of a start with many
    shapes) made by Iceberg's Java library are what pyiceberg makes: the same schema
    (field ids, a list's element too), properties, name mapping and born-marked first
    snapshot; the backfill's snapshot the next generation, the stream's offset carried,
    the retained mark of the generation before dropped. A deposed leader's backfill is
    refused, and a table name taken meanwhile is not taken over."""
    root = str(tmp_path)
    made: dict[str, Any] = {}
    for engine in ("pyiceberg", "java"):
        tables = IcebergFormat()
        if engine == "java":
            tables.use_engine(spark)
        table = tables.changelog(root, f"{SHAPE}_{engine}")
        assert table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        born = table.refresh()
        assert born.current_snapshot() is not None
        first = born.current_snapshot().summary.additional_properties  # type: ignore[union-attr]
        table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
        active = table.active_files_with_sizes()
        table.retention_commit(active, _batch_files(table, 1, BATCH), 5)
        assert table.retained_lsn(0) == 5
        assert (
            table.backfill_commit([], _batch_files(table, 1, BATCH), {"tidemark.rowsTotal": 9}) > 0
        )
        after = table.refresh()
        made[engine] = (table, born, first, snapshots.summary(after), after)
    (py, py_born, py_first, py_summary, _), (jv, jv_born, jv_first, jv_summary, jv_after) = (
        made["pyiceberg"],
        made["java"],
    )
    assert jv_born.schema() == py_born.schema()
    assert jv_born.schema().name_mapping == py_born.schema().name_mapping
    assert json.loads(jv_born.properties["schema.name-mapping.default"]) == json.loads(
        py_born.properties["schema.name-mapping.default"]
    )
    # (each names its own shape; the mapping is the same JSON, laid out by each library)
    differ = {"tidemark.shape", "schema.name-mapping.default"}
    own = {k: v for k, v in py_born.properties.items() if k not in differ}
    assert {k: jv_born.properties.get(k) for k in own} == own
    assert jv_born.metadata.format_version == py_born.metadata.format_version == 2
    assert jv_born.spec().is_unpartitioned()
    assert jv_born.location().startswith("file:") and jv_born.location().endswith(
        f"/tables/{SHAPE}_java"
    )
    assert {k: v for k, v in jv_first.items() if k.startswith("tidemark")} == {
        k: v for k, v in py_first.items() if k.startswith("tidemark")
    }
    assert jv_first[snapshots.GENERATION] == "0" and jv_first[fencing.EPOCH_APP] == "1"
    assert jv_summary["iceberg-version"].startswith("Apache Iceberg")  # (made by the JVM)

    def state(summary: dict[str, str], table: Any) -> dict[str, str]:
        return {
            k.replace(table.app_id, "<app>"): v
            for k, v in summary.items()
            if k.startswith("tidemark")
        }

    assert state(jv_summary, jv) == state(py_summary, py)
    assert jv_summary[snapshots.GENERATION] == "1"
    assert jv_summary["tidemark.operation"] == "backfill"
    assert jv_summary["tidemark.rowsTotal"] == "9"
    assert jv_summary[snapshots.OFFSET + jv.app_id] == str(BATCH)
    assert not any(k.startswith(snapshots.RETAINED) for k in jv_summary)
    assert jv.generation() == 1 and jv.committed_lsn() == BATCH
    assert sorted(r["_lsn"] for r in rows_of(jv)) == sorted([*range(1, BATCH + 1)] * 2)
    # a newer leader marks the table: the old leader's backfill is refused
    assert fencing.advance(root, "test") == 2
    fencing.install(fencing.Fence(root, 2))
    tables = IcebergFormat()
    tables.use_engine(spark)
    assert tables.mark(root, 2, [f"{SHAPE}_java"], fencing.EPOCH_APP) == 1
    (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 1}')  # (a paused check)
    fencing.install(fencing.Fence(root, 1))
    with pytest.raises(fencing.Deposed, match="marked by a newer leader"):
        jv.backfill_commit([], _batch_files(jv, 1, BATCH))
    assert len(jv.refresh().snapshots()) == len(jv_after.snapshots()) + 1  # (the mark)
    # a name another creator took between the check and the insert: not taken over
    (tmp_path / "_tidemark" / "leader.json").write_text('{"epoch": 2}')
    fencing.install(fencing.Fence(root, 2))
    java = jv.java() if jv.java is not None else None
    assert java is not None
    metadata = tmp_path / "tables" / f"{SHAPE}_java" / "metadata"
    files = set(metadata.iterdir())
    assert (
        java.create(
            jv.ident,
            jv_born.location(),
            jv_born.schema().model_dump_json(),
            {"format-version": "2"},
            {"tidemark.generation": "0"},
        )
        is None
    )
    assert set(metadata.iterdir()) == files  # (its metadata file removed)
    assert tables.changelog(root, f"{SHAPE}_java").committed_lsn() == BATCH
    forget_catalogs()


def test_a_table_just_made_in_sparks_driver_answers_as_its_metadata_read_back(
    tmp_path: Path, spark: Any, epoch_one: fencing.Fence
) -> None:
    """A table the JVM just made answers its first backfill's questions (its schema, its
    key, whether it needs replacing, its files) without pyiceberg reading it: each answer
    is what reading its metadata gives, for columns of many types (an int2 Iceberg gives
    back as int4, a numeric's scale, an array among them); and once another writer moved
    the table, it is read again."""
    columns = [
        ColumnSpec("id", 20),
        ColumnSpec("small", 21),
        ColumnSpec("name", 25),
        ColumnSpec("price", 1700, (12 << 16 | 3) + 4),
        ColumnSpec("at", 1184),
        ColumnSpec("flag", 16),
        ColumnSpec("blob", 17),
        ColumnSpec("doc", 3802),
        ColumnSpec("tags", 1007),
        ColumnSpec("day", 1082),
        ColumnSpec("ref", 2950),
        ColumnSpec("ratio", 700),
    ]
    schema = table_schema(columns)
    tables = IcebergFormat()
    tables.use_engine(spark)
    table = tables.changelog(str(tmp_path), f"{SHAPE}_born")
    assert table.create(schema, ["id", "name"], {"name": SHAPE})
    made = (
        table.arrow_schema(),
        table.primary_key(),
        table.needs_replacement(schema, ["id", "name"]),
        table.needs_replacement(schema, ["id"]),
        table.active_files_with_sizes(),
    )
    assert table._table is None  # (not read: answered from what the JVM made)
    read = tables.changelog(str(tmp_path), f"{SHAPE}_born")
    assert read.arrow_schema().equals(made[0], check_metadata=True)
    assert made[1:] == (read.primary_key(), False, True, read.active_files_with_sizes())
    assert made[1] == ["id", "name"] and made[4] == []
    # another writer moved the pointer: the table is read again
    tx = read.refresh().transaction()
    tx.set_properties({"owner": "someone else"})
    tx.commit_transaction()
    assert table.active_files_with_sizes() == []
    assert table._table is not None
    assert table._table.properties["owner"] == "someone else"
    forget_catalogs()


def test_two_handles_racing_one_batch_in_the_driver_commit_it_once(
    tmp_path: Path, spark: Any
) -> None:
    """Two handles of one table commit the same batch at the same moment, each many
    times: the catalog's swap lets one of each pair through, the other reads the table
    again and skips it as a replay; every metadata file a pointer names is there."""
    root = str(tmp_path)
    tables = IcebergFormat()
    tables.use_engine(spark)
    one, two = tables.changelog(root, SHAPE), tables.changelog(root, SHAPE)
    one.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    start = threading.Barrier(2)
    landed: list[int | None] = []

    def commit(table: Any, files: list[Any], first: int, end: int) -> None:
        start.wait()
        landed.append(table.commit(files, end, first_lsn=first))

    for k in range(6):
        first, end = k * BATCH + 1, (k + 1) * BATCH
        files = [_batch_files(t, first, end) for t in (one, two)]
        racers = [
            threading.Thread(target=commit, args=(t, f, first, end))
            for t, f in zip((one, two), files, strict=True)
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
    assert sum(1 for v in landed if v is not None) == 6  # one of each pair
    forget_catalogs()
    again = IcebergFormat().changelog(root, SHAPE)
    assert again.committed_lsn() == 6 * BATCH
    assert sorted(r["_lsn"] for r in rows_of(again)) == list(range(1, 6 * BATCH + 1))
    forget_catalogs()


def test_others_appends_are_built_on_and_anything_else_refused_until_a_resync(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    """Another writer's append between two commits: the next commit (built on the table
    as it was) loses the race, reads the table again and lands on top of it; the
    table's state (the offset a replay is checked against) is read past others'
    snapshots. Another writer's delete: the shape's commits are refused, naming the
    shape and what to do, until a resync's backfill replaces the rows."""
    from pyiceberg.expressions import EqualTo

    root = str(tmp_path)
    table = iceberg.changelog(root, SHAPE)
    table.max_snapshots = 5  # (others' appends do not push tidemark's state out)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)

    def others() -> Any:  # another writer: its own read of the table
        return table.catalog.load_table(table.ident)

    def one_row() -> Any:
        return others().scan(row_filter=EqualTo("_lsn", 1)).to_arrow().slice(0, 1)

    others().append(one_row())  # (row 1 once more: another writer's append)
    assert table.commit(
        _batch_files(table, BATCH + 1, 2 * BATCH), 2 * BATCH, first_lsn=BATCH + 1
    ), "a commit racing another writer's append lands on top of it"
    for _ in range(6):  # others' appends at the head of the history
        others().append(one_row())
    # upkeep's expiry keeps the way back to tidemark's newest snapshot
    iceberg.changelog(root, SHAPE).vacuum(retention_hours=0)
    again = iceberg.changelog(root, SHAPE)
    assert again.committed_lsn() == 2 * BATCH and again.generation() == 0
    assert (
        again.commit(_batch_files(again, BATCH + 1, 2 * BATCH), 2 * BATCH, first_lsn=BATCH + 1)
        is None
    )
    lsns = sorted(r["_lsn"] for r in rows_of(again))
    assert lsns == [1] * 8 + list(range(2, 2 * BATCH + 1))
    assert again.commit(
        _batch_files(again, 2 * BATCH + 1, 3 * BATCH), 3 * BATCH, first_lsn=2 * BATCH + 1
    )
    assert snapshots.summary(again.refresh())[snapshots.GENERATION] == "0"

    others().delete(EqualTo("_lsn", 1))  # another writer's delete
    batch = _batch_files(again, 3 * BATCH + 1, 4 * BATCH)
    for handle in (again, iceberg.changelog(root, SHAPE)):  # (raced, and read fresh)
        with pytest.raises(SinkError, match=f"shape '{SHAPE}': another writer changed") as err:
            handle.commit(batch, 4 * BATCH, first_lsn=3 * BATCH + 1)
        assert f"tidemark shapes resync {SHAPE}" in str(err.value)
        assert "rollback_to_snapshot" in str(err.value)
    with pytest.raises(SinkError, match="another writer changed"):
        again.compact(target_size=1 << 30)
    assert iceberg.changelog(root, SHAPE).committed_lsn() == 3 * BATCH
    # a resync: its backfill replaces the rows, and the stream goes on
    rebuilt = _batch_files(again, 1, 3 * BATCH)
    active = again.active_files_with_sizes()
    assert again.backfill_commit(active, rebuilt) > 0
    assert again.commit(batch, 4 * BATCH, first_lsn=3 * BATCH + 1)
    fresh = iceberg.changelog(root, SHAPE)
    assert fresh.committed_lsn() == 4 * BATCH and fresh.generation() == 1
    assert sorted(r["_lsn"] for r in rows_of(fresh)) == list(range(1, 4 * BATCH + 1))


def test_a_schema_changed_by_another_writer_is_refused(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    """A schema change makes no snapshot: the table's schema against the one tidemark's
    newest snapshot was written with."""
    import pyarrow as pa

    root = str(tmp_path)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
    with table.catalog.load_table(table.ident).update_schema() as update:
        update.union_by_name(pa.schema([pa.field("extra", pa.int64())]))
    for handle in (table, iceberg.changelog(root, SHAPE)):
        with pytest.raises(SinkError, match="its schema was changed"):
            handle.commit(
                _batch_files(handle, BATCH + 1, 2 * BATCH), 2 * BATCH, first_lsn=BATCH + 1
            )
    assert iceberg.changelog(root, SHAPE).committed_lsn() == BATCH


def test_expired_snapshots_lose_nothing_a_restart_needs(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    root = str(tmp_path)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    for i in range(5):
        first = i * BATCH + 1
        table.commit(
            _batch_files(table, first, first + BATCH - 1), first + BATCH - 1, first_lsn=first
        )
    table.compact(target_size=1 << 30)  # (a compaction's snapshot, then)
    # when upkeep expires every snapshot but the newest and removes what none names
    removed = table.vacuum(retention_hours=0)
    restarted = iceberg.changelog(root, SHAPE)
    assert len(restarted.refresh().snapshots()) == 1
    assert removed  # the compacted batches' files are gone
    # then a restart still reads the committed offset, and a replay is skipped
    assert restarted.committed_lsn() == 5 * BATCH
    replay = _batch_files(restarted, 4 * BATCH + 1, 5 * BATCH)
    assert restarted.commit(replay, 5 * BATCH, first_lsn=4 * BATCH + 1) is None
    lsns = sorted(r["_lsn"] for r in rows_of(restarted))
    assert lsns == list(range(1, 5 * BATCH + 1))


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
@pytest.mark.parametrize("engine", ["pyiceberg", "java"])
def test_a_postgresql_database_is_the_catalog(
    tmp_path: Path, pg_server: PgServer, engine: str, request: pytest.FixtureRequest
) -> None:
    name = "t_iceberg_catalog"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name}")
        conn.execute(f"create database {name}")
    try:
        settings = IcebergSettings(catalog_uri=pg_server.dsn_for(name), namespace="lake")
        tables = claim_root(tmp_path, "iceberg", settings)
        if engine == "java":
            tables.use_engine(request.getfixturevalue("spark"))
        table = tables.changelog(tmp_path, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
        assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is None
        table.commit(_batch_files(table, BATCH + 1, 2 * BATCH), 2 * BATCH, first_lsn=BATCH + 1)
        with psycopg.connect(pg_server.dsn_for(name)) as conn:
            found = conn.execute(
                "select table_namespace, table_name from iceberg_tables order by 1, 2"
            ).fetchall()
        assert found == [("lake", SHAPE)]
        # a reader finds the catalog from the root's record, the password given apart
        recorded = json.loads((tmp_path / "_tidemark" / "format.json").read_text())
        assert recorded["format"] == "iceberg" and recorded["namespace"] == "lake"
        forget_catalogs()
        reader = root_format(tmp_path, pg_server.dsn_for(name))
        again = reader.changelog(tmp_path, SHAPE)
        assert again.committed_lsn() == 2 * BATCH
        assert sorted(r["_lsn"] for r in rows_of(again)) == list(range(1, 2 * BATCH + 1))
    finally:
        forget_catalogs()
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"drop database if exists {name} with (force)")


def test_a_catalog_that_cannot_be_reached_is_a_clear_error(tmp_path: Path) -> None:
    settings = IcebergSettings(catalog_uri="postgresql://tm:secret@127.0.0.1:1/nowhere")
    with pytest.raises(SinkError) as caught:
        claim_root(tmp_path, "iceberg", settings)
    message = str(caught.value)
    assert "cannot use the Iceberg catalog at postgresql://tm:***@127.0.0.1:1/nowhere" in message
    assert "secret" not in message and "[iceberg] catalog_uri" in message
    assert not (tmp_path / "_tidemark" / "format.json").exists()


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
def test_a_namespace_the_catalog_cannot_create_is_a_clear_error(
    tmp_path: Path, pg_server: PgServer
) -> None:
    """A role that may not create the catalog's tables in its database."""
    name, role = "t_iceberg_ro", "t_iceberg_ro"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name}")
        conn.execute(f"drop role if exists {role}")
        conn.execute(f"create role {role} login password 'ro'")
        conn.execute(f"create database {name}")
    try:
        with psycopg.connect(pg_server.dsn_for(name), autocommit=True) as conn:
            conn.execute(f"revoke create on schema public from public, {role}")
        settings = IcebergSettings(catalog_uri=pg_server.dsn_for(name, role, "ro"))
        with pytest.raises(SinkError, match="cannot use the Iceberg catalog") as caught:
            claim_root(tmp_path, "iceberg", settings)
        assert "permission denied" in str(caught.value)
    finally:
        forget_catalogs()
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"drop database if exists {name} with (force)")
            conn.execute(f"drop role if exists {role}")


def test_a_root_keeps_its_format(tmp_path: Path) -> None:
    delta = table_format("delta")
    claim_root(tmp_path, "delta", None)
    delta.changelog(tmp_path, SHAPE).create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    with pytest.raises(ConfigError, match=r'holds delta tables.*format = "iceberg"'):
        claim_root(tmp_path, "iceberg", IcebergSettings())
    # a Delta root made before roots recorded their format is recognised too
    (tmp_path / "_tidemark" / "format.json").unlink()
    with pytest.raises(ConfigError, match="holds delta tables"):
        claim_root(tmp_path, "iceberg", IcebergSettings())


def test_a_leader_marks_what_exists_and_nothing_when_it_has_no_shapes(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    assert iceberg.mark(tmp_path, 2, [], "tidemark-epoch") == 0  # (no shapes yet)
    assert iceberg.mark(tmp_path, 2, [SHAPE], "tidemark-epoch") == 0  # (no tables yet)
    iceberg.changelog(tmp_path, SHAPE).create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    assert iceberg.mark(tmp_path, 2, [SHAPE], "tidemark-epoch") == 1
    assert iceberg.mark(tmp_path, 2, [SHAPE], "tidemark-epoch") == 0  # (marked that far)


def test_a_catalog_locked_by_another_process_commit_is_waited_for(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    """Another process's catalog commit (an instance sharing the root) holds SQLite's
    file lock: a read waits for it rather than failing after sqlite3's 5 s default."""
    import sqlite3
    import threading
    import time

    table = iceberg.changelog(tmp_path, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
    # given another connection holding the catalog's exclusive lock for 7 s
    holder = sqlite3.connect(
        tmp_path / "_tidemark" / "iceberg.db", isolation_level=None, check_same_thread=False
    )
    holder.execute("begin exclusive")
    release = threading.Timer(7.0, holder.execute, ("rollback",))
    release.start()
    try:
        started = time.monotonic()
        # when the table is read from the catalog, it waits, then reads
        assert iceberg.changelog(tmp_path, SHAPE).committed_lsn() == BATCH
        assert time.monotonic() - started >= 6.5
    finally:
        release.join()
        holder.close()


def test_a_table_in_the_catalog_not_made_by_tidemark_is_refused(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    import pyarrow as pa

    catalog = iceberg.catalog(tmp_path)
    catalog.create_table(("tidemark", SHAPE), schema=pa.schema([pa.field("x", pa.string())]))
    with pytest.raises(SinkError, match="was not created by tidemark"):
        iceberg.changelog(tmp_path, SHAPE).create(table_schema(COLUMNS), ["id"], {"name": SHAPE})


@pytest.mark.parametrize("engine", ["pyiceberg", "java"])
def test_a_commit_is_on_disk_when_it_returns(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    """On a filesystem that forgets what was not synced (``tests/crashfs``): the power
    cut right after each commit returns, the table opens with that commit. (The data
    files are synced before the commit, the metadata files by tidemark's file IO
    (pyiceberg's, or the Java one) before the catalog's pointer moves, the pointer by
    SQLite.)"""
    require_crashfs()
    spark = request.getfixturevalue("spark") if engine == "java" else None

    def made() -> IcebergFormat:
        tables = IcebergFormat()
        tables.use_engine(spark)
        return tables

    with CrashFS.mounted(tmp_path) as fs:
        root = Path(fs.root) / "lake"
        table = made().changelog(root, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        for k in range(3):
            first, end = k * BATCH + 1, (k + 1) * BATCH
            table.commit(_batch_files(table, first, end), end, first_lsn=first)
            forget_catalogs()  # (its SQLite connections: the mount goes away)
            fs.power_loss()
            table = made().changelog(root, SHAPE)
            assert table.recover(), f"the table is gone after commit {k}"
            assert table.committed_lsn() == end
            assert sorted(r["_lsn"] for r in rows_of(table)) == list(range(1, end + 1))
        forget_catalogs()


@pytest.mark.parametrize("pg_server", ["wheel"], indirect=True)
async def test_a_service_started_again_in_the_same_process_marks_its_tables(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """A second service in one process (a test, a bench, an embedding application):
    its epoch's fence is in force before it marks the tables, so the marks (written
    through the fenced file IO) are not refused by the first service's fence."""
    from .service_support import current_lsn, running_service, settings_for, wait_frontiers
    from .test_backfill import HIGH, HIGH_SHAPE, make_items
    from .test_continuity import assert_equal

    make_items(pg_db, 500)
    settings = settings_for(pg_db.dsn, str(tmp_path), [HIGH_SHAPE], sink={"format": "iceberg"})
    for round_ in range(2):
        async with running_service(settings, spark) as service:
            pg_db.execute(f"update items set score = score + 1 where id <= {100 * (round_ + 1)}")
            await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert fencing.read_epoch(tmp_path) == 2
    assert_equal(spark, tmp_path, "high", HIGH, pg_db.dsn)


async def test_a_shape_whose_table_another_writer_rewrote_waits_in_error_for_a_resync(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """The service (its stream commits in Spark's driver): another writer's delete in one
    shape's changelog puts that shape in error, naming it and what to do, while the
    other shape goes on; a resync brings it back, and both equal Postgres."""
    import asyncio

    from pyiceberg.expressions import EqualTo

    from .service_support import current_lsn, running_service, settings_for, wait_frontiers
    from .test_continuity import assert_equal

    pg_db.execute(
        "create table t (id int primary key, v int); create table u (id int primary key, v int);"
        "insert into t select g, g from generate_series(1, 50) g;"
        "insert into u select g, g from generate_series(1, 50) g"
    )
    shapes = [{"name": "t_all", "table": "t"}, {"name": "u_all", "table": "u"}]
    settings = settings_for(pg_db.dsn, str(tmp_path), shapes, sink={"format": "iceberg"})
    async with running_service(settings, spark) as service:
        pg_db.execute("update t set v = v + 1; update u set v = v + 1")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        others = IcebergFormat().changelog(str(tmp_path), "t_all")
        others.catalog.load_table(others.ident).delete(EqualTo("id", 1))
        pg_db.execute("update t set v = v + 1; update u set v = v + 1")
        target = current_lsn(pg_db.dsn)
        async with asyncio.timeout(60):
            while service.shape_state("t_all")[0] != "error":
                await asyncio.sleep(0.1)
            while service.progress().frontiers.get("u_all", -1) < target:
                await asyncio.sleep(0.1)
        error = str(service.shape_state("t_all")[1])
        assert "shape 't_all': another writer changed the Iceberg table" in error, error
        assert "tidemark shapes resync t_all" in error, error
        assert service.shape_state("u_all")[0] != "error"
        await service.resync_shape("t_all")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    assert_equal(spark, tmp_path, "t_all", "select id, v from t", pg_db.dsn)
    assert_equal(spark, tmp_path, "u_all", "select id, v from u", pg_db.dsn)


def test_a_backfill_that_replaces_the_schema_replaces_it_and_the_rows(
    tmp_path: Path, iceberg: IcebergFormat
) -> None:
    """A resync after a column's type changed: one commit replaces the rows, the
    schema (fresh field ids, a schema id of its own) and the key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.sink.schema import ColumnSpec

    root = str(tmp_path)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1)
    # the new layout: id becomes text, a column is added
    wider = table_schema([ColumnSpec("id", 25), ColumnSpec("note", 25)])
    rows = (
        pa.table(
            {
                "id": ["a", "b"],
                "note": ["x", None],
                "_lsn": pa.array([BATCH, BATCH], pa.int64()),
                "_op": pa.array([0, 1], pa.int64()),
                "_kind": ["snapshot", "snapshot"],
                "_xid": pa.nulls(2, pa.int64()),
                "_commit_ts": pa.nulls(2, pa.timestamp("us", tz="UTC")),
                "_unchanged": pa.nulls(2, pa.list_(pa.string())),
            }
        )
        .select(wider.names)
        .cast(pa.schema([f.remove_metadata() for f in wider]))
    )
    rel, folder = table.new_batch_dir()
    folder.mkdir(parents=True)
    pq.write_table(rows, folder / "part-0.parquet")
    assert table.needs_replacement(wider, ["id"])
    table.backfill_commit([], table.files_in(rel), replace=(wider, ["id"]))
    again = iceberg.changelog(root, SHAPE)
    assert again.arrow_schema().field("id").type == pa.string()
    assert "note" in again.arrow_schema().names and again.generation() == 1
    assert sorted((r["id"], r["note"]) for r in rows_of(again)) == [("a", "x"), ("b", None)]
    assert again.committed_lsn() == BATCH  # (the offset is the stream's, unchanged)
    assert not again.needs_replacement(wider, ["id"])
