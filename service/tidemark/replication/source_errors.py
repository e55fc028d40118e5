"""What a failure of the source connection means: retried, or fatal with what to do.

A lost connection (a restart, a network cut, a walsender timeout) is
``ConnectionLost``: the client reconnects with backoff. Wrong credentials, a role
without ``REPLICATION``, a missing database or a ``pg_hba.conf`` refusal are
``ReplicationError`` naming the fix; a slot that can no longer stream is
``SlotLostError``. Never retried: they would fail the same way.
"""

from __future__ import annotations

import psycopg

from tidemark.conninfo import redact_dsn, redact_text
from tidemark.errors import ReplicationError, SlotLostError


class ConnectionLost(Exception):
    pass


def raise_stream_error(err: psycopg.Error, slot: str) -> None:
    message = err.diag.message_primary or str(err)
    lowered = message.lower()
    if (
        "can no longer get changes" in lowered
        or "has been invalidated" in lowered
        or ("does not exist" in lowered and "slot" in lowered)
    ):
        raise SlotLostError(
            f"replication slot '{slot}' is no longer usable: {message}. "
            "Drop it and resync every shape"
        ) from err
    raise ConnectionLost(message) from err


def classify_connect_error(exc: psycopg.OperationalError, dsn: str) -> Exception:
    text = redact_text(str(exc), dsn).strip()
    lowered = text.lower()
    safe = redact_dsn(dsn)
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return ReplicationError(
            f"cannot log in to the source ({safe}): password authentication failed. "
            "Check the user and password in the source DSN"
        )
    if "must be superuser or replication role" in lowered or (
        "permission denied to start wal sender" in lowered
    ):
        return ReplicationError(
            f"the source role may not start a walsender ({text}). Grant it: "
            "ALTER ROLE <user> REPLICATION;"
        )
    if "does not exist" in lowered and ("database" in lowered or "role" in lowered):
        return ReplicationError(f"cannot connect to the source ({safe}): {text}")
    if "no pg_hba.conf entry" in lowered:
        return ReplicationError(
            f"the source refuses the connection ({text}). Allow it in pg_hba.conf "
            "(a 'replication' line is needed for the walsender connection)"
        )
    return ConnectionLost(text)
