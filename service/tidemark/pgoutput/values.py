"""Typed values from pgoutput's text representation, for predicates and for Arrow.

pgoutput sends every column as its type's text output (``messages.py`` keeps it as
``bytes``). Two consumers need types:

* shape predicates read a few columns as Python values: ``python_parser(oid, typmod)``
  returns a function ``bytes -> value``;
* writers build whole Arrow columns: ``to_arrow(values, oid, typmod)`` converts a
  column at once, with Arrow's vectorized casts wherever Arrow can parse the text and
  per-value Python only where it cannot (bytea hex, array syntax, out-of-range dates);
  ``arrow_type(oid, typmod)`` is the column type, readable by Spark 4 from Parquet.

Assumed session settings (the replication connection sets them): DateStyle=ISO,
IntervalStyle=postgres, TimeZone=UTC, extra_float_digits=3, bytea_output=hex
(escape-format bytea is still understood).

Mapping decisions (Python value / Arrow type):

* bool -> bool; int2/int4/int8 -> int / int16/int32/int64; oid -> int / int64;
  float4/float8 -> float / float32/float64, with NaN and +-Infinity.
* numeric -> Decimal (NaN, +-Infinity included) / decimal128(p, s) when declared with
  0 <= s <= p <= 38; otherwise string, which is lossless. Postgres allows NaN in a
  numeric(p, s) column but decimal128 cannot hold it: such values become null in Arrow
  and are counted by ``unrepresentable_value_counts()``.
* text, varchar, bpchar, name, "char" -> str / string; json, jsonb, timetz -> str /
  string; uuid -> UUID / string; bytea -> bytes / binary.
* date -> date / date32; timestamp -> naive datetime / timestamp[us];
  timestamptz -> datetime in UTC / timestamp[us, UTC] (any +HH[:MM[:SS]] offset).
  'infinity' and '-infinity' map to the largest and smallest Python value
  (date.max, datetime.max = 9999-12-31 23:59:59.999999; date.min, datetime.min =
  0001-01-01), in Python and in Arrow alike, so order is kept.
  BC dates and years after 9999 are exact in Arrow (proleptic Gregorian, as Postgres
  and Spark use); Python's datetime cannot hold them, so the Python parsers raise
  ``UnrepresentableValue`` rather than silently misplace a row in a predicate.
* time -> time / string 'HH:MM:SS[.ffffff]' as Postgres prints it: Spark has no
  portable TIME type, and this text sorts in time order. '24:00:00' (valid in
  Postgres) becomes time.max in Python.
* interval -> ``Interval(months, days, microseconds)`` ordered like Postgres / string.
* one-dimensional arrays of the types above -> list / list<element type>. A
  multi-dimensional value in an array column becomes null in Arrow and is counted
  (the column type cannot depend on the value); Python gets nested lists.
* any other type (enums, domains, ranges, geometry, user types) -> str / string,
  counted per oid by ``unknown_type_counts()``; never an error.

Errors: text that is not the type's output format raises ``ProtocolError`` (the
session settings above are wrong, or the bytes are corrupt).
"""

from __future__ import annotations

import binascii
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, Final
from uuid import UUID

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.errors import ProtocolError

__all__ = [
    "ARRAY_ELEMENT_TYPES",
    "TYPE_NAMES",
    "Interval",
    "UnrepresentableValue",
    "arrow_type",
    "is_supported",
    "parse_array",
    "python_parser",
    "to_arrow",
    "unknown_type_counts",
    "unrepresentable_value_counts",
]

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 114, 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC, UUID_OID, JSONB = (
    1114, 1184, 1186, 1266, 1700, 2950, 3802,
)  # fmt: skip

