"""Read tidemark's tables the way a user's own engine does, without tidemark's code:
DuckDB (``delta_scan``, ``iceberg_scan``: the extensions of its version, installed from
PyPI and loaded from the package's folder), pyiceberg and Polars. An Iceberg table's
metadata file is found in the catalog with plain ``sqlite3`` (the SQL catalog's own
table), as any tool pointed at that catalog would."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from tests.fold_cases import fold_model
from tidemark.demo.verify import normalise


def duck(*extra: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with its Delta and Iceberg extensions (and Avro, which the
    Iceberg one reads manifests with), loaded from the ``duckdb-ext-*`` packages;
    ``extra``: more of them (``httpfs``: S3)."""
    folder = Path(duckdb.__file__).parent.parent / "duckdb_ext" / "extensions"
    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    for name in ("avro", "iceberg", "delta", *extra):
        found = sorted(folder.glob(f"v{duckdb.__version__}/*/{name}.duckdb_extension"))
        assert found, f"no {name} extension for DuckDB {duckdb.__version__} under {folder}"
        con.execute(f"LOAD '{found[0]}'")
    return con


def duck_s3(endpoint: str, key_id: str, secret: str, region: str) -> duckdb.DuckDBPyConnection:
    """``duck`` with ``httpfs`` and an S3 secret for an S3-compatible store at
    ``endpoint`` (path-style), as the reading guide sets it up."""
    con = duck("httpfs")
    scheme, host = endpoint.split("://", 1)
    con.execute(
        f"CREATE SECRET store (TYPE S3, KEY_ID '{key_id}', SECRET '{secret}', "
        f"REGION '{region}', ENDPOINT '{host}', URL_STYLE 'path', "
        f"USE_SSL {'true' if scheme == 'https' else 'false'})"
    )
    return con


def metadata_location(root: Path, namespace: str, name: str) -> str:
    """The current metadata file of an Iceberg table in the default catalog (a SQLite
    file under the sink root), read with sqlite3."""
    with sqlite3.connect(root / "_tidemark" / "iceberg.db") as conn:
        row = conn.execute(
            "select metadata_location from iceberg_tables "
            "where table_namespace = ? and table_name = ?",
            (namespace, name),
        ).fetchone()
    assert row is not None, f"no Iceberg table {namespace}.{name} in the catalog of {root}"
    return str(row[0])


def records(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def changelog_rows(reader: str, root: Path, shape: str, table_format: str) -> list[dict[str, Any]]:
    """A shape's changelog rows as ``reader`` (duckdb, pyiceberg, polars) reads them."""
    if table_format == "delta":
        assert reader == "duckdb"
        return records(duck(), f"select * from delta_scan('{root / 'tables' / shape}')")
    location = metadata_location(root, "tidemark", shape)
    if reader == "duckdb":
        return records(duck(), f"select * from iceberg_scan('{location}')")
    if reader == "pyiceberg":
        from pyiceberg.table import StaticTable

        return StaticTable.from_metadata(location).scan().to_arrow().to_pylist()  # type: ignore[no-any-return]
    assert reader == "polars"
    import polars as pl

    return pl.scan_iceberg(location).collect().to_dicts()


def current_rows(reader: str, root: Path, shape: str, table_format: str) -> list[dict[str, Any]]:
    """A shape's current-state table as ``reader`` reads its newest version."""
    if table_format == "delta":
        return records(duck(), f"select * from delta_scan('{root / 'current' / shape}')")
    location = metadata_location(root, "tidemark_current", shape)
    return records(duck(), f"select * from iceberg_scan('{location}')")


def folded(rows: Sequence[dict[str, Any]], key: Sequence[str]) -> frozenset[tuple[Any, ...]]:
    """The changelog folded (``fold_model``), each row's shape columns normalised."""
    state = fold_model(rows, key)
    return frozenset(tuple(normalise(v) for v in values.values()) for values in state.values())


def plain(rows: Sequence[dict[str, Any]]) -> frozenset[tuple[Any, ...]]:
    """A current table's rows, its shape columns normalised (``_lsn`` left out)."""
    return frozenset(
        tuple(normalise(v) for c, v in r.items() if not c.startswith("_")) for r in rows
    )
