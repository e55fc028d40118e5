"""A shape's rows between the stream and the sink, split at transaction boundaries.

Rows are kept column-wise, as Python lists, in two regions:

* **open**: rows of the transaction currently being received (not committable:
  a transaction is never half-visible);
* **ready**: rows of committed transactions, in commit order, waiting for a flush.

``end_txn`` moves the open rows to ready; ``take_batch`` hands the whole ready
region to a flush job and starts a new one, so the event loop never shares lists
with a worker thread. A transaction too big for memory is *staged*: its open
rows go to Parquet files (written, not committed) and the files travel with the
transaction into the batch that commits it.

Staged files belong to one *delivery* of a transaction: ``take_open_rows`` hands
out the delivery with the rows, and ``attach_staged`` adds the files to that
delivery only. When the stream restarts, Postgres sends the transaction again as a
new delivery; files a job finishes for the aborted one are returned for deletion,
never attached to the new one (that would commit its rows twice).

When the shape's column layout changes (``remap``), buffered rows are rearranged
by column name, so a value never lands in another column.

Values stay in pgoutput's representation (text ``bytes``/None/UNCHANGED_TOAST);
Arrow conversion happens per column when the batch is built. Metadata that is
constant in a transaction (LSN, xid, commit time) is stored once per transaction
and expanded when the batch is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from tidemark.lsn import LogOffset
from tidemark.pgoutput.messages import Value
from tidemark.sink.schema import ColumnSpec
from tidemark.sink.table import DataFile

ROW_OVERHEAD = 96  # bytes per buffered row beyond its values (lists, tuple, ints)


@dataclass(slots=True)
class Rows:
    """Column-wise rows plus per-transaction runs of constant metadata."""

    values: list[tuple[Value, ...]] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    unchanged: list[list[str] | None] = field(default_factory=list)
    # (lsn, xid, commit_ts_us, row count) per transaction, in order
    runs: list[tuple[int, int, int, int]] = field(default_factory=list)
    has_unchanged: bool = False
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.ops)

    def extend(self, other: Rows) -> None:
        self.values.extend(other.values)
        self.ops.extend(other.ops)
        self.kinds.extend(other.kinds)
        self.unchanged.extend(other.unchanged)
        self.runs.extend(other.runs)
        self.has_unchanged |= other.has_unchanged
        self.nbytes += other.nbytes

    def remap(self, positions: Sequence[int | None]) -> None:
        """Rearrange every row's values: new column ``i`` takes old value
        ``positions[i]`` (None, or beyond a short row: NULL)."""
        self.values = [
            tuple(v[j] if j is not None and j < len(v) else None for j in positions)
            for v in self.values
        ]


@dataclass(slots=True)
class Batch:
    """What one flush commits: ready rows, staged files, and where it ends."""

    shape: str
    rows: Rows
    staged: list[DataFile]
    end_lsn: int  # commit LSN of the last transaction in the batch
    last_offset: LogOffset  # the last offset this writer wrote in the batch
    transactions: int
    first_buffered_at: float
    first_lsn: int = 0  # commit LSN of the first transaction in the batch
    # the column layout the rows were buffered with (set by the writer)
    columns: list[ColumnSpec] | None = None
    schema: pa.Schema | None = None

    @property
    def row_count(self) -> int:
        return len(self.rows) + sum(f.num_rows for f in self.staged)


@dataclass(slots=True, eq=False)
class Delivery:
    """One delivery of an open transaction (Postgres re-sends it after a restart)."""

    lsn: int
    xid: int
    commit_ts: int
    rows: Rows = field(default_factory=Rows)
    staged: list[DataFile] = field(default_factory=list)
    staged_rows: int = 0
    last_op: int = -1  # the last row's _op (-1: none yet)
    state: str = "open"  # open | ended | aborted


class ShapeBuffer:
    """The open transaction and the ready region of one shape."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self._open: Delivery | None = None
        self._ready = Rows()
        self._ready_staged: list[DataFile] = []
        self._ready_txns = 0
        self._ready_first: int | None = None
        self._ready_end: tuple[int, LogOffset] | None = None
        self._ready_since: float | None = None

    # -- the stream side ------------------------------------------------------

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> None:
        assert self._open is None, "previous transaction not ended"
        self._open = Delivery(lsn, xid, commit_ts)

    @property
    def in_txn(self) -> bool:
        return self._open is not None

    @property
    def open_last_offset(self) -> LogOffset | None:
        """Offset of the last row of the open transaction, if it has one."""
        txn = self._open
        return None if txn is None or txn.last_op < 0 else LogOffset(txn.lsn, txn.last_op)

    def append(
        self,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> None:
        txn = self._open
        assert txn is not None, "append outside a transaction"
        rows = txn.rows
        rows.values.append(values)
        rows.ops.append(op)
        rows.kinds.append(kind)
        rows.unchanged.append(unchanged)
        if unchanged:
            rows.has_unchanged = True
        rows.nbytes += size_hint + ROW_OVERHEAD
        txn.last_op = op

    def end_txn(self, now: float) -> int:
        """Move the open transaction to ready; returns how many rows it had."""
        txn = self._open
        assert txn is not None
        self._open = None
        txn.state = "ended"
        count = len(txn.rows)
        if txn.last_op < 0:  # nothing written for this shape
            return 0
        txn.rows.runs.append((txn.lsn, txn.xid, txn.commit_ts, count))
        self._ready.extend(txn.rows)
        self._ready_staged.extend(txn.staged)
        self._ready_txns += 1
        if self._ready_first is None:
            self._ready_first = txn.lsn
        self._ready_end = (txn.lsn, LogOffset(txn.lsn, txn.last_op))
        if self._ready_since is None:
            self._ready_since = now
        return count + txn.staged_rows

    def abort_txn(self) -> None:
        """Forget the open transaction (the stream restarts; Postgres re-sends it)."""
        if self._open is not None:
            self._open.state = "aborted"
        self._open = None

    # -- staging a huge open transaction -------------------------------------

    def take_open_rows(self) -> tuple[Delivery, Rows] | None:
        """The open delivery's buffered rows, handed to a staging job."""
        txn = self._open
        if txn is None or not txn.rows.ops:
            return None
        rows = txn.rows
        rows.runs.append((txn.lsn, txn.xid, txn.commit_ts, len(rows)))
        txn.rows = Rows()
        return txn, rows

    def attach_staged(self, delivery: Delivery, files: list[DataFile]) -> list[DataFile]:
        """Files a staging job wrote for ``delivery``; returns those that belong to no
        delivery any more (it was aborted: the caller deletes them)."""
        if delivery.state == "open":
            delivery.staged.extend(files)
            delivery.staged_rows += sum(f.num_rows for f in files)
            return []
        if delivery.state == "ended":
            # committed in the source meanwhile: its rows wait in the ready region (no
            # batch is taken while a staging job runs for the shape)
            self._ready_staged.extend(files)
            return []
        return list(files)

    # -- the flush side -----------------------------------------------------------

    @property
    def ready_rows(self) -> int:
        return len(self._ready) + sum(f.num_rows for f in self._ready_staged)

    @property
    def ready_bytes(self) -> int:
        return self._ready.nbytes

    @property
    def open_rows(self) -> int:
        return 0 if self._open is None else len(self._open.rows)

    @property
    def open_bytes(self) -> int:
        return 0 if self._open is None else self._open.rows.nbytes

    @property
    def nbytes(self) -> int:
        return self._ready.nbytes + self.open_bytes

    @property
    def ready_since(self) -> float | None:
        return self._ready_since

    @property
    def oldest_lsn(self) -> int | None:
        """Commit LSN of the oldest transaction buffered here (ready or open)."""
        if self._ready_first is not None:
            return self._ready_first
        txn = self._open
        if txn is not None and (txn.last_op >= 0 or txn.staged):
            return txn.lsn
        return None

    def remap(self, positions: Sequence[int | None]) -> None:
        """The column layout changed: see ``Rows.remap``."""
        self._ready.remap(positions)
        if self._open is not None:
            self._open.rows.remap(positions)

    def take_batch(self) -> Batch | None:
        if self._ready_end is None:
            return None
        end_lsn, last_offset = self._ready_end
        batch = Batch(
            self.shape,
            self._ready,
            self._ready_staged,
            end_lsn,
            last_offset,
            self._ready_txns,
            self._ready_since or 0.0,
            self._ready_first or end_lsn,
        )
        self._ready = Rows()
        self._ready_staged = []
        self._ready_txns = 0
        self._ready_first = None
        self._ready_end = None
        self._ready_since = None
        return batch