_SCALAR_NAMES: Final = {
    BOOL: "boolean", BYTEA: "bytea", CHAR: '"char"', NAME: "name", INT8: "bigint",
    INT2: "smallint", INT4: "integer", TEXT: "text", OID: "oid", JSON: "json",
    FLOAT4: "real", FLOAT8: "double precision", BPCHAR: "character",
    VARCHAR: "character varying", DATE: "date", TIME: "time without time zone",
    TIMESTAMP: "timestamp without time zone", TIMESTAMPTZ: "timestamp with time zone",
    INTERVAL: "interval", TIMETZ: "time with time zone", NUMERIC: "numeric",
    UUID_OID: "uuid", JSONB: "jsonb",
}  # fmt: skip

#: Array type oid -> element type oid, for the supported element types.
ARRAY_ELEMENT_TYPES: Final[dict[int, int]] = {
    1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4,
    1009: TEXT, 1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR,
    1015: VARCHAR, 1182: DATE, 1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ,
    1187: INTERVAL, 1270: TIMETZ, 1231: NUMERIC, 2951: UUID_OID, 3807: JSONB,
}  # fmt: skip

#: oid -> SQL type name, for every type with a deliberate mapping.
TYPE_NAMES: Final[dict[int, str]] = {
    **_SCALAR_NAMES,
    **{array: _SCALAR_NAMES[element] + "[]" for array, element in ARRAY_ELEMENT_TYPES.items()},
}

_unknown_types: Counter[int] = Counter()
_unrepresentable: Counter[int] = Counter()


def is_supported(type_oid: int) -> bool:
    """True if the type has a deliberate mapping; otherwise its values stay text."""
    return type_oid in TYPE_NAMES


def unknown_type_counts() -> dict[int, int]:
    """Values converted to Arrow as plain text because their type oid is unknown."""
    return dict(_unknown_types)


def unrepresentable_value_counts() -> dict[int, int]:
    """Values that became null in Arrow because the column type cannot hold them
    (NaN in numeric(p, s), multi-dimensional arrays, invalid UTF-8), per type oid."""
    return dict(_unrepresentable)


class UnrepresentableValue(ProtocolError):
    """A valid Postgres value that the Python type cannot hold (BC dates, year > 9999)."""


def _bad_value(text: bytes, type_oid: int | str, expected: str = "") -> ProtocolError:
    name = type_oid if isinstance(type_oid, str) else TYPE_NAMES.get(type_oid, f"oid {type_oid}")
    hint = f" (expected {expected})" if expected else ""
    return ProtocolError(
        f"cannot read {bytes(text[:80])!r} as {name}{hint}; the replication session must use "
        "DateStyle=ISO, IntervalStyle=postgres, TimeZone=UTC, bytea_output=hex"
    )


# --- Python values ---


@dataclass(frozen=True, slots=True, eq=False)
class Interval:
    """A Postgres interval. Compared like Postgres: by months*30 days + days + time,
    so ``Interval(1, 0, 0) == Interval(0, 30, 0)`` as ``'1 mon' = '30 days'`` is true."""

    months: int
    days: int
    microseconds: int

    @property
    def span(self) -> int:
        """Total length in microseconds, a month counted as 30 days (Postgres's rule)."""
        return (self.months * 30 + self.days) * 86_400_000_000 + self.microseconds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interval) and self.span == other.span

    def __hash__(self) -> int:
        return hash(self.span)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self.span < other.span

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self.span <= other.span

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self.span > other.span

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Interval):
            return NotImplemented
        return self.span >= other.span


_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1
_INTERVAL_TEXT: Final = re.compile(
    rb"(?:([+-]?\d+) years? ?)?(?:([+-]?\d+) mons? ?)?(?:([+-]?\d+) days? ?)?"
    rb"(?:([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
)


