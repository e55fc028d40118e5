"""Postgres type oids tidemark knows by number, and their SQL names.

Built-in types have fixed oids (``pg_type.dat``); user-defined types (enums,
composites, ranges, domains, arrays of them) are described from the catalog
instead (``tidemark.pgoutput.values.pgtype``).
"""

from __future__ import annotations

from typing import Final

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 114, 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC, UUID_OID, JSONB = (
    1114, 1184, 1186, 1266, 1700, 2950, 3802,
)  # fmt: skip
POINT = 600
INT4RANGE, NUMRANGE, TSRANGE, TSTZRANGE, DATERANGE, INT8RANGE = (
    3904, 3906, 3908, 3910, 3912, 3926,
)  # fmt: skip

#: The first oid of objects created after initdb (user types); below it, built-ins.
FIRST_NORMAL_OID: Final = 16384

#: Built-in range type oid -> its subtype oid.
RANGE_SUBTYPES: Final[dict[int, int]] = {
    INT4RANGE: INT4, NUMRANGE: NUMERIC, TSRANGE: TIMESTAMP, TSTZRANGE: TIMESTAMPTZ,
    DATERANGE: DATE, INT8RANGE: INT8,
}  # fmt: skip

#: Built-in multirange type oid (PostgreSQL 14+) -> its range type oid.
MULTIRANGE_RANGES: Final[dict[int, int]] = {
    4451: INT4RANGE, 4532: NUMRANGE, 4533: TSRANGE, 4534: TSTZRANGE, 4535: DATERANGE,
    4536: INT8RANGE,
}  # fmt: skip

_SCALAR_NAMES: Final = {
    BOOL: "boolean", BYTEA: "bytea", CHAR: '"char"', NAME: "name", INT8: "bigint",
    INT2: "smallint", INT4: "integer", TEXT: "text", OID: "oid", JSON: "json",
    FLOAT4: "real", FLOAT8: "double precision", BPCHAR: "character",
    VARCHAR: "character varying", DATE: "date", TIME: "time without time zone",
    TIMESTAMP: "timestamp without time zone", TIMESTAMPTZ: "timestamp with time zone",
    INTERVAL: "interval", TIMETZ: "time with time zone", NUMERIC: "numeric",
    UUID_OID: "uuid", JSONB: "jsonb", POINT: "point",
    INT4RANGE: "int4range", NUMRANGE: "numrange", TSRANGE: "tsrange", TSTZRANGE: "tstzrange",
    DATERANGE: "daterange", INT8RANGE: "int8range", 4451: "int4multirange",
    4532: "nummultirange", 4533: "tsmultirange", 4534: "tstzmultirange",
    4535: "datemultirange", 4536: "int8multirange",
}  # fmt: skip

#: Array type oid -> element type oid, for the supported element types.
ARRAY_ELEMENT_TYPES: Final[dict[int, int]] = {
    1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4,
    1009: TEXT, 1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR,
    1015: VARCHAR, 1182: DATE, 1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ,
    1187: INTERVAL, 1270: TIMETZ, 1231: NUMERIC, 2951: UUID_OID, 3807: JSONB,
    1017: POINT, 3905: INT4RANGE, 3907: NUMRANGE, 3909: TSRANGE, 3911: TSTZRANGE,
    3913: DATERANGE, 3927: INT8RANGE, 6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534,
    6155: 4535, 6157: 4536,
}  # fmt: skip

#: oid -> SQL type name, for every type with a deliberate mapping.
TYPE_NAMES: Final[dict[int, str]] = {
    **_SCALAR_NAMES,
    **{array: _SCALAR_NAMES[element] + "[]" for array, element in ARRAY_ELEMENT_TYPES.items()},
}


def is_supported(type_oid: int) -> bool:
    """True if the type has a deliberate mapping; otherwise its values stay text."""
    return type_oid in TYPE_NAMES
