"""The HTTP API and the command line against a running service (real Postgres,
real Spark): health, readiness, metrics, shapes at runtime, progress and waits,
token checks, errors as problem details, times, filtered and paged shape lists; and the
CLI commands that use them."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tidemark import cli
from tidemark.api import problems
from tidemark.demo.verify import compare_shape
from tidemark.lsn import Lsn, format_lsn
from tidemark.shapes.model import ShapeDefinition

from .conftest import PgDatabase
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

TOKEN = "s3cret-token"


async def call(
    service: Any, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://127.0.0.1:{service.http_port}{path}"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=body, headers=headers) as r,
    ):
        text = await r.text()
        try:
            return r.status, json.loads(text) if text else None
        except ValueError:
            return r.status, text


def iso_epoch(text: str) -> float:
    """The Unix time of an ISO 8601 UTC time as the API writes it."""
    assert text.endswith("Z") and len(text) == 24, text  # 2026-11-27T05:00:00.123Z
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def json_of(out: str) -> Any:
    """The JSON document a command printed; the running service's log lines may be
    captured around it (they share the test's stdout)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line in ("[", "{", "[]", "{}"))
    closing = {"[": "]", "{": "}"}.get(lines[start], lines[start])
    end = next(i for i in range(start, len(lines)) if lines[i] == closing)
    return json.loads("\n".join(lines[start : end + 1]))


# a line of the running service's log (structlog's console format)
_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def table_names(out: str) -> list[str]:
    """The first column of the table a command printed, below its header and rule; the
    running service's log lines may be captured anywhere in it (a backfill that starts
    while the command runs)."""
    lines = [line for line in out.splitlines() if line and not _LOG_LINE.match(line)]
    return [line.split()[0] for line in lines[2:] if not line.startswith("more:")]


async def test_the_api_serves_health_shapes_progress_and_waits(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    pg_db.execute(
        "create table t (id int primary key, v text, n int);"
        "alter table t replica identity full;"
        "create table other (id int primary key)"
    )
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        [{"name": "t_all", "table": "public.t"}],
        http={"admin_token": TOKEN},
    )
    async with running_service(settings, spark) as service:
        # health, readiness, metrics
        health = (await call(service, "GET", "/healthz"))[1]
        assert health["phase"] == "streaming" and health["started_at"].endswith("Z")
        assert abs(iso_epoch(health["started_at"]) - health["started_at_epoch"]) < 0.0001
        status, ready = await call(service, "GET", "/readyz")
        assert status == 200 and ready["ready"] is True
        status, text = await call(service, "GET", "/metrics")
        assert status == 200 and "tidemark_flushed_lsn" in text and "tidemark_up 1.0" in text

        # shapes: list, then add at runtime (token checked, body validated)
        status, body = await call(service, "GET", "/v1/shapes")
        assert [s["name"] for s in body["shapes"]] == ["t_all"]
        shape = {"name": "t_big", "table": "public.t", "where": "n > 100"}
        status, err = await call(service, "POST", "/v1/shapes", shape, token=None)
        assert status == 401 and err["type"] == problems.UNAUTHORIZED.type
        assert (await call(service, "POST", "/v1/shapes", shape, token="wrong"))[0] == 403
        status, err = await call(service, "POST", "/v1/shapes", {**shape, "where": "n >"})
        assert status == 400 and err["type"] == problems.INVALID_SHAPE.type and err["error"]
        status, err = await call(service, "POST", "/v1/shapes", {**shape, "table": "public.tt"})
        assert status == 400 and "does not exist" in err["error"]
        status, err = await call(service, "POST", "/v1/shapes", {**shape, "colour": "red"})
        assert status == 400 and "colour" in err["error"]
        status, created = await call(service, "POST", "/v1/shapes", shape)
        assert status == 201 and created["name"] == "t_big"
        assert created["state"] in ("backfilling", "active")
        status, err = await call(service, "POST", "/v1/shapes", {**shape, "where": "n > 5"})
        assert status == 409 and err["type"] == problems.SHAPE_CONFLICT.type

        # the list: in name order, filtered by state, in pages
        status, page = await call(service, "GET", "/v1/shapes?limit=1")
        assert [s["name"] for s in page["shapes"]] == ["t_all"] and page["next_cursor"] == "t_all"
        status, page = await call(service, "GET", "/v1/shapes?limit=1&cursor=t_all")
        assert [s["name"] for s in page["shapes"]] == ["t_big"] and page["next_cursor"] is None
        status, page = await call(service, "GET", "/v1/shapes?state=error")
        assert status == 200 and page == {"shapes": [], "next_cursor": None}
        status, page = await call(
            service, "GET", "/v1/shapes?state=active&state=backfilling,catching_up&limit=5"
        )
        assert [s["name"] for s in page["shapes"]] == ["t_all", "t_big"]
        assert page["next_cursor"] is None

        # the runtime shape gets its rows (by snapshot or stream, whichever comes first)
        pg_db.execute("insert into t select g, 'x', g from generate_series(1, 200) g")
        target = current_lsn(pg_db.dsn)
        status, waited = await call(
            service, "GET", f"/v1/progress/wait?lsn={Lsn(target)}&timeout=60&shape=t_big"
        )
        assert status == 200 and waited["reached"] is True
        assert waited["frontiers"]["t_big"]["value"] >= target
        status, shown = await call(service, "GET", "/v1/shapes/t_big")
        assert shown["ready"] and shown["frontier"]["value"] >= target
        from tidemark import read

        assert read.current(spark, tmp_path, "t_big").count() == 100

        # progress: our positions and Postgres's view of them
        status, progress = await call(service, "GET", "/v1/progress")
        assert progress["flushed"]["value"] >= target
        assert progress["postgres"]["confirmed_flush"]["value"] <= progress["flushed"]["value"]

        # waits that cannot be met, bad input
        far = Lsn(target + 10**12)
        status, body = await call(service, "GET", f"/v1/progress/wait?lsn={far}&timeout=0.5")
        assert status == 504 and body["reached"] is False and body["target"]["lsn"] == str(far)
        assert body["type"] == problems.WAIT_TIMEOUT.type and "not reached" in body["error"]
        assert (await call(service, "GET", "/v1/progress/wait?lsn=nope"))[0] == 400
        assert (await call(service, "GET", "/v1/shapes/nope"))[0] == 404

        # a resync over HTTP rebuilds the shape from a fresh snapshot
        assert (await call(service, "POST", "/v1/shapes/t_big/resync", token=None))[0] == 401
        status, body = await call(service, "POST", "/v1/shapes/t_big/resync")
        assert status == 202 and body["state"] == "backfilling" and body["ready"] is False
        async with asyncio.timeout(60):
            while not (await call(service, "GET", "/v1/shapes/t_big"))[1]["ready"]:
                await asyncio.sleep(0.1)
        assert service.shapes["t_big"].backfills_done == 2
        assert (await call(service, "POST", "/v1/shapes/nope/resync"))[0] == 404

        # removing a shape (its table stays)
        assert (await call(service, "DELETE", "/v1/shapes/t_big", token=None))[0] == 401
        assert (await call(service, "DELETE", "/v1/shapes/t_big"))[0] == 204
        assert (await call(service, "DELETE", "/v1/shapes/t_big"))[0] == 404
        assert [s["name"] for s in (await call(service, "GET", "/v1/shapes"))[1]["shapes"]] == [
            "t_all"
        ]
        assert (tmp_path / "tables" / "t_big" / "_delta_log").is_dir()


async def test_the_cli_talks_to_the_service_and_reads_the_lake(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    pg_db.execute("create table t (id int primary key, v text)")
    settings = settings_for(pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "public.t"}])
    async with running_service(settings, spark) as service:
        url = f"http://127.0.0.1:{service.http_port}"
        pg_db.execute("insert into t values (1, 'one'), (2, 'two')")
        target = current_lsn(pg_db.dsn)
        await wait_frontiers(service, target)

        def run(*argv: str) -> tuple[int, str]:
            capsys.readouterr()
            code = cli.main(list(argv))
            return code, capsys.readouterr().out

        code, out = await asyncio.to_thread(
            run, "wait", "--lsn", str(Lsn(target)), "--shape", "t_all", "--url", url
        )
        assert code == 0 and "reached" in out
        code, out = await asyncio.to_thread(run, "status", "--url", url)
        assert code == 0 and "t_all" in out and "acknowledged" in out
        code, out = await asyncio.to_thread(
            run, "shapes", "add", "t_one", "--table", "public.t", "--where", "id = 1", "--url", url
        )
        assert code == 0 and "t_one" in out
        code, out = await asyncio.to_thread(run, "shapes", "list", "--url", url)
        assert code == 0 and "t_one" in out and "id = 1" in out
        # -o json: the API's JSON, for scripts
        code, out = await asyncio.to_thread(run, "shapes", "list", "-o", "json", "--url", url)
        assert code == 0
        assert {s["name"]: s["where"] for s in json_of(out)}["t_one"] == "id = 1"
        # a page at a time, and by state
        code, out = await asyncio.to_thread(run, "shapes", "list", "--limit", "1", "--url", url)
        assert code == 0 and table_names(out) == ["t_all"] and "--cursor t_all" in out, out
        code, out = await asyncio.to_thread(
            run, "shapes", "list", "--cursor", "t_all", "-o", "json", "--url", url
        )
        assert code == 0 and [s["name"] for s in json_of(out)] == ["t_one"]
        code, out = await asyncio.to_thread(
            run, "shapes", "list", "--state", "error", "-o", "json", "--url", url
        )
        assert code == 0 and json_of(out) == []
        code, out = await asyncio.to_thread(
            run, "shapes", "list", "--state", "active,error", "-o", "json", "--url", url
        )
        assert code == 0 and "t_all" in [s["name"] for s in json_of(out)]

        def run_err(*argv: str) -> tuple[int, str]:
            capsys.readouterr()
            code = cli.main(list(argv))
            return code, capsys.readouterr().err

        code, err = await asyncio.to_thread(
            run_err, "shapes", "list", "--state", "gone", "--url", url
        )
        assert code != 0 and "'gone' is not a shape state" in err and "Traceback" not in err
        code, out = await asyncio.to_thread(
            run, "shapes", "show", "t_one", "-o", "json", "--url", url
        )
        shown = json_of(out)
        assert code == 0 and shown["table"] == "public.t"
        # where its tables are, to point an engine at them
        assert shown["tables"]["changelog"]["path"] == str(tmp_path / "tables" / "t_one")
        assert shown["tables"]["format"] == "delta"
        assert shown["tables"]["changelog"]["primary_key"] == ["id"]
        code, out = await asyncio.to_thread(run, "shapes", "show", "t_one", "--url", url)
        lines = {line.split("  ")[0]: line.split()[-1] for line in out.splitlines() if "  " in line}
        assert code == 0 and lines["primary key"] == "id" and "changelog" in lines
        # (the frontier is read from the root's state file, which a moment may not have
        # written yet on a loaded machine)
        async with asyncio.timeout(60):
            while True:
                code, out = await asyncio.to_thread(
                    run, "tables", "--root", str(tmp_path), "-o", "json"
                )
                listed = {found["shape"]: found for found in json_of(out)}
                if code != 0 or listed.get("t_all", {}).get("frontier") is not None:
                    break
                await asyncio.sleep(0.2)
        assert code == 0 and {"t_all", "t_one"} <= set(listed)
        assert listed["t_all"]["changelog"]["version"] >= 1
        # LSNs as the API gives them everywhere, and how far a plain reader of the
        # current table is behind the frontier
        frontier = listed["t_all"]["frontier"]
        assert frontier == {"lsn": format_lsn(frontier["value"]), "value": frontier["value"]}
        for found in listed.values():
            current = found["current"]
            if current is not None and current["folded"] is not None:
                behind = max(0, found["frontier"]["value"] - current["folded"]["value"])
                assert current["lag_bytes"] == behind, found
        code, out = await asyncio.to_thread(run, "tables", "--root", str(tmp_path))
        assert code == 0 and "t_all" in out and "shape(s) under" in out
        code, out = await asyncio.to_thread(run, "status", "--output", "json", "--url", url)
        status = json_of(out)
        assert code == 0 and status["url"] == url and "flushed" in status["progress"]
        assert {s["name"] for s in status["shapes"]} >= {"t_all", "t_one"}
        assert status["ready"]["ready"] in (True, False)
        code, out = await asyncio.to_thread(
            run,
            "shapes",
            "add",
            "t_two",
            "--table",
            "public.t",
            "--where",
            "id = 2",
            "--wait",
            "--timeout",
            "60",
            "--url",
            url,
        )
        assert code == 0 and "t_two is ready" in out
        code, out = await asyncio.to_thread(
            run, "shapes", "resync", "t_all", "--wait", "--timeout", "60", "--url", url
        )
        assert code == 0 and "rebuilt" in out and "t_all is ready" in out
        code, out = await asyncio.to_thread(run, "read", "t_all", "--root", str(tmp_path))
        assert code == 0 and "one" in out and "two" in out and "2 row(s)" in out
        # without Spark by default; through the configured Spark on request; as CSV and
        # Parquet files
        code, out = await asyncio.to_thread(
            run, "read", "t_all", "--root", str(tmp_path), "--spark"
        )
        assert code == 0 and "one" in out and "two" in out and "2 row(s)" in out
        code, out = await asyncio.to_thread(
            run, "read", "t_all", "--root", str(tmp_path), "-o", "json"
        )
        doc = json_of(out)
        assert code == 0 and doc["total"] == 2 and {r["v"] for r in doc["rows"]} == {"one", "two"}
        lsn = doc["rows"][0]["_lsn"]
        assert lsn == {"lsn": format_lsn(lsn["value"]), "value": lsn["value"]}
        csv_file, parquet_file = tmp_path / "t_all.csv", tmp_path / "t_all.parquet"
        code, out = await asyncio.to_thread(
            run, "read", "t_all", "--root", str(tmp_path), "--format", "csv", "--out", str(csv_file)
        )
        assert code == 0 and "2 row(s) written" in out
        lines = csv_file.read_text().splitlines()
        assert lines[0].split(",")[:2] == ['"id"', '"v"'] and len(lines) == 3
        code, out = await asyncio.to_thread(
            run,
            "read",
            "t_all",
            "--root",
            str(tmp_path),
            "--changelog",
            "--format",
            "parquet",
            "--out",
            str(parquet_file),
        )
        import pyarrow.parquet as pq

        changes = pq.read_table(parquet_file)
        assert code == 0 and changes.num_rows >= 2 and "_lsn" in changes.column_names
        code, out = await asyncio.to_thread(
            run, "wait", "--lsn", str(Lsn(target + 10**12)), "--timeout", "0.5", "--url", url
        )
        assert code == 3
        # an error answer: the CLI prints the problem's detail and its status
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, ["shapes", "show", "nope", "--url", url])
        err = capsys.readouterr().err
        assert code == 1
        assert "there is no shape 'nope'; GET /v1/shapes lists them (HTTP 404)" in err