def _parse_interval(text: bytes) -> Interval:
    match = _INTERVAL_TEXT.fullmatch(text)
    if match is None or not text:
        if text == b"infinity":  # Postgres 17+
            return Interval(_INT32_MAX, _INT32_MAX, _INT64_MAX)
        if text == b"-infinity":
            return Interval(-_INT32_MAX - 1, -_INT32_MAX - 1, -_INT64_MAX - 1)
        raise _bad_value(text, INTERVAL, "'1 year 2 mons 3 days 04:05:06.789'")
    years, months, days, sign, hours, minutes, seconds, fraction = match.groups()
    micros = 0
    if hours is not None:
        micros = (int(hours) * 3600 + int(minutes) * 60 + int(seconds)) * 1_000_000
        if fraction:
            micros += int(fraction.ljust(6, b"0"))
        if sign == b"-":
            micros = -micros
    return Interval(int(years or 0) * 12 + int(months or 0), int(days or 0), micros)


def _parse_bool(text: bytes) -> bool:
    if text == b"t":
        return True
    if text == b"f":
        return False
    raise _bad_value(text, BOOL, "'t' or 'f'")


def _parse_int(text: bytes) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad_value(text, "an integer") from None


def _parse_float(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        raise _bad_value(text, "a floating-point number") from None


def _parse_numeric(text: bytes) -> Decimal:
    try:
        return Decimal(text.decode("ascii"))
    except (ValueError, InvalidOperation):
        raise _bad_value(text, NUMERIC) from None


def _parse_text(text: bytes) -> str:
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_value(text, TEXT, "UTF-8 text") from None


_BYTEA_ESCAPE: Final = re.compile(rb"\\(\\|[0-3][0-7][0-7])")


def _parse_bytea(text: bytes) -> bytes:
    if text[:2] == b"\\x":
        try:
            return binascii.a2b_hex(memoryview(text)[2:])
        except (binascii.Error, ValueError):
            raise _bad_value(text, BYTEA, "hex format '\\x0a1b'") from None
    if b"\\" not in text:
        return text
    # Escape format (bytea_output=escape): '\\' is a backslash, '\\ooo' an octal byte.
    if b"\\" in _BYTEA_ESCAPE.sub(b"", text):
        raise _bad_value(text, BYTEA, "hex format '\\x0a1b'")
    return _BYTEA_ESCAPE.sub(lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1], 8)]), text)


def _parse_uuid(text: bytes) -> UUID:
    try:
        return UUID(text.decode("ascii"))
    except ValueError:
        raise _bad_value(text, UUID_OID) from None


def _unrepresentable_or_bad(text: bytes, type_oid: int) -> ProtocolError:
    if text.endswith(b" BC") or _BIG_YEAR.match(text):
        return UnrepresentableValue(
            f"{TYPE_NAMES[type_oid]} value {text!r} is outside Python's years 1-9999; "
            "it is stored exactly in the lake table, but a shape predicate cannot "
            "evaluate it: exclude this column from predicates or the row from the shape"
        )
    return _bad_value(text, type_oid, "ISO format")


_BIG_YEAR: Final = re.compile(rb"\d{5,}-")
_DATE_INFINITY: Final = {b"infinity": date.max, b"-infinity": date.min}
_TIMESTAMP_INFINITY: Final = {b"infinity": datetime.max, b"-infinity": datetime.min}
_UTC: Final = UTC
_TIMESTAMPTZ_INFINITY: Final = {
    b"infinity": datetime.max.replace(tzinfo=_UTC),
    b"-infinity": datetime.min.replace(tzinfo=_UTC),
}


def _parse_date(text: bytes) -> date:
    try:
        return date.fromisoformat(text.decode("ascii"))
    except ValueError:
        special = _DATE_INFINITY.get(text)
        if special is not None:
            return special
        raise _unrepresentable_or_bad(text, DATE) from None


def _parse_time(text: bytes) -> time:
    try:
        return time.fromisoformat(text.decode("ascii"))
    except ValueError:
        if text == b"24:00:00":
            return time.max
        raise _bad_value(text, TIME, "'HH:MM:SS[.ffffff]'") from None


