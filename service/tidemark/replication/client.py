"""The walsender client: an asyncio shell around psycopg 3's COPY_BOTH.

``ReplicationClient.run()`` connects with ``replication=database``, checks the
server, ensures the publication and the logical slot, and streams pgoutput
bytes into a bounded ``asyncio.Queue`` as ``WalBatch`` items (every XLogData
payload available on the socket in one go, so the queue is touched once per
read, not once per message). Keepalives travel through the same queue as
``KeepaliveMark`` so the consumer sees them in stream order: that is what makes
the idle acknowledgement safe (see ``replication.feedback``).

Backpressure: when the queue is full the reader stops reading the socket, the
walsender's send buffer fills and it waits; a separate sender task keeps sending
status updates, so the walsender does not time the connection out.

Reconnects: any connection loss is retried with capped exponential backoff and
jitter, resuming from the durable position; each (re)start puts a
``StreamStarted`` mark in the queue so the consumer drops a half-received
transaction (Postgres re-sends it). A dropped or invalidated slot, wrong
credentials, a role without REPLICATION or ``wal_level`` below logical are fatal
and raised, never retried (``replication.source_errors``).

Continuity (``StreamGuard``, see ``tidemark.continuity``): on every (re)connection
the client shows the guard what it found (``IDENTIFY_SYSTEM`` and the slot)
*before* it creates a missing slot or streams, and the guard raises when resuming
would skip a gap; a slot the client creates is reported to it; and every status
update waits for ``before_send(flush)``, which makes the flush (and every claim
invalidation) durable before Postgres hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import structlog
from psycopg import pq

from tidemark.aio import wait_event, within
from tidemark.conninfo import redact_dsn, redact_text
from tidemark.continuity.rule import ObservedStream
from tidemark.errors import ReplicationError, SlotLostError, TidemarkError
from tidemark.lsn import format_lsn
from tidemark.pgoutput.framing import pg_now_us, standby_status_update
from tidemark.replication import slot as slots
from tidemark.replication.catalog import check_name, session_options
from tidemark.replication.feedback import Feedback, StatusUpdate, keepalive_interval
from tidemark.replication.observe import observed_stream, timeline_history
from tidemark.replication.protocol import (
    COPY_ENDED,
    KeepaliveMark,
    StreamItem,
    StreamStarted,
    WalBatch,
    drain,
)
from tidemark.replication.source_errors import (
    ConnectionLost,
    classify_connect_error,
    raise_stream_error,
)

log = structlog.get_logger("tidemark.replication")


@dataclass(frozen=True, slots=True)
class SourceConfig:
    dsn: str
    slot: str = "tidemark"
    publication: str = "tidemark"
    # (schema, table) pairs; None: FOR ALL TABLES when the publication is created
    publication_tables: tuple[tuple[str, str], ...] | None = None
    create_publication: bool = True
    create_slot: bool = True
    failover_slot: bool = False  # PG 17+: created as a failover slot
    proto_version: int | None = None  # None: the highest the server speaks (v4 on PG 16)
    streaming: bool = False
    queue_batches: int = 64  # bounded queue, in WalBatch items
    # ... and in bytes: the reader stops reading the socket while the consumer has more
    # than this to decode (messages of a large transaction can be megabytes each)
    queue_bytes: int = 8 * 1024 * 1024
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0


@dataclass(slots=True)
class ClientStats:
    bytes_received: int = 0
    messages_received: int = 0
    keepalives: int = 0
    status_updates: int = 0
    reconnects: int = 0
    last_disconnect: str = ""  # why the stream was last lost (redacted)
    connected: bool = False
    walsender_pid: int | None = None
    history: list[tuple[float, StatusUpdate]] = field(default_factory=list)


class StreamGuard(Protocol):
    """What the client asks of the continuity rule (``tidemark.app`` implements it)."""

    def check(self, observed: ObservedStream) -> None:
        """Raise unless streaming ``observed`` continues what the shapes claim."""

    def slot_created(self, observed: ObservedStream, consistent_lsn: int) -> None:
        """The client created the slot: a new stream starts at ``consistent_lsn``."""

    async def before_send(self, flush_lsn: int) -> None:
        """Called, and awaited, before a status update carrying ``flush_lsn``."""


def proto_for(server_major: int) -> int:
    return 4 if server_major >= 16 else 3


class ReplicationClient:
    """Streams one slot into a queue; reports positions through ``feedback``."""

    def __init__(
        self,
        config: SourceConfig,
        queue: asyncio.Queue[StreamItem] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        guard: StreamGuard | None = None,
        feedback: Feedback | None = None,
    ) -> None:
        """``feedback``: the acknowledgement, the service's (the tracker notifies it);
        one of the client's own when None (a client without a service: tests, bench)."""
        check_name("slot", config.slot)
        self.guard = guard
        check_name("publication", config.publication)
        self.config = config
        self.queue: asyncio.Queue[StreamItem] = queue or asyncio.Queue(config.queue_batches)
        self._queued_bytes = 0
        self._drained = asyncio.Event()
        self.feedback = feedback if feedback is not None else Feedback()
        self.stats = ClientStats()
        self.start_lsn: int | None = None
        self.server_major: int | None = None
        self.system: tuple[str, int] | None = None  # (system identifier, timeline)
        self.proto_version: int | None = None
        self.streaming_started = asyncio.Event()
        self._clock = clock
        self._wall = wall_clock
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self.feedback.on_change = self._wake.set  # what to send may have changed
        self._sender: asyncio.Task[None] | None = None
        self._dropping: str | None = None  # end the current stream: why (drop_stream)
        self._reading: asyncio.Future[None] | None = None  # the read loop's wait
        self._closing: set[asyncio.Future[None]] = set()

    # -- inputs from the pipeline --------------------------------------------

    def drop_stream(self, reason: str) -> None:
        """End the current stream now and connect again later, as after a connection
        loss (nothing is acknowledged beyond what is durable; Postgres sends the rest
        again). For a source that is shutting down: its walsender keeps the server from
        stopping until this client confirms everything sent, or goes."""
        if self._conn is None or self._stopping:
            return
        log.warning("replication.dropping_stream", reason=reason)
        self._dropping = reason
        if self._reading is not None and not self._reading.done():
            self._reading.set_result(None)
        # closed at once, wherever the read loop is (waiting for the consumer, say): the
        # walsender goes, and the loop finds the connection gone and connects again
        closing = asyncio.ensure_future(self._close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    # -- lifecycle -------------------------------------------------------------

    async def run(self) -> None:
        """Stream until ``stop()``; reconnect on connection loss; raise on fatal errors."""
        attempt = 0
        first = True
        while not self._stopping:
            try:
                await self._stream_once(reconnect=not first)
                attempt = 0
                if self._stopping:
                    return
            except (SlotLostError, ReplicationError, TidemarkError):
                raise
            except (
                psycopg.OperationalError,
                psycopg.InterfaceError,
                ConnectionLost,
                OSError,
            ) as exc:
                if self._stopping:
                    return
                attempt += 1
                self.stats.reconnects += 1
                delay = min(
                    self.config.reconnect_max_s,
                    self.config.reconnect_initial_s * 2 ** min(attempt - 1, 16),
                )
                delay *= 0.5 + random.random() / 2  # jitter
                self.stats.last_disconnect = redact_text(str(exc), self.config.dsn).strip()
                log.warning(
                    "replication.disconnected",
                    error=self.stats.last_disconnect,
                    retry_in_s=round(delay, 2),
                    attempt=attempt,
                )
                # closed before the wait: a walsender still attached (a stream dropped
                # on purpose) would keep a stopping server from stopping meanwhile
                self.stats.connected = False
                await self._close()
                await asyncio.sleep(delay)
            finally:
                self.stats.connected = False
                await self._close()
            first = False

    async def stop(self, timeout: float = 10.0) -> None:
        """Final status update, CopyDone, drain, close."""
        self._stopping = True
        self._wake.set()
        await self._stop_sender()
        conn = self._conn
        if conn is None or conn.closed:
            return
        pgconn = conn.pgconn
        try:
            if self.feedback.started:
                await self._send(self.feedback.current())
            pgconn.put_copy_end(None)
            await self._flush_out()
            deadline = self._clock() + timeout
            while self._clock() < deadline:
                pgconn.consume_input()
                nbytes, _ = pgconn.get_copy_data(1)
                if nbytes == -1:
                    while pgconn.get_result() is not None:
                        pass
                    break
                if nbytes == -2:
                    break
                if nbytes == 0:
                    await self._wait_readable(max(0.0, deadline - self._clock()))
            log.info(
                "replication.stopped",
                flush_lsn=format_lsn(self.feedback.flush_lsn) if self.feedback.started else None,
            )
        except ConnectionLost:
            # the receive loop closed the connection while the final update waited (it
            # ends on stopping too): nothing to say to Postgres, which keeps the last
            # position it was told, as after any disconnect
            log.info("replication.stopped", closed_meanwhile=True)
        except (psycopg.Error, OSError) as exc:
            log.warning("replication.stop_unclean", error=redact_text(str(exc), self.config.dsn))
        finally:
            await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    # -- one connection -------------------------------------------------------

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        cfg = self.config
        try:
            return await psycopg.AsyncConnection.connect(
                cfg.dsn,
                replication="database",
                autocommit=True,
                options=session_options(cfg.dsn),
                **connect_timeout(cfg.dsn),
            )
        except psycopg.OperationalError as exc:
            raise classify_connect_error(exc, cfg.dsn) from exc

    async def _prepare(self) -> tuple[int, str]:
        """Checks and objects on a normal connection; returns (server major, dbname)."""
        cfg = self.config
        try:
            conn = await psycopg.AsyncConnection.connect(
                cfg.dsn, autocommit=True, **connect_timeout(cfg.dsn)
            )
        except psycopg.OperationalError as exc:
            raise classify_connect_error(exc, cfg.dsn) from exc
        try:
            major = await slots.check_server(conn)
            if not await slots.role_can_replicate(conn):
                user = conn.info.user
                raise ReplicationError(
                    f"role '{user}' lacks the REPLICATION attribute: run "
                    f"ALTER ROLE {user} REPLICATION; (as a superuser)"
                )
            await slots.ensure_publication(
                conn, cfg.publication, cfg.publication_tables, create=cfg.create_publication
            )
            return major, conn.info.dbname
        finally:
            await conn.close()

    async def _slot_start_lsn(
        self,
        repl: psycopg.AsyncConnection[tuple[object, ...]],
        dbname: str,
        reconnect: bool,
        ident: tuple[str, int],
    ) -> int:
        cfg = self.config
        conn = await psycopg.AsyncConnection.connect(cfg.dsn, autocommit=True)
        try:
            state = await slots.slot_state(conn, cfg.slot)
        finally:
            await conn.close()
        history = await timeline_history(repl, ident[1])
        observed = observed_stream(ident, cfg.slot, state, history)
        if self.guard is not None:
            # before a slot is created over a gap; off the event loop, as a new timeline
            # is written to stream.json: a write there waits for the leader lease to be
            # confirmed again (a failover suspends it, and the lease's task runs on the
            # loop), where on the loop it would fail at once and stop the service
            await asyncio.to_thread(self.guard.check, observed)
        if state is None:
            if reconnect or self.start_lsn is not None:
                raise SlotLostError(
                    f"replication slot '{cfg.slot}' disappeared while tidemark was using it "
                    "(dropped by someone?): changes may have been lost. Resync every shape"
                )
            if not cfg.create_slot:
                raise ReplicationError(
                    f"replication slot '{cfg.slot}' does not exist: create it "
                    f"(SELECT pg_create_logical_replication_slot('{cfg.slot}', 'pgoutput')) "
                    "or allow tidemark to create it"
                )
            lsn = await slots.create_slot(
                repl,
                cfg.slot,
                failover=cfg.failover_slot,
                server_major=self.server_major or slots.MIN_SERVER_MAJOR,
            )
            log.info("slot.created", slot=cfg.slot, consistent_lsn=format_lsn(lsn))
            if self.guard is not None:
                self.guard.slot_created(observed, lsn)
            return lsn
        slots.check_slot_usable(state, cfg.slot, dbname)
        assert state.confirmed_flush_lsn is not None
        return state.confirmed_flush_lsn

    async def _stream_once(self, *, reconnect: bool) -> None:
        cfg = self.config
        major, dbname = await self._prepare()
        self.server_major = major
        repl = await self._connect()
        self._conn = repl
        cur = await repl.execute("IDENTIFY_SYSTEM")
        ident = await cur.fetchone()
        assert ident is not None
        self.system = (str(ident[0]), int(str(ident[1])))
        cur = await repl.execute("SHOW wal_sender_timeout")
        timeout_row = await cur.fetchone()
        timeout_s = _parse_duration_s(str(timeout_row[0]) if timeout_row else "60s")
        slot_lsn = await self._slot_start_lsn(repl, dbname, reconnect, self.system)
        self.feedback.start(
            slot_lsn,
            keepalive_interval_s=keepalive_interval(timeout_s),
            receive_timeout_s=receive_timeout(timeout_s),
        )
        # Resume from what we know is durable; Postgres uses max(this, confirmed_flush).
        start = max(slot_lsn, self.feedback.flush_lsn)
        self.start_lsn = start if self.start_lsn is None else self.start_lsn
        proto = cfg.proto_version or proto_for(major)
        self.proto_version = proto
        options = [
            f"proto_version '{proto}'",
            f"publication_names '{cfg.publication}'",
            "messages 'true'",
        ]
        if cfg.streaming and proto >= 2:
            options.append("streaming 'on'")
        command = (
            f"START_REPLICATION SLOT {cfg.slot} LOGICAL {format_lsn(start)} ({', '.join(options)})"
        )
        pgconn = repl.pgconn
        pid = pgconn.backend_pid
        try:
            await self._start_copy_both(command)
        except psycopg.errors.ObjectInUse as exc:
            raise ConnectionLost(str(exc)) from exc  # our previous walsender still exiting
        except psycopg.errors.UndefinedObject as exc:
            raise SlotLostError(
                f"replication slot '{cfg.slot}' does not exist any more: "
                f"{exc.diag.message_primary}. Resync every shape"
            ) from exc
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:
            raise SlotLostError(
                f"replication slot '{cfg.slot}' cannot be used: {exc.diag.message_primary}. "
                "Drop it and resync every shape"
            ) from exc
        self.stats.connected = True
        self.stats.walsender_pid = pid
        log.info(
            "replication.started",
            slot=cfg.slot,
            start_lsn=format_lsn(start),
            walsender_pid=pid,
            proto_version=proto,
            server=ident[0] if ident else None,
            dsn=redact_dsn(cfg.dsn),
            wal_sender_timeout_s=timeout_s,
            reconnect=reconnect,
        )
        await self.queue.put(StreamStarted(start, pid, proto, reconnect))
        self.streaming_started.set()
        self._sender = asyncio.create_task(self._status_sender(), name="replication-status")
        try:
            await self._read_loop()
        finally:
            await self._stop_sender()

    async def _stop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None and sender is not asyncio.current_task():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender

    async def _start_copy_both(self, command: str) -> None:
        conn = self._conn
        assert conn is not None
        pgconn = conn.pgconn
        pgconn.send_query(command.encode())
        await self._flush_out()
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            await self._wait_readable(None)
        result = pgconn.get_result()
        if result is None:
            raise ConnectionLost("no result for START_REPLICATION")
        if result.status == pq.ExecStatus.FATAL_ERROR:
            err = psycopg.errors.error_from_result(result, encoding="utf-8")
            while pgconn.get_result() is not None:
                pass
            raise err
        if result.status != pq.ExecStatus.COPY_BOTH:
            raise ReplicationError(
                f"START_REPLICATION answered {pq.ExecStatus(result.status).name}, not COPY_BOTH"
            )
        pgconn.nonblocking = 1

    async def _read_loop(self) -> None:
        """Read the stream until stopped: what the frames mean is ``protocol.drain``'s;
        here the waits, the positions fed to ``Feedback`` and the queue."""
        conn = self._conn
        assert conn is not None and self.feedback.started
        pgconn = conn.pgconn
        get_copy_data = pgconn.get_copy_data
        feedback = self.feedback
        stats = self.stats
        queue = self.queue
        clock = self._clock
        feedback.note_heard(clock())
        while not self._stopping:
            try:
                pgconn.consume_input()
            except psycopg.OperationalError as exc:
                raise ConnectionLost(str(exc)) from exc
            drained = drain(get_copy_data)
            for item in drained.items:
                if isinstance(item, WalBatch):
                    feedback.note_received(item.last_lsn)
                    stats.messages_received += len(item.payloads)
                    stats.bytes_received += item.nbytes
                    await self._enqueue(item)
                else:
                    stats.keepalives += 1
                    feedback.note_keepalive(item.wal_end, item.reply_requested)
                    if item.reply_requested:
                        self._wake.set()
                    await queue.put(KeepaliveMark(item.wal_end))
            if drained.end == COPY_ENDED:
                while (res := pgconn.get_result()) is not None:
                    if res.status == pq.ExecStatus.FATAL_ERROR:
                        err = psycopg.errors.error_from_result(res, encoding="utf-8")
                        raise_stream_error(err, self.config.slot)
                raise ConnectionLost("the walsender ended the replication stream")
            if drained.end is not None:
                err_text = (pgconn.error_message or b"").decode(errors="replace")
                raise ConnectionLost(err_text or "copy failed")
            if drained.heard:
                # (heard after the queue took it: a wait for the consumer is no silence)
                feedback.note_heard(clock())
                if isinstance(drained.items[-1], WalBatch):
                    continue  # there may be more already buffered
            elif feedback.timed_out(clock()):
                raise ConnectionLost(
                    f"nothing from the walsender for {feedback.silent_for(clock()):.0f} s, "
                    "not even an answer to a status update that asked for one: the network "
                    "holds or drops the packets; connecting again"
                )
            limit = feedback.receive_timeout_s
            await self._wait_readable(
                None if limit is None else max(0.05, limit - feedback.silent_for(clock()))
            )

    async def _enqueue(self, batch: WalBatch) -> None:
        """Queue a batch for the consumer; wait while it has more bytes than
        ``queue_bytes`` to go through (backpressure reaches the socket)."""
        self._queued_bytes += batch.nbytes
        await self.queue.put(batch)
        while self._queued_bytes > self.config.queue_bytes and not self._stopping:
            self._drained.clear()
            await self._drained.wait()

    def consumed(self, batch: WalBatch) -> None:
        """The consumer is done with ``batch``: its bytes leave the queue's count."""
        self._queued_bytes -= batch.nbytes
        if self._queued_bytes <= self.config.queue_bytes:
            self._drained.set()

    async def _status_sender(self) -> None:
        feedback = self.feedback
        while not self._stopping:
            now = self._clock()
            update = feedback.due(now)
            if update is not None:
                await self._send(update)
                continue
            self._wake.clear()
            await wait_event(self._wake, feedback.next_deadline(now) + 0.001)

    async def _send(self, update: StatusUpdate) -> None:
        conn = self._conn
        if conn is None or conn.closed or not self.feedback.started:
            raise ConnectionLost("status update on a closed replication connection")
        if self.guard is not None:
            await self.guard.before_send(update.flush_lsn)
            if conn.closed:
                raise ConnectionLost("status update on a closed replication connection")
        now = self._clock()
        wall = self._wall()
        msg = standby_status_update(
            update.write_lsn,
            update.flush_lsn,
            update.apply_lsn,
            pg_now_us(wall),
            update.reply_requested,
        )
        conn.pgconn.put_copy_data(msg)
        self.feedback.sent(update, now)
        await self._flush_out()
        self.stats.status_updates += 1
        history = self.stats.history
        history.append((wall, update))
        if len(history) > 256:
            del history[:128]

    async def _flush_out(self) -> None:
        conn = self._conn
        assert conn is not None
        pgconn = conn.pgconn
        while pgconn.flush() == 1:
            await self._wait_writable()

    async def _wait_readable(self, timeout: float | None) -> None:
        await self._wait_fd(True, timeout)

    async def _wait_writable(self) -> None:
        await self._wait_fd(False, 5.0)

    async def _wait_fd(self, readable: bool, timeout: float | None) -> None:
        conn = self._conn
        if conn is None:
            raise ConnectionLost("connection closed")
        loop = asyncio.get_running_loop()
        fd = conn.pgconn.socket
        fut: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        add, remove = (
            (loop.add_reader, loop.remove_reader)
            if readable
            else (loop.add_writer, loop.remove_writer)
        )
        if self._dropping is not None:
            reason, self._dropping = self._dropping, None
            raise ConnectionLost(f"stream dropped: {reason}")
        add(fd, ready)
        if readable:
            self._reading = fut
        try:
            await within(fut, timeout)
        finally:
            remove(fd)
            self._reading = None
        if self._dropping is not None:
            reason, self._dropping = self._dropping, None
            raise ConnectionLost(f"stream dropped: {reason}")


CONNECT_TIMEOUT_S = 10  # when the DSN gives none: a network that holds the packets


def connect_timeout(dsn: str) -> dict[str, Any]:
    """``connect_timeout`` for a connection of the stream, unless the DSN sets one
    (libpq's default is to wait for ever)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {}
    return {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT_S}


RECEIVE_TIMEOUT_MIN_S = 10.0
RECEIVE_TIMEOUT_OFF_S = 60.0  # when the server's wal_sender_timeout is 0 (off)


def receive_timeout(wal_sender_timeout_s: float) -> float:
    """How long the walsender may be silent before the connection is taken for lost
    (PostgreSQL's own walreceiver: ``wal_receiver_timeout``): the server's
    ``wal_sender_timeout`` (it ends a silent client after as long), at least 10 s;
    at half of it a status update asks the walsender for a reply."""
    if wal_sender_timeout_s <= 0:
        return RECEIVE_TIMEOUT_OFF_S
    return max(RECEIVE_TIMEOUT_MIN_S, wal_sender_timeout_s)


def _parse_duration_s(text: str) -> float:
    text = text.strip()
    units = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
    for unit in ("ms", "min", "s", "h", "d"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text) / 1000.0  # bare numbers are milliseconds
