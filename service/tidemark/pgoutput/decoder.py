"""Sans-IO decoder for pgoutput messages, logical replication protocol versions 1-4.

``PgOutputDecoder.decode(payload)`` turns the payload of one XLogData frame (see
``framing.py``) into one typed message from ``messages.py``. It never touches a socket.

Promises:

* Every message type of protocol versions 1-4 is decoded; a type that needs a later
  version than the decoder was created for is rejected, because the server only
  sends it when the matching option was requested.
* On bad input (unknown type byte, truncated or over-long message, unknown tuple kind,
  string without NUL terminator or not UTF-8, unknown replica identity) the only
  exception that escapes is ``ProtocolError``; its message names the message type and
  the byte position inside the payload.
* Tuple values are slices of the payload (``bytes``), never decoded to ``str``.

State: the only state is the one the protocol has. Between Stream Start and Stream
Stop, Relation, Type, Insert, Update, Delete, Truncate and Message carry a leading
xid; outside they do not. The decoder keeps two dispatch tables (outside / inside a
stream block) and switches between them on ``S`` and ``E``; a nested Stream Start,
a Stream Stop outside a block, or Stream Commit/Abort/Prepare inside a block is a
``ProtocolError`` because guessing would misread every following change. Create one
decoder per replication connection (the consumer does, on each ``StreamStarted``).

Speed: Insert, Update and Delete are the hot path. They use precompiled
``struct.Struct.unpack_from`` readers, an inline loop over the tuple columns, and
build the frozen message objects without going through the dataclass ``__init__``
(which costs three ``object.__setattr__`` calls per message); ``bench/decode_bench.py``
measures the effect. Where ``tidemark._fastpath`` was built (``fastpath.py``), their
tuple data is read by compiled code instead, into the same objects; the Python readers
stay the reference and explain every malformed message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import ModuleType
from typing import Final, Literal

from tidemark.errors import ConfigError, ProtocolError
from tidemark.pgoutput.fastpath import FAST, PATH
from tidemark.pgoutput.messages import (
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
    Prepare,
    Relation,
    RelationColumn,
    ReplicaIdentity,
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
    Value,
)

__all__ = ["MESSAGE_NAMES", "PgOutputDecoder"]

Handler = Callable[[bytes], Message]

#: Message type byte -> protocol name, for error messages and logs.
MESSAGE_NAMES: Final[dict[int, str]] = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}

_U16: Final = struct.Struct(">H")
_U16_AT: Final = _U16.unpack_from
_U32: Final = struct.Struct(">I")
_U32_AT: Final = _U32.unpack_from
_Q: Final = struct.Struct(">Q")
_OID_TAG: Final = struct.Struct(">IB")
_OID_TAG_AT: Final = _OID_TAG.unpack_from
_INSERT_HEAD_AT: Final = struct.Struct(">IBH").unpack_from  # oid, 'N', column count
_BEGIN: Final = struct.Struct(">QqI")  # final_lsn, commit_ts, xid
_COMMIT: Final = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, commit_ts
_RELATION_COLUMN_TAIL: Final = struct.Struct(">Ii")  # type oid, type modifier
_TRUNCATE_HEAD: Final = struct.Struct(">IB")  # number of relations, options
_MESSAGE_HEAD: Final = struct.Struct(">BQ")  # flags, lsn
_STREAM_START: Final = struct.Struct(">IB")  # xid, first segment
_STREAM_COMMIT: Final = struct.Struct(">IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_ts
_STREAM_ABORT: Final = struct.Struct(">II")  # xid, subxid
_STREAM_ABORT_PARALLEL: Final = struct.Struct(">IIQq")  # + abort_lsn, abort_ts
_BEGIN_PREPARE: Final = struct.Struct(">QQqI")  # prepare_lsn, end_lsn, prepare_ts, xid
_PREPARE: Final = struct.Struct(">BQQqI")  # flags, lsn, end_lsn, ts, xid (P, K, p)
_ROLLBACK_PREPARED: Final = struct.Struct(">BQQqqI")  # flags, 2 lsns, 2 ts, xid

_KIND_TEXT: Final = ord("t")
_KIND_NULL: Final = ord("n")
_KIND_UNCHANGED: Final = ord("u")
_KIND_BINARY: Final = ord("b")
_TAG_NEW: Final = ord("N")
_TAG_KEY: Final = ord("K")
_TAG_OLD: Final = ord("O")
_REPLICA_IDENTITIES: Final = frozenset(b"dnfi")


# Building Insert/Update/Delete through object.__new__ and the slot descriptors gives
# the same frozen objects as the dataclass __init__ at about half the cost (the
# generated __init__ of a frozen dataclass calls object.__setattr__ once per field).
def _slot_setter(cls: type, field: str) -> Callable[[object, object], None]:
    setter: Callable[[object, object], None] = vars(cls)[field].__set__
    return setter


_new_object: Final = object.__new__
_set_insert_oid: Final = _slot_setter(Insert, "relation_oid")
_set_insert_new: Final = _slot_setter(Insert, "new")
_set_insert_xid: Final = _slot_setter(Insert, "xid")


def _malformed(buf: bytes, pos: int, what: str) -> ProtocolError:
    tag = buf[0]
    name = MESSAGE_NAMES.get(tag, "unknown")
    return ProtocolError(
        f"malformed pgoutput {name} message ({bytes([tag])!r}): {what} at byte {pos} "
        f"of a {len(buf)}-byte message; the stream does not follow the protocol version "
        "and options given to START_REPLICATION (check proto_version and streaming)"
    )


def _truncated(buf: bytes, pos: int, field: str) -> ProtocolError:
    return _malformed(buf, pos, f"message ends before {field}")


def _expect_end(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        if pos > len(buf):
            raise _malformed(buf, len(buf), "message is truncated")
        raise _malformed(buf, pos, f"{len(buf) - pos} trailing byte(s) after the message")


def _expect_length(buf: bytes, size: int) -> None:
    if len(buf) != size:
        if len(buf) < size:
            raise _malformed(
                buf, len(buf), f"message is truncated (a complete one has {size} bytes)"
            )
        raise _malformed(buf, size, f"{len(buf) - size} trailing byte(s) after the message")


def _cstring(buf: bytes, pos: int, field: str) -> tuple[str, int]:
    """Read a NUL-terminated UTF-8 string at ``pos``; return it and the position after."""
    end = buf.find(0, pos)
    if end < 0:
        raise _malformed(buf, pos, f"{field} has no NUL terminator")
    try:
        text = buf[pos:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(buf, pos + exc.start, f"{field} is not valid UTF-8") from None
    return text, end + 1


def _read_xid(buf: bytes) -> int:
    try:
        xid: int = _U32_AT(buf, 1)[0]
    except struct.error:
        raise _truncated(buf, 1, "the streamed transaction's xid") from None
    return xid


# --- tuple data: the hot path ---
#
# The fast readers below check nothing per value: a length running past the end leaves
# ``pos`` beyond the message, which is caught once at the end (positions only grow,
# because lengths are read unsigned), and a read past the end raises IndexError or
# struct.error. On any failure they hand the message to ``_tuple_error``, a slow reader
# that checks every step and names the exact byte.


def _tuple_error(buf: bytes, pos: int) -> ProtocolError:
    """Explain why the TupleData at ``pos`` (or what follows it) is malformed."""
    size = len(buf)
    if pos + 2 > size:
        return _truncated(buf, pos, "the tuple's column count")
    (ncols,) = _U16.unpack_from(buf, pos)
    pos += 2
    for column in range(ncols):
        if pos >= size:
            return _truncated(buf, pos, f"column {column} of {ncols}")
        kind = buf[pos]
        if kind in (_KIND_NULL, _KIND_UNCHANGED):
            pos += 1
        elif kind in (_KIND_TEXT, _KIND_BINARY):
            if pos + 5 > size:
                return _truncated(buf, pos + 1, f"the length of column {column}")
            length = _U32_AT(buf, pos + 1)[0]
            if pos + 5 + length > size:
                return _malformed(
                    buf, pos, f"column {column} value of {length} bytes runs past the end"
                )
            pos += 5 + length
        else:
            return _malformed(
                buf, pos, f"column {column} has unknown tuple data kind {bytes([kind])!r}"
            )
    if pos < size:
        return _malformed(buf, pos, f"{size - pos} trailing byte(s) after the tuple data")
    return _truncated(buf, pos, "the rest of the message")


def _read_tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """Read TupleData (Int16 column count, then one value per column) at ``pos``.

    Returns the values and the position after them, which may lie beyond the end of
    ``buf`` if a length was corrupt: the caller checks it (see ``_expect_end``).
    """
    start = pos
    try:
        ncols = _U16_AT(buf, pos)[0]
        pos += 2
        values: list[Value] = [None] * ncols
        for column in range(ncols):
            kind = buf[pos]
            if kind == 116:  # 't'
                value_start = pos + 5
                pos = value_start + _U32_AT(buf, pos + 1)[0]
                values[column] = buf[value_start:pos]
            elif kind == 110:  # 'n': None is already in place
                pos += 1
            elif kind == 117:  # 'u'
                values[column] = UNCHANGED_TOAST
                pos += 1
            elif kind == 98:  # 'b'
                value_start = pos + 5
                pos = value_start + _U32_AT(buf, pos + 1)[0]
                values[column] = BinaryDatum(buf[value_start:pos])
            else:
                raise _tuple_error(buf, start)
    except (IndexError, struct.error):
        raise _tuple_error(buf, start) from None
    if pos > len(buf):
        raise _tuple_error(buf, start)
    return tuple(values), pos


def _insert(buf: bytes, pos: int = 1, xid: int | None = None) -> Insert:
    # The tuple loop is _read_tuple inlined: the call and its (values, pos) result cost
    # about 10% of an Insert (~150 ns here), and Insert is the most frequent message.
    try:
        oid, tag, ncols = _INSERT_HEAD_AT(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the relation oid, 'N' and the column count") from None
    if tag != 78:  # 'N'
        raise _malformed(buf, pos + 4, f"expected 'N' before the new tuple, got {bytes([tag])!r}")
    pos += 5
    start = pos
    pos += 2
    values: list[Value] = [None] * ncols
    try:
        for column in range(ncols):
            kind = buf[pos]
            if kind == 116:  # 't'
                value_start = pos + 5
                pos = value_start + _U32_AT(buf, pos + 1)[0]
                values[column] = buf[value_start:pos]
            elif kind == 110:  # 'n': None is already in place
                pos += 1
            elif kind == 117:  # 'u'
                values[column] = UNCHANGED_TOAST
                pos += 1
            elif kind == 98:  # 'b'
                value_start = pos + 5
                pos = value_start + _U32_AT(buf, pos + 1)[0]
                values[column] = BinaryDatum(buf[value_start:pos])
            else:
                raise _tuple_error(buf, start)
    except (IndexError, struct.error):
        raise _tuple_error(buf, start) from None
    if pos != len(buf):
        raise _tuple_error(buf, start)
    message: Insert = _new_object(Insert)
    _set_insert_oid(message, oid)
    _set_insert_new(message, tuple(values))
    _set_insert_xid(message, xid)
    return message


def _update(buf: bytes, pos: int = 1, xid: int | None = None) -> Update:
    try:
        oid, tag = _OID_TAG_AT(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the relation oid and the tuple tag") from None
    old: TupleData | None = None
    old_kind: Literal["K", "O"] | None = None
    pos += 5
    if tag in (_TAG_KEY, _TAG_OLD):
        old_kind = "K" if tag == _TAG_KEY else "O"
        old, pos = _read_tuple(buf, pos)
        if pos >= len(buf):
            raise _truncated(buf, pos, "'N' and the new tuple")
        tag = buf[pos]
        pos += 1
    if tag != _TAG_NEW:
        raise _malformed(
            buf, pos - 1, f"expected 'K', 'O' or 'N' before a tuple, got {bytes([tag])!r}"
        )
    new, pos = _read_tuple(buf, pos)
    _expect_end(buf, pos)
    return Update(oid, old, old_kind, new, xid)


def _delete(buf: bytes, pos: int = 1, xid: int | None = None) -> Delete:
    try:
        oid, tag = _OID_TAG_AT(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the relation oid and the tuple tag") from None
    if tag == _TAG_KEY:
        old_kind: Literal["K", "O"] = "K"
    elif tag == _TAG_OLD:
        old_kind = "O"
    else:
        raise _malformed(
            buf, pos + 4, f"expected 'K' or 'O' before the old tuple, got {bytes([tag])!r}"
        )
    old, end = _read_tuple(buf, pos + 5)
    _expect_end(buf, end)
    return Delete(oid, old, old_kind, xid)


# The compiled readers (``FAST``) return the fields of the same three
# messages; on anything unexpected they raise, and the reference reader above runs on
# the same bytes to raise the precise ProtocolError (or, should it accept what the
# compiled one refused, to return the message: the reference decides).
_set_update_fields: Final = [
    _slot_setter(Update, name) for name in ("relation_oid", "old", "old_kind", "new", "xid")
]
_set_delete_fields: Final = [
    _slot_setter(Delete, name) for name in ("relation_oid", "old", "old_kind", "xid")
]


def _compiled_readers(fast: ModuleType) -> dict[int, Callable[..., Message]]:
    insert_parts, update_parts, delete_parts = (
        fast.insert_parts,
        fast.update_parts,
        fast.delete_parts,
    )
    set_oid, set_old, set_old_kind, set_new, set_xid = _set_update_fields
    del_oid, del_old, del_old_kind, del_xid = _set_delete_fields

    def insert(buf: bytes, pos: int = 1, xid: int | None = None) -> Insert:
        try:
            oid, new = insert_parts(buf, pos)
        except (ValueError, TypeError):
            return _insert(buf, pos, xid)
        message: Insert = _new_object(Insert)
        _set_insert_oid(message, oid)
        _set_insert_new(message, new)
        _set_insert_xid(message, xid)
        return message

    def update(buf: bytes, pos: int = 1, xid: int | None = None) -> Update:
        try:
            oid, old, old_kind, new = update_parts(buf, pos)
        except (ValueError, TypeError):
            return _update(buf, pos, xid)
        message: Update = _new_object(Update)
        set_oid(message, oid)
        set_old(message, old)
        set_old_kind(message, old_kind)
        set_new(message, new)
        set_xid(message, xid)
        return message

    def delete(buf: bytes, pos: int = 1, xid: int | None = None) -> Delete:
        try:
            oid, old, old_kind = delete_parts(buf, pos)
        except (ValueError, TypeError):
            return _delete(buf, pos, xid)
        message: Delete = _new_object(Delete)
        del_oid(message, oid)
        del_old(message, old)
        del_old_kind(message, old_kind)
        del_xid(message, xid)
        return message

    return {ord("I"): insert, ord("U"): update, ord("D"): delete}


# --- schema messages ---


def _relation(buf: bytes, pos: int = 1, xid: int | None = None) -> Relation:
    try:
        (oid,) = _U32.unpack_from(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the relation oid") from None
    namespace, pos = _cstring(buf, pos + 4, "namespace")
    name, pos = _cstring(buf, pos, "relation name")
    if pos + 3 > len(buf):
        raise _truncated(buf, pos, "replica identity and column count")
    identity = buf[pos]
    if identity not in _REPLICA_IDENTITIES:
        raise _malformed(
            buf, pos, f"unknown replica identity {bytes([identity])!r} (expected d, n, f or i)"
        )
    (ncols,) = _U16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for index in range(ncols):
        if pos >= len(buf):
            raise _truncated(buf, pos, f"column {index} of {ncols}")
        flags = buf[pos]
        column_name, pos = _cstring(buf, pos + 1, f"column {index} name")
        try:
            type_oid, type_modifier = _RELATION_COLUMN_TAIL.unpack_from(buf, pos)
        except struct.error:
            raise _truncated(buf, pos, f"column {index} type oid and modifier") from None
        pos += 8
        columns.append(RelationColumn(column_name, type_oid, type_modifier, bool(flags & 1)))
    _expect_end(buf, pos)
    replica_identity: ReplicaIdentity = chr(identity)  # type: ignore[assignment]
    return Relation(oid, namespace, name, replica_identity, tuple(columns), xid)


def _type_info(buf: bytes, pos: int = 1, xid: int | None = None) -> TypeInfo:
    try:
        (oid,) = _U32.unpack_from(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the type oid") from None
    namespace, pos = _cstring(buf, pos + 4, "namespace")
    name, pos = _cstring(buf, pos, "type name")
    _expect_end(buf, pos)
    return TypeInfo(oid, namespace, name, xid)


def _truncate(buf: bytes, pos: int = 1, xid: int | None = None) -> Truncate:
    try:
        count, options = _TRUNCATE_HEAD.unpack_from(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the relation count and options") from None
    pos += 5
    _expect_length(buf, pos + 4 * count)
    oids = struct.unpack_from(f">{count}I", buf, pos)
    return Truncate(oids, options, xid)


def _logical_message(buf: bytes, pos: int = 1, xid: int | None = None) -> LogicalMessage:
    try:
        flags, lsn = _MESSAGE_HEAD.unpack_from(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "flags and LSN") from None
    prefix, pos = _cstring(buf, pos + 9, "prefix")
    try:
        (length,) = _U32.unpack_from(buf, pos)
    except struct.error:
        raise _truncated(buf, pos, "the content length") from None
    pos += 4
    _expect_length(buf, pos + length)
    return LogicalMessage(bool(flags & 1), lsn, prefix, buf[pos:], xid)


# --- transaction boundaries ---


def _begin(buf: bytes) -> Begin:
    _expect_length(buf, 1 + _BEGIN.size)
    return Begin(*_BEGIN.unpack_from(buf, 1))


def _commit(buf: bytes) -> Commit:
    _expect_length(buf, 1 + _COMMIT.size)
    return Commit(*_COMMIT.unpack_from(buf, 1))


def _origin(buf: bytes) -> Origin:
    try:
        (commit_lsn,) = _Q.unpack_from(buf, 1)
    except struct.error:
        raise _truncated(buf, 1, "the commit LSN") from None
    name, pos = _cstring(buf, 9, "origin name")
    _expect_end(buf, pos)
    return Origin(commit_lsn, name)


def _begin_prepare(buf: bytes) -> BeginPrepare:
    try:
        prepare_lsn, end_lsn, prepare_ts, xid = _BEGIN_PREPARE.unpack_from(buf, 1)
    except struct.error:
        raise _truncated(buf, 1, "LSNs, timestamp and xid") from None
    gid, pos = _cstring(buf, 1 + _BEGIN_PREPARE.size, "gid")
    _expect_end(buf, pos)
    return BeginPrepare(prepare_lsn, end_lsn, prepare_ts, xid, gid)


def _prepare_fields(buf: bytes) -> tuple[tuple[int, int, int, int, int], str]:
    """Flags, LSN, end LSN, timestamp, xid, gid: the layout of P, K and p."""
    try:
        fields = _PREPARE.unpack_from(buf, 1)
    except struct.error:
        raise _truncated(buf, 1, "flags, LSNs, timestamp and xid") from None
    gid, pos = _cstring(buf, 1 + _PREPARE.size, "gid")
    _expect_end(buf, pos)
    return fields, gid


def _prepare(buf: bytes) -> Prepare:
    fields, gid = _prepare_fields(buf)
    return Prepare(*fields, gid)


def _commit_prepared(buf: bytes) -> CommitPrepared:
    fields, gid = _prepare_fields(buf)
    return CommitPrepared(*fields, gid)


def _stream_prepare(buf: bytes) -> StreamPrepare:
    fields, gid = _prepare_fields(buf)
    return StreamPrepare(*fields, gid)


def _rollback_prepared(buf: bytes) -> RollbackPrepared:
    try:
        flags, prepare_end, rollback_end, prepare_ts, rollback_ts, xid = (
            _ROLLBACK_PREPARED.unpack_from(buf, 1)
        )
    except struct.error:
        raise _truncated(buf, 1, "flags, LSNs, timestamps and xid") from None
    gid, pos = _cstring(buf, 1 + _ROLLBACK_PREPARED.size, "gid")
    _expect_end(buf, pos)
    return RollbackPrepared(flags, prepare_end, rollback_end, prepare_ts, rollback_ts, xid, gid)


def _stream_commit(buf: bytes) -> StreamCommit:
    _expect_length(buf, 1 + _STREAM_COMMIT.size)
    return StreamCommit(*_STREAM_COMMIT.unpack_from(buf, 1))


def _stream_abort(buf: bytes) -> StreamAbort:
    _expect_length(buf, 1 + _STREAM_ABORT.size)
    return StreamAbort(*_STREAM_ABORT.unpack_from(buf, 1))


def _stream_abort_parallel(buf: bytes) -> StreamAbort:
    _expect_length(buf, 1 + _STREAM_ABORT_PARALLEL.size)
    return StreamAbort(*_STREAM_ABORT_PARALLEL.unpack_from(buf, 1))


# Messages that carry a leading xid inside a stream block, and the first protocol
# version of every message type.
_XID_IN_STREAM: Final = frozenset(b"RYIUDTM")
_SINCE_VERSION: Final[dict[int, int]] = {
    **{tag: 1 for tag in b"BCORYIUDTM"},
    **{tag: 2 for tag in b"SEcA"},
    **{tag: 3 for tag in b"bPKrp"},
}


def _with_xid(handler: Callable[[bytes, int, int | None], Message]) -> Handler:
    def decode_streamed(buf: bytes) -> Message:
        return handler(buf, 5, _read_xid(buf))

    return decode_streamed


class PgOutputDecoder:
    """Decodes pgoutput message payloads of one replication connection, in order."""

    __slots__ = (
        "_inside",
        "_outside",
        "_table",
        "compiled",
        "parallel_streaming",
        "proto_version",
    )

    def __init__(
        self, proto_version: int, parallel_streaming: bool = False, compiled: bool | None = None
    ) -> None:
        """``compiled``: read changes with the compiled module (True: it must be built),
        with the pure-Python reference (False), or with whichever is available (None)."""
        if proto_version not in (1, 2, 3, 4):
            raise ConfigError(
                f"pgoutput proto_version {proto_version!r} is not supported: use 1, 2, 3 or 4"
            )
        if parallel_streaming and proto_version < 4:
            raise ConfigError(
                f"parallel streaming needs pgoutput proto_version 4, got {proto_version}: "
                "raise proto_version or use streaming 'on'"
            )
        if compiled and FAST is None:
            raise ConfigError(f"the compiled per-change path is not available: {PATH}")
        self.proto_version = proto_version
        self.parallel_streaming = parallel_streaming
        self.compiled = FAST is not None if compiled is None else compiled
        self._outside = self._build_table(in_stream=False)
        self._inside = self._build_table(in_stream=True)
        self._table = self._outside

    @property
    def in_stream(self) -> bool:
        """True between Stream Start and Stream Stop."""
        return self._table is self._inside

    def decode(self, payload: bytes) -> Message:
        """Decode one pgoutput message; raise ``ProtocolError`` if it is malformed."""
        try:
            handler = self._table[payload[0]]
        except IndexError:
            raise ProtocolError(
                "empty pgoutput message: an XLogData frame carried no payload; "
                "the walsender stream is corrupt"
            ) from None
        return handler(payload)

    # --- stream block state ---

    def _stream_start(self, buf: bytes) -> StreamStart:
        _expect_length(buf, 1 + _STREAM_START.size)
        xid, first = _STREAM_START.unpack_from(buf, 1)
        self._table = self._inside
        return StreamStart(xid, first != 0)

    def _stream_stop(self, buf: bytes) -> StreamStop:
        _expect_length(buf, 1)
        self._table = self._outside
        return StreamStop()

    def _build_table(self, *, in_stream: bool) -> list[Handler]:
        handlers: dict[int, Handler] = {
            ord("B"): _begin,
            ord("C"): _commit,
            ord("O"): _origin,
            ord("R"): _relation,
            ord("Y"): _type_info,
            ord("I"): _insert,
            ord("U"): _update,
            ord("D"): _delete,
            ord("T"): _truncate,
            ord("M"): _logical_message,
            ord("S"): self._stream_start,
            ord("E"): self._stream_stop,
            ord("c"): _stream_commit,
            ord("A"): _stream_abort_parallel if self.parallel_streaming else _stream_abort,
            ord("b"): _begin_prepare,
            ord("P"): _prepare,
            ord("K"): _commit_prepared,
            ord("r"): _rollback_prepared,
            ord("p"): _stream_prepare,
        }
        if self.compiled:
            assert FAST is not None
            handlers.update(_compiled_readers(FAST))
        if in_stream:
            for tag in _XID_IN_STREAM:
                handlers[tag] = _with_xid(handlers[tag])  # type: ignore[arg-type]
            for tag in b"ScAp":
                handlers[tag] = _misplaced(tag, "inside a stream block (before Stream Stop)")
        else:
            handlers[ord("E")] = _misplaced(ord("E"), "outside a stream block")
        table: list[Handler] = [_unknown] * 256
        for tag, handler in handlers.items():
            since = _SINCE_VERSION[tag]
            if since > self.proto_version:
                handler = _too_new(tag, since, self.proto_version)
            table[tag] = handler
        return table


def _unknown(buf: bytes) -> Message:
    raise ProtocolError(
        f"unknown pgoutput message type {bytes([buf[0]])!r} (0x{buf[0]:02x}) at byte 0 of a "
        f"{len(buf)}-byte message; the stream is not pgoutput protocol 1-4 or is corrupt"
    )


def _misplaced(tag: int, where: str) -> Handler:
    def reject(buf: bytes) -> Message:
        raise _malformed(buf, 0, f"{MESSAGE_NAMES[tag]} arrived {where}")

    return reject


def _too_new(tag: int, since: int, version: int) -> Handler:
    def reject(buf: bytes) -> Message:
        raise ProtocolError(
            f"pgoutput {MESSAGE_NAMES[tag]} message ({bytes([tag])!r}) at byte 0 needs "
            f"protocol version {since} or later, but the decoder was created for version "
            f"{version}; create PgOutputDecoder with the proto_version sent in "
            "START_REPLICATION"
        )

    return reject
