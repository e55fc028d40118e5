"""The HTTP API's description and its conventions, without Postgres or Spark.

- The OpenAPI document is valid OpenAPI 3.1, and its paths are exactly the routes the
  aiohttp app registers (a route added without its description fails here).
- Every problem kind is documented on some operation, under its own status.
- Errors are problem details: the server's own 404, 405, 413, 401 and 403 and the
  handlers' 400s, each with its stable ``type``, ``detail`` = ``error`` and ``instance``.
- Paging: walking the pages of any set of shapes, with any limit and filter, returns
  each matching shape once, in name order, even with shapes removed between pages.
- Times: ISO 8601 UTC to the millisecond, the same instant as the epoch beside it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st
from openapi_spec_validator import validate

from tidemark.api import problems
from tidemark.api.openapi import openapi_document
from tidemark.api.paging import MAX_LIMIT, BadQuery, ShapeQuery
from tidemark.api.server import MAX_WAIT_S, build_app
from tidemark.api.shape_view import SHAPE_STATES, epoch, iso_time, time_json
from tidemark.cli import _check
from tidemark.errors import TidemarkError
from tidemark.settings.config import Settings

TOKEN = "unit-token"
METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")


def registered_routes() -> set[tuple[str, str]]:
    app = build_app(SimpleNamespace())  # type: ignore[arg-type]
    return {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"  # aiohttp adds HEAD to GET
    }


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }


# -- the description ------------------------------------------------------------------


def test_the_description_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    validate(document)  # raises, naming the first problem
    assert document["openapi"].startswith("3.1")
    json.dumps(document)  # plain JSON: served as it is


def test_the_description_has_exactly_the_routes_the_server_registers() -> None:
    described = set(operations(openapi_document()))
    assert described == registered_routes()


def test_mutations_need_the_bearer_token_and_reads_do_not() -> None:
    document = openapi_document()
    scheme = document["components"]["securitySchemes"]["adminToken"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for (method, path), operation in operations(document).items():
        mutation = method != "get"
        assert ("security" in operation) is mutation, (method, path)
        assert ("401" in operation["responses"]) is mutation, (method, path)


def test_every_problem_kind_is_documented_under_its_status() -> None:
    document = openapi_document()
    responses = [
        response
        for operation in operations(document).values()
        for response in operation["responses"].values()
    ]
    responses += document["components"]["responses"].values()  # unknown path, method
    types_by_status: dict[str, set[str]] = {}
    for response in responses:
        content = response.get("content", {}).get(problems.CONTENT_TYPE)
        if content is not None and "allOf" in content["schema"]:
            members = content["schema"]["properties"]
            code = str(members["status"]["const"])
            types_by_status.setdefault(code, set()).update(members["type"]["enum"])
    for kind in problems.KINDS:
        assert kind.type in types_by_status.get(str(kind.status), set()), kind.slug
    assert len({k.slug for k in problems.KINDS}) == len(problems.KINDS)


def test_the_described_limits_are_the_servers() -> None:
    parameters = {
        (path, p["name"]): p["schema"]
        for (_, path), op in operations(openapi_document()).items()
        for p in op.get("parameters", [])
    }
    assert parameters[("/v1/progress/wait", "timeout")]["maximum"] == MAX_WAIT_S
    assert parameters[("/v1/shapes", "limit")]["maximum"] == MAX_LIMIT
    assert parameters[("/v1/shapes", "state")]["items"]["enum"] == list(SHAPE_STATES)


# -- errors over HTTP (a stub service: no shapes, a token) -----------------------------


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    settings = Settings.model_validate(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:9/none"},
            "sink": {"root": str(tmp_path)},
            "http": {"admin_token": TOKEN},
        }
    )
    service = SimpleNamespace(
        settings=settings,
        shapes={},
        registered=lambda name: None,
        shape_state=lambda name: ("active", None),
        stalled_shapes=lambda: [],
        monitoring=False,
    )
    server = TestServer(build_app(service))  # type: ignore[arg-type]
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield session, str(server.make_url(""))
    finally:
        await server.close()


async def ask(
    api: tuple[aiohttp.ClientSession, str], method: str, path: str, **kw: Any
) -> tuple[int, str, dict[str, Any], Any]:
    session, base = api
    async with session.request(method, base + path, **kw) as r:
        return r.status, r.content_type, dict(r.headers), await r.json(content_type=None)


async def test_each_kind_of_error_is_a_problem_with_its_own_type(
    api: tuple[aiohttp.ClientSession, str],
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    cases = {
        "no route": (("GET", "/v1/nothing"), {}, problems.NOT_FOUND),
        "no method": (("PUT", "/v1/shapes"), {}, problems.METHOD_NOT_ALLOWED),
        "too large": (
            ("POST", "/v1/shapes"),
            {"data": b" " * 70_000, "headers": bearer},
            problems.TOO_LARGE,
        ),
        "no token": (("POST", "/v1/shapes"), {"json": {}}, problems.UNAUTHORIZED),
        "other token": (
            ("DELETE", "/v1/shapes/x"),
            {"headers": {"Authorization": "Bearer x"}},
            problems.FORBIDDEN,
        ),
        "not json": (
            ("POST", "/v1/shapes"),
            {"data": b"name=s", "headers": bearer},
            problems.INVALID_BODY,
        ),
        "bad name": (
            ("POST", "/v1/shapes"),
            {"json": {"name": "A", "table": "t"}, "headers": bearer},
            problems.INVALID_SHAPE,
        ),
        "unknown shape": (("GET", "/v1/shapes/nope"), {}, problems.NOT_FOUND),
        "bad limit": (("GET", "/v1/shapes?limit=0"), {}, problems.INVALID_PARAMETER),
        "bad state": (("GET", "/v1/shapes?state=active,done"), {}, problems.INVALID_PARAMETER),
        "bad lsn": (("GET", "/v1/progress/wait?lsn=1/2/3"), {}, problems.INVALID_PARAMETER),
        "starting": (("GET", "/v1/progress/wait?lsn=0/1&timeout=0"), {}, problems.STARTING),
    }
    for label, ((method, path), kw, kind) in cases.items():
        status, content_type, headers, body = await ask(api, method, path, **kw)
        assert status == kind.status, (label, status, body)
        assert content_type == problems.CONTENT_TYPE, label
        assert body["type"] == kind.type and body["title"] == kind.title, (label, body)
        assert body["status"] == status and body["detail"] == body["error"] != "", label
        assert body["instance"] == path.split("?")[0], label
    # the instance is the path as a URI reference: percent-encoded
    status, _, _, body = await ask(api, "GET", "/v1/shapes/%C3%A9t%C3%A9%0D")
    assert status == 404 and body["instance"] == "/v1/shapes/%C3%A9t%C3%A9%0D"
    assert "there is no shape 'été\\r'" in body["detail"]
    status, _, headers, body = await ask(api, "PUT", "/v1/shapes")
    assert set(headers["Allow"].split(",")) == {"GET", "HEAD", "POST"}
    assert "it serves GET, HEAD, POST" in body["detail"]
    status, _, headers, _ = await ask(api, "POST", "/v1/shapes", json={})
    assert headers["WWW-Authenticate"].startswith("Bearer")


async def test_the_description_is_served_and_an_empty_list_is_one_last_page(
    api: tuple[aiohttp.ClientSession, str],
) -> None:
    status, content_type, _, served = await ask(api, "GET", "/v1/openapi.json")
    assert status == 200 and content_type == "application/json"
    assert served == openapi_document()
    status, _, _, listed = await ask(api, "GET", "/v1/shapes?state=active&limit=5")
    assert status == 200 and listed == {"shapes": [], "next_cursor": None}


def test_the_cli_prints_a_problems_detail_and_an_old_services_error() -> None:
    problem = problems.problem_json(problems.NOT_FOUND, "there is no shape 'x'", "/v1/x")
    with pytest.raises(TidemarkError, match=r"^there is no shape 'x' \(HTTP 404\)$"):
        _check(404, problem)
    with pytest.raises(TidemarkError, match=r"^old words \(HTTP 409\)$"):
        _check(409, {"error": "old words", "status": 409})
    with pytest.raises(TidemarkError, match=r"^Not found \(HTTP 404\)$"):
        _check(404, {"type": problems.NOT_FOUND.type, "title": "Not found", "status": 404})
    with pytest.raises(TidemarkError, match=r"^plain text \(HTTP 502\)$"):
        _check(502, "plain text")


# -- paging ---------------------------------------------------------------------------

names = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
shape_states = st.dictionaries(names, st.sampled_from(SHAPE_STATES), max_size=40)


@given(
    shapes=shape_states,
    limit=st.integers(1, 7),
    wanted=st.sets(st.sampled_from(SHAPE_STATES)),
    removed=st.sets(names, max_size=5),
)
def test_walking_the_pages_gives_every_matching_shape_once_in_order(
    shapes: dict[str, str], limit: int, wanted: set[str], removed: set[str]
) -> None:
    # given a filter and a page size, when a client follows next_cursor to the end
    # while shapes are removed after the first page
    query = ShapeQuery.parse([",".join(sorted(wanted))] if wanted else [], str(limit), None)
    seen: list[str] = []
    cursor: str | None = None
    current = dict(shapes)
    for page_number in range(len(shapes) + 2):
        page, cursor = ShapeQuery(query.states, query.limit, cursor).page(current)
        assert len(page) <= limit and (cursor is None or cursor == page[-1])
        seen += page
        if page_number == 0:
            current = {n: s for n, s in current.items() if n not in removed}
        if cursor is None:
            break
    # then the first page is the first matching names, and the rest every matching
    # name after it that was not removed meanwhile, in name order, each once
    matching = sorted(n for n, s in shapes.items() if not wanted or s in wanted)
    first = matching[:limit]
    rest = [n for n in matching[limit:] if n not in removed]
    assert seen == first + rest


def test_state_limit_and_cursor_are_checked() -> None:
    both = ShapeQuery.parse(["active", "error,backfilling"], None, None)
    assert both.states == {"active", "error", "backfilling"}
    assert ShapeQuery.parse([], "1000", "t_all") == ShapeQuery(None, 1000, "t_all")
    for states, limit, cursor, said in [
        (["done"], None, None, "state='done' is not a shape state"),
        (["active,"], None, None, "state=''"),
        ([], "0", None, "limit='0' is not a whole number from 1 to 1000"),
        ([], "1001", None, "from 1 to 1000"),
        ([], "1e3", None, "limit='1e3'"),
        ([], " 5", None, "limit=' 5'"),
        ([], "", None, "limit=''"),
        ([], None, "", "cursor='' is not a cursor"),
        ([], None, "../x", "cursor='../x'"),
        ([], None, "a\n", "cursor='a\\n'"),
    ]:
        with pytest.raises(BadQuery) as raised:
            ShapeQuery.parse(states, limit, cursor)
        assert said in str(raised.value)


# -- times ------------------------------------------------------------------------------


@given(st.floats(0, 4_102_444_800, allow_nan=False))  # to 2100
def test_a_time_is_iso_utc_to_the_millisecond_and_the_same_instant_as_its_epoch(
    ts: float,
) -> None:
    text = iso_time(ts)
    assert len(text) == 24 and text.endswith("Z") and text[19] == "."
    parsed = datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    assert abs(parsed - ts) <= 0.0005 + 1e-6
    event = time_json(ts, reason="r")
    assert event == {"at": text, "epoch": epoch(ts), "reason": "r"}
    assert abs(parsed - event["epoch"]) < 1e-6  # the same millisecond, not a neighbour


def test_a_time_and_its_epoch_round_a_half_millisecond_the_same_way() -> None:
    # round(ts, 3) gives ...441 here while the ISO string says ...442 (CI saw this)
    ts = 1795778477.4415
    event = time_json(ts)
    assert event is not None and event["at"].endswith(".442Z") and event["epoch"] == 1795778477.442


def test_times_round_to_the_nearest_millisecond_across_a_second() -> None:
    assert iso_time(1_795_755_600.9996) == "2026-11-27T05:00:01.000Z"
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"
    assert time_json(None) is None


# -- the reference page -----------------------------------------------------------------


def test_the_reference_page_renders_every_operation_and_problem_type() -> None:
    from tests.unit.project.test_docs_reference import ROOT, load_hooks

    hooks = load_hooks()
    page = (ROOT / "docs" / "reference" / "http-api.md").read_text()
    assert "<!-- generated: openapi -->" in page and "<!-- generated: problems -->" in page
    table = hooks.openapi_markdown()
    for method, path in operations(openapi_document()):
        assert f"| `{method.upper()} {path}` |" in table
    assert "401 `unauthorized`" in table and "200 `ShapeList`" in table
    kinds = hooks.problems_markdown()
    for kind in problems.KINDS:
        assert f"| `{kind.slug}` | {kind.status} |" in kinds
