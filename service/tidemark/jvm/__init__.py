"""tidemark's Java side, built into ``tidemark-jvm.jar`` (``make jvm``); a Spark session
tidemark starts in local mode uses these classes (``tidemark.spark.local_mode_conf``;
the S3A and Iceberg ones where their jars are there):

* ``tidemark.hadoop.NioLocalFileSystem`` (``NioLocalFileSystem.java``): Hadoop's
  ``RawLocalFileSystem`` with permissions set through ``java.nio`` instead of a
  ``chmod`` child process for every file and folder (the pyspark wheel has no native
  Hadoop library), for ``file:`` paths: a 100-shape flush round's Spark job, one file
  per shape, measured 0.58 s with ``RawLocalFileSystem`` and 0.20 s with it.
* ``tidemark.hadoop.DirectPartitionCommitProtocol``
  (``DirectPartitionCommitProtocol.java``): Spark's commit protocol, except that a
  flush round partitioned by ``_tm_dest`` writes each member's files straight into
  the folder of its table that the column names (no ``_temporary`` folder renamed at
  job commit, no move by tidemark afterwards); on an object store, a write with the
  option ``DIRECT_REPORT`` has its tasks report the files they wrote, so tidemark
  lists no folder to find them (``sink.folder.take_reported``).
* ``tidemark.hadoop.SizedS3AFileSystem`` (``SizedS3AFileSystem.java``): S3A's file
  system (``fs.s3a.impl`` of a session with an ``s3://`` root), except that it keeps
  the size of each file such a write creates as the task wrote it, so that neither
  Spark's write statistics nor the report ask the store for it (two HEAD requests a
  file), and uploads each such file beside the task that closed it (the task commits
  once they all returned).
* ``tidemark.iceberg.IcebergStreamCommits`` (``IcebergStreamCommits.java``, with
  ``SyncedFileIO.java`` and ``MetadataAvro.java``): the stream commits of Iceberg
  changelogs with Iceberg's Java library (``tidemark.sink.iceberg.jvm``), when Iceberg's
  jars are there (``ICEBERG_JARS``: ``make setup`` resolves them into ``.jars/iceberg``).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

JAR = Path(__file__).with_name("tidemark-jvm.jar")
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "NioLocalFileSystem.java",
        "DirectPartitionCommitProtocol.java",
        "SizedS3AFileSystem.java",
        "IcebergStreamCommits.java",
        "SyncedFileIO.java",
        "MetadataAvro.java",
    )
)
LOCAL_FS_CLASS = "tidemark.hadoop.NioLocalFileSystem"
DIRECT_COMMIT_CLASS = "tidemark.hadoop.DirectPartitionCommitProtocol"
DIRECT_COLUMN = "_tm_dest"  # DirectPartitionCommitProtocol.COLUMN
DIRECT_REPORT = "tidemark.direct.report"  # DirectPartitionCommitProtocol.REPORT
SIZED_S3A_CLASS = "tidemark.hadoop.SizedS3AFileSystem"


ICEBERG_CLASS = "tidemark.iceberg.IcebergStreamCommits"
ICEBERG_JARS = "iceberg"  # the folder of Iceberg's jars in the jar folder (jars/iceberg)


def compile_classpath(jars: Path) -> str:
    """The jars of the installed pyspark (Hadoop's and Spark's API), Iceberg's (in
    ``jars``/iceberg) and S3A's (in ``jars``), to compile against."""
    import pyspark

    folder = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    if not glob.glob(os.path.join(folder, "hadoop-client-api-*.jar")):
        raise FileNotFoundError("pyspark's jars/ has no hadoop-client-api jar")
    iceberg = jars / ICEBERG_JARS
    if not glob.glob(str(iceberg / "iceberg-core-*.jar")):
        raise FileNotFoundError(f"{iceberg} has no iceberg-core jar: run `make setup`")
    s3a = sorted(jars.glob("hadoop-aws-*.jar"))
    if not s3a:
        raise FileNotFoundError(f"{jars} has no hadoop-aws jar: run `make objectstore`")
    return os.pathsep.join([os.path.join(folder, "*"), str(iceberg / "*"), str(s3a[-1])])