def _parse_timestamp(text: bytes) -> datetime:
    try:
        value = datetime.fromisoformat(text.decode("ascii"))
    except ValueError:
        special = _TIMESTAMP_INFINITY.get(text)
        if special is not None:
            return special
        raise _unrepresentable_or_bad(text, TIMESTAMP) from None
    if value.tzinfo is not None:
        raise _bad_value(text, TIMESTAMP, "no time zone offset")
    return value


def _parse_timestamptz(text: bytes) -> datetime:
    try:
        value = datetime.fromisoformat(text.decode("ascii"))
    except ValueError:
        special = _TIMESTAMPTZ_INFINITY.get(text)
        if special is not None:
            return special
        raise _unrepresentable_or_bad(text, TIMESTAMPTZ) from None
    if value.tzinfo is _UTC:
        return value
    if value.tzinfo is None:
        raise _bad_value(text, TIMESTAMPTZ, "a +HH[:MM[:SS]] offset")
    try:
        return value.astimezone(_UTC)
    except OverflowError:  # e.g. 0001-01-01 00:00:00+05 is in year 0 in UTC
        raise UnrepresentableValue(
            f"{TYPE_NAMES[TIMESTAMPTZ]} value {text!r} is outside Python's years 1-9999 in "
            "UTC; it is stored exactly in the lake table, but a shape predicate cannot "
            "evaluate it"
        ) from None


_PYTHON_PARSERS: Final[dict[int, Callable[[bytes], Any]]] = {
    BOOL: _parse_bool,
    BYTEA: _parse_bytea,
    INT2: _parse_int,
    INT4: _parse_int,
    INT8: _parse_int,
    OID: _parse_int,
    FLOAT4: _parse_float,
    FLOAT8: _parse_float,
    NUMERIC: _parse_numeric,
    UUID_OID: _parse_uuid,
    DATE: _parse_date,
    TIME: _parse_time,
    TIMESTAMP: _parse_timestamp,
    TIMESTAMPTZ: _parse_timestamptz,
    INTERVAL: _parse_interval,
}


def python_parser(type_oid: int, type_modifier: int = -1) -> Callable[[bytes], Any]:
    """A function turning one non-null text value of the type into a Python value.

    Text types, json, timetz and unknown types give ``str``. Arrays give lists
    (nested for several dimensions) whose NULL elements are ``None``.
    """
    element = ARRAY_ELEMENT_TYPES.get(type_oid)
    if element is not None:
        parse_element = python_parser(element, type_modifier)

        def parse_array_value(text: bytes) -> list[Any]:
            return parse_array(text, parse_element)

        return parse_array_value
    return _PYTHON_PARSERS.get(type_oid, _parse_text)


# --- array text syntax ---


def parse_array(text: bytes, parse_element: Callable[[bytes], Any] = bytes) -> list[Any]:
    """Parse Postgres array text ('{1,NULL,"a \\"b\\""}', '{{1,2},{3,4}}',
    '[0:1]={1,2}') into nested lists; each non-null element goes through
    ``parse_element``. Lower bounds are dropped: Python lists start at 0."""
    raw = _split_array(text)
    return _map_elements(raw, parse_element)


def _map_elements(items: list[Any], parse_element: Callable[[bytes], Any]) -> list[Any]:
    return [
        None
        if item is None
        else _map_elements(item, parse_element)
        if isinstance(item, list)
        else parse_element(item)
        for item in items
    ]


