"""tidemark's Java side, built into ``tidemark-jvm.jar`` (``make jvm``); a Spark session
tidemark starts in local mode uses both classes (``tidemark.spark.local_mode_conf``):

* ``tidemark.hadoop.NioLocalFileSystem`` (``NioLocalFileSystem.java``): Hadoop's
  ``RawLocalFileSystem`` with permissions set through ``java.nio`` instead of a
  ``chmod`` child process for every file and folder (the pyspark wheel has no native
  Hadoop library), for ``file:`` paths: a 100-shape flush round's Spark job, one file
  per shape, measured 0.58 s with ``RawLocalFileSystem`` and 0.20 s with it.
* ``tidemark.hadoop.DirectPartitionCommitProtocol``
  (``DirectPartitionCommitProtocol.java``): Spark's commit protocol, except that a
  flush round partitioned by ``_tm_dest`` writes each member's files straight into
  the folder of its table that the column names (no ``_temporary`` folder renamed at
  job commit, no move by tidemark afterwards).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

JAR = Path(__file__).with_name("tidemark-jvm.jar")
SOURCES = (
    Path(__file__).with_name("NioLocalFileSystem.java"),
    Path(__file__).with_name("DirectPartitionCommitProtocol.java"),
)
LOCAL_FS_CLASS = "tidemark.hadoop.NioLocalFileSystem"
DIRECT_COMMIT_CLASS = "tidemark.hadoop.DirectPartitionCommitProtocol"
DIRECT_COLUMN = "_tm_dest"  # DirectPartitionCommitProtocol.COLUMN


def compile_classpath() -> str:
    """The jars of the installed pyspark (Hadoop's and Spark's API), to compile against."""
    import pyspark

    folder = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    if not glob.glob(os.path.join(folder, "hadoop-client-api-*.jar")):
        raise FileNotFoundError("pyspark's jars/ has no hadoop-client-api jar")
    return os.path.join(folder, "*")
