"""Shape definitions (validation, canonical identifiers) and binding them to a table."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import ShapeError, TidemarkError
from tidemark.pgoutput.messages import Relation, RelationColumn
from tidemark.shapes.model import (
    BoundShape,
    ShapeDefinition,
    ShapeResync,
    bind,
    format_identifier,
    parse_identifiers,
    rebind,
)


def relation(
    identity: str = "d", *columns: RelationColumn, name: str = "orders", namespace: str = "public"
) -> Relation:
    cols = columns or (
        RelationColumn("id", 23, -1, identity in "df"),
        RelationColumn("region", 25, -1, identity == "f"),
        RelationColumn("amount", 1700, -1, identity == "f"),
        RelationColumn("note", 25, -1, identity == "f"),
    )
    return Relation(16384, namespace, name, identity, cols)  # type: ignore[arg-type]


def shape(**fields: Any) -> ShapeDefinition:
    fields.setdefault("name", "s")
    fields.setdefault("table", "orders")
    return ShapeDefinition(**fields)


# --- definitions ------------------------------------------------------------------------


def test_a_minimal_definition_takes_every_row_and_column_of_a_public_table() -> None:
    definition = shape(name="all_orders")
    assert definition.table == "public.orders"
    assert (definition.schema_name, definition.table_name) == ("public", "orders")
    assert definition.where is None and definition.predicate is None
    assert definition.columns is None and definition.column_names is None
    assert definition.replica == "default"


@pytest.mark.parametrize(
    ("given", "canonical", "parts"),
    [
        ("orders", "public.orders", ("public", "orders")),
        ("Sales.Orders", "sales.orders", ("sales", "orders")),
        ('"MySchema"."Orders"', '"MySchema"."Orders"', ("MySchema", "Orders")),
        ('  "my schema" . "a""b" ', '"my schema"."a""b"', ("my schema", 'a"b')),
        ('"lower".x', "lower.x", ("lower", "x")),
        ("ÉTÉ.t", '"ÉtÉ".t', ("ÉtÉ", "t")),  # only ASCII letters fold
    ],
)
def test_table_names_fold_like_sql_identifiers_and_are_stored_canonically(
    given: str, canonical: str, parts: tuple[str, str]
) -> None:
    definition = shape(table=given)
    assert definition.table == canonical
    assert (definition.schema_name, definition.table_name) == parts
    assert shape(table=canonical) == definition  # canonical form re-validates to itself


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"name": "Orders"}, "field 'name'"),
        ({"name": "1orders"}, "not a valid shape name"),
        ({"name": "a-b"}, "not a valid shape name"),
        ({"name": "x" * 64}, "not a valid shape name"),
        ({"name": ""}, "not a valid shape name"),
        ({"table": "a.b.c"}, "field 'table'"),
        ({"table": '"unterminated'}, "unterminated"),
        ({"table": "a..b"}, "not a valid identifier"),
        ({"table": ""}, "not a valid identifier"),
        ({"table": '""'}, "empty quoted identifier"),
        ({"table": "my table"}, "unexpected"),
        ({"table": "x" * 64}, "63 bytes"),
        ({"columns": []}, "omit 'columns'"),
        ({"columns": ["id", "ID"]}, "listed twice"),
        ({"columns": ["orders.id"]}, "plain column name"),
        ({"replica": "index"}, "field 'replica'"),
        ({"colums": ["id"]}, "field 'colums'"),
        ({"where": "id = "}, "field 'where'"),
        ({"where": "now() > ts"}, "not deterministic"),
        ({"where": "other.id = 1"}, "another table"),
        ({"name": 7}, "field 'name'"),
    ],
)
def test_invalid_definitions_raise_shape_error_naming_the_field(
    fields: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ShapeError, match=re.escape(fragment)):
        shape(**fields)


def test_validation_errors_are_tidemark_errors_from_every_entry_point() -> None:
    # given a bad definition as a dict (as read from a file or the API)
    data = {"name": "Bad", "table": "orders"}
    with pytest.raises(TidemarkError, match="shape 'Bad' is invalid"):
        ShapeDefinition.model_validate(data)
    with pytest.raises(ShapeError):
        ShapeDefinition.model_validate_json('{"name": "x", "table": "a.b.c"}')


def test_columns_are_identifiers_stored_canonically() -> None:
    definition = shape(columns=["ID", '"Name"', "note"])
    assert definition.columns == ("id", '"Name"', "note")
    assert definition.column_names == ("id", "Name", "note")


def test_a_blank_where_means_no_predicate_and_a_where_is_parsed_at_definition() -> None:
    assert shape(where="  ").where is None
    definition = shape(where="Region = 'x' AND orders.id > 1")
    assert definition.predicate is not None
    assert definition.predicate.columns_read == frozenset({"region", "id"})


def test_definitions_round_trip_through_json_and_are_hashable_values() -> None:
    definition = shape(
        name="eu",
        table='"Sales"."Orders"',
        where="region = 'eu'",
        columns=["id", "region"],
        replica="full",
    )
    again = ShapeDefinition.model_validate_json(definition.model_dump_json())
    assert again == definition
    assert hash(again) == hash(definition)
    assert {definition, again} == {definition}


identifier = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=20,
).filter(lambda s: len(s.encode()) <= 63)


@given(identifier)
def test_any_name_survives_format_then_parse(name: str) -> None:
    # format_identifier quotes exactly when needed; parsing gives back the same name
    assert parse_identifiers(format_identifier(name)) == (name,)


# --- binding ----------------------------------------------------------------------------


def test_binding_projects_the_listed_columns_plus_the_key_in_table_order() -> None:
    bound = bind(shape(columns=["note", "region"]), relation(), ["id"])
    assert [c.name for c in bound.output_columns] == ["id", "region", "note"]
    assert bound.projection == (0, 1, 3)
    assert bound.project((b"1", b"eu", b"5", b"n")) == (b"1", b"eu", b"n")
    assert bound.key_positions == (0,)
    assert bound.primary_key == ("id",)


def test_binding_without_a_column_list_projects_the_row_itself() -> None:
    bound = bind(shape(), relation(), ["id"])
    data = (b"1", b"eu", b"5", None)
    assert bound.project(data) is data


def test_a_predicate_on_the_key_works_with_the_default_replica_identity() -> None:
    bound = bind(shape(where="id > 10"), relation("d"), ["id"])
    assert bound.predicate is not None
    assert bound.predicate_positions == frozenset({0})


@pytest.mark.parametrize(
    ("definition", "rel", "key", "fragment"),
    [
        (shape(columns=["nope"]), relation(), ["id"], "available columns: id, region"),
        (shape(where="nope = 1"), relation(), ["id"], '"nope"'),
        (
            shape(where="region = 'x'"),
            relation("d"),
            ["id"],
            'ALTER TABLE "public"."orders" REPLICA IDENTITY FULL',
        ),
        (shape(where="region = 'x'"), relation("d"), ["id"], "reads region"),
        (shape(replica="full"), relation("d"), ["id"], "replica='full'"),
        (shape(), relation("d"), [], "has no primary key"),
        (shape(), relation("n"), ["id"], "REPLICA IDENTITY NOTHING"),
        (shape(), relation("i"), ["id"], "does not include primary key column(s) id"),
        (shape(columns=["id"]), relation("f"), [], "cannot select columns"),
        (shape(), relation("f"), ["missing"], "not among its columns"),
        (shape(table="other"), relation(), ["id"], "not on"),
        (
            shape(where="doc IS NOT NULL"),
            relation(
                "f", RelationColumn("id", 23, -1, True), RelationColumn("doc", 3802, -1, True)
            ),
            ["id"],
            "jsonb",
        ),
    ],
)
def test_binding_rejects_what_the_table_cannot_serve(
    definition: ShapeDefinition, rel: Relation, key: list[str], fragment: str
) -> None:
    with pytest.raises(ShapeError, match=re.escape(fragment)):
        bind(definition, rel, key)


def test_a_table_without_primary_key_but_full_identity_is_keyed_by_the_whole_row() -> None:
    bound = bind(shape(where="region = 'x'"), relation("f"), [])
    assert bound.row_key is True
    assert bound.primary_key == ("id", "region", "amount", "note")
    assert bound.key_positions == (0, 1, 2, 3)


def test_replica_identity_using_an_index_that_covers_the_key_is_enough() -> None:
    rel = relation(
        "i",
        RelationColumn("id", 23, -1, True),
        RelationColumn("tenant", 23, -1, True),
        RelationColumn("note", 25, -1, False),
    )
    bound = bind(shape(where="tenant = 3"), rel, ["id"])
    assert bound.predicate is not None
    with pytest.raises(ShapeError, match="note"):
        bind(shape(where="note = 'x'"), rel, ["id"])


def test_quoted_names_bind_to_case_sensitive_catalog_names() -> None:
    rel = relation(
        "f",
        RelationColumn("Id", 23, -1, True),
        RelationColumn("Region", 25, -1, True),
        name="Orders",
        namespace="MySchema",
    )
    definition = ShapeDefinition(
        name="s", table='"MySchema"."Orders"', where="\"Region\" = 'x'", columns=('"Region"',)
    )
    bound = bind(definition, rel, ["Id"])
    assert [c.name for c in bound.output_columns] == ["Id", "Region"]
    assert bound.predicate is not None
    assert bound.predicate.matches((b"1", b"x")) is True


# --- schema changes ---------------------------------------------------------------------


def _full(*columns: tuple[str, int]) -> Relation:
    return relation("f", *(RelationColumn(n, t, -1, True) for n, t in columns))


BASE = _full(("id", 23), ("region", 25), ("amount", 1700), ("note", 25))


def test_an_unchanged_relation_keeps_the_same_binding() -> None:
    bound = bind(shape(where="region = 'x'"), BASE, ["id"])
    assert rebind(bound, _full(("id", 23), ("region", 25), ("amount", 1700), ("note", 25))) is bound


def test_an_added_column_joins_shapes_without_a_column_list_only() -> None:
    # given two shapes; when a column is added; then only the all-columns shape gets it
    everything = bind(shape(name="all"), BASE, ["id"])
    some = bind(shape(name="some", columns=["region"]), BASE, ["id"])
    grown = _full(("id", 23), ("region", 25), ("amount", 1700), ("note", 25), ("extra", 16))
    everything2, some2 = rebind(everything, grown), rebind(some, grown)
    assert isinstance(everything2, BoundShape) and isinstance(some2, BoundShape)
    assert [c.name for c in everything2.output_columns][-1] == "extra"
    assert everything2.project((b"1", b"r", b"2", b"n", b"t"))[-1] == b"t"
    assert [c.name for c in some2.output_columns] == ["id", "region"]


def test_a_dropped_column_stays_in_the_output_as_null_and_positions_follow() -> None:
    # given a predicate on amount (position 2); when region (position 1) is dropped;
    # then region becomes NULL and the predicate reads amount at its new position
    bound = bind(shape(where="amount > 5"), BASE, ["id"])
    shrunk = _full(("id", 23), ("amount", 1700), ("note", 25))
    after = rebind(bound, shrunk)
    assert isinstance(after, BoundShape)
    assert [c.name for c in after.output_columns] == ["id", "region", "amount", "note"]
    assert after.project((b"1", b"7", b"n")) == (b"1", None, b"7", b"n")
    assert after.predicate is not None and after.predicate.matches((b"1", b"7", b"n"))


@pytest.mark.parametrize(
    ("definition", "new_relation", "fragment"),
    [
        (
            shape(where="region = 'x'"),
            _full(("id", 23), ("amount", 1700), ("note", 25)),
            "predicate column region was dropped",
        ),
        (
            shape(),
            _full(("region", 25), ("amount", 1700), ("note", 25)),
            "primary key column id was dropped",
        ),
        (
            shape(),
            _full(("id", 20), ("region", 25), ("amount", 1700), ("note", 25)),
            "column id of",
        ),
        (
            shape(columns=["region"]),
            _full(("id", 23), ("region", 1043), ("amount", 1700)),
            "column region of",
        ),
        (
            shape(where="region = 'x'"),
            relation(
                "d", RelationColumn("id", 23, -1, True), RelationColumn("region", 25, -1, False)
            ),
            "REPLICA IDENTITY FULL",
        ),
    ],
)
def test_changes_a_shape_cannot_follow_ask_for_a_resync(
    definition: ShapeDefinition, new_relation: Relation, fragment: str
) -> None:
    bound = bind(definition, BASE, ["id"])
    outcome = rebind(bound, new_relation)
    assert isinstance(outcome, ShapeResync)
    assert outcome.shape == "s"
    assert fragment in outcome.reason


def test_a_column_type_change_outside_the_shape_is_followed() -> None:
    bound = bind(shape(columns=["region"]), BASE, ["id"])
    retyped = _full(("id", 23), ("region", 25), ("amount", 701), ("note", 25))
    assert isinstance(rebind(bound, retyped), BoundShape)


def test_a_new_primary_key_under_the_default_identity_asks_for_a_resync() -> None:
    rel = relation("d")
    bound = bind(shape(), rel, ["id"])
    moved = relation(
        "d",
        RelationColumn("id", 23, -1, False),
        RelationColumn("region", 25, -1, True),
        RelationColumn("amount", 1700, -1, False),
        RelationColumn("note", 25, -1, False),
    )
    outcome = rebind(bound, moved)
    assert isinstance(outcome, ShapeResync) and "primary key" in outcome.reason
