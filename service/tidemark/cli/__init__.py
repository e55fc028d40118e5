"""The ``tidemark`` command.

``run`` starts the service; ``config check`` validates settings, the source and the
declared shapes; ``shapes``, ``status`` and ``wait`` talk to a running service over
its HTTP API; ``read`` reads a shape's rows straight from the sink root (without
Spark unless ``--spark``), ``tables`` lists every shape's tables there; ``teardown``
drops what tidemark created in Postgres; ``demo`` runs everything on embedded
defaults.

Exit codes: 0 success, 1 a clear error (printed on stderr), 2 a usage or configuration
error (a bad argument, an unreadable or invalid settings file or variable), 3 a wait
that timed out, 4 ``config check`` found problems (``run``: the source refuses
tidemark, before Spark starts). Bad input never ends in a traceback.
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

from tidemark import exit_reason, version
from tidemark.cli.args import (
    count,
    duration,
    lsn_text,
    page_size,
    port,
    positive_seconds,
    service_url,
    url_arg,
    wait_seconds,
)
from tidemark.errors import ConfigError, TidemarkError
from tidemark.lsn import Lsn, format_lsn, lsn_json
from tidemark.settings.config import Settings


def _settings(args: argparse.Namespace, require_dsn: bool = False) -> Settings:
    from tidemark.settings.config import load_settings
    from tidemark.state import objectstore

    settings = load_settings(args.config, require_dsn=require_dsn)
    # an s3:// root (the settings', or --root's) is reached with [s3]'s endpoint and keys
    objectstore.configure(objectstore.S3Access.from_settings(settings.s3))
    return settings


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
                try:
                    return response.status, json.loads(raw) if raw else None
                except ValueError:
                    raise TidemarkError(
                        f"{self.url} answered {path} with something that is not JSON: is "
                        "--url (or [http] host/port) the tidemark API?"
                    ) from None
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
        except OSError as exc:  # a timeout or a reset while reading the answer
            raise TidemarkError(
                f"tidemark at {self.url} did not answer {method} {path} ({exc}): is it "
                "overloaded or stopping? Try again, or check its log"
            ) from exc


def _api(args: argparse.Namespace) -> Api:
    url = args.url or os.environ.get("TIDEMARK_URL") or None
    if url is not None:
        url = service_url(url)
    # an empty variable means "not set" (compose passes ${TIDEMARK_ADMIN_TOKEN:-})
    token = args.token or os.environ.get("TIDEMARK_HTTP__ADMIN_TOKEN") or None
    if url is None or token is None:
        settings = _settings(args)
        host = settings.http.host
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        url = url or f"http://{host}:{settings.http.port}"
        token = token or settings.http.admin_token.get_secret_value()
    return Api(url, token or None)


def _shape_path(name: str) -> str:
    return "/v1/shapes/" + urllib.parse.quote(name, safe="")


def _check(status: int, body: Any, ok: tuple[int, ...] = (200,)) -> Any:
    if status not in ok:
        raise TidemarkError(f"{_problem_text(body)} (HTTP {status})")
    return body


def _problem_text(body: Any) -> str:
    """What an error answer says: a problem's ``detail`` (RFC 9457), else the ``error``
    of a service before problem details, else its ``title``, else the body."""
    if not isinstance(body, dict):
        return str(body)
    for member in ("detail", "error", "title"):
        if isinstance(body.get(member), str) and body[member]:
            return str(body[member])
    return json.dumps(body)


def _lsn(value: dict[str, Any] | None) -> str:
    return value["lsn"] if value else "-"


def _count_text(value: int | None) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    lines = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
    return "\n".join(text.rstrip() for text in lines)


# -- commands --------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from tidemark.allocators import prepare_process

    prepare_process()  # before pyarrow loads
    from tidemark.app import Service
    from tidemark.cli.preflight import object_store_problem, source_problems, static_problems
    from tidemark.observability import configure_logging

    settings = _settings(args, require_dsn=True)
    # what `config check` finds without the source, before Spark starts (exit 2)
    problems = static_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems) + " (tidemark config check lists every check)")
    # then what the source refuses tidemark (exit 4, as config check's failures)
    problems = asyncio.run(source_problems(settings))
    store = object_store_problem(settings)  # (an s3:// root: reached, written)
    problems += [store] if store is not None else []
    if problems:
        return _fail(args, "; ".join(problems) + " (tidemark config check lists every check)", 4)
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(Service(settings, config_path=args.config).run())
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from tidemark.cli.preflight import run_checks
    from tidemark.settings.config import explain

    settings = _settings(args, require_dsn=True)
    print(explain(settings, args.config))
    results = asyncio.run(run_checks(settings))
    width = max(len(r.name) for r in results)
    for r in results:
        mark = ("skip" if r.skipped else "warn" if r.warning else "ok  ") if r.ok else "FAIL"
        print(f"{mark} {r.name.ljust(width)}  {r.detail}")
    failed = [r for r in results if not r.ok]
    skipped = [r for r in results if r.skipped]
    passed = len(results) - len(failed) - len(skipped)
    print(
        f"\n{passed} checks passed, {len(failed)} failed"
        + (f", {len(skipped)} not checked" if skipped else "")
    )
    return 4 if failed else 0


def cmd_shapes(args: argparse.Namespace) -> int:
    api = _api(args)
    if args.action == "list":
        query = urllib.parse.urlencode(
            [("state", state) for state in args.state or []]
            + ([("limit", str(args.limit))] if args.limit is not None else [])
            + ([("cursor", args.cursor)] if args.cursor else [])
        )
        body = _check(*api.call("GET", "/v1/shapes" + (f"?{query}" if query else "")))
        if args.output == "json":
            print(json.dumps(body["shapes"], indent=2))
            return 0
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
        if body.get("next_cursor"):
            print(f"more: tidemark shapes list --cursor {body['next_cursor']} ...")
    elif args.action == "show":
        shape = _check(*api.call("GET", _shape_path(args.name)))
        print(json.dumps(shape, indent=2) if args.output == "json" else _shape_text(shape))
    elif args.action == "remove":
        _check(*api.call("DELETE", _shape_path(args.name)), ok=(204,))
        print(f"shape {args.name} removed (its table stays under the sink root)")
    elif args.action == "resync":
        _check(*api.call("POST", _shape_path(args.name) + "/resync"), ok=(202,))
        print(f"shape {args.name} is being rebuilt from a fresh snapshot")
        if args.wait:
            return _wait_ready(api, args.name, args.timeout)
    elif args.action == "add":
        body = {"name": args.name, "table": args.table}
        if args.where:
            body["where"] = args.where
        if args.columns:
            from tidemark.shapes.column_casts import split_column_list  # keeps startup light

            body["columns"] = split_column_list(args.columns)
        if args.replica:
            body["replica"] = args.replica
        shape = _check(*api.call("POST", "/v1/shapes", body), ok=(200, 201))
        print(f"shape {shape['name']} added on {shape['table']} (state {shape['state']})")
        if args.wait:
            return _wait_ready(api, shape["name"], args.timeout)
    return 0


def _shape_text(s: dict[str, Any]) -> str:
    """One shape for people: its definition, state, progress and where its tables are."""
    lag = "-"
    if s.get("lag_bytes") is not None:
        lag = f"{human_bytes(s['lag_bytes'])}, {human_seconds(s.get('lag_s'))}"
    lines = [
        ("shape", s["name"]),
        ("table", s["table"]),
        ("where", s.get("where") or "-"),
        ("columns", ", ".join(s["columns"]) if s.get("columns") else "all"),
        ("state", s["state"] + (" (stalled)" if s.get("stalled") else "")),
        ("why not ready", s.get("reason") or "-"),
        ("frontier", _lsn(s.get("frontier"))),
        ("lag", lag),
        (
            "rows",
            f"{s.get('rows_backfilled') or 0:,} from its snapshot + "
            f"{s['rows_committed']:,} changes since start",
        ),
        ("continuity", _continuity(s.get("continuity"))),
    ]
    tables = s.get("tables")
    if tables:
        log = tables["changelog"]
        lines.append(("format", tables["format"]))
        lines.append(
            ("changelog", f"{log['name']} (version {log['version']}, {log['files']} files)")
        )
        lines.append(("primary key", ", ".join(log["primary_key"])))
        current = tables.get("current")
        if current:
            folded = current.get("folded")
            how_far = (
                f"folded {folded['lsn']}, {human_bytes(current.get('lag_bytes'))} behind, "
                f"{current.get('rows_waiting')} row(s) waiting"
                if folded
                else "never refreshed"
            )
            lines.append(
                ("current", f"{current['name']} (version {current['version']}, {how_far})")
            )
        else:
            lines.append(("current", "-"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


def _wait_ready(api: Api, name: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shape = _check(*api.call("GET", _shape_path(name)))
        progress = shape.get("backfill")
        if shape["state"] == "error":
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


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover (the loop returns)


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60)}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60)}m"


def _shape_row(s: dict[str, Any]) -> list[str]:
    lag = "-"
    if s.get("lag_bytes") is not None:
        lag = f"{human_bytes(s['lag_bytes'])}, {human_seconds(s.get('lag_s'))}"
    backfilled = s.get("rows_backfilled")
    rows = f"{'-' if backfilled is None else f'{backfilled:,}'} + {s['rows_committed']:,}"
    last = s.get("last_commit")
    return [
        s["name"],
        s["state"] + (" (stalled)" if s.get("stalled") else ""),
        _lsn(s["frontier"]),
        lag,
        rows,
        f"{s['pending_rows']:,}",
        f"{human_seconds(last['age_s'])} ago" if last else "never",
        _continuity(s.get("continuity")),
        s.get("reason") or "-",
    ]


def _continuity(c: dict[str, Any] | None) -> str:
    """Since when and from which LSN the table is continuous; else the last
    invalidation (when and why its previous claim ended)."""
    if not c:
        return "-"
    if c.get("since"):
        return f"since {c['since']} from {_lsn(c.get('from'))}"
    last = c.get("last_invalidation")
    if last:
        return f"no claim: {last['reason']} at {last['at']}"
    return "no claim yet"


def cmd_status(args: argparse.Namespace) -> int:
    api = _api(args)
    progress = _check(*api.call("GET", "/v1/progress"))
    shapes = _check(*api.call("GET", "/v1/shapes"))["shapes"]
    ready = _check(*api.call("GET", "/readyz"), ok=(200, 503))
    if args.output == "json":
        print(
            json.dumps(
                {"url": api.url, "ready": ready, "progress": progress, "shapes": shapes}, indent=2
            )
        )
        return 0
    pg = progress.get("postgres") or {}
    verdict = "ready" if ready["ready"] else "NOT READY"
    waiting = [s["name"] for s in shapes if not s.get("ready")]
    if waiting:  # readiness is about the service: a backfill is normal operation
        verdict += f"; {len(waiting)} of {len(shapes)} shape(s) not ready yet (below)"
    role = progress.get("role", "leader")
    print(f"tidemark at {api.url}: {role}, {progress['phase']}, {verdict}")
    for reason in ready.get("reasons", []):
        print(f"  - {reason}")
    print(f"  received      {_lsn(progress['received'])}  (from the replication stream)")
    print(
        f"  acknowledged  {_lsn(progress['flushed'])}  (committed in every shape; "
        "Postgres may recycle WAL before it)"
    )
    if pg and pg.get("confirmed_flush") is not None:
        safe = pg.get("safe_wal_size")
        print(
            f"  postgres      (sampled {human_seconds(pg.get('age_s'))} ago) current WAL "
            f"{_lsn(pg.get('current_wal'))}, slot confirmed {_lsn(pg.get('confirmed_flush'))} "
            f"({human_bytes(pg.get('lag_bytes'))} behind), replay lag "
            f"{human_seconds(pg.get('replay_lag_s'))}, wal_status {pg.get('wal_status') or '-'}"
        )
        print(
            f"  retained WAL  {human_bytes(pg.get('retained_wal_bytes'))} kept by the slot; "
            f"safe_wal_size {'unlimited' if safe is None else human_bytes(safe)}"
        )
    else:
        print(
            "  postgres      no sample of the slot yet (the monitor looks every monitor.period_s)"
        )
    print()
    header = [
        "shape",
        "state",
        "frontier",
        "lag (bytes, time)",
        "rows: snapshot + changes",
        "pending",
        "last commit",
        "continuous",
        "why not ready",
    ]
    print(_table([_shape_row(s) for s in shapes], header) if shapes else "no shapes yet")
    if shapes:
        print(
            "\nlag: received minus the shape's frontier, and how long the oldest transaction"
            " it lacks has waited.\nrows: written by its last backfill (the snapshot), plus"
            " the changes committed since tidemark started.\ncontinuous: since when (and from"
            " which snapshot LSN) the table holds every change of this stream; a shape without"
            " a claim is being rebuilt, and says why its last claim ended."
        )
    for v in progress.get("violations", []):
        print(f"VIOLATION {v['kind']}: {v['message']}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    api = _api(args)
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
    from tidemark.errors import SinkError
    from tidemark.sink.root import root_format

    settings = _settings(args)
    root = args.root or settings.sink.root
    as_of = int(Lsn.parse(args.as_of)) if args.as_of else None
    # the root's format as the service recorded it (the catalog's password: from here)
    tables = root_format(
        root, settings.iceberg.catalog_uri or None, settings.iceberg.properties or None
    )
    if not tables.changelog(root, args.shape).exists():  # say so before anything starts
        raise SinkError(
            f"shape '{args.shape}' has no table under {root}: is the name right, and has "
            "tidemark committed anything for it yet?"
        )
    if args.spark:
        rows = _read_with_spark(args, settings, root, as_of, tables)
    else:
        rows = _read_arrow(args, root, as_of, tables)
    limit = args.limit if args.limit is not None else (50 if args.format == "text" else 0)
    total = rows.num_rows
    shown = rows.slice(0, limit) if limit else rows
    if args.format in ("csv", "parquet"):
        _write_rows(shown, args.format, args.out)
        if args.out:
            print(f"{shown.num_rows} row(s) written to {args.out} ({args.format})")
        return 0
    if args.format == "json":
        text = json.dumps(_rows_json(args, shown, total, as_of), indent=1) + "\n"
    else:
        text = _rows_text(shown, total, as_of)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


# a text cell longer than this is cut (the whole value: -o json, csv or parquet)
CELL_WIDTH = 48


def _cell_text(value: Any, column: str) -> str:
    if value is None:
        return "NULL"
    text = format_lsn(value) if column == "_lsn" else str(value)
    return text.replace("\n", "\\n")


def _rows_text(rows: Any, total: int, as_of: int | None) -> str:
    """Rows as a table for people: ``_lsn`` as Postgres prints LSNs, long values cut."""
    columns = rows.column_names
    whole = [[_cell_text(r[c], c) for c in columns] for r in rows.to_pylist()]
    cut = any(len(cell) > CELL_WIDTH for row in whole for cell in row)
    values = [[c if len(c) <= CELL_WIDTH else c[: CELL_WIDTH - 1] + "…" for c in r] for r in whole]
    more = "" if rows.num_rows == total else f", {rows.num_rows} shown"
    when = "" if as_of is None else f" as of {format_lsn(as_of)}"
    note = f"; values over {CELL_WIDTH} characters cut (-o json, csv or parquet: whole)"
    return f"{_table(values, columns)}\n\n{total} row(s){more}{when}{note if cut else ''}\n"


def _rows_json(args: argparse.Namespace, rows: Any, total: int, as_of: int | None) -> Any:
    """Rows for scripts: one document, LSNs as the API gives them (``{lsn, value}``),
    decimals as text (no precision lost), times in ISO 8601, bytes as hex."""
    import datetime
    import decimal

    def plain(value: Any) -> Any:
        if isinstance(value, decimal.Decimal):
            return str(value)
        if isinstance(value, datetime.date | datetime.time):
            return value.isoformat()
        if isinstance(value, datetime.timedelta):
            return value.total_seconds()
        if isinstance(value, bytes):
            return "\\x" + value.hex()
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    listed = [
        {c: lsn_json(v) if c == "_lsn" else plain(v) for c, v in row.items()}
        for row in rows.to_pylist()
    ]
    return {
        "shape": args.shape,
        "changelog": bool(args.changelog),
        "as_of": lsn_json(as_of),
        "total": total,
        "rows": listed,
    }


def cmd_tables(args: argparse.Namespace) -> int:
    """Every shape's tables under the sink root, read from the root itself (no service
    needed): where they are, their versions, the LSN the current table holds."""
    from tidemark import read
    from tidemark.sink.root import root_format

    settings = _settings(args)
    root = args.root or settings.sink.root
    tables = root_format(
        root, settings.iceberg.catalog_uri or None, settings.iceberg.properties or None
    )
    found = [read.describe_tables(root, shape, tables) for shape in read.shapes_at(root)]
    if args.output == "json":
        print(json.dumps(found, indent=2))
        return 0
    rows = [
        [
            t["shape"],
            t["format"],
            t["changelog"]["name"],
            str(t["changelog"]["version"]),
            t["current"]["name"] if t["current"] else "-",
            str(t["current"]["version"]) if t["current"] else "-",
            _lsn((t["current"] or {}).get("folded")),
            human_bytes((t["current"] or {}).get("lag_bytes")),
            _count_text((t["current"] or {}).get("rows_waiting")),
            _lsn(t["frontier"]),
        ]
        for t in found
    ]
    header = [
        *("shape", "format", "changelog", "version", "current", "version"),
        *("folded", "behind", "rows waiting", "frontier"),
    ]
    print(_table(rows, header))
    print(f"\n{len(found)} shape(s) under {root}")
    return 0


def cmd_jvm_archive(args: argparse.Namespace) -> int:
    """Make the Spark driver's class-data archives in the jar folder, each unless it is
    there (tidemark.cli.class_archive); delete the ones that no longer fit."""
    import time

    from tidemark.cli.class_archive import create_all
    from tidemark.spark import check_java, jars_dir

    check_java()
    started = time.monotonic()
    made = create_all(jars_dir())
    names = ", ".join(str(p) for p in made)
    print(f"class-data archives: {names} ({time.monotonic() - started:.0f} s)")
    return 0


def cmd_teardown(args: argparse.Namespace) -> int:
    """Drop the slot (and the publication tidemark created); with --purge, this
    instance's tables and state under the sink root. Shows the plan, then asks."""
    from tidemark.cli.teardown import carry_out, make_plan

    settings = _settings(args, require_dsn=True)
    plan = asyncio.run(make_plan(settings, args.purge))
    print("tidemark teardown will:")
    for line in plan.describe():
        print(f"  {line}")
    if not args.yes:
        if not sys.stdin.isatty():
            print("tidemark: not run: confirm with --yes (no terminal to ask on)", file=sys.stderr)
            return 2
        answer = input(f"Type the slot's name ({plan.slot}) to go on: ").strip()
        if answer != plan.slot:
            print("tidemark: nothing done", file=sys.stderr)
            return 1
    for line in asyncio.run(carry_out(settings, plan)):
        print(line)
    return 0


