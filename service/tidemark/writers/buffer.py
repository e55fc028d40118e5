"""A shape's rows between the stream and the sink, split at transaction boundaries.

Rows are kept column-wise, as Python lists, in two regions of one ``Rows``:

* **ready**: rows of committed transactions, in commit order, waiting for a flush;
* **open**: after them, the rows of the transaction currently being received (not
  committable: a transaction is never half-visible).

``end_txn`` makes the open rows ready by recording their transaction's run (no row
moves: with small transactions touching many shapes, moving them was about a tenth
of the collector's CPU in a profile); ``abort_txn`` cuts them off. ``take_batch``
hands the ready region to a flush job and keeps the open rows in a new one, so the
event loop never shares lists with a worker thread. A transaction too big for memory
is *staged*: its open rows go to Parquet files (written, not committed) and the files
travel with the transaction into the batch that commits it.

Staged files belong to one *delivery* of a transaction: ``take_open_rows`` hands
out the delivery with the rows, and ``attach_staged`` adds the files to that
delivery only. When the stream restarts, Postgres sends the transaction again as a
new delivery; files a job finishes for the aborted one are returned for deletion,
never attached to the new one (that would commit its rows twice).

When the shape's column layout changes (``remap``), buffered rows are rearranged
by column name, so a value never lands in another column.

A transaction Postgres *streams* before its commit (protocol ``streaming``) has a
``StreamPart`` per shape, keyed by xid (several streamed transactions can be open
at once, and an ordinary one beside them). Its commit LSN is unknown until Stream
Commit, so rows that must leave memory early are *spooled* (Parquet under the
table's ``_spool/`` folder, ``_lsn`` and ``_commit_ts`` not yet known) and
rewritten with the commit's values by the flush that commits them
(``SpooledTxn``). A subtransaction abort drops an ``_op`` range (the rows from the
subtransaction's first change on, as Postgres's own subscriber truncates its spool
file); spooled rows of a dropped range are filtered out by that rewrite.

Values stay in pgoutput's representation (text ``bytes``/None/UNCHANGED_TOAST);
Arrow conversion happens per column when the batch is built. Metadata that is
constant in a transaction (LSN, xid, commit time) is stored once per transaction
and expanded when the batch is built.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from tidemark.lsn import LogOffset, offset_of
from tidemark.pgoutput.messages import Value
from tidemark.sink.files import DataFile
from tidemark.sink.schema import ColumnSpec

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

    def add(
        self,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> int:
        """Append a row; returns the bytes it counts for (``nbytes`` grows by them)."""
        self.values.append(values)
        self.ops.append(op)
        self.kinds.append(kind)
        self.unchanged.append(unchanged)
        if unchanged:
            self.has_unchanged = True
        nbytes = size_hint + ROW_OVERHEAD
        self.nbytes += nbytes
        return nbytes

    def extend(self, other: Rows) -> None:
        self.values.extend(other.values)
        self.ops.extend(other.ops)
        self.kinds.extend(other.kinds)
        self.unchanged.extend(other.unchanged)
        self.runs.extend(other.runs)
        self.has_unchanged |= other.has_unchanged
        self.nbytes += other.nbytes

    def clear(self) -> None:
        """Empty every list in place (the object is used again)."""
        self.values.clear()
        self.ops.clear()
        self.kinds.clear()
        self.unchanged.clear()
        self.runs.clear()
        self.has_unchanged = False
        self.nbytes = 0

    def split_off(self, start: int, nbytes: int) -> Rows:
        """Move the rows from ``start`` on, which count for ``nbytes``, into a ``Rows``
        of their own (without runs: they are an open transaction's)."""
        tail = Rows(
            self.values[start:],
            self.ops[start:],
            self.kinds[start:],
            self.unchanged[start:],
            has_unchanged=self.has_unchanged,
            nbytes=nbytes,
        )
        self.truncate(start, nbytes)
        return tail

    def truncate(self, start: int, nbytes: int) -> None:
        """Forget the rows from ``start`` on, which count for ``nbytes``."""
        for column in (self.values, self.ops, self.kinds, self.unchanged):
            del column[start:]
        self.nbytes -= nbytes

    def slices(self, n: int) -> Iterator[Rows]:
        """The rows in consecutive slices of ``n`` (the last one shorter), each a
        ``Rows`` of its own with the runs it covers; this one unchanged. One pass over
        the runs for all slices (a batch of one-row transactions has a run per row)."""
        total = len(self.ops)
        runs = self.runs
        at = used = 0  # the run the next slice starts in, and its rows given out already
        for start in range(0, total, max(1, n)):
            end = min(total, start + max(1, n))
            piece = Rows(
                self.values[start:end],
                self.ops[start:end],
                self.kinds[start:end],
                self.unchanged[start:end],
                has_unchanged=self.has_unchanged,
            )
            out = piece.runs
            want = end - start
            while want:
                run = runs[at]
                left = run[3] - used
                if left <= want:
                    out.append(run if not used else (run[0], run[1], run[2], left))
                    want -= left
                    at += 1
                    used = 0
                else:
                    out.append((run[0], run[1], run[2], want))
                    used += want
                    want = 0
            yield piece

    def drop_front(self, n: int) -> int:
        """Remove the first ``n`` rows and their metadata runs; returns the bytes they
        counted for (in proportion: the per-row sizes are not kept). One pass over the
        runs they cover, however many runs are left (a batch of one-row transactions
        has a run per row)."""
        total = len(self.ops)
        every = n > total  # (then empty runs after the last row go too)
        n = min(n, total)
        nbytes = self.nbytes * n // total if total else 0
        self.nbytes -= nbytes
        for column in (self.values, self.ops, self.kinds, self.unchanged):
            del column[:n]
        whole, left = 0, n
        for _, _, _, count in self.runs:
            if left < count or (left == 0 and not every):
                break
            left -= count
            whole += 1
        del self.runs[:whole]
        if left:  # the run the cut falls in keeps its rest
            lsn, xid, ts, count = self.runs[0]
            self.runs[0] = (lsn, xid, ts, count - left)
        return nbytes

    def remap(self, positions: Sequence[int | None]) -> None:
        """Rearrange every row's values: new column ``i`` takes old value
        ``positions[i]`` (None, or beyond a short row: NULL)."""
        self.values = [
            tuple(v[j] if j is not None and j < len(v) else None for j in positions)
            for v in self.values
        ]


@dataclass(slots=True)
class Spooled:
    """One spooling job's files of a streamed transaction, and the ops they hold."""

    files: list[DataFile]
    first_op: int
    last_op: int
    rows: int


@dataclass(slots=True)
class SpooledTxn:
    """Spool files the flush has Spark rewrite into the table: a committed streamed
    transaction's (its commit LSN and time set, the ``dropped`` op ranges left out),
    or, with ``lsn`` None, a large batch's rows written out in slices (complete)."""

    files: list[DataFile]
    dropped: list[tuple[int, int]]  # [lo, hi) op ranges aborted subtransactions left
    lsn: int | None
    xid: int
    commit_ts: int
    rows: int  # rows in the files (the rewrite may keep fewer)


@dataclass(slots=True, eq=False)
class StreamPart:
    """One shape's rows of a transaction still being streamed (commit LSN unknown)."""

    xid: int
    rows: Rows = field(default_factory=Rows)
    spooled: list[Spooled] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)
    last_op: int = -1  # the last row's _op appended (kept or dropped since)
    state: str = "open"  # open | committed | aborted
    committed: SpooledTxn | None = None  # where chunks still being spooled go

    def in_dropped(self, first_op: int, last_op: int) -> bool:
        """Every op of ``first_op..last_op`` lies in one dropped range."""
        return any(lo <= first_op and last_op < hi for lo, hi in self.dropped)


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
    spooled: list[SpooledTxn] = field(default_factory=list)
    # rows by _kind, counted before a flush moves the rows to spool files (metrics)
    kinds: dict[str, int] | None = None
    # why the batch can never be committed (a staged file whose sync failed: its rows
    # are not in memory to write again); None: it can
    lost: str | None = None

    @property
    def row_count(self) -> int:
        return (
            len(self.rows)
            + sum(f.num_rows for f in self.staged)
            + sum(s.rows for s in self.spooled)
        )


