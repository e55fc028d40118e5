"""Comparisons in a shape predicate: Postgres's common type, and the nodes comparing.

``common_type(a, b)`` is the type Postgres compares (or computes) two known types in:
the wider integer; numeric for integer with numeric (compared exactly: Python
compares int and Decimal exactly); double precision as soon as a float is involved
(so ``real_col = 0.1`` is false, as in Postgres); timestamp for date with timestamp.
Mixing timestamptz with date or timestamp is refused (Postgres would convert in the
session time zone), and so is any other pair: the user casts explicitly.

Nodes: ``Compare`` (``= <> < <= > >=``; float and numeric use the NaN-aware
operators), ``InSet`` (``IN`` a set of constants, or ``= ANY`` of a constant array,
with SQL's NULL rules), ``Distinct`` (``IS [NOT] DISTINCT FROM``, never NULL) and
``Nullif``. ``element_test`` is the per-element test of ``op ANY/ALL (array)``.

Fast path: for types whose text output is canonical (``RAW_EQUALITY``),
``column = constant`` compares the raw bytes pgoutput sent with the constant's text
(``canonical_text``) and never parses the column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date
from typing import Any, Final

from tidemark.errors import ShapeError
from tidemark.predicates.codegen import CodeGen, ColumnValue, Const, Node, StrictTest
from tidemark.predicates.operators import nan_eq, nan_ge, nan_gt, nan_le, nan_lt, nan_ne, nkey
from tidemark.predicates.sqltypes import (
    BOOL,
    FLOAT8,
    NUMERIC,
    RAW_EQUALITY,
    TEXT,
    TIMESTAMP,
    SqlType,
    text_key,
)
from tidemark.predicates.temporal import date_ts

_PY_OPS: Final = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_NAN_OPS: Final = {
    "=": "nan_eq",
    "<>": "nan_ne",
    "<": "nan_lt",
    "<=": "nan_le",
    ">": "nan_gt",
    ">=": "nan_ge",
}
_NAN_FUNCS: Final = {
    "=": nan_eq,
    "<>": nan_ne,
    "<": nan_lt,
    "<=": nan_le,
    ">": nan_gt,
    ">=": nan_ge,
}
_OP_FUNCS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
REVERSED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def converter(source: SqlType, target: SqlType) -> Callable[[str], str] | None:
    """Code template converting a value of ``source`` to the comparison type ``target``."""
    if source == target or (source.family == target.family and source.family != "float"):
        return None
    if target.family == "float":
        if source.family == "float":
            return None
        return lambda x: f"float({x})"
    if target.family == "timestamp" and source.family == "date":
        return lambda x: f"date_ts({x})"
    return None  # int -> numeric: Python compares int and Decimal exactly


def _compare_body(
    op: str,
    cmp: SqlType,
    lconv: Callable[[str], str] | None,
    rconv: Callable[[str], str] | None,
    right_const: Any = None,
) -> Callable[..., str]:
    def body(a: str, b: str) -> str:
        a2 = lconv(a) if lconv else a
        b2 = rconv(b) if rconv else b
        if cmp.family == "numeric" or (cmp.family == "float" and right_const is None):
            return f"{_NAN_OPS[op]}({a2}, {b2})"
        if cmp.family == "float" and op in (">", ">="):
            # the constant is a number: only a NaN on the left changes the answer
            return f"({a2} {_PY_OPS[op]} {b2} or {a2} != {a2})"
        return f"({a2} {_PY_OPS[op]} {b2})"

    return body


class Compare(StrictTest):
    def __init__(self, op: str, left: Node, right: Node, cmp: SqlType) -> None:
        self.op, self.left, self.right, self.cmp = op, left, right, cmp
        right_const = right.value if isinstance(right, Const) else None
        if cmp.family == "float" and right_const is not None and right_const != right_const:
            right_const = None  # NaN constant: use the NaN-aware helper
        body = _compare_body(
            op, cmp, converter(left.type, cmp), converter(right.type, cmp), right_const
        )
        super().__init__((left, right), body)

    def raw_key(self) -> tuple[ColumnValue, bytes] | None:
        """(column, bytes) when this is ``column = constant`` decidable on raw text."""
        if self.op not in ("=", "<>"):
            return None
        col, const = self.left, self.right
        if not isinstance(col, ColumnValue) or not isinstance(const, Const) or const.value is None:
            return None
        key = canonical_text(col.type, self.cmp, const.value)
        return None if key is None else (col, key)

    def _raw_code(self, g: CodeGen) -> tuple[str, str] | None:
        found = self.raw_key()
        if found is None:
            return None
        col, key = found
        return g.raw(col.position), g.const(key)

    def emit(self, g: CodeGen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().emit(g)
        v, k = raw
        return f"(None if {v} is None else {v} {_PY_OPS[self.op]} {k})"

    def truth(self, g: CodeGen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().truth(g)
        v, k = raw
        if self.op == "=":
            return f"({v} == {k})"
        return f"({v} is not None and {v} != {k})"

    def falsity(self, g: CodeGen) -> str:
        raw = self._raw_code(g)
        if raw is None:
            return super().falsity(g)
        v, k = raw
        if self.op == "<>":
            return f"({v} == {k})"
        return f"({v} is not None and {v} != {k})"


def canonical_text(column_type: SqlType, cmp: SqlType, value: Any) -> bytes | None:
    """The text Postgres sends for a column equal to ``value``, if it is unique."""
    if column_type not in RAW_EQUALITY or text_key(column_type).family != cmp.family:
        return None
    if cmp.family == "int":
        return str(value).encode()
    if cmp.family == "text":
        return str(value).encode()
    if cmp.family == "uuid":
        return str(value).encode()
    if cmp.family == "bool":
        return b"t" if value else b"f"
    return None


class InSet(Node):
    """``x IN (constants)`` / ``x = ANY(constant array)`` with SQL NULL rules."""

    type = BOOL

    def __init__(
        self, item: Node, keys: frozenset[Any], has_null: bool, empty: bool, cmp: SqlType
    ) -> None:
        self.item, self.keys, self.has_null, self.empty, self.cmp = item, keys, has_null, empty, cmp
        self.nullable = not empty and (item.nullable or has_null)
        self.conv = converter(item.type, cmp)
        self.nan = cmp.family in ("float", "numeric")

    def children(self) -> Sequence[Node]:
        return (self.item,)

    def raw_keys(self) -> tuple[ColumnValue, frozenset[bytes]] | None:
        col = self.item
        if not isinstance(col, ColumnValue):
            return None
        keys = [canonical_text(col.type, self.cmp, k) for k in self.keys]
        if any(k is None for k in keys):
            return None
        return col, frozenset(k for k in keys if k is not None)

    def _member(self, g: CodeGen) -> tuple[str, Callable[[str], str]]:
        raw = self.raw_keys()
        if raw is not None:
            col, keys = raw
            return g.raw(col.position), lambda x: f"({x} in {g.const(keys)})"
        ks = frozenset(nkey(k) for k in self.keys) if self.nan else self.keys
        k = g.const(ks)
        conv = self.conv or (lambda x: x)
        if self.nan:
            return self.item.emit(g), lambda x: f"(nkey({conv(x)}) in {k})"
        return self.item.emit(g), lambda x: f"({conv(x)} in {k})"

    def _bound(self, g: CodeGen) -> tuple[str, str | None, Callable[[str], str]]:
        code, member = self._member(g)
        if code.isidentifier():
            return code, f"{code} is None", member
        t = g.temp()
        return t, f"({t} := {code}) is None", member

    def _empty(self, g: CodeGen, answer: str) -> str:
        """Against an empty array the answer is false (negated: true) even for a NULL
        item, but the item is evaluated first, as Postgres does: its errors (a cast out
        of range) are the row's."""
        return f"({self.item.emit(g)}, {answer})[1]"

    def emit(self, g: CodeGen) -> str:
        if self.empty:
            return self._empty(g, "False")
        name, test, member = self._bound(g)
        miss = "None" if self.has_null else "False"
        return f"(None if {test} else (True if {member(name)} else {miss}))"

    def truth(self, g: CodeGen) -> str:
        if self.empty:
            return self._empty(g, "False")
        name, test, member = self._bound(g)
        return f"(not ({test}) and {member(name)})"

    def falsity(self, g: CodeGen) -> str:
        if self.empty:
            return self._empty(g, "True")
        if self.has_null:
            return "False"
        name, test, member = self._bound(g)
        return f"(not ({test}) and not {member(name)})"


