"""The reference engines' own readers, run in a Spark of their own: Delta's Spark reader
(delta-spark) and Iceberg's Spark runtime. Not tidemark's Spark (4.3): Iceberg's runtime
stops at Spark 4.1 and delta-spark 4.4 at 4.2, so this script runs in ``.venv-readers``
(pyspark 4.1, ``make readers``) with the jars of ``.jars/readers``, and imports nothing
of tidemark's or the tests'.

    .venv-readers/bin/python tests/integration/reference_readers.py REQUEST.json

The request names the jars, a folder for the rows, S3A's settings for tables on S3
(``hadoop``: ``fs.s3a.*``, paths then ``s3a://``), and the reads. Each read has an
``id`` and one of these kinds; rows go to ``<work>/<id>.parquet``, facts to the answer:

* ``{"delta": path, "version": n | null}``: ``spark.read.format("delta")``, as of a
  version (``versionAsOf``) or the newest;
* ``{"delta_detail": path}``: ``DESCRIBE DETAIL`` (protocol versions, table features,
  files, partition columns), ``DESCRIBE HISTORY``'s versions, and the log segment
  delta-spark's replay used (the checkpoint it started from, the JSON entries after it);
* ``{"iceberg": identifier, "snapshot": id | null}``: Iceberg's reader through the SQL
  catalog (``catalog``: ``uri`` ``jdbc:sqlite:...`` or ``jdbc:postgresql:...``,
  ``warehouse``, and ``jdbc.user``/``jdbc.password`` where it needs them; Iceberg's
  ``JdbcCatalog`` named as pyiceberg names it, ``tidemark``, since it keeps only the
  rows of its own name), or through a REST catalog (``catalog``: ``type`` ``rest``,
  ``uri``);
* ``{"iceberg_path": metadata_location}``: the same reader given the metadata file, no
  catalog;
* ``{"iceberg_snapshots": identifier}``: the snapshots metadata table (id, parent,
  operation, summary).

The answer, on stdout as one JSON document: ``{id: {"rows": n} | facts | {"error":
text}}`` (a read that fails is an answer, so the test can say which and why).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

CATALOG = "tidemark"


def session(request: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[1]")
        .appName("tidemark-reference-readers")
        .config("spark.jars", ",".join(request["jars"]))
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        # Delta's log replay defaults to 50 partitions: seconds on one core for nothing
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config(
            "spark.sql.extensions",
            "io.delta.sql.DeltaSparkSessionExtension,"
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    )
    for key, value in (request.get("hadoop") or {}).items():  # S3A, for tables on S3
        builder = builder.config(f"spark.hadoop.{key}", value)
    catalog = request.get("catalog")
    if catalog:  # Iceberg's JdbcCatalog over tidemark's SQL catalog (SQLite or
        # PostgreSQL), or its REST catalog client (``type`` ``rest``)
        prefix = f"spark.sql.catalog.{CATALOG}"
        builder = builder.config(prefix, "org.apache.iceberg.spark.SparkCatalog").config(
            f"{prefix}.type", catalog.pop("type", "jdbc")
        )
        for key, value in catalog.items():  # uri, warehouse, jdbc.user, jdbc.password
            builder = builder.config(f"{prefix}.{key}", value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def save(frame: Any, out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    table = frame.toArrow()
    pq.write_table(table, out)
    return {"rows": table.num_rows}


def delta_detail(spark: Any, path: str) -> dict[str, Any]:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0].asDict()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    snapshot = log.unsafeVolatileSnapshot()  # (forTable has just read the log)
    segment = snapshot.logSegment()
    return {
        "minReaderVersion": detail["minReaderVersion"],
        "minWriterVersion": detail["minWriterVersion"],
        "tableFeatures": sorted(detail.get("tableFeatures") or []),
        "numFiles": detail["numFiles"],
        "partitionColumns": list(detail["partitionColumns"]),
        "history": sorted(r["version"] for r in history),
        "version": snapshot.version(),
        "checkpoint": segment.checkpointProvider().version(),
        "entries_replayed": segment.deltas().size(),
    }


def iceberg_snapshots(spark: Any, ident: str) -> dict[str, Any]:
    rows = spark.sql(
        f"SELECT snapshot_id, parent_id, operation, summary FROM {ident}.snapshots"
    ).collect()
    return {
        "snapshots": [
            {
                "id": r["snapshot_id"],
                "parent": r["parent_id"],
                "operation": r["operation"],
                "summary": dict(r["summary"] or {}),
            }
            for r in rows
        ]
    }


def answer(spark: Any, read: dict[str, Any], out: Path) -> dict[str, Any]:
    if "delta" in read:
        reader = spark.read.format("delta")
        if read.get("version") is not None:
            reader = reader.option("versionAsOf", read["version"])
        return save(reader.load(read["delta"]), out)
    if "delta_detail" in read:
        return delta_detail(spark, read["delta_detail"])
    if "iceberg" in read:
        ident = f"{CATALOG}.{read['iceberg']}"
        if read.get("snapshot") is None:
            return save(spark.table(ident), out)
        return save(spark.sql(f"SELECT * FROM {ident} VERSION AS OF {int(read['snapshot'])}"), out)
    if "iceberg_path" in read:
        return save(spark.read.format("iceberg").load(read["iceberg_path"]), out)
    if "iceberg_snapshots" in read:
        return iceberg_snapshots(spark, f"{CATALOG}.{read['iceberg_snapshots']}")
    raise ValueError(f"unknown read {read!r}")


def main(path: str) -> int:
    request = json.loads(Path(path).read_text())
    work = Path(request["work"])
    work.mkdir(parents=True, exist_ok=True)
    spark = session(request)
    answers: dict[str, Any] = {"spark": spark.version}
    for read in request["reads"]:
        try:
            answers[read["id"]] = answer(spark, read, work / f"{read['id']}.parquet")
        except Exception as exc:  # the test says which read failed, and why
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            answers[read["id"]] = {"error": text[-3000:]}
    spark.stop()
    print(json.dumps(answers, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
