"""The JSON Schemas (2020-12, as OpenAPI 3.1 uses them) of what the HTTP API sends
and accepts: a shape, its definition, progress, health, readiness, problems.

Each describes what ``shape_view`` and ``server`` build, member by member: the
integration test runs the service against them with every object closed, so a member
added in the code and not here (or the other way round) fails it. The published schemas
stay open (no ``additionalProperties: false`` on responses): a client must ignore
members it does not know, and new ones may come.

``SCHEMAS`` is what ``openapi.py`` puts under ``components/schemas``; ``ref`` points
at one of them.
"""

from __future__ import annotations

from typing import Any

from tidemark.api.problems import KINDS
from tidemark.api.shape_view import SHAPE_STATES

SHAPE_NAME_PATTERN = "^[a-z_][a-z0-9_]{0,62}$"
LSN_PATTERN = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """``schema`` or null."""
    if "$ref" in schema or "type" not in schema:
        return {"anyOf": [schema, {"type": "null"}]}
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return {**schema, "type": [*types, "null"]}


def obj(properties: dict[str, Schema], description: str = "", **more: Any) -> Schema:
    """An object with every one of ``properties`` present (nullable ones may be null)."""
    schema: Schema = {"type": "object", "required": list(properties), "properties": properties}
    if description:
        schema["description"] = description
    return {**schema, **more}


COUNT: Schema = {"type": "integer", "minimum": 0}
BYTES: Schema = {"type": "integer", "minimum": 0}
SECONDS: Schema = {"type": "number", "minimum": 0}
TEXT: Schema = {"type": "string"}
PHASE: Schema = {
    "type": "string",
    "description": "starting, standby, streaming, stopping, stopped or failed",
}
ROLE: Schema = {"enum": ["leader", "standby"]}
ISO_TIME: Schema = {
    "type": "string",
    "format": "date-time",
    "description": "ISO 8601 UTC to the millisecond, e.g. 2026-11-27T05:00:00.123Z",
}
EPOCH: Schema = {"type": "number", "description": "the same time as Unix seconds"}


def _time(description: str, **more: Schema) -> Schema:
    return obj({"at": ISO_TIME, "epoch": EPOCH, **more}, description)


_LSN = obj(
    {
        "lsn": {"type": "string", "pattern": LSN_PATTERN, "examples": ["16/B374D848"]},
        "value": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1},
    },
    "a WAL position, as Postgres prints it and as a number",
)

_DEFINITION = obj(
    {
        "name": {
            "type": "string",
            "pattern": SHAPE_NAME_PATTERN,
            "description": "names the shape's tables' folders and its metric label",
        },
        "table": {
            "type": "string",
            "minLength": 1,
            "description": "the source table, `schema.table` or `table` (meaning public)",
        },
        "where": nullable({"type": "string", "description": "SQL predicate on the rows"}),
        "columns": nullable(
            {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
                "description": "columns to keep (the primary key always is); `x::text` or "
                "`amount::numeric(18,4)` declares a column's lake type",
            }
        ),
        "replica": {"enum": ["default", "full"], "default": "default"},
    },
    "a shape as a user defines it",
    additionalProperties=False,
)
_DEFINITION["required"] = ["name", "table"]

_BACKFILL = obj(
    {
        "phase": {
            "type": "string",
            "description": "queued, snapshot, reading, committing or catching_up",
        },
        "reason": {"type": "string", "description": "why the shape is being backfilled"},
        "rows_done": COUNT,
        "rows_estimated": COUNT,
        "chunks_done": COUNT,
        "chunks": COUNT,
        "snapshot_retakes": COUNT,
        "elapsed_s": SECONDS,
    },
    "the running (or failed) backfill",
)

_CONTINUITY = obj(
    {
        "since": nullable({**ISO_TIME, "description": "when its last backfill committed"}),
        "since_epoch": nullable(EPOCH),
        "from": nullable(ref("Lsn")),
        "stream": nullable(
            obj(
                {
                    "system_id": TEXT,
                    "timeline": COUNT,
                    "slot": TEXT,
                    "epoch": COUNT,
                },
                "the replication stream the claim was made on",
            )
        ),
        "last_invalidation": nullable(_time("when and why its previous claim ended", reason=TEXT)),
    },
    "since when, and from which snapshot, the shape's table holds every change",
)

