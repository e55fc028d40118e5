"""Typed values from pgoutput's text representation, for predicates and for Arrow.

pgoutput sends every column as its type's text output (``messages.py`` keeps it as
``bytes``). Two consumers need types:

* shape predicates read a few columns as Python values: ``python_parser(oid, typmod)``
  returns a function ``bytes -> value`` (``values.python``);
* writers build whole Arrow columns: ``describe(oid, typmod, catalog)`` says what the
  type is (``values.pgtype``; user-defined types need the catalog's description) and
  ``lake_column(pg_type).to_arrow(values)`` converts a column at once, with Arrow's
  vectorized kernels wherever Arrow can parse the text and per-value Python only
  where it cannot (bytea hex, array/composite/range syntax, out-of-range dates)
  (``values.columns``). ``to_arrow(values, oid, typmod)`` and ``arrow_type(oid,
  typmod)`` do the same for built-in types. Every lake type is one Spark 4 reads from
  Parquet and Delta holds.

Assumed session settings (the replication connection and the backfill's COPY
connections set them): DateStyle=ISO, IntervalStyle=postgres, TimeZone=UTC,
extra_float_digits=3, bytea_output=hex (escape-format bytea is still understood).

Mapping decisions (Python value / Arrow type):

* bool -> bool; int2/int4/int8 -> int / int16/int32/int64; oid -> int / int64;
  float4/float8 -> float / float32/float64, with NaN and +-Infinity.
* numeric -> Decimal (NaN, +-Infinity included) / decimal128(p, s) when declared with
  0 <= s <= p <= 38 (by the column, or by the shape: ``amount::numeric(18,4)``);
  otherwise string, which is lossless. A value decimal128(p, s) cannot hold (NaN, and
  for a shape's declaration also infinities, too many digits, more fractional digits
  than the scale) is refused: ``UnfitValue``, never rounded or nulled.
* text, varchar, bpchar, name, "char", json, jsonb, enums -> str / string; uuid ->
  UUID / string; bytea -> bytes / binary.
* date -> date / date32; timestamp -> naive datetime / timestamp[us];
  timestamptz -> datetime in UTC / timestamp[us, UTC] (any +HH[:MM[:SS]] offset).
  'infinity' and '-infinity' map to the largest and smallest Python value
  (date.max, datetime.max = 9999-12-31 23:59:59.999999; date.min, datetime.min =
  0001-01-01), in Python and in Arrow alike, so order is kept.
  BC dates and years after 9999 are exact in Arrow (proleptic Gregorian, as Postgres
  and Spark use); Python's datetime cannot hold them, so the Python parsers raise
  ``UnrepresentableValue`` rather than silently misplace a row in a predicate.
  Timestamps beyond Arrow's range (after about year 294 000) are refused.
* time -> time / int64 microseconds since midnight ('24:00:00' is time.max in Python
  and 86 400 000 000 in Arrow); timetz -> str / struct<microseconds, utc_offset_seconds>;
  interval -> ``Interval(months, days, microseconds)`` ordered like Postgres / struct
  <months: int32, days: int32, microseconds: int64>; point -> str / struct<x, y>
  (``values.arrow_structs`` says why).
* ranges and multiranges -> str / struct<lower, upper, lower_inc, upper_inc,
  lower_inf, upper_inf, empty> and a list of those; composite types -> str / a struct
  of their attributes; one-dimensional arrays of any of these -> list / list<element
  type>; a multi-dimensional value in an array column is refused (``values.columns``).
* any other type (inet, money, box, tsvector ...) -> str / string, counted per oid by
  ``unknown_type_counts()``; never an error.

Errors: text that is not the type's output format raises ``ProtocolError`` (the
session settings above are wrong, or the bytes are corrupt); a valid value the lake
type cannot hold raises ``tidemark.errors.UnfitValue``.
"""

from tidemark.pgoutput.values.array_text import parse_array
from tidemark.pgoutput.values.arrow import unknown_type_counts, unrepresentable_value_counts
from tidemark.pgoutput.values.columns import LakeColumn, arrow_type, lake_column, to_arrow
from tidemark.pgoutput.values.oids import ARRAY_ELEMENT_TYPES, TYPE_NAMES, is_supported
from tidemark.pgoutput.values.pgtype import CatalogType, PgType, TypeCatalog, describe
from tidemark.pgoutput.values.python import Interval, python_parser
from tidemark.pgoutput.values.text_format import UnrepresentableValue

__all__ = [
    "ARRAY_ELEMENT_TYPES",
    "TYPE_NAMES",
    "CatalogType",
    "Interval",
    "LakeColumn",
    "PgType",
    "TypeCatalog",
    "UnrepresentableValue",
    "arrow_type",
    "describe",
    "is_supported",
    "lake_column",
    "parse_array",
    "python_parser",
    "to_arrow",
    "unknown_type_counts",
    "unrepresentable_value_counts",
]
