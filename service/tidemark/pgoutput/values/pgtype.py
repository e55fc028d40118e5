"""What a column's Postgres type is, as far as the lake needs to know.

A Relation message carries only a type oid and a modifier. That is enough for
built-in types (fixed oids, ``oids.py``), but not for user-defined ones: an enum, a
composite type, a range over any subtype, a domain, or an array of any of these gets
an oid at ``CREATE TYPE`` time, and its structure lives in the catalog.
``shapes.catalog`` reads that structure once per shape (``CatalogType`` per oid, a
``TypeCatalog``), and ``describe(oid, typmod, catalog)`` turns an oid into a
``PgType`` tree that says how to read the type's text output and which Arrow type
holds it (``values.columns``).

Kinds of ``PgType``:

* ``scalar``: a built-in type with its own converter (integers, numeric, dates,
  interval, time, point, text types ...), chosen by ``oid`` (and ``typmod``);
* ``enum``: a label, kept as a string;
* ``array``: a one-dimensional list of ``element``;
* ``composite``: a struct of ``fields``;
* ``range``: bounds of ``element`` type plus flags; ``multirange``: a list of ranges
  of ``element`` (the range type);
* ``text``: Postgres's text output, unchanged: types without a faithful mapping
  (``inet``, ``money``, ``box`` ...), unconstrained ``numeric`` is a ``scalar`` that
  also stays text, and a shape may declare ``column::text`` (``declared``).

Domains disappear: a domain is described as its base type, with the outermost
type modifier that is set (a domain over ``numeric(10,2)`` is ``numeric(10,2)``).

Pure: no IO. Frozen and hashable, so converters can be cached per ``PgType``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from tidemark.pgoutput.values.oids import (
    ARRAY_ELEMENT_TYPES,
    BOOL,
    BPCHAR,
    BYTEA,
    CHAR,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    JSON,
    JSONB,
    MULTIRANGE_RANGES,
    NAME,
    NUMERIC,
    OID,
    POINT,
    RANGE_SUBTYPES,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    TYPE_NAMES,
    UUID_OID,
    VARCHAR,
)

Kind = Literal["scalar", "enum", "array", "composite", "range", "multirange", "text"]

#: Types below this oid are fixed at build time (Postgres's FirstGenbkiObjectId); from
#: it on, a type is created by initdb scripts or by users, and only the catalog says
#: what it is.
FIRST_CATALOG_OID: Final = 10_000

#: Built-in types with a converter of their own (``values.arrow`` / ``values.compound``).
SCALARS: Final = frozenset(
    {
        BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, JSON, FLOAT4, FLOAT8,
        BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC,
        UUID_OID, JSONB, POINT,
    }
)  # fmt: skip

_MAX_DEPTH: Final = 32  # types nest only as deep as they were declared; a guard


@dataclass(frozen=True, slots=True)
class PgType:
    """A column type as the lake sees it (see the module docstring)."""

    name: str  # SQL name for messages, e.g. 'numeric(18,4)', 'public.mood', 'interval[]'
    kind: Kind
    oid: int = 0
    typmod: int = -1  # scalars: numeric precision and scale, as Postgres packs them
    element: PgType | None = None  # array element, range subtype, multirange's range
    fields: tuple[tuple[str, PgType], ...] = ()  # composite attributes, in order
    declared: bool = False  # chosen by the shape ('amount::numeric(18,4)', 'x::text')


@dataclass(frozen=True, slots=True)
class CatalogType:
    """One type as ``pg_type`` (and ``pg_range``, ``pg_attribute``) describes it."""

    oid: int
    name: str  # format_type(oid, NULL)
    kind: str  # 'e' enum, 'c' composite, 'r' range, 'm' multirange, 'd' domain, 'a' array,
    # anything else: a base or pseudo type without a mapping
    base: int = 0  # array: element; range: subtype; multirange: range type; domain: base
    base_typmod: int = -1  # domain: its type modifier (typtypmod)
    fields: tuple[tuple[str, int, int], ...] = ()  # composite: (name, type oid, typmod)


TypeCatalog = Mapping[int, CatalogType]
NO_TYPES: Final[TypeCatalog] = {}


def pack_numeric_typmod(precision: int, scale: int) -> int:
    """The type modifier Postgres stores for numeric(precision, scale)."""
    return ((precision << 16) | (scale & 0x7FF)) + 4


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier; None for unconstrained numeric."""
    if typmod < 4:  # -1: declared without precision, any size
        return None
    packed = typmod - 4  # VARHDRSZ, as Postgres stores it
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 0x400) - 0x400  # 11-bit signed since Postgres 15
    return precision, scale


