"""crashfs mounted for real: what a power loss keeps, the faults it injects, and how
it cleans up. Skipped where FUSE cannot be mounted (``crashfs_available`` says why).

The scenarios also pin down what the kernel forwards to a FUSE server: fsync and
fdatasync on a read-only descriptor, fsync on a read-only directory descriptor
(``fsyncdir``), ``renameat2`` flags; and what it does not: ``sync``, ``syncfs``,
``close``. A test of the passthrough's speed prints its figures (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from tests.crashfs import (
    CrashFS,
    Symlink,
    crashfs_fixture,  # noqa: F401  (the fixture `crashfs`)
    is_mounted,
    read_tree,
    require_crashfs,
)

RENAME_NOREPLACE = 1
REPO = Path(__file__).resolve().parents[2]
_libc = ctypes.CDLL(None, use_errno=True)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory through a read-only descriptor."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(top: Path, up_to: Path) -> None:
    """fsync every file and directory under ``top``, then each directory from ``top``'s
    parent up to ``up_to``: what a program must do for ``top`` to survive."""
    for dirpath, _, filenames in os.walk(top, topdown=False):
        for name in filenames:
            fsync_path(Path(dirpath, name))
        fsync_path(Path(dirpath))
    d = top.parent
    while True:
        fsync_path(d)
        if d == up_to:
            return
        d = d.parent


def write_file(path: Path, data: bytes, *, fsync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def renameat2(old: Path, new: Path, flags: int) -> None:
    if _libc.renameat2(-100, bytes(old), -100, bytes(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(new))


def syncs(fs: CrashFS) -> tuple[int, int, int]:
    s = fs.stats()
    return s["fsync"], s["fdatasync"], s["fsyncdir"]


# -- what survives ------------------------------------------------------------------------


def test_a_file_fsynced_in_a_fsynced_directory_survives_and_the_rest_is_forgotten(
    crashfs: CrashFS,
) -> None:
    root = crashfs.root
    write_file(root / "kept", b"durable", fsync=True)
    fsync_path(root)
    write_file(root / "named-only", b"data never synced", fsync=False)
    fsync_path(root)
    write_file(root / "new", b"never named durably", fsync=True)
    (root / "dir").mkdir()

    crashfs.power_loss()

    assert read_tree(crashfs.root) == {"kept": b"durable", "named-only": b""}
    assert crashfs.stats()["model_errors"] == 0


def test_an_overwrite_without_fsync_comes_back_as_it_was(crashfs: CrashFS) -> None:
    root = crashfs.root
    write_file(root / "f", b"version 1", fsync=True)
    fsync_path(root)
    write_file(root / "f", b"version 2, longer", fsync=False)
    os.truncate(root / "f", 4)
    crashfs.power_loss()
    assert (crashfs.root / "f").read_bytes() == b"version 1"


def test_os_replace_is_durable_only_once_the_directory_is_fsynced(crashfs: CrashFS) -> None:
    root = crashfs.root
    write_file(root / "state", b"old", fsync=True)
    fsync_path(root)
    write_file(root / "state.tmp", b"new", fsync=True)
    os.replace(root / "state.tmp", root / "state")
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"state": b"old"}

    root = crashfs.root
    write_file(root / "state.tmp", b"new", fsync=True)
    os.replace(root / "state.tmp", root / "state")
    fsync_path(root)
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"state": b"new"}


def test_rename_noreplace_reaches_the_daemon_and_is_durable_with_the_directory(
    crashfs: CrashFS,
) -> None:
    root = crashfs.root
    write_file(root / "a.tmp", b"A", fsync=True)
    write_file(root / "taken", b"T", fsync=True)
    fsync_path(root)

    with pytest.raises(FileExistsError):  # refused by the VFS before FUSE is asked
        renameat2(root / "a.tmp", root / "taken", RENAME_NOREPLACE)
    renameat2(root / "a.tmp", root / "a", RENAME_NOREPLACE)
    assert crashfs.stats()["rename_noreplace"] == 1, "the flag reached the daemon"
    assert read_tree(root) == {"a": b"A", "taken": b"T"}

    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"a.tmp": b"A", "taken": b"T"}

    renameat2(crashfs.root / "a.tmp", crashfs.root / "a", RENAME_NOREPLACE)
    fsync_path(crashfs.root)
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"a": b"A", "taken": b"T"}


def test_a_new_directory_needs_itself_and_its_parent_fsynced(crashfs: CrashFS) -> None:
    root = crashfs.root
    (root / "d" / "e").mkdir(parents=True)
    write_file(root / "d" / "e" / "f", b"deep", fsync=True)
    fsync_path(root / "d" / "e")
    fsync_path(root / "d")
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {}

    root = crashfs.root
    (root / "d" / "e").mkdir(parents=True)
    write_file(root / "d" / "e" / "f", b"deep", fsync=True)
    sync_tree(root / "d", up_to=root)
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"d": {"e": {"f": b"deep"}}}


def test_hard_links_and_symlinks_pass_through_and_survive_when_synced(crashfs: CrashFS) -> None:
    root = crashfs.root
    write_file(root / "a", b"shared", fsync=True)
    os.link(root / "a", root / "b")
    os.symlink("a", root / "l")
    assert os.stat(root / "a").st_ino == os.stat(root / "b").st_ino
    assert os.stat(root / "a").st_nlink == 2
    assert os.readlink(root / "l") == "a"
    fsync_path(root)
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"a": b"shared", "b": b"shared", "l": Symlink("a")}
    assert os.stat(crashfs.root / "a").st_ino == os.stat(crashfs.root / "b").st_ino


def test_a_reused_backing_inode_number_does_not_resurrect_old_content(crashfs: CrashFS) -> None:
    """Given a durable file that is unlinked, and a new file that the backing file
    system (ext4 here) gives the same inode number, the new file's name made durable
    without fsyncing its data comes back empty, not with the old file's content."""
    root = crashfs.root
    write_file(root / "old", b"old content", fsync=True)
    fsync_path(root)
    old_ino = os.stat(crashfs.backing / "old").st_ino
    os.unlink(root / "old")
    write_file(root / "new", b"new content", fsync=False)
    reused = os.stat(crashfs.backing / "new").st_ino == old_ino
    fsync_path(root)
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"new": b""}, f"inode number reused: {reused}"


