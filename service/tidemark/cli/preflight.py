"""``tidemark config check``: everything that would stop ``tidemark run``, checked first.

Each check gives ok/failed and a sentence saying what was found or what to do.
Nothing is created or changed: a missing slot or publication is reported as
"will be created" when the settings allow it.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pydantic import ValidationError

from tidemark.conninfo import redact_text
from tidemark.errors import ConfigError, TidemarkError
from tidemark.replication import slot as slots
from tidemark.replication.catalog import validate_shape
from tidemark.settings.config import Settings
from tidemark.shapes.model import ShapeDefinition
from tidemark.spark import s3a_jars
from tidemark.state import objectstore


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = False  # ok, but something the operator should know (printed "warn")
    skipped: bool = False  # not made: what it needs failed first (printed "skip")


def _per_change_path() -> Check:
    """Which decoder and batch builder run: compiled (``tidemark._fastpath``) or the
    pure-Python reference, which is correct but slower (a warning, not a failure)."""
    from tidemark.pgoutput.fastpath import FAST, PATH

    return Check("per-change path", True, PATH, warning=FAST is None)


async def run_checks(settings: Settings) -> list[Check]:
    out: list[Check] = []
    out.append(_per_change_path())
    out.append(_spark(settings))
    out.append(_sink(settings))
    shapes = shape_problems(settings)
    out.append(
        Check("shapes as written", not shapes, "; ".join(shapes) or f"{len(settings.shapes)} ok")
    )
    src = settings.source
    try:
        conn = await psycopg.AsyncConnection.connect(src.dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = redact_text(str(exc), src.dsn).strip()
        out.append(
            Check(
                "source connection",
                False,
                f"{reason}\n\tCheck [source] dsn (TIDEMARK_SOURCE__DSN) and that PostgreSQL runs "
                "and accepts this login",
            )
        )
        later = ["server", "replication role", "slot", "publication"]
        later += [f"shape {s.name}" for s in settings.shapes]
        out += [Check(n, True, "not checked: no source connection", skipped=True) for n in later]
        return out
    try:
        out.append(
            Check(
                "source connection",
                True,
                f"{conn.info.user}@{conn.info.host}:{conn.info.port}/{conn.info.dbname}",
            )
        )
        try:
            major = await slots.check_server(conn)
            out.append(Check("server", True, f"PostgreSQL {major}, wal_level = logical"))
        except TidemarkError as exc:
            out.append(Check("server", False, str(exc)))
        if await slots.in_recovery(conn):
            out.append(await _standby(conn))
        elif src.failover_slot:
            out.append(await _failover(conn, src.slot))
        can = await slots.role_can_replicate(conn)
        out.append(
            Check(
                "replication role",
                can,
                "role may replicate (REPLICATION, a superuser, or rds_replication on RDS)"
                if can
                else f"role {conn.info.user} lacks REPLICATION: ALTER ROLE "
                f"{conn.info.user} REPLICATION;",
            )
        )
        state = await slots.slot_state(conn, src.slot)
        if state is None:
            out.append(
                Check(
                    "slot",
                    src.create_slot,
                    f"slot '{src.slot}' will be created"
                    if src.create_slot
                    else f"slot '{src.slot}' does not exist and create_slot is false",
                )
            )
        else:
            try:
                slots.check_slot_usable(state, src.slot, conn.info.dbname)
                out.append(
                    Check(
                        "slot",
                        True,
                        f"slot '{src.slot}' ok (wal_status "
                        f"{state.wal_status}, active pid {state.active_pid})",
                    )
                )
            except TidemarkError as exc:
                out.append(Check("slot", False, str(exc)))
        row = await (
            await conn.execute(
                "select puballtables from pg_publication where pubname = %s", (src.publication,)
            )
        ).fetchone()
        if row is None:
            out.append(
                Check(
                    "publication",
                    src.create_publication,
                    f"publication '{src.publication}' will be created"
                    if src.create_publication
                    else f"publication '{src.publication}' does not exist",
                )
            )
        else:
            out.append(
                Check(
                    "publication",
                    True,
                    f"publication '{src.publication}' exists" + (" (all tables)" if row[0] else ""),
                )
            )
        # a publication tidemark may not change must hold every shape's table already
        fixed_publication = row is not None and not row[0] and not src.create_publication
        for declared in settings.shapes:
            name = f"shape {declared.name}"
            try:
                definition = ShapeDefinition(**declared.model_dump())
                checked = await validate_shape(conn, definition)
                if fixed_publication and not src.publish_all_tables:
                    await slots.add_tables_to_publication(
                        conn,
                        src.publication,
                        [(definition.schema_name, definition.table_name)],
                        alter=False,
                    )
                text = ", ".join(f"{c} ({t})" for c, t in checked.as_text)
                out.append(
                    Check(
                        name,
                        True,
                        f"{definition.table}: ok" + (f"; kept as text: {text}" if text else ""),
                    )
                )
            except TidemarkError as exc:
                out.append(Check(name, False, str(exc)))
    finally:
        await conn.close()
    return out


async def _standby(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> Check:
    """What a standby source needs (logical decoding on a standby: PostgreSQL 16+)."""
    major = conn.info.server_version // 10000
    if major < 16:
        return Check(
            "standby source",
            False,
            f"the source is a standby of PostgreSQL {major}: logical decoding on a standby "
            "needs PostgreSQL 16 or newer; point the DSN at the primary",
        )
    row = await (await conn.execute("select current_setting('hot_standby_feedback')")).fetchone()
    if not row or row[0] != "on":
        return Check(
            "standby source",
            False,
            "the source is a standby with hot_standby_feedback off: the primary may remove "
            "catalog rows the slot still needs, which invalidates it. Run on the standby "
            "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();",
        )
    return Check(
        "standby source",
        True,
        "the source is a standby (hot_standby_feedback on): the primary needs wal_level = "
        "logical; the publication is made on the primary; the slot is created here, and "
        "its creation waits for the primary to log its running transactions, which an idle "
        "primary does only rarely: run SELECT pg_log_standby_snapshot(); on the primary if "
        "it seems stuck",
    )


async def _failover(conn: psycopg.AsyncConnection[tuple[object, ...]], slot: str) -> Check:
    """A failover slot is only as safe as ``synchronized_standby_slots``: without it a
    standby promoted after falling behind has the slot, but not every transaction
    tidemark received (the new timeline forks below them: a gap, found at start)."""
    major = conn.info.server_version // 10000
    if major < slots.FAILOVER_MIN_MAJOR:
        return Check(
            "failover slot",
            False,
            f"[source] failover_slot = true needs PostgreSQL {slots.FAILOVER_MIN_MAJOR} or "
            f"newer (the source is {major})",
        )
    row = await (
        await conn.execute("select current_setting('synchronized_standby_slots', true)")
    ).fetchone()
    if not row or not row[0]:
        return Check(
            "failover slot",
            True,
            f"slot '{slot}' is a failover slot but synchronized_standby_slots is not set on "
            "the primary: a standby that falls behind can be promoted without transactions "
            "tidemark already received, and tidemark then stops with a stream gap. Set it "
            "to the physical slots of the standbys that may be promoted",
            warning=True,
        )
    return Check("failover slot", True, f"standbys kept ahead of the slot: {row[0]}")


def _spark(settings: Settings) -> Check:
    """Java for a driver in this process; for Spark Connect, the client and the server."""
    remote = settings.spark.remote
    if not remote:
        return _java()
    from tidemark.spark import check_connect

    try:
        check_connect(remote, timeout_s=5.0)
    except TidemarkError as exc:
        return Check("spark connect", False, str(exc))
    return Check("spark connect", True, f"{remote} answers (no Java needed here)")


def _java() -> Check:
    from tidemark.spark import java_major_version

    major = java_major_version()
    if major is None:
        return Check("java", False, "no java found: install openjdk-17-jre-headless")
    return Check("java", major >= 17, f"Java {major}" + ("" if major >= 17 else ": need 17+"))


def sink_root_problem(root: str) -> str | None:
    """Why ``[sink] root`` cannot hold the lake (None: it can): made if missing, and a
    file written and removed in it. The message names the setting and the fix."""
    if "://" in root:
        return None
    path = Path(root)
    fix = (
        "set [sink] root (or TIDEMARK_SINK__ROOT) to a folder this user may create and "
        "write, e.g. /var/lib/tidemark/lake"
    )
    if path.exists() and not path.is_dir():
        return f"[sink] root = {root!r} is a file, not a folder: {fix}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tidemark-check-"):
            pass
    except OSError as exc:
        return f"[sink] root = {root!r} cannot be used ({exc.strerror or exc}): {fix}"
    return None


def shape_problems(settings: Settings) -> list[str]:
    """What is wrong with the declared shapes without asking the source: names, tables,
    columns and ``where`` as written, and names declared twice."""
    out: list[str] = []
    seen: set[str] = set()
    for i, shape in enumerate(settings.shapes, start=1):
        label = f"[[shapes]] #{i} ({shape.name!r})"
        try:
            ShapeDefinition(**shape.model_dump())  # (its `where` is parsed here too)
        except (ValidationError, TidemarkError) as exc:
            out.append(f"{label}: {exc}")
            continue
        if shape.name in seen:
            out.append(f"{label}: the name is declared twice; shape names must be unique")
        seen.add(shape.name)
    return out


async def source_problems(settings: Settings, connect_timeout_s: int = 5) -> list[str]:
    """What ``run`` checks on the source before Spark starts: a server tidemark can
    stream from (logical WAL, a supported version) and a role that may replicate, each
    said with the fix. An unreachable source is not a problem here (the service
    connects and retries on its own: a source started with it may come up later); nor
    are the slot and the shapes' tables, which the service handles shape by shape (one
    shape's table gone must not stop the others) or by policy (a slot lost)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            settings.source.dsn, autocommit=True, connect_timeout=connect_timeout_s
        )
    except psycopg.OperationalError:
        return []
    problems = []
    try:
        try:
            await slots.check_server(conn)
        except TidemarkError as exc:
            problems.append(str(exc))
        if not await slots.role_can_replicate(conn):
            user = conn.info.user
            problems.append(
                f"role {user} lacks REPLICATION: run ALTER ROLE {user} REPLICATION; as a "
                "superuser (on Amazon RDS: GRANT rds_replication TO " + user + ";)"
            )
    finally:
        await conn.close()
    return problems


