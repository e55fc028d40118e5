"""Typing a predicate against a table, part 2: value expressions.

``Typer`` extends ``typer.BooleanTyper`` with the expressions that compute values,
each following Postgres:

* ``+ - * / %`` and unary minus in the common type of their operands (integer
  results range-checked, integer ``/`` truncating; numeric exact, numeric ``/``
  refused because its result scale follows Postgres internals; real with real stays
  real);
* casts (``casts``), including ``ARRAY[...]::type[]`` element by element;
* ``lower upper length char_length abs coalesce nullif``; ``abs`` of an unknown
  literal is double precision, as Postgres resolves it;
* ``[NOT] LIKE/ILIKE`` with a constant pattern and optional ``ESCAPE``; a
  ``char(n)`` column keeps its trailing spaces for LIKE only; ``COLLATE "C"`` makes
  case-insensitive matching ASCII-only;
* ``ARRAY[...]`` and the array operators ``@> <@ &&`` on arrays of one element type.
"""

from __future__ import annotations

from sqlglot import exp

from tidemark.errors import ShapeError
from tidemark.predicates.casts import CastTarget, cast_function, cast_target
from tidemark.predicates.codegen import (
    Apply,
    ArrayBuild,
    Call,
    Coalesce,
    ColumnValue,
    Const,
    ConstError,
    Node,
    StrictTest,
)
from tidemark.predicates.comparison import Nullif, converter
from tidemark.predicates.like import like_matcher
from tidemark.predicates.operators import lower, lower_c, upper, upper_c
from tidemark.predicates.parse import ARITHMETIC, unsupported
from tidemark.predicates.sqltypes import (
    BOOL,
    BPCHAR,
    FLOAT4,
    FLOAT8,
    INT4,
    NUMERIC,
    TEXT,
    UNKNOWN,
    SqlType,
    array_of,
    text_key,
)
from tidemark.predicates.typer import BooleanTyper, number_literal


