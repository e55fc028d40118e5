"""The server-side objects replication needs: checks, publication, logical slot.

Everything here runs on a *normal* SQL connection except slot creation, which
uses the replication protocol's ``CREATE_REPLICATION_SLOT`` so it works for a
role that has REPLICATION but is not superuser. Errors say what was wrong and
what to run to fix it.

Slot and publication names are restricted to ``[a-z_][a-z0-9_]{0,62}`` (Postgres
already restricts slot names to lower-case letters, digits and ``_``), which keeps
them safe to splice into replication commands that take no parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import psycopg
import structlog
from psycopg import sql

from tidemark.errors import ReplicationError, SlotLostError
from tidemark.replication.catalog import check_name

log = structlog.get_logger("tidemark.replication")

# The source's WAL position: the last replayed on a standby (where decoding reads up
# to it, and a transaction is visible once its commit record is replayed), the
# current insert position on a primary.
SOURCE_WAL_LSN: Final = (
    "(case when pg_is_in_recovery() then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end)"
)

MIN_SERVER_MAJOR = 15


@dataclass(frozen=True, slots=True)
class SlotState:
    name: str
    plugin: str | None
    database: str | None
    active_pid: int | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    safe_wal_size: int | None
    invalidation_reason: str | None = None  # PG 17+ (e.g. idle_timeout on 18)


def _lsn(value: object) -> int | None:
    if value is None:
        return None
    from tidemark.lsn import Lsn

    return int(Lsn.parse(str(value)))


async def check_server(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
    """Server major version; raises unless it can serve logical replication."""
    major = conn.info.server_version // 10000
    if major < MIN_SERVER_MAJOR:
        raise ReplicationError(
            f"PostgreSQL {major} is not supported: tidemark needs PostgreSQL {MIN_SERVER_MAJOR} "
            "or newer"
        )
    row = await (await conn.execute("select current_setting('wal_level')")).fetchone()
    if row is None or row[0] != "logical":
        level = row[0] if row else "unknown"
        raise ReplicationError(
            f"wal_level is '{level}' on the source, but logical replication needs 'logical': "
            "run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL"
        )
    return major


# the comment on a publication tidemark created (``tidemark teardown`` drops only those)
CREATED_BY = "created by tidemark"

# Amazon RDS and Aurora give replication through membership in this role, not the
# REPLICATION attribute (their admin user cannot grant the attribute)
RDS_REPLICATION = "rds_replication"


async def role_can_replicate(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """The role may open replication connections: REPLICATION, a superuser, or (Amazon
    RDS, Aurora) a member of ``rds_replication``."""
    row = await (
        await conn.execute(
            "select r.rolreplication or r.rolsuper or exists ("
            " select 1 from pg_roles g where g.rolname = %s"
            " and pg_has_role(current_user, g.oid, 'member'))"
            " from pg_roles r where r.rolname = current_user",
            (RDS_REPLICATION,),
        )
    ).fetchone()
    return bool(row and row[0])


TableName = tuple[str, str]  # (schema, table), exactly as the catalog spells them


def _table_text(table: TableName) -> str:
    from tidemark.predicates.identifiers import format_identifier

    return ".".join(format_identifier(part) for part in table)


async def ensure_publication(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    name: str,
    tables: Sequence[TableName] | None,
    *,
    create: bool = True,
) -> bool:
    """Make sure publication ``name`` exists; returns True if it was created.

    ``tables=None`` creates it ``FOR ALL TABLES`` (needs superuser); otherwise
    ``FOR TABLE`` the given (schema, table) pairs, and adds any of them missing
    from an existing publication. With ``create=False`` tidemark neither creates nor
    changes the publication: a missing one, or a table missing from it, raises
    ReplicationError with the statement to run.
    """
    check_name("publication", name)
    row = await (
        await conn.execute("select puballtables from pg_publication where pubname = %s", (name,))
    ).fetchone()
    standby = await in_recovery(conn)
    if row is None:
        if standby:
            listed = ", ".join(_table_text(t) for t in tables or ()) or "..."
            raise ReplicationError(
                f"publication '{name}' does not exist, and the source is a standby, where "
                f"nothing can be created: run on the primary CREATE PUBLICATION {name} FOR "
                f"TABLE {listed} WITH (publish_via_partition_root = true); it reaches the "
                "standby by replication"
            )
        if not create:
            raise ReplicationError(
                f"publication '{name}' does not exist on the source: create it "
                f"(CREATE PUBLICATION {name} FOR TABLE ...) or allow tidemark to create it"
            )
        try:
            if tables is None:
                await conn.execute(
                    sql.SQL("create publication {} for all tables {}").format(
                        sql.Identifier(name), _VIA_ROOT
                    )
                )
            elif tables:
                await conn.execute(
                    sql.SQL("create publication {} for table {} {}").format(
                        sql.Identifier(name),
                        sql.SQL(", ").join(_table_ident(t) for t in tables),
                        _VIA_ROOT,
                    )
                )
            else:
                await conn.execute(
                    sql.SQL("create publication {} {}").format(sql.Identifier(name), _VIA_ROOT)
                )
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ReplicationError(
                f"cannot create publication '{name}': {exc.diag.message_primary}. Create it as "
                "a superuser (CREATE PUBLICATION ... FOR ALL TABLES) or list the shape tables"
            ) from exc
        # the mark `tidemark teardown` drops it by (a publication without it was made by
        # someone else); a crash before it leaves the publication unmarked: kept
        await conn.execute(
            sql.SQL("comment on publication {} is {}").format(
                sql.Identifier(name), sql.Literal(CREATED_BY)
            )
        )
        return True
    if tables and not row[0]:
        await add_tables_to_publication(conn, name, tables, alter=create and not standby)
    elif tables:
        await publish_via_root(conn, name, tables, alter=create and not standby)
    return False


async def in_recovery(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """The source is a standby (read-only: publications are made on the primary)."""
    row = await (await conn.execute("select pg_is_in_recovery()")).fetchone()
    return bool(row and row[0])


# Changes of a partitioned table's partitions are published as the root's, so a shape
# on the root follows one relation (a partition published on its own, without its
# root in the publication, is still published as itself)
_VIA_ROOT: Final = sql.SQL("with (publish_via_partition_root = true)")


async def publish_via_root(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    name: str,
    tables: Sequence[TableName],
    *,
    alter: bool = True,
) -> None:
    """A publication serving a partitioned table must publish via the root: turn it on
    (``alter``), or raise ReplicationError with the statement to run."""
    cur = await conn.execute(
        "select n.nspname, c.relname from pg_class c join pg_namespace n"
        " on n.oid = c.relnamespace where c.relkind = 'p' and (n.nspname, c.relname)"
        " in (select * from unnest(%s::text[], %s::text[]))",
        ([t[0] for t in tables], [t[1] for t in tables]),
    )
    partitioned = [(str(r[0]), str(r[1])) for r in await cur.fetchall()]
    if not partitioned:
        return
    row = await (
        await conn.execute("select pubviaroot from pg_publication where pubname = %s", (name,))
    ).fetchone()
    if row is None or row[0]:
        return
    statement = f"ALTER PUBLICATION {name} SET (publish_via_partition_root = true);"
    if await in_recovery(conn):
        statement += " (on the primary: the source is a standby)"
        alter = False
    if not alter:
        raise ReplicationError(
            f"publication '{name}' publishes the partitions of partitioned table(s) "
            f"{', '.join(_table_text(t) for t in partitioned)} as themselves, and tidemark "
            f"follows a partitioned table as one relation. Run as its owner: {statement}"
        )
    try:
        await conn.execute(
            sql.SQL("alter publication {} set (publish_via_partition_root = true)").format(
                sql.Identifier(name)
            )
        )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ReplicationError(
            f"cannot change publication '{name}': {exc.diag.message_primary}. Run as its "
            f"owner: {statement}"
        ) from exc
    log.info("publication.via_root", publication=name, tables=partitioned)


async def add_tables_to_publication(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    name: str,
    tables: Sequence[TableName],
    *,
    alter: bool = True,
) -> list[TableName]:
    """Add the tables missing from publication ``name``; returns those added.

    ``alter=False`` (``[source] create_publication = false``: the publication belongs
    to someone else) changes nothing: a missing table raises ReplicationError naming
    the ``ALTER PUBLICATION`` to run as the table's owner.
    """
    exists = await (
        await conn.execute("select 1 from pg_publication where pubname = %s", (name,))
    ).fetchone()
    if exists is None:
        raise ReplicationError(
            f"publication '{name}' does not exist on the source: create it (CREATE "
            f"PUBLICATION {name} FOR TABLE ...; as the tables' owner) or let tidemark "
            "create it ([source] create_publication = true)"
        )
    rows = await (
        await conn.execute(
            "select schemaname, tablename from pg_publication_tables where pubname = %s"
            # a partitioned table listed itself (its partitions appear above instead,
            # unless the publication publishes via the root)
            " union select n.nspname, c.relname from pg_publication_rel r"
            " join pg_publication p on p.oid = r.prpubid join pg_class c on c.oid = r.prrelid"
            " join pg_namespace n on n.oid = c.relnamespace where p.pubname = %s",
            (name, name),
        )
    ).fetchall()
    present = {(str(r[0]), str(r[1])) for r in rows}
    missing = [t for t in tables if tuple(t) not in present]
    if missing and await in_recovery(conn):
        statements = " ".join(
            f"ALTER PUBLICATION {name} ADD TABLE {_table_text(t)};" for t in missing
        )
        raise ReplicationError(
            f"table(s) {', '.join(_table_text(t) for t in missing)} are not in publication "
            f"'{name}', and the source is a standby, where nothing can be changed: run on "
            f"the primary {statements} Then try again"
        )
    if missing and not alter:
        statements = " ".join(
            f"ALTER PUBLICATION {name} ADD TABLE {_table_text(t)};" for t in missing
        )
        raise ReplicationError(
            f"table(s) {', '.join(_table_text(t) for t in missing)} are not in publication "
            f"'{name}', and tidemark does not change it ([source] create_publication = "
            f"false). Run as the table's owner: {statements} Then try again"
        )
    for table in missing:
        try:
            await conn.execute(
                sql.SQL("alter publication {} add table {}").format(
                    sql.Identifier(name), _table_ident(table)
                )
            )
        except psycopg.errors.DuplicateObject:
            continue
        except psycopg.errors.InsufficientPrivilege as exc:
            text = _table_text(table)
            raise ReplicationError(
                f"cannot add table {text} to publication '{name}': "
                f"{exc.diag.message_primary}. Run ALTER PUBLICATION {name} ADD TABLE {text}; "
                "as the table owner"
            ) from exc
        except (
            psycopg.errors.InvalidParameterValue,
            psycopg.errors.FeatureNotSupported,
            psycopg.errors.ObjectNotInPrerequisiteState,
        ) as exc:  # a relation Postgres cannot publish
            detail = f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
            raise ReplicationError(
                f"cannot add table {_table_text(table)} to publication '{name}': "
                f"{exc.diag.message_primary}{detail}"
            ) from exc
    await publish_via_root(conn, name, tables, alter=alter)
    return missing


def _table_ident(table: TableName) -> sql.Composable:
    return sql.Identifier(*table)


async def slot_state(
    conn: psycopg.AsyncConnection[tuple[object, ...]], slot: str
) -> SlotState | None:
    row = await (
        await conn.execute(
            "select slot_name, plugin, database, active_pid, confirmed_flush_lsn::text,"
            " restart_lsn::text, wal_status, safe_wal_size,"
            " to_jsonb(s) ->> 'invalidation_reason'"
            " from pg_replication_slots s where slot_name = %s",
            (slot,),
        )
    ).fetchone()
    if row is None:
        return None
    return SlotState(
        name=str(row[0]),
        plugin=row[1],  # type: ignore[arg-type]
        database=row[2],  # type: ignore[arg-type]
        active_pid=row[3],  # type: ignore[arg-type]
        confirmed_flush_lsn=_lsn(row[4]),
        restart_lsn=_lsn(row[5]),
        wal_status=row[6],  # type: ignore[arg-type]
        safe_wal_size=row[7],  # type: ignore[arg-type]
        invalidation_reason=None if row[8] is None else str(row[8]),
    )


async def drop_slot(conn: psycopg.AsyncConnection[tuple[object, ...]], slot: str) -> None:
    """Drop a replication slot nobody uses (an invalidated one, before it is recreated)."""
    await conn.execute("select pg_drop_replication_slot(%s)", (slot,))


def check_slot_usable(state: SlotState, slot: str, dbname: str) -> None:
    """Raise unless ``state`` is a live pgoutput slot of database ``dbname``."""
    if state.plugin != "pgoutput":
        raise ReplicationError(
            f"replication slot '{slot}' uses plugin '{state.plugin}', not 'pgoutput': choose "
            f"another slot name, or drop it (SELECT pg_drop_replication_slot('{slot}')) if "
            "nothing else uses it"
        )
    if state.database != dbname:
        raise ReplicationError(
            f"replication slot '{slot}' belongs to database '{state.database}', not "
            f"'{dbname}': choose another slot name"
        )
    if state.wal_status == "lost":
        raise SlotLostError(
            f"replication slot '{slot}' was invalidated (wal_status = 'lost'): Postgres removed "
            "WAL it still needed, so changes were lost. Drop the slot and resync every shape"
        )


FAILOVER_MIN_MAJOR = 17


def create_slot_command(
    slot: str, *, temporary: bool = False, failover: bool = False, server_major: int = 16
) -> str:
    """The walsender command creating the slot. ``failover``: a PG 17 failover slot,
    synchronised to physical standbys (``sync_replication_slots`` on the standby,
    ``synchronized_standby_slots`` on the primary), so a promoted standby has it at
    the same position; refused with the reason on older servers."""
    check_name("slot", slot)
    temp = " TEMPORARY" if temporary else ""
    if not failover:
        return f"CREATE_REPLICATION_SLOT {slot}{temp} LOGICAL pgoutput NOEXPORT_SNAPSHOT"
    if temporary:
        raise ReplicationError("a temporary slot cannot be a failover slot")
    if server_major < FAILOVER_MIN_MAJOR:
        raise ReplicationError(
            f"[source] failover_slot = true needs PostgreSQL {FAILOVER_MIN_MAJOR} or newer "
            f"(the source is {server_major}): set it to false, or upgrade the source"
        )
    return f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"


async def create_slot(
    repl: psycopg.AsyncConnection[tuple[object, ...]],
    slot: str,
    *,
    temporary: bool = False,
    failover: bool = False,
    server_major: int = 16,
) -> int:
    """Create a logical pgoutput slot over the replication connection; its consistent LSN."""
    command = create_slot_command(
        slot, temporary=temporary, failover=failover, server_major=server_major
    )
    try:
        cur = await repl.execute(command)
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:
        raise ReplicationError(
            f"cannot create slot '{slot}': {exc.diag.message_primary}. Check wal_level = "
            "logical and max_replication_slots on the source"
        ) from exc
    except psycopg.errors.ConfigurationLimitExceeded as exc:
        raise ReplicationError(
            f"cannot create slot '{slot}': {exc.diag.message_primary}. Raise "
            "max_replication_slots on the source or drop unused slots"
        ) from exc
    row = await cur.fetchone()
    assert row is not None
    return _lsn(row[1]) or 0
