"""Postgres array text syntax: ``'{1,NULL,"a \\"b\\""}'``, ``'{{1,2},{3,4}}'``,
``'[0:1]={1,2}'``, split into nested lists of raw element bytes."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tidemark.errors import ProtocolError


def parse_array(text: bytes, parse_element: Callable[[bytes], Any] = bytes) -> list[Any]:
    """Parse Postgres array text ('{1,NULL,"a \\"b\\""}', '{{1,2},{3,4}}',
    '[0:1]={1,2}') into nested lists; each non-null element goes through
    ``parse_element``. Lower bounds are dropped: Python lists start at 0."""
    raw = split_array(text)
    return _map_elements(raw, parse_element)


def _map_elements(items: list[Any], parse_element: Callable[[bytes], Any]) -> list[Any]:
    return [
        None
        if item is None
        else _map_elements(item, parse_element)
        if isinstance(item, list)
        else parse_element(item)
        for item in items
    ]


def split_array(text: bytes) -> list[Any]:
    """Array text -> nested lists of raw element bytes (unquoted, unescaped) or None."""
    body = text
    if body[:1] == b"[":  # dimension decoration '[lb:ub]...=' before the braces
        equals = body.find(b"=")
        if equals < 0:
            raise _bad_array(text, "dimension decoration without '='")
        body = body[equals + 1 :]
    if len(body) < 2 or body[0] != 0x7B or body[-1] != 0x7D:  # '{' ... '}'
        raise _bad_array(text, "not enclosed in braces")
    inner = body[1:-1]
    # The common case: one dimension, nothing quoted ('"'), escaped ('\\'), nested ('{')
    # or padded (' '; Postgres quotes elements with spaces). Byte membership tests are
    # memchr calls, several times faster here than bytes-in-bytes tests.
    if 0x22 not in inner and 0x5C not in inner and 0x7B not in inner and 0x20 not in inner:
        if not inner:
            return []
        items: list[Any] = inner.split(b",")
        if 0x4E in inner or 0x6E in inner:  # an 'N' or 'n': maybe a NULL element
            return [None if _is_null(item) else item for item in items]
        return items
    try:
        items, end = _split_level(body, 0)
    except (IndexError, ValueError):  # ran off the end; bytes.index found no closing quote
        raise _bad_array(text, "unbalanced braces or quotes") from None
    if body[end:].strip():
        raise _bad_array(text, "trailing characters after the closing brace")
    return items


def _is_null(item: bytes) -> bool:
    return len(item) == 4 and item.upper() == b"NULL"


def _split_level(body: bytes, pos: int) -> tuple[list[Any], int]:
    """Parse one '{...}' level starting at ``body[pos] == '{'``; return items and end."""
    items: list[Any] = []
    pos += 1
    while body[pos] in b" \t\n":
        pos += 1
    if body[pos] == 0x7D:  # '}': empty
        return items, pos + 1
    while True:
        while body[pos] in b" \t\n":
            pos += 1
        char = body[pos]
        if char == 0x7B:  # '{'
            sub, pos = _split_level(body, pos)
            items.append(sub)
        elif char == 0x22:  # '"'
            value, pos = _quoted(body, pos + 1)
            items.append(value)
        else:
            start = pos
            while body[pos] not in b",}":
                pos += 1
            raw = body[start:pos].strip()
            if b"\\" in raw:
                raw = re.sub(rb"\\(.)", rb"\1", raw, flags=re.DOTALL)
                items.append(raw)
            else:
                items.append(None if _is_null(raw) else raw)
        while body[pos] in b" \t\n":
            pos += 1
        if body[pos] == 0x2C:  # ','
            pos += 1
        elif body[pos] == 0x7D:  # '}'
            return items, pos + 1
        else:
            raise _bad_array(body, f"unexpected {bytes([body[pos]])!r} at byte {pos}")


def _quoted(body: bytes, pos: int) -> tuple[bytes, int]:
    """Read a quoted element whose content starts at ``pos``; return it unescaped."""
    parts = []
    while True:
        quote = body.index(b'"', pos)
        backslash = body.find(b"\\", pos, quote)
        if backslash < 0:
            parts.append(body[pos:quote])
            return b"".join(parts), quote + 1
        parts.append(body[pos:backslash])
        parts.append(body[backslash + 1 : backslash + 2])
        pos = backslash + 2


def _bad_array(text: bytes, why: str) -> ProtocolError:
    return ProtocolError(
        f"cannot read {bytes(text[:80])!r} as a Postgres array: {why}; "
        "expected array_out text such as '{1,NULL,\"a b\"}'"
    )
