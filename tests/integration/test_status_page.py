"""The status page at ``GET /``, served by tidemark and looked at in a real headless
browser (Debian's chromium, driven by Playwright; never a browser Playwright downloads).

- What is served: HTML, a Content-Security-Policy that allows the page's own inline
  style and script by hash and fetches to the same origin only, and no external URL.
- A thousand shapes (the JSON endpoints answered by the browser's router, no service):
  every row rendered, sorted by lag with the laggards first, filtered as typed, sorted
  by a clicked column; the readiness reasons; an error banner while fetches fail, gone
  once they succeed again.
- A real service (real Postgres, real Spark): the page loads without a console error or
  a failed request, lists every shape, shows a shape's new frontier within seconds of
  its rows being written without a reload, and says so once the service is gone.

Without ``/usr/bin/chromium`` (``make browser``) or the ``playwright`` package the
browser tests are skipped, saying why; with ``TIDEMARK_REQUIRE_BROWSER`` set (CI) they
fail instead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib.util
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tidemark.api.server import build_app
from tidemark.lsn import Lsn
from tidemark.status.history import History

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers

CHROMIUM = Path("/usr/bin/chromium")


def browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found: install Debian's chromium ('make browser' as root)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed: pip install -e '.[test]'"
    return None


def require_browser() -> None:
    """Skip, saying why, where the browser cannot run; fail instead where
    ``TIDEMARK_REQUIRE_BROWSER`` is set (CI: a skipped browser test is not a passed one)."""
    reason = browser_missing()
    if reason is None:
        return
    if os.environ.get("TIDEMARK_REQUIRE_BROWSER"):
        pytest.fail(f"the browser is required here (TIDEMARK_REQUIRE_BROWSER) but {reason}")
    pytest.skip(reason)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Watched:
    """A page and everything that went wrong on it: console errors and warnings
    (a CSP violation is one), uncaught exceptions, failed requests, HTTP errors."""

    page: Any
    problems: list[str] = field(default_factory=list)

    @classmethod
    async def open(cls, browser: Any) -> Watched:
        watched = cls(await browser.new_page())
        say = watched.problems.append
        page = watched.page
        page.on("console", lambda m: m.type in ("error", "warning") and say(f"console: {m.text}"))
        page.on("pageerror", lambda exc: say(f"uncaught: {exc}"))
        page.on("requestfailed", lambda r: say(f"failed: {r.url} ({r.failure})"))
        page.on("response", lambda r: r.status >= 400 and say(f"HTTP {r.status}: {r.url}"))
        return watched

    async def shown_shapes(self) -> list[str]:
        names: list[str] = await self.page.eval_on_selector_all(
            "#shapes tr", "rows => rows.map(r => r.dataset.shape)"
        )
        return names

    async def cell(self, shape: str, column: str) -> str:
        text: str = await self.page.locator(
            f'#shapes tr[data-shape="{shape}"] td.{column} > span:first-child'
        ).inner_text()
        return text

    async def sub(self, shape: str, column: str) -> str:
        """The second line of a cell (what its first one stands on)."""
        text: str = await self.page.locator(
            f'#shapes tr[data-shape="{shape}"] td.{column} > span.sub'
        ).inner_text()
        return text

    async def refreshed_at(self) -> int | None:
        at = await self.page.get_attribute("#refreshed", "data-at")
        return None if at is None else int(at)

    async def until(self, what: str, check: Callable[[], Any], timeout: float = 6.0) -> float:
        """Poll ``check`` (async) until it is true; how long that took."""
        started = time.monotonic()
        while not await check():
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"the page did not show {what} within {timeout:g}s; on the page: "
                    f"{self.problems or 'no error'}"
                )
            await asyncio.sleep(0.1)
        return time.monotonic() - started


@contextlib.asynccontextmanager
async def page_server() -> AsyncIterator[str]:
    """tidemark's HTTP app with no service behind it: enough for ``GET /`` (the JSON
    endpoints are the browser router's, or absent)."""
    async with TestServer(build_app(object()), host="127.0.0.1") as server:  # type: ignore[arg-type]
        yield f"http://127.0.0.1:{server.port}/"


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


