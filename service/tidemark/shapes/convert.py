"""Per-shape changes: what one table change means for each shape of the table.

``convert(index, change)`` turns an Insert/Update/Delete of the index's table, or a
Truncate, into a list of per-shape items, in the order a shape must apply them:

* ``ShapeChange`` = ``(shape_name, kind, values, unchanged)``, a plain tuple (one
  allocation per routed row): ``kind`` is ``"insert" | "update" | "delete" |
  "truncate"`` (the ``_kind`` metadata value); ``values`` are the shape's output
  columns in ``BoundShape.output_columns`` order, still in pgoutput's representation
  (text ``bytes``, ``None``); ``unchanged`` is None or the names of output columns
  whose value is ``UNCHANGED_TOAST`` (not sent, not known): the writer stores NULL
  and lists them in ``_unchanged`` so the sink's fold carries the previous value.
* ``ShapeResync(shape, reason)``: this change cannot be expressed exactly for the
  shape; the collector stops feeding it and rebuilds it from a snapshot.

Rules (``match`` = the shape's predicate is TRUE; shapes without one always match):

* Insert: ``insert`` of the new row for every matching shape.
* Delete: ``delete`` for every shape the old row matches; ``values`` carry the old
  row as sent: the key columns always, the other columns only with REPLICA IDENTITY
  FULL (else NULL). The sink deletes by primary key.
* Update: the old row is the full old tuple (``O``, REPLICA IDENTITY FULL), the old
  key tuple (``K``: the identity changed), or, without an old tuple, the new row
  itself: the identity did not change, and ``bind`` guarantees that a predicate
  reading anything else has REPLICA IDENTITY FULL, so it gets ``O``.
  old and new match -> ``update`` of the new row; only old -> ``delete`` of the old
  row; only new -> ``insert`` of the new row.
  If the primary key changed, a changelog keyed by primary key must see the old key
  go: ``delete`` (old) then ``insert`` (new) instead of ``update``.
  With the full old row known, an ``update`` that changes none of the shape's
  output columns is dropped.
* Unchanged TOAST values in the new row are filled from the old row where it has
  them (FULL always does). Still missing: an ``update`` lists them in ``unchanged``;
  a row *entering* the shape (``insert`` from an update, or the insert half of a
  key change) has no previous value to carry, and a predicate cannot read an
  unknown value: both give ``ShapeResync`` (avoid with REPLICA IDENTITY FULL).
* Truncate: ``truncate`` (no values) for every shape of the table.
* A predicate that cannot be evaluated on a value (a BC date in a predicate column)
  gives ``ShapeResync`` for that shape; the others route normally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tidemark.errors import ProtocolError
from tidemark.pgoutput.messages import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    TupleData,
    Update,
    Value,
)
from tidemark.shapes.model import BoundShape, ShapeResync
from tidemark.shapes.routing import ShapeIndex

INSERT: Final = "insert"
UPDATE: Final = "update"
DELETE: Final = "delete"
TRUNCATE: Final = "truncate"

ShapeChange = tuple[str, str, tuple[Value, ...], tuple[str, ...] | None]
Routed = list[ShapeChange | ShapeResync]


def convert(index: ShapeIndex, change: Insert | Update | Delete) -> Routed:
    """The per-shape items for one row change of the index's table."""
    if type(change) is Insert:
        return convert_insert(index, change)
    if type(change) is Update:
        return convert_update(index, change)
    if type(change) is Delete:
        return convert_delete(index, change)
    raise TypeError(f"cannot convert {type(change).__name__}: use convert_truncate")


def convert_truncate(index: ShapeIndex) -> Routed:
    return [(shape.name, TRUNCATE, (), None) for shape in index.shapes]


def _route(index: ShapeIndex, row: TupleData, out: Routed) -> list[BoundShape]:
    try:
        return index.route(row)
    except ProtocolError:
        matched, failed = index.route_checked(row)
        out.extend(failed)
        return matched


