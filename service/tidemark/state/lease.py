"""The leader lease: of several tidemark instances with one configuration, one streams
the slot and writes the tables; the others stand by and take over when it dies.

The lease is a session advisory lock on the source database, keyed by the slot's
name, held on a connection of its own. It dies with its holder: a killed process's
socket closes and its backend ends at once; a host cut off from the network is
noticed by the server's TCP keepalives (set on the lease connection: about 11 s).
The slot's own rule (one walsender at a time) stands behind it.

Protocol of an instance:

1. Stand by: try the lock every ``retry_s``; meanwhile say who holds it.
2. Lease taken: a walsender of the old leader may still hold the slot (a host cut
   off, a backend that has not noticed its client died): it is ended with
   ``pg_terminate_backend`` and the slot is awaited until free.
3. Lead: the epoch is raised and every table marked with it (``tidemark.state.fencing``),
   then the durable state under the sink root is read (what the old leader left), and
   the service starts from the slot's position as after any restart. The lease
   connection is checked every ``check_s``, each check bounded so that the last
   confirmation is never older than ``deadline_s``. When a check fails or times out
   (a source restart takes the lock with it, a partition, a backend that hangs),
   every write under the sink root is suspended at once: the server ends a vanished
   holder's session after about 11 s (the keepalives above), so the leader has
   stopped writing before a standby can take the lock. The lock is then taken again
   if nobody else has it, and writes resume if no newer leader came meanwhile; if
   another instance has it, ``hold`` raises ``LeaseLost`` and the service stops (the
   supervisor restarts it as a standby).
4. A leader deposed while alive and frozen past all of the above is stopped by the
   epoch: the new leader raised it and marked every table before writing, so the old
   one's commits are refused and its next other write finds it (``tidemark.state.fencing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from tidemark.errors import TidemarkError

log = structlog.get_logger("tidemark.lease")

KEY_PREFIX = "tidemark:lease:"
APPLICATION_NAME = "tidemark-lease"
# the server notices a vanished holder after idle + interval * count seconds
KEEPALIVE_OPTIONS = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
)


class LeaseLost(TidemarkError):
    """The leader's lease connection broke: another instance may lead now."""


def source_stopping(exc: BaseException) -> bool:
    """Whether ``exc`` says the source server is shutting down: it ended our session
    (57P01, also what ``pg_terminate_backend`` gives) or refuses new ones (57P03)."""
    if isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
        return True
    return "the database system is shutting down" in str(exc)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lease, as the source sees it."""

    pid: int
    client: str | None

    def describe(self) -> str:
        where = f" from {self.client}" if self.client else ""
        return f"backend pid {self.pid}{where}"


_TRY = "select pg_try_advisory_lock(hashtextextended(%s, 0))"
_HOLDER = """
select a.pid, host(a.client_addr)
from pg_locks l join pg_stat_activity a on a.pid = l.pid
where l.locktype = 'advisory' and l.granted and l.objsubid = 1
  and l.database = (select oid from pg_database where datname = current_database())
  and ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(%s, 0)
  and a.pid <> pg_backend_pid()
