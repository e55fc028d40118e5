"""What tells tidemark its source is shutting down (``tidemark.state.lease.source_stopping``):
then it ends its stream, whose walsender would hold the server's shutdown."""

from __future__ import annotations

import psycopg
import psycopg.errors

from tidemark.state.lease import source_stopping


def test_the_servers_own_shutdown_messages_say_so() -> None:
    # 57P01: the session ended by a fast shutdown (or pg_terminate_backend)
    assert source_stopping(psycopg.errors.AdminShutdown("terminating connection"))
    # 57P03 at connect time, as psycopg reports it (an OperationalError with the text)
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        "FATAL:  the database system is shutting down"
    )
    assert source_stopping(refused)
    assert source_stopping(psycopg.errors.CannotConnectNow("the database system is starting up"))


def test_other_failures_do_not() -> None:
    assert not source_stopping(TimeoutError("the lease was not confirmed within 10 s"))
    assert not source_stopping(psycopg.OperationalError("Connection refused"))
    assert not source_stopping(psycopg.errors.QueryCanceled("canceling statement"))
