"""The pure half of live-catalog validation: catalog facts in, a bound shape or a clear
ShapeError out (the IO half is tested against Postgres in tests/integration)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import Relation, RelationColumn
from tidemark.shapes.catalog import (
    CatalogColumn,
    CatalogTable,
    Collation,
    check_shape,
    missing_table_error,
)
from tidemark.shapes.model import ShapeDefinition, resolve_domains

LIBC_UTF8 = Collation("default", "c", "en_US.UTF-8", True)
LIBC_C = Collation("default", "c", "C", True)
MOOD, POSITIVE = 16390, 16400  # an enum and a domain over integer


def column(name: str, oid: int = 23, type_name: str = "integer", **kw: Any) -> CatalogColumn:
    kw.setdefault("type_modifier", -1)
    kw.setdefault("type_kind", "b")
    kw.setdefault("generated", False)
    kw.setdefault("collation", None)
    return CatalogColumn(name=name, type_oid=oid, type_name=type_name, **kw)


def table(**kw: Any) -> CatalogTable:
    defaults: dict[str, Any] = {
        "oid": 5000,
        "schema": "public",
        "name": "orders",
        "kind": "r",
        "replica_identity": "f",
        "columns": (
            column("id"),
            column("region", 25, "text"),
            column("qty", POSITIVE, "positive", type_kind="d"),
            column("feeling", MOOD, "mood", type_kind="e"),
            column("twice", 23, "integer", generated=True),
        ),
        "primary_key": ("id",),
        "identity_index": (),
        "can_select": True,
        "domain_bases": {POSITIVE: (23, -1)},
        "encoding": "UTF8",
        "database_collation": LIBC_UTF8,
    }
    return CatalogTable(**{**defaults, **kw})


def shape(where: str | None = None, columns: tuple[str, ...] | None = None) -> ShapeDefinition:
    return ShapeDefinition(name="s1", table="orders", where=where, columns=columns)


def refused(definition: ShapeDefinition, facts: CatalogTable) -> str:
    with pytest.raises(ShapeError) as caught:
        check_shape(definition, facts)
    return str(caught.value)


# --------------------------------------------------------------------------------------
# the Relation pgoutput would send


@pytest.mark.parametrize(
    ("identity", "index", "keys"),
    [
        ("d", (), ["id"]),
        ("i", ("id", "region"), ["id", "region"]),
        ("f", (), ["id", "region", "qty", "feeling"]),
        ("n", (), []),
    ],
)
def test_identity_flags_follow_the_replica_identity(
    identity: str, index: tuple[str, ...], keys: list[str]
) -> None:
    # given a table with a generated column, under each replica identity
    relation = table(replica_identity=identity, identity_index=index).relation()
    # then the generated column is not sent and is_key marks the identity columns
    assert [c.name for c in relation.columns] == ["id", "region", "qty", "feeling"]
    assert [c.name for c in relation.columns if c.is_key] == keys
    # and declared types are kept (the domain is still the domain)
    assert relation.columns[2].type_oid == POSITIVE


def test_domains_resolve_to_their_base_type_and_nothing_else_changes() -> None:
    relation = table().relation()
    resolved = resolve_domains(relation, {POSITIVE: (1700, 655366)})
    assert resolved.columns[2] == RelationColumn("qty", 1700, 655366, True)
    assert resolved.columns[:2] == relation.columns[:2] and resolved.oid == relation.oid
    assert resolve_domains(relation, {}) is relation


# --------------------------------------------------------------------------------------
# happy path


def test_a_valid_shape_binds_with_domains_as_base_types_and_lists_text_columns() -> None:
    # given a predicate on the domain column and an enum among the output columns
    checked = check_shape(shape("qty > 3", ("feeling",)), table())
    # then it binds, reads the domain as an integer, and reports the enum as text
    assert checked.shape.predicate is not None
    assert checked.shape.predicate.matches((b"1", None, b"4", None))
    assert checked.as_text == (("feeling", "mood"),)
    assert checked.relation == table().relation()


# --------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("v", "public.orders is a view; logical replication publishes ordinary tables only"),
        ("m", "is a materialized view"),
        ("f", "is a foreign table"),
    ],
)
def test_relations_that_are_not_plain_tables_are_refused(kind: str, fragment: str) -> None:
    assert fragment in refused(shape(), table(kind=kind))


def test_a_partitioned_table_is_accepted_unless_its_partitions_cannot_serve_it() -> None:
    from tidemark.shapes.partitions import Member

    def part(name: str, kind: str = "r", identity: str = "f") -> Member:
        return Member(9, "public", name, kind, 1, 1, "5", identity, 1, 1)

    ok = check_shape(shape(), table(kind="p", partitions=(part("orders_1"),)))
    assert ok.shape.name == shape().name
    message = refused(shape(), table(kind="p", partitions=(part("orders_x", kind="f"),)))
    assert "public.orders_x of public.orders are foreign tables" in message


def test_an_unreadable_table_names_the_grant() -> None:
    assert "GRANT SELECT ON public.orders" in refused(shape(), table(can_select=False))


def test_unknown_columns_suggest_close_names() -> None:
    message = refused(shape(columns=("regoin",)), table())
    assert "lists column regoin, which public.orders does not have; did you mean region?" in (
        message
    )
    assert "available columns: id, region, qty, feeling" in message  # not the generated one


def test_a_column_differing_only_in_case_suggests_its_quoted_name() -> None:
    facts = table(columns=(column("id"), column("Region", 25, "text")))
    assert 'did you mean "Region"?' in refused(shape("region = 'x'"), facts)


def test_generated_columns_are_refused_with_the_reason() -> None:
    assert "twice of public.orders, a generated column" in refused(shape("twice > 1"), table())


def test_a_predicate_on_an_enum_names_the_type_and_its_kind() -> None:
    message = refused(shape("feeling = 'sad'"), table())
    assert "reads column feeling of public.orders, of type mood (an enum)" in message


def test_text_predicates_need_a_utf8_database() -> None:
    message = refused(shape("region = 'eu'"), table(encoding="LATIN1"))
    assert "database encoding is LATIN1" in message
    # an integer predicate does not read text: fine in any encoding
    assert check_shape(shape("id = 1"), table(encoding="LATIN1")).shape.predicate is not None


def test_nondeterministic_collations_are_refused() -> None:
    ci = Collation("case_insensitive", "i", "und-u-ks-level2", False)
    facts = table(columns=(column("id"), column("region", 25, "text", collation=ci)))
    assert "collation case_insensitive is nondeterministic" in refused(
        shape("region = 'eu'"), facts
    )


@pytest.mark.parametrize(
    "where", ["lower(region) = 'eu'", "upper(region) = 'EU'", "region ILIKE 'e%'"]
)
def test_case_mapping_in_a_c_ctype_database_must_say_collate_c(where: str) -> None:
    # given a database whose LC_CTYPE is C (case mapping of ASCII letters only)
    facts = table(database_collation=LIBC_C)
    # when the predicate maps case without COLLATE "C"; then the error shows the fix
    message = refused(shape(where), facts)
    assert "ASCII letters only under collation ctype 'C'" in message
    assert 'COLLATE "C"' in message
    # and with COLLATE "C" it is accepted: Postgres and tidemark both map ASCII only
    fixed = where.replace("region", 'region COLLATE "C"', 1)
    assert check_shape(shape(fixed), facts).shape.predicate is not None


def test_a_c_collation_on_the_column_counts_as_well() -> None:
    facts = table(
        columns=(column("id"), column("region", 25, "text", collation=replace(LIBC_C, name="C")))
    )
    assert "ASCII letters only" in refused(shape("lower(region) = 'eu'"), facts)


def test_case_mapping_in_a_unicode_database_is_accepted() -> None:
    assert check_shape(shape("lower(region) = 'eu'"), table()).shape.predicate is not None


# --------------------------------------------------------------------------------------
# a table that does not exist


EXISTING = [("public", "orders"), ("public", "Customers"), ("sales", "orderz_archive")]


@pytest.mark.parametrize(
    ("table_name", "expected"),
    [
        ("orderz", "table public.orderz does not exist; did you mean public.orders?"),
        ("customers", 'did you mean public."Customers"?'),
        ("sales.orderz_archve", "did you mean sales.orderz_archive?"),
        ("orderz_archive", "did you mean sales.orderz_archive?"),
        ("zzz", "table public.zzz does not exist"),
    ],
)
def test_missing_tables_suggest_the_closest_names(table_name: str, expected: str) -> None:
    definition = ShapeDefinition(name="s1", table=table_name)
    message = missing_table_error(definition, EXISTING)
    assert expected in message
    if table_name == "zzz":
        assert message == "shape 's1': table public.zzz does not exist"


def test_relation_keeps_oid_and_names() -> None:
    relation = table(schema="Sales", name="Order Items").relation()
    assert isinstance(relation, Relation)
    assert (relation.oid, relation.namespace, relation.name) == (5000, "Sales", "Order Items")


# --------------------------------------------------------------------------------------
# tables logical replication cannot publish


@pytest.mark.parametrize(
    ("persistence", "expected"),
    [("u", "is unlogged"), ("t", "is a temporary table")],
)
def test_unlogged_and_temporary_tables_are_refused_with_what_to_do(
    persistence: str, expected: str
) -> None:
    message = refused(shape(), table(persistence=persistence))
    assert expected in message and "logical replication" in message


def test_an_unlogged_table_is_told_how_to_become_logged() -> None:
    assert "ALTER TABLE public.orders SET LOGGED" in refused(shape(), table(persistence="u"))


@pytest.mark.parametrize("schema", ["pg_catalog", "information_schema", "pg_toast"])
def test_system_catalogs_are_refused_as_such(schema: str) -> None:
    definition = ShapeDefinition(name="s1", table=f"{schema}.orders")
    message = refused(definition, table(schema=schema))
    assert "system catalog" in message and "REPLICA IDENTITY" not in message


def test_under_a_full_identity_every_partition_needs_it_and_the_message_says_how() -> None:
    from tidemark.shapes.partitions import Member

    leaf = Member(9, "public", "orders_2", "r", 1, 1, "5", "d", 1, 1)
    message = refused(shape(), table(kind="p", replica_identity="f", partitions=(leaf,)))
    assert "Run: ALTER TABLE public.orders_2 REPLICA IDENTITY FULL;" in message
