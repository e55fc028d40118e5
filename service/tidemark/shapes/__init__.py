"""Shapes: named subsets of one table (predicate + columns) and how changes reach them.

``model`` defines and binds shapes, ``predicate`` compiles their SQL ``WHERE`` to
Python (its parts: ``predicate_parse``, ``sqltypes``, ``typer``, ``typer_values``,
``comparison``, ``casts``, ``like``, ``temporal``, ``codegen``, ``logic``,
``operators``, ``identifiers``), ``routing``
finds the shapes a row belongs to, and ``convert`` turns a table change into
per-shape changes: all pure, no IO. Two modules do IO and are not imported here:
``catalog`` checks a shape against the source database's catalog, and ``registry``
keeps the set of shapes in one JSON file.
"""

from tidemark.shapes.convert import (
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    Routed,
    ShapeChange,
    convert,
    convert_truncate,
)
from tidemark.shapes.model import BoundShape, ShapeDefinition, ShapeResync, bind, rebind
from tidemark.shapes.predicate import (
    CompiledPredicate,
    ParsedPredicate,
    PredicateEvaluationError,
    compile_predicate,
    parse_predicate,
    predicate_sql,
)
from tidemark.shapes.routing import ShapeIndex

__all__ = [
    "DELETE",
    "INSERT",
    "TRUNCATE",
    "UPDATE",
    "BoundShape",
    "CompiledPredicate",
    "ParsedPredicate",
    "PredicateEvaluationError",
    "Routed",
    "ShapeChange",
    "ShapeDefinition",
    "ShapeIndex",
    "ShapeResync",
    "bind",
    "compile_predicate",
    "convert",
    "convert_truncate",
    "parse_predicate",
    "predicate_sql",
    "rebind",
]
