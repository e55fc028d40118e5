"""One exception hierarchy for tidemark.

Every error a user can meet says what was wrong, with which value, and what to do.
Code raises the most specific subclass; callers catch ``TidemarkError``.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Base of every error tidemark raises on purpose."""


class ConfigError(TidemarkError):
    """Configuration is missing, malformed or inconsistent."""


class ShapeError(TidemarkError):
    """A shape definition is invalid (predicate, table, columns, identity, types)."""


class ProtocolError(TidemarkError):
    """Bytes from the walsender do not follow the replication / pgoutput protocol."""


class ReplicationError(TidemarkError):
    """The replication connection, slot or publication cannot be used as asked."""


class SlotLostError(ReplicationError):
    """The replication slot was dropped or invalidated: fatal, never retried."""


class SinkError(TidemarkError):
    """A lake table cannot be written or read as the commit protocol requires."""


class InvariantViolation(TidemarkError):
    """Something we promised Postgres or readers did not hold (e.g. ack beyond durable)."""
