"""Postgres text output to Python values, for shape predicates.

``python_parser(oid, typmod)`` returns a function ``bytes -> value`` for one non-null
value (see ``tidemark.pgoutput.values`` for the mapping). Python's ``datetime``
cannot hold BC dates or years after 9999: those raise ``UnrepresentableValue``
rather than silently misplace a row in a predicate.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, Final
from uuid import UUID

from tidemark.errors import ProtocolError
from tidemark.pgoutput.values.array_text import parse_array
from tidemark.pgoutput.values.oids import (
    ARRAY_ELEMENT_TYPES,
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
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TYPE_NAMES,
    UUID_OID,
)
from tidemark.pgoutput.values.text_format import UnrepresentableValue, bad_value


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
        raise bad_value(text, INTERVAL, "'1 year 2 mons 3 days 04:05:06.789'")
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
    raise bad_value(text, BOOL, "'t' or 'f'")


def _parse_int(text: bytes) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad_value(text, "an integer") from None


def _parse_float(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        raise bad_value(text, "a floating-point number") from None


def _parse_numeric(text: bytes) -> Decimal:
    try:
        return Decimal(text.decode("ascii"))
    except (ValueError, InvalidOperation):
        raise bad_value(text, NUMERIC) from None


def _parse_text(text: bytes) -> str:
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_value(text, TEXT, "UTF-8 text") from None


_BYTEA_ESCAPE: Final = re.compile(rb"\\(\\|[0-3][0-7][0-7])")


def parse_bytea(text: bytes) -> bytes:
    if text[:2] == b"\\x":
        try:
            return binascii.a2b_hex(memoryview(text)[2:])
        except (binascii.Error, ValueError):
            raise bad_value(text, BYTEA, "hex format '\\x0a1b'") from None
    if b"\\" not in text:
        return text
    # Escape format (bytea_output=escape): '\\' is a backslash, '\\ooo' an octal byte.
    if b"\\" in _BYTEA_ESCAPE.sub(b"", text):
        raise bad_value(text, BYTEA, "hex format '\\x0a1b'")
    return _BYTEA_ESCAPE.sub(lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1], 8)]), text)


def _parse_uuid(text: bytes) -> UUID:
    try:
        return UUID(text.decode("ascii"))
    except ValueError:
        raise bad_value(text, UUID_OID) from None


def _unrepresentable_or_bad(text: bytes, type_oid: int) -> ProtocolError:
    if text.endswith(b" BC") or _BIG_YEAR.match(text):
        return UnrepresentableValue(
            f"{TYPE_NAMES[type_oid]} value {text!r} is outside Python's years 1-9999; "
            "it is stored exactly in the lake table, but a shape predicate cannot "
            "evaluate it: exclude this column from predicates or the row from the shape"
        )
    return bad_value(text, type_oid, "ISO format")


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
        raise bad_value(text, TIME, "'HH:MM:SS[.ffffff]'") from None


def _parse_timestamp(text: bytes) -> datetime:
    try:
        value = datetime.fromisoformat(text.decode("ascii"))
    except ValueError:
        special = _TIMESTAMP_INFINITY.get(text)
        if special is not None:
            return special
        raise _unrepresentable_or_bad(text, TIMESTAMP) from None
    if value.tzinfo is not None:
        raise bad_value(text, TIMESTAMP, "no time zone offset")
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
        raise bad_value(text, TIMESTAMPTZ, "a +HH[:MM[:SS]] offset")
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
    BYTEA: parse_bytea,
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
