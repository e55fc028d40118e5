"""SQL identifiers as Postgres reads and writes them.

* ``fold_identifier``: unquoted names fold ASCII capitals to lower case (only ASCII, as
  Postgres does), quoted names keep their spelling;
* ``quote_identifier``: always quoted, embedded double quotes doubled; safe to splice
  into SQL;
* ``parse_identifiers``: ``schema.table`` / ``"My Schema"."T"`` into the exact catalog
  names, refusing what Postgres would refuse (invalid unquoted names, empty quoted
  names, names longer than 63 bytes, which Postgres would silently truncate);
* ``format_identifier``: the canonical spelling, bare when folding keeps the name,
  quoted otherwise, so ``parse_identifiers(format_identifier(n)) == (n,)``.
"""

from __future__ import annotations

import re
import string
from typing import Final

_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_UNQUOTED: Final = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*\Z")
_CANONICAL_PLAIN: Final = re.compile(r"[a-z_][a-z0-9_$]*\Z")
_MAX_IDENTIFIER_BYTES: Final = 63  # NAMEDATALEN - 1; Postgres truncates longer names


def fold_identifier(name: str, quoted: bool) -> str:
    """Postgres's identifier folding: unquoted names lose ASCII capitals only."""
    return name if quoted else name.translate(_ASCII_LOWER)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (always quoted, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def parse_identifiers(text: str) -> tuple[str, ...]:
    """``schema.table`` / ``"My Schema"."T"`` -> the exact catalog names (ValueError)."""
    parts: list[str] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith('"', pos):
            end = pos + 1
            chars: list[str] = []
            while True:
                close = text.find('"', end)
                if close < 0:
                    raise ValueError(f"unterminated quoted identifier in {text!r}")
                chars.append(text[end:close])
                if text.startswith('"', close + 1):  # "" is an embedded quote
                    chars.append('"')
                    end = close + 2
                    continue
                pos = close + 1
                break
            name = "".join(chars)
            if not name:
                raise ValueError(f'empty quoted identifier "" in {text!r}')
        else:
            end = pos
            while end < len(text) and text[end] not in '."' and not text[end].isspace():
                end += 1
            raw = text[pos:end]
            if not _UNQUOTED.match(raw):
                raise ValueError(
                    f"{raw!r} in {text!r} is not a valid identifier; quote it with double "
                    'quotes if it is a real name (e.g. "Order Items")'
                )
            name = fold_identifier(raw, quoted=False)
            pos = end
        if len(name.encode()) > _MAX_IDENTIFIER_BYTES:
            raise ValueError(f"identifier {name!r} is longer than Postgres's 63 bytes")
        parts.append(name)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return tuple(parts)
        if text[pos] != ".":
            raise ValueError(f"unexpected {text[pos]!r} in {text!r}")
        pos += 1


def format_identifier(name: str) -> str:
    """Canonical spelling: bare when folding keeps it, quoted otherwise."""
    return name if _CANONICAL_PLAIN.match(name) else quote_identifier(name)
