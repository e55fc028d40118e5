"""The HTTP API answers every user mistake with a clear 4xx, never a 500 (real
Postgres, real Spark): malformed and oversized bodies, predicates beyond the size and
depth limits, bad query parameters, a resync racing a remove, a shape that never
started, a table outside a publication tidemark may not change. Each answer is a
problem (RFC 9457) of its own stable type. A long OR that is within the limits works,
and its table equals the query on Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg import sql

from tidemark.api import problems
from tidemark.api.problems import ProblemKind
from tidemark.demo.verify import compare_shape
from tidemark.errors import ShapeError
from tidemark.lsn import Lsn
from tidemark.predicates.compiler import MAX_PREDICATE_DEPTH, MAX_PREDICATE_TOKENS

from .conftest import PgDatabase
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

TOKEN = "s3cret-token"

# timeouts the wait refuses before it waits (URL-encoded): out of range, not numbers, and
# what Python's float() takes but a JSON number is not (another script's digits, '١٢٠',
# underscores, blanks around it)
BAD_TIMEOUTS = ("nan", "inf", "-inf", "-1", "1e999", "abc", "", "301")
BAD_TIMEOUTS += ("%D9%A1%D9%A2%D9%A0", "1_20", "%20120", "120%20", "0x10")


async def call(
    service: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    token: str | None = TOKEN,
) -> tuple[int, Any]:
    status, _, answer = await call_typed(service, method, path, body, raw=raw, token=token)
    return status, answer


async def call_typed(
    service: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    token: str | None = TOKEN,
) -> tuple[int, str, Any]:
    """The status, the content type and the body (JSON when it is)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://127.0.0.1:{service.http_port}{path}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None:
        headers["Content-Type"] = "application/json"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, data=data, headers=headers) as r,
    ):
        text = await r.text()
        try:
            return r.status, r.content_type, json.loads(text) if text else None
        except ValueError:
            return r.status, r.content_type, text


def long_or(terms: int) -> str:
    return " OR ".join(f"id = {i * 3}" for i in range(terms))


