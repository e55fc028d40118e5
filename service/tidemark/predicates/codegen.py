"""Typed predicate nodes and the Python source they generate.

A ``Node`` is an expression whose SQL type is known. It emits Python *source* for:

* ``emit``: the SQL value (``None`` for NULL, else the Python value of the type);
* ``truth`` / ``falsity``: a Python bool that is True exactly when the (boolean)
  value is TRUE / FALSE; NULL is neither, so ``NOT`` is ``falsity`` and never
  turns NULL into a match.

``CodeGen`` collects what the source needs: constants (bound as ``_k<n>`` in the
namespace, never written into the source), temporaries (``_t<n>``), and the columns
read (``v<position>`` = the raw value, ``c<position>`` = parsed once per row, only
for the columns the predicate reads). The generated source is made only of fixed
templates, integers and these names, so nothing a user writes becomes code.

Strict functions (``Apply``, ``Call``, ``StrictTest``) evaluate every argument, then
return NULL if one is NULL, as Postgres does for strict functions. ``Logic`` (AND/OR)
follows Kleene logic and short-circuits left to right. Comparisons live in
``tidemark.predicates.comparison``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from tidemark.pgoutput import values
from tidemark.pgoutput.messages import RelationColumn
from tidemark.predicates import temporal
from tidemark.predicates.operators import RUNTIME, f4
from tidemark.predicates.sqltypes import (
    BOOL,
    BPCHAR,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    TEXT,
    VARCHAR,
    SqlType,
)


class CodeGen:
    """Collects constants, temporaries and column accesses while emitting code."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = dict(RUNTIME)
        self.raw_used: set[int] = set()
        self.parsers: dict[str, tuple[int, Callable[[bytes], Any]]] = {}
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name

    def temp(self) -> str:
        self._n += 1
        return f"_t{self._n}"

    def raw(self, position: int) -> str:
        self.raw_used.add(position)
        return f"v{position}"

    def parsed(self, position: int, parser: Callable[[bytes], Any], variant: str = "c") -> str:
        """Name of the column's value parsed by ``parser`` (one local per variant)."""
        self.raw_used.add(position)
        name = f"{variant}{position}"
        self.parsers[name] = (position, parser)
        return name

    def prologue(self) -> list[str]:
        lines = [f"v{p} = row[{p}]" for p in sorted(self.raw_used)]
        for name, (p, parser) in sorted(self.parsers.items()):
            self.ns[f"_p{name}"] = parser
            lines.append(f"{name} = None if v{p} is None else _p{name}(v{p})")
        return lines

    def _bind(self, node: Node) -> tuple[str, str | None, str | None]:
        """(name usable in a body, "is NULL" test, "is not NULL" test) for a strict argument."""
        code = node.emit(self)
        if code.isidentifier():  # a name, a constant, None, True or False
            if not node.nullable:
                return code, None, None
            return code, f"{code} is None", f"{code} is not None"
        # Computed: bound in the argument order even when it cannot be NULL, so that an
        # error in it is raised before a later argument's NULL decides, as in Postgres.
        t = self.temp()
        return t, f"({t} := {code}) is None", f"({t} := {code}) is not None"

    def strict(self, args: Sequence[Node], body: Callable[..., str]) -> str:
        """Value-mode code: NULL if any argument is NULL, else ``body``.

        Every argument is evaluated before the NULL test (``|`` does not short-circuit),
        as Postgres evaluates all arguments of a strict function.
        """
        names, tests, _ = self._bind_all(args)
        if not tests:
            return body(*names)
        return f"(None if {' | '.join(f'({t})' for t in tests)} else {body(*names)})"

    def strict_bool(self, args: Sequence[Node], body: Callable[..., str], negate: bool) -> str:
        """Python-bool code: True when no argument is NULL and ``body`` (or its negation)."""
        names, tests, not_null = self._bind_all(args)
        code = body(*names)
        if negate:
            code = f"(not {code})"
        if not tests:
            return code
        if len(tests) == 1:
            return f"({not_null[0]} and {code})"
        return f"(not ({' | '.join(f'({t})' for t in tests)}) and {code})"

    def _bind_all(self, args: Sequence[Node]) -> tuple[list[str], list[str], list[str]]:
        names: list[str] = []
        tests: list[str] = []
        not_null: list[str] = []
        for arg in args:
            name, test, positive = self._bind(arg)
            names.append(name)
            if test is not None and positive is not None:
                tests.append(test)
                not_null.append(positive)
        return names, tests, not_null


