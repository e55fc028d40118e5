"""The columns of a shape's table: the shape's output columns, then metadata.

Output columns take the Arrow type of their Postgres type
(``tidemark.pgoutput.values.arrow_type``). Every row also carries:

* ``_lsn`` (int64): commit LSN of its transaction (snapshot rows: the snapshot's LSN);
* ``_op`` (int32): its index inside the transaction; ``(_lsn, _op)`` is unique;
* ``_kind`` (string): ``insert | update | delete | truncate | snapshot``;
* ``_xid`` (int64): the source transaction id;
* ``_commit_ts`` (timestamp, UTC): the source commit time;
* ``_unchanged`` (list<string>): output columns whose unchanged TOAST value was not
  sent; the fold carries their previous value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from tidemark.pgoutput.values import arrow_type

LSN = "_lsn"
OP = "_op"
KIND = "_kind"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged"

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(LSN, pa.int64(), nullable=False),
    pa.field(OP, pa.int32(), nullable=False),
    pa.field(KIND, pa.string(), nullable=False),
    pa.field(XID, pa.int64()),
    pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC")),
    pa.field(UNCHANGED, pa.list_(pa.string())),
)
METADATA_NAMES = frozenset(f.name for f in METADATA_FIELDS)


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One output column of a shape, as Postgres describes it."""

    name: str
    type_oid: int
    type_modifier: int = -1

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type_oid, self.type_modifier)


def table_schema(columns: Sequence[ColumnSpec]) -> pa.Schema:
    """The Arrow schema of a shape table with these output columns."""
    clash = [c.name for c in columns if c.name in METADATA_NAMES]
    if clash:
        from tidemark.errors import ShapeError

        raise ShapeError(
            f"column(s) {clash} collide with tidemark's metadata columns; "
            "leave them out of the shape's columns"
        )
    return pa.schema([pa.field(c.name, c.arrow_type) for c in columns] + list(METADATA_FIELDS))


def spark_schema(schema: pa.Schema):
    """The Spark StructType for an Arrow schema (naive timestamps stay TIMESTAMP_NTZ)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)
