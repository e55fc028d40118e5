"""The source's catalog, read over a normal connection: the SQL side of shapes.

What a shape needs to know of its table before it is bound (``read_table``: the
table, its columns and their types, keys, replica identity, collations, domains and
the user-defined types they are made of), a partitioned table's members
(``read_tree``, ``has_rows``), and the publication's view of a partition
(``check_partition_publishing``); ``validate_shape`` reads a table and hands it to
``tidemark.shapes.catalog.check_shape``, the pure half. Beside them, what every
connection tidemark opens to the source shares: its session options
(``session_options``) and the rule for the names it creates (``check_name``).

The reads are plain SQL on ``pg_catalog``: inside a snapshot transaction they see the
catalog as of that snapshot.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from tidemark.errors import ConfigError, ShapeError
from tidemark.pgoutput.values.pgtype import FIRST_CATALOG_OID, CatalogType
from tidemark.shapes.catalog import (
    CatalogColumn,
    CatalogTable,
    CheckedShape,
    Collation,
    check_shape,
    missing_table_error,
)
from tidemark.shapes.model import ShapeDefinition
from tidemark.shapes.partitions import Member

Conn = psycopg.AsyncConnection[Any]

# Session settings that fix the text format of values the walsender sends.
SESSION_OPTIONS: Final = (
    "-c datestyle=ISO -c intervalstyle=postgres -c timezone=UTC "
    "-c extra_float_digits=3 -c bytea_output=hex"
)
_DEFAULT_COLLATION: Final = 100  # pg_collation's "default"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def session_options(dsn: str) -> str:
    """Our session settings appended to any ``options`` the DSN already carries."""
    from psycopg.conninfo import conninfo_to_dict

    given = str(conninfo_to_dict(dsn).get("options") or "").strip()
    return f"{given} {SESSION_OPTIONS}".strip()


def check_name(kind: str, name: str) -> str:
    """A name tidemark creates on the source (slot, publication): 1-63 lower-case
    letters, digits and '_', not starting with a digit (ConfigError otherwise)."""
    if not _NAME.match(name):
        raise ConfigError(
            f"invalid {kind} name {name!r}: use 1-63 lower-case letters, digits and '_', "
            "not starting with a digit"
        )
    return name


# -- a shape's table ---------------------------------------------------------------------

_TABLE: Final = """
select c.oid, c.relkind, c.relreplident, has_table_privilege(c.oid, 'SELECT'),
       c.relpersistence, c.relispartition
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = %s and c.relname = %s
"""
_CANDIDATES: Final = """
select n.nspname, c.relname
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p', 'v', 'm', 'f')
  and n.nspname not in ('pg_catalog', 'information_schema') and n.nspname !~ '^pg_toast'
"""
_COLUMNS: Final = """
select a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), t.typtype,
       a.attgenerated <> '', a.attcollation, co.collname, co.collprovider,
       coalesce(to_jsonb(co) ->> 'colllocale', to_jsonb(co) ->> 'colliculocale', co.collctype),
       co.collisdeterministic
from pg_attribute a
join pg_type t on t.oid = a.atttypid
left join pg_collation co on co.oid = a.attcollation
where a.attrelid = %s and a.attnum > 0 and not a.attisdropped
order by a.attnum
"""
_INDEX_COLUMNS: Final = """
select a.attname
from pg_index i
cross join lateral unnest(i.indkey) with ordinality as k(attnum, position)
join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
where i.indrelid = %s and i.{flag}
order by k.position
"""
_DOMAIN_CHAIN: Final = """
with recursive chain(oid, typtype, typbasetype, typtypmod, depth) as (
    select oid, typtype, typbasetype, typtypmod, 0 from pg_type where oid = %s
    union all
    select t.oid, t.typtype, t.typbasetype, t.typtypmod, c.depth + 1
    from chain c join pg_type t on t.oid = c.typbasetype
    where c.typtype = 'd'
)
select oid, typtype, typtypmod from chain order by depth
"""
# User-defined types of the given oids and, transitively, the types they are made of:
# array elements, domain bases, range subtypes, a multirange's range, composite
# attributes. Types with fixed oids (below FirstGenbkiObjectId) need no description.
_TYPES: Final = """
with recursive closure(oid) as (
    select unnest(%s::oid[])
  union
    select made_of.oid
    from closure c
    join pg_type t on t.oid = c.oid
    cross join lateral (
        select t.typelem where t.typcategory = 'A' and t.typelem <> 0
        union all select t.typbasetype where t.typtype = 'd'
        union all select r.rngsubtype from pg_range r where r.rngtypid = t.oid
        union all select r.rngtypid from pg_range r where r.rngmultitypid = t.oid
        union all
        select a.atttypid from pg_attribute a
        where t.typtype = 'c' and a.attrelid = t.typrelid and a.attnum > 0
          and not a.attisdropped
    ) made_of(oid)
    where c.oid >= %s
)
select t.oid, format_type(t.oid, null), t.typtype, t.typcategory, t.typelem, t.typbasetype,
       t.typtypmod,
       (select r.rngsubtype from pg_range r where r.rngtypid = t.oid),
       (select r.rngtypid from pg_range r where r.rngmultitypid = t.oid),
       (select coalesce(json_agg(json_build_array(a.attname, a.atttypid, a.atttypmod)
                                 order by a.attnum), '[]'::json)
        from pg_attribute a
        where t.typtype = 'c' and a.attrelid = t.typrelid and a.attnum > 0
          and not a.attisdropped)