_CURRENT = obj(
    {
        "folded": nullable(ref("Lsn")),
        "lag_bytes": nullable(BYTES),
        "lag_s": nullable(SECONDS),
        "rows_waiting": COUNT,
    },
    "the current-state table: how far it is folded",
)

_SHAPE_PROPERTIES: dict[str, Schema] = {
    **_DEFINITION["properties"],
    "replica": {"enum": ["default", "full"]},
    "origin": {"enum": ["config", "api"], "description": "where the shape was declared"},
    "state": {"enum": list(SHAPE_STATES)},
    "error": nullable({"type": "string", "description": "the cause, and when it is retried"}),
    "ready": {"type": "boolean", "description": "it follows the stream (state active)"},
    "reason": nullable(
        {"type": "string", "description": "why it is not ready, or what holds it back"}
    ),
    "stalled": {"type": "boolean"},
    "frontier": nullable(ref("Lsn")),
    "lag_bytes": nullable(BYTES),
    "lag_s": nullable(SECONDS),
    "committed": nullable(ref("Lsn")),
    "rows_backfilled": nullable(COUNT),
    "rows_committed": COUNT,
    "pending_rows": COUNT,
    "last_commit": nullable(_time("its latest stream or backfill commit", age_s=SECONDS)),
    "columns_as_text": {
        "type": "array",
        "items": obj({"column": TEXT, "type": TEXT}),
    },
    "backfill": nullable(ref("Backfill")),
    "continuity": ref("Continuity"),
    "current": nullable(ref("Current")),
}

_SHAPE = obj(_SHAPE_PROPERTIES, "a shape: its definition, state and progress")

_TABLES = obj(
    {
        "shape": TEXT,
        "format": {"enum": ["delta", "iceberg"]},
        "frontier": nullable(ref("Lsn")),
        "changelog": obj(
            {
                "path": TEXT,
                "name": TEXT,
                "version": {
                    "type": "integer",
                    "description": "Delta version or Iceberg snapshot id",
                },
                "generation": COUNT,
                "files": COUNT,
                "primary_key": {"type": "array", "items": TEXT},
                "schema": {"type": "array", "items": obj({"name": TEXT, "type": TEXT})},
            }
        ),
        "current": nullable(
            obj(
                {
                    "path": TEXT,
                    "name": TEXT,
                    "version": {"type": "integer"},
                    "folded": nullable(ref("Lsn")),
                    "lag_bytes": {
                        **nullable(COUNT),
                        "description": "WAL bytes between the folded LSN and the frontier",
                    },
                    "rows_waiting": {
                        **nullable(COUNT),
                        "description": "the changelog's rows past the folded LSN (whole "
                        "files counted): 0 when a plain reader of the current table sees "
                        "every committed change",
                    },
                }
            )
        ),
    },
    "where the shape's tables are, read from the tables",
)

_SHAPE_DETAIL = obj(
    {**_SHAPE_PROPERTIES, "tables": nullable(ref("Tables"))},
    "a shape, and where its tables are (null before its first commit)",
)

_SHAPE_LIST = obj(
    {
        "shapes": {"type": "array", "items": ref("Shape")},
        "next_cursor": nullable(
            {
                "type": "string",
                "description": "pass as `cursor` for the next page; null on the last",
            }
        ),
    },
    "shapes in name order",
)

_POSTGRES = obj(
    {
        "current_wal": nullable(ref("Lsn")),
        "write": nullable(ref("Lsn")),
        "flush": nullable(ref("Lsn")),
        "replay": nullable(ref("Lsn")),
        "confirmed_flush": nullable(ref("Lsn")),
        "restart": nullable(ref("Lsn")),
        "wal_status": nullable(TEXT),
        "safe_wal_size": nullable({"type": "integer"}),
        "retained_wal_bytes": nullable(BYTES),
        "lag_bytes": nullable(BYTES),
        "replay_lag_s": nullable({"type": "number"}),
        "sampled_at": ISO_TIME,
        "sampled_at_epoch": EPOCH,
        "age_s": SECONDS,
    },
    "Postgres's view of the slot, as the monitor last sampled it",
)