async def test_the_page_is_html_under_a_strict_policy_and_names_no_other_origin() -> None:
    async with page_server() as url, aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200
        assert r.content_type == "text/html" and r.charset == "utf-8"
        html = await r.text()
        policy = dict(
            [*d.split(" ", 1), ""][:2]
            for d in (p.strip() for p in r.headers["Content-Security-Policy"].split(";"))
        )
    # the page is self-contained: one inline style, one inline script, nothing to load
    (style,) = re.findall(r"<style>(.*?)</style>", html, flags=re.DOTALL)
    (script,) = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"""\b(src|href|action)\s*=|url\(|@import|//[\w.-]+\.\w""", html)
    # and the policy allows exactly that
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == _csp_hash(script)
    assert policy["style-src"] == _csp_hash(style)
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"
    assert "unsafe" not in " ".join(policy.values())


def _fake_shapes(n: int) -> list[dict[str, Any]]:
    """``n`` shapes as GET /v1/shapes gives them: most active with lags in a scrambled
    order, every 97th backfilling (no frontier, no lag), one in error."""
    shapes = []
    for i in range(n):
        active = i % 97 != 5
        lag = (i * 7919) % 100_003 if active else None
        state = "active" if active else "backfilling"
        reason = None if active else "backfilling: 1,000 of about 5,000 rows copied so far (3s)"
        if i == 42:
            state, reason = "error", "failed: the sink refused the commit"
        shapes.append(
            {
                "name": f"s{i:04d}",
                "table": f"public.t{i % 10}",
                "where": "n > 1" if i % 3 == 0 else None,
                "state": state,
                "error": "the sink refused the commit" if i == 42 else None,
                "ready": state == "active",
                "reason": reason,
                "stalled": False,
                "frontier": {"lsn": str(Lsn(0x1_0000_0000 + i)), "value": 0x1_0000_0000 + i}
                if active
                else None,
                "lag_bytes": lag,
                "lag_s": None if lag is None else lag / 1000,
                "rows_backfilled": 1000,
                "rows_committed": i,
                "last_commit": {
                    "at": "2026-01-02T03:04:09.500Z",
                    "epoch": 1767323049.5,
                    "age_s": 2.0,
                }
                if active
                else None,
                "backfill": None
                if active
                else {"rows_done": 1000, "rows_estimated": 5000, "chunks": 1, "elapsed_s": 3.0},
                "current": None
                if i % 4 == 0
                else {
                    "folded": {"lsn": str(Lsn(0x1_0000_0000)), "value": 0x1_0000_0000},
                    "lag_bytes": i,
                    "lag_s": 1.0,
                    "rows_waiting": i % 3,
                },
                "continuity": {
                    "since": "2026-01-02T03:04:05.250Z",
                    "from": {"lsn": "0/16B3748", "value": 23803720},
                    "stream": None,
                    "last_invalidation": None,
                },
            }
        )
    return shapes


PROGRESS = {
    "phase": "streaming",
    "role": "leader",
    "received": {"lsn": "1/2000", "value": 0x1_0000_2000},
    "flushed": {"lsn": "1/1000", "value": 0x1_0000_1000},
    "applied": {"lsn": "1/1000", "value": 0x1_0000_1000},
    "postgres": None,
    "frontiers": {},
    "violations": [],
    "memory": None,
    # 90 ten-second intervals: no transaction acknowledged in every seventh
    "history": {
        "interval_s": 10.0,
        "points": [
            {
                "at": "2026-01-02T03:04:05.000Z",
                "epoch": 1767323045.0,
                "ack_lag_s": None if i % 7 == 0 else 0.5 + (i % 10) / 10,
                "rows_per_s": 1000.0 * (i % 5),
            }
            for i in range(90)
        ],
    },
}


