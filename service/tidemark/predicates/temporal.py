"""Postgres's special date/time values, which Python's date and time types cannot hold.

Postgres has ``infinity`` and ``-infinity`` for date, timestamp and timestamptz, and
``24:00:00`` for time. ``pgoutput.values`` maps them to Python's extremes
(``date.max``, ``time.max`` ...), which keeps their order but makes them *equal* to a
real value (``9999-12-31``). Predicates need them exact, so their column parsers and
literal input use ``TemporalExtreme`` values instead: each sorts above (or below)
every ordinary value of its type and equals only itself, as in Postgres. A date
infinity and a timestamp infinity are the same object, so casts between date and
timestamp keep them (``date_ts``, ``timestamp_date``); ``date_text`` prints them as
Postgres does.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time
from typing import Any, Final


class TemporalExtreme:
    """A special date/time value Python's types cannot hold: ``infinity`` and
    ``-infinity`` (date, timestamp, timestamptz) or ``24:00:00`` (time).

    It sorts above (``positive``) or below every ordinary value and equals only itself,
    as in Postgres; Python's stand-ins (``date.max``, ``time.max``) would equal a real
    value. Date and timestamp infinities are the same objects, as a cast keeps them.
    """

    __slots__ = ("positive", "text")

    def __init__(self, text: str, positive: bool) -> None:
        self.text = text
        self.positive = positive

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return hash(self.text)

    def __lt__(self, other: object) -> bool:
        return other is not self and not self.positive

    def __le__(self, other: object) -> bool:
        return other is self or not self.positive

    def __gt__(self, other: object) -> bool:
        return other is not self and self.positive

    def __ge__(self, other: object) -> bool:
        return other is self or self.positive

    def __repr__(self) -> str:
        return self.text


POS_INFINITY: Final = TemporalExtreme("infinity", positive=True)
NEG_INFINITY: Final = TemporalExtreme("-infinity", positive=False)
END_OF_DAY: Final = TemporalExtreme("24:00:00", positive=True)
_INFINITIES: Final = {b"infinity": POS_INFINITY, b"-infinity": NEG_INFINITY}
_END_OF_DAY: Final = {b"24:00:00": END_OF_DAY}


def column_parser(family: str, fallback: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """pgoutput text -> value for a date, time, timestamp or timestamptz column.

    Ordinary values take one ``fromisoformat`` (the hot path, one Python call, as
    ``fallback`` itself would); the special values become ``TemporalExtreme``; anything
    else goes to ``fallback`` (``values.python_parser``), which converts other UTC
    offsets and raises its errors (BC dates, years after 9999, malformed text).
    """
    if family == "date":
        from_iso: Callable[[str], Any] = date.fromisoformat
        specials = _INFINITIES
    elif family == "time":
        from_iso, specials = time.fromisoformat, _END_OF_DAY
    else:
        from_iso, specials = datetime.fromisoformat, _INFINITIES
    zone = UTC if family == "timestamptz" else None

    def parse(text: bytes) -> Any:
        try:
            value = from_iso(text.decode("ascii"))
        except ValueError:
            return specials.get(text) or fallback(text)
        if family != "date" and value.tzinfo is not zone:
            return fallback(text)
        return value

    return parse


def date_ts(v: date | TemporalExtreme) -> datetime | TemporalExtreme:
    if isinstance(v, TemporalExtreme):
        return v
    return datetime(v.year, v.month, v.day)


def timestamp_date(v: datetime | TemporalExtreme) -> date | TemporalExtreme:
    return v if isinstance(v, TemporalExtreme) else v.date()


def date_text(v: date | TemporalExtreme) -> str:
    return v.text if isinstance(v, TemporalExtreme) else v.isoformat()
