"""How big and how deep a shape predicate may be.

Too deep (thousands of nested parentheses, NOTs or casts, a long arithmetic chain) or
too large (hundreds of thousands of tokens) is refused when the shape is defined, with
a ``ShapeError`` that gives the limit, never a ``RecursionError`` or a ``SyntaxError``
from the generated code. Long flat lists stay usable: an ``OR`` or ``AND`` of
thousands of terms and an ``IN`` list of ten thousand values compile, evaluate as
Postgres would, and regenerate as SQL for the backfill.
"""

from __future__ import annotations

import pytest

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import RelationColumn
from tidemark.predicates.compiler import (
    MAX_PREDICATE_DEPTH,
    MAX_PREDICATE_TOKENS,
    compile_predicate,
    parse_predicate,
    predicate_sql,
)
from tidemark.shapes.model import ShapeDefinition

COLUMNS = (
    RelationColumn("id", 23, -1, True),
    RelationColumn("v", 25, -1, False),
    RelationColumn("ok", 16, -1, False),
)


def compiled(where: str):  # type: ignore[no-untyped-def]
    return compile_predicate(parse_predicate(where, ("public", "t")), COLUMNS)


def row(id_: int | None, v: str | None = "x", ok: str | None = "t") -> tuple[bytes | None, ...]:
    return (
        None if id_ is None else str(id_).encode(),
        None if v is None else v.encode(),
        None if ok is None else ok.encode(),
    )


@pytest.mark.parametrize(
    "where",
    [
        "(" * 3000 + "id = 1" + ")" * 3000,
        "(" * (MAX_PREDICATE_DEPTH + 1) + "id = 1" + ")" * (MAX_PREDICATE_DEPTH + 1),
        "NOT " * 3000 + "ok",
        "- " * 3000 + "id = 1",
        "id" + "::int" * 3000 + " = 1",
        "id = " + " + ".join(["id"] * 3000),
        "lower(" * 3000 + "v" + ")" * 3000 + " = 'x'",
        "id = " + "abs(" * 200 + "id" + ")" * 200,
    ],
    ids=["parens-3000", "parens-limit", "not", "minus", "casts", "plus", "calls", "abs"],
)
def test_too_deep_a_predicate_is_refused_with_the_limit(where: str) -> None:
    with pytest.raises(ShapeError) as refused:
        compiled(where)
    assert f"at most {MAX_PREDICATE_DEPTH} levels" in str(refused.value)


def test_too_deep_a_predicate_is_refused_when_the_shape_is_defined() -> None:
    with pytest.raises(ShapeError, match=f"at most {MAX_PREDICATE_DEPTH} levels"):
        ShapeDefinition(name="deep", table="t", where="(" * 3000 + "id = 1" + ")" * 3000)


def test_too_large_a_predicate_is_refused_with_the_limit() -> None:
    where = "id IN (" + ", ".join(str(i) for i in range(MAX_PREDICATE_TOKENS // 2 + 10)) + ")"
    with pytest.raises(ShapeError) as refused:
        parse_predicate(where, ("public", "t"))
    assert f"at most {MAX_PREDICATE_TOKENS:,} tokens" in str(refused.value)


def test_nesting_up_to_the_limit_is_accepted() -> None:
    depth = MAX_PREDICATE_DEPTH - 2
    predicate = compiled("(" * depth + "id = 1" + ")" * depth)
    assert predicate.matches(row(1)) and not predicate.matches(row(2))


@pytest.mark.parametrize("terms", [200, 2000, 5000])
def test_a_long_or_compiles_and_evaluates_as_postgres(terms: int) -> None:
    predicate = compiled(" OR ".join(f"id = {i}" for i in range(terms)))
    assert predicate.matches(row(terms - 1)) and not predicate.matches(row(terms))
    assert predicate.evaluate(row(0)) is True and predicate.evaluate(row(terms)) is False
    assert predicate.evaluate(row(None)) is None  # NULL = i for every term: NULL
    assert predicate_sql(predicate).count(" OR ") == terms - 1


@pytest.mark.parametrize("terms", [200, 2000])
def test_a_long_and_compiles_and_evaluates_as_postgres(terms: int) -> None:
    predicate = compiled(" AND ".join(f"id <> {i}" for i in range(terms)))
    assert predicate.matches(row(terms)) and not predicate.matches(row(terms - 1))
    assert predicate.evaluate(row(None)) is None
    assert predicate.evaluate(row(5)) is False


def test_a_long_or_keeps_sql_short_circuit_and_null_rules() -> None:
    # a NULL term does not decide an OR; a TRUE one after it does; an error in a term
    # after the deciding one is never evaluated (1/0 only runs for id = 0)
    terms = [f"v = 'v{i}'" for i in range(300)] + ["10 / id > 1"] + ["id = 7"]
    predicate = compiled(" OR ".join(terms))
    assert predicate.evaluate(row(7, v=None)) is True
    assert predicate.evaluate(row(100, v=None)) is None
    assert predicate.evaluate(row(100, v="v3")) is True
    assert not predicate.matches(row(0, v=None))  # division by zero: an error, no match


def test_a_large_in_list_works() -> None:
    values = range(0, 20_000, 2)
    predicate = compiled("id IN (" + ", ".join(map(str, values)) + ")")
    assert predicate.matches(row(19_998)) and not predicate.matches(row(19_999))
    assert predicate.equality_terms  # still served by the routing index


def test_a_long_or_of_equalities_on_one_column_is_still_a_predicate_the_router_can_run() -> None:
    predicate = compiled(" OR ".join(f"v = 'k{i}'" for i in range(3000)))
    assert predicate.matches(row(1, v="k2999")) and not predicate.matches(row(1, v="k3000"))


@pytest.mark.parametrize(
    ("literal", "accepted"),
    [
        ("9" * 5000, True),  # beyond Python's int() limit of 4,300 digits, still numeric
        ("1e131071", True),
        ("1e131072", False),
        ("1e-16383", True),
        ("1e-16384", False),
        ("1e999999", False),
    ],
)
def test_numeric_constants_follow_postgres_range(literal: str, accepted: bool) -> None:
    # the bounds Postgres 15 and 16 give "value overflows numeric format" beyond
    where = f"id::numeric < {literal}"
    if accepted:
        assert compiled(where).matches(row(0))  # 0 is below each of them
    else:
        with pytest.raises(ShapeError, match="overflows Postgres's numeric format"):
            compiled(where)