async def test_a_thousand_shapes_sort_by_lag_filter_and_survive_failed_fetches() -> None:
    shapes = _fake_shapes(1000)
    failing = False
    fetched: list[str] = []

    async def answer(route: Any) -> None:
        path = route.request.url.split("/", 3)[3]
        fetched.append(path)
        if failing:
            problem = {"title": "Internal error", "status": 500, "detail": "boom"}
            await route.fulfill(status=500, json=problem)
        elif path == "v1/progress":
            await route.fulfill(json=PROGRESS)
        elif path == "v1/shapes":
            await route.fulfill(json={"shapes": shapes, "next_cursor": None})
        else:
            reasons = ["shape s0042 is in error: the sink refused the commit"] + [
                f"shape s{i:04d} has held the flush boundary for over 60.0s" for i in range(20)
            ]
            await route.fulfill(json={"ready": False, "role": "leader", "reasons": reasons})

    async with page_server() as url, chromium() as browser:
        watched = await Watched.open(browser)
        page = watched.page
        for path in ("v1/progress", "v1/shapes", "readyz"):
            await page.route(f"{url}{path}", answer)
        started = time.monotonic()
        await page.goto(url)
        await watched.until("1000 rows", lambda: _count(page, "#shapes tr", 1000))
        rendered_s = time.monotonic() - started

        # the laggards first: no frontier yet, then the largest lag in bytes
        names = await watched.shown_shapes()
        without = sorted(s["name"] for s in shapes if s["lag_bytes"] is None)
        with_lag = sorted(
            (s for s in shapes if s["lag_bytes"] is not None),
            key=lambda s: (-s["lag_bytes"], s["name"]),
        )
        assert names == without + [s["name"] for s in with_lag]
        assert await page.get_attribute('th[data-key="lag_bytes"]', "aria-sort") == "descending"
        assert await watched.cell("s0042", "state") == "error"
        assert await watched.cell("s0005", "reason") == shapes[5]["reason"]
        assert await watched.cell("s0007", "rows") == "1,007"
        assert await watched.cell("s0007", "continuity") == "2026-01-02 03:04:05 UTC"
        # the last commit, on the page's one clock (UTC), and a backfill's progress
        assert await watched.cell("s0007", "last_commit") == "2026-01-02 03:04:09 UTC"
        assert await watched.sub("s0007", "last_commit") == "2.0 s ago"
        assert await watched.cell("s0005", "last_commit") == "—"
        # how far each current table is folded, and what a plain reader of it misses
        assert await watched.cell("s0007", "current") == "1/0"
        assert await watched.sub("s0007", "current") == "7 B behind the frontier, 1 row waiting"
        assert await watched.sub("s0006", "current") == "6 B behind the frontier"
        assert await watched.sub("s0005", "current") == "5 B behind the frontier, 2 rows waiting"
        assert await watched.sub("s0008", "current") == "current tables off"
        assert await watched.sub("s0005", "state") == "1,000 of ~5,000 rows (20%)"
        assert re.fullmatch(r"refreshed \d\d:\d\d:\d\d UTC .*", await page.inner_text("#refreshed"))
        assert await page.inner_text("#ready") == "not ready"
        # a reason a shape, but not a thousand of them: the first twelve and a count
        reasons = await page.locator("#reasons li").all_inner_texts()
        assert reasons[0] == "shape s0042 is in error: the sink refused the commit"
        assert len(reasons) == 13 and reasons[-1].startswith("… and 9 more")
        assert await page.inner_text("#pg-current") == "not sampled yet"
        # the last 15 minutes: one line each, a point for each interval with a value
        ack = page.locator("#spark-ack polyline")
        assert await page.get_attribute("#spark-ack", "data-points") == str(90 - 13)
        assert len((await ack.get_attribute("points") or "").split()) == 90 - 13
        assert await page.get_attribute("#spark-rows", "data-points") == "90"
        assert await page.inner_text("#ack-now") == "now 1.4 s, peak 1.4 s (90 intervals)"
        assert await page.inner_text("#rows-now") == "now 4,000/s, peak 4,000/s (90 intervals)"
        assert "1000 shapes, 12 not ready" in await page.inner_text("#counts")

        # a filter narrows the table as it is typed; a clicked header sorts by its column
        await page.fill("#filter", "s099")
        await watched.until("the filtered rows", lambda: _count(page, "#shapes tr", 10))
        assert await watched.shown_shapes() == sorted(
            [f"s099{i}" for i in range(10)],
            key=lambda n: -_lag_or_most(shapes[int(n[1:])]),
        )
        await page.fill("#filter", "")
        await page.click('th[data-key="name"]')
        assert await watched.shown_shapes() == [s["name"] for s in shapes]

        # polls keep coming every 2 s, and the rows stay the same elements
        marker = await page.evaluate("document.querySelector('#shapes tr').dataset.mark = 'x'")
        first = await watched.refreshed_at()
        await watched.until("a second refresh", lambda: _changed(watched, first))
        assert await page.evaluate("document.querySelector('#shapes tr').dataset.mark") == "x"
        assert marker == "x"
        assert not watched.problems, watched.problems

        # fetches fail: a banner says so and the last data stays; it goes once they succeed
        failing = True
        await watched.until("the error banner", lambda: page.is_visible("#banner"))
        banner = await page.inner_text("#banner")
        assert "HTTP 500: boom" in banner and "showing data from" in banner
        assert await _count(page, "#shapes tr", 1000)
        failing = False
        await watched.until("the banner gone", lambda: page.is_hidden("#banner"))
        assert fetched.count("v1/shapes") >= 4
    # rendering a thousand rows takes a fraction of that; the bound catches a quadratic
    assert rendered_s < 5, rendered_s


