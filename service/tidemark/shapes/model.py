"""Shape definitions, and their binding to one table's columns.

``ShapeDefinition`` is what a user asks for: a ``name``, a ``table``, an optional SQL
``where`` and an optional ``columns`` list, and ``replica`` ('default' or 'full').
Constructing one validates everything that needs no catalog: the name (it names a
directory and a metric label), identifier syntax, and the *form* of the predicate.
Every problem raises ``ShapeError`` naming the field and the fix.

Identifiers follow SQL: unquoted names fold to lower case, ``"Quoted"`` names keep
their case. ``table`` is stored in canonical form, schema-qualified and quoted only
where needed (``public.orders``, ``"MySchema"."Orders"``); an unqualified table means
``public`` (tidemark does not consult a search_path, which belongs to a session).
``columns`` entries are identifiers too (``id``, ``"Name"``) and are stored in the
same canonical form, so a stored definition re-validates to itself; an entry may
declare the column's lake type (``amount::numeric(18,4)``, ``x::text``: see
``shapes.column_casts``).

``bind(definition, relation, primary_key)`` checks a definition against the table as
plain values (a ``Relation``: columns with type oids, replica-identity flags, and the
table's replica identity; the primary key's column names), compiles the predicate,
and returns a ``BoundShape``. Rules, each a ``ShapeError`` telling what to do:

* every listed column and every column the predicate reads exists (the message lists
  the available columns); predicate columns have a type with an exact mapping;
* the table has a primary key, or REPLICA IDENTITY FULL (then the whole row is the
  key and no column list is allowed); REPLICA IDENTITY NOTHING is refused (updates
  and deletes could not be followed); with DEFAULT or USING INDEX the primary key
  must be part of the identity, since deletes only carry the identity columns;
* a predicate reading a column outside the replica identity needs REPLICA IDENTITY
  FULL: without the old row, an update that moves a row out of the predicate cannot
  be seen; ``replica='full'`` needs REPLICA IDENTITY FULL as well.

The output columns of a bound shape are the table's columns in table order,
restricted to the primary key plus ``columns`` when a list is given.

``rebind(shape, relation)`` follows a schema change (a new Relation message for the
table): added columns join shapes without a column list, dropped columns stay in the
output as NULL, and a change that the shape cannot follow exactly (a dropped or
retyped column that is part of the key, the predicate or the output; a replica
identity that no longer satisfies the rules; an added column whose user-defined type
the shape has not read from the catalog, since its lake type depends on it) returns
``ShapeResync`` instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import Relation, RelationColumn, TupleData, Value
from tidemark.pgoutput.values.pgtype import NO_TYPES, TypeCatalog, is_described, resolve_domain
from tidemark.predicates.compiler import (
    CompiledPredicate,
    ParsedPredicate,
    compile_predicate,
    parse_predicate,
)
from tidemark.predicates.identifiers import format_identifier, parse_identifiers, quote_identifier
from tidemark.shapes.column_casts import ColumnCast, format_column, parse_column

_SHAPE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")


class ShapeDefinition(BaseModel):
    """A shape as a user defines it. Frozen; equal definitions compare equal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    table: str
    where: str | None = None
    columns: tuple[str, ...] | None = None
    replica: Literal["default", "full"] = "default"

    _predicate: ParsedPredicate | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _SHAPE_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid shape name: use 1-63 lower-case letters, digits "
                "and '_', starting with a letter or '_' (it names a directory and a metric "
                "label)"
            )
        return value

    @field_validator("table")
    @classmethod
    def _valid_table(cls, value: str) -> str:
        parts = parse_identifiers(value)
        if len(parts) == 1:
            parts = ("public", parts[0])
        if len(parts) != 2:
            raise ValueError(f"{value!r} must be 'schema.table' or 'table' (meaning public)")
        return ".".join(format_identifier(p) for p in parts)

    @field_validator("columns")
    @classmethod
    def _valid_columns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError(
                "is empty: omit 'columns' to take every column, or list the columns you "
                "want (the primary key is always included)"
            )
        names: list[str] = []
        entries: list[str] = []
        for item in value:
            name, cast = parse_column(item)
            if name in names:
                raise ValueError(f"column {item!r} is listed twice")
            names.append(name)
            entries.append(format_column(name, cast))
        return tuple(entries)

    @field_validator("where")
    @classmethod
    def _blank_where(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else value

    @model_validator(mode="after")
    def _parse_where(self) -> ShapeDefinition:
        if self.where is not None:
            try:
                self._predicate = parse_predicate(self.where, (self.schema_name, self.table_name))
            except ShapeError as e:
                raise ShapeError(f"shape {self.name!r}, field 'where': {e}") from None
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _shape_errors(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Callers catch TidemarkError, never pydantic's ValidationError.
        try:
            return handler(data)
        except ValidationError as e:
            label = data.get("name") if isinstance(data, dict) else None
            problems = []
            for err in e.errors():
                where = ".".join(str(p) for p in err["loc"]) or "definition"
                ctx = err.get("ctx") or {}
                message = str(ctx["error"]) if "error" in ctx else err["msg"]
                problems.append(f"field {where!r}: {message}")
            prefix = f"shape {label!r}" if isinstance(label, str) else "shape definition"
            raise ShapeError(f"{prefix} is invalid: " + "; ".join(problems)) from None

    @property
    def schema_name(self) -> str:
        return parse_identifiers(self.table)[0]

    @property
    def table_name(self) -> str:
        return parse_identifiers(self.table)[1]

    @property
    def column_names(self) -> tuple[str, ...] | None:
        """The listed columns' exact catalog names (None: every column)."""
        if self.columns is None:
            return None
        return tuple(parse_column(c)[0] for c in self.columns)

    @property
    def casts(self) -> dict[str, ColumnCast]:
        """Declared lake types by exact column name (``amount::numeric(18,4)``)."""
        found: dict[str, ColumnCast] = {}
        for item in self.columns or ():
            name, cast = parse_column(item)
            if cast is not None:
                found[name] = cast
        return found

    @property
    def predicate(self) -> ParsedPredicate | None:
        return self._predicate


@dataclass(frozen=True, slots=True)
class ShapeResync:
    """The shape can no longer be followed from the stream; it must be rebuilt."""

    shape: str
    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class BoundShape:
    """A definition bound to one column layout of its table. Identity-hashed.

    ``project(row)`` gives the output values (``output_columns`` order) from a tuple
    of the relation; ``projection`` holds each output column's position in that
    tuple, or None for a dropped column (always NULL).
    """

    definition: ShapeDefinition
    relation: Relation
    primary_key: tuple[str, ...]
    output_columns: tuple[RelationColumn, ...]
    projection: tuple[int | None, ...]
    key_positions: tuple[int, ...]
    predicate: CompiledPredicate | None
    row_key: bool  # the table has no primary key: the whole row is the key
    project: Callable[[TupleData], tuple[Value, ...]] = field(repr=False)
    key_of: Callable[[TupleData], Any] = field(repr=False)
    # (position, output column name) for columns present in the relation
    projected_names: tuple[tuple[int, str], ...] = field(repr=False)
    # the catalog's description of the user-defined types of the table's columns
    types: TypeCatalog = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def predicate_positions(self) -> frozenset[int]:
        return frozenset() if self.predicate is None else self.predicate.positions_read


def _qualified(relation: Relation) -> str:
    return (
        f"{quote_identifier(relation.namespace or 'pg_catalog')}.{quote_identifier(relation.name)}"
    )


def _identity_problem(
    definition: ShapeDefinition,
    relation: Relation,
    primary_key: Sequence[str],
    predicate_columns: frozenset[str],
) -> str | None:
    """Why the table's replica identity cannot serve this shape, or None."""
    table = _qualified(relation)
    identity = relation.replica_identity
    full = f"ALTER TABLE {table} REPLICA IDENTITY FULL"
    if identity == "n":
        return (
            f"table {table} has REPLICA IDENTITY NOTHING, so updates and deletes cannot be "
            f"followed: run ALTER TABLE {table} REPLICA IDENTITY DEFAULT (with a primary key) "
            f"or {full}"
        )
    if identity == "f":
        return None
    if not primary_key:
        return f"table {table} has no primary key: add one, or run {full}"
    identity_columns = {c.name for c in relation.columns if c.is_key}
    missing_key = [c for c in primary_key if c not in identity_columns]
    if missing_key:
        return (
            f"the replica identity of {table} does not include primary key column(s) "
            f"{', '.join(missing_key)}, so deletes would not say which row went: run ALTER "
            f"TABLE {table} REPLICA IDENTITY DEFAULT, or {full}"
        )
    if definition.replica == "full":
        return f"shape {definition.name!r} asks for replica='full', which needs: {full}"
    outside = sorted(predicate_columns - identity_columns)
    if outside:
        return (
            f"the predicate of shape {definition.name!r} reads {', '.join(outside)}, which "
            f"{'is' if len(outside) == 1 else 'are'} not part of the replica identity of "
            f"{table}: without the old row, an update that moves a row out of the shape "
            f"cannot be seen. Run {full}"
        )
    return None


def _projector(
    positions: tuple[int | None, ...], width: int
) -> Callable[[TupleData], tuple[Value, ...]]:
    if positions == tuple(range(width)):
        return _same_row
    if None in positions:
        # a dropped column reads the None appended after the row's last value
        getter = itemgetter(*[width if p is None else p for p in positions])
        if len(positions) == 1:
            return lambda row: (getter((*row, None)),)
        return lambda row: getter((*row, None))
    if len(positions) == 1:
        only = positions[0]
        assert only is not None
        return lambda row: (row[only],)
    return itemgetter(*positions)


def _same_row(row: TupleData) -> tuple[Value, ...]:
    return row


def _key_getter(positions: tuple[int, ...]) -> Callable[[TupleData], Any]:
    return itemgetter(*positions)


def _build(
    definition: ShapeDefinition,
    relation: Relation,
    primary_key: tuple[str, ...],
    output: tuple[RelationColumn, ...],
    predicate: CompiledPredicate | None,
    row_key: bool,
    types: TypeCatalog,
) -> BoundShape:
    position = {c.name: i for i, c in enumerate(relation.columns)}
    projection = tuple(position.get(c.name) for c in output)
    key_positions = tuple(position[c] for c in primary_key)
    return BoundShape(
        definition=definition,
        relation=relation,
        primary_key=primary_key,
        output_columns=output,
        projection=projection,
        key_positions=key_positions,
        predicate=predicate,
        row_key=row_key,
        project=_projector(projection, len(relation.columns)),
        key_of=_key_getter(key_positions),
        projected_names=tuple(
            (p, c.name) for p, c in zip(projection, output, strict=True) if p is not None
        ),
        types=types,
    )


def bind(
    definition: ShapeDefinition,
    relation: Relation,
    primary_key: Sequence[str],
    types: TypeCatalog = NO_TYPES,
) -> BoundShape:
    """Check ``definition`` against its table and compile its predicate (ShapeError).

    ``types`` describes the user-defined types of the table's columns (the catalog's):
    the shape keeps it for its writers and for columns added later."""
    if (relation.namespace or "pg_catalog", relation.name) != (
        definition.schema_name,
        definition.table_name,
    ):
        raise ShapeError(
            f"shape {definition.name!r} is defined on {definition.table}, not on "
            f"{_qualified(relation)}"
        )
    names = [c.name for c in relation.columns]
    available = ", ".join(names)
    table = _qualified(relation)
    unknown_key = [c for c in primary_key if c not in names]
    if unknown_key:
        raise ShapeError(
            f"primary key column(s) {', '.join(unknown_key)} of {table} are not among its "
            f"columns ({available}); the catalog and the relation disagree"
        )
    listed = definition.column_names
    for column in listed or ():
        if column not in names:
            raise ShapeError(
                f"shape {definition.name!r} lists column {quote_identifier(column)}, which "
                f"{table} does not have; available columns: {available}"
            )
    predicate = None
    if definition.predicate is not None:
        try:
            predicate = compile_predicate(definition.predicate, relation.columns)
        except ShapeError as e:
            raise ShapeError(f"shape {definition.name!r} on {table}: {e}") from None
    problem = _identity_problem(
        definition, relation, primary_key, predicate.columns_read if predicate else frozenset()
    )
    if problem is not None:
        raise ShapeError(problem)
    key = tuple(primary_key)
    row_key = not key
    if row_key:  # REPLICA IDENTITY FULL without a primary key: the row is its own key
        if listed is not None and set(listed) != set(names):
            raise ShapeError(
                f"table {table} has no primary key, so every column identifies a row and "
                f"shape {definition.name!r} cannot select columns: remove 'columns' or add "
                "a primary key"
            )
        key = tuple(names)
    wanted = None if listed is None else set(listed) | set(key)
    output = tuple(c for c in relation.columns if wanted is None or c.name in wanted)
    return _build(definition, relation, key, output, predicate, row_key, types)


def rebind(shape: BoundShape, relation: Relation) -> BoundShape | ShapeResync:
    """Follow a new Relation message for the shape's table (see module docstring)."""
    old = shape.relation
    if relation.columns == old.columns and relation.replica_identity == old.replica_identity:
        return shape
    name = shape.name

    def resync(reason: str) -> ShapeResync:
        return ShapeResync(name, reason)

    by_name = {c.name: c for c in relation.columns}
    key = shape.primary_key
    needed = set(key) | (shape.predicate.columns_read if shape.predicate else set())
    old_types = {c.name: c for c in shape.output_columns}
    old_types.update({c.name: c for c in old.columns if c.name in needed})
    for column_name, before in old_types.items():
        now = by_name.get(column_name)
        if now is None:
            if column_name in needed:
                role = "primary key" if column_name in key else "predicate"
                return resync(f"{role} column {column_name} was dropped from {_qualified(old)}")
            continue
        if not _same_type(now, before, shape.types):
            return resync(f"column {column_name} of {_qualified(old)} changed type")
    if shape.row_key and [c.name for c in relation.columns] != list(key):
        return resync(f"{_qualified(old)} has no primary key and its columns changed")
    if relation.replica_identity == "d" and old.replica_identity == "d" and not shape.row_key:
        identity = {c.name for c in relation.columns if c.is_key}
        if identity != set(key):
            return resync(f"the primary key of {_qualified(old)} changed")
    primary_key = () if shape.row_key else key
    problem = _identity_problem(
        shape.definition,
        relation,
        primary_key,
        shape.predicate.columns_read if shape.predicate else frozenset(),
    )
    if problem is not None:
        return resync(problem)
    output = list(shape.output_columns)
    if shape.definition.columns is None:
        present = {c.name for c in output}
        added = [c for c in relation.columns if c.name not in present]
        for column in added:
            if not is_described(column.type_oid, shape.types):
                # its lake type needs the catalog (an enum, composite, range, domain):
                # typed as text now, it would change type once the catalog is read
                return resync(
                    f"column {column.name} was added to {_qualified(old)} with a type "
                    f"(oid {column.type_oid}) tidemark reads from the catalog"
                )
        output.extend(added)
    predicate = None
    if shape.definition.predicate is not None:
        try:
            predicate = compile_predicate(shape.definition.predicate, relation.columns)
        except ShapeError as e:
            return resync(f"the predicate no longer compiles: {e}")
    return _build(
        shape.definition, relation, key, tuple(output), predicate, shape.row_key, shape.types
    )


def _same_type(now: RelationColumn, before: RelationColumn, types: TypeCatalog) -> bool:
    """The same type, or a domain the catalog resolves to it (the stream names a domain
    column by the domain's oid until the collector knows the domain)."""
    if (now.type_oid, now.type_modifier) == (before.type_oid, before.type_modifier):
        return True
    return resolve_domain(now.type_oid, now.type_modifier, types) == (
        before.type_oid,
        before.type_modifier,
    )


def resolve_domains(relation: Relation, domain_bases: Mapping[int, tuple[int, int]]) -> Relation:
    """``relation`` with every domain column typed as the domain's base type."""
    if not domain_bases or not any(c.type_oid in domain_bases for c in relation.columns):
        return relation
    columns = []
    for c in relation.columns:
        base = domain_bases.get(c.type_oid)
        columns.append(c if base is None else RelationColumn(c.name, base[0], base[1], c.is_key))
    return Relation(
        relation.oid,
        relation.namespace,
        relation.name,
        relation.replica_identity,
        tuple(columns),
        relation.xid,
    )
