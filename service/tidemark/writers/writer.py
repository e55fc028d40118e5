"""One logical writer per shape: buffer, transaction alignment, committed offset.

The collector drives it on the event loop:

``begin_txn(lsn, xid, ts)`` -> ``append(...)``* -> ``end_txn(txn_last_offset)``

and, for transactions Postgres streams before their commit (several may be open):

``stream_append(xid, ...)``* and ``stream_drop(xid, lo, hi)`` (a subtransaction
aborted) -> ``stream_commit(xid, lsn, ts, txn_last_offset)`` or ``stream_discard(xid)``

A transaction at or below the shape's committed offset (read back from the sink
at start) was committed before a restart: ``begin_txn`` returns False and the
collector leaves the shape out of that transaction entirely (not "affected").

The flush side (``FlushScheduler``) takes batches with ``take_batch`` and, after
the sink commit, calls ``batch_committed``; flush notices aligned to transaction
boundaries (``tidemark.flush.alignment``) go to ``report(shape, offset)``, which
the service wires to ``FlushTracker.handle_flush_notification``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tidemark.flush.alignment import TxnAlignment
from tidemark.lsn import LogOffset
from tidemark.pgoutput.messages import Value
from tidemark.sink.files import DataFile
from tidemark.sink.port import ChangelogTable
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.writers.buffer import Batch, ShapeBuffer
from tidemark.writers.memory import Charge

Report = Callable[[str, LogOffset], None]


@dataclass(frozen=True, slots=True)
class TableState:
    """What a writer reads from its table when it starts. Reading it is blocking I/O
    (the table's log): the service reads it in a thread, with the table's creation
    (at 1000 shapes, reading it on the event loop was 2.3 ms a shape there)."""

    op_type: pa.DataType | None  # an older table's _op may be int32; None: no table yet
    committed_lsn: int | None

    @classmethod
    def read(cls, table: ChangelogTable) -> TableState:
        return cls(table.op_type(), table.committed_lsn())


@dataclass(slots=True)
class JobFailure:
    """A flush or staging job of this shape failed; it is retried with backoff, or, for
    a value its lake column cannot hold (``refused``), not at all: the same batch would
    fail the same way. A resync or a changed definition drops the batch."""

    error: str
    attempts: int
    retry_at: float  # monotonic (inf: not retried)
    since: float  # wall clock of the first failure in a row
    refused: bool = False  # a value the lake column cannot hold (UnfitValue)


class ShapeWriter:
    def __init__(
        self,
        table: ChangelogTable,
        columns: list[ColumnSpec],
        report: Report,
        *,
        state: TableState | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``state``: the table's, read before (None: read it now)."""
        if state is None:
            state = TableState.read(table)
        self.shape = table.shape
        self.table = table
        self.columns = columns
        self.op_type = state.op_type  # an older table's _op may be int32
        self.schema: pa.Schema = table_schema(columns, self.op_type)
        self.buffer = ShapeBuffer(self.shape)
        self.charge = Charge()  # the scheduler's, once added to one
        self.alignment = TxnAlignment()
        self.committed_lsn: int | None = state.committed_lsn
        self._report = report
        self._clock = clock
        self._accepting = False
        self.rows_committed = 0
        self.commits = 0
        self.in_flight = False  # a flush or staging job is running for this shape
        self.awaited = 0  # tasks waiting for ``FlushScheduler.exclusive``: no new job
        self.in_flight_bytes = 0  # buffered bytes that job holds until it finishes
        self.in_flight_lsn: int | None = None  # oldest transaction that job holds
        self.backfill = False  # snapshot work has lower priority
        # a backfill that replaces the table's schema holds stream commits until its
        # own commit (files written with the new layout cannot join the old schema)
        self.hold_commits = False
        self.failure: JobFailure | None = None  # the last job failed: retried later
        self.retry: Callable[[], Any] | None = None  # that job, kept for its retry
        self.taken: Batch | None = None  # the batch a job holds, until it commits
        # spool files no transaction will commit: the scheduler deletes them
        self.orphans: list[DataFile] = []

    # -- schema -----------------------------------------------------------------

    def set_columns(self, columns: list[ColumnSpec]) -> None:
        """The shape's output columns changed (added, dropped, reordered, retyped):
        buffered rows are rearranged by name. Batches already taken keep the layout
        they were taken with."""
        if [c.name for c in columns] != [c.name for c in self.columns]:
            old = {c.name: i for i, c in enumerate(self.columns)}
            self.buffer.remap([old.get(c.name) for c in columns])
        self.columns = columns
        self.schema = table_schema(columns, self.op_type)

    def widen_op(self) -> bool:
        """An older table's int32 ``_op`` becomes int64 from the next backfill on (the
        backfill then replaces the table's schema, as for a column type change: its
        snapshot rewrites every file). True when it was int32."""
        if self.op_type is None or not pa.types.is_int32(self.op_type):
            return False
        self.op_type = pa.int64()
        self.schema = table_schema(self.columns, self.op_type)
        return True

    # -- stream side ------------------------------------------------------------

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> bool:
        """Start a transaction; False if the sink already has it (a replay)."""
        if self.committed_lsn is not None and lsn <= self.committed_lsn:
            self._accepting = False
            return False
        self._accepting = True
        self.buffer.begin_txn(lsn, xid, commit_ts)
        self.alignment.begin_txn()
        return True

    def append(
        self,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> None:
        self.charge.added += self.buffer.append(op, kind, values, unchanged, size_hint)

    def end_txn(self, txn_last_offset: LogOffset) -> None:
        """The transaction committed; the tracker has seen its commit already."""
        if not self._accepting:
            return
        self._accepting = False
        # Alignment needs only the last row of the transaction: flushes commit closed
        # transactions only, so per-row bookkeeping would be wasted on the hot path.
        buffer = self.buffer
        last = buffer.open_last_offset
        buffer.end_txn(self._clock())
        held = self.alignment.end_txn(txn_last_offset, last)
        if held is not None:
            self._report(self.shape, held)

    def abort_txn(self) -> None:
        """The stream restarted mid-transaction: drop its rows (they come again)."""
        if self._accepting:
            self.buffer.abort_txn()
            self.alignment.abort_txn()
            self._accepting = False

    @property
    def in_txn(self) -> bool:
        return self._accepting

    # -- transactions streamed before their commit -----------------------------------

    def stream_append(
        self,
        xid: int,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> None:
        self.charge.added += self.buffer.stream_append(xid, op, kind, values, unchanged, size_hint)

    def stream_drop(self, xid: int, lo: int, hi: int) -> None:
        """A subtransaction of ``xid`` aborted: its rows (``lo <= _op < hi``) go."""
        self.orphans += self.buffer.stream_drop(xid, lo, hi)

    def stream_discard(self, xid: int) -> None:
        """``xid`` aborted, or this shape declines it."""
        self.orphans += self.buffer.stream_discard(xid)

    def stream_wants(self, lsn: int) -> bool:
        """False when the sink has the transaction committed at ``lsn`` already."""
        return self.committed_lsn is None or lsn > self.committed_lsn

    def stream_commit(self, xid: int, lsn: int, commit_ts: int, txn_last_offset: LogOffset) -> None:
        """The streamed transaction committed; the tracker has seen its commit."""
        self.alignment.begin_txn()
        last_op = self.buffer.stream_commit(xid, lsn, commit_ts, self._clock())
        if last_op is not None:
            self.alignment.record_written(LogOffset(lsn, last_op))
        held = self.alignment.end_txn(txn_last_offset)
        if held is not None:
            self._report(self.shape, held)

    # -- flush side ---------------------------------------------------------------

    def take_batch(self) -> Batch | None:
        batch = self.buffer.take_batch()
        if batch is not None:
            batch.columns, batch.schema = list(self.columns), self.schema
            self.taken = batch
        return batch

    def pending_files(self) -> list[DataFile]:
        """Files written for commits still to come: staged for transactions buffered or
        in a batch not committed yet (vacuum must leave them)."""
        taken = [] if self.taken is None else self.taken.staged
        return [*self.buffer.staged_files(), *taken]

    @property
    def oldest_held_lsn(self) -> int | None:
        """Commit LSN of the oldest transaction this writer holds and has not committed
        (buffered, staged, or in a running or failed job): nothing at or after it may
        be acknowledged. Computed from the writer's own state, not the tracker's."""
        held = [x for x in (self.buffer.oldest_lsn, self.in_flight_lsn) if x is not None]
        return min(held) if held else None

    def discard_buffered(self) -> None:
        """Drop everything buffered (the shape is about to be rebuilt from a snapshot
        that holds those transactions). Call with no job running for the shape."""
        self.buffer.abort_txn()
        self.orphans += self.buffer.forget_spool()
        self.buffer = ShapeBuffer(self.shape)
        self.failure, self.retry = None, None
        self.in_flight_bytes, self.in_flight_lsn = 0, None
        self.taken = None
        self.hold_commits = False
        self.alignment = TxnAlignment()
        self._accepting = False

    def batch_committed(self, batch: Batch, version: int | None) -> None:
        """The sink committed ``batch`` (or had it already: version None)."""
        if self.taken is batch:
            self.taken = None
        self.committed_lsn = max(self.committed_lsn or 0, batch.end_lsn)
        self.rows_committed += batch.row_count
        self.commits += version is not None
        notice = self.alignment.on_flushed(batch.last_offset)
        if notice is not None:
            self._report(self.shape, notice)
