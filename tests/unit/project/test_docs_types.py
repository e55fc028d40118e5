"""The type mapping page (docs/reference/types.md) against the code: every built-in
type a row of its table names gets the lake type the row gives (``lake_column``), so
the page cannot drift from the mapping."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from tidemark.pgoutput.values.columns import lake_column
from tidemark.pgoutput.values.pgtype import describe

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "types.md"

OIDS = {
    "boolean": 16, "smallint": 21, "integer": 23, "bigint": 20, "oid": 26, "real": 700,
    "double precision": 701, "text": 25, "varchar": 1043, "char": 1042, "name": 19,
    '"char"': 18, "json": 114, "jsonb": 3802, "uuid": 2950, "bytea": 17, "date": 1082,
    "timestamp": 1114, "timestamptz": 1184, "time": 1083, "timetz": 1266, "interval": 1186,
    "point": 600, "inet": 869, "money": 790, "box": 603, "tsvector": 3614,
}  # fmt: skip


def spark_name(t: pa.DataType) -> str:
    """An Arrow type as the page writes it (Spark's names)."""
    simple = {
        pa.bool_(): "boolean", pa.int16(): "short", pa.int32(): "int", pa.int64(): "long",
        pa.float32(): "float", pa.float64(): "double", pa.string(): "string",
        pa.large_string(): "string", pa.binary(): "binary", pa.date32(): "date",
    }  # fmt: skip
    if t in simple:
        return simple[t]
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {spark_name(f.type)}" for f in t) + ">"
    raise AssertionError(f"no page name for {t}")


def rows() -> list[tuple[str, str]]:
    """(Postgres type, lake type) for each built-in type the table's rows name."""
    out = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0] or cells[0].startswith(("Postgres", "---")):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if cells[0].startswith("anything else"):
            out += [(n, "string") for n in names]
            continue
        if not cells[0].startswith("`") or any(n not in OIDS for n in names):
            continue  # families (enums, ranges, arrays ...) and typmod rows
        lakes = [cells[1].split(" (")[0]]
        if "," in cells[1] and not cells[1].startswith("struct"):
            lakes = [part.strip() for part in cells[1].split(",")]
        if len(lakes) == 1:
            lakes *= len(names)
        assert len(lakes) == len(names), line
        out += list(zip(names, lakes, strict=True))
    return out


ROWS = rows()


def test_the_page_names_most_built_in_types() -> None:
    assert {n for n, _ in ROWS} == set(OIDS)


@pytest.mark.parametrize(("pg_name", "lake"), ROWS, ids=[n for n, _ in ROWS])
def test_the_page_gives_each_type_its_lake_type(pg_name: str, lake: str) -> None:
    column = lake_column(describe(OIDS[pg_name]))
    assert spark_name(column.arrow_type) == lake
