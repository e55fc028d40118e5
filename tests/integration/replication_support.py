"""A minimal consumer for replication tests: decodes, follows transactions, and
reports durability the way the real pipeline does (or withholds it on purpose)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg

from tidemark.pgoutput import messages as m
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.replication.client import ReplicationClient, SourceConfig
from tidemark.replication.protocol import KeepaliveMark, StreamStarted, WalBatch


@dataclass
class Txn:
    xid: int
    commit_lsn: int
    end_lsn: int
    changes: list[m.Message] = field(default_factory=list)


@dataclass
class RecordingConsumer:
    """Consumes the client's queue. ``durable=True`` marks each transaction durable at its
    commit (an instant sink); ``durable=False`` withholds it (a stalled writer)."""

    client: ReplicationClient
    durable: bool = True
    paused: asyncio.Event = field(default_factory=asyncio.Event)
    txns: list[Txn] = field(default_factory=list)
    starts: list[StreamStarted] = field(default_factory=list)
    keepalives: int = 0
    open_txn: Txn | None = None
    decoder: PgOutputDecoder | None = None
    relations: dict[int, m.Relation] = field(default_factory=dict)
    withheld: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paused.set()  # set = running

    async def run(self) -> None:
        queue = self.client.queue
        while True:
            item = await queue.get()
            await self.paused.wait()
            if isinstance(item, StreamStarted):
                self.starts.append(item)
                self.decoder = PgOutputDecoder(item.proto_version)
                self.open_txn = None  # Postgres re-sends it whole
            elif isinstance(item, WalBatch):
                assert self.decoder is not None
                for payload in item.payloads:
                    self._on_message(self.decoder.decode(payload))
            elif isinstance(item, KeepaliveMark):
                self.keepalives += 1
                self.client.feedback.keepalive_reached(
                    item.wal_end, self.open_txn is None and not self.withheld
                )

    def _on_message(self, msg: m.Message) -> None:
        if isinstance(msg, m.Begin):
            self.open_txn = Txn(msg.xid, msg.final_lsn, 0)
        elif isinstance(msg, m.Commit):
            txn = self.open_txn
            assert txn is not None and txn.commit_lsn == msg.commit_lsn
            txn.end_lsn = msg.end_lsn
            self.open_txn = None
            if self.txns and msg.commit_lsn <= self.txns[-1].commit_lsn:
                return  # replayed after a reconnect: already have it
            self.txns.append(txn)
            if self.durable:
                self.client.feedback.note_durable(msg.commit_lsn)
            else:
                self.withheld.append(msg.commit_lsn)
        elif isinstance(msg, m.Relation):
            self.relations[msg.oid] = msg
        elif self.open_txn is not None:
            self.open_txn.changes.append(msg)

    def release(self) -> None:
        """The stalled writer catches up."""
        for lsn in self.withheld:
            self.client.feedback.note_durable(lsn)
        self.withheld.clear()

    def rows(self, relname: str) -> list[tuple[str, tuple[object, ...]]]:
        out = []
        for txn in self.txns:
            for change in txn.changes:
                if isinstance(change, m.Insert | m.Update | m.Delete):
                    rel = self.relations[change.relation_oid]
                    if rel.name != relname:
                        continue
                    tup = change.old if isinstance(change, m.Delete) else change.new
                    out.append((type(change).__name__, tuple(tup)))
        return out


@contextlib.asynccontextmanager
async def streaming(
    config: SourceConfig, *, durable: bool = True, queue_batches: int | None = None
) -> AsyncIterator[RecordingConsumer]:
    queue: asyncio.Queue[object] | None = (
        asyncio.Queue(queue_batches) if queue_batches is not None else None
    )
    client = ReplicationClient(config, queue)  # type: ignore[arg-type]
    consumer = RecordingConsumer(client, durable=durable)
    client_task = asyncio.create_task(client.run())
    consumer_task = asyncio.create_task(consumer.run())
    try:
        await asyncio.wait_for(_started(client, client_task), 30)
        yield consumer
    finally:
        await client.stop()
        consumer_task.cancel()
        client_task.cancel()
        for task in (consumer_task, client_task):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _started(client: ReplicationClient, task: asyncio.Task[None]) -> None:
    waiter = asyncio.create_task(client.streaming_started.wait())
    done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises the client's error
        raise AssertionError("replication client ended before streaming")


async def eventually(predicate, timeout: float = 20.0, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def slot_row(dsn: str, slot: str) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "select confirmed_flush_lsn, restart_lsn, pg_current_wal_lsn(), wal_status,"
            " active_pid, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint"
            " from pg_replication_slots where slot_name = %s",
            (slot,),
        )
        row = cur.fetchone()
        assert row is not None, f"slot {slot} missing"
        from tidemark.lsn import Lsn

        return {
            "confirmed_flush_lsn": int(Lsn.parse(row[0])),
            "restart_lsn": int(Lsn.parse(row[1])),
            "current": int(Lsn.parse(row[2])),
            "wal_status": row[3],
            "active_pid": row[4],
            "retained": int(row[5]),
        }
