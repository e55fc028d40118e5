"""Which shapes of one table does a row belong to: the routing index.

``ShapeIndex`` holds the bound shapes of one table (one relation oid) and answers
``route(row) -> list[BoundShape]``: exactly the shapes whose predicate is TRUE for
the row (shapes without a predicate always).

Cost does not grow with the number of equality shapes: a predicate that is
``column = constant`` or ``column IN (constants)``, alone or as a conjunct of a
top-level AND (``region = 'r17' AND amount > 3``), is filed in a hash table keyed by
(column, constant). ``route`` reads each indexed column of the row once, looks its
value up, and evaluates only the remaining conjuncts of the shapes found there.
Keys are the raw text bytes for types whose text output is canonical (integers,
text, varchar, uuid, boolean), so those lookups parse nothing; other types are
parsed once per row and looked up by value. Every other predicate is evaluated per
shape. The answer is the same as evaluating every shape's predicate on the row
(property-tested).

A row may still hold ``UNCHANGED_TOAST`` in columns no predicate of this index reads;
callers (``convert``) make sure no predicate needs one. A value the Python types
cannot hold (a BC date in a predicate column) raises ``ProtocolError`` from
``route``; ``route_checked`` then tells which shapes failed.

``update_relation`` follows a schema change: every shape is rebound (see
``model.rebind``); shapes that cannot follow are removed from the index and returned
as ``ShapeResync`` for the collector to rebuild. Pure: no IO, no logging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from tidemark.errors import ProtocolError, ShapeError
from tidemark.pgoutput.messages import UNCHANGED_TOAST, Relation, TupleData
from tidemark.predicates.compiler import EqualityTerm
from tidemark.shapes.model import BoundShape, ShapeResync, rebind

_Candidates = tuple[tuple[BoundShape, Callable[[TupleData], bool] | None], ...]
_Lookup = tuple[int, bool, Callable[[bytes], Any] | None, dict[Any, _Candidates]]


class ShapeIndex:
    """The shapes of one table, indexed for routing rows."""

    def __init__(self, relation: Relation) -> None:
        self._relation = relation
        self._shapes: dict[str, BoundShape] = {}
        self._always: tuple[BoundShape, ...] = ()
        self._lookups: tuple[_Lookup, ...] = ()
        self._scan: tuple[tuple[BoundShape, Callable[[TupleData], bool]], ...] = ()

    @property
    def relation(self) -> Relation:
        return self._relation

    @property
    def shapes(self) -> tuple[BoundShape, ...]:
        return tuple(self._shapes.values())

    def __len__(self) -> int:
        return len(self._shapes)

    def __contains__(self, name: object) -> bool:
        return name in self._shapes

    def __iter__(self) -> Iterator[BoundShape]:
        return iter(tuple(self._shapes.values()))

    def get(self, name: str) -> BoundShape | None:
        return self._shapes.get(name)

    def add(self, shape: BoundShape) -> None:
        """Add a shape bound to this index's relation (ShapeError if not, or if taken)."""
        current = self._relation
        if (shape.relation.oid, shape.relation.columns, shape.relation.replica_identity) != (
            current.oid,
            current.columns,
            current.replica_identity,
        ):
            raise ShapeError(
                f"shape {shape.name!r} is bound to another layout of "
                f"{shape.relation.qualified_name} than this index: bind it to the current "
                "relation first"
            )
        if shape.name in self._shapes:
            raise ShapeError(f"shape {shape.name!r} is already routed for this table")
        self._shapes[shape.name] = shape
        self._rebuild()

    def remove(self, name: str) -> BoundShape | None:
        shape = self._shapes.pop(name, None)
        if shape is not None:
            self._rebuild()
        return shape

    def update_relation(self, relation: Relation) -> list[ShapeResync]:
        """Rebind every shape to ``relation``; return (and drop) those that cannot follow."""
        if relation.oid != self._relation.oid:
            raise ShapeError(
                f"relation oid {relation.oid} is not the table of this index "
                f"({self._relation.qualified_name}, oid {self._relation.oid})"
            )
        resyncs: list[ShapeResync] = []
        rebound: dict[str, BoundShape] = {}
        for name, shape in self._shapes.items():
            outcome = rebind(shape, relation)
            if isinstance(outcome, ShapeResync):
                resyncs.append(outcome)
            else:
                rebound[name] = outcome
        self._relation = relation
        self._shapes = rebound
        self._rebuild()
        return resyncs

    # -- routing

    def route(self, row: TupleData) -> list[BoundShape]:
        """The shapes whose predicate is TRUE for ``row`` (a tuple of this relation)."""
        out = list(self._always)
        for position, raw, parse, table in self._lookups:
            value = row[position]
            if value is None or value is UNCHANGED_TOAST:
                continue
            if not raw:
                value = parse(value)  # type: ignore[misc,arg-type]
            hits = table.get(value)
            if hits is not None:
                for shape, residual in hits:
                    if residual is None or residual(row):
                        out.append(shape)
        for shape, matches in self._scan:
            if matches(row):
                out.append(shape)
        return out

    def route_checked(self, row: TupleData) -> tuple[list[BoundShape], list[ShapeResync]]:
        """``route``, shape by shape: predicates that cannot be evaluated become resyncs."""
        matched: list[BoundShape] = []
        failed: list[ShapeResync] = []
        for shape in self._shapes.values():
            if shape.predicate is None:
                matched.append(shape)
                continue
            try:
                if shape.predicate.evaluate(row) is True:
                    matched.append(shape)
            except ProtocolError as e:
                failed.append(ShapeResync(shape.name, f"cannot evaluate the predicate: {e}"))
            except ShapeError:  # PredicateEvaluationError: Postgres would raise too
                continue
        return matched, failed

    # -- index maintenance

    def _rebuild(self) -> None:
        always: list[BoundShape] = []
        scan: list[tuple[BoundShape, Callable[[TupleData], bool]]] = []
        by_column: dict[int, tuple[bool, Callable[[bytes], Any] | None, dict[Any, list[Any]]]] = {}
        for shape in self._shapes.values():
            predicate = shape.predicate
            if predicate is None or predicate.constant is True:
                always.append(shape)
                continue
            if predicate.constant is False:
                continue  # FALSE or NULL for every row: never routed
            term = _choose_term(predicate.equality_terms, by_column)
            if term is None:
                scan.append((shape, predicate.matches))
                continue
            _, _, table = by_column.setdefault(term.position, (term.raw, term.parse, {}))
            for key in term.keys:
                table.setdefault(key, []).append((shape, term.residual))
        self._always = tuple(always)
        self._scan = tuple(scan)
        self._lookups = tuple(
            (position, raw, parse, {k: tuple(v) for k, v in table.items()})
            for position, (raw, parse, table) in by_column.items()
        )


def _choose_term(terms: tuple[EqualityTerm, ...], by_column: dict[int, Any]) -> EqualityTerm | None:
    """Prefer a column that already has a lookup: one more key costs nothing per row."""
    if not terms:
        return None
    for term in terms:
        if term.position in by_column:
            return term
    return terms[0]
