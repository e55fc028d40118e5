"""Shape frontiers, persisted beside the tables (after Materialize's ``txns_progress``).

A shape's table is written only when the shape has changes, but its *logical*
frontier moves with the whole stream: a shape is complete up to ``F`` when every
transaction with commit LSN ``<= F`` that touches the shape is in its table. If the
FlushTracker holds nothing pending for the shape, ``F`` is the global durable LSN
``D``; otherwise it is at least ``D`` and at least the end of the last transaction
the shape fully committed.

The frontiers live in ``<root>/_tidemark/frontiers.json``, replaced atomically
(temp file, fsync, rename, fsync of the folder), so a reader needs neither the
service nor Postgres to ask "is shape X complete as of LSN L?". A frontier never
claims more than was committed when it was written: it is computed from the
tracker's notified value, which only follows durable commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tidemark.durable import write_atomically
from tidemark.errors import SinkError
from tidemark.lsn import format_lsn

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ShapeFrontier:
    frontier_lsn: int  # complete up to here (inclusive, by commit LSN)
    committed_lsn: int | None  # end LSN of the last committed batch
    ready: bool = True  # False while a backfill has not committed
    # the LSN of the snapshot the table was last rebuilt from: reading as of an
    # earlier LSN would miss rows (the older history was replaced)
    snapshot_lsn: int | None = None


@dataclass(frozen=True, slots=True)
class Frontiers:
    durable_lsn: int
    shapes: Mapping[str, ShapeFrontier] = field(default_factory=dict)
    updated_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": FORMAT_VERSION,
                "durable_lsn": self.durable_lsn,
                "durable_lsn_text": format_lsn(self.durable_lsn),
                "updated_at": self.updated_at,
                "shapes": {
                    name: {**asdict(f), "frontier_lsn_text": format_lsn(f.frontier_lsn)}
                    for name, f in sorted(self.shapes.items())
                },
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Frontiers:
        data = json.loads(text)
        if data.get("version") != FORMAT_VERSION:
            raise SinkError(
                f"frontiers file has version {data.get('version')!r}, expected {FORMAT_VERSION}"
            )
        shapes = {
            name: ShapeFrontier(
                int(v["frontier_lsn"]),
                None if v.get("committed_lsn") is None else int(v["committed_lsn"]),
                bool(v.get("ready", True)),
                None if v.get("snapshot_lsn") is None else int(v["snapshot_lsn"]),
            )
            for name, v in data.get("shapes", {}).items()
        }
        return cls(int(data["durable_lsn"]), shapes, float(data.get("updated_at", 0)))


def state_dir(root: str | Path) -> Path:
    return Path(root) / "_tidemark"


def frontiers_path(root: str | Path) -> Path:
    return state_dir(root) / "frontiers.json"


def load_frontiers(root: str | Path) -> Frontiers | None:
    path = frontiers_path(root)
    try:
        return Frontiers.from_json(path.read_text())
    except FileNotFoundError:
        return None


def store_frontiers(root: str | Path, frontiers: Frontiers) -> None:
    stamped = Frontiers(frontiers.durable_lsn, dict(frontiers.shapes), time.time())
    write_atomically(frontiers_path(root), stamped.to_json())