from pg_type t
where t.oid in (select oid from closure) and t.oid >= %s
"""
_DATABASE: Final = """
select pg_encoding_to_char(d.encoding), d.datlocprovider,
       case when d.datlocprovider = 'c' then d.datctype
            else coalesce(to_jsonb(d) ->> 'datlocale', to_jsonb(d) ->> 'daticulocale') end
from pg_database d where d.datname = current_database()
"""


async def _rows(conn: Conn, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    cursor = await conn.execute(query, params)
    return list(await cursor.fetchall())


async def read_table(conn: Conn, definition: ShapeDefinition) -> CatalogTable:
    """The catalog's facts about ``definition``'s table (ShapeError if it is missing)."""
    found = await _rows(conn, _TABLE, (definition.schema_name, definition.table_name))
    if not found:
        existing = await _rows(conn, _CANDIDATES)
        raise ShapeError(missing_table_error(definition, [(s, n) for s, n in existing]))
    oid, kind, identity, can_select, persistence, partition = found[0]
    encoding, provider, locale = (await _rows(conn, _DATABASE))[0]
    database_collation = Collation("default", provider, locale or "", True)
    columns = []
    domains: dict[int, tuple[int, int]] = {}
    for row in await _rows(conn, _COLUMNS, (oid,)):
        name, type_oid, typmod, type_name, type_kind, generated = row[:6]
        collation_oid, collation_name, collation_provider, ctype, deterministic = row[6:]
        collation = None
        if collation_oid and collation_oid != _DEFAULT_COLLATION and collation_name is not None:
            collation = Collation(collation_name, collation_provider, ctype or "", deterministic)
        if type_kind == "d" and type_oid not in domains:
            domains[type_oid] = await _domain_base(conn, type_oid)
        columns.append(
            CatalogColumn(name, type_oid, typmod, type_name, type_kind, generated, collation)
        )
    types = await read_types(conn, [c.type_oid for c in columns])
    primary_key = [
        r[0] for r in await _rows(conn, _INDEX_COLUMNS.format(flag="indisprimary"), (oid,))
    ]
    identity_index: list[str] = []
    if identity == "i":
        query = _INDEX_COLUMNS.format(flag="indisreplident")
        identity_index = [r[0] for r in await _rows(conn, query, (oid,))]
    partitions = tuple(await read_tree(conn, oid)) if kind == "p" else ()
    return CatalogTable(
        oid=oid,
        partitions=partitions,
        schema=definition.schema_name,
        name=definition.table_name,
        kind=kind,
        replica_identity=identity,
        columns=tuple(columns),
        primary_key=tuple(primary_key),
        identity_index=tuple(identity_index),
        can_select=can_select,
        domain_bases=domains,
        encoding=encoding,
        database_collation=database_collation,
        persistence=persistence,
        partition=partition,
        types=types,
    )


async def read_types(conn: Conn, type_oids: Iterable[int]) -> dict[int, CatalogType]:
    """The catalog's description of the user-defined types among ``type_oids`` and of
    every type they are made of (``pgoutput.values.pgtype``)."""
    wanted = sorted({t for t in type_oids if t >= FIRST_CATALOG_OID})
    if not wanted:
        return {}
    types: dict[int, CatalogType] = {}
    rows = await _rows(conn, _TYPES, (wanted, FIRST_CATALOG_OID, FIRST_CATALOG_OID))
    for oid, name, typtype, category, element, base, typmod, subtype, range_oid, fields in rows:
        if typtype == "d":
            types[oid] = CatalogType(oid, name, "d", base, typmod)
        elif typtype == "r":
            types[oid] = CatalogType(oid, name, "r", subtype)
        elif typtype == "m":
            types[oid] = CatalogType(oid, name, "m", range_oid)
        elif typtype == "c":
            attributes = tuple((str(n), int(t), int(m)) for n, t, m in fields)
            types[oid] = CatalogType(oid, name, "c", fields=attributes)
        elif category == "A" and element:
            types[oid] = CatalogType(oid, name, "a", element)
        else:  # an enum ('e'), or a base or pseudo type without a mapping
            types[oid] = CatalogType(oid, name, typtype)
    return types


async def _domain_base(conn: Conn, domain_oid: int) -> tuple[int, int]:
    """(base type oid, typmod) under a chain of domains; the outermost typmod wins."""
    chain = await _rows(conn, _DOMAIN_CHAIN, (domain_oid,))
    typmod = next((m for _, kind, m in chain if kind == "d" and m >= 0), -1)
    return chain[-1][0], typmod


async def validate_shape(conn: Conn, definition: ShapeDefinition) -> CheckedShape:
    """Read ``definition``'s table from the catalog and check and bind the shape."""
    return check_shape(definition, await read_table(conn, definition))


