"""How a column of any Postgres type reaches the lake: its Arrow type and converter.

``lake_column(pg_type)`` (cached per ``PgType``) gives a ``LakeColumn``; its
``to_arrow(values)`` converts one column of a batch: text ``bytes`` (the stream) or
an Arrow string/binary array (a snapshot read with COPY), ``None`` for NULL.

Scalars use the vectorized converters of ``values.arrow``; the kinds built from
other types are split in Python per value (Arrow cannot parse their syntax) and then
convert all their parts of the batch as one column of the part's type:

* ``array`` -> ``list<element>``. A value with several dimensions (``{{1,2},{3,4}}``)
  is refused (``UnfitValue``): the column type cannot depend on the value, and
  Postgres does not enforce a column's dimensions. Lower bounds
  (``[0:1]={1,2}``) are dropped: a list starts at its first element.
* ``composite`` -> ``struct<field: ...>`` in attribute order. A NULL composite is a
  NULL struct; a composite whose fields are all NULL is a struct of NULLs (Postgres
  says ``c IS NULL`` for both, ``c::text`` tells them apart). A value with another
  number of fields than the catalog said (``ALTER TYPE ... ADD/DROP ATTRIBUTE`` since
  the shape read it) is refused with a message that says to resync the shape.
* ``range`` -> ``struct<lower, upper, lower_inc, upper_inc, lower_inf, upper_inf,
  empty>``, bounds typed by the subtype, flags as Postgres's ``lower_inc(r)`` ...
  ``isempty(r)`` return them; an unbounded side has a NULL bound and ``*_inf`` true;
  an empty range has NULL bounds, every other flag false and ``empty`` true.
* ``multirange`` -> ``list<range struct>``, in Postgres's (sorted) order.
* ``enum`` -> string (the label). Delta has no dictionary type, so the lake schema
  says string; Spark's Parquet writer dictionary-encodes such columns in the files.
* ``text`` -> string: Postgres's text output, unchanged (types without a mapping are
  counted by ``unknown_type_counts``, unless the shape declared ``column::text``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from tidemark.errors import UnfitValue
from tidemark.pgoutput.values.array_text import split_array
from tidemark.pgoutput.values.arrow import (
    scalar_arrow_type,
    scalar_converter,
    string_converter,
)
from tidemark.pgoutput.values.pgtype import PgType, describe
from tidemark.pgoutput.values.record_text import (
    RangeParts,
    split_multirange,
    split_range,
    split_record,
)

_BINARY: Final = pa.binary()
_STRING: Final = pa.string()
_BOOL: Final = pa.bool_()
_INT32: Final = pa.int32()
_RANGE_FLAGS: Final = ("lower_inc", "upper_inc", "lower_inf", "upper_inf", "empty")

Converter = Callable[[Sequence[Any]], pa.Array]


@dataclass(frozen=True, slots=True)
class LakeColumn:
    """One Postgres type's column in the lake: Arrow type and converter."""

    pg_type: PgType
    arrow_type: pa.DataType
    convert: Converter  # a Python sequence of text bytes (or None) -> an Arrow array
    python_input: bool  # ``convert`` loops over Python values: give it a list

    def to_arrow(self, values: Sequence[bytes | None] | pa.Array) -> pa.Array:
        """Convert one column of text values (``None`` for NULL) to ``arrow_type``."""
        if isinstance(values, pa.Array):
            values = values if values.type == _BINARY else values.cast(_BINARY)
            if self.python_input:
                values = values.to_pylist()
        return self.convert(values)


@functools.cache
def lake_column(pg_type: PgType) -> LakeColumn:
    """The lake column of a type (see the module docstring); one per ``PgType``."""
    kind = pg_type.kind
    if kind == "scalar":
        convert, python_input = scalar_converter(pg_type)
        arrow = scalar_arrow_type(pg_type.oid, pg_type.typmod)
        return LakeColumn(pg_type, arrow, convert, python_input)
    if kind == "enum":
        return LakeColumn(
            pg_type, _STRING, string_converter(pg_type.oid, count_unknown=False), False
        )
    if kind == "array":
        assert pg_type.element is not None
        element = lake_column(pg_type.element)
        return LakeColumn(
            pg_type, pa.list_(element.arrow_type), _list_converter(pg_type, element), True
        )
    if kind == "composite":
        fields = tuple((name, lake_column(t)) for name, t in pg_type.fields)
        if fields:
            arrow = pa.struct([(name, column.arrow_type) for name, column in fields])
            return LakeColumn(pg_type, arrow, _composite_converter(pg_type, fields), True)
    if kind == "range":
        assert pg_type.element is not None
        bound = lake_column(pg_type.element)
        struct = range_struct(bound.arrow_type)
        return LakeColumn(pg_type, struct, _range_converter(bound, struct), True)
    if kind == "multirange":
        assert pg_type.element is not None and pg_type.element.element is not None
        bound = lake_column(pg_type.element.element)
        struct = range_struct(bound.arrow_type)
        convert = _multirange_converter(bound, struct)
        return LakeColumn(pg_type, pa.list_(struct), convert, True)
    # text, or a composite type without attributes: Postgres's text output
    counted = not pg_type.declared and kind == "text"
    return LakeColumn(pg_type, _STRING, string_converter(pg_type.oid, count_unknown=counted), False)


