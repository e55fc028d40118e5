"""Typed values: Postgres text output -> Python values (predicates) and Arrow columns."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import ProtocolError, UnfitValue
from tidemark.pgoutput.values import (
    TYPE_NAMES,
    Interval,
    UnrepresentableValue,
    arrow_type,
    is_supported,
    parse_array,
    python_parser,
    to_arrow,
    unknown_type_counts,
    unrepresentable_value_counts,
)
from tidemark.pgoutput.values import arrow as v

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 114, 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC, UUID_OID, JSONB = (
    1114, 1184, 1186, 1266, 1700, 2950, 3802,
)  # fmt: skip
INT4_ARRAY, TEXT_ARRAY, NUMERIC_ARRAY, DATE_ARRAY, BYTEA_ARRAY, MOOD = (
    1007, 1009, 1231, 1182, 1001, 90_001,
)  # fmt: skip


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def parse(type_oid: int, text: bytes, type_modifier: int = -1) -> Any:
    return python_parser(type_oid, type_modifier)(text)


# --- Python values ---


@pytest.mark.parametrize(
    ("type_oid", "text", "expected"),
    [
        (BOOL, b"t", True),
        (BOOL, b"f", False),
        (INT2, b"-32768", -32768),
        (INT4, b"2147483647", 2147483647),
        (INT8, b"-9223372036854775808", -(2**63)),
        (OID, b"4294967295", 2**32 - 1),
        (FLOAT8, b"1.5", 1.5),
        (FLOAT8, b"-1.2345678901234567e-300", -1.2345678901234567e-300),
        (FLOAT4, b"3.4028235e+38", 3.4028235e38),
        (FLOAT8, b"Infinity", math.inf),
        (FLOAT8, b"-Infinity", -math.inf),
        (NUMERIC, b"-123.4500", Decimal("-123.4500")),
        (NUMERIC, b"Infinity", Decimal("Infinity")),
        (NUMERIC, b"-Infinity", Decimal("-Infinity")),
        (TEXT, "naïve ☃".encode(), "naïve ☃"),
        (VARCHAR, b"", ""),
        (BPCHAR, b"ab  ", "ab  "),
        (NAME, b"pg_class", "pg_class"),
        (CHAR, b"x", "x"),
        (JSON, b'{"a": [1, 2]}', '{"a": [1, 2]}'),
        (JSONB, b'{"a": [1, 2]}', '{"a": [1, 2]}'),
        (TIMETZ, b"12:34:56+05:30", "12:34:56+05:30"),
        (BYTEA, b"\\x00ff10", b"\x00\xff\x10"),
        (BYTEA, b"\\x", b""),
        (BYTEA, b"a\\\\b\\001", b"a\\b\x01"),  # escape format
        (UUID_OID, b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
         UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        (DATE, b"2024-02-29", date(2024, 2, 29)),
        (DATE, b"infinity", date.max),
        (DATE, b"-infinity", date.min),
        (TIME, b"23:59:59.999999", time(23, 59, 59, 999999)),
        (TIME, b"08:00:00.5", time(8, 0, 0, 500000)),
        (TIME, b"24:00:00", time.max),
        (TIMESTAMP, b"2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
        (TIMESTAMP, b"2024-01-02 03:04:05", datetime(2024, 1, 2, 3, 4, 5)),
        (TIMESTAMP, b"infinity", datetime.max),
        (TIMESTAMP, b"-infinity", datetime.min),
        (TIMESTAMPTZ, b"2024-01-02 03:04:05.12+00",
         datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=UTC)),
        (TIMESTAMPTZ, b"2024-01-02 03:04:05+05:30", datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)),
        (TIMESTAMPTZ, b"2024-01-02 03:04:05-08", datetime(2024, 1, 2, 11, 4, 5, tzinfo=UTC)),
        (TIMESTAMPTZ, b"1850-03-15 12:00:00+00:09:21",
         datetime(1850, 3, 15, 11, 50, 39, tzinfo=UTC)),
        (TIMESTAMPTZ, b"infinity", datetime.max.replace(tzinfo=UTC)),
        (MOOD, b"happy", "happy"),
    ],
)  # fmt: skip
def test_text_output_parses_to_the_python_value(type_oid: int, text: bytes, expected: Any) -> None:
    value = parse(type_oid, text)
    assert value == expected
    assert type(value) is type(expected)


def test_timestamptz_is_always_utc() -> None:
    value = parse(TIMESTAMPTZ, b"2024-06-01 00:30:00-02:30")
    assert value.tzinfo is UTC
    assert value == datetime(2024, 6, 1, 3, 0, tzinfo=UTC)


def test_nan_values() -> None:
    assert math.isnan(parse(FLOAT8, b"NaN"))
    assert math.isnan(parse(FLOAT4, b"NaN"))
    assert parse(NUMERIC, b"NaN").is_nan()


@pytest.mark.parametrize(
    ("type_oid", "text"),
    [
        (DATE, b"0044-03-15 BC"),
        (DATE, b"12024-01-01"),
        (TIMESTAMP, b"0001-01-01 00:00:00 BC"),
        (TIMESTAMPTZ, b"0044-03-15 12:00:00+00 BC"),
        (TIMESTAMPTZ, b"294276-12-31 23:59:59.999999+00"),
    ],
)
def test_dates_python_cannot_hold_raise_a_clear_error(type_oid: int, text: bytes) -> None:
    with pytest.raises(UnrepresentableValue, match="outside Python's years 1-9999"):
        parse(type_oid, text)


@pytest.mark.parametrize(
    ("type_oid", "text"),
    [
        (BOOL, b"true"),
        (INT4, b"12a"),
        (FLOAT8, b"1,5"),
        (NUMERIC, b"1.2.3"),
        (TEXT, b"\xff"),
        (BYTEA, b"\\xabc"),
        (UUID_OID, b"not-a-uuid"),
        (DATE, b"01/02/2024"),  # DateStyle is not ISO
        (TIME, b"25:00:00"),
        (TIMESTAMP, b"2024-01-02 03:04:05+00"),  # an offset on a timestamp without zone
        (TIMESTAMPTZ, b"2024-01-02 03:04:05"),  # no offset on a timestamptz
        (INTERVAL, b"P1Y2M"),  # IntervalStyle iso_8601
        (INTERVAL, b""),
    ],
)
def test_text_a_type_never_outputs_raises_protocol_error(type_oid: int, text: bytes) -> None:
    with pytest.raises(ProtocolError, match="cannot read"):
        parse(type_oid, text)


# --- intervals ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"00:00:00", Interval(0, 0, 0)),
        (b"1 year 2 mons 3 days 04:05:06.789", Interval(14, 3, 14_706_789_000)),
        (b"-1 years -2 mons +3 days -04:05:06", Interval(-14, 3, -14_706_000_000)),
        (b"1 day", Interval(0, 1, 0)),
        (b"-00:00:00.000001", Interval(0, 0, -1)),
        (b"3 mons", Interval(3, 0, 0)),
        (b"2562047788:00:54.775807", Interval(0, 0, 2**63 - 1)),
        (b"infinity", Interval(2**31 - 1, 2**31 - 1, 2**63 - 1)),
    ],
)
def test_interval_text_parses_to_months_days_microseconds(text: bytes, expected: Interval) -> None:
    value = parse(INTERVAL, text)
    assert (value.months, value.days, value.microseconds) == (
        expected.months,
        expected.days,
        expected.microseconds,
    )


def test_intervals_compare_like_postgres() -> None:
    # '1 mon' = '30 days' and '1 day' = '24:00:00' in Postgres
    assert Interval(1, 0, 0) == Interval(0, 30, 0)
    assert Interval(0, 1, 0) == Interval(0, 0, 86_400_000_000)
    assert hash(Interval(1, 0, 0)) == hash(Interval(0, 30, 0))
    assert Interval(0, 31, 0) > Interval(1, 0, 0)
    assert Interval(0, 0, -1) < Interval(0, 0, 0) <= Interval(0, 0, 0)
    assert parse(INTERVAL, b"-infinity") < Interval(-(2**31) + 1, 0, 0)
    assert sorted([Interval(1, 0, 0), Interval(0, 29, 0), Interval(0, 0, 1)]) == [
        Interval(0, 0, 1),
        Interval(0, 29, 0),
        Interval(1, 0, 0),
    ]


@given(
    st.integers(-1000, 1000),
    st.integers(-1000, 1000),
    st.integers(-(10**12), 10**12),
    st.integers(-1000, 1000),
    st.integers(-1000, 1000),
    st.integers(-(10**12), 10**12),
)
def test_interval_order_is_the_order_of_the_30_day_month_span(
    m1: int, d1: int, us1: int, m2: int, d2: int, us2: int
) -> None:  # fmt: skip
    a, b = Interval(m1, d1, us1), Interval(m2, d2, us2)
    span_a = (m1 * 30 + d1) * 86_400_000_000 + us1
    span_b = (m2 * 30 + d2) * 86_400_000_000 + us2
    assert (a < b) == (span_a < span_b)
    assert (a == b) == (span_a == span_b)
    assert (a >= b) == (span_a >= span_b)


# --- arrays ---


@pytest.mark.parametrize(
    ("type_oid", "text", "expected"),
    [
        (INT4_ARRAY, b"{}", []),
        (INT4_ARRAY, b"{1,-2,NULL}", [1, -2, None]),
        (INT4_ARRAY, b"[0:2]={1,2,3}", [1, 2, 3]),
        (INT4_ARRAY, b"{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
        (TEXT_ARRAY, b'{"",NULL,"NULL",null,"a b","q\\"uote","back\\\\slash","{,}"}',
         ["", None, "NULL", None, "a b", 'q"uote', "back\\slash", "{,}"]),
        (TEXT_ARRAY, "{ünï,cödé}".encode(), ["ünï", "cödé"]),
        (NUMERIC_ARRAY, b"{1.50,NaN,-Infinity}", [Decimal("1.50"), Decimal("NaN"),
                                                  Decimal("-Infinity")]),
        (DATE_ARRAY, b"{2024-01-01,infinity}", [date(2024, 1, 1), date.max]),
        (BYTEA_ARRAY, b'{"\\\\x00ff",NULL}', [b"\x00\xff", None]),
    ],
)  # fmt: skip
def test_array_text_parses_to_lists(type_oid: int, text: bytes, expected: list[Any]) -> None:
    result = parse(type_oid, text)
    if expected and isinstance(expected[1], Decimal):  # NaN != NaN
        assert [str(x) for x in result] == [str(x) for x in expected]
    else:
        assert result == expected


@pytest.mark.parametrize("text", [b"1,2", b"{1,2", b'{"a}', b"{1}x", b"[1:2]{1,2}", b"{{1},2"])
def test_malformed_arrays_raise_protocol_error(text: bytes) -> None:
    with pytest.raises(ProtocolError, match="Postgres array"):
        parse_array(text)


def array_out(items: list[str | None]) -> bytes:
    """Format a 1-D text[] the way Postgres's array_out does."""
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
        elif (
            item == ""
            or item.upper() == "NULL"
            or any(c in item for c in '{},"\\')
            or any(c.isspace() for c in item)
        ):
            parts.append('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(item)
    return ("{" + ",".join(parts) + "}").encode()


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.text(st.characters(codec="utf-8", exclude_characters="\x00")),
        )
    )
)
def test_text_arrays_round_trip_through_postgres_array_syntax(items: list[str | None]) -> None:
    assert parse(TEXT_ARRAY, array_out(items)) == items
    column = to_arrow([array_out(items)], TEXT_ARRAY)
    assert column.to_pylist() == [items]


