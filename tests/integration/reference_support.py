"""Running the reference engines' readers (``reference_readers.py``, in the Spark 4.1 of
``.venv-readers``) from the tests, and comparing what they read with ``tidemark.read``
and Postgres."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from tidemark.demo.verify import normalise

REPO = Path(__file__).resolve().parents[2]
READERS_PYTHON = REPO / ".venv-readers" / "bin" / "python"
READERS_JARS = REPO / ".jars" / "readers"
JARS = (
    "delta-spark_4.1_2.13-4.4.0.jar",
    "delta-storage-4.4.0.jar",
    "iceberg-spark-runtime-4.1_2.13-1.12.0.jar",
    "sqlite-jdbc-3.54.1.0.jar",
    "postgresql-42.7.14.jar",
)
S3A_JAR = "hadoop-aws-3.4.2.jar"  # S3A of pyspark 4.1.4's Hadoop
INTERNAL = ("_lsn",)  # tidemark's own column in a current table beside the shape's


def reference_read(
    work: Path,
    reads: list[dict[str, Any]],
    catalog: Path | dict[str, str] | None = None,
    hadoop: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the reads in the reference readers' Spark; the answers by read id (rows in
    ``work/<id>.parquet``). ``catalog``: a SQLite catalog file, or Iceberg's JDBC
    catalog settings (``uri``, ``warehouse``, ``jdbc.user``, ...). ``hadoop``: S3A's
    settings for a store (``fs.s3a.*``; S3A of the readers' Hadoop and the AWS SDK
    bundle of ``.jars/`` go on the class path). A read that failed fails the test with
    the reader's error."""
    jars = [READERS_JARS / name for name in JARS]
    if hadoop is not None:
        from tidemark.spark import jars_dir

        bundles = sorted(jars_dir().glob("bundle-*.jar"))
        assert bundles, f"no AWS SDK bundle in {jars_dir()}: run make objectstore"
        jars += [READERS_JARS / S3A_JAR, bundles[-1]]
    missing = [str(p) for p in (READERS_PYTHON, *jars) if not p.exists()]
    assert not missing, f"the reference readers are not installed ({missing}): run make readers"
    request = work / "request.json"
    work.mkdir(parents=True, exist_ok=True)
    request.write_text(
        json.dumps(
            {
                "jars": [str(p) for p in jars],
                "work": str(work),
                "catalog": sqlite_catalog(catalog) if isinstance(catalog, Path) else catalog,
                "hadoop": hadoop or {},
                "reads": reads,
            }
        )
    )
    done = subprocess.run(
        [str(READERS_PYTHON), str(Path(__file__).with_name("reference_readers.py")), str(request)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {k: v["error"] for k, v in answers.items() if isinstance(v, dict) and "error" in v}
    assert not failed, json.dumps(failed, indent=1)
    assert answers["spark"].startswith("4.1."), answers["spark"]
    return answers


def sqlite_catalog(path: Path) -> dict[str, str]:
    """Iceberg's JDBC catalog settings for tidemark's default catalog, a SQLite file."""
    return {"uri": f"jdbc:sqlite:{path}", "warehouse": f"file://{path.parent}"}


def postgres_catalog(uri: str, warehouse: str) -> dict[str, str]:
    """Iceberg's JDBC catalog settings for a PostgreSQL catalog given as a libpq URI."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    return {
        "uri": f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}",
        "jdbc.user": unquote(parts.username or ""),
        "jdbc.password": unquote(parts.password or ""),
        "warehouse": warehouse,
    }


def rows(table: pa.Table, columns: list[str] | None = None) -> Counter[tuple[Any, ...]]:
    """A multiset of rows over ``columns`` (default: every column, by name)."""
    names = columns or sorted(table.column_names)
    return Counter(
        tuple(normalise(row[c]) for c in names) for row in table.select(names).to_pylist()
    )


def shape_columns(table: pa.Table) -> list[str]:
    return [c for c in table.column_names if c not in INTERNAL]


def same_rows(got: pa.Table, expected: pa.Table, what: str) -> None:
    assert sorted(got.column_names) == sorted(expected.column_names), (
        what,
        got.column_names,
        expected.column_names,
    )
    left, right = rows(got), rows(expected)
    assert left == right, (what, list((left - right).items())[:3], list((right - left).items())[:3])


def postgres_rows(dsn: str, query: str) -> tuple[list[str], Counter[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        cursor = conn.execute(query)
        names = [d.name for d in cursor.description or ()]
        return names, Counter(tuple(map(normalise, r)) for r in cursor.fetchall())


def equals_postgres(table: pa.Table, truth: tuple[list[str], Counter[Any]], what: str) -> None:
    names, expected = truth
    assert sorted(shape_columns(table)) == sorted(names), (what, table.column_names, names)
    got = rows(table, names)
    assert got == expected, (
        what,
        list((got - expected).items())[:3],
        list((expected - got).items())[:3],
    )
