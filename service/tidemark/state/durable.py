"""What survives a power loss: files synced before anything depends on them.

Durability here is a promise about stable storage, not the page cache: a process
crash keeps the page cache, a host crash (power loss, kernel panic) does not. The
model every caller relies on is POSIX's, nothing kinder:

- ``fdatasync`` of a file makes its bytes (and its size) durable, not its name;
- ``fsync`` of a directory makes its entries as they are now durable: the names
  created, renamed in or out, linked and removed in it; a new folder is reachable
  after a crash only once its parent is synced too;
- ``syncfs``/``sync`` are not used: a FUSE filesystem is never told of them, and
  they would flush everything else written to the filesystem as well.

``write_atomically`` writes a temp file in the same folder, fsyncs it, renames it
over the target and fsyncs the folder: a reader (or a restart) sees the old file
or the new one, never a torn mix, and the new one survives power loss once the
call returns. ``remove_stale_temporaries`` clears temp files of writes that
crashed before their rename. ``publish_new`` moves a written file to a name that
must not exist yet (put-if-absent: a Delta log entry).

``SyncSet`` is group commit for the lake tables: the files and folders of many
commits (a flush round's shapes) gathered and synced in one parallel step
(``sync``) before anything that depends on them (the next commit, the status
update to Postgres). A sync that fails is never taken as done: a file whose
``fdatasync`` failed may have lost its bytes (the kernel marks the pages clean
after a failed writeback), so its writer rewrites it or fails, never syncs the
same file again and calls it durable (``SyncFailed.paths``). Syncing can be
turned off for throwaway use (``[sink] sync = false``: ``configure``); the
acknowledgement then promises only the page cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from tidemark.errors import SinkError

TEMP_SUFFIX: Final = ".tmp"
# fsyncs run at once: enough for the disk to merge them into few journal commits
# (3000 fsyncs of new files and folders: 0.63 s one by one, 0.17 s on 8 threads,
# 0.11 s on 32; ext4 on this project's machines)
SYNC_THREADS: Final = 32


class SyncFailed(SinkError):
    """Files or folders could not be synced: what depends on them must not be
    acknowledged, and a file among ``paths`` must be written again, not synced again."""

    def __init__(self, message: str, paths: Iterable[Path]) -> None:
        super().__init__(message)
        self.paths = frozenset(paths)


# filesystems whose syncfs(2) writes every dirty inode and commits the journal (and
# reports writeback errors, Linux 5.8+); FUSE and network filesystems are not told of
# it, overlay forwards it only partly: there each file and folder is synced instead
SYNCFS_TYPES: Final = frozenset({"ext4", "xfs", "btrfs", "ext3", "f2fs"})


class _Syncing:
    """Whether syncing is on (``[sink] sync``), how (``[sink] sync_method``), and the
    threads that sync file by file."""

    def __init__(self) -> None:
        self.enabled = True
        self.method = "files"
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._whole: dict[int, bool] = {}  # device -> whether syncfs makes it durable
        self._fds: dict[int, int] = {}  # device -> a descriptor kept for syncfs

    def filesystem_fd(self, path: Path) -> int:
        """A descriptor on ``path``'s filesystem, opened once and kept: ``syncfs``
        reports the writeback errors that happened since the descriptor was opened, so
        one kept from the first sync on misses none (a new one per call would miss an
        error the kernel's own writeback met, and another process already saw)."""
        device = os.stat(path).st_dev
        with self._lock:
            fd = self._fds.get(device)
            if fd is None:
                fd = self._fds[device] = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            return fd

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="sync")
            return self._pool


_SYNCING = _Syncing()


def configure(*, enabled: bool, method: str = "files") -> None:
    """Turn syncing on (the default) or off for this process, and say how a sync step
    is made: ``files`` (each file and folder) or ``filesystem`` (one ``syncfs`` where
    the filesystem's type is in ``SYNCFS_TYPES``, each file and folder elsewhere)."""
    _SYNCING.enabled = enabled
    _SYNCING.method = method
    _SYNCING._whole.clear()


