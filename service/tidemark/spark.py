"""The Spark session tidemark writes with.

One session per process, of one of two kinds:

* **classic** (``[spark] master``): tidemark is the Spark driver, with a JVM in its
  process; local mode (``local[2]``) by default, or a cluster (``spark://host:7077``),
  whose executors then write the Parquet files. Python workers (none of tidemark's
  jobs start one: Arrow is decoded in the JVM and the fold is SQL) run the same
  interpreter as the service: ``PYSPARK_PYTHON`` is set before the JVM starts.
* **Spark Connect** (``[spark] remote = "sc://host:port"``): tidemark is a gRPC
  client of a Spark Connect server; no JVM in tidemark's process. Only runtime SQL
  settings (``spark.sql.*`` of ``DEFAULT_CONF`` and every key of ``[spark] conf``)
  are sent to the server's session; static ones (memory, UI, ``spark.hadoop.*``)
  belong on the server's own command line.

Data goes in through Arrow (a classic session reads a flush's rows from a Parquet
file the driver writes with pyarrow, ``writers.job.arrow_frames``; Connect takes
``createDataFrame(pyarrow.Table)``) and out through Arrow, never through pandas.
Whatever differs between the kinds is decided here (``is_connect``, ``arrow_parts``,
``readable_path``), so callers stay the same for both.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit

from tidemark.errors import ConfigError
from tidemark.jvm import archive

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

T = TypeVar("T")

MIN_JAVA = 17
CONNECT_DEFAULT_PORT = 15002
# A Spark Connect server turns the Arrow it receives into rows in its driver's heap
# before the job runs (measured with a 1 GiB driver, pyspark 4.3: 33 MB of Arrow
# written, 50 MB ran out of memory), so one job gets at most this much; more rows
# become several jobs appending to the same folder.
CONNECT_JOB_BYTES = 16 * 1024 * 1024
CONNECT_CONF: Mapping[str, str] = {
    # Above this size the client uploads a table as an artifact that the server caches
    # in its block manager for the whole session: a long-running writer would pile up
    # every batch there (measured: the third 80 MB batch through one server exhausted
    # its 1 GiB of direct memory). Below it the rows travel inside the plan, one gRPC
    # message of at most CONNECT_JOB_BYTES (+ a little) against the 128 MiB limit of
    # both the client and the server (spark.connect.grpc.maxInboundMessageSize).
    "spark.sql.session.localRelationCacheThreshold": str(4 * CONNECT_JOB_BYTES),
}

# local mode: see local_mode_conf
LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
DRIVER_LISTING_PATHS = 1_000_000
OPEN_COST = "spark.sql.files.openCostInBytes"
# what a file counts for when Spark packs files into a scan's tasks: at most 128 MiB
# (spark.sql.files.maxPartitionBytes) / 256 KiB = 512 files a task (see local_mode_conf)
OPEN_COST_BYTES = 256 * 1024

# Spark's scheduler pools for a classic session: stream flushes (the acknowledgement
# waits for them) in "default", offered every free task slot first; current-table
# refreshes, backfill rewrites and changelog retention in BACKGROUND_POOL
# (``in_background``). With Spark's default FIFO scheduling a job's queued tasks
# all run before a later job's: a flush started during a refresh of 1000 current
# tables (one job of 13-24 s) would wait for all its queued tasks.
FAIR_POOLS = Path(__file__).with_name("spark_pools.xml")
BACKGROUND_POOL = "background"

DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # Parquet timestamps as INT64 microseconds: Spark's default INT96 is read by plain
    # Parquet/Delta readers (deltalake, pyarrow) as nanoseconds, which fails or
    # overflows outside 1677-2262
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # dates and timestamps as they are, in the proleptic Gregorian calendar Postgres
    # uses: no rebase into the old Julian/Gregorian hybrid, no exception before 1582
    # (Spark 4's default; stated so that a cluster's spark-defaults cannot change it)
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    # snappy: measured 25% faster than zstd per batch here (bench/sink_bench.py)
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.sources.commitProtocolClass": (
        "org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol"
    ),
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # Hadoop's local filesystem without its native library (the pyspark wheel has none)
    # runs `chmod` in a child process for every file and folder it creates: ~10 ms per
    # file, which a flush round writing one file per shape pays a hundred times. No
    # .crc side files (tidemark deletes them anyway) and vfork for those children:
    # a 100-shape round's Spark job went from 1.04 s to 0.71 s (bench/shapes_bench.py).
    # In local mode ``local_mode_conf`` goes further: no child process at all.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # flushes before upkeep (FAIR_POOLS); an install without the file: Spark's FIFO
    **(
        {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(FAIR_POOLS)}
        if FAIR_POOLS.is_file()
        else {}
    ),
    "spark.driver.memory": "2g",
    "spark.driver.extraJavaOptions": "-XX:+UseG1GC -Djdk.lang.Process.launchMechanism=VFORK",
    "spark.executor.extraJavaOptions": "-Djdk.lang.Process.launchMechanism=VFORK",
}


def java_version_text() -> str:
    """What ``java -version`` of the ``java`` Spark will start says ("" if none)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return ""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return f"{os.path.realpath(java)}\n{out.stderr}{out.stdout}"


