"""Where each tidemark instance keeps its state under a sink root.

An instance's state files (the shapes registry, the claims and the stream record of
``tidemark.continuity``, the frontiers of ``tidemark.sink.frontiers``) live in one
folder: ``<root>/_tidemark`` for the unnamed instance, and
``<root>/_tidemark/instances/<name>`` for an instance with an ``[instance] name``.

Locations only (a local path, or an ``s3://`` URI: ``tidemark.state.objectstore``), so the
state's owners (continuity, sink, shapes) all depend on it and on nothing of each
other's for it.
"""

from __future__ import annotations

from pathlib import Path

from tidemark.state.objectstore import Location, is_remote, join, listing

# below ``<root>/_tidemark``, beside the unnamed instance's state: what belongs to the
# root, not to an instance (its format, the named instances' folders, a SQLite Iceberg
# catalog, and the warm-ups' scratch objects of a root on a bucket: writers.job.warm_up)
ROOT_RECORDS = ("instances", "format.json", "iceberg.db", "warm")


def warm_dir(root: Location) -> Location:
    """Where the warm-ups of services on a bucket root write their made-up rounds."""
    return join(root, "_tidemark", "warm")


def state_dir(root: Location, instance: str = "") -> Location:
    """Where an instance keeps its state (registry, claims, stream, frontiers)."""
    base = join(root, "_tidemark")
    return join(base, "instances", instance) if instance else base


def instance_states(root: Location) -> dict[str, Location]:
    """Every instance's state folder under ``root`` ('' is the unnamed instance)."""
    base = state_dir(root)
    found: dict[str, Location] = {"": base}
    named = join(base, "instances")
    if is_remote(named):
        names = {item.name.split("/", 1)[0] for item in listing(named) if "/" in item.name}
        found |= {name: join(named, name) for name in sorted(names)}
    elif Path(named).is_dir():
        found |= {p.name: p for p in sorted(Path(named).iterdir()) if p.is_dir()}
    return found
