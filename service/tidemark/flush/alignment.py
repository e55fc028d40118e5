"""Writer-side alignment of flushed offsets to transaction boundaries.

A shape sees only some changes of a transaction, so the last row its writer writes
for transaction ``T`` is usually not ``T``'s last offset, and the FlushTracker would
never see the shape catch up. Each writer therefore keeps the seed's mapping
"last offset this writer wrote in ``T`` -> ``T``'s ``last_log_offset``" and translates
its flush notices:

* ``on_flushed(f)`` drops every entry whose written offset is ``<= f``. If the last
  one dropped was written exactly at ``f``, the writer has flushed all of that
  transaction: report its ``last_log_offset``. Otherwise ``f`` lies inside a
  transaction: report ``f`` as is (the tracker then confirms only the transactions
  before it).
* A transaction that reached this writer but left no row (everything already in the
  sink or in its snapshot) is flushed as far as this writer is concerned. When the
  writer has nothing unflushed, ``end_txn`` reports the transaction's last offset at
  once; otherwise the newest entry is relabelled so the flush that covers it reports
  this transaction's end. (A transaction the collector never routed to this writer
  is not tracked for its shape at all.)
* The tracker learns about a transaction only from its commit. A flush that covers
  rows of a transaction still open here (fragments received, commit not yet) is held:
  the part covering closed transactions is reported now (their boundary), and the
  offset itself is aligned and reported by ``end_txn``.

Usage, per writer: ``begin_txn()`` when the first fragment of a transaction routed to
it arrives; ``record_written(offset)`` with the offset of rows it buffered (per row or
once per fragment with the highest one, offsets strictly increasing);
``end_txn(txn.last_log_offset)`` on the commit, *after* the tracker has handled that
commit; ``on_flushed(offset)`` when the sink has durably committed everything up to
``offset``. Every ``LogOffset`` returned goes to
``FlushTracker.handle_flush_notification(shape, offset)``; None means nothing to
report. Returned offsets strictly increase and never pass the last ``end_txn``.

Pure and single-owner, like the tracker.
"""

from __future__ import annotations

from bisect import bisect_right

from tidemark.errors import InvariantViolation
from tidemark.lsn import LogOffset


