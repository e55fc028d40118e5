"""A walsender that goes silent, and the network between tidemark and PostgreSQL held
and cut for real. Every connection of the service (the replication stream, the lease,
the catalog) goes through a Toxiproxy proxy.

1. The walsender frozen (SIGSTOP): its connection open, nothing on it, no close.
   tidemark notices the silence itself, as PostgreSQL's walreceiver does: at half its
   receive timeout (the server's ``wal_sender_timeout``, at least 10 s) a status
   update asks for a reply; with none by the whole of it, the connection is given up
   and made again (each try bounded by ``connect_timeout``).
2. Held: Toxiproxy's toxics drop the packets both ways for 25 s while the connections
   stay open (a firewall that black-holes). The walsender's ``wal_sender_timeout`` is
   4 s on this connection (``options=-c wal_sender_timeout=4s`` in the DSN): the server
   ends its side meanwhile, and its close reaches tidemark through the proxy.
3. Cut: the proxy closes every connection and refuses new ones for 8 s.

Not ``pg_terminate_backend``. Each time the slot is not acknowledged past what the
tables hold while it lasts; afterwards every shape equals Postgres with no
``(_lsn, _op)`` twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tidemark.demo.verify import compare_shape

from .conftest import ONE_SERVER, PgDatabase
from .object_store_support import TOXIPROXY_SERVER, Proxy, start_toxiproxy
from .service_support import (
    confirmed_flush,
    current_lsn,
    running_service,
    settings_for,
    wait_frontiers,
)
from .test_backfill import keys_unique

SCHEMA = """
create table accounts (id int primary key, owner text not null, balance int);
alter table accounts replica identity full;
"""
SHAPES = [
    {"name": "rich", "table": "public.accounts", "where": "balance >= 500"},
    {"name": "all_accounts", "table": "public.accounts"},
]
TRUTH = {
    "rich": "select * from accounts where balance >= 500",
    "all_accounts": "select * from accounts",
}


@pytest.fixture
def pg_proxy(pg_db: PgDatabase, tmp_path: Path) -> Iterator[Proxy]:
    if not TOXIPROXY_SERVER.is_file():
        pytest.skip("Toxiproxy is not installed: run `sh jars/toxiproxy.sh`")
    toxiproxy = start_toxiproxy(tmp_path)
    try:
        port = urlsplit(pg_db.server.admin_dsn).port
        assert port is not None
        yield toxiproxy.create_proxy("pg", port)
    finally:
        toxiproxy.stop()


def through(dsn: str, proxy: Proxy, options: str) -> str:
    """``dsn`` with its host and port the proxy's, and libpq ``options`` added."""
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    query = "&".join(q for q in (parts.query, f"options={options}") if q)
    netloc = f"{userinfo}127.0.0.1:{proxy.listen_port}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


async def workload(db: PgDatabase, start: int) -> None:
    await db.aexecute(
        "insert into accounts select g, 'o' || g, (g * 37) %% 1000"
        " from generate_series(%s::int, %s::int) g",
        (start, start + 299),
    )
    await db.aexecute(
        "update accounts set balance = balance + 300 where id %% 5 = 0 and id >= %s::int",
        (start,),
    )
    await db.aexecute("delete from accounts where id %% 7 = 0 and id >= %s::int", (start,))


@contextlib.contextmanager
def held(proxy: Proxy) -> Iterator[None]:
    """Every byte dropped both ways, the connections left open (Toxiproxy's ``timeout``
    toxic with no timeout), until the block ends."""
    names = [
        proxy.add_toxic("timeout", {"timeout": 0}, stream="upstream"),
        proxy.add_toxic("timeout", {"timeout": 0}, stream="downstream"),
    ]
    try:
        yield
    finally:
        for name in names:
            proxy.remove_toxic(name)


async def wait_until(check: Any, timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.2)


@ONE_SERVER
async def test_a_network_that_holds_then_cuts_the_packets_is_ridden_out(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, pg_proxy: Proxy
) -> None:
    await pg_db.aexecute(SCHEMA)
    root = tmp_path / "lake"
    dsn = through(pg_db.dsn, pg_proxy, "-c%20wal_sender_timeout%3D4s")
    config = settings_for(dsn, str(root), SHAPES, current={"enabled": False})
    async with running_service(config, spark) as service:
        await workload(pg_db, 1)
        await wait_frontiers(service, current_lsn(pg_db.dsn))

        # 1. the walsender frozen (SIGSTOP): its connection open, nothing on it. The
        # client asks for a reply at half its receive timeout and, with none, gives the
        # connection up after all of it (10 s), and tries again meanwhile
        stats = service.client.stats
        pid, lost = stats.walsender_pid, stats.reconnects
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await workload(pg_db, 500)
            await wait_until(lambda: stats.reconnects > lost, 40, "the silence noticed")
            assert "nothing from the walsender" in stats.last_disconnect, stats.last_disconnect
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_frontiers(service, current_lsn(pg_db.dsn), timeout=120)

        # 2. held: no byte passes for 25 s, nothing is closed by the proxy
        with held(pg_proxy):
            await workload(pg_db, 1000)  # (straight to the server, not through the proxy)
            during = current_lsn(pg_db.dsn)
            await asyncio.sleep(25)
            assert confirmed_flush(pg_db.dsn) < during
        await wait_frontiers(service, during, timeout=120)
        await wait_until(lambda: confirmed_flush(pg_db.dsn) >= during, 60, "acknowledged")

        # 3. cut: every connection closed, new ones refused, for 8 s
        with pg_proxy.partitioned():
            await workload(pg_db, 2000)
            during = current_lsn(pg_db.dsn)
            await asyncio.sleep(8)
            assert confirmed_flush(pg_db.dsn) < during
        await wait_frontiers(service, during, timeout=120)
        await wait_until(lambda: confirmed_flush(pg_db.dsn) >= during, 60, "acknowledged")
        ready, reasons = service.readiness()
        assert ready, reasons
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
        assert keys_unique(root, shape), shape