async def test_status_shows_rows_lag_last_commit_and_why_a_shape_is_not_ready(
    pg_db: PgDatabase,
    spark,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    # given a shape filled by its backfill (200 rows), then 2 rows from the stream
    pg_db.execute(
        "create table t (id int primary key, v text);"
        "insert into t select g, 'x' from generate_series(1, 200) g"
    )
    settings = settings_for(
        pg_db.dsn,
        str(tmp_path),
        [{"name": "t_all", "table": "public.t"}],
        monitor={"period_s": 0.5, "stall_grace_s": 1.0},
    )
    async with running_service(settings, spark) as service:
        url = f"http://127.0.0.1:{service.http_port}"
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        pg_db.execute("insert into t values (201, 'y'), (202, 'z')")
        await wait_frontiers(service, current_lsn(pg_db.dsn))

        def status() -> str:
            capsys.readouterr()
            assert cli.main(["status", "--url", url]) == 0
            return capsys.readouterr().out

        # then the API and `tidemark status` count the backfilled rows too
        shape = (await call(service, "GET", "/v1/shapes/t_all"))[1]
        assert (shape["rows_backfilled"], shape["rows_committed"]) == (200, 2)
        assert shape["ready"] is True and shape["reason"] is None and shape["stalled"] is False
        assert shape["lag_bytes"] >= 0 and shape["lag_s"] >= 0
        assert 0 <= shape["last_commit"]["age_s"] < 120
        at, epoch = shape["last_commit"]["at"], shape["last_commit"]["epoch"]
        assert abs(iso_epoch(at) - epoch) < 0.0001
        assert (
            abs(iso_epoch(shape["continuity"]["since"]) - shape["continuity"]["since_epoch"])
            < 0.0001
        )
        out = await asyncio.to_thread(status)
        (line,) = [row for row in out.splitlines() if row.startswith("t_all ")]
        assert "active" in line and "200 + 2" in line and " ago" in line
        since = shape["continuity"]["since"]
        assert since and f"since {since} from {shape['continuity']['from']['lsn']}" in line
        assert line.rstrip().endswith("-")  # nothing keeps it from being ready
        assert "streaming, ready" in out and "received" in out and "acknowledged" in out

        # when a new shape cannot start its backfill (its writer is held)
        assert service.scheduler is not None
        await service.add_shape(ShapeDefinition(name="t_new", table="public.t", where="id > 100"))
        async with service.scheduler.exclusive(service.scheduler.writers["t_new"]):
            shape = (await call(service, "GET", "/v1/shapes/t_new"))[1]
            assert shape["state"] == "backfilling" and shape["ready"] is False
            assert shape["reason"].startswith("waiting for its backfill")
            assert shape["frontier"] is None and shape["lag_bytes"] is None
            out = await asyncio.to_thread(status)
            (line,) = [row for row in out.splitlines() if row.startswith("t_new ")]
            assert "backfilling" in line and "waiting for its backfill" in line
            assert "no claim yet" in line  # a new shape: no table to be continuous yet
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        shape = (await call(service, "GET", "/v1/shapes/t_new"))[1]
        assert shape["rows_backfilled"] == 102 and shape["reason"] is None

        # when a shape with data to flush is held past monitor.stall_grace_s
        pg_db.execute("insert into t values (300, 'held')")
        async with service.scheduler.exclusive(service.scheduler.writers["t_all"]):
            async with asyncio.timeout(60):
                while not (shape := (await call(service, "GET", "/v1/shapes/t_all"))[1])["stalled"]:
                    await asyncio.sleep(0.2)
            # then it says so, and why that matters
            assert shape["ready"] is True  # readable up to its frontier, but holding WAL
            assert shape["reason"].startswith("stalled: owes a flush")
            assert shape["pending_rows"] == 1
            out = await asyncio.to_thread(status)
            (line,) = [row for row in out.splitlines() if row.startswith("t_all ")]
            assert "active (stalled)" in line and "stalled: owes a flush" in line
            assert "NOT READY" in out and "shape t_all has held the flush boundary" in out
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        shape = (await call(service, "GET", "/v1/shapes/t_all"))[1]
        assert shape["stalled"] is False and shape["rows_committed"] == 3
    result = compare_shape(
        spark, str(tmp_path), "t_new", "select * from t where id > 100", pg_db.dsn
    )
    assert result.equal, result.describe()


def test_config_check_passes_on_a_good_setup_and_explains_a_bad_shape(
    pg_db: PgDatabase,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pg_db.execute("create table t (id int primary key, v text); create table nopk (v text)")
    config = tmp_path / "tidemark.toml"
    config.write_text(
        f'[source]\ndsn = "{pg_db.dsn}"\n[sink]\nroot = "{tmp_path / "lake"}"\n'
        '[[shapes]]\nname = "t_all"\ntable = "public.t"\n'
    )
    assert cli.main(["--config", str(config), "config", "check"]) == 0
    out = capsys.readouterr().out
    from psycopg.conninfo import conninfo_to_dict

    password = conninfo_to_dict(pg_db.dsn).get("password")
    (dsn_line,) = [line for line in out.splitlines() if line.startswith("dsn = ")]
    assert "ok   shape t_all" in out and (password is None or "***" in dsn_line)
    assert "ok   per-change path" in out and "compiled (tidemark._fastpath, Cython)" in out
    assert pg_db.dsn not in out  # the DSN (with its password) is shown redacted
    config.write_text(config.read_text() + '[[shapes]]\nname = "bad"\ntable = "public.nopk"\n')
    assert cli.main(["--config", str(config), "config", "check"]) == 4
    out = capsys.readouterr().out
    assert "FAIL shape bad" in out and "REPLICA IDENTITY FULL" in out


def test_missing_dsn_and_unreachable_service_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("TIDEMARK_SOURCE__DSN", raising=False)
    assert cli.main(["run"]) == 2  # a configuration error
    assert "source.dsn is not set" in capsys.readouterr().err
    assert cli.main(["status", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach tidemark" in capsys.readouterr().err