class TxnAlignment:
    """One writer's map from its written offsets to transaction boundaries."""

    __slots__ = (
        "_ends",
        "_flushed",
        "_head",
        "_held",
        "_in_txn",
        "_last_boundary",
        "_last_written",
        "_open_first",
        "_open_last",
        "_written_before_txn",
        "_wrote",
    )

    def __init__(self) -> None:
        # Entry i: the last offset written in transaction T (``_wrote[i]``) and T's
        # last_log_offset (``_ends[i]``), oldest first. Live entries start at
        # ``_head``: a flush drops a prefix found by bisection (written offsets
        # increase), and the lists are cut only now and then, so a shape that gets a
        # row in every one of many small transactions costs no per-entry work when a
        # flush covers thousands of them.
        self._wrote: list[LogOffset] = []
        self._ends: list[LogOffset] = []
        self._head = 0
        self._in_txn = False
        self._open_first: LogOffset | None = None
        self._open_last: LogOffset | None = None
        self._last_written: LogOffset | None = None
        self._last_boundary: LogOffset | None = None
        self._flushed: LogOffset | None = None
        self._held: LogOffset | None = None
        self._written_before_txn: LogOffset | None = None

    def begin_txn(self) -> None:
        """The first fragment of a transaction routed to this writer arrived."""
        if self._in_txn:
            raise InvariantViolation(
                "TxnAlignment.begin_txn called while a transaction is open: call end_txn "
                "on its commit first (one transaction at a time per writer)"
            )
        self._in_txn = True
        self._written_before_txn = self._last_written

    def abort_txn(self) -> None:
        """Forget the open transaction: the stream restarted and will send it again.

        Its rows were never committed (writers commit at transaction boundaries), so
        nothing of it was reported; a notice held for it is dropped with it.
        """
        if not self._in_txn:
            return
        self._in_txn = False
        self._open_first = None
        self._open_last = None
        self._last_written = self._written_before_txn
        self._held = None

    def record_written(self, offset: LogOffset) -> None:
        """The writer buffered rows of the open transaction up to ``offset``."""
        if not self._in_txn:
            raise InvariantViolation(
                f"TxnAlignment.record_written({offset}) outside a transaction: call "
                "begin_txn when the transaction's first fragment arrives"
            )
        if self._last_written is not None and offset <= self._last_written:
            raise InvariantViolation(
                f"written offset {offset} is not after the previous one "
                f"{self._last_written}: rows must be recorded in stream order, once"
            )
        if self._open_first is None:
            self._open_first = offset
        self._open_last = offset
        self._last_written = offset

    def end_txn(
        self, txn_last_offset: LogOffset, wrote: LogOffset | None = None
    ) -> LogOffset | None:
        """The open transaction committed; its ``last_log_offset`` is ``txn_last_offset``.

        Must be the same offset the FlushTracker got for this transaction, and the
        tracker must have handled the commit already. Returns what to report now.
        ``wrote``: the offset of the last row buffered in it, when not passed to
        ``record_written`` yet (one call per transaction and writer instead of two).
        """
        if wrote is not None:
            self.record_written(wrote)
        if not self._in_txn:
            raise InvariantViolation(
                f"TxnAlignment.end_txn({txn_last_offset}) without an open transaction: "
                "call begin_txn when the transaction's first fragment arrives"
            )
        if self._last_boundary is not None and txn_last_offset <= self._last_boundary:
            raise InvariantViolation(
                f"transaction end {txn_last_offset} is not after the previous one "
                f"{self._last_boundary}: transactions must end in commit order"
            )
        wrote = self._open_last
        if wrote is not None and wrote > txn_last_offset:
            raise InvariantViolation(
                f"row written at {wrote} lies after its transaction's end "
                f"{txn_last_offset}: pass the transaction's last_log_offset"
            )
        self._in_txn = False
        self._open_first = None
        self._open_last = None
        self._last_boundary = txn_last_offset
        if wrote is not None:
            self._wrote.append(wrote)
            self._ends.append(txn_last_offset)
        held = self._held
        if held is not None:
            self._held = None
            return self._align(held)
        if wrote is None:
            if self._head == len(self._wrote):
                return txn_last_offset
            self._ends[-1] = txn_last_offset
        return None

    def on_flushed(self, flushed: LogOffset) -> LogOffset | None:
        """The sink durably committed every row written up to ``flushed``.

        A notice not above the previous one is a repeat and reports nothing.
        """
        if self._last_written is None or flushed > self._last_written:
            raise InvariantViolation(
                f"flush notice at {flushed} is beyond the last written offset "
                f"{self._last_written}: report only offsets of rows passed to record_written"
            )
        if self._flushed is not None and flushed <= self._flushed:
            return None
        self._flushed = flushed
        if self._open_first is not None and flushed >= self._open_first:
            # Rows of the open transaction are flushed, but the tracker has not seen its
            # commit yet: report only the closed transactions now.
            self._held = flushed
            if self._head == len(self._wrote):
                return None
            closed = self._ends[-1]
            self._drop(len(self._wrote))
            return closed
        return self._align(flushed)

    @property
    def in_txn(self) -> bool:
        return self._in_txn

    @property
    def is_idle(self) -> bool:
        """Nothing written is unflushed and no transaction is open."""
        return self._head == len(self._wrote) and not self._in_txn and self._held is None

    def _align(self, flushed: LogOffset) -> LogOffset:
        wrote = self._wrote
        cut = bisect_right(wrote, flushed, self._head)
        if cut == self._head:
            return flushed
        last = cut - 1
        aligned = self._ends[last] if wrote[last] == flushed else flushed
        self._drop(cut)
        return aligned

    def _drop(self, cut: int) -> None:
        """Entries before ``cut`` are flushed: move the head, cut the lists when most
        of them is dead."""
        if cut == len(self._wrote):
            self._wrote.clear()
            self._ends.clear()
            self._head = 0
        elif cut > 4096 and 2 * cut > len(self._wrote):
            del self._wrote[:cut]
            del self._ends[:cut]
            self._head = 0
        else:
            self._head = cut