def _lag_or_most(shape: dict[str, Any]) -> int:
    return 10**9 if shape["lag_bytes"] is None else int(shape["lag_bytes"])


async def _count(page: Any, selector: str, n: int) -> bool:
    return bool(await page.locator(selector).count() == n)


async def _changed(watched: Watched, before: int | None) -> bool:
    return await watched.refreshed_at() not in (None, before)


@one_server()
async def test_the_page_follows_a_running_service(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
) -> None:
    # given a service with three shapes over two tables, caught up with their snapshots
    pg_db.execute(
        "create table orders (id int primary key, region text, amount int);"
        "alter table orders replica identity full;"
        "create table customers (id int primary key, name text);"
        "insert into orders select g, case when g % 2 = 0 then 'eu' else 'us' end, g"
        "  from generate_series(1, 20) g;"
        "insert into customers select g, 'c' || g from generate_series(1, 5) g"
    )
    shapes = [
        {"name": "orders_all", "table": "public.orders"},
        {"name": "orders_eu", "table": "public.orders", "where": "region = 'eu'"},
        {"name": "customers", "table": "public.customers"},
    ]
    settings = settings_for(pg_db.dsn, str(tmp_path), shapes)
    async with chromium() as browser:
        async with running_service(settings, spark) as service:
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            url = f"http://127.0.0.1:{service.http_port}/"
            service.history = History(interval_s=1.0)  # (1 s intervals, not 10 s)

            # when the page is opened
            watched = await Watched.open(browser)
            page = watched.page
            await page.goto(url)
            await watched.until("every shape", lambda: _count(page, "#shapes tr", 3))

            # then it lists every shape of the service, and what the service says
            assert sorted(await watched.shown_shapes()) == sorted(service.shapes)
            assert await page.inner_text("#role") == "leader"
            assert await page.inner_text("#phase") == "streaming"
            assert await page.inner_text("#ready") == "ready"
            assert await watched.cell("orders_eu", "state") == "active"
            assert await watched.cell("orders_eu", "rows") == "10"
            folded = await watched.cell("orders_eu", "current")
            assert folded == "not yet" or re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", folded), folded
            for name in service.shapes:
                shown = Lsn.parse(await watched.cell(name, "frontier"))
                assert int(shown) <= service.progress().frontiers[name]
            assert Lsn.parse(await page.inner_text("#received"))
            await watched.until("Postgres's view", lambda: _is_lsn(page, "#pg-current"))

            # when rows are written to one shape's table and its frontier passes them
            await page.evaluate("window.loadedOnce = true")
            await pg_db.aexecute(
                "insert into orders select g, 'eu', g from generate_series(21, 30) g"
            )
            target = current_lsn(pg_db.dsn)
            await wait_frontiers(service, target)

            # then the page shows the new frontier within seconds, without a reload
            async def moved() -> bool:
                text = await watched.cell("orders_eu", "frontier")
                return text != "—" and int(Lsn.parse(text)) >= target

            took = await watched.until("the new frontier", moved, timeout=6.0)
            assert await page.evaluate("window.loadedOnce === true")
            assert await watched.cell("orders_eu", "rows") == "20"
            # its last commit, in UTC as the API gives it
            shown_at = await watched.cell("orders_eu", "last_commit")
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown_at), shown_at
            print(f"status page: new frontier shown {took:.1f}s after the service had it")

            # and the last minutes drawn: the rows committed, their acknowledgement lag
            async def drawn() -> bool:
                rows = await page.inner_text("#rows-now")
                peak = re.search(r"peak ([\d,]+)/s", rows)
                acked = await page.get_attribute("#spark-ack", "data-points")
                return bool(peak and int(peak[1].replace(",", "")) > 0 and int(acked or 0) > 0)

            await watched.until("the sparklines", drawn, timeout=10.0)
            assert re.fullmatch(
                r"now [\d.]+ s, peak [\d.]+ s \(\d+ intervals\)", await page.inner_text("#ack-now")
            )
            assert not watched.problems, watched.problems

        # when the service is gone, the page says so and keeps what it showed
        await watched.until("the error banner", lambda: page.is_visible("#banner"))
        assert "cannot be reached" in await page.inner_text("#banner")
        assert await _count(page, "#shapes tr", 3)


async def _is_lsn(page: Any, selector: str) -> bool:
    return bool(re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", await page.inner_text(selector)))
