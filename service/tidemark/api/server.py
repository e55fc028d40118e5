"""The HTTP API.

=====================================  ==============================================
``GET /``                              the status page (HTML; see ``status_page``)
``GET /healthz``                       the process and its event loop answer
``GET /readyz``                        streaming, no invariant violated, no shape
                                       stalled or failed (503 with the reasons)
``GET /metrics``                       Prometheus text format
``GET /v1/openapi.json``               this API's OpenAPI description (``openapi.py``)
``GET /v1/shapes``                     every shape: definition, state, frontier;
                                       ``?state=S&limit=N&cursor=C`` filter and page
``POST /v1/shapes``                    add a shape (JSON body: name, table, where,
                                       columns, replica)
``GET /v1/shapes/{name}``              one shape
``DELETE /v1/shapes/{name}``           remove a shape (its table stays on disk)
``POST /v1/shapes/{name}/resync``      rebuild a shape from a fresh snapshot (202)
``GET /v1/progress``                   received / flushed / applied LSNs, Postgres's
                                       view of our slot, per-shape frontiers
``GET /v1/progress/wait``              ``?lsn=X&timeout=S[&shape=N]``: returns once
                                       Postgres's replay_lsn (and the shape's
                                       frontier) reach X; with a shape, its frontier
                                       alone while another shape in error holds the
                                       acknowledgement; 504 on timeout
=====================================  ==============================================

Mutations need ``Authorization: Bearer <admin_token>`` when a token is configured.
Errors are problem details (RFC 9457, ``application/problem+json``; ``problems.py``):
``{"type", "title", "status", "detail", "instance", "error"}``, one ``type`` per kind
of error. LSNs are given both as text (``16/B374D848``) and as numbers, times as ISO
8601 UTC strings with their Unix time beside them (``shape_view.py``).

A request a user got wrong is answered 4xx, never 500: 400 for a malformed body,
parameter or shape definition (including predicates over the size and depth limits),
404 for an unknown shape or path, 409 for a conflict with a shape's state (another
definition under that name, a shape removed while it was being resynced), 413 for a
body over 64 KiB, 422 when the definition is valid but the source cannot serve it as
configured (a table outside a publication tidemark may not change), 503 when the
source database cannot be reached. Mutations run one at a time. Anything else is a
bug: logged (``api.failed``, with the traceback) and answered 500 with a generic
message.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
import time
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from tidemark import exit_reason
from tidemark.api import problems
from tidemark.api.openapi import openapi_document
from tidemark.api.paging import BadQuery, ShapeQuery
from tidemark.api.problems import Problem, problem
from tidemark.api.shape_view import epoch, iso_time, lsn_json, shape_json
from tidemark.api.status_page import status_page
from tidemark.conninfo import redact_text
from tidemark.errors import ReplicationError, ShapeConflict, ShapeError, TidemarkError
from tidemark.lsn import Lsn
from tidemark.shapes.model import ShapeDefinition
from tidemark.state.durable import full_disk

if TYPE_CHECKING:
    from tidemark.api.port import ServiceView
    from tidemark.status.history import HistoryFacts

log = structlog.get_logger("tidemark.api")
SERVICE: web.AppKey[ServiceView] = web.AppKey("service")
MAX_WAIT_S = 300.0
MAX_BODY_BYTES = 64 * 1024
MUTATIONS: web.AppKey[asyncio.Lock] = web.AppKey("mutations")


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except Problem as exc:
        return exc.response(_instance(request))
    except web.HTTPException as exc:  # raised by aiohttp: no route, method, body size
        if exc.status < 400:
            raise
        return _http_problem(request, exc)
    except ShapeConflict as exc:
        return problem(problems.SHAPE_CONFLICT, str(exc), _instance(request))
    except ShapeError as exc:
        return problem(problems.INVALID_SHAPE, str(exc), _instance(request))
    except psycopg.OperationalError as exc:
        dsn = request.app[SERVICE].settings.source.dsn
        return problem(
            problems.SOURCE_UNAVAILABLE,
            f"the source database cannot be reached: {redact_text(str(exc).strip(), dsn)}; "
            "try again once it is back",
            _instance(request),
        )
    except TidemarkError as exc:
        log.error("api.failed", path=request.path, error=str(exc), exc_info=exc)
        return problem(problems.INTERNAL, str(exc), _instance(request))
    except Exception as exc:  # a bug: say so, keep the details in the log
        log.error("api.failed", path=request.path, error=repr(exc), exc_info=exc)
        return problem(
            problems.INTERNAL,
            f"internal error while serving {request.method} {request.path}; the service "
            "log has the details (event api.failed)",
            _instance(request),
        )


def _instance(request: web.Request) -> str:
    """The problem's ``instance``: the path asked for, percent-encoded (a URI reference
    whatever characters the path has)."""
    return request.rel_url.raw_path


def _http_problem(request: web.Request, exc: web.HTTPException) -> web.Response:
    kind = problems.kind_of_status(exc.status)
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    if exc.status == 404:
        detail = (
            f"there is no {request.path}: GET /v1/openapi.json describes every path of this API"
        )
    elif exc.status == 405:
        allowed = ", ".join(sorted(m for m in exc.headers.get("Allow", "").split(",") if m))
        detail = f"{request.method} is not served at {request.path}: it serves {allowed}"
    elif exc.status == 413:
        detail = (
            f"the request body is over {MAX_BODY_BYTES // 1024} KiB, the "
            "most this API reads: a shape definition is far smaller"
        )
    else:
        detail = exc.text or exc.reason
    if kind.status != exc.status:  # a status no kind names: keep it, say it as it was
        return web.Response(
            text=json.dumps(
                problems.problem_json(kind, detail, _instance(request))
                | {"type": "about:blank", "title": exc.reason, "status": exc.status}
            ),
            status=exc.status,
            content_type=problems.CONTENT_TYPE,
            headers=headers,
        )
    return problem(kind, detail, _instance(request), headers=headers)


def _authorize(request: web.Request) -> None:
    """Raises unless the request may mutate: no admin token, or the bearer is it."""
    token = request.app[SERVICE].settings.http.admin_token.get_secret_value()
    if not token:
        return
    given = request.headers.get("Authorization", "")
    if not given.startswith("Bearer "):
        raise Problem(
            problems.UNAUTHORIZED,
            "this endpoint needs 'Authorization: Bearer <admin token>'",
            headers={"WWW-Authenticate": 'Bearer realm="tidemark"'},
        )
    if not hmac.compare_digest(given[len("Bearer ") :].encode(), token.encode()):
        raise Problem(problems.FORBIDDEN, "the bearer token is not the configured admin token")


async def healthz(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "status": "ok",
            "phase": service.phase,
            "role": service.role,
            "started_at": iso_time(service.started_at),
            "started_at_epoch": epoch(service.started_at),
            "uptime_s": round(time.time() - service.started_at, 1),
        }
    )


async def readyz(request: web.Request) -> web.Response:
    ready, reasons = request.app[SERVICE].readiness()
    body = {"ready": ready, "role": request.app[SERVICE].role, "reasons": reasons}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    service.update_metrics()  # (on the event loop: it reads the service's state)
    # the text of 12k series at 1000 shapes takes ~70 ms to format: off the event loop,
    # which keeps receiving and acknowledging meanwhile (``python -m bench metrics``)
    body = await asyncio.to_thread(generate_latest, service.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def list_shapes(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    try:
        query = ShapeQuery.parse(
            request.query.getall("state", []),
            request.query.get("limit"),
            request.query.get("cursor"),
        )
    except BadQuery as exc:
        raise Problem(problems.INVALID_PARAMETER, str(exc)) from None
    names, next_cursor = query.page({n: service.shape_state(n)[0] for n in service.shapes})
    stalls = {s.name: s for s in service.stalled_shapes()}
    shapes = [shape_json(service, n, stalls) for n in names]
    return web.json_response({"shapes": shapes, "next_cursor": next_cursor})


async def show_shape(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["name"]
    if name not in service.shapes:
        raise _no_shape(name)
    body = shape_json(service, name)
    body["tables"] = await asyncio.to_thread(_tables_of, service, name)
    return web.json_response(body)


def _no_shape(name: str) -> Problem:
    return Problem(problems.NOT_FOUND, f"there is no shape {name!r}; GET /v1/shapes lists them")


def _tables_of(service: ServiceView, name: str) -> dict[str, Any] | None:
    """Where the shape's tables are (None before its first commit); read from the
    tables themselves, so only for one shape at a time."""
    from tidemark.errors import SinkError

    try:
        return service.describe_tables(name)
    except SinkError:
        return None


async def add_shape(request: web.Request) -> web.Response:
    _authorize(request)
    service = request.app[SERVICE]
    not_an_object = Problem(
        problems.INVALID_BODY, "the request body must be a JSON object with name and table"
    )
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise not_an_object from None
    except RecursionError:
        raise Problem(
            problems.INVALID_BODY, "the request body is nested too deeply to be a shape definition"
        ) from None
    if not isinstance(body, dict):
        raise not_an_object
    unknown = set(body) - {"name", "table", "where", "columns", "replica"}
    if unknown:
        raise Problem(
            problems.INVALID_BODY,
            f"unknown field(s) {sorted(unknown)}: allowed are name, table, where, columns, replica",
        )
    try:
        definition = ShapeDefinition.model_validate(body)
    except (ShapeError, ValidationError) as exc:
        raise Problem(problems.INVALID_SHAPE, str(exc)) from None
    async with request.app[MUTATIONS]:
        existing = service.registered(definition.name)
        if existing is not None and existing != definition:
            raise Problem(
                problems.SHAPE_CONFLICT,
                f"shape {definition.name!r} already exists with another definition: DELETE "
                "it first",
            )
        try:
            await service.add_shape(definition, origin="api")
        except ReplicationError as exc:  # e.g. a table outside a publication we may not alter
            raise Problem(problems.SOURCE_CANNOT_SERVE, str(exc)) from None
        except OSError as exc:  # the registry could not be written (a full disk): not added
            full = full_disk(service.settings.sink.root)
            raise Problem(
                problems.STORAGE_FULL,
                f"shape {definition.name!r} was not added: {exc}. {full or ''}".strip(),
            ) from None
        if definition.name not in service.shapes:
            raise Problem(
                problems.SHAPE_CONFLICT,
                f"shape {definition.name!r} was removed while it was being added",
            )
        return web.json_response(shape_json(service, definition.name), status=201)


async def resync_shape(request: web.Request) -> web.Response:
    _authorize(request)
    service = request.app[SERVICE]
    name = request.match_info["name"]
    async with request.app[MUTATIONS]:
        if name not in service.shapes:
            raise _no_shape(name)
        await service.resync_shape(name)
        if name not in service.shapes:
            raise Problem(
                problems.SHAPE_CONFLICT, f"shape {name!r} was removed while it was being resynced"
            )
        return web.json_response(shape_json(service, name), status=202)


async def remove_shape(request: web.Request) -> web.Response:
    _authorize(request)
    service = request.app[SERVICE]
    name = request.match_info["name"]
    async with request.app[MUTATIONS]:
        if name not in service.shapes and service.registered(name) is None:
            raise _no_shape(name)
        await service.remove_shape(name)
        return web.Response(status=204)


def progress_json(service: ServiceView) -> dict[str, Any]:
    p = service.progress()
    sample = service.postgres_sample()
    pg = None
    if sample is not None:
        pg = {
            "current_wal": lsn_json(sample.current_wal_lsn),
            "write": lsn_json(sample.write_lsn),
            "flush": lsn_json(sample.flush_lsn),
            "replay": lsn_json(sample.replay_lsn),
            "confirmed_flush": lsn_json(sample.confirmed_flush_lsn),
            "restart": lsn_json(sample.restart_lsn),
            "wal_status": sample.wal_status,
            "safe_wal_size": sample.safe_wal_size,
            "retained_wal_bytes": sample.retained_wal_bytes,
            "lag_bytes": sample.lag_bytes,
            "replay_lag_s": sample.replay_lag_s,
            "sampled_at": iso_time(sample.taken_at),
            "sampled_at_epoch": epoch(sample.taken_at),
            "age_s": round(max(0.0, time.time() - sample.taken_at), 1),
        }
    return {
        "phase": service.phase,
        "role": service.role,
        "received": lsn_json(p.received_lsn),
        "flushed": lsn_json(p.flushed_lsn),
        "applied": lsn_json(p.applied_lsn),
        "postgres": pg,
        "frontiers": {name: lsn_json(f) for name, f in sorted(p.frontiers.items())},
        "violations": [{"kind": v.kind, "message": v.message} for v in service.violations[-10:]],
        "memory": memory_json(service),
    }


def memory_json(service: ServiceView) -> dict[str, Any] | None:
    """Buffered bytes against the budget, what left memory early, streamed transactions."""
    flush = service.flush_facts()
    if flush is None:
        return None
    collector = service.collector_facts()
    return {
        "buffered_bytes": flush.buffered_bytes,
        "budget_bytes": flush.memory_budget,
        "stage_jobs": flush.stage_jobs,
        "spooled_bytes": flush.spooled_bytes,
        "blocked_s": round(flush.blocked_seconds, 3),
        "waiting_s": None if flush.waiting_s is None else round(flush.waiting_s, 3),
        "open_streamed_transactions": collector.open_streams,
        "streamed_commits": collector.streamed_commits,
        "streamed_aborts": collector.streamed_aborts,
    }


async def progress(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = progress_json(service)
    body["history"] = history_json(service.history_facts())
    return web.json_response(body)


def history_json(history: HistoryFacts) -> dict[str, Any]:
    """The last minutes, interval by interval (``tidemark.status.history``)."""
    return {
        "interval_s": history.interval_s,
        "points": [
            {
                "at": iso_time(p.at),
                "epoch": epoch(p.at),
                "ack_lag_s": None if p.ack_lag_s is None else round(max(0.0, p.ack_lag_s), 3),
                "rows_per_s": round(max(0.0, p.rows_per_s), 1),
            }
            for p in history.points
        ],
    }


# a number as the description's `number` has it (JSON's form, ASCII digits): float()
# alone also takes blanks around it, underscores and other scripts' digits ('١٢٠'),
# which the description refuses, and such a request must be refused before it waits
_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


WAIT_PARAMETERS = ("lsn", "timeout", "shape")


def _only_parameters(request: web.Request, names: tuple[str, ...]) -> None:
    """Refuse a query with a parameter ``names`` does not have, or one of them twice:
    such a request breaks the description, and must not wait (it would have waited
    for the first value, the rest unread)."""
    unknown = sorted(set(request.query) - set(names))
    if unknown:
        raise Problem(
            problems.INVALID_PARAMETER,
            f"unknown query parameter {unknown[0]!r}: {request.path} takes " + ", ".join(names),
        )
    repeated = [n for n in names if len(request.query.getall(n, [])) > 1]
    if repeated:
        raise Problem(
            problems.INVALID_PARAMETER, f"{repeated[0]} is given more than once: give it once"
        )


async def wait_progress(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    _only_parameters(request, WAIT_PARAMETERS)
    try:
        target = int(Lsn.parse(request.query["lsn"]))
    except KeyError:
        raise Problem(
            problems.INVALID_PARAMETER, "give the LSN to wait for: ?lsn=16/B374D848"
        ) from None
    except ValueError as exc:
        raise Problem(problems.INVALID_PARAMETER, str(exc)) from None
    text = request.query.get("timeout", "30")
    timeout = float(text) if _JSON_NUMBER.fullmatch(text) else math.nan
    if not (math.isfinite(timeout) and 0 <= timeout <= MAX_WAIT_S):
        raise Problem(
            problems.INVALID_PARAMETER,
            f"timeout={text!r} is not a number of seconds from 0 to {MAX_WAIT_S:g}: give "
            "e.g. timeout=30, and wait again for longer",
        )
    shape = request.query.get("shape")
    if shape is not None and shape not in service.shapes:
        raise _no_shape(shape)
    deadline = asyncio.get_running_loop().time() + timeout
    if not service.monitoring:
        raise Problem(
            problems.STARTING, "the service is still starting: wait again in a few seconds"
        )
    if shape is None:
        reached = await service.wait_replayed(target, timeout)
    else:
        reached = await _shape_reached(service, shape, target, deadline)
    body = progress_json(service)
    body["target"] = lsn_json(target)
    body["reached"] = reached
    if not reached:
        raise Problem(
            problems.WAIT_TIMEOUT,
            f"{body['target']['lsn']} was not reached within {timeout:g}s"
            + (f" in shape {shape!r}" if shape is not None else "")
            + ": wait again, or look at postgres.replay and frontiers in this answer",
            **body,
        )
    return web.json_response(body)


async def _shape_reached(service: ServiceView, shape: str, target: int, deadline: float) -> bool:
    """Whether ``shape``'s frontier reaches ``target`` by ``deadline``, and Postgres's
    replay too, unless another shape in error holds the acknowledgement back: then the
    frontier alone answers (the shape's table holds every transaction up to it)."""
    loop = asyncio.get_running_loop()
    replayed = asyncio.ensure_future(
        service.wait_replayed(target, max(0.0, deadline - loop.time()))
    )
    try:
        while True:
            frontier = service.frontier(shape)
            if frontier is not None and frontier >= target:
                if replayed.done() and replayed.result():
                    return True
                holder = service.acknowledgement_holder()
                if holder is not None and holder[0] != shape:
                    return True
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.05)
    finally:
        replayed.cancel()


def build_app(service: ServiceView) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[SERVICE] = service
    app[MUTATIONS] = asyncio.Lock()
    app.router.add_get("/", status_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/v1/shapes", list_shapes)
    app.router.add_post("/v1/shapes", add_shape)
    app.router.add_get("/v1/shapes/{name}", show_shape)
    app.router.add_delete("/v1/shapes/{name}", remove_shape)
    app.router.add_post("/v1/shapes/{name}/resync", resync_shape)
    app.router.add_get("/v1/progress", progress)
    app.router.add_get("/v1/progress/wait", wait_progress)
    return app


async def serve(service: ServiceView) -> None:
    """Serve the API until cancelled."""
    http = service.settings.http
    runner = web.AppRunner(build_app(service), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, http.host, http.port)
    await site.start()
    server: Any = site._server
    sockets = server.sockets if server is not None else []
    service.http_port = sockets[0].getsockname()[1] if sockets else http.port
    log.info("http.listening", host=http.host, port=service.http_port)
    exit_reason.clear()  # up again: a reason the last run left is history
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
