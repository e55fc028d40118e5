"""Where a shape's snapshot ends and its stream begins.

A backfill reads the shape's rows in a REPEATABLE READ snapshot; its ``xmin``,
``xmax`` and in-progress xids (``pg_current_snapshot()``) say exactly which
transactions the snapshot already contains. A stream transaction is *visible* in
the snapshot (``xid < xmin``, or ``xid < xmax`` and not in progress) iff its
effects are in the snapshot's rows: the shape skips it. Every other transaction
is applied from the stream.

``lsn`` is ``pg_current_wal_lsn()`` read right after the snapshot was taken. A
transaction visible in the snapshot had committed (and written its commit record)
before that, so its commit LSN is below ``lsn``: from ``lsn`` on, nothing can be
visible and the fence lets everything through. The fence is persisted with the
backfill, so after a restart the stream below ``lsn`` is filtered exactly as
before (committed offsets alone cannot tell a skipped transaction from a missed
one near the snapshot).

Xids in pgoutput are 32 bits; ``pg_current_snapshot()`` gives 64-bit ``xid8``.
Comparisons are modulo 2^32, as Postgres's ``TransactionIdPrecedes`` (xids in use
are always within 2^31 of each other). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MASK = 0xFFFFFFFF


def _precedes(a: int, b: int) -> bool:
    """``a`` is an older xid than ``b`` (32-bit modular arithmetic)."""
    return ((a - b) & _MASK) >= 0x80000000


@dataclass(frozen=True, slots=True)
class SnapshotFence:
    lsn: int
    xmin: int  # 32-bit
    xmax: int  # 32-bit
    xip: frozenset[int]  # 32-bit

    @classmethod
    def parse(cls, snapshot_text: str, lsn: int) -> SnapshotFence:
        """From ``pg_current_snapshot()::text`` (``xmin:xmax:xip1,xip2``)."""
        try:
            xmin, xmax, xip = snapshot_text.split(":")
            ids = frozenset(int(x) & _MASK for x in xip.split(",") if x)
            return cls(lsn, int(xmin) & _MASK, int(xmax) & _MASK, ids)
        except ValueError as exc:
            raise ValueError(f"not a pg_snapshot: {snapshot_text!r}") from exc

    def visible(self, xid: int) -> bool:
        """The transaction's effects are in the snapshot."""
        xid &= _MASK
        if _precedes(xid, self.xmin):
            return True
        if not _precedes(xid, self.xmax):
            return False
        return xid not in self.xip

    def skips(self, commit_lsn: int, xid: int) -> bool:
        """The shape must not apply this stream transaction: the snapshot has it."""
        return commit_lsn < self.lsn and self.visible(xid)

    def to_json(self) -> dict[str, Any]:
        return {"lsn": self.lsn, "xmin": self.xmin, "xmax": self.xmax, "xip": sorted(self.xip)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotFence:
        return cls(
            int(data["lsn"]),
            int(data["xmin"]),
            int(data["xmax"]),
            frozenset(int(x) for x in data["xip"]),
        )
