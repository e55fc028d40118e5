"""Shape frontiers, persisted beside the tables (after Materialize's ``txns_progress``).

A shape's table is written only when the shape has changes, but its *logical*
frontier moves with the whole stream: a shape is complete up to ``F`` when every
transaction with commit LSN ``<= F`` that touches the shape is in its table. It is
the shape's own: if the FlushTracker holds nothing pending for the shape, ``F`` is
how far the stream has been processed (every transaction up to there was routed, and
the shape committed what it got), at least the global durable LSN ``D``; otherwise
it is just below the oldest transaction the shape has not committed. Another shape
that holds ``D`` back (one in error, say) does not hold ``F``.

The frontiers live in ``<root>/_tidemark/frontiers.json`` (an instance with an
``[instance] name`` keeps its state, these included, under
``<root>/_tidemark/instances/<name>/``), replaced atomically
(temp file, fsync, rename, fsync of the folder), so a reader needs neither the
service nor Postgres to ask "is shape X complete as of LSN L?". A frontier never
claims more than was committed when it was written: a shape leaves the tracker's
pending set only on its writers' flush notices, which follow durable commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from tidemark.errors import SinkError
from tidemark.lsn import format_lsn
from tidemark.state import fencing, objectstore
from tidemark.state.instance_state import instance_states, state_dir
from tidemark.state.objectstore import Location, join

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


def frontiers_path(root: Location, instance: str = "") -> Location:
    return join(state_dir(root, instance), "frontiers.json")


def _load(path: Location) -> Frontiers | None:
    text = objectstore.read_text(path)
    return None if text is None else Frontiers.from_json(text)


def load_frontiers(root: Location, instance: str | None = None) -> Frontiers | None:
    """One instance's frontiers, or (``instance=None``) every instance's shapes in one
    view, whose ``durable_lsn`` is the lowest of theirs."""
    if instance is not None:
        return _load(frontiers_path(root, instance))
    states = instance_states(root).values()
    parts = [f for p in states if (f := _load(join(p, "frontiers.json")))]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    shapes: dict[str, ShapeFrontier] = {}
    for part in parts:
        shapes.update(part.shapes)
    return Frontiers(min(p.durable_lsn for p in parts), shapes, max(p.updated_at for p in parts))


def store_frontiers(root: Location, frontiers: Frontiers, instance: str = "") -> None:
    stamped = Frontiers(frontiers.durable_lsn, dict(frontiers.shapes), time.time())
    objectstore.replace(frontiers_path(root, instance), stamped.to_json(), check=fencing.check)