def _split_array(text: bytes) -> list[Any]:
    """Array text -> nested lists of raw element bytes (unquoted, unescaped) or None."""
    body = text
    if body[:1] == b"[":  # dimension decoration '[lb:ub]...=' before the braces
        equals = body.find(b"=")
        if equals < 0:
            raise _bad_array(text, "dimension decoration without '='")
        body = body[equals + 1 :]
    if len(body) < 2 or body[0] != 0x7B or body[-1] != 0x7D:  # '{' ... '}'
        raise _bad_array(text, "not enclosed in braces")
    inner = body[1:-1]
    # The common case: one dimension, nothing quoted ('"'), escaped ('\\'), nested ('{')
    # or padded (' '; Postgres quotes elements with spaces). Byte membership tests are
    # memchr calls, several times faster here than bytes-in-bytes tests.
    if 0x22 not in inner and 0x5C not in inner and 0x7B not in inner and 0x20 not in inner:
        if not inner:
            return []
        items: list[Any] = inner.split(b",")
        if 0x4E in inner or 0x6E in inner:  # an 'N' or 'n': maybe a NULL element
            return [None if _is_null(item) else item for item in items]
        return items
    try:
        items, end = _split_level(body, 0)
    except (IndexError, ValueError):  # ran off the end; bytes.index found no closing quote
        raise _bad_array(text, "unbalanced braces or quotes") from None
    if body[end:].strip():
        raise _bad_array(text, "trailing characters after the closing brace")
    return items


def _is_null(item: bytes) -> bool:
    return len(item) == 4 and item.upper() == b"NULL"


def _split_level(body: bytes, pos: int) -> tuple[list[Any], int]:
    """Parse one '{...}' level starting at ``body[pos] == '{'``; return items and end."""
    items: list[Any] = []
    pos += 1
    while body[pos] in b" \t\n":
        pos += 1
    if body[pos] == 0x7D:  # '}': empty
        return items, pos + 1
    while True:
        while body[pos] in b" \t\n":
            pos += 1
        char = body[pos]
        if char == 0x7B:  # '{'
            sub, pos = _split_level(body, pos)
            items.append(sub)
        elif char == 0x22:  # '"'
            value, pos = _quoted(body, pos + 1)
            items.append(value)
        else:
            start = pos
            while body[pos] not in b",}":
                pos += 1
            raw = body[start:pos].strip()
            if b"\\" in raw:
                raw = re.sub(rb"\\(.)", rb"\1", raw, flags=re.DOTALL)
                items.append(raw)
            else:
                items.append(None if _is_null(raw) else raw)
        while body[pos] in b" \t\n":
            pos += 1
        if body[pos] == 0x2C:  # ','
            pos += 1
        elif body[pos] == 0x7D:  # '}'
            return items, pos + 1
        else:
            raise _bad_array(body, f"unexpected {bytes([body[pos]])!r} at byte {pos}")


def _quoted(body: bytes, pos: int) -> tuple[bytes, int]:
    """Read a quoted element whose content starts at ``pos``; return it unescaped."""
    parts = []
    while True:
        quote = body.index(b'"', pos)
        backslash = body.find(b"\\", pos, quote)
        if backslash < 0:
            parts.append(body[pos:quote])
            return b"".join(parts), quote + 1
        parts.append(body[pos:backslash])
        parts.append(body[backslash + 1 : backslash + 2])
        pos = backslash + 2


def _bad_array(text: bytes, why: str) -> ProtocolError:
    return ProtocolError(
        f"cannot read {bytes(text[:80])!r} as a Postgres array: {why}; "
        "expected array_out text such as '{1,NULL,\"a b\"}'"
    )


# --- Arrow columns ---

_STRING: Final = pa.string()
_BINARY: Final = pa.binary()
_ARROW_TYPES: Final[dict[int, pa.DataType]] = {
    BOOL: pa.bool_(),
    BYTEA: _BINARY,
    INT2: pa.int16(),
    INT4: pa.int32(),
    INT8: pa.int64(),
    OID: pa.int64(),  # oid is unsigned 32-bit; Spark has no unsigned types
    FLOAT4: pa.float32(),
    FLOAT8: pa.float64(),
    DATE: pa.date32(),
    TIMESTAMP: pa.timestamp("us"),
    TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
}


