"""Shapes: named subsets of one table (predicate + columns) and how changes reach them.

``model`` defines and binds shapes (their ``where`` compiled by ``tidemark.predicates``,
their declared column types in ``column_casts``), ``partitions`` lays out their
tables, ``routing`` finds the shapes a row belongs to, and ``convert`` turns a table
change into per-shape changes: all pure, no IO. Two modules do IO and are not
imported here: ``catalog`` checks a shape against the source database's catalog, and
``registry`` keeps the set of shapes in one JSON file.
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
from tidemark.shapes.routing import ShapeIndex

__all__ = [
    "DELETE",
    "INSERT",
    "TRUNCATE",
    "UPDATE",
    "BoundShape",
    "Routed",
    "ShapeChange",
    "ShapeDefinition",
    "ShapeIndex",
    "ShapeResync",
    "bind",
    "convert",
    "convert_truncate",
    "rebind",
]
