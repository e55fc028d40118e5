"""A REST catalog's refusals told apart from its other errors (``catalog.refusal``):
each says what to set, and where."""

from __future__ import annotations

from pyiceberg.exceptions import (
    AuthorizationExpiredError,
    CommitFailedException,
    ForbiddenError,
    NoSuchTableError,
    OAuthError,
    ServerError,
    UnauthorizedError,
)

from tidemark.sink.iceberg.catalog import refusal


def test_credentials_refused_expired_or_unknown_say_to_set_them_in_the_properties() -> None:
    for error in (
        OAuthError("invalid_client: unknown client"),
        UnauthorizedError("NotAuthorizedException: no valid token"),
        AuthorizationExpiredError("token expired"),
    ):
        said = refusal(error)
        assert said is not None
        assert "refused tidemark's credentials" in said
        assert "`credential`" in said and "`token`" in said and "[iceberg] properties" in said
        assert "no row is lost" in said


def test_a_forbidden_request_asks_for_the_principals_rights() -> None:
    said = refusal(ForbiddenError("not allowed"))
    assert said is not None and "grant" in said and "[iceberg] namespace" in said


def test_other_errors_are_no_refusal() -> None:
    for error in (
        ServerError("boom"),
        CommitFailedException("raced"),
        NoSuchTableError("gone"),
        OSError("connection refused"),
    ):
        assert refusal(error) is None
