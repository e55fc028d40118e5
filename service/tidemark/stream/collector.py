"""ShapeLogCollector: decoded messages in, per-shape rows and tracker updates out.

The collector follows the stream one message at a time, so a transaction of any
size flows through in pieces (the consumer yields to backpressure between
fragments of at most ``fragment_changes`` changes):

* ``Relation``: domain-typed columns are read as their base types (as the catalog
  check did), the relation cache is updated and the shapes of that table are
  (re)bound to the new column layout (``ShapeIndex.update_relation``): added
  columns flow on (the writer's schema evolves), dropped ones become NULL, and a
  shape that cannot follow (a type change of a column it uses) is reported for
  resync: it stops being routed at once (as if removed: its part of an open
  transaction is dropped and the FlushTracker releases it), and the shape set
  decides what follows (its claim ends; a backfill rebuilds it).
* ``Begin``: a transaction at or below the last one fully seen is a replay after
  a reconnect and is skipped whole.
* ``Insert``/``Update``/``Delete``/``Truncate``: routed to shapes and converted
  (``tidemark.shapes.convert``); each row goes to its shape's writer, which starts
  its part of the transaction on the first row (a writer whose sink already holds
  the transaction declines: a replay after restart). Change ``i`` of a
  transaction writes rows with ``_op = 2*i`` (and ``2*i + 1`` for the insert half
  of a primary-key change), so ``(_lsn, _op)`` is unique in every shape.
  An insert, most of a stream, skips ``convert``'s per-shape items: each shape it
  routes to gets the projected row directly (``_insert``; property-tested against
  the general way).
  A shape with a snapshot fence (``tidemark.continuity.fence``) skips the
  transactions its snapshot already holds; a shape added while a transaction is
  open skips that one (it committed before the snapshot was taken).
* ``Commit``: the FlushTracker learns the transaction and the shapes it touched,
  *then* each touched writer ends its part (the order ``TxnAlignment`` requires).
  The xids of the last ``RECENT_COMMITS`` commits are remembered: a snapshot that
  does not see one of them was taken while that commit was streamed but not yet
  visible (a synchronous-standby wait), and must be taken again
  (``passed_invisible``).
* ``Origin``, ``Type``, ``Message``: recorded, never fatal.

Transactions Postgres streams before they commit (protocol ``streaming 'on'``:
those over ``logical_decoding_work_mem``) arrive in blocks between ``Stream Start``
and ``Stream Stop``, several open at once and interleaved with ordinary ones:

* their changes are routed and converted as they arrive, numbered per top-level
  transaction like any other, and go to each shape's writer under the xid
  (``stream_append``); the writer spools them when memory asks;
* ``Stream Abort`` of a subtransaction drops, in every shape, the rows from that
  subtransaction's first change on (the rule Postgres's own subscriber applies);
  of the top-level xid, the whole transaction;
* ``Stream Commit`` is where the transaction enters the FlushTracker, in commit
  order like a ``Commit``: shapes whose sink or snapshot has it already decline it
  then (its commit LSN was not known before);
* a reconnect drops every open streamed transaction: Postgres streams it again
  from its start;
* a shape's snapshot must not be taken while a streamed transaction that already
  sent changes of its table is in progress (``passed_invisible`` names it): the
  shape would get only the rest of it.

Two-phase transactions (``two_phase``) are not requested.

Pure: no IO, no clock, no logging; the service reacts to what it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidemark.continuity.fence import SnapshotFence
from tidemark.errors import ProtocolError
from tidemark.flush.tracker import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset, offset_of
from tidemark.pgoutput import messages as m
from tidemark.pgoutput.messages import Value
from tidemark.pgoutput.relations import RelationCache
from tidemark.shapes.convert import INSERT, convert, convert_truncate
from tidemark.shapes.model import BoundShape, ShapeResync, rebind, resolve_domains
from tidemark.shapes.routing import ShapeIndex

TableKey = tuple[str, str]  # (schema, table) as Postgres names them


class ShapeWriter(Protocol):
    """What the collector needs of a shape's writer (``tidemark.writers.writer`` has
    the service's): a transaction's rows in, in stream order, and streamed (protocol
    v2) transactions' rows kept per xid until they commit or abort."""

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> bool:
        """Start a transaction; False if the writer has it already (a replay)."""
        ...

    def append(
        self,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> None: ...

    def end_txn(self, txn_last_offset: LogOffset) -> None: ...

    def abort_txn(self) -> None: ...

    def stream_wants(self, lsn: int) -> bool: ...

    def stream_append(
        self,
        xid: int,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> None: ...

    def stream_drop(self, xid: int, lo: int, hi: int) -> None: ...

    def stream_discard(self, xid: int) -> None: ...

    def stream_commit(
        self, xid: int, lsn: int, commit_ts: int, txn_last_offset: LogOffset
    ) -> None: ...


RECENT_COMMITS = 1 << 17


@dataclass(slots=True)
class CollectorStats:
    transactions: int = 0
    transactions_skipped: int = 0  # replays after a reconnect
    changes: int = 0
    rows_routed: int = 0
    logical_messages: int = 0
    origins: int = 0
    types: int = 0
    relations: int = 0
    streamed_commits: int = 0
    streamed_aborts: int = 0
    subtransaction_aborts: int = 0
    resyncs: list[ShapeResync] = field(default_factory=list)


@dataclass(slots=True)
class _Txn:
    lsn: int
    xid: int
    commit_ts: int
    changes: int = 0
    touched: dict[str, ShapeWriter] = field(default_factory=dict)
    declined: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _StreamedTxn:
    """A transaction Postgres streams before its commit."""

    xid: int
    changes: int = 0
    first_change: dict[int, int] = field(default_factory=dict)  # subxid -> change index
    oids: set[int] = field(default_factory=set)  # tables it changed
    holders: dict[str, ShapeWriter] = field(default_factory=dict)

    def note_subxact(self, sub: int | None, change: int) -> None:
        """A change of subtransaction ``sub`` (the xid a streamed change carries) is
        change number ``change``: remember where each subtransaction began."""
        if sub is not None and sub != self.xid and sub not in self.first_change:
            self.first_change[sub] = change


def table_key_of(relation: m.Relation) -> TableKey:
    return (relation.namespace or "pg_catalog", relation.name)


class ShapeLogCollector:
    def __init__(
        self,
        tracker: FlushTracker,
        *,
        on_resync: Callable[[ShapeResync], None] | None = None,
        on_columns_changed: Callable[[BoundShape], None] | None = None,
    ) -> None:
        self.tracker = tracker
        self.relations = RelationCache()
        self.stats = CollectorStats()
        self._on_resync = on_resync
        self._on_columns_changed = on_columns_changed
        self._shapes: dict[str, tuple[TableKey, BoundShape]] = {}
        self._writers: dict[str, ShapeWriter] = {}
        self._indexes: dict[int, ShapeIndex] = {}  # by relation oid
        self._domains: dict[TableKey, Mapping[int, tuple[int, int]]] = {}
        self._fences: dict[str, SnapshotFence] = {}
        self._txn: _Txn | None = None
        self._streams: dict[int, _StreamedTxn] = {}
        self._block: _StreamedTxn | None = None  # between Stream Start and Stream Stop
        self._skipping = False
        self.last_commit_lsn: int | None = None
        self._recent_xids: deque[int] = deque(maxlen=RECENT_COMMITS)

    # -- shapes ----------------------------------------------------------------

    def add_shape(
        self,
        shape: BoundShape,
        writer: ShapeWriter,
        domain_bases: Mapping[int, tuple[int, int]] | None = None,
        fence: SnapshotFence | None = None,
    ) -> None:
        """Start routing to ``shape`` (bound against the catalog) through ``writer``.

        ``domain_bases`` (domain oid -> base type) is the catalog's, for this table;
        ``fence`` the shape's snapshot, whose transactions it must not apply again.
        """
        if fence is not None:
            self._fences[shape.name] = fence
        else:
            self._fences.pop(shape.name, None)
        if self._txn is not None:
            self._txn.declined.add(shape.name)
        for streamed in self._streams.values():  # routed again behind a new snapshot
            stale = streamed.holders.pop(shape.name, None)
            if stale is not None:
                stale.stream_discard(streamed.xid)
        rel = shape.relation
        key = (rel.namespace or "pg_catalog", rel.name)
        if domain_bases:
            self._domains[key] = domain_bases
        self._shapes[shape.name] = (key, shape)
        self._writers[shape.name] = writer
        for index in self._indexes.values():
            if table_key_of(index.relation) == key:
                self._bind_into(index, shape)
                return
        # the stream has not described this table yet: bound on its Relation message

    def routes(self, name: str) -> bool:
        return name in self._shapes

    def remove_shape(self, name: str) -> None:
        """Stop routing to ``name`` and release its hold on the flush boundary: its part
        of an open transaction is dropped, and the tracker forgets what it owes."""
        self._shapes.pop(name, None)
        self._fences.pop(name, None)
        writer = self._writers.pop(name, None)
        for index in self._indexes.values():
            index.remove(name)
        if self._txn is not None and name in self._txn.touched:
            del self._txn.touched[name]
            if writer is not None:
                writer.abort_txn()
        for streamed in self._streams.values():
            holder = streamed.holders.pop(name, None)
            if holder is not None:
                holder.stream_discard(streamed.xid)
        self.tracker.handle_shape_removed(name)

    def _bind_into(self, index: ShapeIndex, shape: BoundShape) -> None:
        rebound = rebind(shape, index.relation)
        if isinstance(rebound, ShapeResync):
            self._resync(rebound)
            return
        index.add(rebound)
        self._shapes[shape.name] = (self._shapes[shape.name][0], rebound)
        if rebound.output_columns != shape.output_columns and self._on_columns_changed:
            self._on_columns_changed(rebound)

    def mark_resync(self, resync: ShapeResync) -> None:
        """Stop feeding a shape the stream can no longer describe exactly."""
        self._resync(resync)

    def _resync(self, resync: ShapeResync) -> None:
        self.stats.resyncs.append(resync)
        self.remove_shape(resync.shape)
        if self._on_resync is not None:
            self._on_resync(resync)

    # -- the stream -------------------------------------------------------------

    @property
    def in_txn(self) -> bool:
        return self._txn is not None or self._skipping

    def stream_restarted(self) -> None:
        """The walsender connection restarted: it re-sends the open transaction and
        describes every relation again."""
        txn, self._txn = self._txn, None
        self._skipping = False
        if txn is not None:
            for writer in txn.touched.values():
                writer.abort_txn()
        streams, self._streams, self._block = self._streams, {}, None
        for streamed in streams.values():
            for writer in streamed.holders.values():
                writer.stream_discard(streamed.xid)

    @property
    def open_streams(self) -> int:
        """Streamed transactions begun and neither committed nor aborted yet."""
        return len(self._streams)

    def handle(self, msg: m.Message, size: int = 0) -> None:
        """One decoded message; ``size``: its length on the wire, charged to every shape
        a change is routed to (the memory budget's measure of a row)."""
        kind = type(msg)
        if kind is m.Insert or kind is m.Update or kind is m.Delete:
            if self._block is not None:
                self._stream_change(msg, size)  # type: ignore[arg-type]
            else:
                self._change(msg, size)  # type: ignore[arg-type]
        elif kind is m.Begin:
            self._begin(msg)  # type: ignore[arg-type]
        elif kind is m.Commit:
            self._commit(msg)  # type: ignore[arg-type]
        elif kind is m.Relation:
            self._relation(msg)  # type: ignore[arg-type]
        elif kind is m.Truncate:
            if self._block is not None:
                self._stream_truncate(msg)  # type: ignore[arg-type]
            else:
                self._truncate(msg)  # type: ignore[arg-type]
        elif kind is m.StreamStart:
            self._stream_start(msg)  # type: ignore[arg-type]
        elif kind is m.StreamStop:
            self._block = None
        elif kind is m.StreamCommit:
            self._stream_commit(msg)  # type: ignore[arg-type]
        elif kind is m.StreamAbort:
            self._stream_abort(msg)  # type: ignore[arg-type]
        elif kind is m.LogicalMessage:
            self.stats.logical_messages += 1
        elif kind is m.Origin:
            self.stats.origins += 1
        elif kind is m.TypeInfo:
            self.stats.types += 1
        else:
            raise ProtocolError(
                f"{kind.__name__} arrived, but tidemark does not request two-phase "
                "transactions: check the slot (created with two_phase?) and the options"
            )

    def _relation(self, rel: m.Relation) -> None:
        self.stats.relations += 1
        key = table_key_of(rel)
        domains = self._domains.get(key)
        if domains:
            rel = resolve_domains(rel, domains)
        self.relations.update(rel)
        index = self._indexes.get(rel.oid)
        if index is not None:
            before = {s.name: s.output_columns for s in index.shapes}
            for resync in index.update_relation(rel):
                self._resync(resync)
            for shape in index.shapes:
                self._shapes[shape.name] = (key, shape)
                if before.get(shape.name) != shape.output_columns and self._on_columns_changed:
                    self._on_columns_changed(shape)
            return
        index = ShapeIndex(rel)
        self._indexes[rel.oid] = index
        for shape_key, shape in list(self._shapes.values()):
            if shape_key == key:
                self._bind_into(index, shape)

    def _begin(self, begin: m.Begin) -> None:
        if self._txn is not None:
            raise ProtocolError(
                f"Begin of transaction {begin.xid} while transaction {self._txn.xid} is open"
            )
        if self.last_commit_lsn is not None and begin.final_lsn <= self.last_commit_lsn:
            self._skipping = True  # re-sent after a reconnect: already handled
            self.stats.transactions_skipped += 1
            return
        self._txn = _Txn(begin.final_lsn, begin.xid, begin.commit_ts)

    def _change(self, change: m.Insert | m.Update | m.Delete, size: int = 0) -> None:
        txn = self._txn
        if txn is None:
            if self._skipping:
                return
            raise ProtocolError(f"{type(change).__name__} outside a transaction")
        i = txn.changes
        txn.changes = i + 1
        self.stats.changes += 1
        index = self._indexes.get(change.relation_oid)
        if index is None:
            self.relations.get(change.relation_oid)  # unknown oid: a clear ProtocolError
            return  # a published table no shape reads
        if not len(index):
            return
        if type(change) is m.Insert:
            self._insert(txn, index, change, 2 * i, size)
        else:
            self._deliver(txn, convert(index, change), 2 * i, size)

    def _insert(self, txn: _Txn, index: ShapeIndex, change: m.Insert, op: int, size: int) -> None:
        """``_deliver(txn, convert_insert(index, change), op, size)`` without the routed
        items in between: an insert gives each shape whose predicate it matches one row
        of the new tuple (``shapes.convert``; the index names a shape at most once). A
        predicate that cannot be evaluated on the row takes the general way."""
        new = change.new
        try:
            shapes = index.route(new)
        except ProtocolError:
            self._deliver(txn, convert(index, change), op, size)
            return
        touched = txn.touched
        routed = 0
        for shape in shapes:
            name = shape.definition.name
            writer = touched.get(name)
            if writer is None:
                writer = self._enter(txn, name)
                if writer is None:
                    continue
            writer.append(op, INSERT, shape.project(new), None, size)
            routed += 1
        self.stats.rows_routed += routed

    def _enter(self, txn: _Txn, name: str) -> ShapeWriter | None:
        """The writer of shape ``name`` for the transaction's first row routed to it, or
        None when it takes no part (a declined shape's rows are not counted)."""
        if name in txn.declined:
            return None
        writer = self._writers.get(name)
        if writer is None:
            return None
        fence = self._fences.get(name)
        if fence is not None and fence.skips(txn.lsn, txn.xid):
            txn.declined.add(name)  # its snapshot holds this transaction
            return None
        if not writer.begin_txn(txn.lsn, txn.xid, txn.commit_ts):
            txn.declined.add(name)  # its sink has this transaction already
            return None
        txn.touched[name] = writer
        return writer

    def _truncate(self, trunc: m.Truncate) -> None:
        txn = self._txn
        if txn is None:
            if self._skipping:
                return
            raise ProtocolError("Truncate outside a transaction")
        for oid in trunc.relation_oids:
            i = txn.changes
            txn.changes = i + 1
            index = self._indexes.get(oid)
            if index is not None and len(index):
                self._deliver(txn, convert_truncate(index), 2 * i)

    def _deliver(self, txn: _Txn, routed: list[Any], op: int, size: int = 0) -> None:
        seen: set[str] | None = set() if len(routed) > 1 else None
        for item in routed:
            if type(item) is ShapeResync:
                self._resync(item)
                continue
            name, kind, values, unchanged = item
            writer = txn.touched.get(name)
            if writer is None:
                writer = self._enter(txn, name)
                if writer is None:
                    continue
            # the insert half of a key change (a second row for the same shape) gets op+1
            row_op = op
            if seen is not None:
                if name in seen:
                    row_op = op + 1
                seen.add(name)
            writer.append(row_op, kind, values, list(unchanged) if unchanged else None, size)
            self.stats.rows_routed += 1

    def _commit(self, commit: m.Commit) -> None:
        txn = self._txn
        if txn is None:
            if self._skipping:
                self._skipping = False
                return
            raise ProtocolError(f"Commit at {commit.commit_lsn} without Begin")
        self._txn = None
        if commit.commit_lsn != txn.lsn:
            raise ProtocolError(
                f"Commit LSN {commit.commit_lsn} differs from its Begin's final LSN {txn.lsn}"
            )
        last = offset_of((txn.lsn, 2 * txn.changes + 1))
        self.tracker.handle_txn_fragment(CommitFragment(last), txn.touched.keys())
        for writer in txn.touched.values():
            writer.end_txn(last)
        self.last_commit_lsn = txn.lsn
        self._recent_xids.append(txn.xid)
        self.stats.transactions += 1

    # -- transactions streamed before their commit ----------------------------------

    def _stream_start(self, start: m.StreamStart) -> None:
        if self._txn is not None:
            raise ProtocolError(
                f"Stream Start of transaction {start.xid} inside transaction {self._txn.xid}"
            )
        streamed = self._streams.get(start.xid)
        if streamed is None or start.first_segment:
            if streamed is not None:  # streamed again from its start: forget the first
                for writer in streamed.holders.values():
                    writer.stream_discard(streamed.xid)
            streamed = self._streams[start.xid] = _StreamedTxn(start.xid)
        self._block = streamed

    def _stream_change(self, change: m.Insert | m.Update | m.Delete, size: int) -> None:
        streamed = self._block
        assert streamed is not None
        i = streamed.changes
        streamed.changes = i + 1
        self.stats.changes += 1
        streamed.note_subxact(change.xid, i)
        oid = change.relation_oid
        index = self._indexes.get(oid)
        if index is None:
            self.relations.get(oid)  # unknown oid: a clear ProtocolError
            return
        streamed.oids.add(oid)
        if len(index):
            self._stream_deliver(streamed, convert(index, change), 2 * i, size)

    def _stream_truncate(self, trunc: m.Truncate) -> None:
        streamed = self._block
        assert streamed is not None
        streamed.note_subxact(trunc.xid, streamed.changes)
        for oid in trunc.relation_oids:
            i = streamed.changes
            streamed.changes = i + 1
            streamed.oids.add(oid)
            index = self._indexes.get(oid)
            if index is not None and len(index):
                self._stream_deliver(streamed, convert_truncate(index), 2 * i)

    def _stream_deliver(
        self, streamed: _StreamedTxn, routed: list[Any], op: int, size: int = 0
    ) -> None:
        seen: set[str] | None = set() if len(routed) > 1 else None
        for item in routed:
            if type(item) is ShapeResync:
                self._resync(item)
                continue
            name, kind, values, unchanged = item
            writer = streamed.holders.get(name)
            if writer is None:
                writer = self._writers.get(name)
                if writer is None:
                    continue
                streamed.holders[name] = writer
            row_op = op
            if seen is not None:
                if name in seen:
                    row_op = op + 1
                seen.add(name)
            writer.stream_append(
                streamed.xid, row_op, kind, values, list(unchanged) if unchanged else None, size
            )
            self.stats.rows_routed += 1

    def _stream_abort(self, abort: m.StreamAbort) -> None:
        streamed = self._streams.get(abort.xid)
        if streamed is None:
            return  # nothing of it reached us (or a reconnect forgot it)
        if abort.subxid == abort.xid:
            del self._streams[abort.xid]
            if self._block is streamed:
                self._block = None
            for writer in streamed.holders.values():
                writer.stream_discard(streamed.xid)
            self.stats.streamed_aborts += 1
            return
        self.stats.subtransaction_aborts += 1
        first = streamed.first_change.get(abort.subxid)
        if first is None:
            return  # it changed nothing
        # the subtransaction and everything after its first change (its own nested
        # subtransactions) is gone
        streamed.first_change = {s: i for s, i in streamed.first_change.items() if i < first}
        lo, hi = 2 * first, 2 * streamed.changes
        for writer in streamed.holders.values():
            writer.stream_drop(streamed.xid, lo, hi)

    def _stream_commit(self, commit: m.StreamCommit) -> None:
        streamed = self._streams.pop(commit.xid, None)
        lsn = commit.commit_lsn
        if streamed is None:
            streamed = _StreamedTxn(commit.xid)  # streamed without a change for us
        if self.last_commit_lsn is not None and lsn <= self.last_commit_lsn:
            for writer in streamed.holders.values():  # re-sent after a reconnect
                writer.stream_discard(streamed.xid)
            self.stats.transactions_skipped += 1
            return
        touched: dict[str, ShapeWriter] = {}
        for name, writer in streamed.holders.items():
            fence = self._fences.get(name)
            if (fence is not None and fence.skips(lsn, streamed.xid)) or not writer.stream_wants(
                lsn
            ):
                writer.stream_discard(streamed.xid)  # its snapshot or sink has it
                continue
            touched[name] = writer
        last = LogOffset(lsn, 2 * streamed.changes + 1)
        self.tracker.handle_txn_fragment(CommitFragment(last), touched.keys())
        for writer in touched.values():
            writer.stream_commit(streamed.xid, lsn, commit.commit_ts, last)
        self.last_commit_lsn = lsn
        self._recent_xids.append(streamed.xid)
        self.stats.transactions += 1
        self.stats.streamed_commits += 1

    def passed_invisible(self, visible: Callable[[int], bool], oid: int | None = None) -> list[int]:
        """Xids of recent commits the collector already handled that ``visible`` (a
        snapshot's visibility) does not see: the snapshot misses them, and so would a
        shape fenced by it. The transaction being received counts too: it committed
        (pgoutput sends a transaction at its commit), a shape added now declines it,
        and a snapshot taken in the instant between its commit record and its
        visibility does not have it.

        So does a streamed transaction in progress that already changed table ``oid``
        (any table when None): the snapshot does not see it, and the shape, routed from
        now on, would get only its remaining changes."""
        xids = list(self._recent_xids)
        if self._txn is not None:
            xids.append(self._txn.xid)
        xids += [x for x, s in self._streams.items() if oid is None or oid in s.oids]
        return [xid for xid in xids if not visible(xid)]
