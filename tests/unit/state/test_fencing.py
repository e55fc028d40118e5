"""The fence of one process (``tidemark.state.fencing``): the epoch file, deposed, suspended."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tidemark.state import fencing


def test_each_new_leader_raises_the_epoch_by_one(tmp_path: Path) -> None:
    assert fencing.read_epoch(tmp_path) == 0
    assert fencing.advance(tmp_path, "a") == 1
    assert fencing.advance(tmp_path, "b") == 2
    assert fencing.read_epoch(tmp_path) == 2


def test_a_damaged_epoch_file_is_a_clear_error(tmp_path: Path) -> None:
    fencing.leader_path(tmp_path).parent.mkdir()
    fencing.leader_path(tmp_path).write_text("{not json")
    with pytest.raises(fencing.SinkError, match="remove it"):
        fencing.read_epoch(tmp_path)


def test_a_newer_epoch_deposes_once_and_for_good(tmp_path: Path) -> None:
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "old"))
    heard: list[str] = []
    fence.on_deposed(heard.append)
    fence.check()  # our own epoch: fine
    fencing.advance(tmp_path, "new")
    with pytest.raises(fencing.Deposed, match="epoch 2"):
        fence.check()
    with pytest.raises(fencing.Deposed):
        fence.check()
    assert len(heard) == 1


def test_a_table_marked_newer_deposes(tmp_path: Path) -> None:
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "old"))
    fence.check_table(None, "t")
    fence.check_table(1, "t")
    with pytest.raises(fencing.Deposed, match="marked by a newer leader"):
        fence.check_table(2, "the table of shape 't'")


def test_suspended_writes_fail_until_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fencing, "SUSPENDED_WAIT_S", 0.05)
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "me"))
    fence.suspend("lease not confirmed")
    with pytest.raises(fencing.LeaseUnconfirmed):
        fence.check()
    fence.resume()
    fence.check()
    # a newer leader came while suspended: resuming finds it
    fence.suspend("lease not confirmed")
    fencing.advance(tmp_path, "other")
    fence.resume()
    with pytest.raises(fencing.Deposed):
        fence.check()


def test_a_stopping_service_lets_waiting_writes_fail_at_once(tmp_path: Path) -> None:
    # a commit in a worker thread waits for the lease (up to SUSPENDED_WAIT_S, 30 s);
    # the process could not exit before that thread ends
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "me"))
    fence.suspend("the source is shutting down")
    failed: list[BaseException] = []

    def write() -> None:
        try:
            fence.check()
        except fencing.LeaseUnconfirmed as exc:
            failed.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive()  # waiting for the lease
    started = time.monotonic()
    fence.stop_waiting()
    writer.join(timeout=5)
    assert not writer.is_alive() and time.monotonic() - started < 2
    assert len(failed) == 1
    # and no later write waits either
    fence.suspend("still")
    started = time.monotonic()
    with pytest.raises(fencing.LeaseUnconfirmed):
        threading.Thread(target=fence.check).run()
    assert time.monotonic() - started < 1


def test_a_write_waiting_for_the_lease_finds_a_takeover_without_waiting_it_out(
    tmp_path: Path,
) -> None:
    # the leader's lease session ended; a commit in a worker thread waits for the lease
    # while another instance takes it and raises the epoch: the commit learns it is
    # deposed from the epoch file, not after SUSPENDED_WAIT_S (30 s)
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "me"))
    fence.suspend("the lease session ended")
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            fence.check()
        except (fencing.Deposed, fencing.LeaseUnconfirmed) as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive()  # waiting for the lease
    fencing.advance(tmp_path, "the standby")
    writer.join(timeout=10)
    assert not writer.is_alive(), "the write waited on after the takeover"
    assert [type(e) for e in outcome] == [fencing.Deposed]
    assert fence.deposed is not None and "epoch 2" in fence.deposed


def test_a_takeover_is_told_apart_from_an_unconfirmed_lease_without_waiting(
    tmp_path: Path,
) -> None:
    # (what the replication monitor asks before it reports the slot acknowledged beyond
    # this instance's durable frontier: once taken over, that is the new leader's ack)
    assert not fencing.Fence().taken_over()
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "old"))
    assert not fence.taken_over()
    fence.suspend("the lease session ended")
    started = time.monotonic()
    assert not fence.taken_over()
    assert time.monotonic() - started < fencing.SUSPENDED_WAIT_S / 2
    fencing.advance(tmp_path, "new")
    assert fence.taken_over()
    assert fence.deposed is not None
    with pytest.raises(fencing.Deposed):
        fence.check()


def test_without_a_lease_nothing_is_checked_or_carried(tmp_path: Path) -> None:
    fence = fencing.Fence()
    fence.check()
    fence.check_table(99, "t")
    assert fence.app_transactions() == [] and fence.commit_info() == {}
    assert fence.creation() is None


def test_a_cleanup_is_skipped_once_deposed(tmp_path: Path) -> None:
    folder = tmp_path / "staging"
    folder.mkdir()
    fence = fencing.install(fencing.Fence(tmp_path, fencing.advance(tmp_path, "old")))
    try:
        fencing.advance(tmp_path, "new")
        assert not fencing.clear(folder) and folder.is_dir()
        fencing.install(fencing.Fence())
        assert fencing.clear(folder) and not folder.exists()
    finally:
        fencing.install(fencing.Fence())
    assert fence.deposed is not None


def test_a_write_off_the_loop_waits_for_the_lease_and_one_on_it_does_not(
    tmp_path: Path,
) -> None:
    import asyncio
    import threading

    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "me"))
    fence.suspend("lease not confirmed")
    outcome: list[object] = []
    writer = threading.Thread(target=lambda: outcome.append(fence.check()))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and not outcome  # waiting, not failed

    async def on_the_loop() -> None:
        with pytest.raises(fencing.LeaseUnconfirmed):
            fence.check()

    asyncio.run(on_the_loop())
    fence.resume()
    writer.join(5)
    assert outcome == [None]
    # a writer waiting when the leader is deposed learns it at once
    fence.suspend("lease not confirmed")
    failed: list[BaseException] = []

    def write() -> None:
        try:
            fence.check()
        except fencing.Deposed as exc:
            failed.append(exc)

    second = threading.Thread(target=write)
    second.start()
    with pytest.raises(fencing.Deposed):
        fence.depose("a newer leader")
    second.join(5)
    assert len(failed) == 1


def test_a_suspended_writer_finds_a_newer_leader_without_the_lease_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer waiting on a suspended lease learns of a takeover from the epoch file
    when its wait ends, whether or not the task that confirms the lease could run (a
    frozen or blocked event loop): deposed, not merely unconfirmed."""
    monkeypatch.setattr(fencing, "SUSPENDED_WAIT_S", 0.05)
    fence = fencing.Fence(tmp_path, fencing.advance(tmp_path, "me"))
    heard: list[str] = []
    fence.on_deposed(heard.append)
    fence.suspend("lease not confirmed")
    with pytest.raises(fencing.LeaseUnconfirmed):
        fence.check()  # nobody else: still only unconfirmed
    fencing.advance(tmp_path, "other")
    with pytest.raises(fencing.Deposed, match="epoch 2"):
        fence.check()
    assert len(heard) == 1


