"""Typing a predicate against a table, part 1: literals, columns, logic and comparisons.

``BooleanTyper`` walks a validated sqlglot tree (``parse``) and builds typed
nodes (``codegen``, ``logic``, ``comparison``), following Postgres's rules wherever
the result depends on them:

* a string literal is of *unknown* type and takes the type of the other operand
  (``int_col = '17'`` compares integers); integer literals are int4, else int8, else
  numeric; ``1.5`` and ``1e3`` are numeric; NULL is unknown too;
* comparisons use ``comparison.common_type``; a constant is converted to that type
  once, at compile time; a comparison with the constant on the left is turned around
  (column on the left feeds the routing index and the raw-bytes fast path);
* ordering comparisons on text need ``COLLATE "C"`` (the database collation cannot be
  reproduced), ordering comparisons of arrays are refused;
* the planner's simplification is mirrored (``fold``, ``logic``): sub-expressions
  without columns are evaluated once, strict operators with a NULL constant argument
  are NULL, AND/OR with a deciding constant are that constant; a constant that
  raises (``1/0``) becomes a ``ConstError`` that refuses the predicate at definition
  time, unless a constant AND/OR/COALESCE argument before it means Postgres never
  evaluates it;
* ``IN`` lists are typed as Postgres's parser rewrites them (constants first, as one
  ``= ANY``, when there are two or more).

Value expressions (arithmetic, casts, functions, LIKE, arrays) are typed by the
subclass ``typer_values.Typer``, which is what the compiler uses. Every refusal is a
``ShapeError`` quoting the offending SQL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from sqlglot import exp

from tidemark.errors import ShapeError
from tidemark.pgoutput.messages import RelationColumn
from tidemark.predicates.codegen import (
    AnyAll,
    Apply,
    Call,
    CodeGen,
    ColumnValue,
    Const,
    ConstError,
    Node,
    StrictTest,
    first_error,
)
from tidemark.predicates.comparison import (
    REVERSED,
    Compare,
    Distinct,
    InSet,
    common_type,
    converter,
    element_test,
)
from tidemark.predicates.identifiers import quote_identifier
from tidemark.predicates.logic import IsBool, IsNull, Logic, Not
from tidemark.predicates.operators import EVAL_ERRORS, INT_RANGE, RUNTIME, flat
from tidemark.predicates.parse import ANY_ALL_NAMES, COMPARISONS, unsupported
from tidemark.predicates.sqltypes import (
    BOOL,
    INT4,
    INT8,
    NUMERIC,
    SCALARS,
    TEXT,
    UNKNOWN,
    SqlType,
    array_of,
    input_function,
    sql_type,
    type_name,
)


class BooleanTyper:
    def __init__(self, columns: Mapping[str, tuple[int, RelationColumn]]) -> None:
        self.columns = columns
        # lower/upper/ILIKE beyond ASCII: their result depends on the database's ctype
        self.case_mapping = False

    # -- helpers

    def fail_sql(self, node: exp.Expression) -> str:
        return node.sql(dialect="postgres")

    def coerce(
        self, node: Node, target: SqlType, sql: exp.Expression, params: tuple[int, ...] = ()
    ) -> Node:
        """Resolve an unknown-typed literal to ``target`` (Postgres's literal typing)."""
        if node.type is not UNKNOWN:
            return node
        assert isinstance(node, Const)
        if node.value is None:
            return Const(None, target)
        try:
            value = input_function(target, params)(node.value)
        except (*EVAL_ERRORS, ShapeError) as e:
            raise ShapeError(
                f"{node.value!r} in {self.fail_sql(sql)} is not a valid {target.name}: {e}"
            ) from e
        return Const(value, target, node.collate_c)

    def fold(self, node: Node, sql: exp.Expression) -> Node:
        """Simplify ``node`` as Postgres's planner does before it evaluates anything.

        An argument that could not be evaluated makes the whole node that error. A
        strict function or operator with a NULL constant argument is NULL without
        evaluating its other arguments (so ``1/x + NULL`` never raises), and a
        sub-expression without columns is evaluated once, at definition time; if that
        raises, the result is a ``ConstError`` (see ``logic`` and ``compile``).
        """
        error = first_error(node)
        if error is not None:
            return error if error is node else ConstError(node.type, error.message)
        if isinstance(node, Apply | Call | StrictTest) and any(
            isinstance(arg, Const) and arg.value is None for arg in node.children()
        ):
            return Const(None, node.type, node.collate_c)
        if isinstance(node, Const) or any(True for _ in node.columns()):
            return node
        g = CodeGen()
        code = node.emit(g)
        scope = dict(g.ns)
        exec(compile(f"def _value():\n    return {code}\n", "<shape predicate>", "exec"), scope)
        try:
            value = scope["_value"]()
        except EVAL_ERRORS as e:
            return ConstError(
                node.type, f"the constant expression {self.fail_sql(sql)} cannot be evaluated: {e}"
            )
        return Const(value, node.type, node.collate_c)

    # -- entry points

    def boolean(self, e: exp.Expression) -> Node:
        node = self.expr(e)
        if node.type is UNKNOWN:
            node = self.coerce(node, BOOL, e)
        if node.type is not BOOL:
            raise ShapeError(
                f"{self.fail_sql(e)} is of type {node.type.name}, but a shape predicate needs "
                "a boolean here"
            )
        return node

    def expr(self, e: exp.Expression) -> Node:
        method = getattr(self, "t_" + type(e).__name__, None)
        if method is None:
            raise unsupported(e)
        node: Node = method(e)
        return node

    # -- leaves

    def t_Paren(self, e: exp.Paren) -> Node:
        return self.expr(e.this)

    def t_Column(self, e: exp.Column) -> Node:
        name = e.name
        found = self.columns.get(name)
        if found is None:
            available = ", ".join(sorted(self.columns)) or "(none)"
            raise ShapeError(
                f"the shape predicate reads column {quote_identifier(name)}, which the table "
                f"does not have; available columns: {available}"
            )
        position, column = found
        t = sql_type(column.type_oid)
        if t is None:
            raise ShapeError(
                f"column {quote_identifier(name)} has type {type_name(column.type_oid)}, "
                "which shape predicates cannot evaluate exactly; supported: "
                + ", ".join(t.name for t in SCALARS)
                + " and arrays of most of them"
            )
        return ColumnValue(column, position, t)

    def t_Literal(self, e: exp.Literal) -> Node:
        text = e.this
        if e.is_string:
            return Const(text, UNKNOWN)
        return number_literal(text)

    def t_Null(self, e: exp.Null) -> Node:
        return Const(None, UNKNOWN)

    def t_Boolean(self, e: exp.Boolean) -> Node:
        return Const(bool(e.this), BOOL)

    def t_Collate(self, e: exp.Collate) -> Node:
        node = self.expr(e.this)
        if node.type is UNKNOWN:
            node = self.coerce(node, TEXT, e)
        if node.type.family != "text":
            raise ShapeError(
                f"COLLATE applies to text, not to {node.type.name}: {self.fail_sql(e)}"
            )
        if isinstance(node, Const):
            return Const(node.value, node.type, collate_c=True)
        return Apply(node.type, [node], lambda x: x, collate_c=True)

    # -- logic

    def _flatten(self, e: exp.Expression, kind: type[exp.Expression]) -> list[exp.Expression]:
        """The operands of a chain of ``kind`` (AND or OR), left to right, without
        recursion: a chain of thousands of terms is a left-deep tree that deep."""
        items: list[exp.Expression] = []
        stack = [e]
        while stack:
            node = stack.pop()
            while isinstance(node, exp.Paren):
                node = node.this
            if type(node) is kind:
                stack += (node.expression, node.this)  # the left operand is taken first
            else:
                items.append(node)
        return items

    def t_And(self, e: exp.And) -> Node:
        return self.logic([self.boolean(x) for x in self._flatten(e, exp.And)], True, e)

    def t_Or(self, e: exp.Or) -> Node:
        return self.logic([self.boolean(x) for x in self._flatten(e, exp.Or)], False, e)

    def logic(self, items: Sequence[Node], conjunction: bool, e: exp.Expression) -> Node:
        """AND / OR of ``items`` with Postgres's constant simplification, which walks
        them in order: a FALSE (AND) or TRUE (OR) constant decides without evaluating
        the others (an unevaluable constant after it never raises, one before it
        does), the other constant is dropped, several NULL constants count as one."""
        decisive = not conjunction
        kept: list[Node] = []
        has_null = False
        for item in items:
            if isinstance(item, ConstError):
                return item
            if not isinstance(item, Const):
                kept.append(item)
            elif item.value is None:
                has_null = True
            elif item.value is decisive:
                return Const(decisive, BOOL)
        if has_null:
            kept.append(Const(None, BOOL))
        if not kept:
            return Const(conjunction, BOOL)
        if len(kept) == 1:
            return kept[0]
        return self.fold(Logic(kept, conjunction), e)

    def t_Not(self, e: exp.Not) -> Node:
        return self.fold(Not(self.boolean(e.this)), e)

    def t_Is(self, e: exp.Is) -> Node:
        negate = bool(e.args.get("negate"))
        target = e.expression
        if isinstance(target, exp.Null):
            return self.fold(IsNull(self.expr(e.this), negate), e)
        if isinstance(target, exp.Boolean):
            return self.fold(IsBool(self.boolean(e.this), bool(target.this), negate), e)
        raise unsupported(e)

    # -- comparisons

    def _pair(
        self,
        left: Node,
        right: Node,
        e: exp.Expression,
        what: str,
    ) -> tuple[Node, Node, SqlType]:
        if left.type is UNKNOWN and right.type is UNKNOWN:
            left, right = self.coerce(left, TEXT, e), self.coerce(right, TEXT, e)
        elif left.type is UNKNOWN:
            left = self.coerce(left, right.type, e)
        elif right.type is UNKNOWN:
            right = self.coerce(right, left.type, e)
        try:
            cmp = common_type(left.type, right.type, what)
        except ShapeError as err:
            raise ShapeError(f"{err} ({self.fail_sql(e)})") from None
        return left, right, cmp

    def compare(self, op: str, left: Node, right: Node, e: exp.Expression) -> Node:
        left, right, cmp = self._pair(left, right, e, "compare")
        null_constant = any(isinstance(n, Const) and n.value is None for n in (left, right))
        if op not in ("=", "<>") and not null_constant:
            if cmp.family == "text" and not (left.collate_c or right.collate_c):
                raise ShapeError(
                    f"ordering comparison {self.fail_sql(e)} on text depends on the database "
                    'collation, which tidemark cannot reproduce; add COLLATE "C" to compare '
                    "in byte order (e.g. name < 'm' COLLATE \"C\"), or use =, IN or LIKE"
                )
            if cmp.family == "array":
                raise ShapeError(
                    f"ordering comparison of arrays is not supported: {self.fail_sql(e)}"
                )
        if isinstance(left, Const) and not isinstance(right, Const):
            # column-on-the-left form helps the raw-bytes fast path and routing
            left, right, op = right, left, REVERSED[op]
        right = self._const_as(right, cmp)
        return self.fold(Compare(op, left, right, cmp), e)

    def _const_as(self, node: Node, cmp: SqlType) -> Node:
        """A constant converted to the comparison type once, not on every row."""
        if not isinstance(node, Const) or node.value is None:
            return node
        conv = converter(node.type, cmp)
        if conv is None:
            return node
        return Const(self._convert_const(node.value, conv), cmp, node.collate_c)

    def _comparison(self, e: exp.Expression) -> Node:
        op = COMPARISONS[type(e)]
        rhs = e.expression
        if isinstance(rhs, exp.Any) or (
            isinstance(rhs, exp.Anonymous) and rhs.name.upper() in ANY_ALL_NAMES
        ):
            return self.any_all(op, e)
        return self.compare(op, self.expr(e.this), self.expr(rhs), e)

    t_EQ = t_NEQ = t_LT = t_LTE = t_GT = t_GTE = _comparison

    def _distinct(self, e: exp.Expression) -> Node:
        left, right, cmp = self._pair(self.expr(e.this), self.expr(e.expression), e, "compare")
        return self.fold(Distinct(left, right, cmp, negate=isinstance(e, exp.NullSafeEQ)), e)

    t_NullSafeEQ = t_NullSafeNEQ = _distinct

    def t_Between(self, e: exp.Between) -> Node:
        item = self.expr(e.this)
        low, high = self.expr(e.args["low"]), self.expr(e.args["high"])

        # Postgres's parser rewrites BETWEEN into these ANDs and ORs before simplifying
        def between(lo: Node, hi: Node) -> Node:
            tests = [self.compare(">=", item, lo, e), self.compare("<=", item, hi, e)]
            return self.logic(tests, True, e)

        node = between(low, high)
        if e.args.get("symmetric"):
            node = self.logic([node, between(high, low)], False, e)
        return node

    def t_In(self, e: exp.In) -> Node:
        items = e.expressions
        if not items:
            raise ShapeError(f"IN needs at least one value: {self.fail_sql(e)}")
        lhs = self.expr(e.this)
        nodes = [self.expr(i) for i in items]
        if len(nodes) == 1 and lhs.type.family != "array":
            return self.compare("=", lhs, nodes[0], e)  # Postgres's parser: `x IN (y)` is `x = y`
        constants = [n for n in nodes if isinstance(n, Const)]
        if len(constants) == len(nodes):
            return self._in_constants(lhs, nodes, e, empty=False)
        # Postgres's parser turns two or more items without columns into one
        # `= ANY(array)`, tested first; items reading columns follow, in order
        if len(constants) > 1:
            tests = [self._in_constants(lhs, constants, e, empty=False)]
            tests += [self.compare("=", lhs, n, e) for n in nodes if not isinstance(n, Const)]
        else:
            tests = [self.compare("=", lhs, n, e) for n in nodes]
        return self.logic(tests, False, e)

    def _in_constants(
        self, lhs: Node, consts: Sequence[Node], e: exp.Expression, empty: bool
    ) -> Node:
        known = [c.type for c in consts if c.type is not UNKNOWN]
        if lhs.type is UNKNOWN:
            lhs = self.coerce(lhs, known[0] if known else TEXT, e)
        cmp = lhs.type
        for t in known:
            cmp = self._pair(Const(None, cmp), Const(None, t), e, "compare")[2]
        if cmp.family == "array":
            raise ShapeError(f"IN on arrays is not supported; use = or @>: {self.fail_sql(e)}")
        keys: set[Any] = set()
        has_null = False
        for c in consts:
            c = self.coerce(c, cmp, e)
            assert isinstance(c, Const)
            if c.value is None:
                has_null = True
                continue
            conv = converter(c.type, cmp)
            keys.add(self._convert_const(c.value, conv))
        return self.fold(InSet(lhs, frozenset(keys), has_null, empty, cmp), e)

    @staticmethod
    def _convert_const(value: Any, conv: Callable[[str], str] | None) -> Any:
        if conv is None:
            return value
        scope: dict[str, Any] = dict(RUNTIME)
        scope["_x"] = value
        return eval(conv("_x"), scope)  # a fixed template over a bound name

    def any_all(self, op: str, e: exp.Expression) -> Node:
        rhs = e.expression
        every = isinstance(rhs, exp.Anonymous) and rhs.name.upper() == "ALL"
        inner = rhs.this if isinstance(rhs, exp.Any) else rhs.expressions[0]
        while isinstance(inner, exp.Paren):
            inner = inner.this
        item = self.expr(e.this)
        arr = self.expr(inner)
        if arr.type is UNKNOWN:
            if item.type is UNKNOWN:
                item = self.coerce(item, TEXT, e)
            arr = self.coerce(arr, array_of(item.type, self.fail_sql(e)), e)
        if arr.type.family != "array" or arr.type.element is None:
            raise ShapeError(f"ANY/ALL needs an array on the right: {self.fail_sql(e)}")
        element = arr.type.element
        item, _, cmp = self._pair(item, Const(None, element), e, "compare")
        if cmp.family == "text" and op not in ("=", "<>") and not item.collate_c:
            raise ShapeError(
                f"ordering comparison {self.fail_sql(e)} on text depends on the database "
                'collation; add COLLATE "C" to compare in byte order'
            )
        if isinstance(arr, Const) and arr.value is None:
            return Const(None, BOOL)
        if isinstance(arr, Const) and op in ("=", "<>") and (op == "=") != every:
            elements = flat(arr.value)
            consts = [Const(v, element) for v in elements]
            node = self._in_constants(item, consts, e, empty=not elements)
            return node if op == "=" else self.fold(Not(node), e)
        lconv, rconv = converter(item.type, cmp), converter(element, cmp)
        return self.fold(AnyAll(item, arr, element_test(op, cmp, lconv, rconv), every), e)

    def _unify(self, nodes: list[Node], e: exp.Expression, what: str) -> tuple[list[Node], SqlType]:
        known = [n.type for n in nodes if n.type is not UNKNOWN]
        t = known[0] if known else TEXT
        for k in known[1:]:
            t = common_type(t, k, what)
        out: list[Node] = []
        for n in nodes:
            n = self.coerce(n, t, e)
            conv = converter(n.type, t)
            if conv is not None:
                n = self.fold(Apply(t, [n], conv), e)
            out.append(n)
        return out, t


def number_literal(text: str) -> Const:
    # beyond 19 digits no int8 fits (and Python refuses int() of 4,300+ digits)
    if re.fullmatch(r"-?\d+", text) and len(text.lstrip("-").lstrip("0")) <= 19:
        value = int(text)
        for t in (INT4, INT8):
            low, high = INT_RANGE[t.bits]
            if low <= value <= high:
                return Const(value, t)
    number = Decimal(text)
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    if (number and number.adjusted() >= NUMERIC_MAX_WEIGHT) or -exponent > NUMERIC_MAX_SCALE:
        short = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise ShapeError(
            f"the number {short} overflows Postgres's numeric format (at most "
            f"{NUMERIC_MAX_WEIGHT} digits before the decimal point, {NUMERIC_MAX_SCALE} "
            "after it)"
        )
    return Const(number, NUMERIC)


NUMERIC_MAX_WEIGHT = 131072  # digits before the point Postgres's numeric holds
NUMERIC_MAX_SCALE = 16383  # digits after it