class Node:
    """A typed expression. ``emit`` gives Python code for its SQL value (None = NULL)."""

    type: SqlType
    nullable: bool = True
    collate_c: bool = False

    def emit(self, g: CodeGen) -> str:
        raise NotImplementedError

    def truth(self, g: CodeGen) -> str:
        """Python code that is True exactly when the (boolean) value is TRUE."""
        code = self.emit(g)
        return code if not self.nullable else f"({code} is True)"

    def falsity(self, g: CodeGen) -> str:
        """Python code that is True exactly when the (boolean) value is FALSE."""
        code = self.emit(g)
        return f"(not {code})" if not self.nullable else f"({code} is False)"

    def children(self) -> Sequence[Node]:
        return ()

    def columns(self) -> Iterator[ColumnValue]:
        for child in self.children():
            yield from child.columns()


class Const(Node):
    def __init__(self, value: Any, type_: SqlType, collate_c: bool = False) -> None:
        self.value = value
        self.type = type_
        self.nullable = value is None
        self.collate_c = collate_c

    def emit(self, g: CodeGen) -> str:
        if self.value is None or self.value is True or self.value is False:
            return repr(self.value)
        return g.const(self.value)


class ConstError(Node):
    """A sub-expression without columns whose evaluation raised.

    Postgres raises such an error when its planner simplifies the expression, unless
    an AND, OR or COALESCE is decided by a constant before reaching it. The typer
    carries it as a node until one of those drops it, or it reaches the root, where
    the predicate is refused. It never becomes code.
    """

    nullable = False

    def __init__(self, type_: SqlType, message: str) -> None:
        self.type = type_
        self.message = message

    def emit(self, g: CodeGen) -> str:
        raise AssertionError(f"an unevaluable constant reached code generation: {self.message}")


def first_error(node: Node) -> ConstError | None:
    """The first ``ConstError`` in ``node``, in evaluation order."""
    if isinstance(node, ConstError):
        return node
    for child in node.children():
        found = first_error(child)
        if found is not None:
            return found
    return None


# Postgres's text output of these types is exactly what Python's constructors read,
# so the builtins replace values.python_parser on the hot path (same results).
_FAST_PARSERS: Final[dict[SqlType, Callable[[bytes], Any]]] = {
    INT2: int,
    INT4: int,
    INT8: int,
    FLOAT8: float,
    TEXT: bytes.decode,
    VARCHAR: bytes.decode,
}


def _temporal_parser(type_: SqlType) -> Callable[[bytes], Any] | None:
    """Date/time parsers that keep 'infinity' and '24:00:00' apart from real values
    (``values.python_parser`` maps them to date.max, time.max ...)."""
    element = type_.element if type_.family == "array" else None
    scalar = element or type_
    if scalar.family not in ("date", "time", "timestamp", "timestamptz"):
        return None
    parse = temporal.column_parser(scalar.family, values.python_parser(scalar.oid))
    if element is None:
        return parse
    return lambda text: values.parse_array(text, parse)


class ColumnValue(Node):
    """A column's value. char(n) values lose their trailing spaces (Postgres ignores
    them in comparisons and casts to text) unless ``padded`` (LIKE sees them)."""

    def __init__(
        self, column: RelationColumn, position: int, type_: SqlType, padded: bool = False
    ) -> None:
        self.column = column
        self.position = position
        self.type = type_
        self.padded = padded
        base = (
            _FAST_PARSERS.get(type_)
            or _temporal_parser(type_)
            or values.python_parser(column.type_oid, column.type_modifier)
        )
        self.parser: Callable[[bytes], Any]
        if type_ is BPCHAR and not padded:
            self.parser = lambda b: base(b).rstrip(" ")
        elif type_ is FLOAT4:
            self.parser = lambda b: f4(base(b))
        else:
            self.parser = base

    def emit(self, g: CodeGen) -> str:
        return g.parsed(self.position, self.parser, "p" if self.padded else "c")

    def columns(self) -> Iterator[ColumnValue]:
        yield self


