"""A primary and a physical standby that *has the primary's logical slot*, for
timeline-fork scenarios (``test_timeline_fork``).

``pg_basebackup`` does not copy replication slots, so the standby is a cold copy:
the primary is stopped cleanly (keeping its data), its whole data directory
(``pg_replslot`` included) is copied as the server user, the copy is configured as a
streaming standby of the primary (``standby.signal`` and ``primary_conninfo``, what
``pg_basebackup -R`` writes) and both are started. Promoting the standby later
starts timeline 2 with the slot carried over; cutting it off first (``cut_off``)
makes the new timeline fork below what the primary went on to write.

Helpers to read positions (``wal_lsn``, ``replay_lsn``, ``slot_confirmed``, the fork
LSN from ``TIMELINE_HISTORY``) and to run ``tidemark run`` as a child process on the
same code the tests import.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import tidemark
from tidemark.demo.postgres import (
    _PREFIX,
    OWNER_FILE,
    PASSWORD,
    ROLE,
    EmbeddedPostgres,
    _install_signal_cleanup,
    free_port,
)
from tidemark.lsn import Lsn, format_lsn

from .remote_service import service_env

STANDBY_SETTINGS = {"hot_standby": "on", "hot_standby_feedback": "on"}


# -- positions ----------------------------------------------------------------------


def _one(dsn: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        return None if row is None else row[0]


def wal_lsn(dsn: str) -> int:
    """``pg_current_wal_lsn()`` of a primary."""
    return int(Lsn.parse(str(_one(dsn, "select pg_current_wal_lsn()::text"))))


def replay_lsn(dsn: str) -> int:
    """``pg_last_wal_replay_lsn()`` of a standby (0 when it replayed nothing)."""
    text = _one(dsn, "select pg_last_wal_replay_lsn()::text")
    return 0 if text is None else int(Lsn.parse(str(text)))


def slot_confirmed(dsn: str, slot: str) -> int | None:
    """The slot's ``confirmed_flush_lsn`` (None: no such slot)."""
    text = _one(
        dsn,
        "select coalesce(confirmed_flush_lsn::text, '0/0') from pg_replication_slots"
        " where slot_name = %s",
        (slot,),
    )
    return None if text is None else int(Lsn.parse(str(text)))


def has_logical_slot(dsn: str, slot: str) -> bool:
    return bool(
        _one(
            dsn,
            "select count(*) from pg_replication_slots where slot_name = %s"
            " and slot_type = 'logical'",
            (slot,),
        )
    )


def timeline_history(dsn: str, timeline: int) -> list[tuple[int, int, str]]:
    """``TIMELINE_HISTORY <timeline>`` over a replication connection: (parent timeline,
    LSN where the next one began, reason), oldest first."""
    with psycopg.connect(dsn, replication="database", autocommit=True) as conn:
        row = conn.execute(f"TIMELINE_HISTORY {int(timeline)}").fetchone()
    assert row is not None
    content = row[1]
    text = (
        bytes(content).decode() if isinstance(content, bytes | bytearray | memoryview) else content
    )
    entries = []
    for line in str(text).splitlines():
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0].strip().isdigit():
            continue
        entries.append((int(fields[0]), int(Lsn.parse(fields[1])), "\t".join(fields[2:])))
    return entries


def current_timeline(dsn: str) -> int:
    with psycopg.connect(dsn, replication="database", autocommit=True) as conn:
        row = conn.execute("IDENTIFY_SYSTEM").fetchone()
    assert row is not None
    return int(str(row[1]))


def fork_lsn(dsn: str, timeline: int = 2) -> int:
    """Where ``timeline`` left its parent (from its history file)."""
    history = timeline_history(dsn, timeline)
    assert history, f"timeline {timeline} has no history"
    return history[-1][1]