async def check_partition_publishing(
    conn: Conn,
    catalog: CatalogTable,
    shaped: Callable[[], Mapping[int, str]],
    publication: str,
    *,
    publish_all_tables: bool,
) -> None:
    """A partitioned table's changes are published as its root's: a shape on one of
    its partitions receives nothing while the root is published that way. Refuse the
    shape that would be left without changes (ShapeError, saying what to do).
    ``shaped`` gives the relations other shapes follow (oid -> shape name); it is asked
    only for a partitioned table or a partition (at 1000 shapes on one plain table,
    neither the other shapes nor the catalog's ancestors are looked at)."""
    table = catalog.qualified_name
    if catalog.kind == "p":
        others = shaped()
        clash = sorted(others[m.oid] for m in catalog.partitions if m.oid in others)
        if clash:
            raise ShapeError(
                f"shape(s) {', '.join(clash)} follow partitions of {table}, whose changes "
                f"are published as {table}'s once a shape follows it: they would receive "
                f"nothing. Define them on {table} with a 'where' on the partition key, or "
                "remove them first"
            )
        return
    if catalog.partition is False:  # (None: not read; ask the catalog)
        return
    ancestors = [
        int(r[0])
        for r in await _rows(
            conn,
            "select relid::bigint from pg_partition_ancestors(%s) where relid <> %s",
            (catalog.oid, catalog.oid),
        )
    ]
    if not ancestors:
        return
    rows = await _rows(
        conn,
        "select p.puballtables, p.pubviaroot, exists (select 1 from pg_publication_rel r"
        " where r.prpubid = p.oid and r.prrelid = any(%s)) from pg_publication p"
        " where p.pubname = %s",
        (ancestors, publication),
    )
    if not rows:  # tidemark creates it: FOR ALL TABLES publishes via the root
        others = shaped()
        via_root = publish_all_tables or any(a in others for a in ancestors)
    else:
        row = rows[0]
        via_root = bool(row[1]) and (bool(row[0]) or bool(row[2]))
    if via_root:
        raise ShapeError(
            f"{table} is a partition, and publication '{publication}' publishes its "
            "changes as its partitioned root's (publish_via_partition_root, with the root "
            "published): a shape on the partition would receive nothing. Define the "
            "shape on the root with a 'where' on the partition key"
        )


# -- a partitioned table's members ---------------------------------------------------------

_TREE: Final = """
with recursive tree(relid, parent, link) as (
    select i.inhrelid, i.inhparent, i.xmin::text from pg_inherits i where i.inhparent = %s
  union all
    select i.inhrelid, i.inhparent, i.xmin::text
    from pg_inherits i join tree t on i.inhparent = t.relid
)
select t.relid::bigint, n.nspname, c.relname, c.relkind, c.relfilenode::bigint,
       t.parent::bigint, t.link, c.relreplident,
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint,
       greatest(c.reltuples, 0)::bigint, has_table_privilege(c.oid, 'SELECT')
from tree t join pg_class c on c.oid = t.relid join pg_namespace n on n.oid = c.relnamespace
order by n.nspname, c.relname
"""


async def read_tree(conn: Conn, root_oid: int) -> list[Member]:
    """Every member below ``root_oid``, as the transaction on ``conn`` sees the catalog."""
    cursor = await conn.execute(_TREE, (root_oid,))
    return [
        Member(
            int(r[0]),
            str(r[1]),
            str(r[2]),
            str(r[3]),
            int(r[4]),
            int(r[5]),
            str(r[6]),
            str(r[7]),
            int(r[8]),
            int(r[9]),
        )
        for r in await cursor.fetchall()
    ]


async def has_rows(conn: Conn, member: Member) -> bool:
    query = sql.SQL("select exists (select 1 from only {}.{})").format(
        sql.Identifier(member.schema), sql.Identifier(member.name)
    )
    row = await (await conn.execute(query)).fetchone()
    return bool(row and row[0])
