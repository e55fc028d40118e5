"""The routing index: route(row) is exactly the set of shapes whose predicate is TRUE."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.errors import ProtocolError, ShapeError
from tidemark.pgoutput.messages import UNCHANGED_TOAST, Relation, RelationColumn
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync, bind
from tidemark.shapes.routing import ShapeIndex

RELATION = Relation(
    16384,
    "public",
    "orders",
    "f",
    (
        RelationColumn("id", 23, -1, True),
        RelationColumn("region", 25, -1, True),
        RelationColumn("amount", 1700, -1, True),
        RelationColumn("code", 1042, 7, True),  # char(3)
        RelationColumn("d", 1082, -1, True),
    ),
)


def bound(name: str, where: str | None = None, rel: Relation = RELATION) -> BoundShape:
    return bind(ShapeDefinition(name=name, table="orders", where=where), rel, ["id"])


def index_of(*shapes: BoundShape) -> ShapeIndex:
    index = ShapeIndex(RELATION)
    for s in shapes:
        index.add(s)
    return index


def routed(index: ShapeIndex, *values: str | None) -> set[str]:
    row = tuple(None if v is None else v.encode() for v in values)
    return {s.name for s in index.route(row)}


def test_equality_shapes_are_found_by_value_and_others_by_evaluation() -> None:
    # given equality, IN, conjunction, range, unconditional and never-true shapes
    index = index_of(
        bound("r1", "region = 'r1'"),
        bound("r2", "region = 'r2'"),
        bound("r1_or_r3", "region IN ('r1', 'r3')"),
        bound("r1_big", "region = 'r1' AND amount > 100"),
        bound("big", "amount > 100"),
        bound("all"),
        bound("never", "FALSE"),
        bound("always", "1 = 1"),
        bound("also_always", "TRUE AND (NULL OR 2 > 1)"),
        bound("also_never", "TRUE AND NULL"),
    )
    assert index.get("also_always").predicate.constant is True  # type: ignore[union-attr]
    assert index.get("also_never").predicate.constant is False  # type: ignore[union-attr]
    # when rows are routed; then exactly the shapes whose predicate is TRUE
    always = {"all", "always", "also_always"}
    assert routed(index, "1", "r1", "500", None, None) == {
        "r1",
        "r1_or_r3",
        "r1_big",
        "big",
        *always,
    }
    assert routed(index, "1", "r1", "5", None, None) == {"r1", "r1_or_r3", *always}
    assert routed(index, "1", "r3", None, None, None) == {"r1_or_r3", *always}
    assert routed(index, "1", None, None, None, None) == always


def test_parsed_types_are_looked_up_by_value() -> None:
    # numeric 1.50 equals 1.5; char(3) 'ab ' equals 'ab'; dates by value
    index = index_of(
        bound("n", "amount = 1.5"), bound("c", "code = 'ab'"), bound("d", "d = '2024-01-01'")
    )
    assert routed(index, "1", None, "1.50", "ab ", "2024-01-01") == {"n", "c", "d"}
    assert routed(index, "1", None, "1.51", "abc", "2024-01-02") == set()


def test_integer_keys_compare_text_without_parsing_and_never_match_impossible_values() -> None:
    index = index_of(
        bound("one", "id = 1.0"), bound("half", "id = 1.5"), bound("i", "id IN (1, 2)")
    )
    assert routed(index, "1", None, None, None, None) == {"one", "i"}
    assert routed(index, "2", None, None, None, None) == {"i"}


def test_removed_shapes_are_no_longer_routed() -> None:
    index = index_of(bound("a", "region = 'x'"), bound("b", "region = 'x'"))
    assert index.remove("a") is not None
    assert index.remove("a") is None
    assert routed(index, "1", "x", None, None, None) == {"b"}
    assert len(index) == 1 and "b" in index and "a" not in index


def test_a_shape_is_added_once_and_only_to_the_index_of_its_layout() -> None:
    index = index_of(bound("a"))
    with pytest.raises(ShapeError, match="already routed"):
        index.add(bound("a"))
    other = Relation(16384, "public", "orders", "f", RELATION.columns[:2])
    with pytest.raises(ShapeError, match="another layout"):
        index.add(bound("b", rel=other))
    default_identity = Relation(16384, "public", "orders", "d", RELATION.columns)
    with pytest.raises(ShapeError, match="another layout"):
        index.add(bound("c", "id = 1", rel=default_identity))


def test_a_schema_change_rebinds_shapes_and_returns_those_that_must_resync() -> None:
    # given shapes on region and on amount; when region is dropped
    index = index_of(bound("on_region", "region = 'x'"), bound("on_amount", "amount = 7"))
    shrunk = Relation(16384, "public", "orders", "f", (RELATION.columns[0], RELATION.columns[2]))
    resyncs = index.update_relation(shrunk)
    # then the region shape resyncs and leaves the index; the other routes on the new layout
    assert [r.shape for r in resyncs] == ["on_region"]
    assert isinstance(resyncs[0], ShapeResync)
    assert [s.name for s in index.shapes] == ["on_amount"]
    assert {s.name for s in index.route((b"1", b"7"))} == {"on_amount"}


def test_a_value_python_cannot_hold_makes_only_the_shapes_reading_it_resync() -> None:
    index = index_of(bound("by_date", "d = '2024-01-01'"), bound("all"), bound("x", "id = 1"))
    row = (b"1", None, None, None, b"0044-03-15 BC")
    with pytest.raises(ProtocolError):
        index.route(row)
    matched, failed = index.route_checked(row)
    assert {s.name for s in matched} == {"all", "x"}
    assert [f.shape for f in failed] == ["by_date"]


def test_unchanged_toast_in_a_column_without_a_predicate_is_ignored() -> None:
    index = index_of(bound("r", "region = 'x'"), bound("n", "amount > 1"))
    row = (b"1", b"x", b"5", UNCHANGED_TOAST, None)
    assert {s.name for s in index.route(row)} == {"r", "n"}


# --- property: the index answers exactly like evaluating every predicate --------------

TEMPLATES = [
    None,
    "region = 'r{a}'",
    "region IN ('r{a}', 'r{b}')",
    "region = 'r{a}' AND amount > {b}",
    "id = {a}",
    "id = {a} AND region = 'r{b}'",
    "id IN ({a}, {b}, NULL)",
    "amount = {a}.0",
    "amount > {a}",
    "id = {a} OR region = 'r{b}'",
    "code = 'r{a}'",
    "d = '2024-01-0{a}'",
    "NOT (region = 'r{a}')",
    "region IS NULL",
    "FALSE",
]

shape_specs = st.lists(
    st.tuples(st.sampled_from(TEMPLATES), st.integers(1, 4), st.integers(1, 4)),
    min_size=1,
    max_size=25,
)
small = st.integers(1, 4)
rows = st.tuples(
    st.none() | small.map(str),
    st.none() | small.map(lambda v: f"r{v}"),
    st.none() | st.sampled_from(["1", "2.0", "3.5", "4", "NaN"]),
    st.none() | small.map(lambda v: f"r{v} "),
    st.none() | small.map(lambda v: f"2024-01-0{v}"),
)


@settings(max_examples=150, deadline=None)
@given(shape_specs, st.lists(rows, min_size=1, max_size=20))
def test_route_equals_evaluating_every_shape(
    specs: list[tuple[str | None, int, int]], data: list[tuple[str | None, ...]]
) -> None:
    shapes = [
        bound(f"s{i}", None if t is None else t.format(a=a, b=b))
        for i, (t, a, b) in enumerate(specs)
    ]
    index = index_of(*shapes)
    for values in data:
        row = tuple(None if v is None else v.encode() for v in values)
        expected = {
            s.name for s in shapes if s.predicate is None or s.predicate.evaluate(row) is True
        }
        got = [s.name for s in index.route(row)]
        assert len(got) == len(set(got)), "a shape was routed twice"
        assert set(got) == expected
