"""How the HTTP API says that a request failed: problem details (RFC 9457).

Every error answer is ``application/problem+json``::

    {"type": "https://tidemark.dev/problems/not-found", "title": "Not found",
     "status": 404, "detail": "there is no shape 'x'; GET /v1/shapes lists them",
     "instance": "/v1/shapes/x", "error": "there is no shape 'x'; ..."}

``type`` names the kind of error and never changes for it: a client branches on
``type``, shows ``detail`` (what was wrong, with which value, and what to do) and
``title`` (the same for every problem of a kind). ``instance`` is the path that was
asked for. ``error`` repeats ``detail`` for clients of the first API, whose errors were
``{"error", "status"}``; it is an extension member, as RFC 9457 allows, and so is
everything a kind adds (a wait that timed out carries the progress it saw).

``KINDS`` is the whole list, for the OpenAPI description and the docs. The type URIs
identify; they are not promised to resolve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

PROBLEM_BASE = "https://tidemark.dev/problems/"
CONTENT_TYPE = "application/problem+json"


@dataclass(frozen=True, slots=True)
class ProblemKind:
    """One kind of error: its ``type`` URI's last segment, HTTP status, and title."""

    slug: str
    status: int
    title: str
    when: str  # for the docs: which requests meet it

    @property
    def type(self) -> str:
        return PROBLEM_BASE + self.slug


INVALID_BODY = ProblemKind(
    "invalid-body",
    400,
    "The request body is not a JSON object of the allowed fields",
    "the body is not JSON or not UTF-8, is nested too deeply, is not an object, or has "
    "fields other than name, table, where, columns, replica",
)
INVALID_SHAPE = ProblemKind(
    "invalid-shape",
    400,
    "The shape definition is invalid",
    "a field of the definition is refused: a name or type, the predicate (syntax, size "
    "and depth limits), the table (missing, unlogged, a system catalog, no usable key)",
)
INVALID_PARAMETER = ProblemKind(
    "invalid-parameter",
    400,
    "A query parameter is invalid",
    "a query parameter is missing or out of range: `lsn`, `timeout`, `state`, `limit`, `cursor`",
)
UNAUTHORIZED = ProblemKind(
    "unauthorized",
    401,
    "The request needs the admin token",
    "a mutation without `Authorization: Bearer <admin_token>` when a token is configured",
)
FORBIDDEN = ProblemKind(
    "forbidden",
    403,
    "The bearer token is not the admin token",
    "a mutation with another bearer token",
)
NOT_FOUND = ProblemKind(
    "not-found",
    404,
    "Not found",
    "an unknown shape (in the path or in `shape=`), or an unknown path",
)
METHOD_NOT_ALLOWED = ProblemKind(
    "method-not-allowed",
    405,
    "Method not allowed",
    "a method the path does not serve (the `Allow` header lists those it does)",
)
SHAPE_CONFLICT = ProblemKind(
    "shape-conflict",
    409,
    "The request conflicts with the shape's state",
    "another definition under that name, a shape removed while it was being added or "
    "resynced, a resync of a shape that never started",
)
TOO_LARGE = ProblemKind(
    "too-large",
    413,
    "The request body is too large",
    "a body over 64 KiB",
)
SOURCE_CANNOT_SERVE = ProblemKind(
    "source-cannot-serve",
    422,
    "The source cannot serve the shape as configured",
    "a valid definition the source cannot replicate as configured, e.g. a table outside "
    "a publication tidemark may not change (the detail gives the statement to run)",
)
INTERNAL = ProblemKind(
    "internal",
    500,
    "Internal error",
    "a bug: the log has the traceback (event `api.failed`)",
)
SOURCE_UNAVAILABLE = ProblemKind(
    "source-unavailable",
    503,
    "The source database cannot be reached",
    "the request needed the source database and could not reach it; try again",
)
STARTING = ProblemKind(
    "starting",
    503,
    "The service is still starting",
    "a wait asked before the service samples Postgres; try again",
)
WAIT_TIMEOUT = ProblemKind(
    "wait-timeout",
    504,
    "The LSN was not reached within the timeout",
    "`GET /v1/progress/wait` timed out; the body also has the progress it saw "
    "(`reached`: false, `target`)",
)
STORAGE_FULL = ProblemKind(
    "storage-full",
    507,
    "The service could not write its shape registry",
    "the disk under the sink root is full or refused the write: nothing was added",
)

KINDS: tuple[ProblemKind, ...] = (
    INVALID_BODY,
    INVALID_SHAPE,
    INVALID_PARAMETER,
    UNAUTHORIZED,
    FORBIDDEN,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    SHAPE_CONFLICT,
    TOO_LARGE,
    SOURCE_CANNOT_SERVE,
    INTERNAL,
    SOURCE_UNAVAILABLE,
    STARTING,
    WAIT_TIMEOUT,
    STORAGE_FULL,
)

# an error aiohttp raises itself (no route, no such method, a body over the limit)
_BY_STATUS = {400: INVALID_BODY, 404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 413: TOO_LARGE}


def kind_of_status(status: int) -> ProblemKind:
    """The kind an error of this status is when nothing more is known."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return next((k for k in KINDS if k.status == status), INTERNAL)


class Problem(Exception):
    """Raised by a handler to answer with a problem of ``kind``; the server's
    middleware renders it (``response``) with the request's path as ``instance``."""

    def __init__(
        self,
        kind: ProblemKind,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.headers, self.extensions = kind, detail, headers, extensions

    def response(self, instance: str | None) -> web.Response:
        return problem(self.kind, self.detail, instance, headers=self.headers, **self.extensions)


def problem_json(
    kind: ProblemKind, detail: str, instance: str | None = None, **extensions: Any
) -> dict[str, Any]:
    """The body: the RFC 9457 members, ``error`` (= detail) and ``extensions``."""
    body: dict[str, Any] = {
        **extensions,
        "type": kind.type,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        "error": detail,
    }
    if instance is not None:
        body["instance"] = instance
    return body


def problem(
    kind: ProblemKind,
    detail: str,
    instance: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> web.Response:
    """The response for a problem of ``kind``."""
    return web.Response(
        text=json.dumps(problem_json(kind, detail, instance, **extensions)),
        status=kind.status,
        content_type=CONTENT_TYPE,
        headers=headers,
    )