class Distinct(Node):
    """``a IS [NOT] DISTINCT FROM b``: NULL-safe equality, never NULL."""

    type = BOOL
    nullable = False

    def __init__(self, left: Node, right: Node, cmp: SqlType, negate: bool) -> None:
        self.left, self.right, self.negate = left, right, negate
        self.equal = _compare_body("=", cmp, converter(left.type, cmp), converter(right.type, cmp))

    def children(self) -> Sequence[Node]:
        return (self.left, self.right)

    def emit(self, g: CodeGen) -> str:
        a, b = g.temp(), g.temp()
        both = f"((({a} := {self.left.emit(g)}) is None) | (({b} := {self.right.emit(g)}) is None))"
        distinct = f"(({a} is not None or {b} is not None) if {both} else not {self.equal(a, b)})"
        return f"(not {distinct})" if self.negate else distinct


class Nullif(Node):
    def __init__(self, left: Node, right: Node, cmp: SqlType) -> None:
        self.left, self.right, self.type = left, right, left.type
        self.collate_c = left.collate_c
        self.equal = _compare_body("=", cmp, converter(left.type, cmp), converter(right.type, cmp))

    def children(self) -> Sequence[Node]:
        return (self.left, self.right)

    def emit(self, g: CodeGen) -> str:
        # both arguments are evaluated first, as Postgres does (an error in the second
        # counts even when the first is NULL)
        a, b = g.temp(), g.temp()
        return (
            f"(None if (({a} := {self.left.emit(g)}), ({b} := {self.right.emit(g)}))[0] is "
            f"None else ({a} if {b} is None else (None if {self.equal(a, b)} else {a})))"
        )


