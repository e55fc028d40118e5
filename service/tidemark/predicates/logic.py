"""The boolean structure of a predicate: NOT, AND / OR, IS [NOT] NULL / TRUE / FALSE.

SQL's three-valued (Kleene) logic: NULL is unknown, ``NOT NULL`` is NULL, ``FALSE
AND NULL`` is FALSE, ``TRUE OR NULL`` is TRUE. ``Logic`` evaluates its items left to
right and stops at the first that decides (FALSE for AND, TRUE for OR), as Postgres's
executor does, so ``b <> 0 AND a / b > 1`` never divides by zero. ``truth`` and
``falsity`` give the plain Python tests the hot path uses: ``NOT x`` is TRUE exactly
when ``x`` is FALSE, never when it is NULL. ``IS [NOT] NULL`` and ``IS [NOT]
TRUE/FALSE`` are never NULL.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.predicates.codegen import CodeGen, Node
from tidemark.predicates.sqltypes import BOOL


class Not(Node):
    type = BOOL

    def __init__(self, item: Node) -> None:
        self.item = item
        self.nullable = item.nullable

    def children(self) -> Sequence[Node]:
        return (self.item,)

    def emit(self, g: CodeGen) -> str:
        if not self.item.nullable:
            return f"(not {self.item.emit(g)})"
        t = g.temp()
        return f"(None if ({t} := {self.item.emit(g)}) is None else not {t})"

    def truth(self, g: CodeGen) -> str:
        return self.item.falsity(g)

    def falsity(self, g: CodeGen) -> str:
        return self.item.truth(g)


class Logic(Node):
    """n-ary AND (``conjunction``) or OR with Kleene logic, short-circuit left to right."""

    type = BOOL

    def __init__(self, items: Sequence[Node], conjunction: bool) -> None:
        self.items = tuple(items)
        self.conjunction = conjunction
        self.nullable = any(i.nullable for i in self.items)

    def children(self) -> Sequence[Node]:
        return self.items

    def emit(self, g: CodeGen) -> str:
        # Flat, however many items: ``or`` stops at the first deciding item, so items
        # after it are never evaluated; if none decides, every temporary is bound.
        decisive = "False" if self.conjunction else "True"
        other = "True" if self.conjunction else "False"
        names: list[str] = []
        tests: list[str] = []
        for item in self.items:
            t = g.temp()
            names.append(t)
            tests.append(f"({t} := {item.emit(g)}) is {decisive}")
        nulls = [n for n, i in zip(names, self.items, strict=True) if i.nullable]
        tail = (
            other
            if not nulls
            else (f"(None if {' or '.join(f'{n} is None' for n in nulls)} else {other})")
        )
        return f"({decisive} if ({' or '.join(tests)}) else {tail})"

    def truth(self, g: CodeGen) -> str:
        joiner = " and " if self.conjunction else " or "
        return "(" + joiner.join(i.truth(g) for i in self.items) + ")"

    def falsity(self, g: CodeGen) -> str:
        joiner = " or " if self.conjunction else " and "
        return "(" + joiner.join(i.falsity(g) for i in self.items) + ")"


class IsNull(Node):
    type = BOOL
    nullable = False

    def __init__(self, item: Node, negate: bool) -> None:
        self.item, self.negate = item, negate

    def children(self) -> Sequence[Node]:
        return (self.item,)

    def emit(self, g: CodeGen) -> str:
        return f"({self.item.emit(g)} is {'not ' if self.negate else ''}None)"


class IsBool(Node):
    """``x IS [NOT] TRUE/FALSE``: never NULL."""

    type = BOOL
    nullable = False

    def __init__(self, item: Node, value: bool, negate: bool) -> None:
        self.item, self.value, self.negate = item, value, negate

    def children(self) -> Sequence[Node]:
        return (self.item,)

    def emit(self, g: CodeGen) -> str:
        return f"({self.item.emit(g)} is {'not ' if self.negate else ''}{self.value!r})"
