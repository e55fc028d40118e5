"""The continuity rule applied: at start, and on every replication (re)connection.

``decide_at_start`` runs before any shape is activated: on a gap it stops the
service (``on_stream_gap = "fail"``) with what happened and how to resync, or
ends every claim (``"resync"``) so each claimed shape is rebuilt from a snapshot
of the stream that is there now. ``check`` runs on every connection of the
replication client, before it creates a slot or streams: a gap found while
running stops the service (the next start applies the policy), never resumes.
A stream nothing is claimed on is simply adopted: its epoch is recorded, and
with it the slot's origin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import structlog

from tidemark.continuity.rule import (
    ObservedStream,
    StreamRecord,
    Verdict,
    check_stream,
    gap_message,
)
from tidemark.continuity.store import ContinuityStore
from tidemark.errors import StreamGapError
from tidemark.lsn import format_lsn

log = structlog.get_logger("tidemark.continuity")

Policy = Literal["fail", "resync"]
POLICY_KNOB = '[source] on_stream_gap = "resync" (or TIDEMARK_SOURCE__ON_STREAM_GAP=resync)'


class ContinuityGuard:
    def __init__(
        self,
        store: ContinuityStore,
        policy: Policy = "fail",
        held: Callable[[], int] = lambda: 0,
    ) -> None:
        self.store = store
        self.policy = policy
        # the highest LSN tidemark received and holds (tables, buffers): asked only
        # when the timeline changed, to compare with where the new one forked
        self.held = held
        self.last_verdict: Verdict | None = None

    def _verdict(self, observed: ObservedStream) -> Verdict:
        record = self.store.stream
        moved = record is not None and record.timeline != observed.timeline
        verdict = check_stream(
            record,
            observed,
            claimed=bool(self.store.claimed()),
            held=self.held() if moved else 0,
        )
        self.last_verdict = verdict
        return verdict

    def decide_at_start(self, observed: ObservedStream) -> None:
        verdict = self._verdict(observed)
        if verdict.kind == "gap":
            claimed = self.store.claimed()
            if self.policy == "fail":
                log.error("stream.gap", reason=verdict.reason, shapes=claimed, policy="fail")
                raise StreamGapError(gap_message(verdict.reason, claimed, policy_knob=POLICY_KNOB))
            log.warning("stream.gap", reason=verdict.reason, shapes=claimed, policy="resync")
            for name in claimed:
                self.store.invalidate(name, f"stream gap: {verdict.reason}")
            self.store.write_claims()  # before a slot is created or anything is sent
            verdict = Verdict("adopt", verdict.reason)
        self._apply(verdict, observed)

    def check(self, observed: ObservedStream) -> None:
        verdict = self._verdict(observed)
        if verdict.kind == "gap":
            claimed = self.store.claimed()
            log.error("stream.gap", reason=verdict.reason, shapes=claimed, policy="stop")
            raise StreamGapError(
                gap_message(verdict.reason, claimed, policy_knob=POLICY_KNOB)
                + " (found on reconnect: restart tidemark to apply the policy)"
            )
        self._apply(verdict, observed)

    def _apply(self, verdict: Verdict, observed: ObservedStream) -> None:
        record = self.store.stream
        if verdict.kind == "continuous":
            if record is None:
                self._adopt(observed, epoch=1)
            elif record.timeline != observed.timeline:
                log.warning("stream.timeline_changed", detail=verdict.reason)
                self.store.adopt(
                    StreamRecord(
                        record.system_id,
                        observed.timeline,
                        record.slot,
                        record.origin_lsn,
                        record.epoch,
                        record.sent_flush_lsn,
                        record.adopted_at,
                    )
                )
            return
        # adopt: nothing is claimed on the recorded stream; a slot that does not exist yet
        # is recorded with origin 0 (pending) and its origin set when it is created
        self._adopt(observed, epoch=(record.epoch + 1) if record else 1)

    def _adopt(self, observed: ObservedStream, epoch: int) -> None:
        usable = observed.slot_exists and not observed.slot_lost
        origin = (observed.confirmed_flush_lsn or 0) if usable else 0
        self.store.adopt(
            StreamRecord(
                observed.system_id,
                observed.timeline,
                observed.slot,
                origin,
                epoch,
                origin,
                time.time(),
            )
        )

    def slot_created(self, observed: ObservedStream, consistent_lsn: int) -> None:
        record = self.store.stream
        if record is not None and record.origin_lsn == 0 and record.slot == observed.slot:
            epoch = record.epoch  # adopted at start, waiting for this slot
        else:
            epoch = 1 if record is None else record.epoch + 1
        log.info("stream.new_slot", slot=observed.slot, origin_lsn=format_lsn(consistent_lsn))
        self.store.adopt(
            StreamRecord(
                observed.system_id,
                observed.timeline,
                observed.slot,
                consistent_lsn,
                epoch,
                consistent_lsn,
                time.time(),
            )
        )

    async def before_send(self, flush_lsn: int) -> None:
        await self.store.before_send(flush_lsn)
