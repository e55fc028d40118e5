"""Typed pgoutput messages (logical replication protocol versions 1-4).

These are the values the sans-IO decoder produces and the collector consumes.
LSNs are plain ``int`` (see ``tidemark.lsn`` for formatting); timestamps are
integer microseconds since 2000-01-01 UTC, exactly as sent, so nothing is lost
and no clock conversion happens on the hot path.

Tuple data keeps each column's value as Postgres sent it:

* ``None`` for SQL NULL (``n``);
* ``UNCHANGED_TOAST`` for an unchanged TOASTed value that was not sent (``u``);
* ``bytes`` holding the text representation (``t``), not decoded: Arrow casts
  whole columns later, and predicates parse only the columns they read;
* ``BinaryDatum`` wrapping the type's binary send format (``b``, only when the
  ``binary`` option is on, which tidemark does not request).

``xid`` on change messages is set only inside a streamed transaction (v2+).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal


class _UnchangedToast:
    """Singleton marker for an unchanged TOAST value (tuple kind ``u``)."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()


@dataclass(frozen=True, slots=True)
class BinaryDatum:
    """A value in its type's binary send format (tuple kind ``b``)."""

    data: bytes


Value = bytes | None | _UnchangedToast | BinaryDatum
TupleData = tuple[Value, ...]

ReplicaIdentity = Literal["d", "n", "f", "i"]  # default, nothing, full, index


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool  # part of the replica identity (flag bit 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """``R``: describes a table before its first change and after every DDL."""

    oid: int
    namespace: str  # "" means pg_catalog, as the protocol says
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace or 'pg_catalog'}.{self.name}"


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """``Y``: a non-builtin data type used by a following Relation."""

    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # commit LSN of the transaction
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """``U``. ``old_kind`` is ``"K"`` (key columns only), ``"O"`` (whole old row,
    REPLICA IDENTITY FULL) or ``None`` (no old tuple: the key did not change)."""

    relation_oid: int
    old: TupleData | None
    old_kind: Literal["K", "O"] | None
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: TupleData
    old_kind: Literal["K", "O"]
    xid: int | None = None


TRUNCATE_CASCADE: Final = 1
TRUNCATE_RESTART_IDENTITY: Final = 2


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    options: int  # bit 1 CASCADE, bit 2 RESTART IDENTITY
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """``M``: a ``pg_logical_emit_message`` payload."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


# --- streaming of in-progress transactions (protocol v2+) ---


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``A``. ``abort_lsn``/``abort_ts`` only with protocol v4 and parallel streaming."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_ts: int | None = None


# --- two-phase commit (protocol v3+) ---


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


Change = Insert | Update | Delete | Truncate

Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