def scalar_name(oid: int, typmod: int = -1) -> str:
    name = TYPE_NAMES.get(oid, f"type oid {oid}")
    if oid == NUMERIC and (ps := numeric_precision_scale(typmod)) is not None:
        return f"numeric({ps[0]},{ps[1]})"
    return name


def is_described(oid: int, catalog: TypeCatalog) -> bool:
    """True when ``describe`` gives this oid the same type whatever else is read later:
    a type with a fixed oid, or one the catalog described."""
    return oid < FIRST_CATALOG_OID or oid in catalog


def resolve_domain(oid: int, typmod: int, catalog: TypeCatalog) -> tuple[int, int]:
    """(base type oid, type modifier) of a domain (the outermost modifier set wins);
    any other type as it is."""
    for _ in range(_MAX_DEPTH):
        known = catalog.get(oid) if oid >= FIRST_CATALOG_OID else None
        if known is None or known.kind != "d":
            return oid, typmod
        oid, typmod = known.base, typmod if typmod >= 0 else known.base_typmod
    return oid, typmod


def describe(oid: int, typmod: int = -1, catalog: TypeCatalog = NO_TYPES) -> PgType:
    """The ``PgType`` of a column of type ``oid`` with modifier ``typmod``."""
    return _describe(oid, typmod, catalog, 0)


def _describe(oid: int, typmod: int, catalog: TypeCatalog, depth: int) -> PgType:
    if depth > _MAX_DEPTH:
        return PgType(f"type oid {oid}", "text", oid)
    if oid in SCALARS:
        return PgType(scalar_name(oid, typmod), "scalar", oid, typmod if oid == NUMERIC else -1)
    element = ARRAY_ELEMENT_TYPES.get(oid)
    if element is not None:
        # an array column's modifier is its elements' (numeric(10,2)[])
        inner = _describe(element, typmod, catalog, depth + 1)
        return PgType(inner.name + "[]", "array", oid, element=inner)
    subtype = RANGE_SUBTYPES.get(oid)
    if subtype is not None:
        inner = _describe(subtype, -1, catalog, depth + 1)
        return PgType(TYPE_NAMES[oid], "range", oid, element=inner)
    range_oid = MULTIRANGE_RANGES.get(oid)
    if range_oid is not None:
        inner = _describe(range_oid, -1, catalog, depth + 1)
        return PgType(TYPE_NAMES[oid], "multirange", oid, element=inner)
    known = catalog.get(oid) if oid >= FIRST_CATALOG_OID else None
    if known is None:
        return PgType(TYPE_NAMES.get(oid, f"type oid {oid}"), "text", oid)
    if known.kind == "d":
        return _describe(
            known.base, typmod if typmod >= 0 else known.base_typmod, catalog, depth + 1
        )
    if known.kind == "e":
        return PgType(known.name, "enum", oid)
    if known.kind == "a":
        inner = _describe(known.base, typmod, catalog, depth + 1)
        return PgType(known.name, "array", oid, element=inner)
    if known.kind == "r":
        inner = _describe(known.base, -1, catalog, depth + 1)
        return PgType(known.name, "range", oid, element=inner)
    if known.kind == "m":
        inner = _describe(known.base, -1, catalog, depth + 1)
        return PgType(known.name, "multirange", oid, element=inner)
    if known.kind == "c":
        fields = tuple(
            (name, _describe(field_oid, field_typmod, catalog, depth + 1))
            for name, field_oid, field_typmod in known.fields
        )
        return PgType(known.name, "composite", oid, fields=fields)
    return PgType(known.name, "text", oid)


def declared_numeric(precision: int, scale: int) -> PgType:
    """The type of a column a shape declares as ``numeric(precision, scale)``."""
    return PgType(
        f"numeric({precision},{scale})",
        "scalar",
        NUMERIC,
        pack_numeric_typmod(precision, scale),
        declared=True,
    )


def declared_text(source: PgType) -> PgType:
    """The type of a column a shape declares as ``text``: Postgres's text output."""
    return PgType(source.name, "text", source.oid, declared=True)