limit 1
"""
_SLOT_PID = (
    "select active_pid from pg_replication_slots where slot_name = %s and active_pid is not null"
)


class LeaderLease:
    def __init__(
        self,
        dsn: str,
        slot: str,
        *,
        retry_s: float = 1.0,
        check_s: float = 1.0,
        deadline_s: float = 5.0,
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.key = KEY_PREFIX + slot
        self.retry_s = retry_s
        self.check_s = min(check_s, deadline_s / 2)
        self.deadline_s = deadline_s
        self.held = False
        self.holder: Holder | None = None  # the other instance's, while standing by
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._backend: int | None = None  # the server process of the lease session
        self._closing: set[asyncio.Future[None]] = set()  # sessions given up, closing

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                application_name=APPLICATION_NAME,
                options=KEEPALIVE_OPTIONS,
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
                connect_timeout=max(2, int(self.deadline_s)),
            )
            self._backend = self._conn.info.backend_pid
        return self._conn

    async def try_acquire(self) -> bool:
        """One attempt; notes the current holder when it fails."""
        conn = await self._connect()
        row = await (await conn.execute(_TRY, (self.key,))).fetchone()
        if row is not None and row[0]:
            self.held, self.holder = True, None
            return True
        found = await (await conn.execute(_HOLDER, (self.key,))).fetchone()
        self.holder = None
        if found is not None:
            pid, client = found
            self.holder = Holder(int(str(pid)), None if client is None else str(client))
        return False

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Stand by until the lease is ours (True) or ``stop`` is set (False). A source
        that cannot be reached at the first attempt is an error (a wrong DSN, wrong
        credentials); later, it is retried: a standby outlives a source restart."""
        announced = False
        if await self.try_acquire():
            log.info("lease.acquired", slot=self.slot)
            return True
        while not stop.is_set():
            try:
                if await self.try_acquire():
                    log.info("lease.acquired", slot=self.slot)
                    return True
                if not announced:
                    log.info(
                        "lease.standby",
                        slot=self.slot,
                        holder=self.holder.describe() if self.holder else None,
                    )
                    announced = True
            except psycopg.OperationalError as exc:
                log.warning("lease.unreachable", slot=self.slot, error=str(exc).strip())
                await self.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.retry_s):
                    await stop.wait()
        return False

    async def take_over_slot(self, timeout_s: float = 30.0) -> int | None:
        """End a walsender still holding the slot (the old leader's) and wait until the
        slot is free; returns the pid ended, if any."""
        conn = await self._connect()
        ended = None
        async with asyncio.timeout(timeout_s):
            while True:
                row = await (await conn.execute(_SLOT_PID, (self.slot,))).fetchone()
                if row is None:
                    return ended
                pid = int(str(row[0]))
                if ended != pid:
                    await conn.execute("select pg_terminate_backend(%s)", (pid,))
                    log.warning("lease.ended_old_walsender", slot=self.slot, pid=pid)
                    ended = pid
                await asyncio.sleep(0.1)

    async def hold(
        self,
        suspend: Callable[[str], None] = lambda reason: None,
        resume: Callable[[], None] = lambda: None,
        stopping: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """Check the lease until cancelled, every ``check_s``, each check bounded so that
        the last confirmation is never older than ``deadline_s``. When a check fails
        or times out (a source restart, a network cut, a backend that hangs), the lock
        may be gone with it: ``suspend(reason)`` at once (writes stop), then take the
        lock again if nobody else has it (the source restarted under us) and
        ``resume()``, else ``LeaseLost``. ``stopping(reason)`` when the failure says
        the source is shutting down (``source_stopping``): its walsender waits for our
        stream to end before the server can stop, and without the lease nothing we
        receive can be committed meanwhile."""
        confirmed = time.monotonic()
        while True:
            await asyncio.sleep(self.check_s)
            bound = max(0.1, confirmed + self.deadline_s - time.monotonic())
            try:
                conn = self._conn  # a new session would not hold the lock: see below
                if conn is None or conn.closed:
                    raise psycopg.OperationalError("the lease connection is closed")
                await self._confirm(conn, bound)
                confirmed = time.monotonic()
            except (psycopg.Error, TimeoutError) as exc:
                cause = str(exc).strip() or (
                    f"the lease was not confirmed within {self.deadline_s:g} s"
                )
                suspend(f"the leader lease on slot '{self.slot}' is not confirmed: {cause}")
                if source_stopping(exc):
                    stopping(cause)
                self.held = False
                await self.close()
                log.warning("lease.connection_lost", slot=self.slot, error=cause)
                await self._take_back(cause, stopping)
                resume()
                confirmed = time.monotonic()

    async def _confirm(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], bound: float
    ) -> None:
        """One check of the lease session, given up after ``bound`` seconds (then
        ``TimeoutError``). A query whose server process hangs is not cancelled (a
        cancel waits for that server too): the session is dropped and closed in the
        background once it answers, which ends the lock it holds."""
        check = asyncio.ensure_future(conn.execute("select 1"))
        done, _ = await asyncio.wait({check}, timeout=bound)
        if check in done:
            check.result()
            return
        if self._conn is conn:
            self._conn = None
        self.held = False
        check.add_done_callback(lambda done: self._close_later(conn, done))
        raise TimeoutError(f"the lease was not confirmed within {self.deadline_s:g} s")

    def _close_later(self, conn: psycopg.AsyncConnection[Any], check: asyncio.Future[Any]) -> None:
        if not check.cancelled():
            check.exception()  # (retrieved: the session is given up whatever it says)
        closing = asyncio.ensure_future(conn.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _take_back(self, cause: str, stopping: Callable[[str], None]) -> None:
        ours = self._backend  # the session just given up: it may hold the lock a while
        while True:
            try:
                async with asyncio.timeout(self.deadline_s):
                    if await self.try_acquire():
                        log.info("lease.reacquired", slot=self.slot)
                        return
            except (psycopg.OperationalError, TimeoutError) as exc:
                log.warning("lease.retake_failed", slot=self.slot, error=str(exc).strip())
                if source_stopping(exc):
                    stopping(str(exc).strip())
                await self.close()  # the source is still away: try again
                await asyncio.sleep(self.check_s)
                continue
            if self.holder is not None and self.holder.pid == ours:
                # our own old session has not ended yet (its backend hangs): nobody
                # else can lead meanwhile; writes stay suspended until it ends
                await asyncio.sleep(self.check_s)
                continue
            holder = self.holder.describe() if self.holder else "another instance"
            raise LeaseLost(
                f"the leader lease on slot '{self.slot}' was lost ({cause}) and {holder} "
                "holds it now: this instance stops (its supervisor restarts it as a standby)"
            )

    async def close(self) -> None:
        """Release the lease (closing its session ends the lock)."""
        conn, self._conn = self._conn, None
        self.held = False
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
