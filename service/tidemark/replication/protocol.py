"""The streaming replication protocol without IO: what the CopyData frames libpq has
buffered mean, and what goes into the stream queue.

The split is psycopg's (``generators.py`` against ``waiting.py``): ``drain`` takes
libpq's non-blocking ``get_copy_data`` and returns what the frames it has buffered
mean, in stream order; it never waits, reads no clock and touches no queue. The client
(``replication.client``) does the rest: it waits for the socket, feeds the positions
to ``Feedback``, and puts the items in the queue, which is where backpressure holds the
stream. Frames are parsed by ``pgoutput.framing``: an XLogData with its whole header
is taken apart here (its payload is kept as is, its header read once per batch); any
other frame goes through ``parse_copy_data``, so a truncated or unknown frame is a
``ProtocolError`` naming it, never a ``struct.error``.

Promises: the items of one ``drain`` are in the order of the frames; consecutive
XLogData frames become one ``WalBatch`` (the queue is touched once per read, not once
per message), closed by a keepalive, which follows it as a ``Keepalive``; ``end`` says
whether the copy went on (``None``), was ended by the server (``COPY_ENDED``) or failed
(``COPY_FAILED``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from tidemark.pgoutput.framing import PrimaryKeepalive, parse_copy_data

__all__ = [
    "COPY_ENDED",
    "COPY_FAILED",
    "Drained",
    "KeepaliveMark",
    "StreamItem",
    "StreamStarted",
    "WalBatch",
    "drain",
]

_XLOG_START: Final = struct.Struct("!Q")  # wal_start, the first field after the kind
_XLOG_DATA: Final = 0x77  # 'w'
_HEADER: Final = 25  # kind, wal_start, wal_end, send_time

#: ``get_copy_data``'s answers past the frames: the server ended the copy, or it failed
COPY_ENDED: Final = -1
COPY_FAILED: Final = -2


@dataclass(slots=True)
class WalBatch:
    """XLogData payloads in stream order, and the highest XLogData start among them."""

    payloads: list[bytes]
    last_lsn: int
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class KeepaliveMark:
    """A keepalive's ``wal_end`` in the queue, in stream order (the idle rule's input)."""

    wal_end: int


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """A (re)connection began streaming at ``start_lsn``: drop any half-received txn."""

    start_lsn: int
    walsender_pid: int
    proto_version: int
    reconnect: bool


StreamItem = WalBatch | KeepaliveMark | StreamStarted


@dataclass(slots=True)
class Drained:
    """What one ``drain`` found: batches and keepalives in stream order, whether any
    frame came (``heard``), and how the copy stands (``end``: None, ``COPY_ENDED``,
    ``COPY_FAILED``)."""

    items: list[WalBatch | PrimaryKeepalive]
    heard: bool
    end: int | None


def drain(get_copy_data: Callable[[int], tuple[int, Any]]) -> Drained:
    """Every frame libpq has buffered (``pgconn.get_copy_data``, asked not to block),
    until it has no whole frame left or the copy ends."""
    items: list[WalBatch | PrimaryKeepalive] = []
    payloads: list[bytes] = []
    append = payloads.append
    header: Any = None  # the last XLogData: WAL positions never decrease in a stream
    received = 0
    heard = False
    while True:
        nbytes, data = get_copy_data(1)
        if nbytes > 0:
            heard = True
            if data[0] == _XLOG_DATA and nbytes >= _HEADER:  # an XLogData, header whole
                append(bytes(data[_HEADER:]))
                header = data
                received += nbytes
                continue
            frame = parse_copy_data(data)  # a keepalive, or a ProtocolError naming it
            assert isinstance(frame, PrimaryKeepalive)  # (an XLogData here is whole)
            if payloads:
                items.append(WalBatch(payloads, _XLOG_START.unpack_from(header, 1)[0], received))
                payloads, header, received = [], None, 0
                append = payloads.append
            items.append(frame)
            continue
        if payloads:
            items.append(WalBatch(payloads, _XLOG_START.unpack_from(header, 1)[0], received))
        return Drained(items, heard, None if nbytes == 0 else nbytes)
