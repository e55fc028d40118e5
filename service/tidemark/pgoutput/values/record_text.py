"""Postgres text syntax of composite values, ranges and multiranges.

* A composite (``record_out``): ``(1,"a b",,x)``: fields separated by commas,
  nothing for NULL, two double quotes for the empty string; a field is double-quoted
  when it is empty or holds quotes, backslashes, parentheses, commas or spaces, with
  double quotes and backslashes doubled inside.
* A range (``range_out``): ``empty``, or ``[`` / ``(``, the lower bound (nothing when
  unbounded), ``,``, the upper bound, ``]`` / ``)``; bounds are quoted like composite
  fields (also when they hold brackets).
* A multirange: ``{}`` or ``{r1,r2,...}`` of non-empty ranges.

``record_in`` and ``range_in`` also accept a backslash escaping any character outside
or inside quotes; so do these parsers. Values come back as raw bytes (unquoted,
unescaped) for the field's or bound's own converter.
"""

from __future__ import annotations

from typing import Final

from tidemark.errors import ProtocolError
from tidemark.pgoutput.values.text_format import SESSION_HINT

#: (lower, upper, lower_inc, upper_inc, lower_inf, upper_inf, empty); unbounded and
#: empty ranges have None bounds.
RangeParts = tuple[bytes | None, bytes | None, bool, bool, bool, bool, bool]

EMPTY_RANGE: Final[RangeParts] = (None, None, False, False, False, False, True)
_SPACE: Final = b" \t\n\r\v\f"


def _bad(text: bytes, what: str, why: str) -> ProtocolError:
    return ProtocolError(f"cannot read {bytes(text[:80])!r} as {what}: {why}; {SESSION_HINT}")


def split_record(text: bytes) -> list[bytes | None]:
    """The raw fields of composite text; None for NULL fields."""
    if len(text) < 2 or text[0] != 0x28 or text[-1] != 0x29:  # '(' ... ')'
        raise _bad(text, "a composite value", "not enclosed in parentheses")
    inner = text[1:-1]
    if 0x22 not in inner and 0x5C not in inner:  # nothing quoted or escaped: split
        return [field or None for field in inner.split(b",")]
    fields: list[bytes | None] = []
    pos = 1
    end = len(text) - 1
    while True:
        field, pos = _token(text, pos, b",)", "a composite value")
        fields.append(field)
        if pos >= end:
            if pos > end:
                raise _bad(text, "a composite value", "unbalanced quotes")
            return fields
        pos += 1  # the comma


def _token(text: bytes, pos: int, stops: bytes, what: str) -> tuple[bytes | None, int]:
    """One field or bound starting at ``pos``; returns it (None when nothing is there)
    and the position of the character that ended it."""
    out = bytearray()
    quoted = False  # the token had quotes: '""' is the empty string, not NULL
    in_quotes = False
    n = len(text)
    while pos < n:
        char = text[pos]
        if char == 0x5C:  # backslash: the next character as is
            if pos + 1 >= n:
                raise _bad(text, what, "a backslash at the end")
            out.append(text[pos + 1])
            pos += 2
        elif char == 0x22:  # '"'
            if in_quotes and pos + 1 < n and text[pos + 1] == 0x22:
                out.append(0x22)
                pos += 2
            else:
                in_quotes = not in_quotes
                quoted = True
                pos += 1
        elif not in_quotes and char in stops:
            break
        else:
            out.append(char)
            pos += 1
    if in_quotes:
        raise _bad(text, what, "unbalanced quotes")
    if not out and not quoted:
        return None, pos
    return bytes(out), pos


def split_range(text: bytes) -> RangeParts:
    """The bounds and flags of range text."""
    parts, end = _range_at(text, 0)
    if text[end:].strip(_SPACE):
        raise _bad(text, "a range", "characters after the closing bracket")
    return parts


def _range_at(text: bytes, pos: int) -> tuple[RangeParts, int]:
    n = len(text)
    while pos < n and text[pos] in _SPACE:
        pos += 1
    if text[pos : pos + 5].lower() == b"empty":
        return EMPTY_RANGE, pos + 5
    if pos >= n or text[pos] not in b"[(":
        raise _bad(text, "a range", "expected 'empty', '[' or '('")
    lower_bracket = text[pos]
    lower, pos = _token(text, pos + 1, b",", "a range")
    if pos >= n:
        raise _bad(text, "a range", "no comma between the bounds")
    upper, pos = _token(text, pos + 1, b")]", "a range")
    if pos >= n:
        raise _bad(text, "a range", "no closing bracket")
    upper_bracket = text[pos]
    lower_inf, upper_inf = lower is None, upper is None
    return (
        lower,
        upper,
        lower_bracket == 0x5B and not lower_inf,  # '['
        upper_bracket == 0x5D and not upper_inf,  # ']'
        lower_inf,
        upper_inf,
        False,
    ), pos + 1


def split_multirange(text: bytes) -> list[RangeParts]:
    """The ranges of multirange text, in order."""
    body = text.strip(_SPACE)
    if len(body) < 2 or body[0] != 0x7B or body[-1] != 0x7D:  # '{' ... '}'
        raise _bad(text, "a multirange", "not enclosed in braces")
    ranges: list[RangeParts] = []
    pos, end = 1, len(body) - 1
    while True:
        while pos < end and body[pos] in _SPACE:
            pos += 1
        if pos >= end:
            if ranges:
                raise _bad(text, "a multirange", "a comma before the closing brace")
            return ranges
        parts, pos = _range_at(body, pos)
        ranges.append(parts)
        while pos < end and body[pos] in _SPACE:
            pos += 1
        if pos >= end:
            return ranges
        if body[pos] != 0x2C:  # ','
            raise _bad(text, "a multirange", f"unexpected {bytes([body[pos]])!r} at byte {pos}")
        pos += 1