async def test_bad_requests_get_a_clear_4xx_and_a_long_or_works(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg_db.execute("create table t (id int primary key, v text)")
    pg_db.execute("insert into t select g, 'v' || g from generate_series(1, 3000) g")
    pg_db.execute("create unlogged table scratch (id int primary key)")
    settings = settings_for(
        pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "t"}], http={"admin_token": TOKEN}
    )
    async with running_service(settings, spark) as service:
        answers: dict[str, tuple[int, str, Any]] = {}

        async def ask(label: str, method: str, path: str, body: Any = None, **kw: Any) -> None:
            answers[label] = await call_typed(service, method, path, body, **kw)

        shape = {"name": "s", "table": "t"}
        # bodies
        await ask("deep json", "POST", "/v1/shapes", raw=b"[" * 30_000 + b"]" * 30_000)
        await ask("deep json 2", "POST", "/v1/shapes", raw=b'{"name": ' + b"[" * 30_000)
        nested_field = b'{"name": "s", "table": "t", "where": ' + b"[" * 15_000 + b"]" * 15_000
        await ask("deep json field", "POST", "/v1/shapes", raw=nested_field + b"}")
        await ask("too big", "POST", "/v1/shapes", raw=b" " * 70_000 + b"{}")
        await ask("not json", "POST", "/v1/shapes", raw=b"name=s&table=t")
        await ask("not utf8", "POST", "/v1/shapes", raw=b'{"name": "\xff"}')
        await ask("a list", "POST", "/v1/shapes", [shape])
        await ask("name type", "POST", "/v1/shapes", {"name": ["s"], "table": "t"})
        await ask("where type", "POST", "/v1/shapes", {**shape, "where": {"id": 1}})
        # predicates over the limits
        deep = "(" * 3000 + "id = 1" + ")" * 3000
        await ask("3000 parens", "POST", "/v1/shapes", {**shape, "where": deep})
        await ask("3000 nots", "POST", "/v1/shapes", {**shape, "where": "NOT " * 3000 + "true"})
        chain = "id = " + " + ".join(["id"] * 500)
        await ask("plus chain", "POST", "/v1/shapes", {**shape, "where": chain})
        many = "id IN (" + "1," * (MAX_PREDICATE_TOKENS // 2 + 5) + "1)"
        await ask("too many tokens", "POST", "/v1/shapes", {**shape, "where": many})
        # definitions Postgres could not serve
        await ask("unlogged", "POST", "/v1/shapes", {"name": "u", "table": "scratch"})
        await ask("system", "POST", "/v1/shapes", {"name": "c", "table": "pg_catalog.pg_class"})
        huge = {**shape, "where": "id = 1e999999"}
        await ask("numeric overflow", "POST", "/v1/shapes", huge)
        long_number = {**shape, "where": "id = 9" + "9" * 5000}
        await ask("5001 digits", "POST", "/v1/shapes", long_number)
        # query parameters
        lsn = str(Lsn(current_lsn(pg_db.dsn)))
        for value in BAD_TIMEOUTS:
            await ask(f"timeout={value}", "GET", f"/v1/progress/wait?lsn={lsn}&timeout={value}")
        await ask("no lsn", "GET", "/v1/progress/wait")
        await ask("bad lsn", "GET", "/v1/progress/wait?lsn=1/2/3")
        await ask("huge lsn", "GET", "/v1/progress/wait?lsn=FFFFFFFFF/0")
        await ask("unknown shape", "GET", f"/v1/progress/wait?lsn={lsn}&shape=nope")
        # (an LSN far ahead: a request taken would wait its 2 s and answer 504)
        ahead = "FFFFFFFF/0"
        await ask("unknown parameter", "GET", f"/v1/progress/wait?lsn={ahead}&timeout=2&x=1")
        twice = f"/v1/progress/wait?lsn={ahead}&timeout=2&timeout=200"
        await ask("timeout twice", "GET", twice)
        # paths and methods
        await ask("no path", "GET", "/v1/nothing")
        await ask("wrong method", "PUT", "/v1/shapes")
        await ask("odd name", "GET", "/v1/shapes/..%2F..%2Fetc")
        await ask("remove unknown", "DELETE", "/v1/shapes/nope")
        await ask("resync unknown", "POST", "/v1/shapes/nope/resync")
        await ask("bad state", "GET", "/v1/shapes?state=active&state=gone")
        await ask("bad limit", "GET", "/v1/shapes?limit=1001")
        await ask("bad cursor", "GET", "/v1/shapes?limit=1&cursor=..%2Fetc")

        wrong: list[tuple[str, int, str, Any]] = []

        def expect(label: str, kind: ProblemKind, text: str = "") -> None:
            got, content_type, body = answers[label]
            if not (
                got == kind.status
                and content_type == problems.CONTENT_TYPE
                and isinstance(body, dict)
                and body["type"] == kind.type
                and body["status"] == kind.status
                and text in body["detail"]
                and body["error"] == body["detail"]  # what clients of {"error"} read
            ):
                shown = body if isinstance(body, dict) else str(body)[:80]
                wrong.append((label, got, content_type, shown))

        body, shape_ = problems.INVALID_BODY, problems.INVALID_SHAPE
        expect("deep json", body, "nested too deeply")
        expect("deep json 2", body)
        expect("deep json field", body)
        expect("too big", problems.TOO_LARGE)
        expect("not json", body, "JSON object")
        expect("not utf8", body)
        expect("a list", body, "JSON object")
        expect("name type", shape_, "name")
        expect("where type", shape_, "where")
        expect("3000 parens", shape_, f"at most {MAX_PREDICATE_DEPTH} levels")
        expect("3000 nots", shape_, f"at most {MAX_PREDICATE_DEPTH} levels")
        expect("plus chain", shape_, f"at most {MAX_PREDICATE_DEPTH} levels")
        expect("too many tokens", shape_, f"at most {MAX_PREDICATE_TOKENS:,} tokens")
        expect("unlogged", shape_, "SET LOGGED")
        expect("system", shape_, "system catalog")
        expect("numeric overflow", shape_, "overflows Postgres's numeric format")
        assert answers["5001 digits"][0] == 201, answers["5001 digits"]  # numeric, not int
        parameter, not_found = problems.INVALID_PARAMETER, problems.NOT_FOUND
        for value in BAD_TIMEOUTS:
            expect(f"timeout={value}", parameter, "from 0 to 300")
        expect("no lsn", parameter, "?lsn=")
        expect("bad lsn", parameter, "invalid LSN")
        expect("huge lsn", parameter)
        expect("unknown shape", not_found)
        expect("unknown parameter", parameter, "unknown query parameter 'x'")
        expect("timeout twice", parameter, "timeout is given more than once")
        expect("no path", not_found, "GET /v1/openapi.json describes every path")
        expect("wrong method", problems.METHOD_NOT_ALLOWED, "PUT is not served at /v1/shapes")
        expect("odd name", not_found)
        expect("remove unknown", not_found, "there is no shape 'nope'")
        expect("resync unknown", not_found, "there is no shape 'nope'")
        expect("bad state", parameter, "state='gone' is not a shape state")
        expect("bad limit", parameter, "limit='1001'")
        expect("bad cursor", parameter, "cursor='../etc'")
        assert wrong == [], "\n".join(map(str, wrong))
        assert sorted(service.shapes) == ["s", "t_all"]  # nothing was half-added

        # a 2,000-term OR is within the limits: added, backfilled, then followed
        status, created = await call(
            service, "POST", "/v1/shapes", {"name": "picked", "table": "t", "where": long_or(2000)}
        )
        assert status == 201, created
        pg_db.execute("update t set v = v || '!' where id % 2 = 0")
        pg_db.execute("delete from t where id % 5 = 0")
        pg_db.execute("insert into t select g, 'w' from generate_series(3001, 6500) g")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    query = f"select id, v from t where {long_or(2000)}"
    comparison = compare_shape(spark, str(tmp_path), "picked", query, pg_db.dsn)
    assert comparison.equal, comparison.describe()
    assert comparison.expected_rows > 1000


async def test_a_resync_racing_a_remove_is_refused_or_cancelled_not_a_crash(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg_db.execute("create table t (id int primary key, v text)")
    pg_db.execute("insert into t select g, 'x' from generate_series(1, 50) g")
    settings = settings_for(
        pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "t"}], http={"admin_token": TOKEN}
    )
    async with running_service(settings, spark) as service:
        # over HTTP: resync and remove sent together, several times
        for round_ in range(5):
            name = f"racer_{round_}"
            status, body = await call(service, "POST", "/v1/shapes", {"name": name, "table": "t"})
            assert status == 201, body
            (resync, _), (remove, _) = await asyncio.gather(
                call(service, "POST", f"/v1/shapes/{name}/resync"),
                call(service, "DELETE", f"/v1/shapes/{name}"),
            )
            assert resync in (202, 404, 409) and remove == 204, (resync, remove)
            assert name not in service.shapes
        # in the service itself (as the stream's automatic resync does): the resync only
        # queues a rebuild, and a remove landing before that rebuild runs cancels it
        status, body = await call(service, "POST", "/v1/shapes", {"name": "late", "table": "t"})
        assert status == 201, body
        queued = await service.resync_shape("late")
        assert queued.backfills_wanted > queued.backfills_done
        await service.remove_shape("late")
        await asyncio.sleep(1.0)  # the queued rebuild had its chance to run
        assert "late" not in service.shapes
        with pytest.raises(ShapeError, match="no shape 'late'"):
            await service.resync_shape("late")
        # and the API still answers with exactly the shape that is left (whether the
        # stream then moves on is issue 12's "removal during a backfill", not tested here)
        status, shapes = await call(service, "GET", "/v1/shapes")
        assert status == 200 and [s["name"] for s in shapes["shapes"]] == ["t_all"]


