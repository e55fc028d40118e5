"""Where each tidemark instance keeps its state under a sink root.

An instance's state files (the shapes registry, the claims and the stream record of
``tidemark.continuity``, the frontiers of ``tidemark.sink.frontiers``) live in one
folder: ``<root>/_tidemark`` for the unnamed instance, and
``<root>/_tidemark/instances/<name>`` for an instance with an ``[instance] name``.

A leaf: paths only, so the state's owners (continuity, sink, shapes) all depend on it
and on nothing of each other's for it.
"""

from __future__ import annotations

from pathlib import Path


def state_dir(root: str | Path, instance: str = "") -> Path:
    """Where an instance keeps its state (registry, claims, stream, frontiers)."""
    base = Path(root) / "_tidemark"
    return base / "instances" / instance if instance else base


def instance_states(root: str | Path) -> dict[str, Path]:
    """Every instance's state folder under ``root`` ('' is the unnamed instance)."""
    base = state_dir(root)
    found = {"": base}
    named = base / "instances"
    if named.is_dir():
        found |= {p.name: p for p in sorted(named.iterdir()) if p.is_dir()}
    return found