def _read_arrow(args: argparse.Namespace, root: str, as_of: int | None, tables: Any) -> Any:
    """The rows without Spark: pyarrow reads the snapshot's files, the fold is Arrow's."""
    import pyarrow.compute as pc

    from tidemark import read

    if not args.changelog:
        return read.arrow_current(root, args.shape, as_of, tables)
    rows = read.arrow_changelog(root, args.shape, tables)
    if as_of is not None:
        rows = rows.filter(pc.less_equal(rows["_lsn"], as_of))
    return rows.sort_by([("_lsn", "ascending"), ("_op", "ascending")])


def _read_with_spark(
    args: argparse.Namespace, settings: Any, root: str, as_of: int | None, tables: Any
) -> Any:
    """The rows through the configured Spark (local, a cluster, or Spark Connect)."""
    from tidemark import read
    from tidemark.spark import build_session, s3a_jars, with_s3a
    from tidemark.state import objectstore

    cfg = settings.spark
    conf = dict(cfg.conf)
    if objectstore.is_remote(root) and not cfg.remote:
        conf = with_s3a(conf, s3a_jars())
    spark = build_session(cfg.master, conf, "tidemark-read", cfg.remote)
    if args.changelog:
        frame = read.changelog(spark, root, args.shape, tables).orderBy("_lsn", "_op")
        if as_of is not None:
            frame = frame.where(frame["_lsn"] <= as_of)
    else:
        frame = read.current(spark, root, args.shape, as_of, tables)
    return frame.toArrow()