def range_struct(bound: pa.DataType) -> pa.StructType:
    """The lake type of a range whose bounds have Arrow type ``bound``."""
    return pa.struct(
        [("lower", bound), ("upper", bound), *((flag, _BOOL) for flag in _RANGE_FLAGS)]
    )


@functools.lru_cache(maxsize=512)
def _builtin(type_oid: int, type_modifier: int) -> LakeColumn:
    return lake_column(describe(type_oid, type_modifier))


def arrow_type(type_oid: int, type_modifier: int = -1) -> pa.DataType:
    """The Arrow type of a column of a built-in type (user types: ``lake_column``)."""
    return _builtin(type_oid, type_modifier).arrow_type


def to_arrow(
    values: Sequence[bytes | None] | pa.Array, type_oid: int, type_modifier: int = -1
) -> pa.Array:
    """Convert one column of a built-in type (user types: ``lake_column``).

    Raises ``ProtocolError`` for text that the type never outputs and ``UnfitValue``
    for a value the lake type cannot hold exactly; types without a mapping stay text
    and are counted.
    """
    return _builtin(type_oid, type_modifier).to_arrow(values)


# --- arrays ---


def _list_converter(pg_type: PgType, element: LakeColumn) -> Converter:
    lake_type = f"{pa.list_(element.arrow_type)} (the lake type of {pg_type.name})"

    def convert(values: Sequence[bytes | None]) -> pa.Array:
        # Arrow cannot parse array text: split per value in Python, then convert all
        # elements of the batch as one column.
        offsets = [0]
        is_null: list[bool] = []
        flat: list[bytes | None] = []
        for value in values:
            if value is None:
                is_null.append(True)
            else:
                items = split_array(value)
                if value.count(b"{") > 1 and any(isinstance(item, list) for item in items):
                    raise UnfitValue(
                        value,
                        lake_type,
                        "it has several dimensions and a lake list has one",
                    )
                flat.extend(items)
                is_null.append(False)
            offsets.append(len(flat))
        return pa.ListArray.from_arrays(
            pa.array(offsets, _INT32), element.convert(flat), mask=pa.array(is_null, _BOOL)
        )

    return convert


# --- composites ---


def _composite_converter(pg_type: PgType, fields: tuple[tuple[str, LakeColumn], ...]) -> Converter:
    width = len(fields)
    arrow_fields = [pa.field(name, column.arrow_type) for name, column in fields]
    nulls: tuple[None, ...] = (None,) * width

    def convert(values: Sequence[bytes | None]) -> pa.Array:
        rows: list[Sequence[bytes | None]] = []
        is_null: list[bool] = []
        for value in values:
            if value is None:
                rows.append(nulls)
                is_null.append(True)
                continue
            row = split_record(value)
            if len(row) != width:
                raise UnfitValue(
                    value,
                    f"the struct of composite type {pg_type.name}",
                    f"it has {len(row)} fields, but the type had {width} when the shape "
                    "read the catalog (ALTER TYPE changed it since)",
                    "Resync the shape: it reads the type again and rebuilds the table",
                )
            rows.append(row)
            is_null.append(False)
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
        arrays = [
            column.convert(list(part)) for (_, column), part in zip(fields, columns, strict=True)
        ]
        return pa.StructArray.from_arrays(
            arrays, fields=arrow_fields, mask=pa.array(is_null, _BOOL) if any(is_null) else None
        )

    return convert


# --- ranges and multiranges ---


def _range_array(
    parts: Sequence[RangeParts | None], bound: LakeColumn, struct: pa.StructType
) -> pa.Array:
    lower = [None if p is None else p[0] for p in parts]
    upper = [None if p is None else p[1] for p in parts]
    arrays = [bound.convert(lower), bound.convert(upper)]
    for index in range(2, 7):
        arrays.append(pa.array([None if p is None else p[index] for p in parts], _BOOL))
    mask = [p is None for p in parts]
    return pa.StructArray.from_arrays(
        arrays, fields=list(struct), mask=pa.array(mask, _BOOL) if any(mask) else None
    )


def _range_converter(bound: LakeColumn, struct: pa.StructType) -> Converter:
    def convert(values: Sequence[bytes | None]) -> pa.Array:
        return _range_array([None if v is None else split_range(v) for v in values], bound, struct)

    return convert


def _multirange_converter(bound: LakeColumn, struct: pa.StructType) -> Converter:
    def convert(values: Sequence[bytes | None]) -> pa.Array:
        offsets = [0]
        is_null: list[bool] = []
        flat: list[RangeParts | None] = []
        for value in values:
            if value is None:
                is_null.append(True)
            else:
                flat.extend(split_multirange(value))
                is_null.append(False)
            offsets.append(len(flat))
        return pa.ListArray.from_arrays(
            pa.array(offsets, _INT32),
            _range_array(flat, bound, struct),
            mask=pa.array(is_null, _BOOL),
        )

    return convert
