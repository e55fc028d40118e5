"""The reference engines read what tidemark writes: Delta's own Spark reader (delta-spark)
and Iceberg's Spark runtime, in a Spark of their own (``reference_readers.py``, run in
``.venv-readers``), read every kind of table a running service leaves (changelog and
current tables after an added column, a truncate, a resync, compaction, vacuum and
retention, a shape on a partitioned table among them; time travel to a version and to
the versions of one LSN; a Delta log replayed from tidemark's checkpoint) and get what
``tidemark.read`` gets, which equals Postgres. (On S3: ``test_s3_root``.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from .conftest import PgDatabase
from .outside_readers import metadata_location
from .reference_support import equals_postgres, postgres_rows, reference_read, same_rows
from .service_support import current_lsn, running_service, settings_for, wait_frontiers
from .test_e2e import SCHEMA, SHAPES, TRUTH, arun, mixed_workload

# besides test_e2e's tables, a partitioned one (published via its root)
PARTITIONED = """
create table visits (id int not null, day date not null, region text, pages int,
                     primary key (id, day)) partition by range (day);
create table visits_jan partition of visits for values from ('2026-01-01') to ('2026-02-01');
create table visits_feb partition of visits for values from ('2026-02-01') to ('2026-03-01');
alter table visits replica identity full;
alter table visits_jan replica identity full;
alter table visits_feb replica identity full;
"""
VISITS = {"name": "visits_eu", "table": "public.visits", "where": "region = 'eu'"}
SHAPE_TRUTH = {**TRUTH, "visits_eu": "select * from visits where region = 'eu'"}


async def visits_workload(db: PgDatabase) -> None:
    await arun(
        db,
        "insert into visits select g, date '2026-01-01' + (g % 50),"
        " (array['eu','us'])[g % 2 + 1], g from generate_series(1, 400) g",
    )
    await arun(db, "update visits set day = day + 31 where id % 9 = 0 and day < '2026-01-20'")
    await arun(db, "update visits set region = 'eu' where id % 5 = 0")
    await arun(db, "delete from visits where id % 7 = 0")


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
async def test_the_reference_readers_read_every_table_as_tidemark_does_and_equal_postgres(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    table_format: str,
) -> None:
    from tidemark import read
    from tidemark.sink import table_format as format_named
    from tidemark.sink.fold_arrow import fold_arrow_onto

    tables = format_named(table_format)
    root = tmp_path / "lake"
    await arun(pg_db, SCHEMA + PARTITIONED)
    settings = settings_for(
        pg_db.dsn,
        str(root),
        [*SHAPES, VISITS],
        current={"refresh_s": 0.5, "buckets": 4},
        sink={"changelog_retention_hours": 0, "format": table_format},
    )
    async with running_service(settings, spark) as service:
        assert service.keeper is not None
        # given every kind of change (an added column and a truncate among them), a
        # resync, then compaction, vacuum and retention of what is folded
        await mixed_workload(pg_db)
        await visits_workload(pg_db)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.resync_shape("urgent")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.keeper.refresh(*SHAPE_TRUTH)
        await service._maintain()
        # and after them two changes, Postgres's state kept at the first
        await arun(pg_db, "update accounts set owner = 'first after' where id in (2, 3)")
        first = current_lsn(pg_db.dsn)
        truth_first = {s: postgres_rows(pg_db.dsn, q) for s, q in SHAPE_TRUTH.items()}
        await wait_frontiers(service, first)
        await service.keeper.refresh(*SHAPE_TRUTH)
        await arun(pg_db, "update accounts set owner = 'second after', balance = 7 where id = 2")
        await arun(pg_db, "delete from notes where id = 7")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        await service.keeper.refresh(*SHAPE_TRUTH)
    truth_now = {s: postgres_rows(pg_db.dsn, q) for s, q in SHAPE_TRUTH.items()}
    at_first = read.versions_at(root, list(SHAPE_TRUTH), first)

    # when the reference readers read each table now, and at the versions of ``first``
    def table_reads(kind: str, shape: str, version: int | None, tag: str) -> dict[str, Any]:
        if table_format == "delta":
            return {"id": tag, "delta": str(root / kind / shape), "version": version}
        namespace = "tidemark" if kind == "tables" else "tidemark_current"
        return {"id": tag, "iceberg": f"{namespace}.{shape}", "snapshot": version}

    reads: list[dict[str, Any]] = []
    for shape in SHAPE_TRUTH:
        for kind in ("tables", "current"):
            reads.append(table_reads(kind, shape, None, f"{kind}-{shape}"))
            if table_format == "delta":
                reads.append(
                    {"id": f"detail-{kind}-{shape}", "delta_detail": str(root / kind / shape)}
                )
            else:
                namespace = "tidemark" if kind == "tables" else "tidemark_current"
                reads.append(
                    {"id": f"snapshots-{kind}-{shape}", "iceberg_snapshots": f"{namespace}.{shape}"}
                )
                reads.append(
                    {
                        "id": f"path-{kind}-{shape}",
                        "iceberg_path": metadata_location(root, namespace, shape),
                    }
                )
        versions = at_first[shape]
        reads.append(
            table_reads("tables", shape, versions.changelog_version, f"first-tables-{shape}")
        )
        assert versions.current_version is not None, versions
        reads.append(
            table_reads("current", shape, versions.current_version, f"first-current-{shape}")
        )
    # (and, in the same reader's session, a Delta log with tidemark's checkpoint)
    checkpointed = None
    if table_format == "delta":
        checkpointed = checkpointed_table(tmp_path / "checkpointed")
        reads += checkpoint_reads(checkpointed)
    catalog = root / "_tidemark" / "iceberg.db" if table_format == "iceberg" else None
    answers = reference_read(tmp_path / "read", reads, catalog)
    if checkpointed is not None:
        check_checkpoint_reads(answers, tmp_path / "read", checkpointed)

    def got(tag: str) -> pa.Table:
        return pq.read_table(tmp_path / "read" / f"{tag}.parquet")

    # then each table is what tidemark's own reading of it gives, and folds to Postgres
    kinds: Counter[str] = Counter()
    for shape in SHAPE_TRUTH:
        changelog = tables.changelog(root, shape)
        key = changelog.primary_key()
        same_rows(got(f"tables-{shape}"), read.arrow_changelog(root, shape), f"changelog {shape}")
        current = got(f"current-{shape}")
        equals_postgres(current, truth_now[shape], f"current {shape} now")
        tail = got(f"tables-{shape}")
        point = tables.current(root, shape).points()[0]
        tail = tail.filter(pc.greater(tail["_lsn"], point.lsn))
        equals_postgres(
            fold_arrow_onto(current, tail, key), truth_now[shape], f"current+tail {shape}"
        )
        equals_postgres(read.arrow_current(root, shape), truth_now[shape], f"tidemark {shape}")
        # time travel: the current table at the refresh before ``first``, and the
        # changelog at the version holding ``first``, its rows in between folded on
        versions = at_first[shape]
        base, changes = got(f"first-current-{shape}"), got(f"first-tables-{shape}")
        lsn = changes["_lsn"]
        between = pc.and_(pc.greater(lsn, versions.current_lsn), pc.less_equal(lsn, first))
        folded = fold_arrow_onto(base, changes.filter(between), key)
        equals_postgres(folded, truth_first[shape], f"{shape} as of {first}")
        equals_postgres(read.arrow_current(root, shape, as_of=first), truth_first[shape], shape)
        if table_format == "delta":
            from deltalake import DeltaTable

            for kind in ("tables", "current"):
                detail = answers[f"detail-{kind}-{shape}"]
                table = DeltaTable(str(root / kind / shape))
                protocol = table.protocol()
                # the protocol delta-spark reads is the one tidemark declares
                assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2), detail
                assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
                assert detail["tableFeatures"] == ["appendOnly", "invariants"], detail
                assert detail["numFiles"] == len(table.file_uris()), detail
                assert detail["version"] == table.version() == detail["history"][-1], detail
                assert detail["partitionColumns"] == table.metadata().partition_columns
                if kind == "tables":
                    kinds.update(
                        f"{shape}:{h.get('tidemark.operation') or h['operation']}"
                        for h in table.history()
                    )
        else:
            from pyiceberg.table import StaticTable

            for kind, namespace in (("tables", "tidemark"), ("current", "tidemark_current")):
                static = StaticTable.from_metadata(metadata_location(root, namespace, shape))
                snapshots = answers[f"snapshots-{kind}-{shape}"]["snapshots"]
                assert sorted(s["id"] for s in snapshots) == sorted(
                    s.snapshot_id for s in static.metadata.snapshots
                )
                same_rows(got(f"path-{kind}-{shape}"), got(f"{kind}-{shape}"), f"{kind} by path")
                if kind == "tables":
                    kinds.update(
                        f"{shape}:{s['summary'].get('tidemark.operation', s['operation'])}"
                        for s in snapshots
                    )
    # and the tables were the kinds the test means: compacted, retained, resynced
    assert kinds["all_accounts:compaction"] >= 1 and kinds["rich:retention"] >= 1, kinds
    assert kinds["urgent:backfill"] == 2, kinds  # the backfill, and the resync's


def checkpointed_table(root: Path) -> str:
    """A Delta table of 105 versions committed by tidemark's own log writer, which
    writes a checkpoint at version 100; its path."""
    from tests.integration.test_sink_fencing import BATCH, COLUMNS, SHAPE, _batch_files
    from tidemark.sink.delta.table import ShapeTable
    from tidemark.sink.schema import table_schema

    table = ShapeTable(str(root), SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    for i in range(105):
        first = i * BATCH + 1
        table.commit(
            _batch_files(table, first, first + BATCH - 1),
            first + BATCH - 1,
            {"tidemark.transactions": BATCH},
            first_lsn=first,
        )
    return str(table.path)


def checkpoint_reads(path: str) -> list[dict[str, Any]]:
    return [
        {"id": "checkpoint-detail", "delta_detail": path},
        {"id": "checkpoint-newest", "delta": path, "version": None},
        {"id": "checkpoint-v50", "delta": path, "version": 50},
    ]


def check_checkpoint_reads(answers: dict[str, Any], work: Path, path: str) -> None:
    """delta-spark's replay of the checkpointed table started at tidemark's checkpoint
    (version 100, then 5 JSON entries), and it read the rows deltalake reads."""
    from deltalake import DeltaTable

    from tests.integration.test_sink_fencing import BATCH

    detail = answers["checkpoint-detail"]
    assert (detail["version"], detail["checkpoint"], detail["entries_replayed"]) == (105, 100, 5)
    for tag, version in (("checkpoint-newest", None), ("checkpoint-v50", 50)):
        expected = DeltaTable(path, version=version).to_pyarrow_table()
        same_rows(pq.read_table(work / f"{tag}.parquet"), expected, tag)
    assert answers["checkpoint-newest"]["rows"] == 105 * BATCH