def convert_insert(index: ShapeIndex, change: Insert) -> Routed:
    new = change.new
    out: Routed = []
    for shape in _route(index, new, out):
        out.append((shape.name, INSERT, shape.project(new), None))
    return out


def convert_delete(index: ShapeIndex, change: Delete) -> Routed:
    old = change.old
    out: Routed = []
    for shape in _route(index, old, out):
        out.append((shape.name, DELETE, shape.project(old), None))
    return out


def convert_update(index: ShapeIndex, change: Update) -> Routed:
    new = change.new
    old = change.old
    old_kind = change.old_kind
    out: Routed = []
    missing: frozenset[int] = frozenset()
    probe = new
    if UNCHANGED_TOAST in new:
        new = _fill_toast(new, old, old_kind, index)
        missing = frozenset(i for i, v in enumerate(new) if v is UNCHANGED_TOAST)
        # predicates must not see the marker; shapes reading it resync below
        probe = tuple(None if v is UNCHANGED_TOAST else v for v in new) if missing else new
    blind: set[BoundShape] = set()
    if missing:
        for shape in index.shapes:
            if shape.predicate_positions & missing:
                blind.add(shape)
                out.append(
                    ShapeResync(
                        shape.name,
                        "an update did not send the unchanged TOAST value of a column the "
                        "predicate reads; REPLICA IDENTITY FULL avoids this",
                    )
                )
    new_shapes = _route(index, probe, out)
    if old is None or old_kind is None:
        old_shapes = new_shapes
        old = new
    else:
        old_shapes = _route(index, old, out)
    old_set = set(old_shapes)
    full_old = old_kind == "O"
    for shape in new_shapes:
        if shape in blind:
            continue
        if shape not in old_set:
            _enter(shape, new, missing, out)
            continue
        if old_kind is not None and shape.key_of(old) != shape.key_of(new):
            out.append((shape.name, DELETE, shape.project(old), None))
            _enter(shape, new, missing, out)
            continue
        values = shape.project(new)
        if full_old and shape.project(old) == values:
            continue  # none of the shape's columns changed
        out.append((shape.name, UPDATE, values, _unchanged(shape, missing)))
    if old_shapes is not new_shapes:
        new_set = set(new_shapes)
        for shape in old_shapes:
            if shape not in new_set and shape not in blind:
                out.append((shape.name, DELETE, shape.project(old), None))
    return out


def _enter(shape: BoundShape, new: TupleData, missing: frozenset[int], out: Routed) -> None:
    """The new row enters the shape: it needs every output value."""
    if missing and _unchanged(shape, missing):
        out.append(
            ShapeResync(
                shape.name,
                "a row entered the shape without the unchanged TOAST value of "
                f"{', '.join(_unchanged(shape, missing) or ())}; REPLICA IDENTITY FULL avoids this",
            )
        )
        return
    out.append((shape.name, INSERT, shape.project(new), None))


def _unchanged(shape: BoundShape, missing: frozenset[int]) -> tuple[str, ...] | None:
    if not missing:
        return None
    names = tuple(name for position, name in shape.projected_names if position in missing)
    return names or None


def _fill_toast(
    new: TupleData, old: TupleData | None, old_kind: str | None, index: ShapeIndex
) -> TupleData:
    """Replace UNCHANGED_TOAST with the old value where the old tuple carries it."""
    if old is None or old_kind is None:
        return new
    if old_kind == "O":
        return tuple(o if n is UNCHANGED_TOAST else n for n, o in zip(new, old, strict=True))
    # 'K': only the identity columns of the old tuple are values; the rest are absent
    identity: Sequence[bool] = [c.is_key for c in index.relation.columns]
    return tuple(
        o if n is UNCHANGED_TOAST and is_key else n
        for n, o, is_key in zip(new, old, identity, strict=True)
    )
