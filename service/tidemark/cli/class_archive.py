"""``tidemark jvm-archive``: the training runs that make the Spark driver's class-data
archives (``tidemark.jvm.archive``): for a root on disk and, with S3A's jars there, for
an ``s3://`` root, each a session as ``tidemark.spark.build_session`` makes it, started
with ``-XX:ArchiveClassesAtExit`` in a child process, writing made-up flush rounds and
committing an Iceberg changelog; the JVM writes the archive as it exits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.errors import ConfigError, TidemarkError
from tidemark.jvm.archive import ARCHIVES
from tidemark.sink import table_format
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.spark import (
    JAVA_OPTIONS,
    archive_for,
    build_session,
    iceberg_jars,
    object_store_master,
    s3a_jars,
    with_s3a,
)
from tidemark.writers.job import warm_up


def create_all(folder: Path) -> list[Path]:
    """The archives of the sessions ``build_session`` makes here with its defaults: on
    disk, and with S3A's jars (an ``s3://`` root) when they are there; each made by a
    training run unless it is there already. Any other archive in the folder (of jars
    since changed) is deleted. Returns the archives' paths."""
    kinds = [False]
    try:
        s3a_jars(folder)
        kinds.append(True)
    except ConfigError:
        pass
    made = [_create(archive_for(folder, s3=s3), s3) for s3 in kinds]
    for old in (folder / ARCHIVES).glob("driver-*.jsa"):
        if old not in made:
            old.unlink()
    return made


def _create(target: Path, s3: bool) -> Path:
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    code = (
        "import sys; from pathlib import Path; from tidemark.cli.class_archive import training_run;"
        " training_run(Path(sys.argv[1]), sys.argv[2] == 's3')"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", code, str(partial), "s3" if s3 else "disk"],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0 or not partial.is_file():
            raise TidemarkError(
                f"the training run for {target.name} failed (exit {run.returncode});"
                f" its output ends:\n{(run.stdout + run.stderr)[-4000:]}"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)  # (a failed run's JVM writes one all the same)
    return target


def training_run(partial: Path, s3: bool) -> None:
    """In the child: the session with ``-XX:ArchiveClassesAtExit``, the training, and
    the JVM's exit awaited (it writes the archive as it exits)."""
    from pyspark import SparkContext

    conf = {JAVA_OPTIONS[0]: f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"}
    master = "local[2]"
    if s3:
        conf = with_s3a(conf, s3a_jars())
        master = object_store_master(master)
    spark = build_session(master, conf, app_name="tidemark-archive")
    scratch = Path(tempfile.mkdtemp(prefix="tidemark-archive-"))
    try:
        train(spark, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is not None:  # the driver exits once its stdin closes, writing the archive
        proc.stdin.close()
        proc.wait(timeout=300)


def train(spark: Any, scratch: Path) -> None:
    """Load what a service's start and first rounds load: flush rounds' writes (the
    service's own warm-up), a Parquet read and a fold's kind of query (a window per key,
    as current tables run), and, with Iceberg's jars there, an Iceberg changelog created
    and committed to in the JVM."""
    warm_up(spark, scratch / "warm", threading.Event(), rounds=2)
    folder = str(scratch / "read")
    spark.range(1000).selectExpr("id % 10 as k", "id as v").write.parquet(folder)
    spark.read.parquet(folder).createOrReplaceTempView("tm_train")
    spark.sql(
        "select k, v from (select *, row_number() over (partition by k order by v desc) r"
        " from tm_train) where r = 1"
    ).collect()
    if iceberg_jars():
        _train_iceberg(spark, scratch / "lake")


def _train_iceberg(spark: Any, root: Path) -> None:
    tables = table_format("iceberg")
    tables.use_engine(spark)
    schema = table_schema([ColumnSpec("id", 23), ColumnSpec("v", 25)])  # (int4, text)
    table = tables.changelog(root, "train")
    table.create(schema, ["id"], {"name": "train"})
    for lsn in (100, 200, 300):
        rel, path = table.new_batch_dir()
        Path(path).mkdir(parents=True)
        columns = {f.name: pa.array([_value(f.type, lsn)], f.type) for f in schema}
        pq.write_table(pa.table(columns, schema=schema), Path(path) / "part-0.parquet")
        batch = [table.file_at(f"{rel}/part-0.parquet")]
        table.files_sync(batch).sync()
        table.commit(batch, lsn, {"tidemark.rows": 1}, first_lsn=lsn)


def _value(kind: pa.DataType, lsn: int) -> object:
    if pa.types.is_integer(kind):
        return lsn
    return "u" if pa.types.is_string(kind) else None
