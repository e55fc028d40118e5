"""``publish_new``: a written file moved to a name that must not exist yet (the
put-if-absent a Delta log entry needs), with the kernel's no-replace rename and
with the hard-link fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.state import durable


@pytest.fixture(params=["renameat2", "link"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "link":
        monkeypatch.setattr(durable, "_renameat2", None)
    elif durable._renameat2 is None:
        pytest.skip("this libc has no renameat2")
    return str(request.param)


def test_a_new_name_gets_the_whole_file_and_the_temp_file_is_gone(tmp_path: Path, way: str) -> None:
    temp, target = tmp_path / "_commit.tmp", tmp_path / "00000000000000000001.json"
    temp.write_text("entry\n")
    assert durable.publish_new(temp, target) is True
    assert target.read_text() == "entry\n"
    assert not temp.exists()


def test_an_existing_name_is_left_as_it_is(tmp_path: Path, way: str) -> None:
    target = tmp_path / "00000000000000000001.json"
    target.write_text("another writer's entry\n")
    temp = tmp_path / "_commit.tmp"
    temp.write_text("ours\n")
    assert durable.publish_new(temp, target) is False
    assert target.read_text() == "another writer's entry\n"
    assert not temp.exists()


def test_a_folder_that_is_not_there_is_an_error_and_leaves_nothing(
    tmp_path: Path, way: str
) -> None:
    temp = tmp_path / "_commit.tmp"
    temp.write_text("ours\n")
    with pytest.raises(OSError):
        durable.publish_new(temp, tmp_path / "missing" / "00000000000000000001.json")
    assert not temp.exists()


# -- SyncSet: group commit of what a commit depends on -----------------------------------


def test_a_new_file_brings_every_folder_up_to_the_durable_top(tmp_path: Path) -> None:
    """Given a file written two folders below a durable folder, its sync set holds the
    file and both folders (each gained an entry), and the top (it gained the first)."""
    top = tmp_path / "data"
    f = top / "batch" / "part-0.parquet"
    synced = durable.SyncSet()
    synced.new_file(f, top, 10)
    assert synced.files == {f: 10}
    assert synced.folders == {top / "batch", top}


def test_sync_names_every_file_that_is_missing_or_cut_short(tmp_path: Path) -> None:
    """A staged file removed before its commit, or shorter than written, fails the sync
    with its name: never a commit without it."""
    whole, short = tmp_path / "whole.parquet", tmp_path / "short.parquet"
    whole.write_bytes(b"x" * 10)
    short.write_bytes(b"x" * 3)
    synced = durable.SyncSet()
    synced.file(whole, 10)
    synced.file(short, 10)
    synced.file(tmp_path / "gone.parquet", 10)
    synced.folder(tmp_path)
    with pytest.raises(durable.SyncFailed) as failed:
        synced.sync()
    assert failed.value.paths == {short, tmp_path / "gone.parquet"}
    assert "more" in str(failed.value)


def test_a_failed_fdatasync_is_a_failure_never_a_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fdatasync returning EIO fails the sync for that file only."""
    import errno
    import os

    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(b"1")
    bad.write_bytes(b"2")
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(bad):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    synced = durable.SyncSet()
    synced.file(good)
    synced.file(bad)
    durable.configure(enabled=True, method="files")
    try:
        with pytest.raises(durable.SyncFailed) as failed:
            synced.sync()
    finally:
        durable.configure(enabled=True)
    assert failed.value.paths == {bad}
    assert "Input/output error" in str(failed.value)


def test_syncing_off_syncs_nothing(tmp_path: Path) -> None:
    """``[sink] sync = false``: a missing file is not even looked at."""
    synced = durable.SyncSet()
    synced.file(tmp_path / "gone", 1)
    durable.configure(enabled=False)
    try:
        synced.sync()
    finally:
        durable.configure(enabled=True)
    with pytest.raises(durable.SyncFailed):
        synced.sync()


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /srv/lake rw,nosuid shared:20 - fuse.crashfs crashfs rw,user_id=0
41 22 0:36 / /srv/lake\\040two rw shared:21 - xfs /dev/vdb rw
"""


def test_the_filesystem_of_a_path_is_its_longest_mount_point() -> None:
    assert durable.filesystem_type(Path("/srv/lake/tables/x"), MOUNTINFO) == "fuse.crashfs"
    assert durable.filesystem_type(Path("/srv/lakehouse"), MOUNTINFO) == "ext4"
    assert durable.filesystem_type(Path("/srv/lake two/t"), MOUNTINFO) == "xfs"


def test_a_filesystem_sync_checks_each_file_then_syncs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync_method = "filesystem"``: one syncfs for the whole set, after a missing or
    short file was refused (never a sync that hides it)."""
    calls: list[int] = []
    monkeypatch.setattr(durable, "_syncfs", lambda fd: calls.append(fd) or 0)
    monkeypatch.setattr(durable, "filesystem_type", lambda path: "ext4")
    durable.configure(enabled=True, method="filesystem")
    try:
        whole = tmp_path / "whole"
        whole.write_bytes(b"x" * 4)
        synced = durable.SyncSet()
        synced.file(whole, 4)
        synced.folder(tmp_path)
        synced.sync()
        assert len(calls) == 1
        synced.file(tmp_path / "gone", 4)
        with pytest.raises(durable.SyncFailed) as failed:
            synced.sync()
        assert failed.value.paths == {tmp_path / "gone"} and len(calls) == 1
    finally:
        durable.configure(enabled=True)


def test_a_filesystem_sync_is_made_file_by_file_where_syncfs_may_not_reach_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(durable, "_syncfs", lambda fd: calls.append(fd) or 0)
    monkeypatch.setattr(durable, "filesystem_type", lambda path: "fuse.crashfs")
    durable.configure(enabled=True, method="filesystem")
    try:
        f = tmp_path / "f"
        f.write_bytes(b"1")
        synced = durable.SyncSet()
        synced.file(f, 1)
        synced.sync()
        assert calls == []
        monkeypatch.setattr(durable, "filesystem_type", lambda path: "ext4")
        durable.configure(enabled=True, method="filesystem")  # (forgets what it learnt)
        synced.sync()
        assert len(calls) == 1
    finally:
        durable.configure(enabled=True)
