"""Partitioned tables: the partition tree, and the changes the stream does not show.

A shape may name a partitioned table. Its publication publishes the partitions'
changes as the root's (``publish_via_partition_root``), so the stream describes one
relation, and the backfill reads every leaf partition in one snapshot.

Some partition maintenance changes the root's rows without any change in the
stream: ``ATTACH PARTITION`` of a table that has rows, ``DETACH PARTITION`` and
``DROP`` of a partition, and ``TRUNCATE`` of a single partition (not replicated when
changes are published via the root). tidemark records the tree its snapshot saw
(``fingerprint``: every member's parent, the ``xmin`` of its ``pg_inherits`` row,
which a detach-and-attach renews, and each leaf's ``relfilenode``, which a truncate
or a rewrite renews) and compares it with the live tree (``tree_changes``):

* a partition gone, attached again, truncated or rewritten: the shape is rebuilt
  from a new snapshot (a resync), the only exact answer;
* a new partition: if it is empty, nothing was missed (every row it gets from now on
  is a change of the root, in the stream) and the recorded tree is just updated; if
  it has rows, they may predate its attachment, and the shape is resynced.
  A partition created with ``CREATE TABLE ... PARTITION OF`` ahead of its rows (the
  usual practice) therefore costs nothing.

The reads are SQL on ``pg_inherits``/``pg_class``, so inside a snapshot transaction
they see the tree as of that snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidemark.predicates.identifiers import format_identifier


@dataclass(frozen=True, slots=True)
class Member:
    """A partition (leaf or itself partitioned) below a partitioned table."""

    oid: int
    schema: str
    name: str
    kind: str  # pg_class.relkind: r leaf, p partitioned, f foreign
    filenode: int  # 0 for a partitioned member
    parent: int
    link: str  # xmin of its pg_inherits row: renewed by every (re)attachment
    replica_identity: str
    relpages: int
    reltuples: int
    can_select: bool = True  # the snapshot reads each leaf directly

    @property
    def qualified_name(self) -> str:
        return f"{format_identifier(self.schema)}.{format_identifier(self.name)}"

    @property
    def is_leaf(self) -> bool:
        return self.kind != "p"


def leaves(members: Sequence[Member]) -> list[Member]:
    return [m for m in members if m.is_leaf]


def fingerprint(members: Sequence[Member]) -> dict[str, list[Any]]:
    """What a later look at the tree compares with (JSON: kept with the shape's claim)."""
    return {
        str(m.oid): [m.parent, m.link, m.filenode if m.is_leaf else 0, m.qualified_name]
        for m in members
    }


@dataclass(frozen=True, slots=True)
class TreeChanges:
    resync: list[str]  # why the shape must be rebuilt (empty: it need not)
    added: list[Member]  # new leaves: rebuild only if one has rows


def tree_changes(before: Mapping[str, Sequence[Any]], now: Sequence[Member]) -> TreeChanges:
    """How the live tree ``now`` differs from the recorded ``before``."""
    current = fingerprint(now)
    reasons = []
    for oid, (parent, link, filenode, name) in before.items():
        seen = current.get(oid)
        if seen is None:
            reasons.append(f"partition {name} was detached or dropped")
        elif (seen[0], seen[1]) != (parent, link):
            reasons.append(f"partition {name} was detached and attached again")
        elif seen[2] != filenode:
            reasons.append(
                f"partition {name} was truncated or rewritten (a TRUNCATE of one partition "
                "is not replicated)"
            )
    added = [m for m in now if str(m.oid) not in before and m.is_leaf]
    return TreeChanges(reasons, added)


def identity_problem(root_name: str, needs_full: bool, members: Sequence[Member]) -> str | None:
    """Why the leaves' replica identities cannot serve a shape on the root (whose own
    identity the shape's checks already accepted), or None. Postgres sends a change's
    old row by the leaf's identity, and ``ALTER TABLE ... REPLICA IDENTITY`` on the root
    does not reach its partitions."""
    foreign = [m.qualified_name for m in members if m.kind == "f"]
    if foreign:
        return (
            f"partition(s) {', '.join(foreign)} of {root_name} are foreign tables, whose "
            "changes logical replication does not publish: define the shape on the other "
            "partitions, or detach the foreign ones"
        )
    hidden = [m.qualified_name for m in leaves(members) if not m.can_select]
    if hidden:
        grants = " ".join(f"GRANT SELECT ON {name} TO <tidemark's role>;" for name in hidden)
        return (
            f"our role cannot read partition(s) {', '.join(hidden)} of {root_name} (a "
            f"snapshot reads each partition; privileges on a partition are its own): {grants}"
        )
    if not needs_full:
        return None
    partial = [m for m in leaves(members) if m.replica_identity != "f"]
    if not partial:
        return None
    statements = " ".join(f"ALTER TABLE {m.qualified_name} REPLICA IDENTITY FULL;" for m in partial)
    return (
        f"{root_name} has REPLICA IDENTITY FULL but its partition(s) "
        f"{', '.join(m.qualified_name for m in partial)} do not, and Postgres sends old rows "
        f"by each partition's identity. Run: {statements}"
    )