def _numeric_decimal(type_modifier: int) -> pa.DataType | None:
    """decimal128(p, s) for numeric(p, s) when Arrow and Spark hold it exactly."""
    if type_modifier < 4:  # -1: declared without precision, any size
        return None
    packed = type_modifier - 4  # VARHDRSZ, as Postgres stores it
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 0x400) - 0x400  # 11-bit signed since Postgres 15
    if 1 <= precision <= 38 and 0 <= scale <= precision:
        return pa.decimal128(precision, scale)
    return None


def arrow_type(type_oid: int, type_modifier: int = -1) -> pa.DataType:
    """The Arrow type of a column of this Postgres type (see the module docstring)."""
    element = ARRAY_ELEMENT_TYPES.get(type_oid)
    if element is not None:
        return pa.list_(arrow_type(element, type_modifier))
    if type_oid == NUMERIC:
        decimal = _numeric_decimal(type_modifier)
        return _STRING if decimal is None else decimal
    return _ARROW_TYPES.get(type_oid, _STRING)


def to_arrow(
    values: Sequence[bytes | None] | pa.Array, type_oid: int, type_modifier: int = -1
) -> pa.Array:
    """Convert one column of text values (``None`` for NULL) to ``arrow_type(...)``.

    ``values`` is a Python sequence of text bytes (the stream) or an Arrow string or
    binary array (a snapshot read with COPY): the bulk casts take either as is.
    Callers pass ``None`` for unchanged TOAST values too (the sink records them in
    ``_unchanged``). Raises ``ProtocolError`` only for text that a known type never
    outputs; unknown types and unrepresentable values never raise (they are counted).
    """
    element = ARRAY_ELEMENT_TYPES.get(type_oid)
    if isinstance(values, pa.Array):
        values = values if values.type == _BINARY else values.cast(_BINARY)
        if element is not None or type_oid == BYTEA:  # converters that loop in Python
            values = values.to_pylist()
    if element is not None:
        return _list_column(values, type_oid, element, type_modifier)
    if type_oid == NUMERIC:
        decimal = _numeric_decimal(type_modifier)
        if decimal is not None:
            return _decimal_column(values, decimal)
    else:
        convert = _ARROW_CONVERTERS.get(type_oid)
        if convert is not None:
            return convert(values)
        if type_oid not in TYPE_NAMES:
            _unknown_types[type_oid] += len(values)
    return _string_column(values, type_oid)


def _column_error(type_oid: int, target: pa.DataType, exc: Exception) -> ProtocolError:
    return ProtocolError(
        f"cannot convert a {TYPE_NAMES.get(type_oid, f'oid {type_oid}')} column to Arrow "
        f"{target}: {exc}; the replication session must use DateStyle=ISO, "
        "IntervalStyle=postgres, TimeZone=UTC, bytea_output=hex"
    )


def _utf8(values: Sequence[bytes | None]) -> pa.Array:
    """A string array of the values; ArrowInvalid if one is not UTF-8.

    Building binary and casting (which validates UTF-8 in one pass) takes half the time
    of building a string array from Python bytes directly.
    """
    return pa.array(values, _BINARY).cast(_STRING)


def _string_column(values: Sequence[bytes | None], type_oid: int) -> pa.Array:
    try:
        return _utf8(values)
    except pa.ArrowInvalid:
        pass
    # Only a database whose encoding is SQL_ASCII sends bytes that are not UTF-8: keep
    # the row, replace the bad bytes, and count it.
    text: list[str | None] = []
    for value in values:
        if value is None:
            text.append(None)
            continue
        try:
            text.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            text.append(value.decode("utf-8", errors="replace"))
            _unrepresentable[type_oid] += 1
    return pa.array(text, _STRING)


def _cast_column(type_oid: int) -> Callable[[Sequence[bytes | None]], pa.Array]:
    target = _ARROW_TYPES[type_oid]

    def cast(values: Sequence[bytes | None]) -> pa.Array:
        try:
            return pc.cast(pa.array(values, _BINARY), target)
        except pa.ArrowInvalid as exc:
            raise _column_error(type_oid, target, exc) from None

    return cast


