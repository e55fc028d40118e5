"""The HTTP API.

=====================================  ==============================================
``GET /healthz``                       the process and its event loop answer
``GET /readyz``                        streaming, no invariant violated, no shape
                                       stalled or failed (503 with the reasons)
``GET /metrics``                       Prometheus text format
``GET /v1/shapes``                     every shape: definition, state, frontier
``POST /v1/shapes``                    add a shape (JSON body: name, table, where,
                                       columns, replica)
``GET /v1/shapes/{name}``              one shape
``DELETE /v1/shapes/{name}``           remove a shape (its table stays on disk)
``POST /v1/shapes/{name}/resync``      rebuild a shape from a fresh snapshot (202)
``GET /v1/progress``                   received / flushed / applied LSNs, Postgres's
                                       view of our slot, per-shape frontiers
``GET /v1/progress/wait``              ``?lsn=X&timeout=S[&shape=N]``: returns once
                                       Postgres's replay_lsn (and the shape's
                                       frontier) reach X; 504 on timeout
=====================================  ==============================================

Mutations need ``Authorization: Bearer <admin_token>`` when a token is configured.
Errors are JSON: ``{"error": "<what was wrong and what to do>", "status": <code>}``.
LSNs are given both as text (``16/B374D848``) and as numbers.

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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from tidemark.api.shape_view import lsn_json, shape_json
from tidemark.conninfo import redact_text
from tidemark.durable import full_disk
from tidemark.errors import ReplicationError, ShapeConflict, ShapeError, TidemarkError
from tidemark.lsn import Lsn
from tidemark.shapes.model import ShapeDefinition

if TYPE_CHECKING:
    from tidemark.api.port import ServiceView

log = structlog.get_logger("tidemark.api")
SERVICE: web.AppKey[ServiceView] = web.AppKey("service")
MAX_WAIT_S = 300.0
MUTATIONS: web.AppKey[asyncio.Lock] = web.AppKey("mutations")


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        return error(exc.status, exc.reason or "error")
    except ShapeConflict as exc:
        return error(409, str(exc))
    except ShapeError as exc:
        return error(400, str(exc))
    except psycopg.OperationalError as exc:
        dsn = request.app[SERVICE].settings.source.dsn
        return error(
            503,
            f"the source database cannot be reached: {redact_text(str(exc).strip(), dsn)}; "
            "try again once it is back",
        )
    except TidemarkError as exc:
        log.error("api.failed", path=request.path, error=str(exc), exc_info=exc)
        return error(500, str(exc))
    except Exception as exc:  # a bug: say so, keep the details in the log
        log.error("api.failed", path=request.path, error=repr(exc), exc_info=exc)
        return error(
            500,
            f"internal error while serving {request.method} {request.path}; the service "
            "log has the details (event api.failed)",
        )


def _authorized(request: web.Request) -> web.Response | None:
    token = request.app[SERVICE].settings.http.admin_token
    if not token:
        return None
    given = request.headers.get("Authorization", "")
    if not given.startswith("Bearer "):
        return error(401, "this endpoint needs 'Authorization: Bearer <admin token>'")
    if not hmac.compare_digest(given[len("Bearer ") :].encode(), token.encode()):
        return error(403, "the bearer token is not the configured admin token")
    return None


async def healthz(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "status": "ok",
            "phase": service.phase,
            "role": service.role,
            "uptime_s": round(time.time() - service.started_at, 1),
        }
    )


async def readyz(request: web.Request) -> web.Response:
    ready, reasons = request.app[SERVICE].readiness()
    body = {"ready": ready, "role": request.app[SERVICE].role, "reasons": reasons}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[SERVICE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def list_shapes(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    stalls = {s.name: s for s in service.stalled_shapes()}
    shapes = [shape_json(service, n, stalls) for n in sorted(service.shapes)]
    return web.json_response({"shapes": shapes})


async def show_shape(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["name"]
    if name not in service.shapes:
        return error(404, f"there is no shape {name!r}; GET /v1/shapes lists them")
    body = shape_json(service, name)
    body["tables"] = await asyncio.to_thread(_tables_of, service, name)
    return web.json_response(body)


def _tables_of(service: ServiceView, name: str) -> dict[str, Any] | None:
    """Where the shape's tables are (None before its first commit); read from the
    tables themselves, so only for one shape at a time."""
    from tidemark.errors import SinkError
    from tidemark.read import describe_tables

    try:
        return describe_tables(service.settings.sink.root, name, service.tables)
    except SinkError:
        return None


async def add_shape(request: web.Request) -> web.Response:
    if (denied := _authorized(request)) is not None:
        return denied
    service = request.app[SERVICE]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "the request body must be a JSON object with name and table")
    except RecursionError:
        return error(400, "the request body is nested too deeply to be a shape definition")
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object with name and table")
    unknown = set(body) - {"name", "table", "where", "columns", "replica"}
    if unknown:
        return error(400, f"unknown field(s) {sorted(unknown)}: allowed are name, table, "
                          "where, columns, replica")  # fmt: skip
    try:
        definition = ShapeDefinition.model_validate(body)
    except (ShapeError, ValidationError) as exc:
        return error(400, str(exc))
    async with request.app[MUTATIONS]:
        existing = service.registry.get(definition.name)
        if existing is not None and existing.definition != definition:
            return error(409, f"shape {definition.name!r} already exists with another "
                              "definition: DELETE it first")  # fmt: skip
        try:
            await service.add_shape(definition, origin="api")
        except ReplicationError as exc:  # e.g. a table outside a publication we may not alter
            return error(422, str(exc))
        except OSError as exc:  # the registry could not be written (a full disk): not added
            full = full_disk(Path(service.settings.sink.root))
            return error(507, f"shape {definition.name!r} was not added: {exc}. {full or ''}")
        if definition.name not in service.shapes:
            return error(409, f"shape {definition.name!r} was removed while it was being added")
        return web.json_response(shape_json(service, definition.name), status=201)


async def resync_shape(request: web.Request) -> web.Response:
    if (denied := _authorized(request)) is not None:
        return denied
    service = request.app[SERVICE]
    name = request.match_info["name"]
    async with request.app[MUTATIONS]:
        if name not in service.shapes:
            return error(404, f"there is no shape {name!r}; GET /v1/shapes lists them")
        await service.resync_shape(name)
        if name not in service.shapes:
            return error(409, f"shape {name!r} was removed while it was being resynced")
        return web.json_response(shape_json(service, name), status=202)


async def remove_shape(request: web.Request) -> web.Response:
    if (denied := _authorized(request)) is not None:
        return denied
    service = request.app[SERVICE]
    name = request.match_info["name"]
    async with request.app[MUTATIONS]:
        if name not in service.shapes and service.registry.get(name) is None:
            return error(404, f"there is no shape {name!r}; GET /v1/shapes lists them")
        await service.remove_shape(name)
        return web.Response(status=204)


def progress_json(service: ServiceView) -> dict[str, Any]:
    p = service.progress()
    sample = service.monitor.state.last if service.monitor else None
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
            "sampled_at": sample.taken_at,
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
    scheduler = service.scheduler
    if scheduler is None:
        return None
    stats = scheduler.stats
    waiting = scheduler.waiting_since
    return {
        "buffered_bytes": scheduler.buffered_bytes,
        "budget_bytes": scheduler.policy.memory_budget,
        "stage_jobs": stats.stage_jobs,
        "spooled_bytes": stats.spooled_bytes,
        "blocked_s": round(stats.blocked_seconds, 3),
        "waiting_s": None if waiting is None else round(time.monotonic() - waiting, 3),
        "open_streamed_transactions": service.collector.open_streams,
        "streamed_commits": service.collector.stats.streamed_commits,
        "streamed_aborts": service.collector.stats.streamed_aborts,
    }


async def progress(request: web.Request) -> web.Response:
    return web.json_response(progress_json(request.app[SERVICE]))


async def wait_progress(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    try:
        target = int(Lsn.parse(request.query["lsn"]))
    except KeyError:
        return error(400, "give the LSN to wait for: ?lsn=16/B374D848")
    except ValueError as exc:
        return error(400, str(exc))
    text = request.query.get("timeout", "30")
    try:
        timeout = float(text)
    except ValueError:
        timeout = math.nan
    if not (math.isfinite(timeout) and 0 <= timeout <= MAX_WAIT_S):
        return error(
            400,
            f"timeout={text!r} is not a number of seconds from 0 to {MAX_WAIT_S:g}: give "
            "e.g. timeout=30, and wait again for longer",
        )
    shape = request.query.get("shape")
    if shape is not None and shape not in service.shapes:
        return error(404, f"there is no shape {shape!r}; GET /v1/shapes lists them")
    deadline = asyncio.get_running_loop().time() + timeout
    monitor = service.monitor
    if monitor is None:
        return error(503, "the service is still starting")
    sample = await monitor.wait_for_lsn(target, timeout)
    while sample is not None and shape is not None:
        frontier = service.frontier(shape)
        if frontier is not None and frontier >= target:
            break
        if asyncio.get_running_loop().time() > deadline:
            sample = None
            break
        await asyncio.sleep(0.05)
    body = progress_json(service)
    body["target"] = lsn_json(target)
    body["reached"] = sample is not None
    return web.json_response(body, status=200 if sample is not None else 504)


def build_app(service: ServiceView) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024)
    app[SERVICE] = service
    app[MUTATIONS] = asyncio.Lock()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
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
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
