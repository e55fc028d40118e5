"""The running service answers as its OpenAPI description says (real Postgres, real
Spark), found by property-based requests (schemathesis, from ``GET /v1/openapi.json``).

For every operation, valid requests (positive) and requests that break the description
(negative: a wrong type, a missing parameter, a value out of range, an unknown field)
are sent with the admin token, and every answer is checked: no 5xx (but a wait's 504
and a readiness probe's 503, which are answers), a status the operation documents, the
documented content type and headers, a body its schema accepts, and a 4xx for every
request the description forbids.

The description is served open (clients ignore members they do not know); here every
object of it is closed (``unevaluatedProperties: false``), so a member the code sends
and the description lacks fails too. Waits are kept short: positive requests to
``/v1/progress/wait`` always give a timeout of at most 0.25 s (a request that breaks the
description is refused before it waits).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tidemark.api.openapi import openapi_document

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for

TOKEN = "schema-token"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,  # a request the description forbids gets a 4xx
]
# the 5xx answers that are no server error: a readiness probe that says "not ready",
# a wait that timed out
INTENDED_5XX = {"/readyz": "503", "/v1/progress/wait": "504"}
CONFIG = schemathesis.Config.from_dict(
    {
        "operations": [
            {
                "include-path": path,
                "checks": {
                    "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", status]}
                },
            }
            for path, status in INTENDED_5XX.items()
        ]
    }
)
EXAMPLES = 100  # per operation and mode: about 1,200 requests, 15 s
WAIT_MAX_S = 0.25  # x 100 valid waits, most of them for an LSN far ahead


def closed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with every object schema that names its members closed to others."""
    document = copy.deepcopy(document)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["unevaluatedProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(document["components"])
    close(document["paths"])
    return document


def with_short_waits(document: dict[str, Any]) -> dict[str, Any]:
    """The wait's ``timeout`` required and at most ``WAIT_MAX_S`` (for valid requests)."""
    document = copy.deepcopy(document)
    for parameter in document["paths"]["/v1/progress/wait"]["get"]["parameters"]:
        if parameter["name"] == "timeout":
            parameter["required"] = True
            parameter["schema"]["maximum"] = WAIT_MAX_S
    return document


def fuzz(base: str, examples: int) -> tuple[list[str], dict[str, int]]:
    """Every operation, positive then negative; the failures, and requests per operation."""
    with urllib.request.urlopen(f"{base}/v1/openapi.json", timeout=10) as answer:
        served = json.loads(answer.read())
    assert served == openapi_document()
    documents = {
        GenerationMode.POSITIVE: closed(with_short_waits(served)),
        GenerationMode.NEGATIVE: closed(served),
    }
    failures: list[str] = []
    sent: dict[str, int] = {}
    for mode, document in documents.items():
        schema = schemathesis.openapi.from_dict(document, config=CONFIG)
        for result in schema.get_all_operations():
            operation = result.ok()
            label = f"{operation.label} ({mode.value})"
            if mode is GenerationMode.NEGATIVE and not takes_input(document, operation):
                continue  # nothing to get wrong
            sent[label] = 0
            started = time.monotonic()
            try:
                requests_to(operation, mode, base, examples, sent, label)
            except (AssertionError, BaseExceptionGroup, requests.RequestException) as exc:
                failures.append(f"{label}: {exc}")  # the shrunk failure, with its curl
            print(f"{label}: {sent[label]} requests, {time.monotonic() - started:.1f}s")
    return failures, sent


def takes_input(document: dict[str, Any], operation: Any) -> bool:
    item = document["paths"][operation.path]
    described = item[operation.method.lower()]
    return bool(item.get("parameters") or described.get("parameters") or "requestBody" in described)


def requests_to(
    operation: Any, mode: GenerationMode, base: str, examples: int, sent: dict[str, int], label: str
) -> None:
    """Up to ``examples`` requests to ``operation``, each answer checked (raises the
    first failure hypothesis shrank)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        sent[label] += 1
        case.call_and_validate(base_url=base, headers=headers, checks=CHECKS, timeout=60)

    check()


@one_server()  # the API is tidemark's own, not the server version's
async def test_the_service_answers_as_its_openapi_description_says(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a service with two shapes that follow the stream, and an admin token
    pg_db.execute(
        "create table t (id int primary key, v text);"
        "insert into t select g, 'v' || g from generate_series(1, 100) g"
    )
    shapes = [
        {"name": "t_all", "table": "public.t"},
        {"name": "t_low", "table": "public.t", "where": "id < 10"},
    ]
    settings_ = settings_for(pg_db.dsn, str(tmp_path), shapes, http={"admin_token": TOKEN})
    async with running_service(settings_, spark) as service:
        async with asyncio.timeout(120):
            while not all(service.frontier(n) is not None for n in ("t_all", "t_low")):
                await asyncio.sleep(0.1)
        pg_db.execute("update t set v = 'w' where id < 5")
        await asyncio.sleep(0.5)  # some shapes now have a last commit, one has lag
        base = f"http://127.0.0.1:{service.http_port}"
        # when schemathesis sends what the description allows, and what it does not
        started = time.monotonic()
        failures, sent = await asyncio.to_thread(fuzz, base, EXAMPLES)
        took = time.monotonic() - started
        # then every answer is one the description has
        assert not failures, "\n\n".join(failures)
        assert len(sent) > len(openapi_document()["paths"]) and all(sent.values()), sent
        print(f"schemathesis: {sum(sent.values())} requests in {took:.1f}s")
        # and the service still streams: its shapes (those the requests left) follow
        assert service.phase == "streaming"
        pg_db.execute("insert into t values (1000, 'after')")
        lsn = current_lsn(pg_db.dsn)
        followers = {n for n in ("t_all", "t_low") if n in service.shapes}
        async with asyncio.timeout(120):
            while not all((service.frontier(n) or -1) >= lsn for n in followers):
                await asyncio.sleep(0.05)
