"""The walsender CopyData envelope: XLogData, keepalive, standby status update, clock."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pgoutput_bytes as pg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import ProtocolError
from tidemark.pgoutput import (
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    pg_now_us,
    standby_status_update,
    xlogdata_parts,
)

lsn = st.integers(0, 2**64 - 1)
clock = st.integers(-(2**63), 2**63 - 1)


@given(lsn, lsn, clock, st.binary(max_size=64))
def test_xlogdata_carries_the_wal_range_and_the_payload(
    start: int, end: int, sent: int, payload: bytes
) -> None:
    frame = pg.xlogdata(start, end, sent, payload)
    parsed = parse_copy_data(frame)
    assert parsed == XLogData(start, end, sent, payload)
    assert isinstance(parsed, XLogData)
    assert type(parsed.payload) is bytes
    assert xlogdata_parts(frame) == (start, end, sent, payload)


def test_xlogdata_from_a_memoryview_gives_a_bytes_payload() -> None:
    # Given a frame as psycopg hands it over: a memoryview
    frame = memoryview(pg.xlogdata(1, 2, 3, b"I\x00payload"))
    # Then the payload is bytes, usable by the decoder
    parsed = parse_copy_data(frame)
    assert isinstance(parsed, XLogData)
    assert type(parsed.payload) is bytes
    assert parsed.payload == b"I\x00payload"
    assert xlogdata_parts(frame)[3] == b"I\x00payload"


@pytest.mark.parametrize("reply", [True, False])
def test_primary_keepalive(reply: bool) -> None:
    parsed = parse_copy_data(pg.keepalive(0x16_B374_D848, 770_000_000_000_000, reply))
    assert parsed == PrimaryKeepalive(0x16_B374_D848, 770_000_000_000_000, reply)


def test_truncated_xlogdata_header_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=r"truncated XLogData 'w' message: 24 bytes"):
        parse_copy_data(pg.xlogdata(1, 2, 3, b"")[:-1])


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (pg.keepalive(1, 2, True)[:-1], "17 bytes instead of 18 (truncated at byte 17)"),
        (
            pg.keepalive(1, 2, True) + b"\x00",
            "19 bytes instead of 18 (trailing bytes from byte 18)",
        ),
    ],
)
def test_keepalive_of_the_wrong_size_is_rejected(frame: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=r"Primary keepalive 'k'") as raised:
        parse_copy_data(frame)
    assert words in str(raised.value)


def test_unknown_or_empty_copy_data_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=r"unknown walsender CopyData kind b'r' \(0x72\)"):
        parse_copy_data(b"r" + b"\x00" * 33)
    with pytest.raises(ProtocolError, match="empty CopyData"):
        parse_copy_data(b"")


def test_xlogdata_parts_rejects_keepalives() -> None:
    with pytest.raises(ProtocolError, match="expected an XLogData 'w' frame, got PrimaryKeepalive"):
        xlogdata_parts(pg.keepalive(1, 2))
    with pytest.raises(ProtocolError, match="truncated XLogData"):
        xlogdata_parts(b"w\x00")


def test_standby_status_update_layout() -> None:
    # Given write/flush/apply positions and a client clock
    message = standby_status_update(0x30, 0x20, 0x10, 12345, reply_requested=True)
    # Then the 34 bytes are 'r', three unsigned LSNs, a signed clock, the reply flag
    assert len(message) == 34
    assert struct.unpack(">cQQQqB", message) == (b"r", 0x30, 0x20, 0x10, 12345, 1)


@given(lsn, lsn, lsn, clock, st.booleans())
def test_standby_status_update_round_trips(
    write: int, flush: int, apply: int, now: int, reply: bool
) -> None:
    message = standby_status_update(write, flush, apply, now, reply)
    assert struct.unpack(">cQQQqB", message) == (b"r", write, flush, apply, now, int(reply))


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_status_update_refuses_lsns_outside_64_bits(bad: int) -> None:
    with pytest.raises(ProtocolError, match=f"flush LSN {bad} is outside"):
        standby_status_update(0, bad, 0, 0)


def test_status_update_refuses_a_clock_outside_64_bits() -> None:
    with pytest.raises(ProtocolError, match="clock"):
        standby_status_update(0, 0, 0, 2**63)


def test_postgres_clock_counts_microseconds_since_2000() -> None:
    assert pg_now_us(datetime(2000, 1, 1, tzinfo=UTC).timestamp()) == 0
    assert pg_now_us(datetime(2000, 1, 1, 0, 0, 1, tzinfo=UTC).timestamp()) == 1_000_000
    assert pg_now_us(0.0) == -946_684_800_000_000
    # a present-day time keeps microsecond resolution
    moment = datetime(2025, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    assert pg_now_us(moment.timestamp()) == 802_094_400_250_000
