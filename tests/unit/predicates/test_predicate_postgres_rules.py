"""Postgres rules found by the differential test (tests/integration/
test_predicate_differential.py), kept here as fast scenarios without Postgres.

Each case: a predicate, a row of pgoutput text values, and what Postgres answers
(True, False, None for NULL, ERR where it raises, REFUSED where it raises for every
row and the compiler refuses the predicate at definition time).
"""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.errors import ProtocolError, ShapeError
from tidemark.pgoutput.messages import RelationColumn
from tidemark.predicates.compiler import (
    CompiledPredicate,
    PredicateEvaluationError,
    compile_predicate,
    parse_predicate,
)
from tidemark.predicates.operators import lower, upper

COLUMNS = (
    RelationColumn("i2", 21, -1, False),
    RelationColumn("i4", 23, -1, False),
    RelationColumn("i8", 20, -1, False),
    RelationColumn("n", 1700, -1, False),
    RelationColumn("s", 25, -1, False),
    RelationColumn("d", 1082, -1, False),
    RelationColumn("ts", 1184, -1, False),
    RelationColumn("tm", 1083, -1, False),
    RelationColumn("ia", 1007, -1, False),
    RelationColumn("da", 1182, -1, False),
)
NAMES = [c.name for c in COLUMNS]
ERR, REFUSED = "error", "refused"


def compiled(sql: str) -> CompiledPredicate:
    return compile_predicate(parse_predicate(sql, ("public", "t")), COLUMNS)


def answer(sql: str, values: dict[str, str]) -> Any:
    try:
        predicate = compiled(sql)
    except ShapeError:
        return REFUSED
    row = tuple(values[n].encode() if n in values else None for n in NAMES)
    try:
        value = predicate.evaluate(row)
    except PredicateEvaluationError:
        assert predicate.matches(row) is False
        return ERR
    assert predicate.matches(row) is (value is True)
    return value


RULES: list[tuple[str, dict[str, str], Any]] = [
    # infinities are values of their own, not Python's date.max / datetime.max
    ("d = '9999-12-31'", {"d": "infinity"}, False),
    ("d > '9999-12-31'", {"d": "infinity"}, True),
    ("d < '0001-01-01'", {"d": "-infinity"}, True),
    ("d::text = 'infinity'", {"d": "infinity"}, True),
    ("ts = '9999-12-31 23:59:59.999999+00'", {"ts": "infinity"}, False),
    ("tm = '23:59:59.999999'", {"tm": "24:00:00"}, False),
    ("tm > '23:59:59.999999'", {"tm": "24:00:00"}, True),
    ("ts = '2024-01-01 00:00:00+00'", {"ts": "2024-01-01 05:30:00+05:30"}, True),
    ("'2020-01-01'::date = ANY(da)", {"da": "{infinity,2020-01-01}"}, True),
    ("da @> ARRAY['infinity'::date]", {"da": "{infinity}"}, True),
    # a minus sign folds into a number literal, through parentheses and repeatedly
    ("i8 = -(-9223372036854775808)", {"i8": "1"}, False),
    ("-(-(5)) = 5", {}, True),
    ("-(-2147483648) = 2147483648", {}, True),
    # numeric has no negative zero
    ("(n * -1)::text = '0'", {"n": "0"}, True),
    ("(n * -1)::text = '0.00'", {"n": "0.00"}, True),
    # the planner's constant simplification happens before anything is evaluated
    ("(1 / i2) + NULL IS NULL", {"i2": "0"}, True),
    ("(1 / i2 = 1) AND FALSE", {"i2": "0"}, False),
    ("(1 / i2 = 1) OR TRUE", {"i2": "0"}, True),
    ("length('ab') BETWEEN (i8 + i8) AND 1.5", {"i8": "-9223372036854775808"}, False),
    ("NOT (FALSE AND i2 = 99999::smallint)", {"i2": "1"}, True),
    ("(i2 = 99999::smallint) AND FALSE", {"i2": "1"}, REFUSED),
    ("coalesce(i2, 1, 1 / 0) = 1", {}, True),
    ("coalesce(1 / 0, i2) = 1", {}, REFUSED),
    # every argument of NULLIF, of op ANY (array) and of strict operators is evaluated
    ("nullif(i4, 1 / i2) IS NULL", {"i2": "0"}, ERR),
    ("(1 / i2) = ANY(ia)", {"i2": "0"}, ERR),
    # ... also against an empty array, whose answer is false (ALL: true) even for NULL
    ("(1 / i2) = ANY('{}'::int[])", {"i2": "0"}, ERR),
    ("(1 / i2) <> ALL('{}'::int[])", {"i2": "0"}, ERR),
    ("CAST(i8 AS int) = ANY('{}'::int[])", {"i8": "2147483648"}, ERR),
    ("i4 = ANY('{}'::int[])", {}, False),
    ("i4 <> ALL('{}'::int[])", {}, True),
    ("((1 / i2) IS NULL) = (i4 > 0)", {"i2": "0"}, ERR),
    ("(i4 > 0) = ((1 / i2) IS NULL)", {"i2": "0"}, ERR),
    # IN: two or more items without columns are one = ANY, tested first
    ("i4 IN (1 / i2, 7, 8)", {"i2": "0", "i4": "7"}, True),
    ("i4 IN (1 / i2, 7)", {"i2": "0", "i4": "7"}, ERR),
    ("i2 IN (0, 1.5)", {"i2": "0"}, True),
    ("i2 IN (0, 1.5)", {"i2": "1"}, False),
    ("(i4 + i4) IN (NULL)", {"i4": "-2147483648"}, None),
    ("(i4 + i4) IN (NULL, NULL)", {"i4": "-2147483648"}, ERR),
    # a constant chosen by COALESCE takes the common type of its arguments
    ("abs(coalesce(-2147483648, i8)) = 2147483648", {}, True),
    # case mapping is per code point (glibc's simple mapping); ILIKE lowers both sides
    ("lower(s) = 'i'", {"s": "\u0130"}, True),
    ("upper(s) = s", {"s": "\u00df"}, True),
    ("s ILIKE 'si'", {"s": "\u017f\u0131"}, False),
    ("s ILIKE 'İ'", {"s": "i"}, True),
    ('lower(s COLLATE "C") = s', {"s": "\u0130"}, True),
]


