"""Shapes validated against a real catalog: the happy path, and one scenario per error.

Each error must name the offending part and say what to do; the Relation built from
the catalog must be exactly the one pgoutput sends for the table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from tidemark.errors import ShapeError
from tidemark.pgoutput import messages as m
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.replication.catalog import validate_shape
from tidemark.shapes.catalog import CheckedShape
from tidemark.shapes.model import ShapeDefinition

from .conftest import PgDatabase

Conn = psycopg.AsyncConnection[tuple[object, ...]]


@pytest.fixture
async def conn(pg_db: PgDatabase) -> AsyncIterator[Conn]:
    async with await psycopg.AsyncConnection.connect(pg_db.dsn, autocommit=True) as c:
        yield c


def shape(
    table: str, where: str | None = None, columns: list[str] | None = None
) -> ShapeDefinition:
    return ShapeDefinition(
        name="s1", table=table, where=where, columns=tuple(columns) if columns else None
    )


async def rejected(conn: Conn, definition: ShapeDefinition) -> str:
    with pytest.raises(ShapeError) as caught:
        await validate_shape(conn, definition)
    return str(caught.value)


def relation_from_slot(db: PgDatabase, table: str, insert: str) -> m.Relation:
    """The Relation pgoutput really sends for ``table`` (through a throwaway slot)."""
    db.execute(f"create publication p_cat for table {table}")
    db.execute("select pg_create_logical_replication_slot('s_cat', 'pgoutput')")
    db.execute(insert)
    decoder = PgOutputDecoder(1)
    rows = db.execute(
        "select data from pg_logical_slot_get_binary_changes('s_cat', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'p_cat')"
    )
    messages = [decoder.decode(d) for (d,) in rows if isinstance(d, bytes)]
    relations = [r for r in messages if isinstance(r, m.Relation)]
    assert len(messages) == len(rows) and len(relations) == 1
    return relations[0]


# --------------------------------------------------------------------------------------
# happy paths


async def test_relation_from_the_catalog_is_the_one_pgoutput_sends(
    pg_db: PgDatabase, conn: Conn
) -> None:
    # given a table with a primary key, a dropped column, a generated column, a domain,
    # an enum, an inet and a varchar(20), with REPLICA IDENTITY FULL (the predicate
    # needs it)
    pg_db.execute(
        "create domain positive as integer check (value > 0);"
        "create type mood as enum ('sad', 'happy');"
        "create table orders (id bigint primary key, gone int, region varchar(20) not null,"
        " qty positive, feeling mood, total numeric(10, 2), host inet,"
        " doubled numeric generated always as (total * 2) stored);"
        "alter table orders drop column gone; alter table orders replica identity full"
    )
    # when the shape is validated against the catalog
    checked = await validate_shape(
        conn,
        shape("orders", where="qty > 3 AND region = 'eu'", columns=["region", "feeling", "host"]),
    )
    # then the relation equals what the stream will announce (minus the oid it carries)
    sent = relation_from_slot(
        pg_db, "orders", "insert into orders (id, region, qty) values (1, 'eu', 5)"
    )
    assert checked.relation == sent
    assert [c.name for c in sent.columns] == ["id", "region", "qty", "feeling", "total", "host"]
    # and the shape reads the domain as its base type, keeps the key, knows the enum
    # from the catalog, and says which output columns reach the lake as text
    assert [c.name for c in checked.shape.output_columns] == ["id", "region", "feeling", "host"]
    assert checked.shape.primary_key == ("id",)
    mood = next(c.type_oid for c in sent.columns if c.name == "feeling")
    assert checked.shape.types[mood].kind == "e"
    assert checked.as_text == (("host", "inet"),)
    assert checked.shape.predicate is not None
    row = (b"1", b"eu", b"5", None, None, None)
    assert checked.shape.predicate.matches(row)
    assert not checked.shape.predicate.matches((b"1", b"eu", b"2", None, None, None))


async def test_quoted_mixed_case_schema_table_and_columns(pg_db: PgDatabase, conn: Conn) -> None:
    # given a mixed-case schema, a table name with a space and a mixed-case column
    pg_db.execute(
        'create schema "Sales";'
        'create table "Sales"."Order Items" ("Id" int primary key, "Amount" numeric, note text);'
        'alter table "Sales"."Order Items" replica identity full'
    )
    # when a shape names them quoted
    checked = await validate_shape(
        conn, shape('"Sales"."Order Items"', where='"Amount" > 5', columns=['"Amount"'])
    )
    # then it binds to the exact catalog names
    assert (checked.relation.namespace, checked.relation.name) == ("Sales", "Order Items")
    assert [c.name for c in checked.shape.output_columns] == ["Id", "Amount"]
    assert checked.shape.predicate is not None
    assert checked.shape.predicate.columns_read == frozenset({"Amount"})


async def test_identity_full_without_primary_key_keys_by_the_whole_row(
    pg_db: PgDatabase, conn: Conn
) -> None:
    # given a table without primary key but with REPLICA IDENTITY FULL
    pg_db.execute(
        "create table events (kind text, at date); alter table events replica identity full"
    )
    # when validated; then every column is part of the identity and of the key
    checked = await validate_shape(conn, shape("events", where="kind = 'click'"))
    assert all(c.is_key for c in checked.relation.columns)
    assert checked.shape.row_key and checked.shape.primary_key == ("kind", "at")


async def test_identity_using_index_that_covers_the_key(pg_db: PgDatabase, conn: Conn) -> None:
    # given REPLICA IDENTITY USING INDEX on a unique index that contains the primary key
    pg_db.execute(
        "create table t (id int primary key, code text not null, v int);"
        "create unique index t_id_code on t (id, code);"
        "alter table t replica identity using index t_id_code"
    )
    # when validated; then the identity flags are the index columns, as pgoutput says
    checked = await validate_shape(conn, shape("t", where="code = 'x'"))
    sent = relation_from_slot(pg_db, "t", "insert into t values (1, 'x', 2)")
    assert checked.relation == sent
    assert [c.name for c in sent.columns if c.is_key] == ["id", "code"]


async def test_lower_with_collate_c_is_accepted_in_a_c_ctype_database(conn: Conn) -> None:
    # given the test database, whose LC_CTYPE is C
    await conn.execute("create table people (id int primary key, name text)")
    await conn.execute("alter table people replica identity full")
    # when lower() says COLLATE "C"; then the shape validates
    checked = await validate_shape(conn, shape("people", where="lower(name COLLATE \"C\") = 'ann'"))
    assert isinstance(checked, CheckedShape)


# --------------------------------------------------------------------------------------
# errors


async def test_missing_table_suggests_the_close_name(pg_db: PgDatabase, conn: Conn) -> None:
    # given a table public.orders
    pg_db.execute("create table orders (id int primary key)")
    # when a shape names public.orderz; then the error suggests public.orders
    message = await rejected(conn, shape("public.orderz"))
    assert "table public.orderz does not exist; did you mean public.orders?" in message


async def test_case_mismatch_suggests_the_quoted_name(pg_db: PgDatabase, conn: Conn) -> None:
    # given a table created with a quoted mixed-case name
    pg_db.execute('create table "Orders" (id int primary key)')
    # when the shape writes it unquoted (folded to lower case)
    message = await rejected(conn, shape("Orders"))
    # then the error points at the quoted spelling
    assert 'did you mean public."Orders"?' in message


async def test_a_table_with_no_close_name_says_only_that_it_is_missing(conn: Conn) -> None:
    message = await rejected(conn, shape("nothing_like_it"))
    assert message == "shape 's1': table public.nothing_like_it does not exist"


async def test_views_are_refused_and_partitioned_tables_need_fitting_partitions(
    pg_db: PgDatabase, conn: Conn
) -> None:
    # given a view, and a partitioned table whose identity its partition does not share
    pg_db.execute(
        "create table base (id int primary key); create view v as select * from base;"
        "create table parts (id int, primary key (id)) partition by range (id);"
        "create table parts_1 partition of parts for values from (0) to (100);"
        "alter table parts replica identity full"
    )
    # when shapes name them; then each error says what the relation is, or what to run
    assert "public.v is a view; logical replication publishes ordinary tables only" in (
        await rejected(conn, shape("v"))
    )
    assert "Run: ALTER TABLE public.parts_1 REPLICA IDENTITY FULL;" in await rejected(
        conn, shape("parts")
    )
    # and once it does, the partitioned table is accepted
    pg_db.execute("alter table parts_1 replica identity full")
    checked = await validate_shape(conn, shape("parts"))
    assert checked.shape.relation.name == "parts"


async def test_unreadable_table_says_which_grant_is_missing(pg_db: PgDatabase) -> None:
    # given a role that may log in but not read the table
    pg_db.execute(
        "create table secret (id int primary key);"
        "create role reader login password 'pw';"
        f'grant connect on database "{pg_db.name}" to reader'
    )
    dsn = pg_db.server.dsn_for(pg_db.name, "reader", "pw")
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as reader:
            message = await rejected(reader, shape("secret"))
    finally:
        pg_db.execute("drop owned by reader; drop role reader")
    # then the error names the GRANT to run
    assert "GRANT SELECT ON public.secret" in message


async def test_missing_column_suggests_the_close_name(pg_db: PgDatabase, conn: Conn) -> None:
    pg_db.execute("create table t (id int primary key, name text, amount int)")
    # when a listed column and a predicate column are misspelled
    listed = await rejected(conn, shape("t", columns=["naem"]))
    read = await rejected(conn, shape("t", where="ammount > 1"))
    # then each error suggests the real column and lists the available ones
    assert "lists column naem, which public.t does not have; did you mean name?" in listed
    assert "available columns: id, name, amount" in listed
    assert "predicate reads column ammount" in read and "did you mean amount?" in read


async def test_generated_columns_cannot_be_read(pg_db: PgDatabase, conn: Conn) -> None:
    pg_db.execute(
        "create table t (id int primary key, a int, b int generated always as (a * 2) stored)"
    )
    message = await rejected(conn, shape("t", columns=["b"]))
    assert "a generated column: logical replication does not send generated columns" in message


async def test_table_without_primary_key_suggests_replica_identity_full(
    pg_db: PgDatabase, conn: Conn
) -> None:
    pg_db.execute("create table t (a int, b int)")
    message = await rejected(conn, shape("t"))
    assert 'has no primary key: add one, or run ALTER TABLE "public"."t" REPLICA IDENTITY FULL' in (
        message
    )


async def test_replica_identity_nothing_is_refused(pg_db: PgDatabase, conn: Conn) -> None:
    pg_db.execute("create table t (id int primary key); alter table t replica identity nothing")
    message = await rejected(conn, shape("t"))
    assert "REPLICA IDENTITY NOTHING" in message and "REPLICA IDENTITY DEFAULT" in message


async def test_identity_index_without_the_primary_key_is_refused(
    pg_db: PgDatabase, conn: Conn
) -> None:
    pg_db.execute(
        "create table t (id int primary key, code text not null unique);"
        "alter table t replica identity using index t_code_key"
    )
    message = await rejected(conn, shape("t"))
    assert "does not include primary key column(s) id" in message


async def test_predicate_outside_the_identity_needs_replica_identity_full(
    pg_db: PgDatabase, conn: Conn
) -> None:
    pg_db.execute("create table t (id int primary key, region text)")
    message = await rejected(conn, shape("t", where="region = 'eu'"))
    assert "reads region" in message and 'ALTER TABLE "public"."t" REPLICA IDENTITY FULL' in message


async def test_predicate_on_an_enum_names_the_type(pg_db: PgDatabase, conn: Conn) -> None:
    pg_db.execute(
        "create type mood as enum ('sad', 'happy');"
        "create table t (id int primary key, feeling mood); alter table t replica identity full"
    )
    message = await rejected(conn, shape("t", where="feeling = 'sad'"))
    assert "reads column feeling of public.t, of type mood (an enum)" in message


async def test_lower_without_collate_c_in_a_c_ctype_database_is_refused(
    pg_db: PgDatabase, conn: Conn
) -> None:
    # given the test database (LC_CTYPE C: lower() maps ASCII only there)
    pg_db.execute(
        "create table t (id int primary key, name text); alter table t replica identity full"
    )
    # when a predicate lowers text without saying COLLATE "C"
    message = await rejected(conn, shape("t", where="lower(name) = 'ann'"))
    # then the error explains and shows the fix
    assert "change ASCII letters only under collation ctype 'C'" in message
    assert 'COLLATE "C"' in message


async def test_nondeterministic_collation_is_refused(pg_db: PgDatabase, conn: Conn) -> None:
    try:
        pg_db.execute(
            "create collation ci (provider = icu, locale = 'und-u-ks-level2',"
            " deterministic = false)"
        )
    except psycopg.Error:
        pytest.skip("this server was built without ICU")
    pg_db.execute("create table t (id int primary key, name text collate ci)")
    pg_db.execute("alter table t replica identity full")
    message = await rejected(conn, shape("t", where="name = 'Ann'"))
    assert "collation ci is nondeterministic" in message