def test_a_state_file_is_not_replaced_by_a_leader_deposed_while_it_synced(
    tmp_path: Path,
) -> None:
    from tidemark.state.durable import write_atomically

    root = tmp_path / "lake"
    fence = fencing.Fence(root, fencing.advance(root, "old"))
    state = root / "_tidemark" / "frontiers.json"
    write_atomically(state, "mine", check=fence.check)
    assert state.read_text() == "mine"
    calls = 0

    def paused_after_the_first_check() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the data is written and synced: a new leader took over meanwhile
            fencing.advance(root, "new")
        fence.check()

    with pytest.raises(fencing.Deposed, match="epoch 2"):
        write_atomically(state, "stale", check=paused_after_the_first_check)
    assert state.read_text() == "mine"
    assert not [p.name for p in state.parent.iterdir() if p.name.startswith(".frontiers")]


def test_a_leader_deposed_while_frozen_removes_no_spool_file(tmp_path: Path) -> None:
    # (a flush's spool files, deleted once their commit landed or was refused: a leader
    # continued after the takeover has not been told yet, the epoch file tells it)
    from tidemark.sink.files import DataFile
    from tidemark.sink.folder import TableFolder

    root = tmp_path / "lake"
    table = TableFolder()
    table.root, table.shape, table.path = root, "s", root / "tables" / "s"
    spooled = table.path / "_spool" / "t1" / "part-0.parquet"
    spooled.parent.mkdir(parents=True)
    spooled.write_bytes(b"rows")
    files = [DataFile("_spool/t1/part-0.parquet", 4, 1, 0, "{}")]
    before = fencing.current()
    fencing.install(fencing.Fence(root, fencing.advance(root, "old")))
    try:
        fencing.advance(root, "new")  # taken over while it was frozen
        table.delete_spool(files)
        assert spooled.exists()
        fencing.install(fencing.Fence(root, fencing.advance(root, "newest")))
        table.delete_spool(files)  # the leader's own
        assert not spooled.exists() and not spooled.parent.exists()
    finally:
        fencing.install(before)


def test_an_unpublished_log_entry_is_left_by_a_leader_taken_over(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    entry = root / "tables" / "s" / "_delta_log" / "_commit_x.json.tmp"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    before = fencing.current()
    fencing.install(fencing.Fence(root, fencing.advance(root, "old")))
    try:
        fencing.advance(root, "new")
        fencing.remove_own(entry)
        assert entry.exists()  # (recover_log removes it at the next start)
        fencing.install(fencing.Fence(root, fencing.advance(root, "newest")))
        fencing.remove_own(entry)
        assert not entry.exists()
        fencing.remove_own(entry)  # (gone already: nothing to do)
    finally:
        fencing.install(before)