@pytest.mark.parametrize(("sql", "row", "expected"), RULES)
def test_evaluation_follows_postgres(sql: str, row: dict[str, str], expected: Any) -> None:
    # given a predicate and a row where Python's obvious answer differs from Postgres's
    # when compiled and evaluated; then the answer is Postgres's
    assert answer(sql, row) == expected


def test_clock_words_are_refused_but_infinity_is_a_literal() -> None:
    assert answer("d = 'infinity'", {"d": "infinity"}) is True
    with pytest.raises(ShapeError, match="not supported in a shape predicate"):
        compiled("d = 'today'")


@pytest.mark.parametrize(
    ("sql", "maps_case"),
    [
        ("lower(s) = 'a'", True),
        ("upper(s) = 'A'", True),
        ("s ILIKE 'a'", True),
        ("lower(s COLLATE \"C\") = 'a'", False),
        ("s ILIKE 'a' COLLATE \"C\"", False),
        ("s LIKE 'a%'", False),
    ],
)
def test_compiled_predicates_say_whether_they_map_case(sql: str, maps_case: bool) -> None:
    assert compiled(sql).case_mapping is maps_case


def test_case_mapping_exceptions_are_the_unicode_simple_mapping() -> None:
    # full mappings that produce several code points fall back to the simple one
    assert lower("\u0130") == "i"
    assert upper("\u00df") == "\u00df"  # 'ß' stays, as towupper leaves it
    assert upper("\u1f80") == "\u1f88"
    assert upper("\u0149") == "\u0149"
    assert lower("ÀÉÎ") == "àéî" and upper("àéî") == "ÀÉÎ"


def test_dates_python_cannot_hold_still_raise_for_routing_to_resync() -> None:
    # given a BC date, which Postgres stores but Python's date cannot hold
    predicate = compiled("d > '2000-01-01'")
    row = tuple(b"0044-03-15 BC" if n == "d" else None for n in NAMES)
    # then evaluating it raises ProtocolError (the router turns it into a resync)
    with pytest.raises(ProtocolError, match="is outside Python"):
        predicate.evaluate(row)
