"""The guide docs/guides/preparing-postgres.md, followed on a real server.

Every ```sql block of the guide runs in order, as a superuser, on a fresh database
holding the table the guide names (``public.orders``). Then the role the guide
created must do what tidemark does with it: open a replication connection and create
a logical slot there, read the table, find the table in the publication; and
``tidemark config check``, given the guide's tidemark.toml, must pass every check.

The guide's role is cluster-wide. The embedded servers' superuser is itself named
tidemark, so there the test creates the guide's role as ``tidemark_docs`` (see
``prepared``), and drops it afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from .conftest import PgDatabase, one_server

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "preparing-postgres.md"
ORDERS = (
    "create table public.orders (id bigint primary key, region text, status text, total numeric)"
)
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks(info: str) -> list[str]:
    return [body for lang, body in FENCE.findall(GUIDE.read_text()) if lang == info]


def guide_role() -> tuple[str, str]:
    """The role name and password the guide's SQL creates."""
    text = "\n".join(blocks("sql"))
    found = re.search(r"create role (\w+) .*?password '([^']*)'", text, re.IGNORECASE)
    assert found, "the guide's ```sql blocks create no role with a password"
    return found.group(1), found.group(2)


def as_role(block: str, guide: str, role: str) -> str:
    """``block`` with the guide's role named ``role`` wherever it stands for the role."""
    return re.sub(rf"\b(ROLE|TO|USER)\s+{guide}\b", rf"\1 {role}", block, flags=re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Prepared:
    db: PgDatabase
    role: str  # the guide's role, or its stand-in (see ``prepared``)
    dsn: str  # as that role


@pytest.fixture
def prepared(pg_db: PgDatabase) -> Iterator[Prepared]:
    """``pg_db`` after the guide's SQL. The embedded servers' superuser is itself named
    tidemark, like the guide's role: there the guide's role is created as
    ``tidemark_docs`` instead (only where the SQL names the role; the publication keeps
    its name)."""
    guide, password = guide_role()
    with psycopg.connect(pg_db.server.admin_dsn, autocommit=True) as conn:
        taken = {str(r[0]) for r in conn.execute("select rolname from pg_roles").fetchall()}
    role = guide if guide not in taken else f"{guide}_docs"
    if role in taken:
        pytest.skip(f"the server already has roles {guide!r} and {role!r}")
    pg_db.execute(ORDERS)
    try:
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            for number, block in enumerate(blocks("sql"), 1):
                try:
                    conn.execute(as_role(block, guide, role).encode())
                except psycopg.Error as exc:
                    pytest.fail(f"```sql block {number} of the guide fails: {exc}\n{block}")
        yield Prepared(pg_db, role, pg_db.server.dsn_for(pg_db.name, role, password))
    finally:
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            if conn.execute("select 1 from pg_roles where rolname = %s", (role,)).fetchone():
                conn.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                    (role,),
                )
                conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


@one_server()
def test_the_guides_role_replicates_reads_and_finds_its_table_published(
    prepared: Prepared,
) -> None:
    # given a database prepared by the guide's SQL, and the role it created
    db = prepared.db
    # when the role opens a replication connection, as tidemark's walsender client does
    with psycopg.connect(prepared.dsn, replication="database", autocommit=True) as repl:
        system = repl.execute("IDENTIFY_SYSTEM").fetchone()
        slot = repl.execute(
            "CREATE_REPLICATION_SLOT tm_docs_check TEMPORARY LOGICAL pgoutput"
        ).fetchone()
    # then it is a logical walsender of this database, allowed to create a slot
    assert system is not None and system[3] == db.name
    assert slot is not None and slot[0] == "tm_docs_check"
    # and the role reads the table, is in pg_monitor, and is no superuser
    with psycopg.connect(prepared.dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from public.orders").fetchone() == (0,)
        attributes = conn.execute(
            "select rolsuper, rolreplication, pg_has_role(current_user, 'pg_monitor', 'member')"
            " from pg_roles where rolname = current_user"
        ).fetchone()
        assert attributes == (False, True, True)
    # and the publication holds the table, via the partition root, with full old rows
    published = db.execute(
        "select p.pubviaroot, t.schemaname, t.tablename from pg_publication p"
        " join pg_publication_tables t on t.pubname = p.pubname where p.pubname = 'tidemark'"
    )
    assert published == [(True, "public", "orders")]
    identity = db.execute("select relreplident from pg_class where oid = 'public.orders'::regclass")
    assert identity == [("f",)]


@one_server()
def test_config_check_passes_with_the_guides_toml(prepared: Prepared, tmp_path: Path) -> None:
    # given the guide's tidemark.toml, its DSN and sink root pointed at this test's
    (toml,) = [b for b in blocks("toml") if "[source]" in b]
    config = tmp_path / "tidemark.toml"
    config.write_text(toml)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEMARK_", "PG"))}
    env |= {"TIDEMARK_SOURCE__DSN": prepared.dsn, "TIDEMARK_SINK__ROOT": str(tmp_path / "lake")}
    # when `tidemark config check` runs on it
    result = subprocess.run(
        [sys.executable, "-m", "tidemark", "--config", str(config), "config", "check"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # then every check passes: the login, the server, the role, the publication, the shapes
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    checks = {
        m.group(2): (m.group(1), m.group(3))
        for m in re.finditer(r"^(ok  |warn|FAIL) (.+?) {2,}(.*)$", result.stdout, re.MULTILINE)
    }
    assert checks["source connection"][1].startswith(f"{prepared.role}@"), out
    assert checks["server"][1].endswith(", wal_level = logical"), out
    assert checks["replication role"] == (
        "ok  ",
        "role may replicate (REPLICATION, a superuser, or rds_replication on RDS)",
    ), out
    assert checks["publication"] == ("ok  ", "publication 'tidemark' exists"), out
    assert checks["slot"] == ("ok  ", "slot 'tidemark' will be created"), out
    for shape in ("orders_eu", "order_status"):
        assert checks[f"shape {shape}"][0] == "ok  ", out
        assert checks[f"shape {shape}"][1].startswith("public.orders: ok"), out
    # and it created nothing: the slot is left to `tidemark run`
    assert prepared.db.execute("select count(*) from pg_replication_slots") == [(0,)]


@one_server()
async def test_a_member_of_rds_replication_counts_as_able_to_replicate(pg_db: PgDatabase) -> None:
    """Amazon RDS and Aurora: the admin cannot give REPLICATION, and the guide grants
    ``rds_replication`` instead. A plain server plays it with a role of that name."""
    from tidemark.replication import slot as slots

    admin = pg_db.server.admin_dsn
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("create role tm_rds_plain login password 'pw'")
        conn.execute("create role tm_rds_member login password 'pw'")
        exists = conn.execute("select 1 from pg_roles where rolname = 'rds_replication'")
        made = exists.fetchone() is None
        if made:
            conn.execute("create role rds_replication nologin")
        conn.execute("grant rds_replication to tm_rds_member")
    try:
        verdicts = {}
        for role in ("tm_rds_plain", "tm_rds_member"):
            dsn = pg_db.server.dsn_for(pg_db.name, role, "pw")
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                verdicts[role] = await slots.role_can_replicate(conn)
        assert verdicts == {"tm_rds_plain": False, "tm_rds_member": True}
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("drop role tm_rds_plain")
            conn.execute("drop role tm_rds_member")
            if made:
                conn.execute("drop role rds_replication")
