"""PgOutputDecoder: every pgoutput message of protocol versions 1-4, from hand-built bytes."""

from __future__ import annotations

import struct

import pgoutput_bytes as pg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.errors import ConfigError, ProtocolError
from tidemark.pgoutput import (
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    BinaryDatum,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputDecoder,
    Prepare,
    Relation,
    RelationCache,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TypeInfo,
    Update,
)

LSN = 0x16_B374_D848
TS = 770_000_000_123_456
OID = 16384


def decoder(version: int = 4, parallel: bool = False) -> PgOutputDecoder:
    return PgOutputDecoder(proto_version=version, parallel_streaming=parallel)


# --- transaction boundaries ---


def test_begin_and_commit_carry_lsns_timestamps_and_xid() -> None:
    d = decoder(1)
    assert d.decode(pg.begin(LSN, TS, 4242)) == Begin(final_lsn=LSN, commit_ts=TS, xid=4242)
    assert d.decode(pg.commit(LSN, LSN + 48, TS)) == Commit(
        flags=0, commit_lsn=LSN, end_lsn=LSN + 48, commit_ts=TS
    )


def test_unsigned_fields_use_the_full_range_and_timestamps_may_be_negative() -> None:
    # Given an LSN and xid with the top bit set and a timestamp before 2000
    message = pg.begin((1 << 64) - 8, -1_000_000, 0xFFFF_FFFE)
    # Then they decode as Postgres meant them (LSN/xid unsigned, timestamp signed)
    assert decoder(1).decode(message) == Begin((1 << 64) - 8, -1_000_000, 0xFFFF_FFFE)


def test_origin_names_the_origin_of_the_transaction() -> None:
    assert decoder(1).decode(pg.origin(LSN, "node_ü")) == Origin(LSN, "node_ü")


# --- schema ---


def test_relation_describes_columns_with_key_flags_and_modifiers() -> None:
    columns = [
        ("id", 20, -1, True),
        ("amount", 1700, ((12 << 16) | 2) + 4, False),
        ("naïve", 25, -1, False),
    ]
    message = decoder(1).decode(pg.relation(OID, "public", "orders", columns, "f"))
    assert message == Relation(
        oid=OID,
        namespace="public",
        name="orders",
        replica_identity="f",
        columns=(
            RelationColumn("id", 20, -1, True),
            RelationColumn("amount", 1700, ((12 << 16) | 2) + 4, False),
            RelationColumn("naïve", 25, -1, False),
        ),
    )
    assert isinstance(message, Relation)
    assert message.qualified_name == "public.orders"


def test_relation_in_pg_catalog_has_an_empty_namespace() -> None:
    message = decoder(1).decode(pg.relation(OID, "", "t", []))
    assert isinstance(message, Relation)
    assert message.columns == ()
    assert message.qualified_name == "pg_catalog.t"


def test_relation_with_an_unknown_replica_identity_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=r"Relation.*replica identity b'x'"):
        decoder(1).decode(pg.relation(OID, "public", "t", [], "x"))


def test_type_message_names_a_user_type() -> None:
    assert decoder(1).decode(pg.type_info(90001, "public", "mood")) == TypeInfo(
        90001, "public", "mood"
    )


# --- changes and tuple data ---


def test_insert_keeps_text_values_as_bytes_and_marks_null_toast_and_binary() -> None:
    # Given a row with every tuple data kind: text, null, unchanged TOAST, binary
    values = [b"42", None, UNCHANGED_TOAST, BinaryDatum(b"\x00\x01"), "", "héllo"]
    # When it is decoded
    message = decoder(1).decode(pg.insert(OID, values))
    # Then text stays bytes (not decoded), the markers are kept
    assert message == Insert(
        OID, (b"42", None, UNCHANGED_TOAST, BinaryDatum(b"\x00\x01"), b"", "héllo".encode())
    )
    assert isinstance(message, Insert)
    assert type(message.new[0]) is bytes
    assert message.xid is None


def test_insert_decoded_fast_equals_one_built_by_the_dataclass() -> None:
    message = decoder(1).decode(pg.insert(OID, [b"1"]))
    assert message == Insert(OID, (b"1",), None)
    assert hash(message) == hash(Insert(OID, (b"1",), None))
    with pytest.raises(AttributeError):
        message.relation_oid = 1  # type: ignore[misc]


def test_insert_of_a_row_without_columns() -> None:
    assert decoder(1).decode(pg.insert(OID, [])) == Insert(OID, ())


