"""The Spark session tidemark writes with.

One session per process: local mode (``local[2]``) by default, any
``spark.master`` by configuration. The Python workers must run the same
interpreter as the service, so ``PYSPARK_PYTHON`` is set before the JVM starts.
Data goes in and out through Arrow (``createDataFrame(pyarrow.Table)``), never
through pandas.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17

DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # snappy: measured 25% faster than zstd per batch here (bench/sink_bench.py)
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.sources.commitProtocolClass": (
        "org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol"
    ),
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.driver.memory": "2g",
    "spark.driver.extraJavaOptions": "-XX:+UseG1GC",
}


def java_major_version() -> int | None:
    """The major version of the ``java`` Spark will start, or None if there is none."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java() -> None:
    """Raise ConfigError unless Java >= 17 is available."""
    major = java_major_version()
    if major is None:
        raise ConfigError(
            "Java was not found: Spark needs Java 17 or newer. Install it "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    if major < MIN_JAVA:
        raise ConfigError(
            f"Java {major} found, but Spark 4 needs Java {MIN_JAVA} or newer. "
            "Install openjdk-17-jre-headless or point JAVA_HOME at a newer JDK."
        )


def build_session(
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "tidemark",
) -> SparkSession:
    """Create (or return the running) Spark session with tidemark's defaults."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