def _write_rows(rows: Any, fmt: str, out: str | None) -> None:
    """CSV or Parquet, to a file or to stdout. CSV holds no nested values: arrays,
    structs and maps are written as their JSON text."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    sink: Any = out if out is not None else sys.stdout.buffer
    if fmt == "csv":
        for i, field in enumerate(rows.schema):
            if pa.types.is_nested(field.type):
                text = [
                    None if v is None else json.dumps(v, default=str) for v in rows[i].to_pylist()
                ]
                rows = rows.set_column(i, field.name, pa.array(text, pa.string()))
        pacsv.write_csv(rows, sink)
    else:
        pq.write_table(rows, sink)
    if out is None:
        sys.stdout.buffer.flush()


def cmd_demo(args: argparse.Namespace) -> int:
    from tidemark.allocators import prepare_process

    prepare_process()  # before pyarrow loads
    from tidemark.demo.run import run_demo

    return run_demo(
        duration_s=args.duration, data_dir=args.data, port=args.port, table_format=args.format
    )


# -- the parser ----------------------------------------------------------------------------


CONFIG_HELP = "settings file (default: $TIDEMARK_CONFIG or ./tidemark.toml)"

SUMMARY = """\
tidemark streams a PostgreSQL database's changes into Delta or Iceberg tables, one
table per shape (a table, a where, columns), exactly once, and acknowledges WAL to
Postgres only once every shape has committed it."""

EXAMPLES = """\
examples:
  tidemark demo                                  try it: embedded Postgres and Spark
  tidemark config check                          settings, the source, the shapes
  tidemark run                                   the service (settings: ./tidemark.toml)
  tidemark shapes add orders_eu --table public.orders --where "region = 'eu'" --wait
  tidemark status                                how far each shape is
  tidemark read orders_eu --limit 10             a shape's rows, from the lake
  tidemark tables                                where each shape's tables are