_TRUE: Final = pa.scalar(b"t", _BINARY)
_FALSE: Final = pa.scalar(b"f", _BINARY)
_NAN: Final = pa.scalar(b"NaN", _BINARY)
_NULL_BINARY: Final = pa.scalar(None, _BINARY)
_NULL_STRING: Final = pa.scalar(None, _STRING)


def _bool_column(values: Sequence[bytes | None]) -> pa.Array:
    text = pa.array(values, _BINARY)
    is_true = pc.equal(text, _TRUE)
    # all() of an empty or all-null column is null, not false: only false is an error
    if pc.all(pc.or_(is_true, pc.equal(text, _FALSE))).as_py() is False:
        raise _column_error(BOOL, pa.bool_(), ValueError("a value is neither 't' nor 'f'"))
    return is_true


def _decimal_column(values: Sequence[bytes | None], target: pa.DataType) -> pa.Array:
    text = pa.array(values, _BINARY)
    try:
        return pc.cast(text, target)
    except pa.ArrowInvalid as exc:
        error = exc
    is_nan = pc.equal(text, _NAN)
    nan_count = pc.sum(is_nan).as_py() or 0
    if not nan_count:
        raise _column_error(NUMERIC, target, error)
    _unrepresentable[NUMERIC] += nan_count
    try:
        return pc.cast(pc.if_else(is_nan, _NULL_BINARY, text), target)
    except pa.ArrowInvalid as exc:
        raise _column_error(NUMERIC, target, exc) from None


def _bytea_column(values: Sequence[bytes | None]) -> pa.Array:
    # Arrow has no hex decoding kernel: this is the one per-value Python loop.
    return pa.array([None if v is None else _parse_bytea(v) for v in values], _BINARY)


# Dates and timestamps: Arrow parses plain ISO text; what it cannot (infinities, BC,
# years beyond 9999, offsets with seconds) is computed exactly here, per value, for
# those values only.
_ISO_DATE: Final = r"^\d{4}-\d\d-\d\d"
_ISO_TIME: Final = r" \d\d:\d\d:\d\d(\.\d{1,6})?"
_PLAIN_ISO: Final = {
    DATE: _ISO_DATE + "$",
    TIMESTAMP: _ISO_DATE + _ISO_TIME + "$",
    TIMESTAMPTZ: _ISO_DATE + _ISO_TIME + r"[+-]\d\d(:\d\d)?$",
}
_EXOTIC: Final = re.compile(
    rb"(\d+)-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    rb"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)
