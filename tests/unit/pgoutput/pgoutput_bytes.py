"""Test-side builder of pgoutput and walsender byte strings.

Written straight from the protocol documentation with ``struct.pack`` and sharing no
code with ``tidemark.pgoutput``, so decoding what it builds is a real check.

* ``encode(message)`` turns any typed message from ``tidemark.pgoutput.messages`` into
  the bytes pgoutput would send. Messages whose ``xid`` is set are encoded with the
  leading xid they carry inside a stream block.
* ``insert``/``update``/``delete``/``tuple_data`` accept friendlier values: ``str`` is
  encoded as UTF-8 text, ``bytes`` is text already, ``None`` is NULL.
* ``xlogdata``/``keepalive`` wrap payloads in the walsender CopyData envelope.

Used by unit tests, fuzz tests and ``bench/decode_bench.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

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
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TypeInfo,
    Update,
)

ValueLike = bytes | str | None | BinaryDatum | object


def cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def tuple_data(values: Iterable[ValueLike]) -> bytes:
    values = list(values)
    out = [struct.pack(">H", len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, BinaryDatum):
            out.append(b"b" + struct.pack(">I", len(value.data)) + value.data)
        elif isinstance(value, str):
            raw = value.encode("utf-8")
            out.append(b"t" + struct.pack(">I", len(raw)) + raw)
        elif isinstance(value, bytes):
            out.append(b"t" + struct.pack(">I", len(value)) + value)
        else:
            raise TypeError(f"cannot encode tuple value {value!r}")
    return b"".join(out)


def begin(final_lsn: int, commit_ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, commit_ts, xid)


def commit(commit_lsn: int, end_lsn: int, commit_ts: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, commit_ts)


def relation(
    oid: int,
    namespace: str,
    name: str,
    columns: Sequence[RelationColumn | tuple[str, int, int, bool]],
    replica_identity: str = "d",
    xid: int | None = None,
) -> bytes:
    out = [b"R", _xid(xid), struct.pack(">I", oid), cstring(namespace), cstring(name)]
    out.append(replica_identity.encode("ascii") + struct.pack(">H", len(columns)))
    for column in columns:
        if isinstance(column, RelationColumn):
            column = (column.name, column.type_oid, column.type_modifier, column.is_key)
        col_name, type_oid, type_modifier, is_key = column
        out.append(bytes([1 if is_key else 0]) + cstring(col_name))
        out.append(struct.pack(">Ii", type_oid, type_modifier))
    return b"".join(out)


def type_info(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + _xid(xid) + struct.pack(">I", oid) + cstring(namespace) + cstring(name)


def insert(oid: int, new: Iterable[ValueLike], xid: int | None = None) -> bytes:
    return b"I" + _xid(xid) + struct.pack(">I", oid) + b"N" + tuple_data(new)


def update(
    oid: int,
    new: Iterable[ValueLike],
    old: Iterable[ValueLike] | None = None,
    old_kind: str | None = None,
    xid: int | None = None,
) -> bytes:
    out = b"U" + _xid(xid) + struct.pack(">I", oid)
    if old is not None:
        out += (old_kind or "K").encode("ascii") + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(
    oid: int, old: Iterable[ValueLike], old_kind: str = "K", xid: int | None = None
) -> bytes:
    return b"D" + _xid(xid) + struct.pack(">I", oid) + old_kind.encode("ascii") + tuple_data(old)


def truncate(oids: Sequence[int], options: int = 0, xid: int | None = None) -> bytes:
    head = b"T" + _xid(xid) + struct.pack(">IB", len(oids), options)
    return head + b"".join(struct.pack(">I", oid) for oid in oids)


def logical_message(
    prefix: str,
    content: bytes,
    lsn: int,
    transactional: bool = True,
    xid: int | None = None,
) -> bytes:
    head = b"M" + _xid(xid) + struct.pack(">BQ", 1 if transactional else 0, lsn)
    return head + cstring(prefix) + struct.pack(">I", len(content)) + content


def origin(commit_lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", commit_lsn) + cstring(name)


def stream_start(xid: int, first_segment: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, 1 if first_segment else 0)


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_ts: int, flags: int = 0) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, flags, commit_lsn, end_lsn, commit_ts)


def stream_abort(
    xid: int, subxid: int, abort_lsn: int | None = None, abort_ts: int | None = None
) -> bytes:
    out = b"A" + struct.pack(">II", xid, subxid)
    if abort_lsn is not None or abort_ts is not None:
        out += struct.pack(">Qq", abort_lsn or 0, abort_ts or 0)
    return out


def begin_prepare(prepare_lsn: int, end_lsn: int, prepare_ts: int, xid: int, gid: str) -> bytes:
    return b"b" + struct.pack(">QQqI", prepare_lsn, end_lsn, prepare_ts, xid) + cstring(gid)


def _prepare_like(
    tag: bytes, flags: int, lsn: int, end_lsn: int, ts: int, xid: int, gid: str
) -> bytes:
    return tag + struct.pack(">BQQqI", flags, lsn, end_lsn, ts, xid) + cstring(gid)


def rollback_prepared(
    prepare_end_lsn: int,
    rollback_end_lsn: int,
    prepare_ts: int,
    rollback_ts: int,
    xid: int,
    gid: str,
    flags: int = 0,
) -> bytes:
    fields = struct.pack(
        ">BQQqqI", flags, prepare_end_lsn, rollback_end_lsn, prepare_ts, rollback_ts, xid
    )
    return b"r" + fields + cstring(gid)


def encode(message: Message) -> bytes:
    """The pgoutput bytes of a typed message (inverse of ``PgOutputDecoder.decode``)."""
    match message:
        case Begin(final_lsn, commit_ts, xid):
            return begin(final_lsn, commit_ts, xid)
        case Commit(flags, commit_lsn, end_lsn, commit_ts):
            return commit(commit_lsn, end_lsn, commit_ts, flags)
        case Origin(commit_lsn, name):
            return origin(commit_lsn, name)
        case Relation(oid, namespace, name, identity, columns, xid):
            return relation(oid, namespace, name, columns, identity, xid)
        case TypeInfo(oid, namespace, name, xid):
            return type_info(oid, namespace, name, xid)
        case Insert(oid, new, xid):
            return insert(oid, new, xid)
        case Update(oid, old, old_kind, new, xid):
            return update(oid, new, old, old_kind, xid)
        case Delete(oid, old, old_kind, xid):
            return delete(oid, old, old_kind, xid)
        case Truncate(oids, options, xid):
            return truncate(oids, options, xid)
        case LogicalMessage(transactional, lsn, prefix, content, xid):
            return logical_message(prefix, content, lsn, transactional, xid)
        case StreamStart(xid, first_segment):
            return stream_start(xid, first_segment)
        case StreamStop():
            return stream_stop()
        case StreamCommit(xid, flags, commit_lsn, end_lsn, commit_ts):
            return stream_commit(xid, commit_lsn, end_lsn, commit_ts, flags)
        case StreamAbort(xid, subxid, abort_lsn, abort_ts):
            return stream_abort(xid, subxid, abort_lsn, abort_ts)
        case BeginPrepare(prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return begin_prepare(prepare_lsn, end_lsn, prepare_ts, xid, gid)
        case Prepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return _prepare_like(b"P", flags, prepare_lsn, end_lsn, prepare_ts, xid, gid)
        case CommitPrepared(flags, commit_lsn, end_lsn, commit_ts, xid, gid):
            return _prepare_like(b"K", flags, commit_lsn, end_lsn, commit_ts, xid, gid)
        case StreamPrepare(flags, prepare_lsn, end_lsn, prepare_ts, xid, gid):
            return _prepare_like(b"p", flags, prepare_lsn, end_lsn, prepare_ts, xid, gid)
        case RollbackPrepared(flags, prep_end, rb_end, prep_ts, rb_ts, xid, gid):
            return rollback_prepared(prep_end, rb_end, prep_ts, rb_ts, xid, gid, flags)
    raise TypeError(f"cannot encode {message!r}")


# --- walsender CopyData envelope ---


def xlogdata(wal_start: int, wal_end: int, send_time: int, payload: bytes) -> bytes:
    return b"w" + struct.pack(">QQq", wal_start, wal_end, send_time) + payload


def keepalive(wal_end: int, send_time: int, reply_requested: bool = False) -> bytes:
    return b"k" + struct.pack(">QqB", wal_end, send_time, 1 if reply_requested else 0)