Exit codes: 0 done, 1 an error (said on stderr), 2 bad settings or arguments, 3 a
wait that timed out, 4 config check found problems (run: the source refuses tidemark).
'tidemark COMMAND --help' says more; the docs: docs/reference/cli.md."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidemark",
        description=SUMMARY,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help=CONFIG_HELP)
    p.add_argument("--version", action="version", version=f"tidemark {version()}")
    # --config also after the subcommand (`tidemark run --config f`): SUPPRESS keeps the
    # value given before it when it is not repeated
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("run", help="run the service", parents=[common]).set_defaults(func=cmd_run)

    config = sub.add_parser("config", help="settings", parents=[common])
    config_sub = config.add_subparsers(dest="action", required=True)
    config_sub.add_parser(
        "check", help="validate settings, source and shapes", parents=[common]
    ).set_defaults(func=cmd_config_check)

    def api_args(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--url", type=url_arg, help="service URL (default from [http] or $TIDEMARK_URL)"
        )
        q.add_argument("--token", help="admin token (default from [http] admin_token)")

    def output_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "-o",
            "--output",
            choices=("text", "json"),
            default="text",
            help="text for people (default), or the API's JSON for scripts",
        )

    shapes = sub.add_parser("shapes", help="add, list, show, remove shapes", parents=[common])
    shapes_sub = shapes.add_subparsers(dest="action", required=True)
    add = shapes_sub.add_parser("add", help="add a shape", parents=[common])
    add.add_argument("name", help="the shape's name (its tables' folder name)")
    add.add_argument("--table", required=True, help="schema.table")
    add.add_argument("--where", help="SQL predicate")
    add.add_argument(
        "--columns",
        help="comma-separated columns (primary key is always in); 'amount::numeric(18,4)' "
        "or 'x::text' declares a column's lake type",
    )
    add.add_argument(
        "--replica",
        choices=["default", "full"],
        help="full: require REPLICA IDENTITY FULL on the table (default: only when the "
        "predicate reads columns outside the key)",
    )
    add.add_argument("--wait", action="store_true", help="wait until the shape is ready")
    add.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds --wait waits (600)"
    )
    verbs = {
        "list": "list every shape",
        "show": "show one shape (its API JSON)",
        "remove": "remove a shape (its tables stay on disk)",
        "resync": "rebuild a shape from a fresh snapshot",
    }
    for name, what in verbs.items():
        q = shapes_sub.add_parser(name, help=what, parents=[common])
        if name != "list":
            q.add_argument("name", help="the shape's name")
        if name in ("list", "show"):
            output_arg(q)
        if name == "list":
            q.add_argument(
                "--state",
                action="append",
                help="only shapes in this state (repeat, or separate with commas): "
                "backfilling, active, error, ...",
            )
            q.add_argument("--limit", type=page_size, help="at most this many shapes, by name")
            q.add_argument("--cursor", help="the shape name a page before ended with")
        if name == "resync":
            q.add_argument("--wait", action="store_true", help="wait until the shape is ready")
            q.add_argument(
                "--timeout",
                type=positive_seconds,
                default=600.0,
                help="seconds --wait waits (600)",
            )
    for q in [add, *(shapes_sub.choices[n] for n in ("list", "show", "remove", "resync"))]:
        api_args(q)
    shapes.set_defaults(func=cmd_shapes)

    status = sub.add_parser(
        "status", help="acknowledged LSNs, Postgres's view, frontiers", parents=[common]
    )
    api_args(status)
    output_arg(status)
    status.set_defaults(func=cmd_status)

    wait = sub.add_parser(
        "wait", help="wait until an LSN is replayed (and in a shape)", parents=[common]
    )
    wait.add_argument(
        "--lsn", required=True, type=lsn_text, help="the LSN, e.g. from pg_current_wal_lsn()"
    )
    wait.add_argument("--shape", help="also wait until this shape's frontier reaches it")
    wait.add_argument(
        "--timeout", type=wait_seconds, default=60.0, help="seconds, at most 300 (60)"
    )
    api_args(wait)
    wait.set_defaults(func=cmd_wait)

    read = sub.add_parser(
        "read", help="a shape's rows from the lake, without Spark", parents=[common]
    )
    read.add_argument("shape", help="the shape's name")
    read.add_argument(
        "--as-of", type=lsn_text, help="LSN to read as of (default: everything committed)"
    )
    read.add_argument("--root", help="sink root (default from [sink] root)")
    read.add_argument(
        "--limit", type=count, help="rows to show (0: all; default: 50 as text, all otherwise)"
    )
    read.add_argument("--changelog", action="store_true", help="every change, not the state")
    read.add_argument(
        "-o",
        "--output",
        "--format",
        dest="format",
        choices=("text", "json", "csv", "parquet"),
        default="text",
        help="text (a table for people, long values cut; default), json (one document "
        "for scripts), csv or parquet",
    )
    read.add_argument("--out", help="write to this file (default: stdout)")
    read.add_argument(
        "--spark",
        action="store_true",
        help="read through the configured [spark] (a cluster, Spark Connect) instead of "
        "pyarrow in this process",
    )
    read.set_defaults(func=cmd_read)

    tables_cmd = sub.add_parser(
        "tables", help="every shape's tables under the sink root", parents=[common]
    )
    tables_cmd.add_argument("--root", help="sink root (default from [sink] root)")
    output_arg(tables_cmd)
    tables_cmd.set_defaults(func=cmd_tables)

    teardown = sub.add_parser(
        "teardown",
        help="drop the slot and the publication tidemark created (--purge: the tables too)",
        parents=[common],
    )
    teardown.add_argument(
        "--purge",
        action="store_true",
        help="also remove this instance's tables and state under the sink root",
    )
    teardown.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    teardown.set_defaults(func=cmd_teardown)

    sub.add_parser(
        "jvm-archive",
        help="make the Spark driver's class-data archives (a faster start; in the jar folder)",
        parents=[common],
    ).set_defaults(func=cmd_jvm_archive)

    demo = sub.add_parser(
        "demo", help="embedded Postgres + Spark local, with a workload", parents=[common]
    )
    demo.add_argument("--duration", type=duration, default=45.0, help="seconds (0: until Ctrl-C)")
    demo.add_argument("--data", default="./demo-data", help="where the tables go")
    demo.add_argument("--port", type=port, default=8765, help="HTTP API port (0: any free)")
    demo.add_argument(
        "--format",
        choices=("delta", "iceberg"),
        default="delta",
        help="the table format (iceberg: its catalog a SQLite file under --data)",
    )
    demo.set_defaults(func=cmd_demo)
    return p


