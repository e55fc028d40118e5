"""Shapes against the live catalog: the table as Postgres has it, checked before binding.

``tidemark.replication.catalog.validate_shape(conn, definition)`` reads the shape's
table from the source database (one normal connection, a handful of catalog queries)
and returns a ``CheckedShape``: the ``BoundShape`` and the ``Relation`` exactly as
pgoutput will describe the table. ``read_table`` there is the IO half; this module is
the pure half, ``check_shape`` (unit-tested without Postgres). Every problem is a
``ShapeError`` that names the offending part and says what to do:

* the table must exist (close matches are suggested: ``public.orderz`` ->
  ``public.orders``; a case mismatch suggests the quoted name), be an ordinary table
  (views, materialized and foreign tables are not replicated), or a partitioned
  table (``tidemark.shapes.partitions``: its leaves must not be foreign tables, and
  under ``REPLICA IDENTITY FULL`` each leaf needs it too), and be readable by our role
  (the snapshot of a new shape reads it);
* listed and predicate columns must exist (close matches suggested) and not be
  generated columns, which pgoutput does not send (PostgreSQL 15-17);
* primary key and replica identity rules are ``model.bind``'s (each with the
  ``ALTER TABLE ... REPLICA IDENTITY ...`` to run);
* text the predicate reads must be UTF-8 with a deterministic collation (a
  nondeterministic one makes '=' ignore case or accents); ``lower``/``upper``/
  ``ILIKE`` without ``COLLATE "C"`` need a database or column ctype that maps case
  per Unicode character: under ``LC_CTYPE=C`` Postgres changes ASCII letters only,
  and the message says to write ``COLLATE "C"``, which tidemark then evaluates
  exactly.

Types. The Relation keeps the declared type oids, as pgoutput sends them. A domain
is read as its base type (``resolve_domains``): the predicate sees integers for a
domain over integer, and writers get the base type's column. The collector must
resolve every Relation from the stream with the same ``domain_bases`` so that
``rebind`` sees the same types. User-defined types (enums, composites, ranges,
domains, arrays of them, and what they are made of) are described by
``tidemark.replication.catalog.read_types`` (``CatalogTable.types``); the bound shape
keeps that description, so its writers give enums, composites and ranges their lake
types (``pgoutput.values.pgtype``).
A predicate may read only the types listed in ``tidemark.predicates.compiler`` (after
domain resolution); enums, ranges, composite types, json, intervals and the like are
refused there with the type's name. Projected columns of a type without a mapping
are accepted and reach the lake as their Postgres text output (lossless, but a string
column): ``CheckedShape.as_text`` lists them so the caller can say so. A column the
shape declares ``::numeric(p,s)`` must be numeric (or a domain over it).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import Relation, RelationColumn, ReplicaIdentity
from tidemark.pgoutput.values.oids import NUMERIC
from tidemark.pgoutput.values.pgtype import (
    TypeCatalog,
    describe,
)
from tidemark.predicates.identifiers import format_identifier
from tidemark.predicates.sqltypes import SCALARS, sql_type
from tidemark.shapes.model import BoundShape, ShapeDefinition, bind, resolve_domains
from tidemark.shapes.partitions import Member, identity_problem

_KIND_NAMES: Final = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "S": "a sequence",
    "i": "an index",
    "I": "a partitioned index",
    "c": "a composite type",
    "t": "a TOAST table",
}
_TYPE_KINDS: Final = {
    "c": "a composite type",
    "e": "an enum",
    "r": "a range type",
    "m": "a multirange type",
    "p": "a pseudo-type",
}


@dataclass(frozen=True, slots=True)
class Collation:
    """How a column (or the database) compares and maps case."""

    name: str
    provider: str  # 'c' libc, 'i' ICU, 'b' builtin (PostgreSQL 17), 'd' database default
    ctype: str  # LC_CTYPE of a libc collation, the locale of an ICU or builtin one
    deterministic: bool

    @property
    def ascii_case_only(self) -> bool:
        """lower()/upper() change only ASCII letters (Postgres's "C" behaviour)."""
        return self.provider in ("c", "b") and self.ctype in ("C", "POSIX")


@dataclass(frozen=True, slots=True)
class CatalogColumn:
    """One live column (``pg_attribute``, attnum > 0, not dropped)."""

    name: str
    type_oid: int
    type_modifier: int
    type_name: str  # format_type(), e.g. 'character varying(20)'
    type_kind: str  # pg_type.typtype: b base, d domain, e enum, c composite, r range ...
    generated: bool
    collation: Collation | None  # None: not a collatable type, or the default


@dataclass(frozen=True, slots=True)
class CatalogTable:
    """What the catalog says about one table, as plain values."""

    oid: int
    schema: str
    name: str
    kind: str  # pg_class.relkind
    replica_identity: ReplicaIdentity
    columns: tuple[CatalogColumn, ...]
    primary_key: tuple[str, ...]
    identity_index: tuple[str, ...]  # columns of REPLICA IDENTITY USING INDEX, else ()
    can_select: bool
    domain_bases: Mapping[int, tuple[int, int]]  # domain oid -> (base oid, base typmod)
    encoding: str  # the database's server encoding
    database_collation: Collation
    persistence: str = "p"  # pg_class.relpersistence: p permanent, u unlogged, t temporary
    partitions: tuple[Member, ...] = ()  # members below a partitioned table
    partition: bool | None = None  # pg_class.relispartition (None: not read)
    # user-defined types the columns use, and the types those are made of
    types: TypeCatalog = field(default_factory=dict)

    @property
    def qualified_name(self) -> str:
        return f"{format_identifier(self.schema)}.{format_identifier(self.name)}"

    def relation(self) -> Relation:
        """The Relation pgoutput sends for this table: published columns (generated
        ones are not), declared type oids, and the replica-identity flag per column."""
        if self.replica_identity == "f":
            identity = {c.name for c in self.columns}
        elif self.replica_identity == "i":
            identity = set(self.identity_index)
        elif self.replica_identity == "d":
            identity = set(self.primary_key)
        else:
            identity = set()
        return Relation(
            oid=self.oid,
            namespace=self.schema,
            name=self.name,
            replica_identity=self.replica_identity,
            columns=tuple(
                RelationColumn(c.name, c.type_oid, c.type_modifier, c.name in identity)
                for c in self.columns
                if not c.generated
            ),
        )


@dataclass(frozen=True, slots=True)
class CheckedShape:
    """A shape validated against the live table."""

    shape: BoundShape  # bound to the domain-resolved relation
    relation: Relation  # as pgoutput will describe the table
    as_text: tuple[tuple[str, str], ...]  # (column, type name) reaching the lake as text


# --------------------------------------------------------------------------------------
# the pure checks


def check_shape(definition: ShapeDefinition, table: CatalogTable) -> CheckedShape:
    """Validate ``definition`` against ``table`` and bind it (ShapeError)."""
    where = table.qualified_name
    label = f"shape {definition.name!r}"
    if table.schema in ("pg_catalog", "information_schema") or table.schema.startswith("pg_toast"):
        raise ShapeError(
            f"{label}: {where} is a system catalog; logical replication publishes user tables only"
        )
    if table.persistence == "u":
        raise ShapeError(
            f"{label}: table {where} is unlogged: its changes are not written to the WAL, "
            f"so logical replication cannot follow them. Run ALTER TABLE {where} SET LOGGED"
        )
    if table.persistence == "t":
        raise ShapeError(
            f"{label}: table {where} is a temporary table; logical replication publishes "
            "permanent tables only"
        )
    if table.kind == "p":
        problem = identity_problem(where, table.replica_identity == "f", table.partitions)
        if problem is not None:
            raise ShapeError(f"{label}: {problem}")
    elif table.kind != "r":
        what = _KIND_NAMES.get(table.kind, f"a relation of kind {table.kind!r}")
        raise ShapeError(
            f"{label}: {where} is {what}; logical replication publishes ordinary tables only"
        )
    if not table.can_select:
        raise ShapeError(
            f"{label}: our role cannot read {where} (a new shape's snapshot selects from "
            f"it): run GRANT SELECT ON {where} TO <tidemark's role>"
        )
    by_name = {c.name: c for c in table.columns}
    predicate = definition.predicate
    read = sorted(predicate.columns_read) if predicate is not None else []
    for role, names in (("lists", definition.column_names or ()), ("predicate reads", read)):
        for name in names:
            _check_column(label, role, name, by_name, where)
    for name in read:
        _check_predicate_column(label, by_name[name], table)
    relation = table.relation()
    shape = bind(
        definition, resolve_domains(relation, table.domain_bases), table.primary_key, table.types
    )
    if shape.predicate is not None and shape.predicate.case_mapping:
        _check_case_mapping(label, [by_name[n] for n in read], table)
    casts = definition.casts
    for c in shape.output_columns:
        cast = casts.get(c.name)
        if cast is not None and cast.kind == "numeric" and c.type_oid != NUMERIC:
            raise ShapeError(
                f"{label} declares {format_identifier(c.name)}::{cast}, but the column is "
                f"{by_name[c.name].type_name}: '::numeric(p,s)' applies to numeric columns; "
                "list the column without a type (or with '::text')"
            )
    as_text = tuple(
        (c.name, by_name[c.name].type_name)
        for c in shape.output_columns
        if c.name not in casts and describe(c.type_oid, c.type_modifier, table.types).kind == "text"
    )
    return CheckedShape(shape, relation, as_text)


def _check_column(
    label: str, role: str, name: str, columns: Mapping[str, CatalogColumn], where: str
) -> None:
    column = columns.get(name)
    shown = format_identifier(name)
    if column is None:
        published = [c.name for c in columns.values() if not c.generated]
        raise ShapeError(
            f"{label} {role} column {shown}, which {where} does not have"
            f"{_did_you_mean(name, published)}; available columns: "
            f"{', '.join(format_identifier(c) for c in published)}"
        )
    if column.generated:
        raise ShapeError(
            f"{label} {role} column {shown} of {where}, a generated column: logical "
            "replication does not send generated columns, so tidemark never sees its values; "
            "use the columns it is computed from"
        )


def _check_predicate_column(label: str, column: CatalogColumn, table: CatalogTable) -> None:
    shown = f"{format_identifier(column.name)} of {table.qualified_name}"
    oid = table.domain_bases.get(column.type_oid, (column.type_oid, 0))[0]
    t = sql_type(oid)
    if t is None:
        kind = _TYPE_KINDS.get(column.type_kind)
        described = f"{column.type_name} ({kind})" if kind else column.type_name
        raise ShapeError(
            f"{label}: the predicate reads column {shown}, of type {described}, which shape "
            "predicates cannot evaluate exactly; they read "
            + ", ".join(s.name for s in SCALARS)
            + " and arrays of most of them. Filter on another column, or remove it from "
            "'where'"
        )
    if t.family != "text" and not (t.element is not None and t.element.family == "text"):
        return
    if table.encoding != "UTF8":
        raise ShapeError(
            f"{label}: the predicate reads text column {shown}, but the database encoding "
            f"is {table.encoding}; tidemark evaluates text predicates on UTF-8 only"
        )
    collation = column.collation
    if collation is not None and not collation.deterministic:
        raise ShapeError(
            f"{label}: the predicate reads column {shown}, whose collation "
            f"{format_identifier(collation.name)} is nondeterministic (equal strings may "
            "differ in bytes), which tidemark cannot reproduce; filter on another column"
        )


def _check_case_mapping(label: str, read: Sequence[CatalogColumn], table: CatalogTable) -> None:
    collations = [table.database_collation] + [c.collation for c in read if c.collation]
    ascii_only = [c for c in collations if c.ascii_case_only]
    if ascii_only:
        raise ShapeError(
            f"{label}: lower(), upper() and ILIKE change ASCII letters only under collation "
            f"ctype {ascii_only[0].ctype!r} (database or column of {table.qualified_name}), "
            'while tidemark would map every letter; say so explicitly with COLLATE "C", '
            "e.g. lower(name COLLATE \"C\") = 'abc' or name ILIKE 'a%' COLLATE \"C\""
        )


def _did_you_mean(wanted: str, candidates: Iterable[str]) -> str:
    """'; did you mean x?' for candidate column names close to ``wanted``, or ''."""
    return _suggest([format_identifier(c) for c in _close(wanted, candidates)])


def _close(wanted: str, candidates: Iterable[str]) -> list[str]:
    pool = list(candidates)
    same_letters = [c for c in pool if c.lower() == wanted.lower() and c != wanted]
    return same_letters or difflib.get_close_matches(wanted, pool, n=3, cutoff=0.6)


def _suggest(names: Sequence[str]) -> str:
    return "; did you mean " + " or ".join(names) + "?" if names else ""


def missing_table_error(definition: ShapeDefinition, existing: Iterable[tuple[str, str]]) -> str:
    """The message for a table that does not exist, with the closest existing names
    (same schema first; a name differing only in case suggests its quoted spelling)."""
    shown = {(s, n): f"{format_identifier(s)}.{format_identifier(n)}" for s, n in existing}
    schema, name = definition.schema_name, definition.table_name
    in_schema = {n: q for (s, n), q in shown.items() if s == schema}
    close = [in_schema[n] for n in _close(name, in_schema)]
    if not close:  # the same or a close name in another schema
        by_name: dict[str, list[str]] = {}
        for (_, n), q in shown.items():
            by_name.setdefault(n, []).append(q)
        close = [q for n in _close(name, by_name) for q in sorted(by_name[n])]
    return f"shape {definition.name!r}: table {definition.table} does not exist{_suggest(close)}"
