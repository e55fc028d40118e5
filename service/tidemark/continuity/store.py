"""The one home of the continuity facts, persisted under ``<root>/_tidemark/``.

``stream.json``
    the ``StreamRecord``: the source system and timeline, the slot, its origin,
    the epoch, and the highest flush LSN ever sent. ``before_send(flush)`` writes
    it (fsync, atomic replace) *before* the replication client sends ``flush``.
``claims.json``
    per shape, the claim of its last committed backfill: the snapshot's fence (the
    stream must keep skipping what the snapshot holds below its LSN), the snapshot
    LSN, the row count, since when it holds, and the stream epoch it was made on;
    and per shape the last invalidation (when, why), kept after the claim is gone
    so an operator can see it.

Invalidation is immediate in memory (the shape is no longer claimed from that
moment) and durable before anything is acknowledged past it: ``before_send``
writes pending invalidations first, and nothing is sent to Postgres without it.

A crash at any point leaves the old file or the new one for each (atomic
replace); the worst outcome is a claim that is missing (the shape is backfilled
again, replacing the same rows), never a claim that outlived its invalidation
once an acknowledgement past it was sent.

Thread-safety: mutations happen on the event loop; writes may run in a worker
thread. A lock guards the in-memory state; files are written in version order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from tidemark.continuity.fence import SnapshotFence
from tidemark.continuity.rule import StreamRecord
from tidemark.errors import ConfigError
from tidemark.lsn import format_lsn
from tidemark.state import fencing, objectstore
from tidemark.state.instance_state import state_dir
from tidemark.state.objectstore import Location, join

log = structlog.get_logger("tidemark.continuity")

FORMAT_VERSION = 2


@dataclass(frozen=True, slots=True)
class Claim:
    """A shape's table holds the snapshot at ``fence.lsn`` plus the stream after it."""

    fence: SnapshotFence
    rows: int
    since: float  # when the backfill committed
    epoch: int | None  # the stream epoch it was made on (None: before epochs)
    # a partitioned table's tree as the snapshot saw it (``shapes.partitions``), and as
    # later checks accepted it; None for other tables
    partitions: dict[str, list[Any]] | None = None

    @property
    def snapshot_lsn(self) -> int:
        return self.fence.lsn

    def to_json(self) -> dict[str, Any]:
        return {
            "fence": self.fence.to_json(),
            "snapshot_lsn_text": format_lsn(self.fence.lsn),
            "rows": self.rows,
            "since": self.since,
            "epoch": self.epoch,
            **({} if self.partitions is None else {"partitions": self.partitions}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Claim:
        epoch = data.get("epoch")
        return cls(
            SnapshotFence.from_json(data["fence"]),
            int(data["rows"]),
            float(data.get("since", data.get("finished_at", 0.0))),
            None if epoch is None else int(epoch),
            data.get("partitions"),
        )


@dataclass(frozen=True, slots=True)
class Invalidation:
    at: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "reason": self.reason}


def _compact(value: Any) -> str:
    """JSON without spaces: Python's C encoder (an indented dump is the pure-Python
    one, 7x slower)."""
    return json.dumps(value, separators=(",", ":"))


class ContinuityStore:
    def __init__(self, root: Location, instance: str = "") -> None:
        folder = state_dir(root, instance)
        self.folder = folder
        self.stream_path = join(folder, "stream.json")
        self.claims_path = join(folder, "claims.json")
        self._legacy_path = join(folder, "backfills.json")
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._claims: dict[str, Claim] = {}
        self._claim_texts: dict[str, tuple[Claim, str]] = {}  # JSON of each, as written
        self._invalidations: dict[str, Invalidation] = {}
        self.stream: StreamRecord | None = None
        self.invalidations_total = 0  # claims ended by this process (metrics)
        self._claims_version = 0
        self._claims_written = 0
        self._stream_version = 0
        self._stream_written = 0
        self._load()

    # -- loading ------------------------------------------------------------

    def reload(self) -> None:
        """Read the state again (a standby taking over what the old leader left)."""
        with self._lock:
            self._claims.clear()
            self._invalidations.clear()
            self.stream = None
            self._claims_version = self._claims_written = 0
            self._stream_version = self._stream_written = 0
            self._load()

    def _load(self) -> None:
        try:
            stream = objectstore.read_text(self.stream_path)
            if stream is not None:
                self.stream = StreamRecord.from_json(json.loads(stream))
            claims = objectstore.read_text(self.claims_path)
            legacy = None if claims is not None else objectstore.read_text(self._legacy_path)
            if claims is not None:
                data = json.loads(claims)
                if int(data.get("version", 0)) > FORMAT_VERSION:
                    raise ConfigError(
                        f"{self.claims_path} was written by a newer tidemark "
                        f"(format {data.get('version')}): upgrade tidemark"
                    )
                for name, entry in data.get("claims", {}).items():
                    self._claims[name] = Claim.from_json(entry)
                for name, entry in data.get("invalidations", {}).items():
                    self._invalidations[name] = Invalidation(float(entry["at"]), entry["reason"])
            elif legacy is not None:  # round 1: backfills.json, no epochs
                data = json.loads(legacy)
                for name, entry in data.get("shapes", {}).items():
                    self._claims[name] = Claim.from_json(entry)
                self._claims_version = 1  # rewrite as claims.json on the next write
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"the continuity state under {self.folder} is unreadable ({exc}): "
                "restore it, or move the folder away to rebuild every shape from a snapshot"
            ) from exc

    # -- reading ------------------------------------------------------------

    def claim(self, shape: str) -> Claim | None:
        return self._claims.get(shape)

    def claimed(self) -> list[str]:
        return sorted(self._claims)

    def last_invalidation(self, shape: str) -> Invalidation | None:
        return self._invalidations.get(shape)

    @property
    def epoch(self) -> int:
        return self.stream.epoch if self.stream is not None else 1

    # -- changes (event loop) -----------------------------------------------

    def record_claim(
        self,
        shape: str,
        fence: SnapshotFence,
        rows: int,
        partitions: dict[str, list[Any]] | None = None,
    ) -> Claim:
        """The shape's backfill committed: it now claims the stream from its fence on.
        Call on the event loop (so an invalidation is never overtaken by it), then
        ``write_claims`` to make it durable."""
        claim = Claim(fence, rows, time.time(), self.epoch, partitions)
        with self._lock:
            self._claims[shape] = claim
            self._claims_version += 1
        log.info("claim.recorded", shape=shape, snapshot_lsn=format_lsn(fence.lsn), rows=rows)
        return claim

    def accept_partitions(self, shape: str, claim: Claim, partitions: dict[str, list[Any]]) -> bool:
        """The partition tree changed in a way the claim survives (a new empty
        partition): record it, unless the claim ended meanwhile. Then ``write_claims``."""
        with self._lock:
            if self._claims.get(shape) is not claim:
                return False
            self._claims[shape] = dataclasses.replace(claim, partitions=partitions)
            self._claims_version += 1
        return True

    def invalidate(self, shape: str, reason: str) -> bool:
        """End ``shape``'s claim now (in memory); durable before the next acknowledgement.
        Returns whether there was a claim."""
        with self._lock:
            had = self._claims.pop(shape, None) is not None
            self._invalidations[shape] = Invalidation(time.time(), reason)
            self._claims_version += 1
        if had:
            self.invalidations_total += 1
            log.warning("claim.invalidated", shape=shape, reason=reason)
        return had

    def forget(self, shape: str) -> None:
        """The shape is gone for good: drop its claim and its history."""
        with self._lock:
            self._claims.pop(shape, None)
            self._invalidations.pop(shape, None)
            self._claims_version += 1

    def adopt(self, record: StreamRecord) -> None:
        """Follow a new stream from now on (durable when this returns)."""
        with self._lock:
            self.stream = record
            self._stream_version += 1
        self.write_stream()
        log.info(
            "stream.adopted",
            epoch=record.epoch,
            system_id=record.system_id,
            timeline=record.timeline,
            slot=record.slot,
            origin_lsn=format_lsn(record.origin_lsn),
        )

    # -- persistence --------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return self._claims_version != self._claims_written

    def write_claims(self) -> None:
        # one write at a time, of the newest claims: a caller that waited for the write
        # before it finds its changes written already (at 1000 new shapes, backfills
        # that commit together share a write)
        with self._write_lock:
            with self._lock:
                version = self._claims_version
                if version <= self._claims_written:
                    return
                text = self._claims_text()
            objectstore.replace(self.claims_path, text, check=fencing.check)
            self._claims_written = version
        if isinstance(self._legacy_path, Path) and self._legacy_path.exists():
            with contextlib.suppress(OSError):
                self._legacy_path.unlink()

    def _claims_text(self) -> str:
        """The text json.dumps(..., separators=(",", ":")) gives for the whole document,
        made of each claim's text kept from the write before (at 1000 new shapes each
        backfill writes the file: encoding every claim each time was 6 ms a write, most
        of the start-up's Python time). Under ``_lock``."""
        texts: dict[str, tuple[Claim, str]] = {}
        for name, claim in self._claims.items():
            kept = self._claim_texts.get(name)
            if kept is None or kept[0] is not claim:
                kept = (claim, _compact(claim.to_json()))
            texts[name] = kept
        self._claim_texts = texts
        claims = ",".join(f"{_compact(n)}:{texts[n][1]}" for n in sorted(texts))
        invalidations = _compact({n: i.to_json() for n, i in sorted(self._invalidations.items())})
        return (
            f'{{"version":{_compact(FORMAT_VERSION)},"claims":{{{claims}}},'
            f'"invalidations":{invalidations}}}'
        )

    def write_stream(self) -> None:
        with self._lock:
            version, record = self._stream_version, self.stream
        if record is None:
            return
        with self._write_lock:
            if version <= self._stream_written:
                return
            objectstore.replace(
                self.stream_path, json.dumps(record.to_json(), indent=1), check=fencing.check
            )
            self._stream_written = version

    def _note_sent(self, flush_lsn: int) -> bool:
        with self._lock:
            record = self.stream
            if record is None or flush_lsn <= record.sent_flush_lsn:
                return False
            self.stream = record.sent(flush_lsn)
            self._stream_version += 1
            return True

    async def before_send(self, flush_lsn: int) -> None:
        """Make every invalidation, and ``flush_lsn`` as the highest flush ever sent,
        durable; the replication client awaits this before it sends ``flush_lsn``."""
        self._note_sent(flush_lsn)
        if self.dirty:
            await asyncio.to_thread(self.write_claims)
        # whatever is noted and not yet written: an earlier call may have noted this
        # flush and been cancelled before its write ran (the sender stopped), and the
        # final update of the same flush must not be sent unwritten
        if self._stream_pending():
            await asyncio.to_thread(self.write_stream)

    def _stream_pending(self) -> bool:
        with self._lock:
            return self._stream_version != self._stream_written