_HISTORY = obj(
    {
        "interval_s": {"type": "number", "exclusiveMinimum": 0},
        "points": {
            "type": "array",
            "description": "the closed intervals of the last 15 minutes, oldest first",
            "items": obj(
                {
                    "at": ISO_TIME,
                    "epoch": EPOCH,
                    "ack_lag_s": nullable(SECONDS),
                    "rows_per_s": SECONDS,
                },
                "one interval, ending at `at`: the longest acknowledgement lag of a "
                "transaction acknowledged in it (null: none was) and the rows committed "
                "to the shape tables a second",
            ),
        },
    },
    "the last minutes, interval by interval (the status page's sparklines)",
)

_MEMORY = obj(
    {
        "buffered_bytes": BYTES,
        "budget_bytes": BYTES,
        "stage_jobs": COUNT,
        "spooled_bytes": BYTES,
        "blocked_s": SECONDS,
        "waiting_s": nullable(SECONDS),
        "open_streamed_transactions": COUNT,
        "streamed_commits": COUNT,
        "streamed_aborts": COUNT,
    },
    "buffered bytes against the budget",
)

_PROGRESS_PROPERTIES: dict[str, Schema] = {
    "phase": PHASE,
    "role": ROLE,
    "received": ref("Lsn"),
    "flushed": ref("Lsn"),
    "applied": ref("Lsn"),
    "postgres": nullable(ref("PostgresSample")),
    "frontiers": {"type": "object", "additionalProperties": ref("Lsn")},
    "violations": {"type": "array", "items": obj({"kind": TEXT, "message": TEXT})},
    "memory": nullable(ref("Memory")),
}

_WAIT_PROPERTIES: dict[str, Schema] = {
    **_PROGRESS_PROPERTIES,
    "target": ref("Lsn"),
    "reached": {"type": "boolean"},
}

_PROBLEM_PROPERTIES: dict[str, Schema] = {
    "type": {
        "type": "string",
        "format": "uri",
        "description": "the kind of error; stable",
        "examples": [k.type for k in KINDS],
    },
    "title": {"type": "string", "description": "the kind's title"},
    "status": {"type": "integer", "minimum": 400, "maximum": 599},
    "detail": {"type": "string", "description": "what was wrong, with what value, what to do"},
    "instance": {"type": "string", "format": "uri-reference", "description": "the path"},
    "error": {
        "type": "string",
        "description": 'the same as detail, for clients of `{"error", "status"}`',
    },
}

_PROBLEM = obj(
    _PROBLEM_PROPERTIES,
    "an error, as RFC 9457 problem details",
)
_PROBLEM["required"] = ["type", "title", "status", "detail", "error"]

_WAIT_TIMEOUT = obj(
    {**_WAIT_PROPERTIES, **_PROBLEM_PROPERTIES},
    "a wait that timed out: a problem, with the progress seen at the end",
)
_WAIT_TIMEOUT["required"] = [*_WAIT_PROPERTIES, *_PROBLEM["required"]]

SCHEMAS: dict[str, Schema] = {
    "Lsn": _LSN,
    "ShapeDefinition": _DEFINITION,
    "Shape": _SHAPE,
    "ShapeDetail": _SHAPE_DETAIL,
    "ShapeList": _SHAPE_LIST,
    "Backfill": _BACKFILL,
    "Continuity": _CONTINUITY,
    "Current": _CURRENT,
    "Tables": _TABLES,
    "Health": obj(
        {
            "status": {"const": "ok"},
            "phase": PHASE,
            "role": ROLE,
            "started_at": ISO_TIME,
            "started_at_epoch": EPOCH,
            "uptime_s": SECONDS,
        },
        "the process answers",
    ),
    "Readiness": obj(
        {
            "ready": {"type": "boolean"},
            "role": ROLE,
            "reasons": {"type": "array", "items": TEXT},
        },
        "whether the service is ready, and if not, why",
    ),
    "Progress": obj(
        {**_PROGRESS_PROPERTIES, "history": ref("History")},
        "how far the stream is, Postgres's view, and the last minutes",
    ),
    "History": _HISTORY,
    "PostgresSample": _POSTGRES,
    "Memory": _MEMORY,
    "WaitResult": obj(_WAIT_PROPERTIES, "progress once the wait ended; reached: true"),
    "Problem": _PROBLEM,
    "WaitTimeout": _WAIT_TIMEOUT,
}