def test_concurrent_writers_lose_nothing_once_everything_is_synced(crashfs: CrashFS) -> None:
    """Given four threads creating, renaming, linking and removing files and folders at
    once (requests served by several daemon threads), when everything is fsynced, the
    tree after a power loss is the tree before it: the model kept step."""
    root = crashfs.root

    def work(n: int) -> None:
        d = root / f"w{n}"
        d.mkdir()
        for i in range(40):
            write_file(d / f"f{i}.tmp", f"{n}/{i}".encode() * (i + 1), fsync=i % 2 == 0)
            os.replace(d / f"f{i}.tmp", d / f"f{i}")
            if i % 5 == 0:
                os.link(d / f"f{i}", d / f"h{i}")
            if i % 7 == 0:
                (d / f"sub{i}").mkdir()
                os.replace(d / f"f{i}", d / f"sub{i}" / "moved")
            if i % 3 == 0 and (d / f"f{i - 1}").exists():
                os.unlink(d / f"f{i - 1}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    before = read_tree(root)
    sync_tree(root / "w0", up_to=root)
    for n in range(1, 4):
        sync_tree(root / f"w{n}", up_to=root)
    assert crashfs.stats()["model_errors"] == 0

    crashfs.power_loss()

    assert read_tree(crashfs.root) == before


# -- what reaches the daemon -----------------------------------------------------------------


def test_the_counters_see_fsync_fdatasync_and_fsyncdir_but_not_sync_or_syncfs(
    crashfs: CrashFS,
) -> None:
    root = crashfs.root
    write_file(root / "f", b"x", fsync=False)

    def delta(action: object) -> tuple[int, int, int]:
        before = syncs(crashfs)
        action()  # type: ignore[operator]
        after = syncs(crashfs)
        return after[0] - before[0], after[1] - before[1], after[2] - before[2]

    def on_fd(path: Path, flags: int, call: object) -> object:
        def run() -> None:
            fd = os.open(path, flags)
            try:
                call(fd)  # type: ignore[operator]
            finally:
                os.close(fd)

        return run

    assert delta(on_fd(root / "f", os.O_WRONLY, os.fsync)) == (1, 0, 0)
    assert delta(on_fd(root / "f", os.O_RDONLY, os.fsync)) == (1, 0, 0)
    assert delta(on_fd(root / "f", os.O_RDONLY, os.fdatasync)) == (0, 1, 0)
    assert delta(on_fd(root, os.O_RDONLY, os.fsync)) == (0, 0, 1)
    assert delta(on_fd(root, os.O_RDONLY | os.O_DIRECTORY, os.fdatasync)) == (0, 0, 1)
    assert delta(on_fd(root, os.O_RDONLY, _libc.syncfs)) == (0, 0, 0)
    assert delta(os.sync) == (0, 0, 0)
    assert delta(on_fd(root / "f", os.O_WRONLY, lambda fd: None)) == (0, 0, 0)
    assert (crashfs.root / "f").read_bytes() == b"x"


# -- faults --------------------------------------------------------------------------------------


def test_an_injected_fsync_error_fails_the_call_and_makes_nothing_durable(
    crashfs: CrashFS,
) -> None:
    root = crashfs.root
    (root / "t").mkdir()
    fsync_path(root)
    crashfs.fail_fsync("*.parquet")
    crashfs.fail_fsync("t/locked", errno.EROFS)

    with pytest.raises(OSError) as e:
        write_file(root / "t" / "part-0.parquet", b"rows", fsync=True)
    assert e.value.errno == errno.EIO
    write_file(root / "t" / "other.json", b"{}", fsync=True)
    (root / "t" / "locked").mkdir()
    with pytest.raises(OSError) as e:
        fsync_path(root / "t" / "locked")
    assert e.value.errno == errno.EROFS
    fsync_path(root / "t")
    assert crashfs.stats()["injected_fsync_errors"] == 2

    crashfs.power_loss()
    assert read_tree(crashfs.root) == {
        "t": {"locked": {}, "other.json": b"{}", "part-0.parquet": b""}
    }

    crashfs.fail_fsync("*")
    crashfs.clear_faults()
    fsync_path(crashfs.root)  # faults are gone


def test_writes_past_the_capacity_fail_with_enospc_until_it_is_raised(crashfs: CrashFS) -> None:
    root = crashfs.root
    crashfs.set_capacity(10_000)
    assert os.statvfs(root).f_bavail * os.statvfs(root).f_frsize <= 10_000

    fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.write(fd, b"x" * 8_000) == 8_000
        assert os.write(fd, b"y" * 4_000) == 2_000, "a short write: what was left"
        with pytest.raises(OSError) as e:
            os.write(fd, b"z")
        assert e.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as e:
            os.open(root / "g", os.O_WRONLY | os.O_CREAT, 0o644)
        assert e.value.errno == errno.ENOSPC
        crashfs.set_capacity(None)
        assert os.write(fd, b"w" * 50_000) == 50_000
    finally:
        os.close(fd)
    assert (root / "f").stat().st_size == 60_000
    assert crashfs.stats()["enospc"] == 2


def test_after_the_freeze_every_operation_fails_with_eio(crashfs: CrashFS) -> None:
    root = crashfs.root
    write_file(root / "before", b"durable", fsync=True)
    fsync_path(root)
    fd = os.open(root / "before", os.O_RDWR)
    crashfs.freeze()
    for action in (
        lambda: os.write(fd, b"more"),
        lambda: os.fsync(fd),
        lambda: os.stat(root / "before"),
        lambda: os.listdir(root),
        lambda: os.open(root / "after", os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: os.close(fd),  # its flush fails; the descriptor is gone all the same
    ):
        with pytest.raises(OSError) as e:
            action()
        assert e.value.errno == errno.EIO
    assert crashfs.stats()["frozen_eio"] >= 6
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"before": b"durable"}


def test_names_the_kernel_caches_fail_too_after_the_freeze(crashfs: CrashFS) -> None:
    """The kernel keeps names and attributes for a moment (most stats never reach the
    daemon), and forgets them at the cut: a stat, a path walk and a listing through
    names it had just seen fail with EIO, as on a disk that is gone (a hidden folder
    too, as Spark's ``.spark-staging-*``)."""
    top = crashfs.root / ".d"
    (top / "e").mkdir(parents=True)
    write_file(top / "e" / "f", b"x", fsync=False)
    ops = crashfs.stats()["ops"].get("getattr", 0)
    for _ in range(200):
        os.stat(top / "e" / "f")
    asked = crashfs.stats()["ops"].get("getattr", 0) - ops
    assert asked < 50, f"200 stats asked the daemon {asked} times: the kernel caches nothing"
    fd = os.open(top / "e" / "f", os.O_RDONLY)
    os.fstat(fd)
    crashfs.freeze()
    for action in (
        lambda: os.fstat(fd),  # (no path walk: the file's own attributes)
        lambda: os.stat(top / "e" / "f"),
        lambda: os.stat(top),
        lambda: os.listdir(top / "e"),
        lambda: open(top / "e" / "f", "rb").close(),
    ):
        with pytest.raises(OSError) as e:
            action()
        assert e.value.errno == errno.EIO
    with contextlib.suppress(OSError):
        os.close(fd)


# -- processes and mounts ---------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    root = sys.argv[1]
    if sys.argv[2] == "parent":
        child = subprocess.Popen([sys.executable, __file__, root, "child"])
    with open(os.path.join(root, sys.argv[2]), "wb") as f:
        print("WRITING", flush=True)
        while True:
            f.write(b"x" * 100)
            time.sleep(0.01)
    """
)


def test_power_loss_kills_the_writer_with_its_children_and_forgets_their_files(
    crashfs: CrashFS, tmp_path: Path
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen(
        [sys.executable, str(script), str(crashfs.root), "parent"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "WRITING"
    deadline = time.monotonic() + 10
    while not (crashfs.backing / "child").exists():
        assert time.monotonic() < deadline, "the child never wrote"
        time.sleep(0.05)
    child_pids = children_of(writer.pid)
    assert child_pids

    crashfs.power_loss(kill=[writer])

    assert writer.returncode == -signal.SIGKILL
    for pid in child_pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    assert read_tree(crashfs.root) == {}


def children_of(parent: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(raw[raw.rindex(")") + 2 :].split()[1]) == parent:
                out.append(int(entry))
    return out


def _is_zombie(pid: int) -> bool:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2] in "ZX"


def test_a_busy_mount_is_detached_when_the_block_ends_with_an_error(tmp_path: Path) -> None:
    require_crashfs()
    with pytest.raises(RuntimeError, match="test body failed"), CrashFS.mounted(tmp_path) as fs:
        busy = os.open(fs.root / "open-file", os.O_WRONLY | os.O_CREAT, 0o644)
        root = fs.root
        raise RuntimeError("test body failed")
    assert not is_mounted(root)
    with pytest.raises(OSError) as e:  # the daemon is gone
        os.close(busy)
    assert e.value.errno == errno.ENOTCONN


MOUNTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.crashfs import CrashFS
    fs = CrashFS(Path(sys.argv[1]))
    fs.mount()
    print("MOUNTED", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_test_process_leaves_no_mount_behind(tmp_path: Path) -> None:
    """Given a process that mounted a crashfs and is then SIGKILLed (no finalizer
    runs), the daemon notices its parent is gone and unmounts."""
    require_crashfs()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", MOUNTER, str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "MOUNTED"
    mountpoint = tmp_path.resolve() / "crashfs" / "mnt"
    assert is_mounted(mountpoint)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while is_mounted(mountpoint):
        assert time.monotonic() < deadline, "the mount outlived its test process"
        time.sleep(0.05)


# -- a real writer: Rust's deltalake -------------------------------------------------------------


@pytest.fixture
def rows() -> pa.Table:
    return pa.table({"id": list(range(50)), "name": [f"row {i}" for i in range(50)]})


def test_a_delta_table_written_without_syncs_is_forgotten(crashfs: CrashFS, rows: pa.Table) -> None:
    import deltalake

    table = crashfs.root / "lake" / "t"
    deltalake.write_deltalake(str(table), rows)
    deltalake.write_deltalake(str(table), rows, mode="append")
    assert deltalake.DeltaTable(str(table)).to_pyarrow_table().num_rows == 100
    ops = crashfs.stats()["ops"]
    assert ops.get("link", 0) + ops.get("rename", 0) >= 2, "commits went through the mount"

    crashfs.power_loss()

    table = crashfs.root / "lake" / "t"
    assert not table.exists()
    with pytest.raises(deltalake.exceptions.TableNotFoundError):
        deltalake.DeltaTable(str(table))


def test_a_delta_table_whose_files_and_folders_are_all_fsynced_survives(
    crashfs: CrashFS, rows: pa.Table
) -> None:
    import deltalake

    table = crashfs.root / "lake" / "t"
    deltalake.write_deltalake(str(table), rows)
    deltalake.write_deltalake(str(table), rows, mode="append")
    sync_tree(table, up_to=crashfs.root)
    deltalake.write_deltalake(str(table), rows, mode="append")  # not synced: forgotten

    crashfs.power_loss()

    dt = deltalake.DeltaTable(str(crashfs.root / "lake" / "t"))
    assert dt.version() == 1
    got = dt.to_pyarrow_table().sort_by("id")
    assert got.num_rows == 100
    assert got.column("id").to_pylist() == sorted(list(range(50)) * 2)


# -- speed --------------------------------------------------------------------------------------


def test_the_passthrough_creates_and_fsyncs_500_small_files_in_seconds(
    crashfs: CrashFS, tmp_path: Path
) -> None:
    def create_and_fsync(d: Path, n: int = 500) -> float:
        d.mkdir()
        start = time.perf_counter()
        for i in range(n):
            fd = os.open(d / f"f{i:03d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 1_000)
            os.fsync(fd)
            os.close(fd)
        fsync_path(d)
        return time.perf_counter() - start

    native = create_and_fsync(tmp_path / "native")
    before = syncs(crashfs)[0]
    mounted = create_and_fsync(crashfs.root / "many")
    start = time.perf_counter()
    for i in range(500):
        (crashfs.root / "many" / f"f{i:03d}").read_bytes()
    read = time.perf_counter() - start
    print(
        f"\n500 x (create, write 1 kB, fsync, close): crashfs {mounted:.2f} s, "
        f"native {native:.2f} s; reading them back {read:.2f} s"
    )
    assert syncs(crashfs)[0] - before == 500
    assert mounted < 30


def test_an_armed_cut_freezes_right_after_the_matching_name_appears(crashfs: CrashFS) -> None:
    """Given a cut armed on names under log/ holding "backfill", a rename of another
    content changes nothing; the matching rename is applied, then every operation
    fails, and the power loss keeps neither (nothing was synced)."""
    log_dir = crashfs.root / "log"
    log_dir.mkdir()
    fd = os.open(crashfs.root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    crashfs.freeze_on("log/*.json", contains="backfill")
    (crashfs.root / "a.tmp").write_text('{"op":"stream"}')
    os.rename(crashfs.root / "a.tmp", log_dir / "1.json")
    assert not crashfs.frozen()
    (crashfs.root / "b.tmp").write_text('{"op":"backfill"}')
    os.rename(crashfs.root / "b.tmp", log_dir / "2.json")
    assert crashfs.frozen() and crashfs.stats()["frozen_at"] == "log/2.json"
    with pytest.raises(OSError) as e:
        (crashfs.root / "c").write_text("after the cut")
    assert e.value.errno == errno.EIO
    crashfs.power_loss()
    assert read_tree(crashfs.root) == {"log": {}}
