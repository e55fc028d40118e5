"""The continuity rule: is the stream there now the one the claims were made on?

``check_stream`` compares what tidemark recorded about its stream
(``StreamRecord``) with what the source shows now (``ObservedStream``) and
answers with a ``Verdict``:

* ``continuous``: same system, same slot, and the slot is not beyond the highest
  flush tidemark ever sent. Postgres re-sends everything after the slot's
  position, and the sinks drop what they hold: resuming is exact. A new timeline
  with the slot still there (a promoted standby that had the slot, a PG 17
  failover slot) is the same stream, if the new timeline left the recorded one at
  or after everything tidemark holds (the fork LSN, from the timeline history).
* ``adopt``: nothing is claimed on the recorded stream (first start, or no shape
  has a backfill record), so whatever stream is there now becomes the record.
* ``gap``: something is claimed and the stream changed under it: another system,
  another slot name, the slot missing (dropped, lost in a failover, invalidated),
  or its ``confirmed_flush_lsn`` beyond what tidemark sent (recreated, advanced,
  or consumed by another client): changes in between never reached the shapes. Or a
  new timeline that forked below what tidemark holds (a standby promoted before it
  had everything tidemark received: those transactions exist only on the lost
  timeline, and the new one reuses their LSNs for other changes).

Pure: no IO; the caller observes and persists.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from tidemark.lsn import Lsn, format_lsn


@dataclass(frozen=True, slots=True)
class ObservedStream:
    """What the source shows now."""

    system_id: str  # IDENTIFY_SYSTEM systemid
    timeline: int
    slot: str
    slot_exists: bool
    confirmed_flush_lsn: int | None = None  # the slot's, when it exists
    slot_lost: bool = False  # wal_status = 'lost' (invalidated)
    slot_invalidation: str | None = None  # why, as Postgres says (PG 17+)
    # the observed timeline's history: (timeline, LSN where the next one began), oldest
    # first (``TIMELINE_HISTORY``; empty on timeline 1)
    history: tuple[tuple[int, int], ...] = ()

    def fork_from(self, timeline: int) -> int | None:
        """Where this stream's timeline left ``timeline`` (None: not an ancestor)."""
        return next((lsn for tli, lsn in self.history if tli == timeline), None)


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """The stream tidemark follows, and the highest flush it ever sent on it."""

    system_id: str
    timeline: int
    slot: str
    origin_lsn: int  # where tidemark created the slot, or first streamed from it (0: not yet)
    epoch: int  # grows by one each time a new stream is adopted
    sent_flush_lsn: int  # persisted before it is sent
    adopted_at: float

    def sent(self, flush_lsn: int) -> StreamRecord:
        return replace(self, sent_flush_lsn=max(self.sent_flush_lsn, flush_lsn))

    def to_json(self) -> dict[str, Any]:
        return {
            "system_id": self.system_id,
            "timeline": self.timeline,
            "slot": self.slot,
            "origin_lsn": self.origin_lsn,
            "origin_lsn_text": format_lsn(self.origin_lsn),
            "epoch": self.epoch,
            "sent_flush_lsn": self.sent_flush_lsn,
            "sent_flush_lsn_text": format_lsn(self.sent_flush_lsn),
            "adopted_at": self.adopted_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamRecord:
        return cls(
            str(data["system_id"]),
            int(data["timeline"]),
            str(data["slot"]),
            int(data["origin_lsn"]),
            int(data["epoch"]),
            int(data["sent_flush_lsn"]),
            float(data["adopted_at"]),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: Literal["continuous", "adopt", "gap"]
    reason: str = ""  # why (gap, adopt) or what changed harmlessly (continuous)


def check_stream(
    record: StreamRecord | None, observed: ObservedStream, claimed: bool, held: int = 0
) -> Verdict:
    """The verdict for resuming the claims on ``record`` with the stream ``observed``.

    ``claimed``: at least one shape holds a claim (a backfill record) on the record;
    ``held``: the highest LSN tidemark received and holds of it (tables' committed
    transactions; the record's sent flush counts too).
    """
    broken = _break(record, observed) or _fork(record, observed, held)
    if broken is None:
        if record is None:  # state written before streams were recorded
            return Verdict(
                "continuous",
                f"no stream was recorded yet: slot '{observed.slot}' is adopted as it is",
            )
        if record.timeline != observed.timeline:
            fork = observed.fork_from(record.timeline)
            where = "" if fork is None else f", forking at {format_lsn(fork)}"
            return Verdict(
                "continuous",
                f"the source's timeline changed from {record.timeline} to {observed.timeline} "
                f"(a promotion{where}) and slot '{observed.slot}' carried over at its position",
            )
        return Verdict("continuous")
    if not claimed:
        return Verdict("adopt", broken)
    return Verdict("gap", broken)


def _break(record: StreamRecord | None, observed: ObservedStream) -> str | None:
    """What separates ``observed`` from ``record`` (None: the same stream)."""
    slot = observed.slot
    if record is None:
        if observed.slot_exists and not observed.slot_lost:
            return None
        return f"no stream was recorded and replication slot '{slot}' does not exist"
    if record.system_id != observed.system_id:
        return (
            f"the source is another PostgreSQL system (system identifier {observed.system_id}, "
            f"recorded {record.system_id}): a different server or a restored copy"
        )
    if record.slot != slot:
        return f"the slot changed from '{record.slot}' to '{slot}'"
    if not observed.slot_exists and record.origin_lsn == 0:
        return None  # adopted while the slot did not exist yet: it is created next
    if not observed.slot_exists:
        return (
            f"replication slot '{slot}' does not exist any more (it was dropped, or lost in a "
            "failover)"
        )
    if observed.slot_lost:
        why = INVALIDATIONS.get(observed.slot_invalidation or "wal_removed")
        said = observed.slot_invalidation or "wal_status 'lost'"
        return f"replication slot '{slot}' was invalidated ({said}): {why or 'Postgres says so'}"
    confirmed = observed.confirmed_flush_lsn
    if confirmed is not None and confirmed > record.sent_flush_lsn:
        return (
            f"replication slot '{slot}' is at {format_lsn(confirmed)}, beyond the highest "
            f"position tidemark ever acknowledged ({format_lsn(record.sent_flush_lsn)}): it was "
            "recreated, advanced, or consumed by another client"
        )
    return None


INVALIDATIONS = {
    "wal_removed": "Postgres removed WAL it still needed (max_slot_wal_keep_size)",
    "idle_timeout": "it was unused longer than idle_replication_slot_timeout",
    "rows_removed": "the primary removed catalog rows it still needed",
    "wal_level_insufficient": "wal_level on the primary was lowered below logical",
}


def _fork(record: StreamRecord | None, observed: ObservedStream, held: int) -> str | None:
    """What a new timeline breaks (None: nothing): a timeline that does not descend
    from the recorded one, or that left it below what tidemark holds."""
    if record is None or record.timeline == observed.timeline:
        return None
    fork = observed.fork_from(record.timeline)
    if fork is None:
        return (
            f"the source is on timeline {observed.timeline}, which does not descend from "
            f"timeline {record.timeline} that tidemark followed (a standby restored from "
            "another backup, or timeline history files removed)"
        )
    highest = max(held, record.sent_flush_lsn)
    if highest > fork:
        return (
            f"the source was promoted onto timeline {observed.timeline}, which left timeline "
            f"{record.timeline} at {format_lsn(fork)}, but tidemark had received and holds "
            f"transactions of timeline {record.timeline} up to {format_lsn(highest)}: the "
            "promoted standby never had them (they exist only on the lost timeline and "
            "stay in the tables as phantoms, while the new timeline reuses their positions "
            "for other changes)"
        )
    return None


def parse_timeline_history(text: str) -> tuple[tuple[int, int], ...]:
    """A timeline history file: ``<timeline>\t<switch LSN>\t<reason>`` lines, comments
    (``#``) and blank lines skipped."""
    entries = []
    for line in text.splitlines():
        fields = line.split("\t") if "\t" in line else line.split()
        if not fields or not fields[0].strip() or fields[0].lstrip().startswith("#"):
            continue
        entries.append((int(fields[0]), int(Lsn.parse(fields[1].strip()))))
    return tuple(entries)


def gap_message(reason: str, shapes: list[str], *, policy_knob: str) -> str:
    """The error a ``fail`` policy stops with: what happened, and how to resync."""
    listed = ", ".join(shapes[:10]) + (f" and {len(shapes) - 10} more" if len(shapes) > 10 else "")
    return (
        f"stream gap: {reason}. Changes made in between never reached the shape tables, so "
        f"resuming would leave them silently incomplete (shapes: {listed}). To rebuild them "
        f"from a fresh snapshot of the source, start tidemark once with {policy_knob}; "
        "their tables stay readable meanwhile and are replaced atomically"
    )
