"""``publish_new``: a written file moved to a name that must not exist yet (the
put-if-absent a Delta log entry needs), with the kernel's no-replace rename and
with the hard-link fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark import durable


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
