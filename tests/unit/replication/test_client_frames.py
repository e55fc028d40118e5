"""What the replication client does with malformed frames from the walsender: a clear
``ProtocolError`` naming the frame, never a ``struct.error``; a well-formed stream still
reaches the queue. The connection is a stand-in for psycopg's ``pgconn`` that hands out
CopyData frames, so the client's own read loop runs on them."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from types import SimpleNamespace

import pytest

from tidemark.errors import ProtocolError
from tidemark.replication.client import ReplicationClient, SourceConfig
from tidemark.replication.feedback import Feedback
from tidemark.replication.protocol import KeepaliveMark, WalBatch


class FramesConn:
    """``get_copy_data`` hands out the frames, then nothing more (the loop then waits)."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = list(frames)

    def consume_input(self) -> None:
        pass

    def get_copy_data(self, _async: int) -> tuple[int, bytes]:
        if self.frames:
            frame = self.frames.pop(0)
            return len(frame), frame
        return 0, b""


def xlogdata(start: int, payload: bytes = b"B...") -> bytes:
    return b"w" + struct.pack("!QQQ", start, start + 8, 0) + payload


def keepalive(wal_end: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack("!QQB", wal_end, 0, reply)


async def read(frames: list[bytes]) -> list[object]:
    client = ReplicationClient(SourceConfig(dsn="host=nowhere"))
    client.feedback = Feedback(100)
    client._conn = SimpleNamespace(pgconn=FramesConn(frames))  # type: ignore[assignment]

    async def never_readable(_timeout: object) -> None:
        await asyncio.sleep(3600)

    client._wait_readable = never_readable  # type: ignore[method-assign]
    task = asyncio.create_task(client._read_loop())
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 0.5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    items = []
    while not client.queue.empty():
        items.append(client.queue.get_nowait())
    return items


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"k" + struct.pack("!QQ", 500, 0), "keepalive 'k' message: 17 bytes"),
        (b"k" + struct.pack("!Q", 500), "keepalive 'k' message: 9 bytes"),
        (b"w" + struct.pack("!QQ", 500, 600), "truncated XLogData 'w' message: 17 bytes"),
        (b"w", "truncated XLogData 'w' message: 1 bytes"),
        (b"x" + struct.pack("!Q", 500), "unknown walsender CopyData kind b'x'"),
    ],
)
def test_a_malformed_frame_is_a_protocol_error_that_names_it(frame: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says.replace("(", r"\(")):
        asyncio.run(read([xlogdata(100), frame, keepalive(900)]))


def test_well_formed_frames_reach_the_queue_in_order() -> None:
    items = asyncio.run(read([xlogdata(100, b"one"), xlogdata(200, b"two"), keepalive(900)]))
    assert len(items) == 2
    batch, mark = items
    assert isinstance(batch, WalBatch) and batch.payloads == [b"one", b"two"]
    assert batch.last_lsn == 200
    assert isinstance(mark, KeepaliveMark) and mark.wal_end == 900