class Typer(BooleanTyper):
    """Types a whole predicate: ``BooleanTyper`` plus value expressions."""

    # -- LIKE

    def _like(
        self, e: exp.Expression, escape: exp.Expression | None, outer: exp.Expression
    ) -> Node:
        item = self.expr(e.this)
        if item.type is UNKNOWN:
            item = self.coerce(item, TEXT, outer)
        if item.type.family != "text":
            raise ShapeError(
                f"LIKE applies to text, not to {item.type.name}: {self.fail_sql(outer)}; cast "
                "the value to text first"
            )
        if item.type is BPCHAR:
            # trailing spaces of char(n) count in LIKE (Postgres docs, "Character Types")
            if not isinstance(item, ColumnValue):
                raise ShapeError(
                    f"LIKE on a computed character(n) value is not supported: "
                    f"{self.fail_sql(outer)}; cast it to text first"
                )
            item = ColumnValue(item.column, item.position, BPCHAR, padded=True)
        pattern_node = self.coerce(self.expr(e.expression), TEXT, outer)
        if not isinstance(pattern_node, Const) or pattern_node.type.family != "text":
            raise ShapeError(f"the LIKE pattern must be a text constant: {self.fail_sql(outer)}")
        esc: str | None = "\\"
        if escape is not None:
            esc_node = self.coerce(self.expr(escape), TEXT, outer)
            if not isinstance(esc_node, Const) or esc_node.value is None:
                raise ShapeError(f"ESCAPE needs a constant: {self.fail_sql(outer)}")
            if len(esc_node.value) > 1:
                raise ShapeError(
                    f"ESCAPE must be a single character or empty: {self.fail_sql(outer)}"
                )
            esc = esc_node.value or None
        negate = bool(e.args.get("negate"))
        if pattern_node.value is None:
            return Const(None, BOOL)
        ci = isinstance(e, exp.ILike)
        ascii_only = item.collate_c or pattern_node.collate_c
        self.case_mapping |= ci and not ascii_only
        matcher = like_matcher(
            pattern_node.value, esc, ci, ascii_only=ascii_only, sql=self.fail_sql(outer)
        )
        return self.fold(StrictTest([item], fn=matcher, negate=negate), outer)

    def t_Like(self, e: exp.Like) -> Node:
        return self._like(e, None, e)

    t_ILike = t_Like

    def t_Escape(self, e: exp.Escape) -> Node:
        inner = e.this
        if not isinstance(inner, exp.Like | exp.ILike):
            raise unsupported(e)
        return self._like(inner, e.expression, e)

    # -- arithmetic

    def _arith(self, e: exp.Expression) -> Node:
        op = ARITHMETIC[type(e)]
        left, right, t = self._pair(
            self.expr(e.this), self.expr(e.expression), e, f"apply '{op}' to"
        )
        if t.family not in ("int", "numeric", "float"):
            raise ShapeError(
                f"operator '{op}' is not supported for {left.type.name} and {right.type.name} "
                f"in a shape predicate: {self.fail_sql(e)}"
            )
        if left.type == FLOAT4 and right.type == FLOAT4:
            t = FLOAT4
        lconv, rconv = converter(left.type, t), converter(right.type, t)
        fn = _arith_function(op, t, self.fail_sql(e))
        node = Apply(
            t,
            [left, right],
            lambda a, b: f"{fn}({lconv(a) if lconv else a}, {rconv(b) if rconv else b})",
        )
        return self.fold(node, e)

    t_Add = t_Sub = t_Mul = t_Div = t_Mod = _arith

    def t_Neg(self, e: exp.Neg) -> Node:
        literal = _negated_literal(e)
        if literal is not None:
            return number_literal(literal)
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, NUMERIC, e)  # Postgres: unary minus of unknown -> numeric
        f = node.type.family
        if f == "int":
            check = f"ck{node.type.bits // 8}"
            return self.fold(Apply(node.type, [node], lambda x: f"{check}(-{x})"), e)
        if f == "numeric":
            return self.fold(Apply(node.type, [node], lambda x: f"nneg({x})"), e)
        if f == "float":
            return self.fold(Apply(node.type, [node], lambda x: f"(-{x})"), e)
        raise ShapeError(f"unary minus is not supported for {node.type.name}: {self.fail_sql(e)}")

    # -- casts and functions

    def t_Cast(self, e: exp.Cast) -> Node:
        target = cast_target(e.args["to"])
        if isinstance(e.this, exp.Array) and not e.this.expressions:
            if target.type.family != "array":
                raise ShapeError(f"cannot cast an array to {target.type.name}: {self.fail_sql(e)}")
            return Const([], target.type)  # ARRAY[]::integer[]
        node = self.expr(e.this)
        if isinstance(node, Const) and node.type is UNKNOWN:
            return self.coerce(node, target.type, e, target.params)
        if isinstance(node, ArrayBuild) and target.type.family == "array":
            assert target.type.element is not None
            items = [
                self._cast_node(i, CastTarget(target.type.element, target.params), e)
                for i in node.items
            ]
            return self.fold(ArrayBuild(items, target.type), e)
        return self._cast_node(node, target, e)

    def _cast_node(self, node: Node, target: CastTarget, e: exp.Expression) -> Node:
        if isinstance(node, Const) and node.type is UNKNOWN:
            return self.coerce(node, target.type, e, target.params)
        if isinstance(node, Const) and node.value is None:
            return Const(None, target.type)
        fn = cast_function(node.type, target, self.fail_sql(e))
        if fn is None:
            if node.type == target.type:
                return node
            return Apply(target.type, [node], lambda x: x, collate_c=node.collate_c)
        return self.fold(Call(target.type, [node], fn, collate_c=node.collate_c), e)

    def _text_arg(self, e: exp.Expression, fname: str) -> Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family != "text":
            raise ShapeError(f"{fname}() needs text, not {node.type.name}: {self.fail_sql(e)}")
        return node

    def t_Lower(self, e: exp.Lower) -> Node:
        node = self._text_arg(e, "lower")
        self.case_mapping |= not node.collate_c
        fn = lower_c if node.collate_c else lower
        return self.fold(Call(TEXT, [node], fn, collate_c=node.collate_c), e)

    def t_Upper(self, e: exp.Upper) -> Node:
        node = self._text_arg(e, "upper")
        self.case_mapping |= not node.collate_c
        fn = upper_c if node.collate_c else upper
        return self.fold(Call(TEXT, [node], fn, collate_c=node.collate_c), e)

    def t_Length(self, e: exp.Length) -> Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family not in ("text", "bytea"):
            raise ShapeError(
                f"length() needs text or bytea, not {node.type.name}: {self.fail_sql(e)}"
            )
        return self.fold(Apply(INT4, [node], lambda x: f"len({x})"), e)

    def t_Abs(self, e: exp.Abs) -> Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, FLOAT8, e)  # Postgres picks abs(double precision)
        f = node.type.family
        if f == "int":
            check = f"ck{node.type.bits // 8}"
            return self.fold(Apply(node.type, [node], lambda x: f"{check}(abs({x}))"), e)
        if f == "numeric":
            return self.fold(Apply(node.type, [node], lambda x: f"nabs({x})"), e)
        if f == "float":
            return self.fold(Apply(node.type, [node], lambda x: f"abs({x})"), e)
        raise ShapeError(f"abs() needs a number, not {node.type.name}: {self.fail_sql(e)}")

    def t_Coalesce(self, e: exp.Coalesce) -> Node:
        nodes, t = self._unify([self.expr(x) for x in [e.this, *e.expressions]], e, "combine")
        # Postgres's simplification, in order: NULL constants go, a first non-NULL
        # constant is the result, one after other arguments ends the list
        kept: list[Node] = []
        for node in nodes:
            if isinstance(node, ConstError):
                return ConstError(t, node.message)
            if isinstance(node, Const):
                if node.value is None:
                    continue
                if not kept:  # the result, in the common type (an int4 constant is int8 here)
                    return Const(node.value, t, node.collate_c)
                kept.append(node)
                break
            kept.append(node)
        if not kept:
            return Const(None, t)
        return self.fold(Coalesce(kept, t), e)

    def t_Nullif(self, e: exp.Nullif) -> Node:
        left, right, cmp = self._pair(self.expr(e.this), self.expr(e.expression), e, "compare")
        return self.fold(Nullif(left, right, cmp), e)

    # -- arrays

    def t_Array(self, e: exp.Array) -> Node:
        items = [self.expr(x) for x in e.expressions]
        if not items:
            raise ShapeError(
                f"an empty ARRAY[] needs a type: write ARRAY[]::integer[] ({self.fail_sql(e)})"
            )
        nodes, t = self._unify(items, e, "combine")
        node = ArrayBuild(nodes, array_of(t, self.fail_sql(e)))
        return self.fold(node, e)

    def _array_op(self, e: exp.Expression) -> Node:
        left, right = self.expr(e.this), self.expr(e.expression)
        if left.type is UNKNOWN and right.type is UNKNOWN:
            raise ShapeError(f"cannot tell the array type of {self.fail_sql(e)}: add a cast")
        left, right = self.coerce(left, right.type, e), self.coerce(right, left.type, e)
        if left.type.family != "array" or right.type.family != "array":
            raise ShapeError(
                f"operator {self.fail_sql(e)} needs arrays on both sides (jsonb and other "
                "types are not supported)"
            )
        assert left.type.element is not None and right.type.element is not None
        if text_key(left.type.element) != text_key(right.type.element):
            raise ShapeError(
                f"operator {self.fail_sql(e)} needs arrays of the same type, not "
                f"{left.type.name} and {right.type.name}: cast one side"
            )
        if isinstance(e, exp.ArrayContainsAll):
            body = "acontains({0}, {1})"
        elif isinstance(e, exp.ArrayContainedBy):
            body = "acontains({1}, {0})"
        else:
            body = "aoverlap({0}, {1})"
        return self.fold(StrictTest([left, right], lambda a, b: body.format(a, b)), e)

    t_ArrayContainsAll = t_ArrayContainedBy = t_ArrayOverlaps = _array_op