def test_update_without_old_tuple_when_the_key_did_not_change() -> None:
    message = decoder(1).decode(pg.update(OID, [b"1", b"new"]))
    assert message == Update(OID, old=None, old_kind=None, new=(b"1", b"new"))


def test_update_with_old_key_columns() -> None:
    message = decoder(1).decode(pg.update(OID, [b"2", b"x"], old=[b"1", None], old_kind="K"))
    assert message == Update(OID, old=(b"1", None), old_kind="K", new=(b"2", b"x"))


def test_update_with_the_whole_old_row_under_replica_identity_full() -> None:
    message = decoder(1).decode(
        pg.update(OID, [b"1", UNCHANGED_TOAST], old=[b"1", b"big"], old_kind="O")
    )
    assert message == Update(OID, (b"1", b"big"), "O", (b"1", UNCHANGED_TOAST))


@pytest.mark.parametrize("kind", ["K", "O"])
def test_delete_carries_the_old_key_or_row(kind: str) -> None:
    message = decoder(1).decode(pg.delete(OID, [b"7", None], kind))
    assert message == Delete(OID, (b"7", None), kind)  # type: ignore[arg-type]


def test_delete_without_old_tuple_tag_is_rejected() -> None:
    bad = b"D" + struct.pack(">I", OID) + b"N" + pg.tuple_data([b"1"])
    with pytest.raises(ProtocolError, match=r"Delete.*expected 'K' or 'O'.*at byte 5"):
        decoder(1).decode(bad)


def test_truncate_lists_relations_and_both_option_bits() -> None:
    options = TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY
    message = decoder(1).decode(pg.truncate([OID, OID + 1, OID + 2], options))
    assert message == Truncate((OID, OID + 1, OID + 2), options)
    assert isinstance(message, Truncate)
    assert message.options & TRUNCATE_CASCADE
    assert message.options & TRUNCATE_RESTART_IDENTITY


def test_truncate_without_options() -> None:
    assert decoder(1).decode(pg.truncate([OID])) == Truncate((OID,), 0)


@pytest.mark.parametrize("transactional", [True, False])
def test_logical_message_transactional_or_not(transactional: bool) -> None:
    raw = pg.logical_message("audit", b"\x00payload\xff", LSN, transactional)
    assert decoder(1).decode(raw) == LogicalMessage(transactional, LSN, "audit", b"\x00payload\xff")


# --- streaming (v2+) ---


def test_changes_inside_a_stream_block_carry_the_xid() -> None:
    # Given a stream block of transaction 900
    d = decoder(2)
    assert d.decode(pg.stream_start(900, first_segment=True)) == StreamStart(900, True)
    assert d.in_stream
    # Then every change message inside it carries xid 900
    inside = [
        (pg.relation(OID, "public", "t", [("id", 23, -1, True)], xid=900),
         Relation(OID, "public", "t", "d", (RelationColumn("id", 23, -1, True),), 900)),
        (pg.type_info(90001, "public", "mood", xid=900), TypeInfo(90001, "public", "mood", 900)),
        (pg.insert(OID, [b"1"], xid=900), Insert(OID, (b"1",), 900)),
        (pg.update(OID, [b"2"], [b"1"], "K", xid=900), Update(OID, (b"1",), "K", (b"2",), 900)),
        (pg.update(OID, [b"3"], xid=900), Update(OID, None, None, (b"3",), 900)),
        (pg.delete(OID, [b"2"], xid=900), Delete(OID, (b"2",), "K", 900)),
        (pg.truncate([OID], TRUNCATE_CASCADE, xid=900), Truncate((OID,), 1, 900)),
        (pg.logical_message("p", b"c", LSN, xid=900), LogicalMessage(True, LSN, "p", b"c", 900)),
    ]  # fmt: skip
    for raw, expected in inside:
        assert d.decode(raw) == expected
    # When the block stops, changes no longer carry an xid
    assert d.decode(pg.stream_stop()) == StreamStop()
    assert not d.in_stream
    assert d.decode(pg.insert(OID, [b"1"])) == Insert(OID, (b"1",), None)


def test_later_segment_and_stream_commit() -> None:
    d = decoder(2)
    assert d.decode(pg.stream_start(900, first_segment=False)) == StreamStart(900, False)
    d.decode(pg.stream_stop())
    assert d.decode(pg.stream_commit(900, LSN, LSN + 8, TS)) == StreamCommit(
        900, 0, LSN, LSN + 8, TS
    )