class Apply(Node):
    """A strict function of its arguments, given as a code template over their names."""

    def __init__(
        self,
        type_: SqlType,
        args: Sequence[Node],
        template: Callable[..., str],
        nullable: bool | None = None,
        collate_c: bool = False,
    ) -> None:
        self.type = type_
        self.args = tuple(args)
        self.template = template
        self.nullable = any(a.nullable for a in args) if nullable is None else nullable
        self.collate_c = collate_c

    def emit(self, g: CodeGen) -> str:
        return g.strict(self.args, self.template)

    def children(self) -> Sequence[Node]:
        return self.args


class Call(Node):
    """A strict call of a Python function placed in the namespace."""

    def __init__(
        self, type_: SqlType, args: Sequence[Node], fn: Callable[..., Any], collate_c: bool = False
    ) -> None:
        self.type = type_
        self.args = tuple(args)
        self.fn = fn
        self.nullable = any(a.nullable for a in self.args)
        self.collate_c = collate_c

    def emit(self, g: CodeGen) -> str:
        name = g.const(self.fn)
        return g.strict(self.args, lambda *xs: f"{name}({', '.join(xs)})")

    def children(self) -> Sequence[Node]:
        return self.args


class StrictTest(Node):
    """A strict boolean test: NULL if an argument is NULL, else a Python bool.

    The test is ``body`` (a code template over the argument names) or, with ``fn``,
    a call of that Python function (placed in the namespace), negated if asked.
    """

    type = BOOL

    def __init__(
        self,
        args: Sequence[Node],
        body: Callable[..., str] | None = None,
        fn: Callable[..., bool] | None = None,
        negate: bool = False,
    ) -> None:
        self.args = tuple(args)
        self.body = body
        self.fn = fn
        self.negate = negate
        self.nullable = any(a.nullable for a in self.args)

    def _template(self, g: CodeGen) -> Callable[..., str]:
        if self.fn is None:
            assert self.body is not None
            return self.body
        name = g.const(self.fn)
        prefix = "not " if self.negate else ""
        return lambda *xs: f"({prefix}{name}({', '.join(xs)}))"

    def emit(self, g: CodeGen) -> str:
        return g.strict(self.args, self._template(g))

    def truth(self, g: CodeGen) -> str:
        return g.strict_bool(self.args, self._template(g), negate=False)

    def falsity(self, g: CodeGen) -> str:
        return g.strict_bool(self.args, self._template(g), negate=True)

    def children(self) -> Sequence[Node]:
        return self.args


class Coalesce(Node):
    def __init__(self, items: Sequence[Node], type_: SqlType) -> None:
        self.items, self.type = tuple(items), type_
        self.nullable = all(i.nullable for i in self.items)
        self.collate_c = any(i.collate_c for i in self.items)

    def children(self) -> Sequence[Node]:
        return self.items

    def emit(self, g: CodeGen) -> str:
        code = self.items[-1].emit(g)
        for item in reversed(self.items[:-1]):
            t = g.temp()
            code = f"({t} if ({t} := {item.emit(g)}) is not None else {code})"
        return code


class ArrayBuild(Node):
    nullable = False

    def __init__(self, items: Sequence[Node], type_: SqlType) -> None:
        self.items, self.type = tuple(items), type_

    def children(self) -> Sequence[Node]:
        return self.items

    def emit(self, g: CodeGen) -> str:
        return "[" + ", ".join(i.emit(g) for i in self.items) + "]"


class AnyAll(Node):
    """``x op ANY/ALL (array)`` for a non-constant array or operator."""

    type = BOOL

    def __init__(
        self, item: Node, arr: Node, test: Callable[[Any, Any], bool], every: bool
    ) -> None:
        self.item, self.arr, self.test, self.every = item, arr, test, every

    def children(self) -> Sequence[Node]:
        return (self.item, self.arr)

    def emit(self, g: CodeGen) -> str:
        fn = g.const(self.test)
        x, a = g.temp(), g.temp()
        # both sides are evaluated first, as Postgres does; a NULL array gives NULL,
        # otherwise array_any applies the SQL rules (the item may be NULL)
        return (
            f"(None if (({x} := {self.item.emit(g)}), ({a} := {self.arr.emit(g)}))[1] is None "
            f"else array_any({fn}, {x}, {a}, {self.every!r}))"
        )
