"""A Spark Connect client in its own process, for the Connect tests (a Connect
session switches pyspark's whole process into Connect mode, so it cannot share the
suite's process and its classic session). Prints one JSON line.

``fold URL ROOT DSN TRUTH_JSON``: every shape folded through Connect
(``tidemark.read``), compared with its query on Postgres (``compare_shape``); then
each shape's current-state table refreshed through Connect (in 4 buckets, one shape
at a time; then all shapes as one file each, in one job per column layout) and read
back with deltalake alone, compared with the same query.

``write URL ROOT ROWS``: a batch of ROWS rows, tens of MB of Arrow, written through
Connect by ``write_arrow`` into a new shape table ``big`` and committed.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.compute as pc


def fold(url: str, root: str, dsn: str, truth: dict[str, str]) -> dict[str, object]:
    from tidemark.demo.verify import compare_shape
    from tidemark.spark import build_session, is_connect

    spark = build_session(remote=url, app_name="tidemark-test-fold")
    results = {
        shape: compare_shape(spark, root, shape, query, dsn) for shape, query in truth.items()
    }
    return {
        "connect": is_connect(spark),
        "shapes": {
            shape: {"equal": r.equal, "rows": r.got_rows, "describe": r.describe()}
            for shape, r in results.items()
        },
        "current": {
            shape: refreshed_equals(spark, root, shape, query, dsn)
            for shape, query in truth.items()
        },
        "current_together": refreshed_together(spark, root, dsn, truth),
    }


def refreshed_together(
    spark: object, root: str, dsn: str, truth: dict[str, str]
) -> dict[str, object]:
    from tidemark.sink import current

    done = current.refresh_many(spark, root, list(truth), buckets=4)
    return {
        shape: repr(done[shape])
        if isinstance(done[shape], Exception) or done[shape].buckets_written != 1  # type: ignore[union-attr]
        else read_equals(root, shape, query, dsn)
        for shape, query in truth.items()
    }


def refreshed_equals(spark: object, root: str, shape: str, query: str, dsn: str) -> bool:
    from tidemark.sink import current

    current.refresh(spark, root, shape, buckets=4)
    return read_equals(root, shape, query, dsn)


def read_equals(root: str, shape: str, query: str, dsn: str) -> bool:
    import psycopg
    from deltalake import DeltaTable

    from tidemark.demo.verify import normalise
    from tidemark.sink import current

    rows = DeltaTable(str(current.current_path(root, shape))).to_pyarrow_table().to_pylist()
    got = sorted((tuple(normalise(v) for c, v in r.items() if c != "_lsn") for r in rows), key=repr)
    with psycopg.connect(dsn) as conn:
        expected = sorted((tuple(map(normalise, r)) for r in conn.execute(query)), key=repr)
    return got == expected


def write(url: str, root: str, rows: int) -> dict[str, object]:
    from tests.integration.sink_support import ITEM_COLUMNS
    from tidemark.sink.delta.table import ShapeTable
    from tidemark.sink.schema import table_schema
    from tidemark.spark import arrow_parts, build_session, is_connect
    from tidemark.writers.job import write_arrow

    spark = build_session(remote=url, app_name="tidemark-test-write")
    schema = table_schema(ITEM_COLUMNS)
    ids = pa.array(range(rows), pa.int32())
    arrow = pa.table(
        {
            "id": ids,
            "name": pc.cast(ids, pa.string()),
            "big": pa.array(["x" * 40] * rows),
            "_lsn": pa.array([7] * rows, pa.int64()),
            "_op": ids,
            "_kind": pa.array(["insert"] * rows),
            "_xid": pa.array([1] * rows, pa.int64()),
            "_commit_ts": pa.nulls(rows, pa.timestamp("us", tz="UTC")),
            "_unchanged": pa.nulls(rows, pa.list_(pa.string())),
        },
        schema=schema,
    )
    table = ShapeTable(root, "big")
    table.create(schema, ["id"], {"name": "big"})
    files = write_arrow(spark, table, schema, arrow)
    version = table.commit(files, 7)
    return {
        "connect": is_connect(spark),
        "arrow_bytes": arrow.nbytes,
        "jobs": len(arrow_parts(spark, arrow)),
        "files": len(files),
        "version": version,
    }


def main(argv: list[str]) -> None:
    command, url, root, *rest = argv
    if command == "fold":
        dsn, truth = rest
        out = fold(url, root, dsn, json.loads(truth))
    elif command == "write":
        out = write(url, root, int(rest[0]))
    else:
        raise SystemExit(f"unknown command {command}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
