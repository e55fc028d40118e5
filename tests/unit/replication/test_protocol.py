"""``replication.protocol.drain``: the frames libpq has buffered, as the stream's items,
without a socket, a clock or a queue."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from tidemark.errors import ProtocolError
from tidemark.pgoutput.framing import PrimaryKeepalive
from tidemark.replication.protocol import COPY_ENDED, COPY_FAILED, WalBatch, drain


def xlogdata(start: int, payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQQ", start, start + 8, 0) + payload


def keepalive(wal_end: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack("!QqB", wal_end, 0, reply)


def buffered(frames: list[Any], last: int = 0) -> Any:
    """``get_copy_data`` over ``frames``, then ``last`` (0: nothing more buffered)."""
    pending = list(frames)

    def get_copy_data(_async: int) -> tuple[int, Any]:
        assert _async == 1  # never asked to block
        if pending:
            frame = pending.pop(0)
            return len(frame), frame
        return last, b""

    return get_copy_data


def test_xlogdata_frames_are_one_batch_closed_by_a_keepalive_that_follows_it() -> None:
    frames = [xlogdata(100, b"a"), xlogdata(200, b"bb"), keepalive(900, reply=True)]
    frames += [xlogdata(950, b"c")]
    drained = drain(buffered(frames))
    assert drained.heard and drained.end is None
    first, mark, second = drained.items
    assert isinstance(first, WalBatch) and first.payloads == [b"a", b"bb"]
    assert (first.last_lsn, first.nbytes) == (200, 26 + 27)
    assert mark == PrimaryKeepalive(900, 0, True)
    assert isinstance(second, WalBatch) and (second.payloads, second.last_lsn) == ([b"c"], 950)


def test_nothing_buffered_is_silence_and_the_copy_goes_on() -> None:
    drained = drain(buffered([]))
    assert drained.items == [] and not drained.heard and drained.end is None


@pytest.mark.parametrize("end", [COPY_ENDED, COPY_FAILED])
def test_the_end_of_the_copy_comes_after_the_frames_before_it(end: int) -> None:
    drained = drain(buffered([xlogdata(100, b"a"), keepalive(150)], last=end))
    assert drained.end == end
    assert [type(i).__name__ for i in drained.items] == ["WalBatch", "PrimaryKeepalive"]


def test_a_payload_is_copied_out_of_a_memoryview_frame() -> None:
    frame = bytearray(xlogdata(100, b"abc"))
    drained = drain(buffered([memoryview(frame)]))
    frame[-3:] = b"xyz"  # libpq reuses its buffer
    (batch,) = drained.items
    assert isinstance(batch, WalBatch) and batch.payloads == [b"abc"]


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (keepalive(500)[:-1], "keepalive 'k' message: 17 bytes"),
        (xlogdata(500, b"")[:17], "truncated XLogData 'w' message: 17 bytes"),
        (b"x" + struct.pack("!Q", 500), "unknown walsender CopyData kind b'x'"),
    ],
)
def test_a_malformed_frame_is_a_protocol_error_not_a_struct_error(frame: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says.replace("(", r"\(")):
        drain(buffered([xlogdata(100, b"a"), frame]))
