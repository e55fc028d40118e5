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
  A shape with a snapshot fence (``tidemark.backfill.fence``) skips the
  transactions its snapshot already holds; a shape added while a transaction is
  open skips that one (it committed before the snapshot was taken).
* ``Commit``: the FlushTracker learns the transaction and the shapes it touched,
  *then* each touched writer ends its part (the order ``TxnAlignment`` requires).
  The xids of the last ``RECENT_COMMITS`` commits are remembered: a snapshot that
  does not see one of them was taken while that commit was streamed but not yet
  visible (a synchronous-standby wait), and must be taken again
  (``passed_invisible``).
* ``Origin``, ``Type``, ``Message``: recorded, never fatal.

Streamed in-progress transactions (protocol ``streaming``) are not consumed here:
the service does not request them (large transactions spill on the server).

Pure: no IO, no clock, no logging; the service reacts to what it returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.backfill.fence import SnapshotFence
from tidemark.errors import ProtocolError
from tidemark.flush.tracker import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset
from tidemark.pgoutput import messages as m
from tidemark.pgoutput.relations import RelationCache
from tidemark.shapes.catalog import resolve_domains
from tidemark.shapes.convert import convert, convert_truncate
from tidemark.shapes.model import BoundShape, ShapeResync, rebind
from tidemark.shapes.routing import ShapeIndex
from tidemark.writers.writer import ShapeWriter

TableKey = tuple[str, str]  # (schema, table) as Postgres names them
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
    resyncs: list[ShapeResync] = field(default_factory=list)


@dataclass(slots=True)
class _Txn:
    lsn: int
    xid: int
    commit_ts: int
    changes: int = 0
    touched: dict[str, ShapeWriter] = field(default_factory=dict)
    declined: set[str] = field(default_factory=set)


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

    @property
    def idle(self) -> bool:
        """No transaction open here and nothing pending in the tracker."""
        return not self.in_txn and self.tracker.is_caught_up

    def stream_restarted(self) -> None:
        """The walsender connection restarted: it re-sends the open transaction and
        describes every relation again."""
        txn, self._txn = self._txn, None
        self._skipping = False
        if txn is not None:
            for writer in txn.touched.values():
                writer.abort_txn()

    def handle(self, msg: m.Message, size: int = 0) -> None:
        """One decoded message; ``size``: its length on the wire, charged to every shape
        a change is routed to (the memory budget's measure of a row)."""
        kind = type(msg)
        if kind is m.Insert or kind is m.Update or kind is m.Delete:
            self._change(msg, size)  # type: ignore[arg-type]
        elif kind is m.Begin:
            self._begin(msg)  # type: ignore[arg-type]
        elif kind is m.Commit:
            self._commit(msg)  # type: ignore[arg-type]
        elif kind is m.Relation:
            self._relation(msg)  # type: ignore[arg-type]
        elif kind is m.Truncate:
            self._truncate(msg)  # type: ignore[arg-type]
        elif kind is m.LogicalMessage:
            self.stats.logical_messages += 1
        elif kind is m.Origin:
            self.stats.origins += 1
        elif kind is m.TypeInfo:
            self.stats.types += 1
        else:
            raise ProtocolError(
                f"{kind.__name__} arrived, but tidemark does not request streamed or "
                "two-phase transactions: check the publication/slot options"
            )

    def handle_all(self, messages: Iterable[m.Message]) -> None:
        for msg in messages:
            self.handle(msg)

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
        self._deliver(txn, convert(index, change), 2 * i, size)

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
                if name in txn.declined:
                    continue
                writer = self._writers.get(name)
                if writer is None:
                    continue
                fence = self._fences.get(name)
                if fence is not None and fence.skips(txn.lsn, txn.xid):
                    txn.declined.add(name)  # its snapshot holds this transaction
                    continue
                if not writer.begin_txn(txn.lsn, txn.xid, txn.commit_ts):
                    txn.declined.add(name)  # its sink has this transaction already
                    continue
                txn.touched[name] = writer
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
        last = LogOffset(txn.lsn, 2 * txn.changes + 1)
        self.tracker.handle_txn_fragment(CommitFragment(last), txn.touched.keys())
        for writer in txn.touched.values():
            writer.end_txn(last)
        self.last_commit_lsn = txn.lsn
        self._recent_xids.append(txn.xid)
        self.stats.transactions += 1

    def passed_invisible(self, visible: Callable[[int], bool]) -> list[int]:
        """Xids of recent commits the collector already handled that ``visible`` (a
        snapshot's visibility) does not see: the snapshot misses them, and so would a
        shape fenced by it. The transaction being received counts too: it committed
        (pgoutput sends a transaction at its commit), a shape added now declines it,
        and a snapshot taken in the instant between its commit record and its
        visibility does not have it."""
        xids = list(self._recent_xids)
        if self._txn is not None:
            xids.append(self._txn.xid)
        return [xid for xid in xids if not visible(xid)]
