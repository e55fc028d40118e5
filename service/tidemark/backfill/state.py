"""Which shapes have their backfill committed, and with which snapshot fence.

``<root>/_tidemark/backfills.json`` (replaced atomically) maps a shape to its last
committed backfill: the fence the stream must keep applying below its LSN, and
counts. It is written *after* the backfill's Delta commit: a crash in between
only makes the next start backfill the shape again, which replaces the same data.
A shape without an entry (new, or interrupted mid-backfill) is backfilled at start.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemark.backfill.fence import SnapshotFence
from tidemark.durable import write_atomically
from tidemark.sink.frontiers import state_dir


@dataclass(frozen=True, slots=True)
class BackfillRecord:
    fence: SnapshotFence
    rows: int
    finished_at: float


class BackfillState:
    def __init__(self, root: str | Path) -> None:
        self.path = state_dir(root) / "backfills.json"
        self._records: dict[str, BackfillRecord] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            for name, entry in data.get("shapes", {}).items():
                self._records[name] = BackfillRecord(
                    SnapshotFence.from_json(entry["fence"]),
                    int(entry["rows"]),
                    float(entry["finished_at"]),
                )

    def get(self, shape: str) -> BackfillRecord | None:
        return self._records.get(shape)

    def done(self, shape: str, fence: SnapshotFence, rows: int) -> None:
        self._records[shape] = BackfillRecord(fence, rows, time.time())
        self._store()

    def forget(self, shape: str) -> None:
        if self._records.pop(shape, None) is not None:
            self._store()

    def _store(self) -> None:
        data: dict[str, Any] = {
            "version": 1,
            "shapes": {
                name: {"fence": r.fence.to_json(), "rows": r.rows, "finished_at": r.finished_at}
                for name, r in sorted(self._records.items())
            },
        }
        write_atomically(self.path, json.dumps(data, indent=2))
