"""The consumer: the replication client's queue in, decoded messages routed to shapes.

One task reads what the client put in its queue, in stream order:

- a ``WalBatch`` (every message one socket read brought): each payload decoded
  (``PgOutputDecoder``) and handed to the ``ShapeLogCollector``; the writers are
  poked, and the consumer waits for memory (``FlushScheduler.wait_for_room``) every
  ``FRAGMENT_CHANGES`` changes or ``FRAGMENT_BYTES`` bytes and after each batch: that
  wait is the backpressure that stops the client reading the socket;
- a ``KeepaliveMark``: with no transaction open, every transaction before it was
  processed; the client's ``Feedback`` is told it was reached, and whether nothing is
  held now (the idle acknowledgement's rule is there);
- a ``StreamStarted``: a new decoder for the protocol version, a half-received
  transaction dropped on a reconnect (Postgres sends it again).

Nothing is processed while ``lock`` is held (``ShapeSet`` pauses the stream with it
to change shapes between batches). ``arrivals`` dates each batch's last commit, for
the acknowledgement lag and a shape's lag in seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final, Protocol

from tidemark.errors import ProtocolError
from tidemark.observability import Metrics
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.replication.client import ReplicationClient
from tidemark.replication.feedback import Feedback
from tidemark.replication.protocol import KeepaliveMark, StreamStarted, WalBatch
from tidemark.stream.collector import ShapeLogCollector

FRAGMENT_CHANGES: Final = 10_000  # backpressure check at least this often inside a batch
FRAGMENT_BYTES: Final = 4 * 1024 * 1024  # ... and at least every this many bytes received
ARRIVALS_KEPT: Final = 100_000


class Writers(Protocol):
    """What the consumer needs of the writers (``tidemark.writers.scheduler`` has the
    service's): a poke when rows arrived, and a wait while they hold too much memory
    (the backpressure that stops the client reading the socket)."""

    def poke(self) -> None: ...

    async def wait_for_room(self) -> None: ...


class StreamConsumer:
    def __init__(
        self,
        collector: ShapeLogCollector,
        metrics: Metrics,
        *,
        feedback: Feedback,
        on_started: Callable[[StreamStarted], None],
    ) -> None:
        """``feedback``: the acknowledgement, told each keepalive the consumer reaches
        and each new stream (the idle rule needs to know how far it got)."""
        self.collector = collector
        self.feedback = feedback
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.decoder: PgOutputDecoder | None = None
        self.idle_processed: int | None = None  # a keepalive reached with nothing held
        self.arrivals: list[tuple[int, float]] = []  # (commit lsn, monotonic) for ack lag
        self._on_started = on_started

    async def run(self, client: ReplicationClient, scheduler: Writers, stop: asyncio.Event) -> None:
        queue = client.queue
        while not stop.is_set():
            item = await queue.get()
            if stop.is_set():
                break
            async with self.lock:
                if type(item) is WalBatch:
                    try:
                        await self._batch(item, scheduler)
                    finally:
                        client.consumed(item)
                elif type(item) is KeepaliveMark:
                    if not self.collector.in_txn:
                        # every transaction before it was processed; what writers still
                        # hold of them bounds the acknowledgement on its own
                        self.idle_processed = item.wal_end
                    self.feedback.keepalive_reached(
                        item.wal_end, self.collector.tracker.is_caught_up
                    )
                elif type(item) is StreamStarted:
                    self.decoder = PgOutputDecoder(item.proto_version)
                    self.feedback.stream_restarted()
                    if item.reconnect:
                        self.collector.stream_restarted()
                    self._on_started(item)

    async def _batch(self, batch: WalBatch, scheduler: Writers) -> None:
        """The hot path: decode and route every message of one read from the socket."""
        decoder, collector = self.decoder, self.collector
        assert decoder is not None
        decode, handle, metrics = decoder.decode, collector.handle, self.metrics
        before_txns = collector.stats.transactions
        count = received = 0
        for payload in batch.payloads:
            try:
                message = decode(payload)
            except ProtocolError:
                metrics.decode_errors.inc()
                raise
            size = len(payload)
            handle(message, size)
            count += 1
            received += size
            if count >= FRAGMENT_CHANGES or received >= FRAGMENT_BYTES:
                count = received = 0
                scheduler.poke()
                await scheduler.wait_for_room()
        new_txns = collector.stats.transactions - before_txns
        if new_txns and collector.last_commit_lsn is not None:
            metrics.transactions.inc(new_txns)
            if len(self.arrivals) < ARRIVALS_KEPT:
                self.arrivals.append((collector.last_commit_lsn, time.monotonic()))
        scheduler.poke()
        await scheduler.wait_for_room()

    def acknowledged(self, lsn: int) -> float | None:
        """Every transaction through ``lsn`` is durable: observe their ack lag; the
        longest of them (None when no transaction was newly covered)."""
        now = time.monotonic()
        arrivals = self.arrivals
        done = 0
        longest = None
        for commit_lsn, at in arrivals:
            if commit_lsn > lsn:
                break
            if longest is None:
                longest = now - at  # (arrivals are in order: the first waited longest)
            self.metrics.ack_lag_seconds.observe(now - at)
            done += 1
        if done:
            del arrivals[:done]
        return longest

    def waited_since(self, frontier: int) -> float:
        """How long the oldest transaction received past ``frontier`` has waited (0 when
        none has)."""
        for commit_lsn, arrived in self.arrivals:
            if commit_lsn > frontier:
                return max(0.0, time.monotonic() - arrived)
        return 0.0
