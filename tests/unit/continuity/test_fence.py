"""Snapshot visibility of stream transactions (the backfill seam)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.continuity.fence import SnapshotFence


def test_parse_takes_the_low_32_bits_of_xid8() -> None:
    epoch = 3 << 32
    fence = SnapshotFence.parse(f"{epoch + 100}:{epoch + 110}:{epoch + 104},{epoch + 107}", 77)
    assert (fence.xmin, fence.xmax, fence.xip, fence.lsn) == (100, 110, frozenset({104, 107}), 77)
    assert SnapshotFence.from_json(fence.to_json()) == fence


def test_visibility_follows_postgres_rules() -> None:
    fence = SnapshotFence(1000, xmin=100, xmax=110, xip=frozenset({104}))
    assert fence.visible(99) and fence.visible(100 - 50)
    assert fence.visible(103) and not fence.visible(104)  # in progress
    assert not fence.visible(110) and not fence.visible(500)
    # past the fence LSN nothing is skipped, whatever the xid
    assert fence.skips(999, 99) and not fence.skips(1000, 99)


def test_visibility_survives_xid_wraparound() -> None:
    fence = SnapshotFence(1000, xmin=2**32 - 5, xmax=3, xip=frozenset({1}))
    assert fence.visible(2**32 - 10)  # older, before the wrap
    assert fence.visible(2**32 - 2) and fence.visible(0) and fence.visible(2)
    assert not fence.visible(1)  # in progress
    assert not fence.visible(3) and not fence.visible(10)


@given(st.integers(0, 2**32 - 1), st.integers(0, 20), st.integers(0, 2**32 - 1))
def test_xids_from_xmax_on_are_never_visible(xmin: int, width: int, delta: int) -> None:
    xmax = (xmin + width) % 2**32
    fence = SnapshotFence(10, xmin=xmin, xmax=xmax, xip=frozenset())
    # xids in use are always less than 2^31 apart (Postgres stops before that)
    xid = (xmax + delta % (2**31 - 21)) % 2**32
    assert not fence.visible(xid)
