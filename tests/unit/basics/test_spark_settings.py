"""Choosing the Spark engine: ``[spark] master`` or ``[spark] remote``, checked at
load time with messages that say what to do; and how a batch is cut into Spark jobs
on each kind of session. No Spark is started."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pyarrow as pa
import pytest

from tidemark import jvm
from tidemark.demo.postgres import free_port
from tidemark.errors import ConfigError
from tidemark.settings.config import load_settings
from tidemark.spark import (
    CONNECT_CONF,
    CONNECT_JOB_BYTES,
    DEFAULT_CONF,
    DRIVER_LISTING_PATHS,
    JAVA_OPTIONS,
    LISTING_THRESHOLD,
    OPEN_COST,
    OPEN_COST_BYTES,
    arrow_parts,
    check_connect,
    connect_address,
    iceberg_jars,
    is_connect,
    jars_dir,
    java_options,
    local_mode_conf,
    readable_path,
)


@pytest.fixture(autouse=True)
def _no_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in [k for k in os.environ if k.startswith("TIDEMARK_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_a_remote_alone_makes_a_connect_client_and_master_keeps_its_default() -> None:
    settings = load_settings(require_dsn=False, spark={"remote": "sc://spark:15002"})
    assert settings.spark.remote == "sc://spark:15002"
    assert settings.spark.master == "local[2]"  # unused with a remote


def test_an_empty_master_beside_a_remote_is_unset_as_compose_passes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # compose always sets both variables; the one not chosen is empty
    monkeypatch.setenv("TIDEMARK_SPARK__MASTER", "")
    monkeypatch.setenv("TIDEMARK_SPARK__REMOTE", "sc://spark-connect:15002")
    settings = load_settings(require_dsn=False)
    assert (settings.spark.master, settings.spark.remote) == (
        "local[2]",
        "sc://spark-connect:15002",
    )


def test_master_and_remote_together_are_refused_with_both_named() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            require_dsn=False, spark={"master": "spark://m:7077", "remote": "sc://c:15002"}
        )
    message = str(caught.value)
    assert "spark://m:7077" in message and "sc://c:15002" in message
    assert "keep one of them" in message and "TIDEMARK_SPARK" in message


@pytest.mark.parametrize("remote", ["http://c:15002", "sc://", "c:15002", "sc://:15002"])
def test_a_remote_that_is_not_an_sc_url_is_refused(remote: str) -> None:
    with pytest.raises(ConfigError, match="is not a Spark Connect URL: write sc://host:port"):
        load_settings(require_dsn=False, spark={"remote": remote})


def test_a_connect_url_given_as_master_points_to_remote() -> None:
    with pytest.raises(ConfigError, match="set \\[spark\\] remote to it"):
        load_settings(require_dsn=False, spark={"master": "sc://c:15002"})


def test_connect_address_defaults_to_the_connect_port() -> None:
    assert connect_address("sc://spark") == ("spark", 15002)
    assert connect_address("sc://10.0.0.5:443/;use_ssl=true;token=x") == ("10.0.0.5", 443)


def test_an_unreachable_connect_server_is_a_config_error_naming_the_address() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ConfigError, match=f"no Spark Connect server answers at 127.0.0.1:{port}"):
        check_connect(f"sc://127.0.0.1:{port}", timeout_s=2)


class _ConnectSession:
    """Only the type's module matters to is_connect (pyspark's Connect session class
    lives in pyspark.sql.connect.session)."""


_ConnectSession.__module__ = "pyspark.sql.connect.session"


class _ClassicSession:
    pass


_ClassicSession.__module__ = "pyspark.sql.session"


def big_table(rows: int) -> pa.Table:
    return pa.table({"id": pa.array(range(rows), pa.int64()), "pad": pa.array(["x" * 56] * rows)})


def test_a_classic_session_writes_any_batch_as_one_job() -> None:
    table = big_table(400_000)
    assert table.nbytes > CONNECT_JOB_BYTES
    assert not is_connect(_ClassicSession())
    assert arrow_parts(_ClassicSession(), table) == [table]


def test_connect_cuts_a_big_batch_into_jobs_of_bounded_size_keeping_every_row() -> None:
    table = big_table(400_000)
    parts = arrow_parts(_ConnectSession(), table)
    assert is_connect(_ConnectSession())
    assert len(parts) == -(-table.nbytes // CONNECT_JOB_BYTES) > 1
    assert all(p.nbytes <= CONNECT_JOB_BYTES for p in parts)
    assert pa.concat_tables(parts).equals(table)
    small = big_table(1000)
    assert arrow_parts(_ConnectSession(), small) == [small]


def test_connect_keeps_each_job_inside_the_plan_below_grpcs_message_limit() -> None:
    # a job's rows travel inline (not as a session-cached artifact) and fit one message
    threshold = int(CONNECT_CONF["spark.sql.session.localRelationCacheThreshold"])
    assert CONNECT_JOB_BYTES < threshold < 128 * 1024 * 1024


def test_local_mode_uses_tidemarks_local_filesystem_and_keeps_a_class_path_of_its_own() -> None:
    conf = local_mode_conf("local[2]", {})
    assert conf["spark.hadoop.fs.file.impl"] == jvm.LOCAL_FS_CLASS
    assert conf["spark.sql.sources.commitProtocolClass"] == jvm.DIRECT_COMMIT_CLASS
    ours = [str(jvm.JAR), *([iceberg_jars()] if iceberg_jars() else [])]
    assert conf["spark.driver.extraClassPath"] == os.pathsep.join(ours)
    assert conf[LISTING_THRESHOLD] == str(DRIVER_LISTING_PATHS)  # files listed in the driver
    assert conf[OPEN_COST] == str(OPEN_COST_BYTES)  # small files: 512 at most a task
    mine = local_mode_conf("local[*]", {"spark.driver.extraClassPath": "/opt/x.jar"})
    assert mine["spark.driver.extraClassPath"] == os.pathsep.join([*ours, "/opt/x.jar"])


def test_a_cluster_or_a_filesystem_of_ones_own_keeps_hadoops() -> None:
    assert local_mode_conf("spark://127.0.0.1:7077", {}) == {}
    assert local_mode_conf("local-cluster[2,1,1024]", {}) == {}
    assert local_mode_conf("local", {})["spark.sql.sources.commitProtocolClass"]
    chosen = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    assert local_mode_conf("local[2]", chosen) == {
        LISTING_THRESHOLD: str(DRIVER_LISTING_PATHS),
        OPEN_COST: str(OPEN_COST_BYTES),
    }


@pytest.mark.skipif(
    not (shutil.which("javac") and shutil.which("jar")), reason="no JDK (javac, jar) here"
)
def test_the_committed_jar_is_built_from_the_committed_source(tmp_path: Path) -> None:
    """``make jvm`` output matches: a change to the .java without a rebuild fails here."""
    subprocess.run(
        [
            "javac",
            "--release",
            "17",
            "-cp",
            jvm.compile_classpath(jars_dir()),
            "-d",
            str(tmp_path),
            *map(str, jvm.SOURCES),
        ],
        check=True,
    )
    built = {p.relative_to(tmp_path).as_posix(): p for p in tmp_path.rglob("*.class")}
    with zipfile.ZipFile(jvm.JAR) as jar:
        held = {n for n in jar.namelist() if n.endswith(".class")}
        assert held == set(built), "tidemark-jvm.jar does not hold its sources' classes: `make jvm`"
        for name, path in built.items():
            assert path.read_bytes() == jar.read(name), (
                "tidemark-jvm.jar is older than its source: `make jvm`"
            )


def test_java_options_from_the_settings_come_after_tidemarks_own() -> None:
    ours = DEFAULT_CONF["spark.driver.extraJavaOptions"]
    merged = java_options(ours, " -XX:TieredStopAtLevel=1 ")
    assert merged == f"{ours} -XX:TieredStopAtLevel=1"
    assert "launchMechanism=VFORK" in merged  # tidemark's own stay
    assert java_options(ours, "") == ours
    assert java_options("", "-Xss4m") == "-Xss4m"
    assert set(JAVA_OPTIONS) == {
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
    }


def test_paths_hadoop_would_read_as_a_glob_or_a_uri_are_not_read_as_they_are() -> None:
    assert readable_path("/srv/lake/_rounds/x.in")
    assert readable_path(Path("/srv/lake ü = x/_spool/y"))
    for odd in ("/srv/lake{x}", "/srv/a[1]", "/srv/a*", "/srv/a?", "/srv/a\\b", "/srv/l:1"):
        assert not readable_path(odd), odd


def test_a_local_master_gets_32_slots_for_an_object_store() -> None:
    from tidemark.spark import object_store_master

    assert object_store_master("local[2]") == "local[32]"
    assert object_store_master("local[1]") == "local[32]"
    assert object_store_master("local[64]") == "local[64]"
    assert object_store_master("local[*]") == "local[*]"  # (every core: as set)
    assert object_store_master("spark://host:7077") == "spark://host:7077"
