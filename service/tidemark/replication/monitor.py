"""The check against Postgres's own view of our replication.

A normal connection polls ``pg_stat_replication`` for our walsender (its pid is
taken before START_REPLICATION) and ``pg_replication_slots`` for our slot, and
compares what Postgres reports with what we sent:

* PG's ``write_lsn``/``flush_lsn``/``replay_lsn`` must be values we actually sent,
  and must equal the latest we sent once a status interval has passed since it;
* ``confirmed_flush_lsn`` must never exceed the durable frontier (what the sinks
  committed), the promise that makes the flush LSN safe.

A violation is logged, counted and reported to readiness. The samples also feed
metrics (lag, retained WAL, ``safe_wal_size``) and ``wait_for_lsn``, which resolves
when ``replay_lsn`` reaches a given LSN: read-your-writes for lake readers.

``check_sample`` is pure and unit-tested; ``ReplicationMonitor`` is the IO shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
import structlog

from tidemark.aio import wait_event
from tidemark.conninfo import redact_text
from tidemark.lsn import Lsn, format_lsn
from tidemark.replication.feedback import StatusUpdate
from tidemark.replication.slot import SOURCE_WAL_LSN

log = structlog.get_logger("tidemark.monitor")


@dataclass(frozen=True, slots=True)
class ReplicationSample:
    taken_at: float  # wall clock (time.time())
    current_wal_lsn: int
    walsender_pid: int | None
    write_lsn: int | None
    flush_lsn: int | None
    replay_lsn: int | None
    reply_time: float | None  # unix seconds
    replay_lag_s: float | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    safe_wal_size: int | None
    slot_active: bool

    @property
    def retained_wal_bytes(self) -> int | None:
        if self.restart_lsn is None:
            return None
        return max(0, self.current_wal_lsn - self.restart_lsn)

    @property
    def lag_bytes(self) -> int | None:
        if self.confirmed_flush_lsn is None:
            return None
        return max(0, self.current_wal_lsn - self.confirmed_flush_lsn)


VIOLATION_KINDS = (
    "ack_beyond_durable",
    "committed_not_in_table",
    *(
        f"{pos}_{what}"
        for pos in ("write", "flush", "replay")
        for what in ("beyond_sent", "mismatch", "unknown")
    ),
)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message: str


def check_sample(
    sample: ReplicationSample,
    sent: Sequence[tuple[float, StatusUpdate]],
    durable_frontier: int | None,
    interval_s: float,
) -> list[Violation]:
    """What in ``sample`` contradicts what we sent (``sent``: (wall time, update), oldest
    first) or the durable frontier."""
    out: list[Violation] = []
    if (
        durable_frontier is not None
        and sample.confirmed_flush_lsn is not None
        and sample.confirmed_flush_lsn > durable_frontier
    ):
        out.append(
            Violation(
                "ack_beyond_durable",
                f"slot confirmed_flush_lsn {format_lsn(sample.confirmed_flush_lsn)} is beyond the "
                f"durable frontier {format_lsn(durable_frontier)}",
            )
        )
    if not sent or sample.walsender_pid is None:
        return out
    latest_at = sent[-1][0]
    for name, reported in (
        ("write", sample.write_lsn),
        ("flush", sample.flush_lsn),
        ("replay", sample.replay_lsn),
    ):
        if reported is None:
            continue
        ours = [getattr(u, f"{'apply' if name == 'replay' else name}_lsn") for _, u in sent]
        if reported > max(ours):
            out.append(
                Violation(
                    f"{name}_beyond_sent",
                    f"pg_stat_replication.{name}_lsn {format_lsn(reported)} is beyond anything we "
                    f"sent (latest {format_lsn(max(ours))})",
                )
            )
        elif sample.reply_time is not None and sample.reply_time >= latest_at - 0.001:
            # Postgres has processed our latest update (reply_time is its send time).
            want = ours[-1]
            if reported != want:
                out.append(
                    Violation(
                        f"{name}_mismatch",
                        f"pg_stat_replication.{name}_lsn is {format_lsn(reported)} but we last "
                        f"sent {format_lsn(want)} {sample.taken_at - latest_at:.1f}s ago",
                    )
                )
        elif sample.taken_at - latest_at > 2 * interval_s and reported not in ours:
            out.append(
                Violation(
                    f"{name}_unknown",
                    f"pg_stat_replication.{name}_lsn {format_lsn(reported)} is not a value we sent",
                )
            )
    return out


_QUERY = f"""
select {SOURCE_WAL_LSN}::text,
       r.pid, r.write_lsn::text, r.flush_lsn::text, r.replay_lsn::text,
       extract(epoch from r.reply_time)::float8,
       extract(epoch from r.replay_lag)::float8,
       s.confirmed_flush_lsn::text, s.restart_lsn::text, s.wal_status, s.safe_wal_size,
       coalesce(s.active, false)