def _negated_literal(e: exp.Neg) -> str | None:
    """The constant a minus sign in front of a number literal becomes, as Postgres's
    grammar folds it (through parentheses and repeatedly): ``-(-9223372036854775808)``
    is the numeric 9223372036854775808, not a negated bigint that overflows."""
    inner = e.this
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Literal) and not inner.is_string:
        text = str(inner.this)
    elif isinstance(inner, exp.Neg):
        found = _negated_literal(inner)
        if found is None:
            return None
        text = found
    else:
        return None
    return text[1:] if text.startswith("-") else "-" + text


def _arith_function(op: str, t: SqlType, sql: str) -> str:
    f = t.family
    if f == "int":
        check = f"ck{t.bits // 8}"
        if op == "/":
            return f"(lambda a, b: {check}(idiv(a, b)))"
        if op == "%":
            return "imod"
        return {
            "+": f"(lambda a, b: {check}(a + b))",
            "-": f"(lambda a, b: {check}(a - b))",
            "*": f"(lambda a, b: {check}(a * b))",
        }[op]
    if f == "numeric":
        if op == "/":
            raise ShapeError(
                f"division of numeric values is not supported in a shape predicate ({sql}): "
                "its result scale follows Postgres internals; multiply instead, or cast to "
                "double precision"
            )
        return {"+": "nadd", "-": "nsub", "*": "nmul", "%": "nmod"}[op]
    if op == "%":
        raise ShapeError(f"operator '%' does not exist for {t.name}: {sql}")
    name = {"+": "fadd", "-": "fsub", "*": "fmul", "/": "fdiv"}[op]
    return f"f4op({name})" if t is FLOAT4 else name
