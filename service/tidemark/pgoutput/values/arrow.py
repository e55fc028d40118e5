"""Columns of built-in scalar types to Arrow arrays, a whole column at a time.

``scalar_converter(pg_type)`` converts a column with Arrow's vectorized casts wherever
Arrow can parse the text and per-value Python only where it cannot (bytea hex,
out-of-range dates); ``scalar_arrow_type(oid, typmod)`` is the column type (see
``tidemark.pgoutput.values`` for the mapping, ``values.columns`` for the types built
from others). ``values`` is a Python sequence of text bytes (the stream) or an Arrow
binary array (a snapshot read with COPY).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.errors import ProtocolError, UnfitValue
from tidemark.pgoutput.values.arrow_structs import (
    INTERVAL_TYPE,
    POINT_TYPE,
    TIME_TYPE,
    TIMETZ_TYPE,
    Converter,
    interval_column,
    point_column,
    time_column,
    timetz_column,
)
from tidemark.pgoutput.values.oids import (
    BOOL,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    NUMERIC,
    OID,
    POINT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    TYPE_NAMES,
)
from tidemark.pgoutput.values.pgtype import PgType, numeric_precision_scale
from tidemark.pgoutput.values.python import parse_bytea
from tidemark.pgoutput.values.text_format import SESSION_HINT, bad_value

_unknown_types: Counter[int] = Counter()
_unrepresentable: Counter[int] = Counter()


def unknown_type_counts() -> dict[int, int]:
    """Values converted to Arrow as plain text because their type oid is unknown."""
    return dict(_unknown_types)


def unrepresentable_value_counts() -> dict[int, int]:
    """Text values whose bytes were not UTF-8 (a SQL_ASCII database), kept with the
    bad bytes replaced, per type oid."""
    return dict(_unrepresentable)


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
    TIME: TIME_TYPE,
    TIMETZ: TIMETZ_TYPE,
    INTERVAL: INTERVAL_TYPE,
    POINT: POINT_TYPE,
}


def numeric_decimal(type_modifier: int) -> pa.DataType | None:
    """decimal128(p, s) for numeric(p, s) when Arrow and Spark hold it exactly."""
    declared = numeric_precision_scale(type_modifier)
    if declared is None:
        return None
    precision, scale = declared
    if 1 <= precision <= 38 and 0 <= scale <= precision:
        return pa.decimal128(precision, scale)
    return None


def scalar_arrow_type(type_oid: int, type_modifier: int = -1) -> pa.DataType:
    """The Arrow type of a built-in scalar type (``PgType`` kind ``scalar``)."""
    if type_oid == NUMERIC:
        decimal = numeric_decimal(type_modifier)
        return _STRING if decimal is None else decimal
    return _ARROW_TYPES.get(type_oid, _STRING)


def scalar_converter(pg_type: PgType) -> tuple[Converter, bool]:
    """The converter of a built-in scalar type, and whether it loops over Python
    values (it wants a list, not an Arrow array)."""
    if pg_type.oid == NUMERIC:
        decimal = numeric_decimal(pg_type.typmod)
        if decimal is None:
            return string_converter(NUMERIC, count_unknown=False), False
        return _decimal_converter(decimal, pg_type), False
    convert = _ARROW_CONVERTERS.get(pg_type.oid)
    if convert is not None:
        return convert, pg_type.oid == BYTEA
    return string_converter(pg_type.oid, count_unknown=False), False


def string_converter(type_oid: int, *, count_unknown: bool) -> Converter:
    """Text kept as Postgres prints it; ``count_unknown``: count the values as of a
    type without a deliberate mapping (``unknown_type_counts``)."""

    def convert(values: Sequence[bytes | None]) -> pa.Array:
        if count_unknown:
            _unknown_types[type_oid] += len(values)
        return _string_column(values, type_oid)

    return convert


def _column_error(type_oid: int, target: pa.DataType, exc: Exception) -> ProtocolError:
    return ProtocolError(
        f"cannot convert a {TYPE_NAMES.get(type_oid, f'oid {type_oid}')} column to Arrow "
        f"{target}: {exc}; {SESSION_HINT}"
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
_NULL_STRING: Final = pa.scalar(None, _STRING)


def _bool_column(values: Sequence[bytes | None]) -> pa.Array:
    text = pa.array(values, _BINARY)
    is_true = pc.equal(text, _TRUE)
    # all() of an empty or all-null column is null, not false: only false is an error
    if pc.all(pc.or_(is_true, pc.equal(text, _FALSE))).as_py() is False:
        raise _column_error(BOOL, pa.bool_(), ValueError("a value is neither 't' nor 'f'"))
    return is_true


def _decimal_converter(target: pa.DataType, pg_type: PgType) -> Converter:
    source = f"{pg_type.name}, declared by the shape" if pg_type.declared else pg_type.name
    lake_type = f"{target} (the lake type of {source})"

    def convert(values: Sequence[bytes | None]) -> pa.Array:
        text = pa.array(values, _BINARY)
        try:
            return pc.cast(text, target)
        except pa.ArrowInvalid as exc:
            raise _unfit_decimal(text, target, lake_type, exc, pg_type.declared) from None

    return convert


def _unfit_decimal(
    text: pa.Array, target: pa.Decimal128Type, lake_type: str, error: Exception, declared: bool
) -> Exception:
    """The refusal of the first value that ``target`` cannot hold exactly. In a column
    Postgres declares numeric(p, s), only NaN can be such a value: anything else is
    text Postgres never outputs (ProtocolError)."""
    for value in text.to_pylist():
        if value is None:
            continue
        try:
            pc.cast(pa.array([value], _BINARY), target)
            continue
        except pa.ArrowInvalid:
            pass
        try:
            number = Decimal(value.decode("ascii"))
        except (UnicodeDecodeError, InvalidOperation):
            return _column_error(NUMERIC, target, error)
        if number.is_nan():
            return UnfitValue(value, lake_type, "NaN has no decimal value")
        if not declared:
            break
        if number.is_infinite():
            return UnfitValue(value, lake_type, "an infinite value has no decimal value")
        exact = number.normalize()
        exponent = int(exact.as_tuple().exponent)
        fraction = max(0, -exponent)
        if fraction > target.scale:
            return UnfitValue(
                value,
                lake_type,
                f"it has {fraction} digits after the decimal point and the scale is "
                f"{target.scale}; tidemark does not round",
            )
        whole = max(0, exact.adjusted() + 1)
        return UnfitValue(
            value,
            lake_type,
            f"it has {whole} digits before the decimal point and {target} holds "
            f"{target.precision - target.scale}",
        )
    return _column_error(NUMERIC, target, error)


def _bytea_column(values: Sequence[bytes | None]) -> pa.Array:
    # Arrow has no hex decoding kernel: this is the one per-value Python loop.
    return pa.array([None if v is None else parse_bytea(v) for v in values], _BINARY)


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
        raise bad_value(text, type_oid, "ISO format")
    year = int(match[1])
    if match[12]:
        year = 1 - year
    month, day = int(match[2]), int(match[3])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise bad_value(text, type_oid, "ISO format")
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
    limit = 2**31 if type_oid == DATE else 2**63

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
            exotic[index] = number = _exotic_temporal(value, type_oid)
            if not -limit <= number < limit:
                raise UnfitValue(
                    value,
                    f"{target} (the lake type of {TYPE_NAMES[type_oid]})",
                    "it is beyond what a 64-bit count of microseconds since 1970 holds "
                    "(about 292 000 years either side)",
                )
        exotic_array = pa.array(exotic, storage)
        return pc.if_else(plain, parsed, exotic_array.cast(target))

    return convert


_ARROW_CONVERTERS: Final[dict[int, Converter]] = {
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
    TIME: time_column,
    TIMETZ: timetz_column,
    INTERVAL: interval_column,
    POINT: point_column,
}