class Delivery:
    """An open transaction of which a staging job took rows (one delivery of it:
    Postgres re-sends the transaction after a restart, as another delivery).

    Compared by identity: files staged for an aborted delivery are never attached to
    the next one."""

    __slots__ = ("commit_ts", "lsn", "staged", "staged_rows", "state", "xid")

    def __init__(self, lsn: int, xid: int, commit_ts: int) -> None:
        self.lsn = lsn
        self.xid = xid
        self.commit_ts = commit_ts
        self.staged: list[DataFile] = []
        self.staged_rows = 0
        self.state = "open"  # open | ended | aborted

    def __repr__(self) -> str:
        return (
            f"Delivery(lsn={self.lsn}, xid={self.xid}, staged={len(self.staged)}, "
            f"state={self.state!r})"
        )


class ShapeBuffer:
    """The open transaction and the ready region of one shape."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        # the ready rows, then the open transaction's (from ``_open_start`` on)
        self._ready = Rows()
        self._open = False
        self._open_lsn = self._open_xid = self._open_ts = 0
        self._open_start = 0
        self._open_nbytes = 0
        self._open_last_op = -1  # the open transaction's last row's _op (-1: none yet)
        self._delivery: Delivery | None = None  # once a staging job took open rows
        self._ready_staged: list[DataFile] = []
        self._ready_txns = 0
        self._ready_first: int | None = None
        self._ready_end: tuple[int, int] | None = None  # its last transaction's LSN, op
        self._ready_since: float | None = None
        self._ready_spooled: list[SpooledTxn] = []
        self._streams: dict[int, StreamPart] = {}

    # -- the stream side ------------------------------------------------------

    def begin_txn(self, lsn: int, xid: int, commit_ts: int) -> None:
        assert not self._open, "previous transaction not ended"
        self._open = True
        self._open_lsn, self._open_xid, self._open_ts = lsn, xid, commit_ts
        self._open_start = len(self._ready.ops)
        self._open_nbytes = 0
        self._open_last_op = -1

    @property
    def in_txn(self) -> bool:
        return self._open

    @property
    def open_last_offset(self) -> LogOffset | None:
        """Offset of the last row of the open transaction, if it has one."""
        if not self._open or self._open_last_op < 0:
            return None
        return offset_of((self._open_lsn, self._open_last_op))

    def append(
        self,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> int:
        """Append a row to the open transaction; returns the bytes it counts for."""
        assert self._open, "append outside a transaction"
        self._open_last_op = op
        nbytes = self._ready.add(op, kind, values, unchanged, size_hint)
        self._open_nbytes += nbytes
        return nbytes

    def end_txn(self, now: float) -> int:
        """The open transaction's rows are ready; returns how many rows it had."""
        assert self._open, "end_txn outside a transaction"
        self._open = False
        self._open_nbytes = 0
        delivery, self._delivery = self._delivery, None
        if delivery is not None:
            delivery.state = "ended"
        last_op = self._open_last_op
        if last_op < 0:  # nothing written for this shape
            return 0
        lsn = self._open_lsn
        count = len(self._ready.ops) - self._open_start
        if count:
            self._ready.runs.append((lsn, self._open_xid, self._open_ts, count))
        if delivery is not None:
            self._ready_staged.extend(delivery.staged)
            count += delivery.staged_rows
        self._ready_txns += 1
        if self._ready_first is None:
            self._ready_first = lsn
        self._ready_end = (lsn, last_op)
        if self._ready_since is None:
            self._ready_since = now
        return count

    def abort_txn(self) -> None:
        """Forget the open transaction (the stream restarts; Postgres re-sends it)."""
        if not self._open:
            return
        self._open = False
        self._ready.truncate(self._open_start, self._open_nbytes)
        self._open_nbytes = 0
        delivery, self._delivery = self._delivery, None
        if delivery is not None:
            delivery.state = "aborted"

    # -- transactions streamed before their commit ------------------------------

    def stream_append(
        self,
        xid: int,
        op: int,
        kind: str,
        values: tuple[Value, ...],
        unchanged: list[str] | None,
        size_hint: int,
    ) -> int:
        """Append a row of a streamed transaction; returns the bytes it counts for."""
        part = self._streams.get(xid)
        if part is None:
            part = self._streams[xid] = StreamPart(xid)
        part.last_op = op
        return part.rows.add(op, kind, values, unchanged, size_hint)

    def stream_drop(self, xid: int, lo: int, hi: int) -> list[DataFile]:
        """A subtransaction aborted: forget the rows with ``lo <= _op < hi``; returns
        spool files that hold nothing else (the caller deletes them)."""
        part = self._streams.get(xid)
        if part is None:
            return []
        part.dropped.append((lo, hi))
        rows = part.rows
        cut = bisect.bisect_left(rows.ops, lo)
        end = bisect.bisect_left(rows.ops, hi)
        if cut < end:
            n = len(rows.ops)
            kept = n - (end - cut)
            for column in (rows.values, rows.ops, rows.kinds, rows.unchanged):
                del column[cut:end]
            rows.nbytes = rows.nbytes * kept // n if n else 0
        gone = [s for s in part.spooled if part.in_dropped(s.first_op, s.last_op)]
        if not gone:
            return []
        part.spooled = [s for s in part.spooled if s not in gone]
        return [f for s in gone for f in s.files]

    def stream_commit(self, xid: int, lsn: int, commit_ts: int, now: float) -> int | None:
        """The streamed transaction committed at ``lsn``: its rows (and spool files)
        join the ready region. Returns the last op it appended here (the offset the
        writer reports as written), or None if nothing of it is left."""
        part = self._streams.pop(xid, None)
        if part is None:
            return None
        part.state = "committed"
        rows = part.rows
        if not rows.ops and not part.spooled and part.last_op < 0:
            return None
        if rows.ops:
            rows.runs.append((lsn, xid, commit_ts, len(rows)))
            self._ready.extend(rows)
        part.rows = Rows()
        txn = SpooledTxn(
            [f for s in part.spooled for f in s.files],
            part.dropped,
            lsn,
            xid,
            commit_ts,
            sum(s.rows for s in part.spooled),
        )
        part.committed = txn
        self._ready_spooled.append(txn)  # even without files: a chunk may be on its way
        self._ready_txns += 1
        if self._ready_first is None:
            self._ready_first = lsn
        self._ready_end = (lsn, part.last_op)
        if self._ready_since is None:
            self._ready_since = now
        return part.last_op

    def stream_discard(self, xid: int) -> list[DataFile]:
        """The streamed transaction aborted (or this shape declines it): forget it;
        returns its spool files (the caller deletes them)."""
        part = self._streams.pop(xid, None)
        if part is None:
            return []
        part.state = "aborted"
        return [f for s in part.spooled for f in s.files]

    def forget_spool(self) -> list[DataFile]:
        """Forget every streamed transaction, open or committed and not yet taken by a
        flush; returns their spool files."""
        files: list[DataFile] = []
        for xid in list(self._streams):
            files += self.stream_discard(xid)
        for txn in self._ready_spooled:
            files += txn.files
        return files

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def stream_bytes(self) -> int:
        if not self._streams:  # nearly always; asked for every shape on every tick
            return 0
        return sum(p.rows.nbytes for p in self._streams.values())

    def take_stream_rows(self) -> list[tuple[StreamPart, Rows]]:
        """Every streamed part's buffered rows, handed to a spooling job."""
        taken = []
        for part in self._streams.values():
            rows = part.rows
            if rows.ops:
                rows.runs.append((0, part.xid, 0, len(rows)))
                part.rows = Rows()
                taken.append((part, rows))
        return taken

    def attach_spooled(self, part: StreamPart, chunk: Spooled) -> list[DataFile]:
        """Files a spooling job wrote for ``part``; returns those no transaction will
        commit (aborted meanwhile, or all their rows dropped)."""
        if part.state == "aborted" or part.in_dropped(chunk.first_op, chunk.last_op):
            return list(chunk.files)
        if part.state == "committed":
            assert part.committed is not None
            part.committed.files.extend(chunk.files)
            part.committed.rows += chunk.rows
            return []
        part.spooled.append(chunk)
        return []

    # -- staging a huge open transaction -------------------------------------

    def take_open_rows(self) -> tuple[Delivery, Rows] | None:
        """The open transaction's buffered rows, handed to a staging job with the
        delivery they belong to."""
        if not self._open or len(self._ready.ops) == self._open_start:
            return None
        rows = self._ready.split_off(self._open_start, self._open_nbytes)
        self._open_nbytes = 0
        lsn, xid, ts = self._open_lsn, self._open_xid, self._open_ts
        rows.runs.append((lsn, xid, ts, len(rows)))
        delivery = self._delivery
        if delivery is None:
            delivery = self._delivery = Delivery(lsn, xid, ts)
        return delivery, rows

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
        return (
            len(self._ready)
            - self.open_rows
            + sum(f.num_rows for f in self._ready_staged)
            + sum(s.rows for s in self._ready_spooled)
        )

    @property
    def ready_bytes(self) -> int:
        return self._ready.nbytes - self._open_nbytes

    @property
    def open_rows(self) -> int:
        return len(self._ready.ops) - self._open_start if self._open else 0

    @property
    def open_bytes(self) -> int:
        return self._open_nbytes

    @property
    def nbytes(self) -> int:
        return self._ready.nbytes + self.stream_bytes

    @property
    def ready_since(self) -> float | None:
        return self._ready_since

    @property
    def oldest_lsn(self) -> int | None:
        """Commit LSN of the oldest transaction buffered here (ready or open)."""
        if self._ready_first is not None:
            return self._ready_first
        if self._open and self._open_last_op >= 0:
            return self._open_lsn
        return None

    def remap(self, positions: Sequence[int | None]) -> None:
        """The column layout changed: see ``Rows.remap``."""
        self._ready.remap(positions)  # (the open transaction's rows with them)
        for part in self._streams.values():
            part.rows.remap(positions)

    def staged_files(self) -> list[DataFile]:
        """Files staged for the open transaction and the ready region."""
        open_staged = [] if self._delivery is None else self._delivery.staged
        return [*open_staged, *self._ready_staged]

    def take_batch(self) -> Batch | None:
        if self._ready_end is None:
            return None
        end_lsn, last_op = self._ready_end
        ready = self._ready
        if self._open:  # its rows stay
            self._ready = ready.split_off(self._open_start, self._open_nbytes)
            self._open_start = 0
        else:
            self._ready = Rows()
        batch = Batch(
            self.shape,
            ready,
            self._ready_staged,
            end_lsn,
            LogOffset(end_lsn, last_op),
            self._ready_txns,
            self._ready_since or 0.0,
            self._ready_first or end_lsn,
            spooled=self._ready_spooled,
        )
        self._ready_staged = []
        self._ready_spooled = []
        self._ready_txns = 0
        self._ready_first = None
        self._ready_end = None
        self._ready_since = None
        return batch
