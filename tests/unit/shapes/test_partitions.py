"""Partitioned tables: what a change of the partition tree means for a shape, the
leaves' replica identities, and the snapshot's chunks per partition."""

from __future__ import annotations

from tidemark.backfill.reader import Snapshot, plan_snapshot_chunks, snapshot_query
from tidemark.continuity.fence import SnapshotFence
from tidemark.pgoutput import messages as m
from tidemark.shapes.model import ShapeDefinition, bind
from tidemark.shapes.partitions import Member, fingerprint, identity_problem, tree_changes


def member(oid: int, name: str, *, parent: int = 1, link: str = "500", filenode: int = 0,
           kind: str = "r", identity: str = "f", pages: int = 10) -> Member:  # fmt: skip
    return Member(oid, "public", name, kind, filenode or oid * 10, parent, link, identity, pages, 0)


JAN, FEB = member(2, "ev_jan"), member(3, "ev_feb")
RECORDED = fingerprint([JAN, FEB])


def test_an_unchanged_tree_needs_nothing() -> None:
    changes = tree_changes(RECORDED, [FEB, JAN])
    assert changes.resync == [] and changes.added == []


def test_a_partition_gone_detached_and_attached_again_or_truncated_needs_a_resync() -> None:
    assert tree_changes(RECORDED, [FEB]).resync == [
        "partition public.ev_jan was detached or dropped"
    ]
    reattached = member(2, "ev_jan", link="900")
    assert tree_changes(RECORDED, [reattached, FEB]).resync == [
        "partition public.ev_jan was detached and attached again"
    ]
    truncated = member(2, "ev_jan", filenode=77)
    (reason,) = tree_changes(RECORDED, [truncated, FEB]).resync
    assert reason.startswith("partition public.ev_jan was truncated or rewritten")


def test_a_new_leaf_is_reported_for_a_look_at_its_rows_and_a_new_parent_is_not() -> None:
    mar = member(4, "ev_mar")
    sub = member(5, "ev_apr", kind="p")
    changes = tree_changes(RECORDED, [JAN, FEB, mar, sub])
    assert changes.resync == [] and changes.added == [mar]
    # once accepted, the new tree is the reference
    assert tree_changes(fingerprint([JAN, FEB, mar, sub]), [JAN, FEB, mar, sub]).added == []


def test_under_replica_identity_full_every_leaf_needs_it_too() -> None:
    plain = member(4, "ev_mar", identity="d")
    problem = identity_problem("public.ev", True, [JAN, plain])
    assert problem is not None and "ALTER TABLE public.ev_mar REPLICA IDENTITY FULL;" in problem
    assert identity_problem("public.ev", False, [JAN, plain]) is None
    foreign = member(6, "ev_remote", kind="f")
    problem = identity_problem("public.ev", False, [JAN, foreign])
    assert problem is not None and "foreign" in problem


def test_a_partitioned_snapshot_is_read_leaf_by_leaf_with_only() -> None:
    sub = member(5, "ev_2027", kind="p")
    snapshot = Snapshot(
        SnapshotFence(1, 1, 1, frozenset()),
        "s",
        0,
        0,
        (JAN, member(3, "ev_feb", pages=5000), sub),
        partitioned=True,
    )
    chunks = plan_snapshot_chunks(snapshot, pages_per_chunk=2048)
    assert [(c.table, c.first_page, c.end_page) for c in chunks] == [
        (("public", "ev_jan"), 0, None),
        (("public", "ev_feb"), 0, 2048),
        (("public", "ev_feb"), 2048, 4096),
        (("public", "ev_feb"), 4096, None),
    ]
    relation = m.Relation(1, "public", "ev", "f", (m.RelationColumn("id", 23, -1, True),))
    shape = bind(ShapeDefinition(name="s", table="public.ev"), relation, ["id"])
    query = snapshot_query(shape, chunks[1]).as_string(None)
    assert 'from only "public"."ev_feb" where ctid >= ' in query
    # a partitioned table without partitions has nothing to read
    empty = Snapshot(SnapshotFence(1, 1, 1, frozenset()), "s", 0, 0, (), partitioned=True)
    assert plan_snapshot_chunks(empty) == []


def test_a_partition_our_role_cannot_read_needs_its_own_grant() -> None:
    hidden = Member(7, "public", "ev_secret", "r", 70, 1, "500", "f", 1, 0, can_select=False)
    problem = identity_problem("public.ev", False, [JAN, hidden])
    assert problem is not None
    assert "GRANT SELECT ON public.ev_secret TO <tidemark's role>;" in problem
