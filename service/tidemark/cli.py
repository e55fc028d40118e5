"""The ``tidemark`` command.

``run`` starts the service; ``config check`` validates settings, the source and the
declared shapes; ``shapes``, ``status`` and ``wait`` talk to a running service over
its HTTP API; ``read`` reads a shape's table straight from the sink with Spark;
``demo`` runs everything on embedded defaults.

Exit codes: 0 success, 1 a clear error (printed on stderr), 2 usage, 3 a wait that
timed out, 4 ``config check`` found problems.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tidemark.config import Settings
from tidemark.errors import TidemarkError
from tidemark.lsn import Lsn, format_lsn


def _settings(args: argparse.Namespace, require_dsn: bool = False) -> Settings:
    from tidemark.config import load_settings

    return load_settings(args.config, require_dsn=require_dsn)


# -- talking to a running service ---------------------------------------------------


class Api:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, {"error": raw.decode(errors="replace")}
        except urllib.error.URLError as exc:
            raise TidemarkError(
                f"cannot reach tidemark at {self.url} ({exc.reason}): is `tidemark run` up, "
                "and is --url (or [http] host/port) right?"
            ) from exc


def _api(args: argparse.Namespace) -> Api:
    url = args.url or os.environ.get("TIDEMARK_URL")
    token = args.token or os.environ.get("TIDEMARK_HTTP__ADMIN_TOKEN")
    if url is None or token is None:
        settings = _settings(args)
        host = settings.http.host if settings.http.host not in ("0.0.0.0", "::") else "127.0.0.1"
        url = url or f"http://{host}:{settings.http.port}"
        token = token if token is not None else settings.http.admin_token
    return Api(url, token or None)


def _check(status: int, body: Any, ok: tuple[int, ...] = (200,)) -> Any:
    if status not in ok:
        message = body.get("error") if isinstance(body, dict) else body
        raise TidemarkError(f"{message} (HTTP {status})")
    return body


def _lsn(value: dict[str, Any] | None) -> str:
    return value["lsn"] if value else "-"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


# -- commands --------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from tidemark.app import Service
    from tidemark.observability import configure_logging

    settings = _settings(args, require_dsn=True)
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(Service(settings).run())
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from tidemark.config import explain
    from tidemark.preflight import run_checks

    settings = _settings(args, require_dsn=True)
    print(explain(settings))
    results = asyncio.run(run_checks(settings))
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.name.ljust(width)}  {r.detail}")
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)} checks passed, {len(failed)} failed")
    return 4 if failed else 0


def cmd_shapes(args: argparse.Namespace) -> int:
    api = _api(args)
    if args.action == "list":
        body = _check(*api.call("GET", "/v1/shapes"))
        rows = [
            [
                s["name"],
                s["table"],
                s["where"] or "",
                s["state"],
                _lsn(s["frontier"]),
                str(s["rows_committed"]),
            ]
            for s in body["shapes"]
        ]
        print(_table(rows, ["shape", "table", "where", "state", "frontier", "rows"]))
    elif args.action == "show":
        print(json.dumps(_check(*api.call("GET", f"/v1/shapes/{args.name}")), indent=2))
    elif args.action == "remove":
        _check(*api.call("DELETE", f"/v1/shapes/{args.name}"), ok=(204,))
        print(f"shape {args.name} removed (its table stays under the sink root)")
    elif args.action == "resync":
        _check(*api.call("POST", f"/v1/shapes/{args.name}/resync"), ok=(202,))
        print(f"shape {args.name} is being rebuilt from a fresh snapshot")
        if args.wait:
            return _wait_ready(api, args.name, args.timeout)
    elif args.action == "add":
        body = {"name": args.name, "table": args.table}
        if args.where:
            body["where"] = args.where
        if args.columns:
            body["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
        if args.replica:
            body["replica"] = args.replica
        shape = _check(*api.call("POST", "/v1/shapes", body), ok=(200, 201))
        print(f"shape {shape['name']} added on {shape['table']} (state {shape['state']})")
        if args.wait:
            return _wait_ready(api, shape["name"], args.timeout)
    return 0


def _wait_ready(api: Api, name: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shape = _check(*api.call("GET", f"/v1/shapes/{name}"))
        progress = shape.get("backfill")
        if shape["state"] in ("error", "resync_needed"):
            print(f"\nshape {name} is {shape['state']}: {shape['error']}", file=sys.stderr)
            return 1
        if shape.get("ready"):
            print(f"\nshape {name} is ready (frontier {_lsn(shape['frontier'])})")
            return 0
        if progress:
            done, total = progress.get("rows_done", 0), max(1, progress.get("rows_estimated", 1))
            bar = "#" * int(30 * min(1.0, done / total))
            print(f"\r[{bar.ljust(30)}] {done:,}/{total:,} rows", end="", flush=True)
        time.sleep(0.5)
    print(f"\nshape {name} is not ready after {timeout}s", file=sys.stderr)
    return 3


def cmd_status(args: argparse.Namespace) -> int:
    api = _api(args)
    progress = _check(*api.call("GET", "/v1/progress"))
    shapes = _check(*api.call("GET", "/v1/shapes"))["shapes"]
    pg = progress.get("postgres") or {}
    print(f"phase      {progress['phase']}")
    print(f"received   {_lsn(progress['received'])}")
    print(f"flushed    {_lsn(progress['flushed'])}   (acknowledged to Postgres)")
    print(f"applied    {_lsn(progress['applied'])}")
    print(
        f"pg replay  {_lsn(pg.get('replay'))}   confirmed_flush {_lsn(pg.get('confirmed_flush'))}"
        f"   current {_lsn(pg.get('current_wal'))}   wal_status {pg.get('wal_status')}"
    )
    if pg.get("retained_wal_bytes") is not None:
        print(f"retained   {pg['retained_wal_bytes']:,} bytes of WAL held by the slot")
    current = (pg.get("current_wal") or {}).get("value")
    rows = []
    for s in shapes:
        frontier = (s.get("frontier") or {}).get("value")
        lag = f"{current - frontier:,}" if current is not None and frontier is not None else "-"
        rows.append(
            [
                s["name"],
                s["state"],
                _lsn(s["frontier"]),
                lag,
                str(s["rows_committed"]),
                str(s["pending_rows"]),
            ]
        )
    print()
    print(_table(rows, ["shape", "state", "frontier", "lag bytes", "rows", "pending"]))
    for v in progress.get("violations", []):
        print(f"VIOLATION {v['kind']}: {v['message']}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    api = _api(args)
    Lsn.parse(args.lsn)  # a clear error before the request
    query = {"lsn": args.lsn, "timeout": str(args.timeout)}
    if args.shape:
        query["shape"] = args.shape
    status, body = api.call(
        "GET", "/v1/progress/wait?" + urllib.parse.urlencode(query), timeout=args.timeout + 10
    )
    if status == 504:
        print(
            f"not reached within {args.timeout}s: replay at "
            f"{_lsn((body.get('postgres') or {}).get('replay'))}",
            file=sys.stderr,
        )
        return 3
    _check(status, body)
    print(f"reached {args.lsn}: replay {_lsn((body.get('postgres') or {}).get('replay'))}")
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from tidemark import read
    from tidemark.spark import build_session

    root = args.root or _settings(args).sink.root
    as_of = int(Lsn.parse(args.as_of)) if args.as_of else None
    spark = build_session(app_name="tidemark-read")
    if args.changelog:
        frame = read.changelog(spark, root, args.shape).orderBy("_lsn", "_op")
        if as_of is not None:
            frame = frame.where(frame["_lsn"] <= as_of)
    else:
        frame = read.current(spark, root, args.shape, as_of)
    rows = frame.limit(args.limit).collect() if args.limit else frame.collect()
    columns = frame.columns
    print(
        _table([[("NULL" if r[c] is None else str(r[c])) for c in columns] for r in rows], columns)
    )
    total = frame.count()
    shown = len(rows)
    print(
        f"\n{total} row(s){'' if shown == total else f', {shown} shown'}"
        f"{'' if as_of is None else f' as of {format_lsn(as_of)}'}"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tidemark.demo import run_demo

    return run_demo(duration_s=args.duration, data_dir=args.data, port=args.port)


# -- the parser ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidemark", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="settings file (default: $TIDEMARK_CONFIG or ./tidemark.toml)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("run", help="run the service").set_defaults(func=cmd_run)

    config = sub.add_parser("config", help="settings")
    config_sub = config.add_subparsers(dest="action", required=True)
    config_sub.add_parser("check", help="validate settings, source and shapes").set_defaults(
        func=cmd_config_check
    )

    def api_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--url", help="service URL (default from [http] or $TIDEMARK_URL)")
        q.add_argument("--token", help="admin token (default from [http] admin_token)")

    shapes = sub.add_parser("shapes", help="add, list, show, remove shapes")
    shapes_sub = shapes.add_subparsers(dest="action", required=True)
    add = shapes_sub.add_parser("add", help="add a shape")
    add.add_argument("name")
    add.add_argument("--table", required=True, help="schema.table")
    add.add_argument("--where", help="SQL predicate")
    add.add_argument("--columns", help="comma-separated columns (primary key is always in)")
    add.add_argument("--replica", choices=["default", "full"])
    add.add_argument("--wait", action="store_true", help="wait until the shape is ready")
    add.add_argument("--timeout", type=float, default=600.0)
    for name in ("list", "show", "remove", "resync"):
        q = shapes_sub.add_parser(name, help=f"{name} shape(s)")
        if name != "list":
            q.add_argument("name")
        if name == "resync":
            q.add_argument("--wait", action="store_true", help="wait until the shape is ready")
            q.add_argument("--timeout", type=float, default=600.0)
    for q in [add, *(shapes_sub.choices[n] for n in ("list", "show", "remove", "resync"))]:
        api_args(q)
    shapes.set_defaults(func=cmd_shapes)

    status = sub.add_parser("status", help="acknowledged LSNs, Postgres's view, frontiers")
    api_args(status)
    status.set_defaults(func=cmd_status)

    wait = sub.add_parser("wait", help="wait until an LSN is replayed (and in a shape)")
    wait.add_argument("--lsn", required=True)
    wait.add_argument("--shape")
    wait.add_argument("--timeout", type=float, default=60.0)
    api_args(wait)
    wait.set_defaults(func=cmd_wait)

    read = sub.add_parser("read", help="print a shape's rows from the lake (Spark)")
    read.add_argument("shape")
    read.add_argument("--as-of", help="LSN to read as of (default: everything committed)")
    read.add_argument("--root", help="sink root (default from [sink] root)")
    read.add_argument("--limit", type=int, default=50, help="rows to print (0: all)")
    read.add_argument("--changelog", action="store_true", help="every change, not the state")
    read.set_defaults(func=cmd_read)

    demo = sub.add_parser("demo", help="embedded Postgres + Spark local, with a workload")
    demo.add_argument("--duration", type=float, default=45.0, help="seconds (0: until Ctrl-C)")
    demo.add_argument("--data", default="./demo-data", help="where the tables go")
    demo.add_argument("--port", type=int, default=8765, help="HTTP API port (0: any free)")
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TidemarkError as exc:
        print(f"tidemark: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
