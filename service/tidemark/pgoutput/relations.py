"""The relations a replication stream has described so far, by oid.

pgoutput sends a Relation message before the first change of a table in a session and
again after every DDL that alters it; changes refer to the table by oid only.
``RelationCache`` keeps the latest Relation per oid.

Promise: ``get(oid)`` returns the most recent Relation received for ``oid`` or raises
``ProtocolError`` naming the oid; it never guesses a layout. The cache lives as long
as one replication connection: a new connection resends every Relation it needs.
"""

from __future__ import annotations

from tidemark.errors import ProtocolError
from tidemark.pgoutput.messages import Relation

__all__ = ["RelationCache"]


class RelationCache:
    """Latest ``Relation`` per relation oid."""

    __slots__ = ("_relations",)

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}

    def update(self, relation: Relation) -> None:
        """Record a Relation message, replacing the previous one for its oid."""
        self._relations[relation.oid] = relation

    def get(self, oid: int) -> Relation:
        """The latest Relation for ``oid``; ``ProtocolError`` if none was received."""
        try:
            return self._relations[oid]
        except KeyError:
            raise ProtocolError(
                f"change for relation oid {oid} arrived before its Relation message; "
                "pgoutput always describes a relation first, so the stream was read from "
                "the middle or the relation cache was reset mid-connection"
            ) from None

    def __contains__(self, oid: object) -> bool:
        return oid in self._relations

    def __len__(self) -> int:
        return len(self._relations)
