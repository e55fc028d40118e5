"""The columns of a shape's table: the shape's output columns, then metadata.

Output columns take the Arrow type of their Postgres type, as the catalog describes
it (``tidemark.pgoutput.values``: ``describe`` and ``lake_column``), or the lake type
the shape declares (``amount::numeric(18,4)``). Every row also carries:

* ``_lsn`` (int64): commit LSN of its transaction (snapshot rows: the snapshot's LSN);
* ``_op`` (int64): its index inside the transaction (snapshot rows: inside the
  snapshot); ``(_lsn, _op)`` is unique. A table created when ``_op`` was int32 keeps
  int32 (``table_schema(..., op_type)``) until its next backfill or resync, which
  rewrites it with an int64 ``_op`` (``ShapeWriter.widen_op``);
* ``_kind`` (string): ``insert | update | delete | truncate | snapshot``;
* ``_xid`` (int64): the source transaction id;
* ``_commit_ts`` (timestamp, UTC): the source commit time;
* ``_unchanged`` (list<string>): output columns whose unchanged TOAST value was not
  sent; the fold carries their previous value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from tidemark.pgoutput.values import LakeColumn, PgType, describe, lake_column

if TYPE_CHECKING:
    from tidemark.shapes.model import BoundShape

LSN = "_lsn"
OP = "_op"
KIND = "_kind"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged"

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(LSN, pa.int64(), nullable=False),
    pa.field(OP, pa.int64(), nullable=False),
    pa.field(KIND, pa.string(), nullable=False),
    pa.field(XID, pa.int64()),
    pa.field(COMMIT_TS, pa.timestamp("us", tz="UTC")),
    pa.field(UNCHANGED, pa.list_(pa.string())),
)
METADATA_NAMES = frozenset(f.name for f in METADATA_FIELDS)


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One output column of a shape, as Postgres describes it.

    ``pg_type`` is the column's full description (catalog types, declared casts);
    without it the column is described from its oid alone (built-in types)."""

    name: str
    type_oid: int
    type_modifier: int = -1
    pg_type: PgType | None = None

    @property
    def lake(self) -> LakeColumn:
        return lake_column(self.pg_type or describe(self.type_oid, self.type_modifier))

    @property
    def arrow_type(self) -> pa.DataType:
        return self.lake.arrow_type


def column_specs(shape: BoundShape) -> list[ColumnSpec]:
    """The shape's output columns with their lake types: the catalog's description of
    each column's type (``shape.types``), or the type the shape declares for it."""
    casts = shape.definition.casts
    specs = []
    for c in shape.output_columns:
        pg_type = describe(c.type_oid, c.type_modifier, shape.types)
        cast = casts.get(c.name)
        if cast is not None:
            pg_type = cast.lake_type(pg_type)
        specs.append(ColumnSpec(c.name, c.type_oid, c.type_modifier, pg_type))
    return specs


def table_schema(columns: Sequence[ColumnSpec], op_type: pa.DataType | None = None) -> pa.Schema:
    """The Arrow schema of a shape table with these output columns; ``op_type``: the
    type of an existing table's ``_op`` (int32 in tables made before it was int64)."""
    clash = [c.name for c in columns if c.name in METADATA_NAMES]
    if clash:
        from tidemark.errors import ShapeError

        raise ShapeError(
            f"column(s) {clash} collide with tidemark's metadata columns; "
            "leave them out of the shape's columns"
        )
    metadata = [
        f.with_type(op_type) if f.name == OP and op_type is not None else f for f in METADATA_FIELDS
    ]
    return pa.schema([pa.field(c.name, c.arrow_type) for c in columns] + metadata)


PRIMARY_KEY_META = b"tidemark.primary_key"


def with_primary_key(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """``schema`` with the key recorded in its fields' metadata (position in the key)."""
    position = {name: i for i, name in enumerate(primary_key)}
    fields = []
    for field in schema:
        meta = {k: v for k, v in (field.metadata or {}).items() if k != PRIMARY_KEY_META}
        if field.name in position:
            meta[PRIMARY_KEY_META] = str(position[field.name]).encode()
        fields.append(field.with_metadata(meta or None))
    return pa.schema(fields, metadata=schema.metadata)


def is_row_key(columns: Sequence[str], primary_key: Sequence[str]) -> bool:
    """Whether the key is every column of the shape (a table without a primary key: the
    whole row is the key), so a row may be there several times and the fold counts
    copies (``tidemark.sink.fold``)."""
    return set(columns) <= set(primary_key)


def primary_key_of(schema: pa.Schema) -> list[str]:
    """The key recorded by ``with_primary_key`` (empty if none)."""
    keyed = [
        (int(f.metadata[PRIMARY_KEY_META]), f.name)
        for f in schema
        if f.metadata and PRIMARY_KEY_META in f.metadata
    ]
    return [name for _, name in sorted(keyed)]


def spark_schema(schema: pa.Schema):
    """The Spark StructType for an Arrow schema (naive timestamps stay TIMESTAMP_NTZ)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def current_schema(changelog: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The current table's schema: the changelog's shape columns, then ``_lsn``."""
    fields = [f for f in changelog if f.name not in METADATA_NAMES]
    fields.append(changelog.field(LSN))
    return with_primary_key(pa.schema(fields), primary_key)