async def test_resyncing_a_shape_that_never_started_says_what_to_do(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a shape added at runtime whose table was gone when tidemark started again
    pg_db.execute("create table keep (id int primary key); create table t (id int primary key)")
    settings = settings_for(
        pg_db.dsn, str(tmp_path), [{"name": "keep", "table": "keep"}], http={"admin_token": TOKEN}
    )
    async with running_service(settings, spark) as service:
        added = await call(service, "POST", "/v1/shapes", {"name": "t_all", "table": "t"})
        assert added[0] == 201, added
    pg_db.execute("drop table t")
    async with running_service(settings, spark) as service:
        assert service.shapes["t_all"].state == "error"
        pg_db.execute("create table t (id int primary key)")
        # when an operator asks for a resync
        status, body = await call(service, "POST", "/v1/shapes/t_all/resync")
        # then a conflict that says how to bring it back, and that way works
        assert status == 409 and "remove it and add it again" in body["detail"], body
        assert body["type"] == problems.SHAPE_CONFLICT.type
        assert (await call(service, "DELETE", "/v1/shapes/t_all"))[0] == 204
        status, body = await call(service, "POST", "/v1/shapes", {"name": "t_all", "table": "t"})
        assert status == 201, body


@contextlib.contextmanager
def non_owner_role(db: PgDatabase, tables: list[str]) -> Any:
    """A LOGIN REPLICATION role that owns nothing, with SELECT on ``tables``."""
    role, password = f"tm_api_{secrets.token_hex(4)}", secrets.token_hex(8)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("create role {} login replication password {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        for table in tables:
            conn.execute(
                sql.SQL("grant select on {} to {}").format(
                    sql.Identifier(table), sql.Identifier(role)
                )
            )
    try:
        yield db.server.dsn_for(db.name, role, password)
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                (role,),
            )
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


async def test_a_table_outside_a_fixed_publication_is_refused_with_the_statement_to_run(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a publication the DBA made, which tidemark must not change
    pg_db.execute(
        "create table inside (id int primary key, v text);"
        "create table outside (id int primary key, v text);"
        "insert into outside select g, 'o' from generate_series(1, 100) g;"
        "create publication tm_e2e for table inside"
    )
    with non_owner_role(pg_db, ["inside", "outside"]) as dsn:
        settings = settings_for(
            dsn,
            str(tmp_path),
            [{"name": "inside", "table": "inside"}],
            source={"create_publication": False},
            http={"admin_token": TOKEN},
        )
        async with running_service(settings, spark) as service:
            # when a shape on a table outside it is asked for
            status, body = await call(
                service, "POST", "/v1/shapes", {"name": "out", "table": "outside"}
            )
            # then 422 with the exact statement, and nothing changed or registered
            assert status == 422, body
            assert "ALTER PUBLICATION tm_e2e ADD TABLE public.outside;" in body["detail"]
            assert body["type"] == problems.SOURCE_CANNOT_SERVE.type
            assert "out" not in service.shapes and service.registry.get("out") is None
            published = pg_db.execute(
                "select tablename from pg_publication_tables where pubname = 'tm_e2e'"
            )
            assert published == [("inside",)]
            # when the DBA runs it, the same request works and the rows arrive
            pg_db.execute("alter publication tm_e2e add table public.outside")
            status, body = await call(
                service, "POST", "/v1/shapes", {"name": "out", "table": "outside"}
            )
            assert status == 201, body
            pg_db.execute("update outside set v = 'changed' where id <= 10")
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        comparison = compare_shape(
            spark, str(tmp_path), "out", "select id, v from outside", pg_db.dsn
        )
        assert comparison.equal, comparison.describe()
