"""The walsender CopyData envelope around pgoutput messages (streaming replication protocol).

Inside ``START_REPLICATION``'s COPY BOTH, the server sends CopyData payloads of two
kinds and the client answers with a third:

* ``w`` XLogData: wal_start, wal_end, send_time, then one pgoutput message;
* ``k`` Primary keepalive: wal_end, send_time, reply_requested;
* ``r`` Standby status update (client to server): write, flush and apply LSNs,
  the client's clock, reply_requested.

LSNs are unsigned 64-bit, times are signed 64-bit microseconds since
2000-01-01 00:00:00 UTC (the Postgres epoch), all big-endian.

Promises: ``parse_copy_data`` returns ``XLogData`` or ``PrimaryKeepalive`` or raises
``ProtocolError`` (unknown kind, truncated, trailing bytes), nothing else.
``standby_status_update`` builds exactly 34 bytes. Nothing here reads a clock:
``pg_now_us`` converts a Unix time it is given.

Copies: ``XLogData.payload`` is ``bytes`` because the decoder keeps column values as
slices of it. For a ``bytes`` frame that is one copy of the payload (the 25-byte
header is not copied); for a ``memoryview`` frame, as psycopg's ``get_copy_data``
returns, the frame is sliced as a view first, so the payload is still copied exactly
once and the rest of the frame never.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tidemark.errors import ProtocolError

__all__ = [
    "POSTGRES_EPOCH_UNIX",
    "PrimaryKeepalive",
    "XLogData",
    "parse_copy_data",
    "pg_now_us",
    "standby_status_update",
    "xlogdata_parts",
]

#: 2000-01-01 00:00:00 UTC as a Unix timestamp.
POSTGRES_EPOCH_UNIX: Final = 946_684_800

_XLOG_HEADER: Final = struct.Struct(">QQq")  # wal_start, wal_end, send_time
_KEEPALIVE: Final = struct.Struct(">QqB")  # wal_end, send_time, reply_requested
_STATUS_UPDATE: Final = struct.Struct(">cQQQqB")
_MAX_LSN: Final = (1 << 64) - 1
_XLOG_DATA: Final = ord("w")
_PRIMARY_KEEPALIVE: Final = ord("k")


@dataclass(frozen=True, slots=True)
class XLogData:
    """``w``: one pgoutput message and the WAL range it was sent for."""

    wal_start: int
    wal_end: int
    send_time: int  # microseconds since 2000-01-01 UTC, server clock
    payload: bytes


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """``k``: the server's current WAL end; answer at once when ``reply_requested``."""

    wal_end: int
    send_time: int
    reply_requested: bool


_new_object: Final = object.__new__
_set_wal_start: Final[Callable[[object, object], None]] = vars(XLogData)["wal_start"].__set__
_set_wal_end: Final[Callable[[object, object], None]] = vars(XLogData)["wal_end"].__set__
_set_send_time: Final[Callable[[object, object], None]] = vars(XLogData)["send_time"].__set__
_set_payload: Final[Callable[[object, object], None]] = vars(XLogData)["payload"].__set__


def parse_copy_data(buf: bytes | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse one CopyData payload received during START_REPLICATION."""
    size = len(buf)
    if size == 0:
        raise ProtocolError(
            "empty CopyData message from the walsender; expected XLogData 'w' or keepalive 'k'"
        )
    kind = buf[0]
    if kind == _XLOG_DATA:
        if size < 25:
            raise ProtocolError(
                f"truncated XLogData 'w' message: {size} bytes, the header alone needs 25 "
                "(byte 0 kind, 1 wal_start, 9 wal_end, 17 send_time); the stream is corrupt"
            )
        wal_start, wal_end, send_time = _XLOG_HEADER.unpack_from(buf, 1)
        # One XLogData per pgoutput message: built through the slot descriptors, which
        # costs about half of the frozen dataclass __init__ (see decoder.py).
        frame: XLogData = _new_object(XLogData)
        _set_wal_start(frame, wal_start)
        _set_wal_end(frame, wal_end)
        _set_send_time(frame, send_time)
        _set_payload(frame, bytes(buf[25:]))
        return frame
    if kind == _PRIMARY_KEEPALIVE:
        if size != 18:
            raise ProtocolError(
                f"malformed Primary keepalive 'k' message: {size} bytes instead of 18 "
                f"({'truncated at' if size < 18 else 'trailing bytes from'} byte "
                f"{min(size, 18)}); the stream is corrupt"
            )
        wal_end, send_time, reply = _KEEPALIVE.unpack_from(buf, 1)
        return PrimaryKeepalive(wal_end, send_time, reply != 0)
    raise ProtocolError(
        f"unknown walsender CopyData kind {bytes([kind])!r} (0x{kind:02x}) at byte 0; "
        "expected XLogData 'w' or Primary keepalive 'k'"
    )


def xlogdata_parts(buf: bytes | memoryview) -> tuple[int, int, int, bytes]:
    """Hot-path form of ``parse_copy_data`` for XLogData frames.

    Returns ``(wal_start, wal_end, send_time, payload)`` as a plain tuple: no
    ``XLogData`` object, which is most of ``parse_copy_data``'s cost per message.
    Raises ``ProtocolError`` if ``buf`` is not a well-formed XLogData frame (a keepalive
    included: check ``buf[0] == ord("w")`` first, or use ``parse_copy_data``).
    """
    if len(buf) < 25 or buf[0] != _XLOG_DATA:
        frame = parse_copy_data(buf)  # raises the precise error for malformed frames
        raise ProtocolError(
            f"expected an XLogData 'w' frame, got {type(frame).__name__}; "
            "use parse_copy_data for frames that may be keepalives"
        )
    wal_start, wal_end, send_time = _XLOG_HEADER.unpack_from(buf, 1)
    return wal_start, wal_end, send_time, bytes(buf[25:])


def standby_status_update(
    write_lsn: int,
    flush_lsn: int,
    apply_lsn: int,
    now_us: int,
    reply_requested: bool = False,
) -> bytes:
    """The ``r`` message telling the server how far WAL was written, flushed and applied.

    ``now_us`` is the client clock in microseconds since 2000-01-01 UTC (``pg_now_us``).
    """
    for name, lsn in (("write", write_lsn), ("flush", flush_lsn), ("apply", apply_lsn)):
        if not 0 <= lsn <= _MAX_LSN:
            raise ProtocolError(
                f"standby status update {name} LSN {lsn!r} is outside 0..2^64-1; "
                "an acknowledged LSN must be a position received from the server"
            )
    try:
        return _STATUS_UPDATE.pack(
            b"r", write_lsn, flush_lsn, apply_lsn, now_us, 1 if reply_requested else 0
        )
    except struct.error:
        raise ProtocolError(
            f"standby status update clock {now_us!r} is outside the signed 64-bit range; "
            "pass pg_now_us(time.time())"
        ) from None


def pg_now_us(unix_time: float) -> int:
    """Microseconds since 2000-01-01 00:00:00 UTC for a Unix time in seconds."""
    return round((unix_time - POSTGRES_EPOCH_UNIX) * 1_000_000)