def _source_error(exc: BaseException) -> str | None:
    """A message for Postgres refusing us (unreachable, login, permission), else None."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return None
    from tidemark.conninfo import redact_text

    text = redact_text(str(exc).strip(), os.environ.get("TIDEMARK_SOURCE__DSN", ""))
    if isinstance(exc, psycopg.OperationalError):
        return (
            f"cannot connect to the source database: {text}\n"
            "Check [source] dsn (TIDEMARK_SOURCE__DSN) and that PostgreSQL runs and accepts "
            "this login; `tidemark config check` tests the settings one by one"
        )
    if isinstance(exc, psycopg.Error):
        return (
            f"the source database refused an operation: {text}\n"
            "`tidemark config check` tests the role's rights one by one"
        )
    return None


def _spark_error(exc: BaseException) -> str | None:
    """A message for Spark failing (to start, or a job), else None."""
    module = type(exc).__module__
    if not module.startswith(("pyspark", "py4j")):
        return None
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (
        f"Spark failed: {first}\nCheck [spark] master and conf (TIDEMARK_SPARK__MASTER, "
        "TIDEMARK_SPARK__CONF) and Java 17; the lines above (Spark's own log) say more"
    )


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    print(f"tidemark: {message}", file=sys.stderr)
    if args.func is cmd_run:  # for a container's health check (tidemark.exit_reason)
        exit_reason.record(message)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if argv is None and args.func is not cmd_run:
        # the command in a process of its own: its log lines on stderr, so that its
        # output (`-o json`, a CSV on stdout) is only what it prints (`run` sets up the
        # service's logging from its settings; a caller passing argv keeps its own)
        from tidemark.observability import configure_logging

        configure_logging()
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        return _fail(args, str(exc), 2)
    except TidemarkError as exc:
        return _fail(args, str(exc), 1)
    except OSError as exc:  # a file or socket the command needed
        return _fail(args, str(exc), 1)
    except Exception as exc:
        explained = _source_error(exc) or _spark_error(exc)
        if explained is None:
            if args.func is cmd_run:
                exit_reason.record(f"unexpected error {type(exc).__name__}: {exc}")
            raise
        return _fail(args, explained, 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
