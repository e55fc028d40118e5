"""The text format tidemark reads values in, and the errors for text that breaks it.

Assumed session settings (the replication connection and the backfill's COPY
connections set them): DateStyle=ISO, IntervalStyle=postgres, TimeZone=UTC,
extra_float_digits=3, bytea_output=hex (escape-format bytea is still understood).
"""

from __future__ import annotations

from tidemark.errors import ProtocolError
from tidemark.pgoutput.values.oids import TYPE_NAMES

SESSION_HINT = (
    "the replication session must use DateStyle=ISO, IntervalStyle=postgres, "
    "TimeZone=UTC, bytea_output=hex"
)


class UnrepresentableValue(ProtocolError):
    """A valid Postgres value that the Python type cannot hold (BC dates, year > 9999)."""


def bad_value(text: bytes, type_oid: int | str, expected: str = "") -> ProtocolError:
    """The error for ``text`` that is not the type's output in our session settings."""
    name = type_oid if isinstance(type_oid, str) else TYPE_NAMES.get(type_oid, f"oid {type_oid}")
    hint = f" (expected {expected})" if expected else ""
    return ProtocolError(f"cannot read {bytes(text[:80])!r} as {name}{hint}; {SESSION_HINT}")
