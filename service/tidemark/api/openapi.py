"""The OpenAPI 3.1 description of the HTTP API, served at ``GET /v1/openapi.json``.

One dict, built from the same constants the server uses (shape states, the page limit,
the wait limit, the problem kinds; the schemas in ``schemas.py``), so the description
moves with the code. Every route ``server.build_app`` registers is here (a unit test
holds the two together), with its parameters, body, each status it answers and the
schema of each answer; an error status lists the problem ``type`` values it can carry.
Mutations name the bearer admin token as their security; what the router itself
answers (an unknown path, a method a path does not serve) is under
``components/responses``. The document has no
``servers``: it describes the service it is fetched from.

Pure: ``openapi_document()`` builds a new dict on each call (callers may change it).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from tidemark.api import problems
from tidemark.api.paging import MAX_LIMIT
from tidemark.api.problems import CONTENT_TYPE as PROBLEM_JSON
from tidemark.api.problems import ProblemKind
from tidemark.api.schemas import LSN_PATTERN, SCHEMAS, SHAPE_NAME_PATTERN, Schema, ref
from tidemark.api.shape_view import SHAPE_STATES

MAX_WAIT_S = 300  # GET /v1/progress/wait's timeout, in seconds (server.MAX_WAIT_S)
JSON = "application/json"
SECURITY_SCHEME = "adminToken"

_ABOUT = """\
Shapes of a PostgreSQL database replicated into Delta or Iceberg tables, and how far
the replication is.

**Errors** are problem details (RFC 9457, `application/problem+json`): `type` names
the kind of error and is stable, `detail` says what was wrong and what to do, `error`
repeats `detail` for older clients.

**Values**: an LSN is `{"lsn": "16/B374D848", "value": 97628022856}`; a time is an
ISO 8601 UTC string to the millisecond with its Unix time beside it (`{"at", "epoch"}`
for an event, `<name>_epoch` for a member named after the time).

A path not described here is answered 404 (`not-found`), a method not described for
a path 405 (`method-not-allowed`, with `Allow`): `components/responses`.