# --- hypothesis round trips for scalars ---


@given(st.integers(-(2**63), 2**63 - 1))
def test_int8_round_trip(number: int) -> None:
    text = str(number).encode()
    assert parse(INT8, text) == number
    assert to_arrow([text], INT8).to_pylist() == [number]


@given(st.floats(allow_nan=False))
def test_float8_round_trip_with_postgres_infinity_spelling(number: float) -> None:
    text = (
        b"Infinity" if number == math.inf else b"-Infinity" if number == -math.inf
        else repr(number).encode()
    )  # fmt: skip
    assert parse(FLOAT8, text) == number
    assert to_arrow([text], FLOAT8).to_pylist() == [number]


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float4_round_trip(number: float) -> None:
    text = repr(number).encode()
    assert to_arrow([text], FLOAT4).to_pylist() == [number]


@given(st.datetimes(timezones=st.just(UTC)))
def test_timestamptz_round_trip_in_python_and_arrow(moment: datetime) -> None:
    # as Postgres prints it: 4-digit year, fraction without trailing zeros, '+00'
    fraction = f".{moment.microsecond:06d}".rstrip("0").rstrip(".")
    text = f"{moment.year:04d}-{moment:%m-%d %H:%M:%S}{fraction}+00".encode()
    assert parse(TIMESTAMPTZ, text) == moment
    assert to_arrow([text], TIMESTAMPTZ).to_pylist() == [moment]


