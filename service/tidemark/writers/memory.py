"""What to stage so buffered rows stay within the memory budget.

Buffered bytes are counted from what the stream delivered (each change's message
size, charged to every shape it is routed to) plus a fixed per-row overhead, per
writer and in total; rows handed to a running job count until it ends.

Ready rows (committed transactions) leave memory by flushing. Open rows (a
transaction still being received) cannot be committed, so they leave memory by
*staging*: written to Parquet, not committed, and committed later with their
transaction. The rule:

* an open part of ``stage_bytes`` or more is staged whatever the total (a huge
  transaction never needs its size in RAM);
* when the total reaches the budget, the biggest open parts of all writers are
  staged, biggest first, until what is left would be under the budget, so one
  transaction spread over many shapes (each part under ``stage_bytes``) cannot
  fill the budget and wait forever for a flush that cannot happen.

Writers with a job running are skipped: their open rows are taken when the job
ends (and the stream waits meanwhile, which it may: the job frees memory).

Pure: no IO, no clock; the scheduler launches the jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class Charge:
    """Bytes buffered by every writer of a scheduler since it last summed them.

    Bytes enter a buffer only as appended rows (each charged here as ``Rows`` counts
    it); every other move (into a job, to Parquet, a commit) keeps or lowers the
    total. So the last exact sum plus ``added`` is an upper bound on what is buffered
    now, and while it is under the budget nobody needs the exact sum: that sum walks
    every writer, which at 1000 shapes cost a fifth of the event loop when it ran
    after every message batch."""

    __slots__ = ("added",)

    def __init__(self) -> None:
        self.added = 0


@dataclass(frozen=True, slots=True)
class OpenPart:
    """One writer's open rows, as the scheduler sees them."""

    shape: str
    open_bytes: int
    busy: bool  # a job runs for this writer now


def parts_to_stage(
    parts: Iterable[OpenPart], total_bytes: int, budget: int, stage_bytes: int
) -> list[str]:
    """The shapes whose open rows to stage now, in order."""
    free = [p for p in parts if not p.busy and p.open_bytes > 0]
    chosen = [p.shape for p in free if p.open_bytes >= stage_bytes]
    left = total_bytes - sum(p.open_bytes for p in free if p.shape in chosen)
    if left < budget:
        return chosen
    for part in sorted(free, key=lambda p: -p.open_bytes):
        if left < budget:
            break
        if part.shape in chosen:
            continue
        chosen.append(part.shape)
        left -= part.open_bytes
    return chosen