**Mutations** (adding, removing, resyncing a shape) need `Authorization: Bearer
<admin_token>` when `[http] admin_token` is set, and run one at a time. Answers are
open: a client ignores members it does not know."""


def _json(schema: Schema, description: str, media_type: str = JSON) -> dict[str, Any]:
    return {"description": description, "content": {media_type: {"schema": schema}}}


def _problem_responses(*kinds: ProblemKind) -> dict[str, Any]:
    """One response per status of ``kinds``, each naming the ``type`` values it carries."""
    by_status: dict[int, list[ProblemKind]] = {}
    for kind in kinds:
        by_status.setdefault(kind.status, []).append(kind)
    responses: dict[str, Any] = {}
    for status, same in sorted(by_status.items()):
        schema = {
            "allOf": [ref("Problem")],
            "properties": {
                "type": {"enum": [k.type for k in same]},
                "status": {"const": status},
            },
        }
        description = "; ".join(f"`{k.slug}`: {k.title}" for k in same)
        response = _json(schema, description, PROBLEM_JSON)
        if status == 401:
            response["headers"] = {
                "WWW-Authenticate": {
                    "description": '`Bearer realm="tidemark"`',
                    "schema": {"type": "string"},
                }
            }
        responses[str(status)] = response
    return responses


def _operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    tag: str,
    description: str = "",
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    mutation: bool = False,
    errors: tuple[ProblemKind, ...] = (),
) -> dict[str, Any]:
    kinds = list(errors)
    if mutation:
        kinds[:0] = [problems.UNAUTHORIZED, problems.FORBIDDEN]
    kinds.append(problems.INTERNAL)
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "responses": dict(sorted({**responses, **_problem_responses(*kinds)}.items())),
    }
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = body
    if mutation:
        operation["security"] = [{SECURITY_SCHEME: []}]
    return operation


def _query(name: str, schema: Schema, description: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description, **more}


_SHAPE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "the shape's name",
    "schema": {"type": "string", "pattern": SHAPE_NAME_PATTERN},
}


def _paths() -> dict[str, Any]:
    service, shapes, progress = "service", "shapes", "progress"
    return {
        "/": {
            "get": _operation(
                "statusPage",
                "The status page",
                {"200": _json({"type": "string"}, "the page (HTML)", "text/html")},
                tag=service,
                description="An HTML page for people: it polls `/v1/progress`, "
                "`/v1/shapes` and `/readyz` and shows them.",
            )
        },
        "/healthz": {
            "get": _operation(
                "health",
                "The process and its event loop answer",
                {"200": _json(ref("Health"), "it answers")},
                tag=service,
            )
        },
        "/readyz": {
            "get": _operation(
                "readiness",
                "Whether the service is ready",
                {
                    "200": _json(
                        ref("Readiness"),
                        "streaming, no invariant violated, no shape stalled or failed",
                    ),
                    "503": _json(
                        ref("Readiness"),
                        "not ready: `reasons` says why (a shape being backfilled is not a reason)",
                    ),
                },
                tag=service,
            )
        },
        "/metrics": {
            "get": _operation(
                "metrics",
                "Prometheus metrics",
                {"200": _json({"type": "string"}, "Prometheus text format", "text/plain")},
                tag=service,
            )
        },
        "/v1/openapi.json": {
            "get": _operation(
                "openapi",
                "This description",
                {"200": _json({"type": "object"}, "an OpenAPI 3.1 document")},
                tag=service,
            )
        },
        "/v1/shapes": {
            "get": _operation(
                "listShapes",
                "List shapes, in name order",
                {"200": _json(ref("ShapeList"), "a page of shapes")},
                tag=shapes,
                description="Every shape by default. `state` keeps the shapes in those "
                "states; `limit` cuts a page, and `next_cursor` (null on the last page) "
                "is the `cursor` of the next.",
                parameters=[
                    _query(
                        "state",
                        {"type": "array", "items": {"enum": list(SHAPE_STATES)}},
                        "keep shapes in these states: repeated (`state=active&state=error`) "
                        "or comma-separated (`state=active,error`)",
                        style="form",
                        explode=True,
                    ),
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                        "the most shapes on the page (default: all)",
                    ),
                    _query(
                        "cursor",
                        {"type": "string", "pattern": SHAPE_NAME_PATTERN},
                        "the `next_cursor` of the previous page, as it was (opaque)",
                    ),
                ],
                errors=(problems.INVALID_PARAMETER,),
            ),
            "post": _operation(
                "addShape",
                "Add a shape",
                {"201": _json(ref("Shape"), "added; its backfill starts")},
                tag=shapes,
                description="Checks the definition against the source; the shape then "
                "backfills from a snapshot and follows the stream. Adding the same "
                "definition again is no error.",
                body={
                    "required": True,
                    "content": {JSON: {"schema": ref("ShapeDefinition")}},
                },
                mutation=True,
                errors=(
                    problems.INVALID_BODY,
                    problems.INVALID_SHAPE,
                    problems.SHAPE_CONFLICT,
                    problems.TOO_LARGE,
                    problems.SOURCE_CANNOT_SERVE,
                    problems.SOURCE_UNAVAILABLE,
                    problems.STORAGE_FULL,
                ),
            ),
        },
        "/v1/shapes/{name}": {
            "parameters": [_SHAPE_NAME],
            "get": _operation(
                "showShape",
                "One shape, and where its tables are",
                {"200": _json(ref("ShapeDetail"), "the shape")},
                tag=shapes,
                errors=(problems.NOT_FOUND,),
            ),
            "delete": _operation(
                "removeShape",
                "Remove a shape (its tables stay on disk)",
                {"204": {"description": "removed"}},
                tag=shapes,
                mutation=True,
                errors=(problems.NOT_FOUND, problems.SOURCE_UNAVAILABLE),
            ),
        },
        "/v1/shapes/{name}/resync": {
            "parameters": [_SHAPE_NAME],
            "post": _operation(
                "resyncShape",
                "Rebuild a shape from a fresh snapshot",
                {"202": _json(ref("Shape"), "the rebuild is queued; the stream continues")},
                tag=shapes,
                mutation=True,
                errors=(problems.NOT_FOUND, problems.SHAPE_CONFLICT, problems.SOURCE_UNAVAILABLE),
            ),
        },
        "/v1/progress": {
            "get": _operation(
                "progress",
                "Received, flushed and applied LSNs, Postgres's view, frontiers",
                {"200": _json(ref("Progress"), "how far the stream is")},
                tag=progress,
            )
        },
        "/v1/progress/wait": {
            "get": _operation(
                "waitForLsn",
                "Wait until Postgres replays an LSN (and a shape holds it)",
                {
                    "200": _json(ref("WaitResult"), "reached"),
                    "504": _json(
                        {
                            "allOf": [ref("WaitTimeout")],
                            "properties": {
                                "type": {"enum": [problems.WAIT_TIMEOUT.type]},
                                "status": {"const": 504},
                            },
                        },
                        f"`wait-timeout`: {problems.WAIT_TIMEOUT.title}",
                        PROBLEM_JSON,
                    ),
                },
                tag=progress,
                description="Returns once Postgres's replay_lsn (and, with `shape`, the "
                "shape's frontier) reach `lsn`; with `shape`, its frontier alone while "
                "another shape in error holds the acknowledgement back.",
                parameters=[
                    _query(
                        "lsn",
                        # as Lsn.parse reads it: blanks around it are allowed
                        {"type": "string", "pattern": r"^\s*" + LSN_PATTERN[1:-1] + r"\s*$"},
                        "the LSN to wait for, e.g. from pg_current_wal_lsn()",
                        required=True,
                    ),
                    _query(
                        "timeout",
                        {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 30},
                        "seconds to wait at most",
                    ),
                    _query(
                        "shape",
                        {"type": "string", "pattern": SHAPE_NAME_PATTERN},
                        "also wait until this shape's frontier reaches the LSN",
                    ),
                ],
                errors=(problems.INVALID_PARAMETER, problems.NOT_FOUND, problems.STARTING),
            )
        },
    }


def _version() -> str:
    try:
        return version("tidemark")
    except PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


def openapi_document() -> dict[str, Any]:
    """The whole description, as a new dict."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tidemark HTTP API",
            "version": _version(),
            "description": _ABOUT,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "service", "description": "health, readiness, metrics, this description"},
            {"name": "shapes", "description": "the shapes: list, add, show, remove, resync"},
            {"name": "progress", "description": "how far the stream is; waiting for an LSN"},
        ],
        "paths": _paths(),
        "components": {
            "schemas": {name: _copy(schema) for name, schema in SCHEMAS.items()},
            # what the router answers for a request no operation takes
            "responses": {
                "UnknownPath": _problem_responses(problems.NOT_FOUND)["404"],
                "MethodNotAllowed": _problem_responses(problems.METHOD_NOT_ALLOWED)["405"],
            },
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`[http] admin_token`; a service without one takes "
                    "mutations without a token",
                }
            },
        },
    }


def _copy(value: Any) -> Any:
    """A deep copy of JSON-like data (the schemas share their parts)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