# --- Arrow columns ---


def test_arrow_types_are_the_documented_spark_readable_ones() -> None:
    assert arrow_type(BOOL) == pa.bool_()
    assert arrow_type(INT2) == pa.int16()
    assert arrow_type(INT4) == pa.int32()
    assert arrow_type(INT8) == pa.int64()
    assert arrow_type(OID) == pa.int64()
    assert arrow_type(FLOAT4) == pa.float32()
    assert arrow_type(FLOAT8) == pa.float64()
    assert arrow_type(NUMERIC, numeric_typmod(12, 2)) == pa.decimal128(12, 2)
    assert arrow_type(NUMERIC, numeric_typmod(38, 0)) == pa.decimal128(38, 0)
    assert arrow_type(NUMERIC) == pa.string()  # unconstrained: lossless text
    assert arrow_type(NUMERIC, numeric_typmod(39, 2)) == pa.string()
    assert arrow_type(NUMERIC, numeric_typmod(5, -2)) == pa.string()  # negative scale (PG15+)
    assert arrow_type(NUMERIC, numeric_typmod(2, 4)) == pa.string()  # scale > precision
    for text_like in (TEXT, VARCHAR, BPCHAR, NAME, CHAR, UUID_OID, JSON, JSONB, MOOD):
        assert arrow_type(text_like) == pa.string()
    assert arrow_type(TIME) == pa.int64()  # microseconds since midnight
    assert arrow_type(TIMETZ) == pa.struct(
        [("microseconds", pa.int64()), ("utc_offset_seconds", pa.int32())]
    )
    assert arrow_type(INTERVAL) == pa.struct(
        [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
    )
    assert arrow_type(BYTEA) == pa.binary()
    assert arrow_type(DATE) == pa.date32()
    assert arrow_type(TIMESTAMP) == pa.timestamp("us")
    assert arrow_type(TIMESTAMPTZ) == pa.timestamp("us", tz="UTC")
    assert arrow_type(INT4_ARRAY) == pa.list_(pa.int32())
    assert arrow_type(NUMERIC_ARRAY, numeric_typmod(10, 3)) == pa.list_(pa.decimal128(10, 3))


@pytest.mark.parametrize(
    ("type_oid", "typmod", "values", "expected"),
    [
        (BOOL, -1, [b"t", None, b"f"], [True, None, False]),
        (INT2, -1, [b"-32768", None, b"32767"], [-32768, None, 32767]),
        (INT4, -1, [b"-2147483648", None], [-(2**31), None]),
        (INT8, -1, [b"9223372036854775807", None], [2**63 - 1, None]),
        (OID, -1, [b"4294967295"], [2**32 - 1]),
        (FLOAT8, -1, [b"Infinity", b"-Infinity", b"1e-05", None], [math.inf, -math.inf, 1e-05,
                                                                    None]),
        (NUMERIC, numeric_typmod(12, 2), [b"-1234567890.12", b"0.50", None],
         [Decimal("-1234567890.12"), Decimal("0.50"), None]),
        (NUMERIC, -1, [b"123456789012345678901234567890123456789012.5", b"NaN"],
         ["123456789012345678901234567890123456789012.5", "NaN"]),
        (TEXT, -1, ["☃".encode(), b"", None], ["☃", "", None]),
        (UUID_OID, -1, [b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
         ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
        (TIME, -1, [b"08:00:00.5", b"24:00:00", None], [28_800_500_000, 86_400_000_000, None]),
        (INTERVAL, -1, [b"1 day 02:00:00", None],
         [{"months": 0, "days": 1, "microseconds": 7_200_000_000}, None]),
        (JSONB, -1, [b'{"a": 1}', None], ['{"a": 1}', None]),
        (BYTEA, -1, [b"\\xdeadbeef", b"\\x", None], [b"\xde\xad\xbe\xef", b"", None]),
        (DATE, -1, [b"2024-02-29", None], [date(2024, 2, 29), None]),
        (DATE, -1, [b"infinity", b"-infinity", b"2024-01-01"],
         [date.max, date.min, date(2024, 1, 1)]),
        (TIMESTAMP, -1, [b"2024-01-02 03:04:05.123456", b"infinity", b"-infinity", None],
         [datetime(2024, 1, 2, 3, 4, 5, 123456), datetime.max, datetime.min, None]),
        (TIMESTAMPTZ, -1, [b"2024-01-02 03:04:05.5+00", b"2024-01-02 03:04:05+05:30"],
         [datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC),
          datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)]),
        (TIMESTAMPTZ, -1, [b"1850-03-15 12:00:00+00:09:21", b"infinity", None],
         [datetime(1850, 3, 15, 11, 50, 39, tzinfo=UTC), datetime.max.replace(tzinfo=UTC), None]),
        (INT4_ARRAY, -1, [b"{1,NULL,3}", None, b"{}"], [[1, None, 3], None, []]),
        (TEXT_ARRAY, -1, [b'{"a,b",NULL,"NULL"}'], [["a,b", None, "NULL"]]),
        (NUMERIC_ARRAY, numeric_typmod(6, 2), [b"{1.50,-2.25}"], [[Decimal("1.50"),
                                                                   Decimal("-2.25")]]),
        (DATE_ARRAY, -1, [b"{2024-01-01,infinity}"], [[date(2024, 1, 1), date.max]]),
    ],
)  # fmt: skip
def test_columns_convert_to_arrow(
    type_oid: int, typmod: int, values: list[bytes | None], expected: list[Any]
) -> None:
    column = to_arrow(values, type_oid, typmod)
    assert column.type == arrow_type(type_oid, typmod)
    assert column.to_pylist() == expected


def test_float_nan_survives_arrow() -> None:
    column = to_arrow([b"NaN", b"1"], FLOAT4)
    assert math.isnan(column[0].as_py())


def test_empty_column() -> None:
    assert to_arrow([], INT8).type == pa.int64()
    assert len(to_arrow([], TEXT_ARRAY)) == 0


CYCLE = 146_097  # days in 400 Gregorian years: the calendar repeats with this period


def days_since_epoch(year: int, month: int, day: int) -> int:
    """Proleptic Gregorian day number of any year, through Python's date and the cycle."""
    shift = (year - 2000) // 400
    return (date(year - 400 * shift, month, day) - date(1970, 1, 1)).days + shift * CYCLE


def test_bc_and_far_future_dates_are_exact_in_arrow() -> None:
    # 1 BC is year 0 of the proleptic Gregorian calendar, 44 BC is year -43
    column = to_arrow([b"0001-01-01 BC", b"0044-03-15 BC", b"12024-01-01", b"2024-01-01"], DATE)
    assert column.cast(pa.int32()).to_pylist() == [
        days_since_epoch(0, 1, 1),
        days_since_epoch(-43, 3, 15),
        days_since_epoch(12024, 1, 1),
        days_since_epoch(2024, 1, 1),
    ]


def test_bc_timestamps_with_offsets_are_exact_in_arrow() -> None:
    column = to_arrow([b"0044-03-15 12:00:00+02 BC", b"2000-01-01 00:00:00+00"], TIMESTAMPTZ)
    micros = column.cast(pa.int64()).to_pylist()
    assert micros[1] == 946_684_800_000_000
    days_44bc = to_arrow([b"0044-03-15 BC"], DATE).cast(pa.int32())[0].as_py()
    assert micros[0] == days_44bc * 86_400_000_000 + 10 * 3_600_000_000


def test_days_from_civil_agrees_with_python_dates() -> None:
    epoch = date(1970, 1, 1)
    for day in (date(1, 1, 1), date(1600, 2, 29), date(1900, 3, 1), date(2000, 2, 29),
                date(2100, 12, 31), date(9999, 12, 31)):  # fmt: skip
        assert v._days_from_civil(day.year, day.month, day.day) == (day - epoch).days


@given(st.dates())
def test_days_from_civil_agrees_with_python_for_every_date(day: date) -> None:
    assert v._days_from_civil(day.year, day.month, day.day) == (day - date(1970, 1, 1)).days


def test_nan_in_a_constrained_numeric_is_refused_not_nulled() -> None:
    # Given NaN in a numeric(12,2) column (Postgres allows it, decimal cannot hold it)
    with pytest.raises(UnfitValue) as refused:
        to_arrow([b"1.50", b"NaN", None], NUMERIC, numeric_typmod(12, 2))
    # Then the batch is refused with the value, the lake type and the way out
    message = str(refused.value)
    assert "'NaN' does not fit decimal128(12, 2)" in message
    assert "numeric(12,2)" in message and "::text" in message


def test_multidimensional_value_in_an_array_column_is_refused_not_nulled() -> None:
    with pytest.raises(UnfitValue) as refused:
        to_arrow([b"{5}", b"{{1,2},{3,4}}"], INT4_ARRAY)
    assert "'{{1,2},{3,4}}' does not fit list<item: int32>" in str(refused.value)
    assert "several dimensions" in str(refused.value)


def test_invalid_utf8_in_text_is_replaced_and_counted() -> None:
    before = unrepresentable_value_counts().get(TEXT, 0)
    column = to_arrow([b"ok", b"bad\xff"], TEXT)
    assert column.to_pylist() == ["ok", "bad\ufffd"]
    assert unrepresentable_value_counts()[TEXT] == before + 1


def test_unknown_types_stay_text_and_are_counted_per_value() -> None:
    # Given a column of an enum type tidemark does not know
    before = unknown_type_counts().get(MOOD, 0)
    # When it is converted
    column = to_arrow([b"happy", None, b"sad"], MOOD)
    # Then it is text, and the three values are counted under its oid
    assert column.type == pa.string()
    assert column.to_pylist() == ["happy", None, "sad"]
    assert unknown_type_counts()[MOOD] == before + 3
    assert not is_supported(MOOD)


def test_known_types_are_not_counted_as_unknown() -> None:
    before = unknown_type_counts()
    to_arrow([b"x"], TEXT)
    to_arrow([b"1 day"], INTERVAL)
    assert unknown_type_counts() == before


@pytest.mark.parametrize(
    ("type_oid", "values"),
    [
        (BOOL, [b"t", b"yes"]),
        (INT4, [b"1", b"2147483648"]),  # out of int32 range
        (INT8, [b"12x"]),
        (FLOAT8, [b"one"]),
        (NUMERIC, [b"1.234"]),  # more digits than numeric(12, 2) prints
        (DATE, [b"2024-13-01"]),
        (DATE, [b"01/02/2024"]),
        (TIMESTAMPTZ, [b"2024-01-02 03:04:05"]),
    ],
)
def test_text_a_known_type_never_outputs_fails_the_column(
    type_oid: int, values: list[bytes | None]
) -> None:
    with pytest.raises(ProtocolError):
        to_arrow(values, type_oid, numeric_typmod(12, 2) if type_oid == NUMERIC else -1)


def test_type_names_and_support() -> None:
    assert TYPE_NAMES[TIMESTAMPTZ] == "timestamp with time zone"
    assert TYPE_NAMES[INT4_ARRAY] == "integer[]"
    assert is_supported(JSONB)
    assert is_supported(TEXT_ARRAY)
    assert is_supported(3904)  # int4range
    assert not is_supported(869)  # inet: text, without a deliberate mapping


def test_python_parsers_of_arrays_use_the_element_type_modifier() -> None:
    parse_numbers = python_parser(NUMERIC_ARRAY, numeric_typmod(6, 2))
    assert parse_numbers(b"{1.50}") == [Decimal("1.50")]


def test_timezone_offsets_with_seconds_in_python() -> None:
    value = parse(TIMESTAMPTZ, b"2024-01-01 00:00:00-00:00:30")
    assert value == datetime(2024, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert value.utcoffset() == timedelta(0)
    assert value.tzinfo is UTC


@pytest.mark.parametrize("type_oid", [*sorted(TYPE_NAMES), MOOD])
def test_all_null_and_empty_columns_of_every_type(type_oid: int) -> None:
    typmod = numeric_typmod(12, 2) if type_oid in (NUMERIC, NUMERIC_ARRAY) else -1
    for values in ([None, None], []):
        column = to_arrow(values, type_oid, typmod)
        assert column.type == arrow_type(type_oid, typmod)
        assert column.to_pylist() == values


def test_timestamptz_that_leaves_python_range_in_utc() -> None:
    with pytest.raises(UnrepresentableValue, match="in UTC"):
        parse(TIMESTAMPTZ, b"0001-01-01 00:00:00+05")


def test_intervals_do_not_compare_with_other_types() -> None:
    assert Interval(0, 0, 0) != 0
    with pytest.raises(TypeError):
        _ = Interval(0, 0, 0) < 1


_SAMPLES = {
    16: [b"t", b"f", None],
    21: [b"-32768", b"7", None],
    23: [b"2147483647", None],
    20: [b"-9223372036854775808", b"0"],
    700: [b"1.5", b"NaN", b"-Infinity", None],
    701: [b"2.25", b"Infinity", None],
    1700: [b"1.50", b"-0.01", None],
    25: ["caf\u00e9".encode(), b"", None],
    17: [b"\\x00ff", None],
    2950: [b"b1a5c3e2-0d3c-4a6b-9b1f-3b4c5d6e7f80", None],
    1082: [b"2024-02-29", b"infinity", b"0044-03-15 BC", None],
    1114: [b"2024-01-01 12:00:00.5", b"-infinity", None],
    1184: [b"2024-01-01 12:00:00+02", b"2024-06-30 23:59:59.999999+00", None],
    1007: [b"{1,2,NULL}", b"{}", None],
    1009: [b'{"a b","c,d",NULL}', None],
    3802: [b'{"k": [1, 2]}', None],
}


@pytest.mark.parametrize("type_oid", sorted(_SAMPLES))
def test_an_arrow_text_column_converts_like_the_same_values_as_bytes(type_oid: int) -> None:
    # given the same text values, as Python bytes (stream) and as an Arrow column (COPY)
    raw = _SAMPLES[type_oid]
    typmod = (12 << 16 | 2) + 4 if type_oid == 1700 else -1
    as_arrow = pa.array([None if v is None else v.decode() for v in raw], pa.string())
    # then both paths give the same typed column (floats: NaN is not equal to itself)
    from_arrow, from_bytes = to_arrow(as_arrow, type_oid, typmod), to_arrow(raw, type_oid, typmod)
    assert from_arrow.type == from_bytes.type
    if pa.types.is_floating(from_arrow.type):
        assert repr(from_arrow.to_pylist()) == repr(from_bytes.to_pylist())
    else:
        assert from_arrow.equals(from_bytes)
