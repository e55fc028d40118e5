"""crashfs's durability model without FUSE: what survives a power loss.

Each scenario works on a :class:`Disk`: a live tree in a temp directory and a
:class:`DurabilityModel` kept in step with it the way the crashfs daemon keeps them
(an operation is applied to the live tree and, if it succeeded there, mirrored into
the model). ``power_loss`` freezes the model and materializes its durable image into
a fresh directory, whose contents the test then checks.

Hypothesis checks three laws over random operation sequences: the model mirrors
every sequence the kernel accepts without an error of its own; after an fsync of
every file and directory nothing is lost (the rebuilt tree is the live tree, hard
links included); and without any sync nothing changes (the rebuilt tree is the
adopted one, contents included).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.crashfs.model import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    DurabilityModel,
    DurableImage,
    Frozen,
    Kind,
    Symlink,
    Tree,
    read_tree,
)

_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old: Path, new: Path, flags: int) -> None:
    if _libc.renameat2(-100, bytes(old), -100, bytes(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(new))


class Disk:
    """A live tree and its durability model, in step."""

    def __init__(self, tmp: Path, seed: Tree | None = None) -> None:
        self.tmp = tmp
        self.live = tmp / "live"
        self.live.mkdir(parents=True)
        if seed:
            write_tree(self.live, seed)
        self.model = DurabilityModel.adopt(self.live, tmp / "state")
        self.losses = 0

    def p(self, path: str) -> Path:
        return self.live / path.lstrip("/")

    # operations: live first, then the model (as the daemon does)

    def write(self, path: str, data: bytes) -> None:
        """Open (creating if missing), truncate, write; no sync."""
        existed = self.p(path).exists()
        self.p(path).write_bytes(data)
        if not existed:
            self.model.create(path, Kind.FILE, 0o644)

    def mkdir(self, path: str) -> None:
        self.p(path).mkdir()
        self.model.create(path, Kind.DIR, 0o755)

    def symlink(self, path: str, target: str) -> None:
        os.symlink(target, self.p(path))
        self.model.create(path, Kind.SYMLINK, 0o777, target=target)

    def link(self, existing: str, new: str) -> None:
        os.link(self.p(existing), self.p(new))
        self.model.link(existing, new)

    def unlink(self, path: str) -> None:
        self.p(path).unlink()
        self.model.unlink(path)

    def rmdir(self, path: str) -> None:
        self.p(path).rmdir()
        self.model.rmdir(path)

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        renameat2(self.p(old), self.p(new), flags)
        self.model.rename(old, new, flags)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self.p(path), mode)
        self.model.chmod(self.model.lookup(path), mode)

    def fsync(self, path: str) -> None:
        self.model.sync_file(self.model.lookup(path), self.p(path))

    def fsync_dir(self, path: str = "/") -> None:
        self.model.sync_dir(self.model.lookup(path))

    def power_loss(self) -> Tree:
        self.losses += 1
        after = self.tmp / f"after-{self.losses}"
        after.mkdir()
        self.model.freeze().materialize(after)
        self.after = after
        return read_tree(after)


def write_tree(root: Path, tree: Tree) -> None:
    for name, value in tree.items():
        if isinstance(value, dict):
            (root / name).mkdir()
            write_tree(root / name, value)
        elif isinstance(value, Symlink):
            os.symlink(value.target, root / name)
        else:
            (root / name).write_bytes(value)


@pytest.fixture
def disk(tmp_path: Path) -> Disk:
    return Disk(tmp_path)


# -- files ----------------------------------------------------------------------------


def test_a_file_and_its_directory_both_fsynced_survive(disk: Disk) -> None:
    disk.write("a", b"hello")
    disk.fsync("a")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"a": b"hello"}


def test_a_file_whose_directory_was_never_fsynced_is_gone(disk: Disk) -> None:
    disk.write("a", b"hello")
    disk.fsync("a")
    assert disk.power_loss() == {}


def test_a_file_never_fsynced_whose_name_is_durable_comes_back_empty(disk: Disk) -> None:
    """Given a name made durable by a directory fsync, but the file's data never
    fsynced (the classic zero-length file after a crash on ext4)."""
    disk.write("a", b"hello")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"a": b""}


def test_a_file_comes_back_as_it_was_at_its_last_fsync(disk: Disk) -> None:
    disk.write("a", b"first")
    disk.fsync("a")
    disk.fsync_dir("/")
    disk.write("a", b"second, longer")
    assert disk.power_loss() == {"a": b"first"}


def test_a_truncation_not_synced_is_undone(disk: Disk) -> None:
    disk.write("a", b"0123456789")
    disk.fsync("a")
    disk.fsync_dir("/")
    os.truncate(disk.p("a"), 3)
    assert disk.power_loss() == {"a": b"0123456789"}


def test_a_mode_change_is_durable_with_the_next_fsync_of_the_file(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"a": b"x", "b": b"y"})
    disk.chmod("a", 0o600)
    disk.chmod("b", 0o600)
    disk.fsync("b")
    disk.power_loss()
    assert stat.S_IMODE(os.stat(disk.after / "a").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(disk.after / "b").st_mode) == 0o600


# -- what was there at mount time ---------------------------------------------------------


def test_an_adopted_tree_is_durable_as_it_was(tmp_path: Path) -> None:
    """Given a tree adopted at mount, when its files are changed, removed and renamed
    without any sync, then the power loss brings the adopted tree back."""
    seed: Tree = {"a": b"A", "d": {"b": b"B", "e": {}}, "l": Symlink("a")}
    disk = Disk(tmp_path, seed=seed)
    disk.write("a", b"changed")
    disk.unlink("d/b")
    disk.rename("d", "moved")
    disk.mkdir("new")
    assert disk.power_loss() == seed


def test_a_directory_never_fsynced_keeps_only_its_durable_entries(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"d": {"old": b"1"}})
    disk.write("d/new", b"2")
    disk.fsync("d/new")
    disk.unlink("d/old")
    assert disk.power_loss() == {"d": {"old": b"1"}}


def test_a_new_directory_whose_name_is_durable_but_never_fsynced_comes_back_empty(
    disk: Disk,
) -> None:
    disk.mkdir("d")
    disk.write("d/f", b"data")
    disk.fsync("d/f")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"d": {}}


# -- unlink ---------------------------------------------------------------------------------


def test_an_unlink_without_a_directory_fsync_comes_back_with_its_content(disk: Disk) -> None:
    disk.write("a", b"keep me")
    disk.fsync("a")
    disk.fsync_dir("/")
    disk.unlink("a")
    assert disk.power_loss() == {"a": b"keep me"}


def test_an_unlink_followed_by_a_directory_fsync_is_durable(disk: Disk) -> None:
    disk.write("a", b"gone")
    disk.fsync("a")
    disk.fsync_dir("/")
    disk.unlink("a")
    disk.fsync_dir("/")
    assert disk.power_loss() == {}


def test_an_unlinked_file_stays_syncable_through_an_open_handle(disk: Disk) -> None:
    """Given a durable name whose inode is then unlinked (not durably), an fsync
    through the inode still updates what the old name comes back with."""
    disk.write("a", b"v1")
    disk.fsync("a")
    disk.fsync_dir("/")
    inode = disk.model.lookup("a")
    keep = disk.tmp / "open-handle"
    os.link(disk.p("a"), keep)
    disk.unlink("a")
    keep.write_bytes(b"v2")
    disk.model.sync_file(inode, keep)
    assert disk.power_loss() == {"a": b"v2"}


# -- rename -----------------------------------------------------------------------------------


def test_a_rename_is_durable_only_once_its_directory_is_fsynced(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"tmp": b"data"})
    disk.rename("tmp", "final")
    assert disk.power_loss() == {"tmp": b"data"}

    disk = Disk(tmp_path / "synced", seed={"tmp": b"data"})
    disk.rename("tmp", "final")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"final": b"data"}


def test_an_overwrite_by_rename_with_the_new_file_fsynced_is_atomic(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"data": b"v1"})
    disk.write("data.tmp", b"v2")
    disk.fsync("data.tmp")
    disk.rename("data.tmp", "data")
    assert disk.power_loss() == {"data": b"v1"}, "without the directory fsync: the old file"

    disk = Disk(tmp_path / "synced", seed={"data": b"v1"})
    disk.write("data.tmp", b"v2")
    disk.fsync("data.tmp")
    disk.rename("data.tmp", "data")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"data": b"v2"}


def test_an_overwrite_by_rename_without_fsyncing_the_new_file_comes_back_empty(
    tmp_path: Path,
) -> None:
    disk = Disk(tmp_path, seed={"data": b"v1"})
    disk.write("data.tmp", b"v2")
    disk.rename("data.tmp", "data")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"data": b""}


def test_a_rename_between_directories_needs_both_fsynced(tmp_path: Path) -> None:
    seed: Tree = {"a": {"f": b"F"}, "b": {}}
    outcomes = {}
    for synced in ((), ("a",), ("b",), ("a", "b")):
        disk = Disk(tmp_path / ("-".join(synced) or "none"), seed=seed)
        disk.rename("a/f", "b/f")
        for d in synced:
            disk.fsync_dir(d)
        outcomes[synced] = disk.power_loss()
    assert outcomes[()] == seed
    assert outcomes[("a",)] == {"a": {}, "b": {}}, "the file is in neither directory"
    assert outcomes[("b",)] == {"a": {"f": b"F"}, "b": {"f": b"F"}}, "in both"
    assert outcomes[("a", "b")] == {"a": {}, "b": {"f": b"F"}}


def test_a_file_durable_under_two_names_comes_back_as_a_hard_link(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"a": {"f": b"F"}, "b": {}})
    disk.rename("a/f", "b/f")
    disk.fsync_dir("b")
    disk.power_loss()
    assert os.stat(disk.after / "a/f").st_ino == os.stat(disk.after / "b/f").st_ino


def test_a_directory_durable_under_two_names_comes_back_once(tmp_path: Path) -> None:
    """Given a directory moved into a sibling with only the sibling fsynced, its
    durable parent still lists it too: it comes back at the first name only (sorted
    walk), never as two directories or a cycle."""
    disk = Disk(tmp_path, seed={"a": {"x": b"1"}, "b": {}})
    disk.rename("a", "b/a")
    disk.fsync_dir("b")
    assert disk.power_loss() == {"a": {"x": b"1"}, "b": {}}


def test_a_cycle_of_durable_entries_does_not_loop(tmp_path: Path) -> None:
    """Given durable entries root/a, a/b and b/a (a's move below b made durable only
    in b), the rebuild stops at the directory it has already placed."""
    disk = Disk(tmp_path, seed={"a": {"b": {}}})
    disk.rename("a/b", "b")
    disk.rename("a", "b/a")
    disk.fsync_dir("b")
    assert disk.power_loss() == {"a": {"b": {}}}


def test_rename_noreplace_and_exchange_are_mirrored(disk: Disk) -> None:
    disk.write("a", b"A")
    disk.write("b", b"B")
    disk.fsync("a")
    disk.fsync("b")
    with pytest.raises(FileExistsError):
        disk.model.rename("a", "b", RENAME_NOREPLACE)
    disk.rename("a", "b", RENAME_EXCHANGE)
    disk.rename("b", "c", RENAME_NOREPLACE)
    disk.fsync_dir("/")
    assert disk.power_loss() == {"a": b"B", "c": b"A"}


# -- directories -----------------------------------------------------------------------------


def test_nested_new_directories_need_each_parent_fsynced(tmp_path: Path) -> None:
    steps = ("a/b", "a", "/")
    outcomes = []
    for n in range(len(steps) + 1):
        disk = Disk(tmp_path / str(n))
        disk.mkdir("a")
        disk.mkdir("a/b")
        disk.write("a/b/f", b"deep")
        disk.fsync("a/b/f")
        for d in steps[:n]:
            disk.fsync_dir(d)
        outcomes.append(disk.power_loss())
    assert outcomes[:3] == [{}, {}, {}]
    assert outcomes[3] == {"a": {"b": {"f": b"deep"}}}


def test_a_synced_subdirectory_waits_for_its_parent_only(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"a": {}})
    disk.mkdir("a/b")
    disk.write("a/b/f", b"x")
    disk.fsync("a/b/f")
    disk.fsync_dir("a/b")
    assert disk.power_loss() == {"a": {}}, "a not fsynced: b is not in it"


def test_an_rmdir_is_durable_only_with_its_parent_fsynced(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"d": {}})
    disk.rmdir("d")
    assert disk.power_loss() == {"d": {}}


def test_a_symlink_is_durable_with_its_directory(disk: Disk) -> None:
    disk.symlink("l", "target/elsewhere")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"l": Symlink("target/elsewhere")}


# -- identity ----------------------------------------------------------------------------------


def test_hard_links_share_one_inode_and_its_snapshot(disk: Disk) -> None:
    disk.write("a", b"shared")
    disk.link("a", "b")
    disk.fsync("b")
    disk.fsync_dir("/")
    assert disk.power_loss() == {"a": b"shared", "b": b"shared"}
    assert os.stat(disk.after / "a").st_ino == os.stat(disk.after / "b").st_ino


def test_a_hard_link_not_made_durable_leaves_the_old_name_alone(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"a": b"A"})
    disk.link("a", "b")
    disk.unlink("a")
    assert disk.power_loss() == {"a": b"A"}


def test_a_new_file_never_inherits_an_unlinked_files_snapshot(disk: Disk) -> None:
    """Given a durable file that is unlinked, a new file (at another name, or at the
    same one) is a new inode: it comes back empty, not with the old content, even
    where the backing file system reuses the old inode number."""
    disk.write("old", b"old content")
    disk.fsync("old")
    disk.fsync_dir("/")
    ino = os.stat(disk.p("old")).st_ino
    disk.unlink("old")
    disk.write("new", b"new content")
    disk.unlink("new")
    disk.write("old", b"another new content")
    reused = os.stat(disk.p("old")).st_ino == ino
    disk.fsync_dir("/")
    assert disk.power_loss() == {"old": b""}, f"backing inode number reused: {reused}"


def test_adopted_hard_links_stay_one_inode(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    (live / "a").write_bytes(b"x")
    os.link(live / "a", live / "b")
    model = DurabilityModel.adopt(live, tmp_path / "state")
    assert model.lookup("a") == model.lookup("b")


# -- the power cut ---------------------------------------------------------------------------


def test_after_the_freeze_nothing_changes_any_more(disk: Disk) -> None:
    disk.write("a", b"A")
    disk.fsync("a")
    disk.fsync_dir("/")
    image = disk.model.freeze()
    disk.p("b").write_bytes(b"B")
    with pytest.raises(Frozen):
        disk.model.create("b", Kind.FILE, 0o644)
    with pytest.raises(Frozen):
        disk.fsync("a")
    with pytest.raises(Frozen):
        disk.fsync_dir("/")
    assert disk.model.image().nodes == image.nodes


def test_an_image_round_trips_through_json_and_rebuilds_the_same_tree(
    disk: Disk, tmp_path: Path
) -> None:
    disk.write("a", b"A")
    disk.mkdir("d")
    disk.link("a", "d/b")
    disk.fsync("a")
    disk.fsync_dir("d")
    disk.fsync_dir("/")
    image = disk.model.freeze()
    saved = tmp_path / "image.json"
    image.save(saved)
    again = DurableImage.load(saved)
    assert again == image
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    (second / "junk").write_bytes(b"replaced")
    image.materialize(first)
    again.materialize(second)
    again.materialize(second)
    assert read_tree(first) == read_tree(second) == {"a": b"A", "d": {"b": b"A"}}


def test_a_read_only_directory_is_rebuilt_and_cleared_again(tmp_path: Path) -> None:
    disk = Disk(tmp_path, seed={"d": {"f": b"x"}})
    os.chmod(disk.p("d"), 0o555)
    disk.model.chmod(disk.model.lookup("d"), 0o555)
    disk.fsync_dir("d")
    image = disk.model.freeze()
    out = tmp_path / "out"
    out.mkdir()
    image.materialize(out)
    image.materialize(out)
    assert read_tree(out) == {"d": {"f": b"x"}}
    assert stat.S_IMODE(os.stat(out / "d").st_mode) == 0o555


# -- the model refuses what the kernel refuses -----------------------------------------------


@pytest.mark.parametrize(
    ("op", "code"),
    [
        (lambda m: m.create("a", Kind.FILE, 0o644), errno.EEXIST),
        (lambda m: m.create("missing/x", Kind.FILE, 0o644), errno.ENOENT),
        (lambda m: m.create("a/x", Kind.FILE, 0o644), errno.ENOTDIR),
        (lambda m: m.unlink("d"), errno.EISDIR),
        (lambda m: m.rmdir("a"), errno.ENOTDIR),
        (lambda m: m.rmdir("d"), errno.ENOTEMPTY),
        (lambda m: m.link("d", "e"), errno.EPERM),
        (lambda m: m.rename("d", "d/sub"), errno.EINVAL),
        (lambda m: m.rename("a", "d"), errno.EISDIR),
        (lambda m: m.rename("d", "a"), errno.ENOTDIR),
        (lambda m: m.rename("a", "nowhere", RENAME_EXCHANGE), errno.ENOENT),
    ],
)
def test_the_model_refuses_what_the_kernel_refuses(tmp_path: Path, op: object, code: int) -> None:
    live = tmp_path / "live"
    live.mkdir()
    write_tree(live, {"a": b"", "d": {"f": b""}})
    model = DurabilityModel.adopt(live, tmp_path / "state")
    with pytest.raises(OSError) as e:
        op(model)  # type: ignore[operator]
    assert e.value.errno == code


# -- laws over random histories ----------------------------------------------------------------

NAMES = ("a", "b", "d/a", "d/b", "d/e/a", "d/e", "e")
SEED: Tree = {"a": b"seed-a", "d": {"b": b"seed-db", "e": {}}}

op_strategy = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), st.binary(max_size=12)),
    st.tuples(st.just("mkdir"), st.sampled_from(NAMES)),
    st.tuples(st.just("unlink"), st.sampled_from(NAMES)),
    st.tuples(st.just("rmdir"), st.sampled_from(NAMES)),
    st.tuples(
        st.just("rename"),
        st.sampled_from(NAMES),
        st.sampled_from(NAMES),
        st.sampled_from((0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE)),
    ),
    st.tuples(st.just("link"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("sync"), st.sampled_from((*NAMES, "/"))),
)


def apply(disk: Disk, op: tuple[object, ...], syncs: bool) -> None:
    """Apply one operation the way the daemon does: to the live tree, and to the model
    only if the live tree took it (the model must then take it too)."""
    name, *args = op
    path = str(args[0])
    try:
        if name == "write":
            if disk.p(path).is_dir():
                return
            existed = disk.p(path).exists()
            disk.p(path).write_bytes(args[1])  # type: ignore[arg-type]
            if not existed:
                disk.model.create(path, Kind.FILE, 0o644)
        elif name == "mkdir":
            disk.p(path).mkdir()
            disk.model.create(path, Kind.DIR, 0o755)
        elif name == "unlink":
            disk.p(path).unlink()
            disk.model.unlink(path)
        elif name == "rmdir":
            disk.p(path).rmdir()
            disk.model.rmdir(path)
        elif name == "rename":
            renameat2(disk.p(path), disk.p(str(args[1])), int(args[2]))  # type: ignore[call-overload]
            disk.model.rename(path, str(args[1]), int(args[2]))  # type: ignore[call-overload]
        elif name == "link":
            os.link(disk.p(path), disk.p(str(args[1])))
            disk.model.link(path, str(args[1]))
        elif name == "sync" and syncs:
            if disk.p(path).is_dir():
                disk.fsync_dir(path)
            elif disk.p(path).is_file():
                disk.fsync(path)
    except OSError as e:
        if e.filename is not None and Path(e.filename).is_relative_to(disk.live):
            return  # refused by the live tree: not mirrored
        raise


def every_path(root: Path) -> Iterator[tuple[str, bool]]:
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            yield os.path.join(rel, name), False
        for name in dirnames:
            yield os.path.join(rel, name), True


def link_groups(root: Path) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for path, is_dir in every_path(root):
        if not is_dir:
            groups.setdefault(os.lstat(root / path).st_ino, set()).add(path)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


HISTORY = st.lists(op_strategy, max_size=25)
LAWS = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


@LAWS
@given(history=HISTORY)
def test_after_syncing_everything_nothing_is_lost(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[object, ...]]
) -> None:
    disk = Disk(tmp_path_factory.mktemp("law"), seed=SEED)
    for op in history:
        apply(disk, op, syncs=True)
    for path, is_dir in every_path(disk.live):
        if is_dir:
            disk.fsync_dir(path)
        else:
            disk.fsync(path)
    disk.fsync_dir("/")
    assert disk.power_loss() == read_tree(disk.live)
    assert link_groups(disk.after) == link_groups(disk.live)


@LAWS
@given(history=HISTORY)
def test_without_any_sync_the_adopted_tree_comes_back(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[object, ...]]
) -> None:
    disk = Disk(tmp_path_factory.mktemp("law"), seed=SEED)
    for op in history:
        apply(disk, op, syncs=False)
    assert disk.power_loss() == SEED


# -- writeback: the kernel's periodic flush ---------------------------------------------


def test_writeback_makes_everything_so_far_durable_and_nothing_after(disk: Disk) -> None:
    """Given a tree written without a single sync, a writeback (what ext4 does every few
    seconds on its own) makes all of it durable; what is written after it is not."""
    disk.mkdir("d")
    disk.write("d/a", b"before")
    disk.write("b", b"also before")
    disk.model.writeback(disk.live)
    disk.write("d/a", b"after, unsynced")
    disk.write("d/c", b"new, unsynced")
    disk.unlink("b")
    assert disk.power_loss() == {"d": {"a": b"before"}, "b": b"also before"}