def static_problems(settings: Settings) -> list[str]:
    """What ``tidemark run`` refuses before it starts Spark or connects anywhere."""
    problems = shape_problems(settings)
    sink = sink_root_problem(settings.sink.root) or connector_problem(settings)
    return problems + ([sink] if sink is not None else [])


def connector_problem(settings: Settings) -> str | None:
    """An ``s3://`` root whose Spark (local: tidemark's own JVM) lacks S3A's jars."""
    if not objectstore.is_remote(settings.sink.root) or settings.spark.remote:
        return None
    try:
        s3a_jars()
    except ConfigError as exc:
        return str(exc)
    return None


def object_store_problem(settings: Settings) -> str | None:
    """Why an ``s3://`` root cannot hold the lake (None: it can, or the root is a local
    folder): a file put, read back and removed under ``<root>/_tidemark/``, through the
    store ``[s3]`` describes. The message names the setting and what to do."""
    root = settings.sink.root
    if not objectstore.is_remote(root):
        return None
    try:
        objectstore.configure(objectstore.S3Access.from_settings(settings.s3))
        probe = objectstore.join(root, "_tidemark", f".tidemark-check-{uuid.uuid4()}")
        objectstore.replace(probe, b"tidemark")
        if objectstore.read(probe) != b"tidemark":
            return f"[sink] root = {root!r}: a file written there read back otherwise"
        objectstore.delete([probe])
    except TidemarkError as exc:
        return f"[sink] root = {root!r}: {exc}"
    return None


def _sink(settings: Settings) -> Check:
    root = settings.sink.root
    if objectstore.is_remote(root):
        found = connector_problem(settings) or object_store_problem(settings)
        if found is not None:
            return Check("sink", False, found)
        endpoint = settings.s3.endpoint or f"AWS S3 ({settings.s3.region})"
        return Check("sink", True, f"{root} on {endpoint}: written, read and removed a file")
    if "://" in root:
        return Check("sink", True, f"{root} (remote: not checked)")
    problem = sink_root_problem(root)
    if problem is not None:
        return Check("sink", False, problem)
    path = Path(root)
    free = os.statvfs(path)
    gib = free.f_bavail * free.f_frsize / 2**30
    return Check("sink", True, f"{path.resolve()} writable, {gib:.1f} GiB free")