def common_type(a: SqlType, b: SqlType, what: str) -> SqlType:
    """Postgres's common type for two known types (comparison or arithmetic)."""
    if a == b:
        return a
    fa, fb = a.family, b.family
    if fa == fb:
        if fa == "int":
            return a if a.bits >= b.bits else b
        if fa == "float":
            return FLOAT8
        if fa == "text":
            return TEXT
        if fa == "array" and a.element and b.element and text_key(a.element) == text_key(b.element):
            return a
    elif {fa, fb} <= {"int", "numeric"}:
        return NUMERIC
    elif {fa, fb} <= {"int", "numeric", "float"}:
        return FLOAT8
    elif {fa, fb} == {"date", "timestamp"}:
        return TIMESTAMP
    if "timestamptz" in (fa, fb) and {fa, fb} <= {"date", "timestamp", "timestamptz"}:
        raise ShapeError(
            f"cannot {what} {a.name} and {b.name} in a shape predicate: Postgres would convert "
            "using the session time zone; compare timestamptz with a timestamptz literal that "
            "has a UTC offset"
        )
    raise ShapeError(
        f"cannot {what} {a.name} and {b.name} in a shape predicate: cast one side explicitly"
    )


def element_test(
    op: str, cmp: SqlType, lconv: Callable[[str], str] | None, rconv: Callable[[str], str] | None
) -> Callable[[Any, Any], bool]:
    base = _NAN_FUNCS[op] if cmp.family in ("numeric", "float") else _OP_FUNCS[op]
    to_float = cmp.family == "float"
    if to_float and (lconv or rconv):
        return lambda a, b: base(float(a), float(b))
    if lconv is not None or rconv is not None:  # date vs timestamp

        def fix(v: Any) -> Any:
            return date_ts(v) if type(v) is date else v

        return lambda a, b: base(fix(a), fix(b))
    return base
