"""Explicit casts in a shape predicate: the target types, and what each cast computes.

``cast_target(datatype)`` reads a cast's target (``x::int``, ``CAST(x AS
varchar(10))``, ``'{1,2}'::int[]``) into a ``CastTarget``: a supported ``SqlType``
plus its type modifier (length for text types, precision and scale for numeric).
Other modifiers are refused, since Postgres would round the value.

``cast_function(source, target)`` is the Python function for casting a value of
``source`` to ``target``, or None when the value does not change. It follows
Postgres's cast functions: integer narrowing checks the range, numeric and float to
integer round (half away from zero for numeric, half to even for float), text input
goes through the type's input function, ``char(n)`` pads away trailing spaces, dates
print in ISO style. Casts whose result would depend on the session (text to
timestamptz, timestamp to timestamptz) or that tidemark does not implement raise
``ShapeError`` naming the cast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sqlglot import exp

from tidemark.errors import ShapeError
from tidemark.predicates.operators import (
    INT_CHECK,
    bool_text,
    f4,
    float_to_int,
    numeric_text,
    numeric_to_int,
    numeric_typmod,
)
from tidemark.predicates.sqltypes import (
    BOOL,
    BPCHAR,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UUID,
    VARCHAR,
    SqlType,
    array_of,
    input_function,
    length_limited,
    text_key,
)
from tidemark.predicates.temporal import date_text, date_ts, timestamp_date


@dataclass(frozen=True, slots=True)
class CastTarget:
    type: SqlType
    params: tuple[int, ...] = ()


_DTYPES: Final = {
    exp.DataType.Type.BOOLEAN: BOOL,
    exp.DataType.Type.SMALLINT: INT2,
    exp.DataType.Type.INT: INT4,
    exp.DataType.Type.BIGINT: INT8,
    exp.DataType.Type.DECIMAL: NUMERIC,
    exp.DataType.Type.FLOAT: FLOAT4,
    exp.DataType.Type.DOUBLE: FLOAT8,
    exp.DataType.Type.TEXT: TEXT,
    exp.DataType.Type.VARCHAR: VARCHAR,
    exp.DataType.Type.CHAR: BPCHAR,
    exp.DataType.Type.BPCHAR: BPCHAR,
    exp.DataType.Type.VARBINARY: BYTEA,
    exp.DataType.Type.UUID: UUID,
    exp.DataType.Type.DATE: DATE,
    exp.DataType.Type.TIME: TIME,
    exp.DataType.Type.TIMESTAMP: TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: TIMESTAMPTZ,
}


def cast_target(dt: exp.DataType) -> CastTarget:
    if dt.this == exp.DataType.Type.ARRAY:
        inner = dt.expressions[0] if dt.expressions else None
        while isinstance(inner, exp.DataType) and inner.this == exp.DataType.Type.ARRAY:
            inner = inner.expressions[0] if inner.expressions else None  # int[][] is int[]
        if not isinstance(inner, exp.DataType):
            raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported")
        element = cast_target(inner)
        return CastTarget(array_of(element.type, dt.sql(dialect="postgres")), element.params)
    found = _DTYPES.get(dt.this)
    if found is None:
        raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported in a shape predicate")
    params: list[int] = []
    for p in dt.expressions:
        inner = p.this if isinstance(p, exp.DataTypeParam) else p
        if not (isinstance(inner, exp.Literal) and not inner.is_string):
            raise ShapeError(f"type {dt.sql(dialect='postgres')} is not supported")
        params.append(int(inner.this))
    if params and found.family not in ("text", "numeric"):
        raise ShapeError(
            f"type modifier in {dt.sql(dialect='postgres')} is not supported in a shape "
            "predicate (Postgres would round the value)"
        )
    return CastTarget(found, tuple(params))


def cast_function(src: SqlType, target: CastTarget, sql: str) -> Callable[[Any], Any] | None:
    """Python function for an explicit cast of a value of ``src`` (None: no change)."""
    dst, params = target.type, target.params
    sf, df = src.family, dst.family

    def refuse() -> ShapeError:
        return ShapeError(f"cannot cast {src.name} to {dst.name} in a shape predicate: {sql}")

    if df == "text":
        limit = length_limited(params[0] if params else None, dst is BPCHAR)
        to_text: Callable[[Any], str] | None = {
            "text": None,
            "int": str,
            "numeric": numeric_text,
            "uuid": str,
            "bool": bool_text,
            "date": date_text,
        }.get(sf, refuse)  # type: ignore[arg-type]
        if to_text is refuse:
            raise refuse()
        if dst is BPCHAR or params:
            if to_text is None:
                return limit
            first = to_text
            return lambda v: limit(first(v))
        return to_text
    if sf == "text":
        if df == "timestamptz":
            raise ShapeError(
                f"casting text to timestamptz is not supported in a shape predicate ({sql}): "
                "values without a UTC offset would be read in the session time zone"
            )
        if df == "array":
            raise refuse()
        return input_function(dst, params)
    if sf == "int" and df == "int":
        return None if dst.bits >= src.bits else INT_CHECK[dst.bits]
    if df == "numeric" and sf in ("int", "numeric"):
        if params:
            return numeric_typmod(params[0], params[1] if len(params) > 1 else 0)
        return Decimal if sf == "int" else None
    if df == "float" and sf in ("int", "numeric", "float"):
        if dst is FLOAT4:
            return lambda v: f4(float(v))
        return None if sf == "float" else float
    if df == "int" and sf == "numeric":
        check = INT_CHECK[dst.bits]
        return lambda v: check(numeric_to_int(v))
    if df == "int" and sf == "float":
        check = INT_CHECK[dst.bits]
        return lambda v: check(float_to_int(v))
    if src is INT4 and dst is BOOL:
        return lambda v: v != 0
    if src is BOOL and dst is INT4:
        return int
    if sf == "date" and df == "timestamp":
        return date_ts
    if sf == "timestamp" and df == "date":
        return timestamp_date
    if src == dst or (
        sf == "array"
        and df == "array"
        and src.element
        and dst.element
        and text_key(src.element) == text_key(dst.element)
    ):
        return None
    raise refuse()