def _syncfs_covers(path: Path) -> bool:
    """Whether one ``syncfs`` of ``path``'s filesystem makes what is written there
    durable, as the configured method says."""
    if _SYNCING.method != "filesystem" or _syncfs is None:
        return False
    device = os.stat(path).st_dev
    known = _SYNCING._whole.get(device)
    if known is None:
        known = _SYNCING._whole[device] = filesystem_type(path) in SYNCFS_TYPES
    return known


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem ``path`` is on (from ``mountinfo``, by default this
    process's ``/proc/self/mountinfo``: the longest mount point that holds it)."""
    target = os.path.realpath(path)
    best, kind = "", None
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


_syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)


def syncing() -> bool:
    return _SYNCING.enabled


class SyncSet:
    """Files and folders to make durable in one step. ``file`` adds a file with the
    size it must have (checked when it is synced: a staged file that went missing or
    was cut short is an error, never a commit without it); ``folder`` a directory
    whose entries changed; ``new_file``/``new_folder`` something just created below
    ``top``: it, and every folder between it and ``top`` (their entries changed)."""

    __slots__ = ("files", "folders")

    def __init__(self) -> None:
        self.files: dict[Path, int | None] = {}
        self.folders: set[Path] = set()

    def __bool__(self) -> bool:
        return bool(self.files or self.folders)

    def file(self, path: Path, size: int | None = None) -> None:
        self.files[path] = size

    def folder(self, path: Path) -> None:
        self.folders.add(path)

    def new_file(self, path: Path, top: Path, size: int | None = None) -> None:
        """A file created somewhere below the folder ``top`` (itself durable): the file,
        and every folder from its own up to ``top`` (each gained an entry)."""
        self.file(path, size)
        self._up_to(path.parent, top)

    def new_folder(self, path: Path, top: Path) -> None:
        """A folder created below ``top``: it and the folders up to ``top``."""
        self._up_to(path, top)

    def _up_to(self, folder: Path, top: Path) -> None:
        while folder != top and top in folder.parents:
            self.folders.add(folder)
            folder = folder.parent
        self.folders.add(top)

    def update(self, other: SyncSet) -> None:
        self.files.update(other.files)
        self.folders |= other.folders

    def sync(self) -> None:
        """Sync every file and folder, all at once (the order among them does not
        matter: each must be durable before what depends on them, which comes after
        this returns); raises ``SyncFailed`` naming every path that failed (and not only
        the first)."""
        if not _SYNCING.enabled or not self:
            return
        anchor = next(iter(self.folders), None) or next(iter(self.files)).parent
        if _syncfs_covers(anchor):
            self._sync_filesystem(anchor)
            return
        items: list[tuple[Path, int | None, bool]] = [
            (path, size, False) for path, size in self.files.items()
        ]
        items += [(path, None, True) for path in self.folders]
        outcomes = _SYNCING.pool().map(_sync_one, items)
        failed = {
            path: problem
            for (path, _, _), problem in zip(items, outcomes, strict=True)
            if problem is not None
        }
        _raise_failed(failed)

    def _sync_filesystem(self, anchor: Path) -> None:
        """One ``syncfs`` for the whole set (every path on ``anchor``'s filesystem:
        tidemark writes one sink root), after checking each file's size; a failure
        fails every path (which were lost is not known)."""
        failed: dict[Path, str] = {}
        for path, size in self.files.items():
            try:
                have = os.stat(path).st_size
            except FileNotFoundError:
                failed[path] = "the file is missing (removed before its commit)"
                continue
            if size is not None and have != size:
                failed[path] = f"the file has {have} bytes, {size} were written"
        _raise_failed(failed)
        assert _syncfs is not None
        if _syncfs(_SYNCING.filesystem_fd(anchor)) != 0:
            code = ctypes.get_errno()
            raise SyncFailed(
                f"syncfs of the filesystem of {anchor} failed: {os.strerror(code)}",
                [*self.files, *self.folders],
            )