async def until(what: str, check: Any, timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll ``check()`` (run in a thread) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(psycopg.OperationalError):
            last = await asyncio.to_thread(check)
            if last:
                return last
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def replayed(standby: EmbeddedPostgres, lsn: int, timeout: float = 60.0) -> int:
    """Until the standby replayed up to ``lsn``; its replay LSN."""
    dsn = standby.dsn("app")
    return int(
        await until(
            f"the standby to replay {format_lsn(lsn)}",
            lambda: (now := replay_lsn(dsn)) >= lsn and now,
            timeout,
        )
    )


async def confirmed(primary_dsn: str, slot: str, lsn: int, timeout: float = 60.0) -> int:
    """Until the slot's ``confirmed_flush_lsn`` reaches ``lsn``; its position."""
    return int(
        await until(
            f"slot {slot} to confirm {format_lsn(lsn)}",
            lambda: (now := slot_confirmed(primary_dsn, slot) or 0) >= lsn and now,
            timeout,
        )
    )


# -- clusters -------------------------------------------------------------------------


def stop_keeping_data(pg: EmbeddedPostgres, mode: signal.Signals = signal.SIGINT) -> None:
    """Shut the server down (SIGINT: fast, a clean shutdown checkpoint; SIGQUIT:
    immediate) and keep its data directory, unlike ``stop()``."""
    proc = pg._process
    if proc is not None and proc.poll() is None:
        proc.send_signal(mode)
        proc.wait(timeout=60)
    pg._process = None


def _own(pg: EmbeddedPostgres, path: Path, mode: int = 0o600) -> None:
    os.chmod(path, mode)
    if pg._user is not None:
        os.chown(path, pg._user.uid, pg._user.gid)


def attach_copy(
    source: EmbeddedPostgres, *, settings: dict[str, str] | None = None
) -> EmbeddedPostgres:
    """A stopped ``EmbeddedPostgres`` on a new folder holding a copy of ``source``'s
    (stopped) data directory, owned by the server user; not started. ``stop()``
    removes it like any embedded cluster."""
    assert source.dir is not None and source._process is None, "stop the source first"
    copy = EmbeddedPostgres(
        source.flavor,
        bin_dir=source._source_bin_dir,
        settings=source.settings | (settings or {}),
        port=free_port(),
    )
    copy._user = source._user
    copy.bin_dir = source.bin_dir
    copy.major = source.major
    copy.dir = Path(tempfile.mkdtemp(prefix=_PREFIX))
    (copy.dir / OWNER_FILE).write_text(str(os.getpid()))
    _own(copy, copy.dir, 0o755)
    atexit.register(copy.stop)
    _install_signal_cleanup(copy)
    # cp -a as the server user: modes, times and (its own) ownership kept, slots included
    proc = copy._run_as_server_user(
        ["cp", "-a", str(source.data_dir), str(copy.data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"copying the data directory failed: {out.decode()}"
    for stale in ("postmaster.pid", "postmaster.opts", "standby.signal", "recovery.signal"):
        (copy.data_dir / stale).unlink(missing_ok=True)
    return copy


def make_standby_of(copy: EmbeddedPostgres, primary: EmbeddedPostgres) -> None:
    """What ``pg_basebackup -R`` writes: ``standby.signal`` and ``primary_conninfo``."""
    signal_file = copy.data_dir / "standby.signal"
    signal_file.write_text("")
    _own(copy, signal_file)
    auto = copy.data_dir / "postgresql.auto.conf"
    conninfo = (
        f"user={ROLE} password={PASSWORD} host={primary.host} port={primary.port} "
        "application_name=fork_standby sslmode=disable"
    )
    with open(auto, "a") as out:
        out.write(f"primary_conninfo = '{conninfo}'\n")
    _own(copy, auto)
    copy.settings = copy.settings | STANDBY_SETTINGS


def cold_standby(primary: EmbeddedPostgres, timeout: float = 60.0) -> EmbeddedPostgres:
    """A streaming standby of ``primary`` that has its replication slots: the primary
    is stopped cleanly, copied, and started again; then the standby starts."""
    stop_keeping_data(primary)
    standby = attach_copy(primary)
    try:
        make_standby_of(standby, primary)
        primary.restart(timeout)
        standby._launch()
        standby._wait_ready(timeout)
    except BaseException:
        standby.stop()
        raise
    return standby


async def cut_off(standby: EmbeddedPostgres, settle_s: float = 0.5) -> int:
    """Stop the standby's WAL receiver (``primary_conninfo = ''``, reloaded): it keeps
    running, replays what it received and gets nothing more. Returns X, its replay
    LSN once replay stopped moving and no WAL receiver runs."""
    dsn = standby.dsn("app")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("alter system set primary_conninfo = ''")
        conn.execute("select pg_reload_conf()")

    def quiet() -> int | None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("select count(*) from pg_stat_wal_receiver").fetchone()
            if row is None or row[0]:
                return None
        first = replay_lsn(dsn)
        time.sleep(settle_s)
        return first if replay_lsn(dsn) == first else None

    return int(await until("the standby's WAL receiver to stop", quiet, 60.0, 0.2))


# -- tidemark as a child process --------------------------------------------------------


def child_env(**kwargs: Any) -> dict[str, str]:
    """``remote_service.service_env``, running the tidemark package this process imported
    (``PYTHONPATH``), with a one-thread Spark to keep the machine's CPU for others."""
    env = service_env(**kwargs)
    env["PYTHONPATH"] = str(Path(tidemark.__file__).resolve().parents[1])
    env.setdefault("TIDEMARK_SPARK__MASTER", "local[1]")
    return env