def test_stream_abort_without_parallel_streaming_has_no_lsn_or_timestamp() -> None:
    for version in (2, 3, 4):
        assert decoder(version).decode(pg.stream_abort(900, 901)) == StreamAbort(900, 901)


def test_stream_abort_with_v4_parallel_streaming_carries_abort_lsn_and_timestamp() -> None:
    message = decoder(4, parallel=True).decode(pg.stream_abort(900, 900, LSN, TS))
    assert message == StreamAbort(900, 900, abort_lsn=LSN, abort_ts=TS)


def test_stream_abort_layout_must_match_the_parallel_option() -> None:
    # A v4 abort with parallel fields is 16 bytes too long for a non-parallel decoder
    with pytest.raises(ProtocolError, match=r"Stream Abort.*16 trailing byte\(s\)"):
        decoder(4).decode(pg.stream_abort(900, 900, LSN, TS))
    with pytest.raises(ProtocolError, match=r"Stream Abort.*truncated"):
        decoder(4, parallel=True).decode(pg.stream_abort(900, 900))


def test_nested_stream_start_is_a_protocol_error() -> None:
    d = decoder(2)
    d.decode(pg.stream_start(900, True))
    with pytest.raises(ProtocolError, match="Stream Start arrived inside a stream block"):
        d.decode(pg.stream_start(901, True))


def test_stream_stop_outside_a_block_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="Stream Stop arrived outside a stream block"):
        decoder(2).decode(pg.stream_stop())


@pytest.mark.parametrize(
    "raw",
    [
        pg.stream_commit(900, LSN, LSN + 8, TS),
        pg.stream_abort(900, 900),
        pg._prepare_like(b"p", 0, LSN, LSN + 8, TS, 900, "gid"),
    ],
    ids=["commit", "abort", "prepare"],
)
def test_stream_end_messages_inside_a_block_are_protocol_errors(raw: bytes) -> None:
    d = decoder(3)
    d.decode(pg.stream_start(900, True))
    with pytest.raises(ProtocolError, match="inside a stream block"):
        d.decode(raw)


# --- two-phase commit (v3+) ---


def test_two_phase_messages() -> None:
    d = decoder(3)
    assert d.decode(pg.begin_prepare(LSN, LSN + 8, TS, 77, "tx-1")) == BeginPrepare(
        LSN, LSN + 8, TS, 77, "tx-1"
    )
    assert d.decode(pg._prepare_like(b"P", 0, LSN, LSN + 8, TS, 77, "tx-1")) == Prepare(
        0, LSN, LSN + 8, TS, 77, "tx-1"
    )
    assert d.decode(pg._prepare_like(b"K", 0, LSN + 16, LSN + 24, TS, 77, "tx-1")) == (
        CommitPrepared(0, LSN + 16, LSN + 24, TS, 77, "tx-1")
    )
    assert d.decode(pg.rollback_prepared(LSN + 8, LSN + 32, TS, TS + 5, 78, "tx-2")) == (
        RollbackPrepared(0, LSN + 8, LSN + 32, TS, TS + 5, 78, "tx-2")
    )
    assert d.decode(pg._prepare_like(b"p", 0, LSN, LSN + 8, TS, 79, "tx-3")) == StreamPrepare(
        0, LSN, LSN + 8, TS, 79, "tx-3"
    )


# --- protocol versions ---


@pytest.mark.parametrize(
    ("raw", "since"),
    [
        (pg.stream_start(1, True), 2),
        (pg.stream_commit(1, LSN, LSN, TS), 2),
        (pg.stream_abort(1, 1), 2),
        (pg.begin_prepare(LSN, LSN, TS, 1, "g"), 3),
        (pg._prepare_like(b"P", 0, LSN, LSN, TS, 1, "g"), 3),
        (pg.rollback_prepared(LSN, LSN, TS, TS, 1, "g"), 3),
    ],
)
def test_messages_newer_than_the_negotiated_version_are_rejected(raw: bytes, since: int) -> None:
    with pytest.raises(ProtocolError, match=f"needs protocol version {since} or later"):
        decoder(since - 1).decode(raw)
    decoder(since).decode(raw)  # and accepted from that version on


def test_decoder_rejects_unsupported_configurations() -> None:
    with pytest.raises(ConfigError, match="proto_version 5"):
        PgOutputDecoder(5)
    with pytest.raises(ConfigError, match="parallel streaming needs pgoutput proto_version 4"):
        PgOutputDecoder(3, parallel_streaming=True)


# --- malformed input: errors name the message and the byte ---