def _raise_failed(failed: dict[Path, str]) -> None:
    """``SyncFailed`` naming the first path that failed and how many more did."""
    if failed:
        first = next(iter(failed))
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise SyncFailed(f"cannot make {first} durable: {failed[first]}{more}", failed)


def _sync_one(item: tuple[Path, int | None, bool]) -> str | None:
    path, size, folder = item
    return _sync_folder(path) if folder else _sync_file(path, size)


def _sync_file(path: Path, size: int | None) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return "the file is missing (removed before its commit)"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        if size is not None:
            have = os.fstat(fd).st_size
            if have != size:
                return f"the file has {have} bytes, {size} were written"
        os.fdatasync(fd)
    except OSError as exc:
        return f"fdatasync failed: {exc}"
    finally:
        os.close(fd)
    return None


def _sync_folder(path: Path) -> str | None:
    try:
        sync_folder(path)
    except FileNotFoundError:
        return "the folder is missing"
    except OSError as exc:
        return f"fsync of the folder failed: {exc}"
    return None


def sync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FULL_BELOW_BYTES: Final = 16 * 1024 * 1024


def full_disk(path: Path | str) -> str | None:
    """What to say when a write under ``path`` failed and its filesystem is (nearly)
    full: Spark's Hadoop writer reports a full disk only as "Mkdirs failed" or a bare
    IOException. None when there is room (or ``path`` cannot be looked at, or is an
    object store's)."""
    if str(path).startswith("s3://"):
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= FULL_BELOW_BYTES:
        return None
    return (
        f"the filesystem of {path} is full ({free} bytes free): free some space; the "
        "failed work is retried and nothing past it is acknowledged meanwhile"
    )


def write_synced(path: Path, data: bytes) -> None:
    """Write a new file ``path`` (it must not exist) and fdatasync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if _SYNCING.enabled:
            os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def make_dirs(path: Path) -> None:
    """``mkdir -p`` that survives a power loss: each folder it creates is synced into
    its parent (a new folder's name lives in its parent's entries)."""
    missing = []
    at = path
    while not at.is_dir():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        sync_folder(folder.parent)


def write_atomically(
    path: Path, data: str | bytes, *, check: Callable[[], None] | None = None
) -> None:
    """Replace ``path`` with ``data``, synced: a reader (and a power loss) sees the old
    file or the new one whole. ``check`` (a fence: ``tidemark.state.fencing.check``) is called
    before anything is written and again once the data is synced, right before the
    rename: a process paused while it wrote or synced (a leader deposed meanwhile)
    raises there and replaces nothing."""
    if check is not None:
        check()
    directory = path.parent
    make_dirs(directory)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        if check is not None:
            check()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # the rename is durable only once the directory entry is
    sync_folder(directory)


_AT_FDCWD: Final = -100
_RENAME_NOREPLACE: Final = 1
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def publish_new(temp: Path, target: Path) -> bool:
    """Move ``temp`` to ``target`` unless ``target`` exists (then False, ``temp``
    removed): atomic, so a reader sees no ``target`` or the whole file. One
    ``renameat2(RENAME_NOREPLACE)`` where the kernel and filesystem have it, else a
    hard link and the temp file's removal (two directory changes instead of one)."""
    global _renameat2
    if _renameat2 is not None:
        done = _renameat2(
            _AT_FDCWD, os.fsencode(temp), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE
        )
        if done == 0:
            return True
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            os.unlink(temp)
            return False
        if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            os.unlink(temp)
            raise OSError(code, os.strerror(code), str(target))
        _renameat2 = None  # not here: hard links from now on
    try:
        os.link(temp, target)
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
    return True


def remove_stale_temporaries(path: Path) -> None:
    """Temp files left by writes of ``path`` that crashed before their rename."""
    if not path.parent.is_dir():
        return
    for stale in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            stale.unlink()
