"""Built-in types whose lake column is a number or a struct of numbers, read with
Arrow's regex kernels a whole column at a time (no per-value Python).

* ``time`` -> int64, microseconds since midnight (``24:00:00`` is 86 400 000 000).
  Neither Delta nor Spark 4.3's Parquet writer can hold a TIME type: Delta's protocol
  has none (deltalake refuses Arrow ``time64``) and Spark refuses TIME unless a preview
  flag is set. The integer is exact and orders like the time.
* ``timetz`` -> struct<microseconds: int64, utc_offset_seconds: int32>: the local time
  of day as written and its offset east of UTC (``12:00:00+05:30`` -> 43 200 000 000,
  19 800), as ``extract(timezone from t)`` gives it.
* ``interval`` -> struct<months: int32, days: int32, microseconds: int64>: Postgres's
  own three fields, so nothing is normalised away (``'1 mon'`` and ``'30 days'`` stay
  different, as Postgres stores them). Arrow's month-day-nano interval would say the
  same but Spark cannot write it to Parquet and Delta has no interval type. Infinite
  intervals (PostgreSQL 17) are Postgres's own encoding: all three fields at their
  maximum (``infinity``) or minimum (``-infinity``).
* ``point`` -> struct<x: float64, y: float64>.

Text is read as Postgres prints it with ``IntervalStyle=postgres``; anything else
raises ``ProtocolError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.pgoutput.values.text_format import bad_value

_INT32: Final = pa.int32()
_INT64: Final = pa.int64()
_FLOAT64: Final = pa.float64()
_STRING: Final = pa.string()
_BINARY: Final = pa.binary()

TIME_TYPE: Final = _INT64
TIMETZ_TYPE: Final = pa.struct([("microseconds", _INT64), ("utc_offset_seconds", _INT32)])
INTERVAL_TYPE: Final = pa.struct([("months", _INT32), ("days", _INT32), ("microseconds", _INT64)])
POINT_TYPE: Final = pa.struct([("x", _FLOAT64), ("y", _FLOAT64)])

_CLOCK: Final = r"(?P<h>\d+):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,6}))?"
_TIME: Final = "^" + _CLOCK + "$"
_TIMETZ: Final = "^" + _CLOCK + r"(?P<zs>[+-])(?P<zh>\d\d)(?::(?P<zm>\d\d))?(?::(?P<zsec>\d\d))?$"
_INTERVAL: Final = (
    r"^(?:(?P<y>[+-]?\d+) years? ?)?(?:(?P<mo>[+-]?\d+) mons? ?)?(?:(?P<d>[+-]?\d+) days? ?)?"
    r"(?:(?P<sign>[+-])?" + _CLOCK + ")?$"
)
_POINT: Final = r"^\((?P<x>[^,]+),(?P<y>[^)]+)\)$"

_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1

Converter = Callable[[Sequence[bytes | None]], pa.Array]


def _text(values: Sequence[bytes | None], what: str) -> pa.Array:
    """The values as a string array (ProtocolError if one is not UTF-8)."""
    try:
        return pa.array(values, _BINARY).cast(_STRING)
    except pa.ArrowInvalid:
        raise bad_value(b"(bytes that are not UTF-8)", what) from None


def _match(text: pa.Array, pattern: str, what: str) -> pa.Array:
    """The regex groups of every value, as a struct array; a value that does not match
    raises ProtocolError."""
    parts = pc.extract_regex(text, pattern)
    if parts.null_count != text.null_count:
        unmatched = pc.and_(pc.is_valid(text), pc.is_null(parts))
        index = pc.index(unmatched, True).as_py()
        raise bad_value(text[index].as_py().encode(), what)
    return parts


def _int(parts: pa.Array, name: str) -> pa.Array:
    """A group as int64; an optional group that did not match counts as 0."""
    field = pc.utf8_ltrim(parts.field(name), characters="+")  # Arrow refuses '+3'
    return pc.cast(pc.if_else(pc.equal(field, ""), "0", field), _INT64)


def _present(parts: pa.Array, name: str) -> pa.Array:
    """A group, NULL where the value is NULL (Arrow gives '' there)."""
    field = parts.field(name)
    return pc.if_else(pc.equal(field, ""), pa.scalar(None, _STRING), field)


def _clock_micros(parts: pa.Array) -> pa.Array:
    seconds = pc.add(
        pc.multiply(pc.add(pc.multiply(_int(parts, "h"), 60), _int(parts, "mi")), 60),
        _int(parts, "s"),
    )
    return pc.multiply(seconds, 1_000_000)


def _fraction(parts: pa.Array) -> pa.Array:
    return pc.cast(pc.utf8_rpad(parts.field("f"), width=6, padding="0"), _INT64)


def _masked(array: pa.Array, text: pa.Array) -> pa.Array:
    return pc.if_else(pc.is_valid(text), array, pa.scalar(None, array.type))


def _struct(arrays: list[pa.Array], target: pa.StructType, text: pa.Array) -> pa.Array:
    return pa.StructArray.from_arrays(
        arrays, fields=list(target), mask=pc.is_null(text) if text.null_count else None
    )


def time_column(values: Sequence[bytes | None]) -> pa.Array:
    text = _text(values, "time without time zone")
    parts = _match(text, _TIME, "time without time zone")
    return _masked(pc.add(_clock_micros(parts), _fraction(parts)), text)


def timetz_column(values: Sequence[bytes | None]) -> pa.Array:
    text = _text(values, "time with time zone")
    parts = _match(text, _TIMETZ, "time with time zone")
    micros = pc.add(_clock_micros(parts), _fraction(parts))
    offset = pc.add(
        pc.add(pc.multiply(_int(parts, "zh"), 3600), pc.multiply(_int(parts, "zm"), 60)),
        _int(parts, "zsec"),
    )
    offset = pc.if_else(pc.equal(parts.field("zs"), "-"), pc.negate(offset), offset)
    return _struct([micros, pc.cast(offset, _INT32)], TIMETZ_TYPE, text)


def interval_column(values: Sequence[bytes | None]) -> pa.Array:
    text = _text(values, "interval")
    if len(text) and pc.any(pc.equal(text, "")).as_py():
        raise bad_value(b"", "interval", "'1 year 2 mons 3 days 04:05:06.789'")
    positive = pc.fill_null(pc.equal(text, "infinity"), False)  # PostgreSQL 17
    negative = pc.fill_null(pc.equal(text, "-infinity"), False)
    infinite = pc.or_(positive, negative)
    any_infinite = bool(pc.any(infinite).as_py())
    finite = pc.if_else(infinite, pa.scalar(None, _STRING), text) if any_infinite else text
    parts = _match(finite, _INTERVAL, "interval")
    months = pc.add(pc.multiply(_int(parts, "y"), 12), _int(parts, "mo"))
    days = _int(parts, "d")
    clock = _clock_micros(parts)
    fraction = _fraction(parts)
    # add the fraction with the clock's sign; -(clock) - fraction reaches INT64_MIN
    minus = pc.equal(parts.field("sign"), "-")
    micros = pc.if_else(minus, pc.subtract(pc.negate(clock), fraction), pc.add(clock, fraction))
    if any_infinite:  # Postgres's own encoding: every field at its maximum or minimum
        months = _extremes(months, positive, negative, _INT32_MAX)
        days = _extremes(days, positive, negative, _INT32_MAX)
        micros = _extremes(micros, positive, negative, _INT64_MAX)
    return _struct([pc.cast(months, _INT32), pc.cast(days, _INT32), micros], INTERVAL_TYPE, text)


def _extremes(array: pa.Array, positive: pa.Array, negative: pa.Array, top: int) -> pa.Array:
    array = pc.if_else(positive, pa.scalar(top, _INT64), array)
    return pc.if_else(negative, pa.scalar(-top - 1, _INT64), array)


def point_column(values: Sequence[bytes | None]) -> pa.Array:
    text = _text(values, "point")
    parts = _match(text, _POINT, "point")
    try:
        x = pc.cast(_present(parts, "x"), _FLOAT64)
        y = pc.cast(_present(parts, "y"), _FLOAT64)
    except pa.ArrowInvalid as exc:
        raise bad_value(str(exc).encode(), "point", "'(x,y)' with two numbers") from None
    return _struct([x, y], POINT_TYPE, text)
