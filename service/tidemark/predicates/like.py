"""LIKE and ILIKE with a constant pattern, compiled once into a string test.

``like_matcher(pattern, escape, ci, ascii_only, sql)`` follows Postgres: ``%`` matches
any run of characters, ``_`` exactly one character (a code point), the escape
character (backslash unless ``ESCAPE`` says otherwise, none for ``ESCAPE ''``) makes
the next character literal, and a pattern ending in the escape character is refused
(``ShapeError``; Postgres raises for every non-NULL value). ILIKE compares both sides
lowered, as Postgres does for UTF-8 text: with ``lower`` (Unicode simple case
mapping), or ``lower_c`` (ASCII letters only) under ``COLLATE "C"``. The common
shapes (exact, prefix, suffix, substring) become plain string operations; the rest
one anchored regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tidemark.errors import ShapeError
from tidemark.predicates.operators import lower, lower_c


def like_matcher(
    pattern: str, escape: str | None, ci: bool, ascii_only: bool, sql: str
) -> Callable[[str], bool]:
    """Compile a LIKE pattern once into a test of a string.

    ILIKE (``ci``) is LIKE between both sides lowered, as Postgres computes it for
    UTF-8 text (``lower_c`` under ``COLLATE "C"``, ``ascii_only``). Python's
    IGNORECASE would differ: it also equates the long s (U+017F) with 's'.
    """
    tokens: list[str | None] = []  # str: literal text, None: '%', '' : '_'
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            i += 1
            if i == len(pattern):
                raise ShapeError(f"LIKE pattern must not end with escape character: {sql}")
            literal.append(pattern[i])
        elif c in "%_":
            if literal:
                tokens.append("".join(literal))
                literal = []
            tokens.append(None if c == "%" else "")
        else:
            literal.append(c)
        i += 1
    if literal:
        tokens.append("".join(literal))
    if ci:
        fold = lower_c if ascii_only else lower
        test = _token_matcher([fold(t) if t else t for t in tokens])
        return lambda s: test(fold(s))
    return _token_matcher(tokens)


def _token_matcher(tokens: list[str | None]) -> Callable[[str], bool]:
    texts = [t for t in tokens if t]
    shape = tuple("lit" if t else ("any" if t is None else "one") for t in tokens)
    if shape == ("lit",) or not tokens:
        exact = texts[0] if texts else ""
        return lambda s: s == exact
    if shape == ("lit", "any"):
        prefix = texts[0]
        return lambda s: s.startswith(prefix)
    if shape == ("any", "lit"):
        suffix = texts[0]
        return lambda s: s.endswith(suffix)
    if shape == ("any", "lit", "any"):
        middle = texts[0]
        return lambda s: middle in s
    regex = "".join(".*" if t is None else "." if t == "" else re.escape(t) for t in tokens)
    fullmatch = re.compile(regex, re.DOTALL).fullmatch
    return lambda s: fullmatch(s) is not None
