"""The driver's class-data archive (``tidemark.jvm.archive``): which one fits a session,
and where ``build_session`` puts it among the JVM options. Making one and a JVM mapping
it: ``tests/integration/test_warm_up.py`` (``make setup`` makes them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidemark.cli import class_archive as training
from tidemark.jvm import archive
from tidemark.spark import (
    DEFAULT_CONF,
    archive_for,
    session_settings,
    with_class_archive,
)

OPTIONS = "spark.driver.extraJavaOptions"


def jar(folder: Path, name: str, data: bytes = b"x") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


def test_an_archive_fits_one_jvm_and_every_jar_of_the_class_path_as_it_is(tmp_path: Path) -> None:
    spark_jars, ours = tmp_path / "spark", tmp_path / "ours"
    a = jar(spark_jars, "spark-core.jar")
    jar(ours, "iceberg-core.jar")
    path = f"{tmp_path / 'tidemark.jar'}{os.pathsep}{ours / '*'}"
    first = archive.fingerprint("17.0.15", path, spark_jars)
    assert archive.fingerprint("17.0.15", path, spark_jars) == first
    assert archive.fingerprint("17.0.16", path, spark_jars) != first  # another JVM build
    jar(ours, "iceberg-aws.jar")  # a jar more in a folder/* entry
    second = archive.fingerprint("17.0.15", path, spark_jars)
    assert second != first
    a.write_bytes(b"xy")  # a jar of Spark's changed
    third = archive.fingerprint("17.0.15", path, spark_jars)
    assert third != second
    os.utime(a, ns=(0, 0))  # only its time
    assert archive.fingerprint("17.0.15", path, spark_jars) != third
    jar(tmp_path, "tidemark.jar")  # a file the class path names appears
    assert archive.fingerprint("17.0.15", path, spark_jars) != third


def test_a_local_session_maps_the_archive_that_fits_between_tidemarks_options_and_the_users(
    tmp_path: Path,
) -> None:
    conf = {OPTIONS: "-Xss4m"}
    settings = session_settings("local[2]", conf)
    assert with_class_archive("local[2]", settings, conf, tmp_path) == settings  # none yet
    made = archive_for(tmp_path, settings=settings)
    made.parent.mkdir()
    made.touch()
    got = with_class_archive("local[2]", settings, conf, tmp_path)
    assert got[OPTIONS] == f"{DEFAULT_CONF[OPTIONS]} {archive.use_options(made)} -Xss4m"
    assert {k: v for k, v in got.items() if k != OPTIONS} == {
        k: v for k, v in settings.items() if k != OPTIONS
    }


@pytest.mark.parametrize("own", ["-Xshare:off", "-XX:SharedArchiveFile=/opt/mine.jsa"])
def test_jvm_options_that_choose_an_archive_or_none_are_left_alone(
    tmp_path: Path, own: str
) -> None:
    conf = {OPTIONS: own}
    settings = session_settings("local[2]", conf)
    made = archive_for(tmp_path, settings=settings)
    made.parent.mkdir()
    made.touch()
    assert with_class_archive("local[2]", settings, conf, tmp_path) == settings


def test_a_cluster_driver_gets_no_archive(tmp_path: Path) -> None:
    settings = session_settings("spark://127.0.0.1:7077", {})
    made = archive_for(tmp_path, settings=settings)
    made.parent.mkdir()
    made.touch()
    assert with_class_archive("spark://127.0.0.1:7077", settings, {}, tmp_path) == settings


def test_making_the_archives_keeps_the_current_ones_and_deletes_older(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Path] = []

    def fake(target: Path, s3: bool) -> Path:  # (the training run: a JVM, in the integration tests)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        made.append(target)
        return target

    monkeypatch.setattr(training, "_create", fake)
    old = tmp_path / archive.ARCHIVES / "driver-0123456789abcdef01234567.jsa"
    old.parent.mkdir()
    old.touch()
    assert training.create_all(tmp_path) == made == [archive_for(tmp_path)]  # (no S3A jars here)
    assert not old.exists() and made[0].is_file()