_DAY_US: Final = 86_400_000_000


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar; year 0 is 1 BC."""
    # Count from 0000-03-01 so the leap day ends the year; eras of 400 years repeat.
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


_MAX_DAY: Final = _days_from_civil(9999, 12, 31)
_MIN_DAY: Final = _days_from_civil(1, 1, 1)
_INFINITIES: Final = {
    DATE: {b"infinity": _MAX_DAY, b"-infinity": _MIN_DAY},
    TIMESTAMP: {b"infinity": (_MAX_DAY + 1) * _DAY_US - 1, b"-infinity": _MIN_DAY * _DAY_US},
}
_INFINITIES[TIMESTAMPTZ] = _INFINITIES[TIMESTAMP]


def _exotic_temporal(text: bytes, type_oid: int) -> int:
    """Days (date) or microseconds since 1970 UTC (timestamps) of one value."""
    special = _INFINITIES[type_oid].get(text)
    if special is not None:
        return special
    match = _EXOTIC.fullmatch(text)
    has_time = match is not None and match[4] is not None
    has_offset = match is not None and match[8] is not None
    if match is None or has_time != (type_oid != DATE) or has_offset != (type_oid == TIMESTAMPTZ):
        raise _bad_value(text, type_oid, "ISO format")
    year = int(match[1])
    if match[12]:
        year = 1 - year
    month, day = int(match[2]), int(match[3])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise _bad_value(text, type_oid, "ISO format")
    days = _days_from_civil(year, month, day)
    if type_oid == DATE:
        return days
    seconds = int(match[4]) * 3600 + int(match[5]) * 60 + int(match[6])
    micros = days * _DAY_US + seconds * 1_000_000 + int((match[7] or b"").ljust(6, b"0"))
    if has_offset:
        offset = int(match[9]) * 3600 + int(match[10] or 0) * 60 + int(match[11] or 0)
        micros -= offset * 1_000_000 if match[8] == b"+" else -offset * 1_000_000
    return micros


def _temporal_column(type_oid: int) -> Callable[[Sequence[bytes | None]], pa.Array]:
    target = _ARROW_TYPES[type_oid]
    plain_pattern = _PLAIN_ISO[type_oid]
    storage = pa.int32() if type_oid == DATE else pa.int64()

    def convert(values: Sequence[bytes | None]) -> pa.Array:
        try:
            text = _utf8(values)
        except pa.ArrowInvalid as exc:  # not UTF-8: no date or timestamp text
            raise _column_error(type_oid, target, exc) from None
        try:
            return pc.cast(text, target)
        except pa.ArrowInvalid:
            pass
        plain = pc.match_substring_regex(text, plain_pattern)
        try:
            parsed = pc.cast(pc.if_else(plain, text, _NULL_STRING), target)
        except pa.ArrowInvalid as exc:
            raise _column_error(type_oid, target, exc) from None
        exotic: list[int | None] = [None] * len(values)
        for index in pc.indices_nonzero(pc.invert(plain)).to_pylist():
            value = values[index]
            if isinstance(value, pa.Scalar):  # an Arrow column (snapshot)
                value = value.as_py()
            exotic[index] = _exotic_temporal(value, type_oid)
        try:
            exotic_array = pa.array(exotic, storage)
        except (pa.ArrowInvalid, OverflowError):  # beyond what Arrow's storage holds
            exotic = [_in_range(v, storage, type_oid) for v in exotic]
            exotic_array = pa.array(exotic, storage)
        return pc.if_else(plain, parsed, exotic_array.cast(target))

    return convert


def _in_range(value: int | None, storage: pa.DataType, type_oid: int) -> int | None:
    limit = 2**31 if storage == pa.int32() else 2**63
    if value is None or -limit <= value < limit:
        return value
    _unrepresentable[type_oid] += 1
    return None


def _list_column(
    values: Sequence[bytes | None], type_oid: int, element: int, type_modifier: int
) -> pa.Array:
    # Arrow cannot parse array text: split per value in Python, then convert all
    # elements of the batch as one column.
    offsets = [0]
    is_null: list[bool] = []
    flat: list[bytes | None] = []
    for value in values:
        if value is None:
            is_null.append(True)
        else:
            items = _split_array(value)
            if value.count(b"{") > 1 and any(isinstance(item, list) for item in items):
                _unrepresentable[type_oid] += 1  # several dimensions: no list<...> fits
                is_null.append(True)
            else:
                flat.extend(items)
                is_null.append(False)
        offsets.append(len(flat))
    elements = to_arrow(flat, element, type_modifier)
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), elements, mask=pa.array(is_null, pa.bool_())
    )


_ARROW_CONVERTERS: Final[dict[int, Callable[[Sequence[bytes | None]], pa.Array]]] = {
    BOOL: _bool_column,
    BYTEA: _bytea_column,
    INT2: _cast_column(INT2),
    INT4: _cast_column(INT4),
    INT8: _cast_column(INT8),
    OID: _cast_column(OID),
    FLOAT4: _cast_column(FLOAT4),
    FLOAT8: _cast_column(FLOAT8),
    DATE: _temporal_column(DATE),
    TIMESTAMP: _temporal_column(TIMESTAMP),
    TIMESTAMPTZ: _temporal_column(TIMESTAMPTZ),
}
