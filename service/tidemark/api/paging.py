"""Which shapes one page of ``GET /v1/shapes`` holds.

The query: ``state`` (repeatable, or comma-separated: ``state=active,error``) keeps the
shapes in one of those states; ``limit`` (1 to ``MAX_LIMIT``; none: every shape) caps
the page; ``cursor`` continues after the page that ended there. Shapes are in name
order, and the cursor is the last name of the previous page, handed out as
``next_cursor`` (``None`` once nothing follows). So a page is "the first ``limit``
names above the cursor": a shape added or removed between two pages neither repeats
nor hides any other, and a cursor whose shape was removed meanwhile still works.
Clients treat the cursor as opaque.

Pure: ``ShapeQuery.parse`` reads the parameters (``BadQuery`` says what was wrong),
``ShapeQuery.page`` cuts the page from the names and their states.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidemark.api.shape_view import SHAPE_STATES

MAX_LIMIT = 1000
# a shape name (tidemark.shapes.model): what a cursor is
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")


class BadQuery(ValueError):
    """A query parameter of ``GET /v1/shapes`` that is not what it must be."""


@dataclass(frozen=True, slots=True)
class ShapeQuery:
    states: frozenset[str] | None = None  # None: every state
    limit: int | None = None  # None: every shape
    cursor: str | None = None  # the last name of the previous page

    @classmethod
    def parse(cls, states: Iterable[str], limit: str | None, cursor: str | None) -> ShapeQuery:
        """The query from the values of ``state`` (each maybe comma-separated),
        ``limit`` and ``cursor``."""
        wanted = {s.strip() for value in states for s in value.split(",")}
        unknown = sorted(wanted - set(SHAPE_STATES))
        if unknown:
            raise BadQuery(
                f"state={','.join(unknown)!r} is not a shape state: give one or more of "
                f"{', '.join(SHAPE_STATES)} (repeated, or separated by commas)"
            )
        return cls(
            states=frozenset(wanted) if wanted else None,
            limit=None if limit is None else _limit(limit),
            cursor=None if cursor is None else _cursor(cursor),
        )

    def page(self, states: Mapping[str, str]) -> tuple[list[str], str | None]:
        """The names on this page, in order, and the cursor of the next (None: last).
        ``states``: each shape's name and state."""
        names = sorted(
            name
            for name, state in states.items()
            if (self.states is None or state in self.states)
            and (self.cursor is None or name > self.cursor)
        )
        if self.limit is None or len(names) <= self.limit:
            return names, None
        chosen = names[: self.limit]
        return chosen, chosen[-1]


def _limit(text: str) -> int:
    if not (re.fullmatch(r"[0-9]{1,4}", text) and 1 <= int(text) <= MAX_LIMIT):
        raise BadQuery(
            f"limit={text!r} is not a whole number from 1 to {MAX_LIMIT}: give e.g. "
            "limit=100, and follow next_cursor for the rest"
        )
    return int(text)


def _cursor(text: str) -> str:
    if not _NAME.match(text):
        raise BadQuery(
            f"cursor={text!r} is not a cursor this API handed out: pass the next_cursor "
            "of the previous page as it was, or leave it out to start from the first shape"
        )
    return text
