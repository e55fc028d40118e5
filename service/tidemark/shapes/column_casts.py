"""Lake types a shape declares for its columns: ``amount::numeric(18,4)``, ``x::text``.

An entry of a shape's ``columns`` may end with ``::`` and a type; the output column
keeps its name (``amount``), only its lake type changes:

* ``::numeric(p,s)`` (or ``decimal(p,s)``; ``numeric(p)`` means scale 0), with
  1 <= p <= 38 and 0 <= s <= p (what Spark's decimal holds), on a ``numeric`` column
  (or a domain over one): the lake column is ``decimal(p,s)``. An unconstrained
  ``numeric`` column otherwise stays text, which is lossless but not a number. A
  value that does not fit is refused when its batch is built (``UnfitValue``): NaN,
  infinities, too many digits before the point, and more digits after the point than
  the scale (never rounded: Postgres kept those digits, so would the lake).
* ``::text``, on a column of any type: Postgres's text output, unchanged; the escape
  hatch for values a mapped type cannot hold (NaN in a ``numeric(p,s)`` column, a
  multi-dimensional array) or when text is simply wanted.

Entries are stored canonically (``amount::numeric(18,4)``), so a stored definition
re-validates to itself. Pure: parsing and the lake type; the catalog check that the
column's type suits the cast is in ``shapes.catalog``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from tidemark.pgoutput.values.pgtype import PgType, declared_numeric, declared_text
from tidemark.predicates.identifiers import format_identifier, parse_identifiers

_NUMERIC: Final = re.compile(
    r"\s*(?:numeric|decimal)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*\Z", re.IGNORECASE
)
_TEXT: Final = re.compile(r"\s*text\s*\Z", re.IGNORECASE)
MAX_PRECISION: Final = 38  # Spark's and Arrow's decimal128


@dataclass(frozen=True, slots=True)
class ColumnCast:
    """The lake type a shape declares for one column."""

    kind: Literal["numeric", "text"]
    precision: int = 0
    scale: int = 0

    def __str__(self) -> str:
        return f"numeric({self.precision},{self.scale})" if self.kind == "numeric" else "text"

    def lake_type(self, source: PgType) -> PgType:
        """The column's ``PgType`` under this cast (``source``: the column's own)."""
        if self.kind == "numeric":
            return declared_numeric(self.precision, self.scale)
        return declared_text(source)


def split_cast(item: str) -> tuple[str, str | None]:
    """``'"a::b"::text'`` -> ``('"a::b"', 'text')``: the ``::`` outside double quotes."""
    quoted = False
    for pos, char in enumerate(item):
        if char == '"':
            quoted = not quoted
        elif not quoted and item.startswith("::", pos):
            return item[:pos], item[pos + 2 :]
    return item, None


def parse_cast(text: str) -> ColumnCast:
    """A declared type (ValueError saying what is accepted)."""
    if _TEXT.match(text):
        return ColumnCast("text")
    numeric = _NUMERIC.match(text)
    if numeric is None:
        raise ValueError(
            f"'::{text.strip()}' is not a lake type a shape can declare: use "
            "'::numeric(p,s)' (a decimal column) or '::text' (Postgres's text output)"
        )
    if numeric[1] is None:
        raise ValueError(
            "'::numeric' needs a precision and a scale, e.g. '::numeric(18,4)': an "
            "unconstrained numeric already reaches the lake as text"
        )
    precision, scale = int(numeric[1]), int(numeric[2] or 0)
    if not 1 <= precision <= MAX_PRECISION:
        raise ValueError(
            f"numeric({precision},{scale}): the precision must be 1 to {MAX_PRECISION} "
            "(the widest decimal Spark and Arrow hold)"
        )
    if scale > precision:
        raise ValueError(f"numeric({precision},{scale}): the scale cannot exceed the precision")
    return ColumnCast("numeric", precision, scale)


def parse_column(item: str) -> tuple[str, ColumnCast | None]:
    """A ``columns`` entry -> (exact column name, declared cast or None) (ValueError)."""
    name_text, cast_text = split_cast(item)
    parts = parse_identifiers(name_text)
    if len(parts) != 1:
        raise ValueError(f"{item!r} must be a plain column name, without a table")
    return parts[0], None if cast_text is None else parse_cast(cast_text)


def split_column_list(text: str) -> list[str]:
    """``'id, amount::numeric(18,4), "a,b"'`` -> the entries: commas inside
    parentheses or double quotes do not separate (the command line's ``--columns``)."""
    entries: list[str] = []
    depth, quoted, start = 0, False, 0
    for pos, char in enumerate(text):
        if char == '"':
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth = max(0, depth - 1)
        elif not quoted and depth == 0 and char == ",":
            entries.append(text[start:pos])
            start = pos + 1
    entries.append(text[start:])
    return [e.strip() for e in entries if e.strip()]


def format_column(name: str, cast: ColumnCast | None) -> str:
    """The canonical spelling of a ``columns`` entry."""
    return format_identifier(name) + ("" if cast is None else f"::{cast}")
