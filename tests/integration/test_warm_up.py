"""A fresh JVM's write path warmed at start (``[spark] warm_up``): ``tidemark run`` in a
process of its own (a JVM of its own, as after a crash or a deploy) writes made-up rounds
into a scratch folder under the temporary directory, never under the root, deletes it,
says so in its log, and streams as ever: the shape equals Postgres. In the suite's own
session ``warm_up`` runs once per JVM and stops between rounds when asked.

Before that, the JVM starts from the class-data archive ``make setup`` made
(``tidemark.jvm.archive``): the service's driver and the suite's own map it.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs

from tidemark import app
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn
from tidemark.spark import archive_for, jars_dir
from tidemark.writers import job

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import service_env, start_service, stop_service, wait_shapes, wait_streaming
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

SHAPES = [{"name": "warm_items", "table": "public.items", "where": "grp < 2"}]
TRUTH = "select * from items where grp < 2"


def mapped_archive(jvm_pid: int) -> Path:
    """The class-data archive the JVM was started with, checked to be mapped in its
    memory (a JVM that refused the archive, as one made for another class path, has
    dropped its mapping by the time it runs a job)."""
    command = Path(f"/proc/{jvm_pid}/cmdline").read_bytes().decode().split("\0")
    chosen = [m.group(1) for a in command if (m := re.fullmatch(r"-XX:SharedArchiveFile=(.+)", a))]
    assert chosen, (
        "the driver's JVM got no class-data archive: `make setup` makes it "
        f"(tidemark jvm-archive); its command: {command[:3]}"
    )
    maps = Path(f"/proc/{jvm_pid}/maps").read_text()
    assert chosen[-1] in maps, f"the JVM did not map {chosen[-1]}"
    return Path(chosen[-1])


def child_jvm(pid: int) -> int:
    found = subprocess.run(
        ["pgrep", "-P", str(pid), "java"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert len(found) == 1, f"no single JVM under {pid}: {found}"
    return int(found[0])


def test_the_suites_session_maps_the_class_data_archive(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark import SparkContext

    spark.range(3).count()
    gateway = SparkContext._gateway
    assert mapped_archive(gateway.proc.pid).is_file()  # type: ignore[union-attr]


def log_events(log: Path) -> list[dict[str, object]]:
    events = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


@ONE_SERVER
async def test_a_fresh_jvm_is_warmed_outside_the_root_and_the_stream_is_exact(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # given a table with rows, and a service in a process of its own
    pg_db.execute(
        "create table items (id bigint primary key, grp int not null, name text);"
        "alter table items replica identity full;"
        "insert into items select g, g % 3, 'before-' || g from generate_series(1, 300) g"
    )
    root, temp, log = tmp_path / "lake", tmp_path / "tmp", tmp_path / "tidemark.log"
    temp.mkdir()
    port = free_port()
    env = service_env(
        dsn=pg_db.dsn, root=root, port=port, name="tm_warm", shapes=SHAPES, warm_up="true"
    )
    env["TMPDIR"] = str(temp)
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc, log, timeout=240)
        # when rows stream in while (or after) it warms its JVM
        pg_db.execute(
            "insert into items select g, g % 3, 'after-' || g from generate_series(301, 900) g;"
            "update items set name = name || '!' where id % 7 = 0;"
            "delete from items where id % 11 = 0"
        )
        wait_shapes(port, format_lsn(current_lsn(pg_db.dsn)), ["warm_items"], timeout=180)
        # (its JVM started from the archive of a root on disk)
        assert mapped_archive(child_jvm(proc.pid)) == archive_for(jars_dir())
        deadline = time.monotonic() + 60
        while not any(e["event"] == "spark.warmed" for e in log_events(log)):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
    finally:
        stop_service(proc, log)
    # then it warmed once, in the temporary directory, and left nothing there
    (warmed,) = [e for e in log_events(log) if e["event"] == "spark.warmed"]
    assert warmed["rounds"] == job.WARM_ROUNDS
    assert not [e for e in log_events(log) if e["event"] == "spark.warm_up_failed"]
    assert list(temp.iterdir()) == []
    # and nothing of it under the root: only the shape's table and tidemark's own folders
    assert {p.name for p in root.iterdir()} == {"tables", "_tidemark"}
    assert [p.name for p in (root / "tables").iterdir()] == ["warm_items"]
    made_up = {c.name for c in job.WARM_COLUMNS} - {"id", "name"}  # (items has those)
    for data in (root / "tables" / "warm_items").rglob("*.parquet"):
        assert not made_up & set(pq.read_schema(data).names), data
    # and the shape equals Postgres
    result = compare_shape(spark, str(root), "warm_items", TRUTH, pg_db.dsn)
    assert result.equal, result.describe()


@ONE_SERVER
async def test_a_warm_up_that_fails_is_logged_and_the_stream_is_exact(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a JVM whose warm-up fails (the suite's own JVM, taken for a fresh one)
    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("made-up failure of the warm-up's write")

    monkeypatch.setattr(app, "needs_warm_up", lambda session, remote=False: True)
    monkeypatch.setattr(app, "warm_up", broken)
    pg_db.execute(
        "create table items (id bigint primary key, grp int not null, name text);"
        "alter table items replica identity full;"
        "insert into items select g, g % 3, 'before-' || g from generate_series(1, 200) g"
    )
    settings = settings_for(pg_db.dsn, str(tmp_path / "lake"), SHAPES)
    with capture_logs() as logs:
        async with running_service(settings, spark) as service:
            # when rows stream in after it
            pg_db.execute(
                "insert into items select g, g % 3, 'after-' || g from generate_series(201, 500) g;"
                "update items set name = name || '!' where id % 7 = 0;"
                "delete from items where id % 11 = 0"
            )
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            assert service.phase == "streaming"
    # then the failure is logged, as a warning, and nothing else changed
    (failed,) = [e for e in logs if e["event"] == "spark.warm_up_failed"]
    assert failed["log_level"] == "warning" and "made-up failure" in failed["error"]
    assert not [e for e in logs if e["event"] == "spark.warmed"]
    result = compare_shape(spark, str(tmp_path / "lake"), "warm_items", TRUTH, pg_db.dsn)
    assert result.equal, result.describe()


def test_warm_up_writes_only_its_scratch_folder_and_stops_when_asked(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # given a scratch folder
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    stop = threading.Event()
    # when it warms two rounds: they are written, and the folder is gone after
    assert job.warm_up(spark, scratch, stop, rounds=2, members=3, rows=5) == 2
    assert not scratch.exists()
    assert not job.needs_warm_up(spark)  # once per JVM
    # and asked to stop, it writes nothing
    scratch.mkdir()
    stop.set()
    assert job.warm_up(spark, scratch, stop, rounds=2, members=3, rows=5) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("count", [1, 7])
def test_the_made_up_rows_convert_to_the_tables_schema(count: int) -> None:
    from tidemark.sink.schema import table_schema
    from tidemark.writers.arrow_batch import build_table

    schema = table_schema(job.WARM_COLUMNS)
    table = build_table(schema, job.WARM_COLUMNS, job.warm_rows(count))
    assert table.num_rows == count and table.schema == schema
    assert table.column("name").to_pylist()[-1] == f"item-{count - 1}"