from (select 1) one
left join pg_replication_slots s on s.slot_name = %(slot)s
left join pg_stat_replication r on r.pid = %(pid)s
"""


def _lsn(value: object) -> int | None:
    return None if value is None else int(Lsn.parse(str(value)))


@dataclass(slots=True)
class MonitorState:
    samples: int = 0
    violations: int = 0
    last: ReplicationSample | None = None
    last_violation: Violation | None = None
    recent_violations: list[Violation] = field(default_factory=list)
    errors: int = 0


class ReplicationMonitor:
    """Polls Postgres's view of our walsender and slot; checks it; serves wait_for_lsn."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        *,
        walsender_pid: Callable[[], int | None],
        sent_history: Callable[[], Sequence[tuple[float, StatusUpdate]]],
        durable_frontier: Callable[[], int | None],
        period_s: float = 5.0,
        status_interval_s: float = 10.0,
        on_violation: Callable[[Violation], None] | None = None,
        explain_frontier: Callable[[], str] | None = None,
        slot_ours: Callable[[], bool] | None = None,
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.period_s = period_s
        self.status_interval_s = status_interval_s
        self.state = MonitorState()
        self._pid = walsender_pid
        self._sent = sent_history
        self._durable = durable_frontier
        self._explain = explain_frontier
        # False once another instance acknowledges the slot (this one was deposed): its
        # confirmed_flush_lsn is then beyond our frontier by right, not a violation
        self._slot_ours = slot_ours
        self._on_violation = on_violation
        self._changed = asyncio.Condition()
        self._waiters = 0
        self._poke = asyncio.Event()
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def sample(self) -> ReplicationSample:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name="tidemark-monitor"
            )
        row = await (await conn.execute(_QUERY, {"slot": self.slot, "pid": self._pid()})).fetchone()
        assert row is not None
        return ReplicationSample(
            taken_at=time.time(),
            current_wal_lsn=_lsn(row[0]) or 0,
            walsender_pid=row[1],  # type: ignore[arg-type]
            write_lsn=_lsn(row[2]),
            flush_lsn=_lsn(row[3]),
            replay_lsn=_lsn(row[4]),
            reply_time=row[5],  # type: ignore[arg-type]
            replay_lag_s=row[6],  # type: ignore[arg-type]
            confirmed_flush_lsn=_lsn(row[7]),
            restart_lsn=_lsn(row[8]),
            wal_status=row[9],  # type: ignore[arg-type]
            safe_wal_size=row[10],  # type: ignore[arg-type]
            slot_active=bool(row[11]),
        )

    async def poll_once(self) -> ReplicationSample:
        sample = await self.sample()
        state = self.state
        state.samples += 1
        state.last = sample
        for violation in check_sample(
            sample, list(self._sent()), self._durable(), self.status_interval_s
        ):
            if violation.kind == "ack_beyond_durable":
                if self._slot_ours is not None and not self._slot_ours():
                    continue
                if self._explain is not None:
                    violation = Violation(
                        violation.kind, f"{violation.message} ({self._explain()})"
                    )
            state.violations += 1
            state.last_violation = violation
            state.recent_violations = [*state.recent_violations[-9:], violation]
            log.error("invariant.violated", kind=violation.kind, detail=violation.message)
            if self._on_violation is not None:
                self._on_violation(violation)
        async with self._changed:
            self._changed.notify_all()
        return sample

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.poll_once()
                except (psycopg.Error, OSError) as exc:
                    self.state.errors += 1
                    log.warning("monitor.poll_failed", error=redact_text(str(exc), self.dsn))
                    await self._close()
                period = 0.1 if self._waiters else self.period_s
                self._poke.clear()
                await wait_event(self._poke, period)
        finally:
            await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def wait_for_lsn(self, lsn: int, timeout: float) -> ReplicationSample | None:
        """The first sample whose replay_lsn >= lsn, or None on timeout."""

        def reached() -> bool:
            last = self.state.last
            return last is not None and last.replay_lsn is not None and last.replay_lsn >= lsn

        self._waiters += 1
        self._poke.set()
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(reached)
            return self.state.last
        except TimeoutError:
            return None
        finally:
            self._waiters -= 1
