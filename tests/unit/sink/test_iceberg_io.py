"""The file IO of tidemark's Iceberg catalogs (``tidemark.sink.iceberg.io``): a file is
written whole at its close, after the fence is checked there, so a leader deposed while
it encoded a manifest or a metadata file leaves nothing under the root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemark.sink.iceberg.io import SyncedFileIO
from tidemark.state import fencing


@pytest.fixture
def fence(tmp_path: Path) -> Iterator[fencing.Fence]:
    root = tmp_path / "lake"
    before = fencing.current()
    fence = fencing.install(fencing.Fence(root, fencing.advance(root, "me")))
    yield fence
    fencing.install(before)


def test_a_file_is_written_whole_at_close(tmp_path: Path, fence: fencing.Fence) -> None:
    path = tmp_path / "lake" / "metadata" / "one.avro"
    path.parent.mkdir(parents=True, exist_ok=True)
    with SyncedFileIO().new_output(str(path)).create(overwrite=True) as stream:
        stream.write(b"head")
        assert not path.exists()  # nothing on disk while it is encoded
        stream.write(b"tail")
    assert path.read_bytes() == b"headtail"


def test_a_leader_deposed_while_it_encodes_a_file_leaves_none(
    tmp_path: Path, fence: fencing.Fence
) -> None:
    root = tmp_path / "lake"
    path = root / "metadata" / "snap-m0.avro"
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = SyncedFileIO().new_output(str(path)).create(overwrite=True)
    stream.write(b"manifest entries")
    fencing.advance(root, "the new leader")  # it took over meanwhile
    with pytest.raises(fencing.Deposed, match="epoch 2"):
        stream.close()
    assert not path.exists()
    stream.close()  # (closing again is a no-op)
    assert not path.exists()


def test_an_existing_file_is_not_overwritten_unless_asked(
    tmp_path: Path, fence: fencing.Fence
) -> None:
    path = tmp_path / "lake" / "v1.metadata.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"first")
    with pytest.raises(FileExistsError):
        SyncedFileIO().new_output(str(path)).create()
    assert path.read_bytes() == b"first"
    with SyncedFileIO().new_output(str(path)).create(overwrite=True) as stream:
        stream.write(b"second")
    assert path.read_bytes() == b"second"


def test_a_deposed_leader_removes_no_file(tmp_path: Path, fence: fencing.Fence) -> None:
    # (pyiceberg deletes the manifests of a commit the catalog refused: the new leader
    # marked the table meanwhile; the deposed leader leaves them, named by no snapshot)
    root = tmp_path / "lake"
    path = root / "metadata" / "snap-1-0-x.avro"
    path.parent.mkdir(parents=True, exist_ok=True)
    with SyncedFileIO().new_output(str(path)).create() as stream:
        stream.write(b"manifest list")
    fencing.advance(root, "the new leader")
    SyncedFileIO().delete(str(path))
    assert path.read_bytes() == b"manifest list"
    assert fence.deposed is not None


def test_a_leader_removes_its_files(tmp_path: Path, fence: fencing.Fence) -> None:
    path = tmp_path / "lake" / "metadata" / "snap-1-0-y.avro"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"uncommitted")
    SyncedFileIO().delete(str(path))
    assert not path.exists()
