"""A class-data archive for the driver's JVM (Java's CDS, ``-XX:SharedArchiveFile``).

A Spark driver loads some 15,000 classes before its first job, each read from a jar,
parsed and verified. An archive holds them as the JVM laid them out in memory: a JVM
started with it maps the file instead. Measured here (2026-12-01, ``local[2]``, Java
17, two cores): the session built in 4.1-5.0 s instead of 6.2-7.6 s, and its first
job took 1.4-1.9 s instead of 2.7-3.5 s. A service's start, a restart after a crash
and a standby's takeover all begin with that.

An archive belongs to one JVM build and one class path (the JVM refuses it otherwise,
and starts as if there were none), so each is named by a fingerprint of both:
``java -version``, and the name, size and modification time of every jar the driver
loads (Spark's, tidemark's, Iceberg's, S3A's). ``make setup`` creates the ones a
checkout uses (``tidemark jvm-archive``: ``tidemark.cli.class_archive``). ``tidemark.spark
.build_session`` uses the one that fits, in local mode only; a class path that
changed (another pyspark, new jars) finds none until it is created again.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

ARCHIVES: Final = "cds"  # the folder of archives in the jar folder (.jars/cds)
# the JVM options that choose an archive (or none) themselves: then tidemark adds none
OWN_CHOICE: Final = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")


def spark_jars() -> Path:
    """The folder of the jars Spark's launcher puts on the driver's class path."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _entries(class_path: str, jars: Path) -> Iterator[str]:
    """Every file of ``class_path`` (``*`` entries expanded as the JVM does: the
    folder's ``.jar`` files), then ``jars``'s."""
    for entry in [*(e for e in class_path.split(os.pathsep) if e), str(jars / "*")]:
        if entry.endswith("*"):
            yield from sorted(glob.glob(entry[:-1] + "*.jar"))
        else:
            yield entry


def fingerprint(java_version: str, class_path: str, jars: Path) -> str:
    """What an archive fits: the JVM (its ``-version`` text) and each class path file's
    name, size and modification time (a file missing counts as such)."""
    digest = hashlib.sha256(java_version.encode())
    for path in _entries(class_path, jars):
        try:
            stat = os.stat(path)
            digest.update(f"\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
        except OSError:
            digest.update(f"\0{path}\0missing".encode())
    return digest.hexdigest()[:24]


def archive_path(folder: Path, java_version: str, class_path: str, jars: Path) -> Path:
    return folder / ARCHIVES / f"driver-{fingerprint(java_version, class_path, jars)}.jsa"


def chooses_its_own(java_options: str) -> bool:
    """Whether ``java_options`` already say which archive to use or make (or none)."""
    return any(flag in java_options for flag in OWN_CHOICE)


def use_options(archive: Path) -> str:
    """The driver's JVM options to map ``archive``. Its messages are off: an archive the
    JVM refuses (made by another build of it) only costs the time it would save."""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