def java_major_version() -> int | None:
    """The major version of the ``java`` Spark will start, or None if there is none."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', java_version_text())
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


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no JVM, no sparkContext)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def in_background(spark: Any, call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` with the Spark jobs it starts in ``BACKGROUND_POOL``, so
    a stream flush's tasks go first (``FAIR_POOLS``). The pool is a property of the
    calling thread (give this to ``asyncio.to_thread``), reset after. Spark Connect:
    no change (the server's scheduler decides; see docs/guides/spark-connect.md)."""
    if is_connect(spark):
        return call(*args, **kwargs)
    context = spark.sparkContext
    context.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL)
    try:
        return call(*args, **kwargs)
    finally:
        context.setLocalProperty("spark.scheduler.pool", None)


def arrow_parts(spark: Any, arrow: pa.Table) -> list[pa.Table]:
    """``arrow`` cut into the pieces to send to Spark one job each.

    Classic: the whole table (Arrow batches stream into the JVM). Connect: slices of
    at most ``CONNECT_JOB_BYTES``, so a big batch does not exhaust the server's
    driver. Each slice stays below ``CONNECT_CONF``'s cache threshold, so its rows
    travel inside the job's plan: one gRPC message, far below the 128 MiB limit.
    """
    if not is_connect(spark) or arrow.nbytes <= CONNECT_JOB_BYTES or arrow.num_rows <= 1:
        return [arrow]
    pieces = -(-arrow.nbytes // CONNECT_JOB_BYTES)
    step = -(-arrow.num_rows // pieces)
    return [arrow.slice(start, step) for start in range(0, arrow.num_rows, step)]


# Hadoop reads a path with any of these as a glob pattern (or, with ':', fails to
# parse it: "Relative path in absolute URI")
_UNREADABLE: Final = frozenset("{}[]*?\\:")


def readable_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``spark.read`` can open ``path`` as it is: no character Hadoop takes for
    a glob or a URI scheme (a sink root may have them; writes do not mind)."""
    return not _UNREADABLE.intersection(os.fspath(path))


def connect_address(remote: str) -> tuple[str, int]:
    """Host and port of an ``sc://host[:port][/;params]`` URL."""
    parts = urlsplit(remote)
    if parts.scheme != "sc" or not parts.hostname:
        raise ConfigError(f"{remote!r} is not a Spark Connect URL: write sc://host:port")
    return parts.hostname, parts.port or CONNECT_DEFAULT_PORT


def check_connect(remote: str, timeout_s: float = 10.0) -> None:
    """Raise ConfigError unless the Connect client is installed and the server answers.

    The client itself retries an unreachable server for about ten minutes (right for a
    server restarting under a running service, wrong for a typo at start), so the
    address is tried once here first.
    """
    try:
        import pyspark.sql.connect  # noqa: F401 - its import checks the client's packages
    except ImportError as exc:
        raise ConfigError(
            f"[spark] remote needs pyspark's Spark Connect client ({exc}): install "
            "tidemark with its `connect` extra (pip install 'tidemark[connect]')"
        ) from None
    host, port = connect_address(remote)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"no Spark Connect server answers at {host}:{port} ({exc}): start one "
            "(sbin/start-connect-server.sh, or spark-submit --class "
            "org.apache.spark.sql.connect.service.SparkConnectServer) or fix [spark] remote"
        ) from None


def local_mode_conf(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """In local mode (the JVM is tidemark's own, on this machine):

    * Spark lists the files a job reads in the driver, however many
      (``LISTING_THRESHOLD``). Above 32 paths it otherwise lists them with a Spark job
      of one task per path: listing 6000 small files took 11.6-16 s that way, 0.6-0.7
      s in the driver (a refresh's 5996 changelog files: 12.9 s; 4894 in the driver:
      1.2 s).
    * A job reading many small files counts 256 KiB per file when it packs them into
      tasks (``spark.sql.files.openCostInBytes``; Spark's default 4 MiB makes many
      more tasks): a scan of 3000 Parquet files of 15 rows took 1.8-2.2 s with 0
      against 2.9-3.2 s with 4 MiB; of 3000 files of 4 rows, 1.23-1.41 s with 256
      KiB (6 tasks), 1.14-1.33 s with 0 (2 tasks). Not 0: Spark's file scan goes
      one call deeper for each file that yields no rows (its row groups all pruned
      by a filter), and 5000 such files in one task overflowed the task thread's
      stack, which ends the JVM; 256 KiB keeps a task at 512 files or fewer.
    * Iceberg's jars are on the driver's class path when ``make setup`` fetched them
      (``iceberg_jars``): the driver commits Iceberg changelogs.
    * ``file:`` paths go through ``tidemark.hadoop.NioLocalFileSystem``
      (``tidemark/jvm``): the modes of the files and folders Spark writes are set
      without a ``chmod`` process each; and writes use
      ``tidemark.hadoop.DirectPartitionCommitProtocol``, with which a flush round
      writes each member's files straight into its table's folder. Not when ``conf``
      chooses ``spark.hadoop.fs.file.impl`` itself.

    Not on a cluster: its executors would need the jar on their class path, and
    listing thousands of files of remote storage one by one in the driver may well
    be slower than a job."""
    from tidemark import jvm

    # (local-cluster[...] runs executors in JVMs of their own, without the jar)
    if not is_local(master):
        return {}
    out = {LISTING_THRESHOLD: str(DRIVER_LISTING_PATHS), OPEN_COST: str(OPEN_COST_BYTES)}
    if "spark.hadoop.fs.file.impl" in conf or not jvm.JAR.is_file():
        return out  # (no jar: an install without the package data) Hadoop's own
    extra = conf.get(CLASS_PATH)
    return out | {
        "spark.hadoop.fs.file.impl": jvm.LOCAL_FS_CLASS,
        "spark.sql.sources.commitProtocolClass": jvm.DIRECT_COMMIT_CLASS,
        CLASS_PATH: os.pathsep.join(p for p in (str(jvm.JAR), iceberg_jars(), extra) if p),
    }


def iceberg_jars(folder: Path | None = None) -> str:
    """Iceberg's jars for the driver's class path (``folder/*``; default ``jars_dir()
    /iceberg``), "" when they are not there: then pyiceberg commits every Iceberg table
    (``tidemark.sink.iceberg.jvm``)."""
    from tidemark import jvm

    folder = folder or jars_dir() / jvm.ICEBERG_JARS
    if not folder.is_dir() or not any(folder.glob("iceberg-core-*.jar")):
        return ""
    return str(folder / "*")


CLASS_PATH: Final = "spark.driver.extraClassPath"
JAVA_OPTIONS: Final = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def java_options(ours: str, theirs: str) -> str:
    """JVM options a user sets in ``[spark] conf`` go after tidemark's own, not in their
    place: the JVM takes the last of two conflicting flags, so the user's win, and
    tidemark's others (the child process mechanism) stay."""
    return " ".join(part for part in (ours.strip(), theirs.strip()) if part)


def build_session(
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "tidemark",
    remote: str = "",
) -> SparkSession:
    """Create (or return the running) Spark session with tidemark's defaults.

    ``remote`` (an ``sc://`` URL) makes it a Spark Connect session and ``master`` is
    not used.
    """
    if remote:
        return _connect_session(remote, conf or {}, app_name)
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = with_class_archive(master, session_settings(master, conf or {}), conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def is_local(master: str) -> bool:
    """Whether ``master`` runs the tasks in the driver's own JVM (``local``, ``local[N]``;
    not ``local-cluster[...]``, whose executors have JVMs of their own)."""
    return master == "local" or master.startswith("local[")


def session_settings(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """Every setting ``build_session`` gives a classic session (before a class-data
    archive): tidemark's defaults, local mode's, the user's ``conf`` on top, except that
    the class path and the JVM options hold tidemark's and the user's both."""
    local = local_mode_conf(master, conf)
    settings = {**DEFAULT_CONF, **local, **conf}
    if CLASS_PATH in local:  # (tidemark's jar, then the user's class path: both)
        settings[CLASS_PATH] = local[CLASS_PATH]
    for key in JAVA_OPTIONS:
        settings[key] = java_options(DEFAULT_CONF.get(key, ""), conf.get(key, ""))
    return settings


def with_class_archive(
    master: str, settings: Mapping[str, str], conf: Mapping[str, str], folder: Path | None = None
) -> dict[str, str]:
    """``settings`` with the driver's JVM mapping its class-data archive
    (``tidemark.jvm.archive``) when ``folder`` (default ``jars_dir()``) has the one that
    fits: local mode only, and not when the user's JVM options choose (``-Xshare:off``,
    an archive of their own). The user's options stay last: theirs win."""
    out = dict(settings)
    key = JAVA_OPTIONS[0]
    if not is_local(master) or archive.chooses_its_own(out.get(key, "")):
        return out
    found = archive_for(folder or jars_dir(), settings=out)
    if found.is_file():
        ours = java_options(DEFAULT_CONF[key], archive.use_options(found))
        out[key] = java_options(ours, conf.get(key, ""))
    return out


def archive_for(folder: Path, s3: bool = False, settings: Mapping[str, str] | None = None) -> Path:
    """Where the class-data archive (``tidemark.jvm.archive``) of a local session with
    ``settings`` (default: tidemark's own, with S3A's jars if ``s3``) is or would be."""
    if settings is None:
        conf = with_s3a({}, s3a_jars(folder)) if s3 else {}
        settings = session_settings(object_store_master("local[2]") if s3 else "local[2]", conf)
    return archive.archive_path(
        folder, java_version_text(), settings.get(CLASS_PATH, ""), archive.spark_jars()
    )


def _connect_session(remote: str, conf: Mapping[str, str], app_name: str) -> SparkSession:
    check_connect(remote)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote).appName(app_name)
    runtime = {k: v for k, v in DEFAULT_CONF.items() if k.startswith("spark.sql.")}
    for key, value in {**runtime, **CONNECT_CONF, **conf}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# ---- object stores (an s3:// sink root) -----------------------------------------------

# what S3A needs beside pyspark's own Hadoop: hadoop-aws of the same Hadoop version, the
# AWS SDK bundle it was built against, and its analytics accelerator (pinned, with
# checksums, in jars/pom.xml and jars/checksums.sha256; ``make objectstore`` fetches them)
S3A_JARS: Final = ("hadoop-aws-", "bundle-", "analyticsaccelerator-s3-")
JARS_ENV: Final = "TIDEMARK_JARS_DIR"


def jars_dir() -> Path:
    """Where the extra jars are: ``$TIDEMARK_JARS_DIR``, else ``.jars`` of the checkout
    tidemark runs from."""
    found = os.environ.get(JARS_ENV)
    return Path(found) if found else Path(__file__).resolve().parents[2] / ".jars"


def s3a_jars(folder: Path | None = None) -> list[Path]:
    """The S3A jars in ``folder`` (default ``jars_dir()``); ``ConfigError`` naming each
    one missing and how to get it."""
    folder = folder or jars_dir()
    found: list[Path] = []
    missing: list[str] = []
    for prefix in S3A_JARS:
        matches = sorted(folder.glob(f"{prefix}*.jar")) if folder.is_dir() else []
        if matches:
            found.append(matches[-1])
        else:
            missing.append(f"{prefix}*.jar")
    if missing:
        raise ConfigError(
            f"an s3:// sink root needs Spark's S3A connector, and {', '.join(missing)} "
            f"is not in {folder}: run `make objectstore` in tidemark's checkout (it fetches "
            f"the pinned jars with their checksums), or copy that folder from a machine "
            f"that has it and set {JARS_ENV} to it"
        )
    return found


def with_s3a(conf: Mapping[str, str], jars: list[Path]) -> dict[str, str]:
    """``conf`` with the S3A jars on the driver's class path (local mode: the driver's
    JVM runs the tasks too, so nothing is copied)."""
    extra = conf.get(CLASS_PATH, "")
    return {**conf, CLASS_PATH: os.pathsep.join([*map(str, jars), *([extra] if extra else [])])}


def configure_s3a(spark: Any, bucket: str, hadoop: Mapping[str, str]) -> None:
    """Give the running session's Hadoop ``hadoop`` (S3A's ``fs.s3a.*`` settings) for
    ``bucket`` only (S3A's per-bucket keys), so that sessions shared by several roots
    keep each its own store."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in hadoop.items():
        conf.set(key.replace("fs.s3a.", f"fs.s3a.bucket.{bucket}.", 1), value)
    # S3A, keeping the sizes of the files a round writes into tables' folders (no HEAD
    # request per file afterwards: tidemark/jvm/SizedS3AFileSystem.java), where tidemark's
    # jar is the session's (local mode); for the buckets first opened from now on
    # (Hadoop keeps each bucket's file system)
    from tidemark import jvm

    direct = spark.sparkContext.getConf().get("spark.sql.sources.commitProtocolClass", "")
    if direct == jvm.DIRECT_COMMIT_CLASS:
        conf.set("fs.s3a.impl", jvm.SIZED_S3A_CLASS)


# task slots of a local session writing to an object store: a write task waits on the
# store's replies, not on the CPU (S3Proxy behind 20 ms, `python -m bench object-store`:
# a round's Spark job for 100 shapes 7.2-8.5 s in local[2], 1.8-3.1 s in local[8]; for
# 500 shapes 5.3-8.1 s in local[8], 2.2-4.3 s in local[32], 2026-11-29)
OBJECT_STORE_SLOTS: Final = 32
_LOCAL_N = re.compile(r"local\[(\d+)\]")


def object_store_master(master: str) -> str:
    """``local[N]`` with at least ``OBJECT_STORE_SLOTS`` slots for a root on an object
    store; any other master as it is."""
    found = _LOCAL_N.fullmatch(master)
    if found is None or int(found.group(1)) >= OBJECT_STORE_SLOTS:
        return master
    return f"local[{OBJECT_STORE_SLOTS}]"
