"""The replication monitor of a leader deposed while alive (``tidemark.state.fencing``): the
slot's confirmed position is the new leader's, beyond the old one's durable frontier by
right, and is not reported as a violation of "nothing acknowledged early"."""

from __future__ import annotations

import asyncio
import time

from tidemark.replication.monitor import ReplicationMonitor, ReplicationSample


def _sample(confirmed: int) -> ReplicationSample:
    return ReplicationSample(
        taken_at=time.time(),
        current_wal_lsn=confirmed + 100,
        walsender_pid=None,
        write_lsn=None,
        flush_lsn=None,
        replay_lsn=None,
        reply_time=None,
        replay_lag_s=None,
        confirmed_flush_lsn=confirmed,
        restart_lsn=confirmed,
        wal_status="reserved",
        safe_wal_size=None,
        slot_active=True,
    )


def _kinds(slot_ours: bool) -> list[str]:
    monitor = ReplicationMonitor(
        "postgresql://unused",
        "tm",
        walsender_pid=lambda: None,
        sent_history=list,
        durable_frontier=lambda: 1000,
        slot_ours=lambda: slot_ours,
    )

    async def sample() -> ReplicationSample:
        return _sample(5000)  # confirmed beyond our durable frontier

    monitor.sample = sample  # type: ignore[method-assign]
    asyncio.run(monitor.poll_once())
    return [v.kind for v in monitor.state.recent_violations]


def test_an_ack_beyond_our_frontier_is_a_violation_while_the_slot_is_ours() -> None:
    assert _kinds(slot_ours=True) == ["ack_beyond_durable"]


def test_the_new_leaders_ack_is_no_violation_of_the_deposed_one() -> None:
    assert _kinds(slot_ours=False) == []
