"""Fuzzing the decoder and the framing: bad bytes raise ProtocolError and nothing else.

Properties:

* any typed message, encoded, decodes back to itself;
* every proper prefix of a valid message, and a valid message with bytes appended,
  is rejected (pgoutput messages are self-delimiting);
* random bytes and random mutations of valid messages either decode or raise
  ``ProtocolError``, in every protocol version and stream state.
"""

from __future__ import annotations

import pgoutput_bytes as pg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.errors import ProtocolError
from tidemark.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    BinaryDatum,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    PgOutputDecoder,
    Prepare,
    Relation,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TypeInfo,
    Update,
    parse_copy_data,
)

u8 = st.integers(0, 255)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
lsn = st.integers(0, 2**64 - 1)
ts = st.integers(-(2**63), 2**63 - 1)
name = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
value = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.binary(max_size=24),
    st.builds(BinaryDatum, st.binary(max_size=8)),
)
row = st.lists(value, max_size=6).map(tuple)
stream_xid = st.one_of(st.none(), u32)
old_kind = st.sampled_from(["K", "O"])

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Begin, lsn, ts, u32),
    st.builds(Commit, u8, lsn, lsn, ts),
    st.builds(Origin, lsn, name),
    st.builds(
        Relation,
        u32,
        name,
        name,
        st.sampled_from(["d", "n", "f", "i"]),
        st.lists(st.builds(RelationColumn, name, u32, i32, st.booleans()), max_size=5).map(tuple),
        stream_xid,
    ),
    st.builds(TypeInfo, u32, name, name, stream_xid),
    st.builds(Insert, u32, row, stream_xid),
    st.one_of(
        st.builds(Update, u32, st.none(), st.none(), row, stream_xid),
        st.builds(Update, u32, row, old_kind, row, stream_xid),
    ),
    st.builds(Delete, u32, row, old_kind, stream_xid),
    st.builds(Truncate, st.lists(u32, max_size=5).map(tuple), st.integers(0, 3), stream_xid),
    st.builds(LogicalMessage, st.booleans(), lsn, name, st.binary(max_size=20), stream_xid),
    st.builds(StreamStart, u32, st.booleans()),
    st.just(StreamStop()),
    st.builds(StreamCommit, u32, u8, lsn, lsn, ts),
    st.builds(StreamAbort, u32, u32),
    st.builds(StreamAbort, u32, u32, lsn, ts),
    st.builds(BeginPrepare, lsn, lsn, ts, u32, name),
    st.builds(Prepare, u8, lsn, lsn, ts, u32, name),
    st.builds(CommitPrepared, u8, lsn, lsn, ts, u32, name),
    st.builds(RollbackPrepared, u8, lsn, lsn, ts, ts, u32, name),
    st.builds(StreamPrepare, u8, lsn, lsn, ts, u32, name),
)


STREAMED = (Relation, TypeInfo, Insert, Update, Delete, Truncate, LogicalMessage)


def decoder_for(message: Message) -> PgOutputDecoder:
    """A v4 decoder in the state in which ``message`` may arrive."""
    parallel = isinstance(message, StreamAbort) and message.abort_lsn is not None
    decoder = PgOutputDecoder(4, parallel_streaming=parallel)
    streamed = isinstance(message, STREAMED) and message.xid is not None
    if streamed or isinstance(message, StreamStop):
        decoder.decode(pg.stream_start(1, True))
    return decoder


def decode_or_protocol_error(decoder: PgOutputDecoder, raw: bytes) -> Message | None:
    try:
        return decoder.decode(raw)
    except ProtocolError:
        return None


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decoder_for(message).decode(pg.encode(message)) == message


@given(messages, st.data())
def test_every_proper_prefix_of_a_message_is_rejected(
    message: Message, data: st.DataObject
) -> None:
    raw = pg.encode(message)
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
    assert decode_or_protocol_error(decoder_for(message), raw[:cut]) is None


@given(messages, st.binary(min_size=1, max_size=8))
def test_bytes_after_a_complete_message_are_rejected(message: Message, extra: bytes) -> None:
    assert decode_or_protocol_error(decoder_for(message), pg.encode(message) + extra) is None


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.data())
def test_mutated_messages_decode_or_raise_protocol_error(
    message: Message, data: st.DataObject
) -> None:
    raw = bytearray(pg.encode(message))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        index = data.draw(st.integers(0, len(raw) - 1), label="index")
        raw[index] = data.draw(u8, label="byte")
    decode_or_protocol_error(decoder_for(message), bytes(raw))


@given(
    st.binary(max_size=64),
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
)
def test_random_bytes_decode_or_raise_protocol_error(
    raw: bytes, version: int, parallel: bool, in_stream: bool
) -> None:
    decoder = PgOutputDecoder(version, parallel_streaming=parallel and version == 4)
    if in_stream and version >= 2:
        decoder.decode(pg.stream_start(1, True))
    decode_or_protocol_error(decoder, raw)


@given(st.sampled_from(b"BCORYIUDTMSEcAbPKrp"), st.binary(max_size=48))
def test_random_bodies_behind_every_message_type(tag: int, body: bytes) -> None:
    decode_or_protocol_error(PgOutputDecoder(4), bytes([tag]) + body)


@given(st.sampled_from([b"", b"w", b"k", b"r"]), st.binary(max_size=40))
def test_copy_data_parses_or_raises_protocol_error(kind: bytes, rest: bytes) -> None:
    raw = kind + rest
    try:
        parse_copy_data(raw)
        parse_copy_data(memoryview(raw))
    except ProtocolError:
        pass