def test_unknown_message_type_names_the_byte() -> None:
    with pytest.raises(ProtocolError, match=r"unknown pgoutput message type b'Z' \(0x5a\)"):
        decoder().decode(b"Z\x00\x00")


def test_empty_payload() -> None:
    with pytest.raises(ProtocolError, match="empty pgoutput message"):
        decoder().decode(b"")


def test_unknown_tuple_kind_names_the_column_and_position() -> None:
    raw = b"I" + struct.pack(">I", OID) + b"N" + struct.pack(">H", 2) + b"n" + b"x"
    with pytest.raises(ProtocolError, match=r"Insert.*column 1 has unknown.*b'x' at byte 9"):
        decoder().decode(raw)


def test_text_value_longer_than_the_message_is_reported_where_it_starts() -> None:
    raw = pg.insert(OID, [b"ok", b"abcdef"])[:-2]
    with pytest.raises(ProtocolError, match=r"Insert.*column 1 value of 6 bytes runs past.* 15 "):
        decoder().decode(raw)


def test_trailing_bytes_after_a_tuple_are_rejected() -> None:
    with pytest.raises(ProtocolError, match=r"Insert.*3 trailing byte\(s\).*at byte 14"):
        decoder().decode(pg.insert(OID, [b"1"]) + b"xyz")
    with pytest.raises(ProtocolError, match=r"Update.*1 trailing"):
        decoder().decode(pg.update(OID, [b"1"]) + b"x")


def test_truncated_fixed_size_message() -> None:
    with pytest.raises(ProtocolError, match=r"Begin.*truncated.*21 bytes.*at byte 20"):
        decoder().decode(pg.begin(LSN, TS, 1)[:-1])


def test_string_without_terminator_or_not_utf8() -> None:
    with pytest.raises(ProtocolError, match=r"Origin.*origin name has no NUL terminator"):
        decoder().decode(pg.origin(LSN, "x")[:-1])
    with pytest.raises(ProtocolError, match=r"Type.*namespace is not valid UTF-8 at byte 6"):
        decoder().decode(b"Y" + struct.pack(">I", 1) + b"a\xffb\x00t\x00")


def test_truncate_whose_count_exceeds_the_oids_sent() -> None:
    raw = b"T" + struct.pack(">IB", 3, 0) + struct.pack(">II", 1, 2)
    with pytest.raises(ProtocolError, match=r"Truncate.*truncated"):
        decoder().decode(raw)


def test_update_missing_the_new_tuple() -> None:
    raw = b"U" + struct.pack(">I", OID) + b"K" + pg.tuple_data([b"1"])
    with pytest.raises(ProtocolError, match=r"Update.*message ends before 'N'"):
        decoder().decode(raw)


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.just(UNCHANGED_TOAST),
            st.binary(max_size=40),
            st.builds(BinaryDatum, st.binary(max_size=10)),
        ),
        max_size=12,
    ),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
def test_any_row_round_trips_through_insert_update_and_delete(
    values: list[object], xid: int | None
) -> None:
    # Given any row, encoded as pgoutput would (inside a stream block when xid is set)
    d = decoder(2)
    if xid is not None:
        d.decode(pg.stream_start(xid, True))
    row: TupleData = tuple(values)  # type: ignore[arg-type]
    # Then every change message decodes back to the same values
    assert d.decode(pg.insert(OID, values, xid)) == Insert(OID, row, xid)
    assert d.decode(pg.update(OID, values, values, "O", xid)) == Update(OID, row, "O", row, xid)
    assert d.decode(pg.delete(OID, values, "K", xid)) == Delete(OID, row, "K", xid)


# --- relation cache ---


def test_relation_cache_keeps_the_latest_relation_per_oid() -> None:
    # Given a decoded stream that describes a table, then alters it (DDL)
    d, cache = decoder(1), RelationCache()
    before = d.decode(pg.relation(OID, "public", "t", [("id", 23, -1, True)]))
    after = d.decode(pg.relation(OID, "public", "t", [("id", 23, -1, True), ("x", 25, -1, False)]))
    assert isinstance(before, Relation)
    assert isinstance(after, Relation)
    # When both Relation messages are recorded in order
    cache.update(before)
    assert cache.get(OID) is before
    cache.update(after)
    # Then changes are interpreted with the newest layout
    assert cache.get(OID) is after
    assert OID in cache
    assert len(cache) == 1


def test_relation_cache_refuses_a_change_before_its_relation() -> None:
    cache = RelationCache()
    assert 16385 not in cache
    with pytest.raises(ProtocolError, match="relation oid 16385 arrived before its Relation"):
        cache.get(16385)
