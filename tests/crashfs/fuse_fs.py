"""The crashfs FUSE daemon: a passthrough of a backing directory that records, in a
:class:`~tests.crashfs.model.DurabilityModel`, what would survive a power loss.

What it promises:

* Every operation is passed through to the backing directory (so the live tree is
  always on the backing, readable after an unmount) and, for namespace changes,
  mirrored into the model under one lock, in the order the backing applied them.
* ``fsync``/``fdatasync`` of a file (FUSE ``fsync``) snapshots its content into the
  model; ``fsync`` of a directory (FUSE ``fsyncdir``) makes its entries durable. The
  backing itself is never fsynced: durability is what the model says, not what the
  host's disk did. ``sync(2)``/``syncfs(2)`` never reach a FUSE server (the kernel
  forwards syncfs to virtiofs only), so they make nothing durable here.
* Faults, settable at run time through the control socket:

  - ``fail_fsync(pattern, errno)``: fsync, fdatasync and fsyncdir of matching paths
    fail with that errno and make nothing durable. A pattern without ``/`` is
    matched against the base name, one with ``/`` against the path from the mount's
    root without its leading ``/`` (globs as in :mod:`fnmatch`).
  - a capacity budget: the bytes that writes may still add. Every write request is
    charged its full length (an overwrite too), ``fallocate`` the growth it causes
    (all or nothing), a truncation nothing (it is sparse). A request larger than
    what is left writes what is left (a short write, as on a full disk); once
    nothing is left, writes and the creation of any name fail with ENOSPC until the
    budget is raised or removed. ``statfs`` reports the budget as the free space.
  - ``freeze_on(pattern, contains)``: a power cut armed to happen right after a link
    or rename gives a file a name matching ``pattern`` (as for ``fail_fsync``) whose
    content holds ``contains``: the instant after a commit's log entry appears,
    before anything could sync it.
  - ``freeze``: the power cut. From then on every operation fails with EIO
    (``close`` too: its flush), the model takes no change, and the durable image is
    written to ``<state>/durable.json``.

* Counters of fsync, fdatasync and fsyncdir calls (including those failed by an
  injected fault), of injected failures, ENOSPC answers, refusals after the freeze,
  renames that carried RENAME_NOREPLACE or RENAME_EXCHANGE, and of every operation
  by name.

Not implemented: extended attributes (ENOTSUP), ioctls (so no FICLONE on the
mount), ``lseek`` with SEEK_DATA/SEEK_HOLE beyond the kernel's generic answer, and
``copy_file_range`` (the kernel falls back to reads and writes through the daemon).
POSIX and flock locks are kept by the kernel, locally. Owners and times pass
through to the backing but are not part of the durability model.

Mount options and why: the kernel's writeback cache is turned off (every write
reaches the daemon before ``write(2)`` returns); the kernel keeps names and
attributes for ``CACHE_S`` (a second) and negative lookups not at all. Every change
to the tree, every write and every sync goes through the mount, so the kernel's
caches stay true and the daemon still sees every operation the model needs; only
lookups and stats are saved (with timeouts of 0, ``default_permissions`` made the
kernel ask for the attributes of every directory on every path walk: 1.2M getattr
calls in one Delta power-loss run, 62k with the cache). ``freeze`` drops the
kernel's cached attributes of every name in the tree (``fuse_invalidate_path``), so
after it a stat, a path walk or a listing fails with EIO as before. ``hard_remove``
(an unlinked open file is unlinked, not renamed to ``.fuse_hidden*``); ``use_ino``
(``st_ino`` is the backing's, so hard links look like hard links); ``allow_other``
with ``default_permissions`` (other users may use the mount; the kernel checks
modes).
The page cache still serves reads, so ``mmap`` works; a shared writable mapping's
pages reach the daemon when the kernel writes them back (before an fsync's
FUSE_FSYNC), as on any file system.

libfuse 3 through mfusepy; ``FUSE_LIBRARY_NAME`` is set to ``fuse3`` before mfusepy
loads, as mfusepy would otherwise take libfuse 2 when both are installed.
``renameat2`` flags (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``) are passed to the
backing's ``renameat2``: mfusepy 3.1 drops them, so :class:`_CrashFUSE` passes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import functools
import json
import logging
import os
import signal
import socketserver
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .model import (
    DURABLE_IMAGE,
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    DurabilityModel,
    Frozen,
    Kind,
    kind_of,
)

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy  # after FUSE_LIBRARY_NAME is set

log = logging.getLogger("crashfs")

FUSE_CAP_WRITEBACK_CACHE = 1 << 16
CACHE_S = 1.0  # how long the kernel may keep a name's entry and attributes
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


_libfuse = mfusepy._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int


def _libfuse_invalidate(fuse: ctypes.c_void_p, path: bytes) -> None:
    """The kernel forgets the attributes (and cached pages) of ``path``; a path
    libfuse does not know (never looked up) has nothing cached: -ENOENT, ignored."""
    _libfuse.fuse_invalidate_path(fuse, path)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_Times = tuple[tuple[int, int], tuple[int, int]]


def _raise_errno(path: str | None = None) -> NoReturn:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code), path)


def _fuse_error(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


@dataclass
class _Faults:
    fsync: list[tuple[str, int]] = field(default_factory=list)  # (pattern, errno)
    budget: int | None = None  # bytes writes may still add; None: no quota
    # freeze right after a name matching the pattern is made by a link or rename of a
    # file whose content holds the bytes (None: any): (pattern, bytes or None)
    freeze_on: list[tuple[str, bytes | None]] = field(default_factory=list)


_COUNTERS = (
    "fsync",  # FUSE fsync with datasync 0, failed ones included
    "fdatasync",  # FUSE fsync with datasync 1
    "fsyncdir",
    "injected_fsync_errors",
    "enospc",
    "frozen_eio",  # operations refused after the power cut
    "model_errors",  # the model out of step with the backing: a crashfs bug
    "rename_noreplace",  # renames that arrived with RENAME_NOREPLACE
    "rename_exchange",
    "frozen_on",  # power cuts a freeze_on rule made
)

F = TypeVar("F", bound=Callable[..., Any])


def _op(fn: F) -> F:
    """An operation: counted, and failed with EIO once the power is off."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: CrashOps, *args: Any) -> Any:
        if self.frozen:
            self._bump("frozen_eio")
            raise _fuse_error(errno.EIO)
        self._bump_op(name)
        return fn(self, *args)

    return wrapper  # type: ignore[return-value]


class CrashOps(mfusepy.Operations):
    """Passthrough operations on ``backing`` that feed ``model``."""

    use_ns = True

    def __init__(self, backing: Path, model: DurabilityModel, state: Path) -> None:
        self.backing = str(backing)
        self.model = model
        self.state = state
        self.frozen = False
        self.frozen_at: str | None = None  # the name whose appearance cut the power
        self._ns = threading.Lock()  # a backing namespace change and its model mirror
        self._stats_lock = threading.Lock()
        self._counters: Counter[str] = Counter()
        self._ops: Counter[str] = Counter()
        self._faults = _Faults()
        self._files: dict[int, int | None] = {}  # backing fd -> model inode
        self._dirs: dict[int, int | None] = {}  # our dir handle -> model inode
        self._next_dir_handle = 1
        self._fuse: int | None = None  # libfuse's struct fuse, for cache invalidations

    # -- control ------------------------------------------------------------------------

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """One control command (see ``__main__`` and the controller)."""
        cmd = request.get("cmd")
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        if cmd == "stats":
            return {"ok": True, "stats": self.stats()}
        if cmd == "fail_fsync":
            code = int(request.get("errno", errno.EIO))
            with self._stats_lock:
                self._faults.fsync.append((str(request["pattern"]), code))
            return {"ok": True}
        if cmd == "set_capacity":
            budget = request.get("bytes")
            with self._stats_lock:
                self._faults.budget = None if budget is None else int(budget)
            return {"ok": True}
        if cmd == "freeze_on":
            needle = request.get("contains")
            with self._stats_lock:
                self._faults.freeze_on.append(
                    (str(request["pattern"]), None if needle is None else str(needle).encode())
                )
            return {"ok": True}
        if cmd == "writeback":
            with self._ns:  # no namespace change half mirrored meanwhile
                files = self.model.writeback(Path(self.backing))
            return {"ok": True, "files": files}
        if cmd == "clear_faults":
            with self._stats_lock:
                self._faults = _Faults()
            return {"ok": True}
        if cmd == "freeze":
            return {"ok": True, "image": str(self.freeze())}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def freeze(self, *, inside_operation: bool = False) -> Path:
        """The power cut: every operation fails from now on; the durable image is saved."""
        self.frozen = True
        image = self.model.freeze()
        path = self.state / DURABLE_IMAGE
        image.save(path)
        # what the kernel still holds about names it has seen goes too, so that a stat
        # or a path walk through them asks us (and gets EIO); from a thread of its own,
        # as the cut may come from inside a rename whose directories the kernel holds
        forget = threading.Thread(target=self._forget_cached, name="crashfs-forget")
        forget.start()
        if not inside_operation:
            forget.join()
        log.info("frozen; durable image in %s", path)
        return path

    def _forget_cached(self) -> None:
        """Drop the kernel's cached attributes of every name in the live tree."""
        if self._fuse is None:
            return
        fuse = ctypes.c_void_p(self._fuse)
        for top, dirs, files in os.walk(self.backing):
            rel = "/" + os.path.relpath(top, self.backing) if top != self.backing else "/"
            for name in [None, *dirs, *files]:
                path = rel if name is None else os.path.join(rel, name)
                _libfuse_invalidate(fuse, path.encode())

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            out: dict[str, Any] = {k: self._counters[k] for k in _COUNTERS}
            out["ops"] = dict(self._ops)
            out["budget"] = self._faults.budget
            out["frozen"] = self.frozen
            out["frozen_at"] = self.frozen_at
            return out

    def _bump(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counters[key] += n

    def _bump_op(self, name: str) -> None:
        with self._stats_lock:
            self._ops[name] += 1

    # -- helpers --------------------------------------------------------------------------

    def _b(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _mirror(self, what: str, fn: Callable[[], Any]) -> Any:
        """Apply a namespace change to the model after the backing took it."""
        try:
            return fn()
        except Frozen as e:
            raise _fuse_error(errno.EIO) from e
        except (OSError, KeyError, ValueError):
            self._bump("model_errors")
            log.exception("model out of step with the backing at %s", what)
            return None

    def _lookup(self, path: str) -> int | None:
        try:
            return self.model.lookup(path)
        except (OSError, ValueError):
            self._bump("model_errors")
            log.error("model has no inode at %s", path)
            return None

    def _take(self, nbytes: int) -> int:
        """How many of ``nbytes`` a write may write: all, what is left of the budget (a
        short write, as a full disk gives), or none (ENOSPC)."""
        with self._stats_lock:
            budget = self._faults.budget
            if budget is None or nbytes <= 0:
                return nbytes
            if budget <= 0:
                self._counters["enospc"] += 1
                raise _fuse_error(errno.ENOSPC)
            allowed = min(nbytes, budget)
            self._faults.budget = budget - allowed
            return allowed

    def _charge(self, nbytes: int) -> None:
        """All of ``nbytes`` or ENOSPC (fallocate)."""
        with self._stats_lock:
            budget = self._faults.budget
            if budget is None or nbytes <= 0:
                return
            if nbytes > budget:
                self._counters["enospc"] += 1
                raise _fuse_error(errno.ENOSPC)
            self._faults.budget = budget - nbytes

    def _charge_name(self) -> None:
        with self._stats_lock:
            if self._faults.budget is not None and self._faults.budget <= 0:
                self._counters["enospc"] += 1
                raise _fuse_error(errno.ENOSPC)

    def _check_fsync_fault(self, path: str | None) -> None:
        if path is None:
            return
        rel = path.lstrip("/")
        base = rel.rsplit("/", 1)[-1]
        with self._stats_lock:
            rules = list(self._faults.fsync)
        for pattern, code in rules:
            subject = rel if "/" in pattern else base
            if fnmatch.fnmatchcase(subject, pattern):
                self._bump("injected_fsync_errors")
                raise _fuse_error(code)

    @staticmethod
    def _own(path: str) -> None:
        """New inodes belong to the caller, as on a local file system (we run as root)."""
        uid, gid, _ = mfusepy.fuse_get_context()
        if os.geteuid() == 0 and (uid or gid):
            os.lchown(path, uid, gid)

    def _new_inode(self, path: str, b: str) -> None:
        st = os.lstat(b)
        kind = kind_of(st.st_mode)
        target = os.readlink(b) if kind is Kind.SYMLINK else None
        self._mirror(
            f"create {path}",
            lambda: self.model.create(path, kind, st.st_mode, target=target, rdev=st.st_rdev),
        )

    # -- lifecycle -----------------------------------------------------------------------

    def init_with_config(
        self, conn_info: mfusepy.fuse_conn_info | None, config_3: mfusepy.fuse_config | None
    ) -> None:
        self._fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
        if conn_info is not None:
            conn_info.want &= ~FUSE_CAP_WRITEBACK_CACHE
        if config_3 is not None:
            config_3.hard_remove = 1
            config_3.use_ino = 1
            config_3.entry_timeout = CACHE_S
            config_3.attr_timeout = CACHE_S
            config_3.negative_timeout = 0.0
            config_3.kernel_cache = 0
            config_3.auto_cache = 0
            config_3.direct_io = 0

    # -- attributes --------------------------------------------------------------------------

    @_op
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._b(path or "/"))
        return {
            "st_mode": st.st_mode,
            "st_ino": st.st_ino,
            "st_nlink": st.st_nlink,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_rdev": st.st_rdev,
            "st_size": st.st_size,
            "st_blksize": st.st_blksize,
            "st_blocks": st.st_blocks,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    @_op
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._b(path), amode, follow_symlinks=False):
            raise _fuse_error(errno.EACCES)
        return 0

    @_op
    def readlink(self, path: str) -> str:
        return os.readlink(self._b(path))

    @_op
    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        if fh is not None:
            os.fchmod(fh, mode)
            node = self._files.get(fh)
        else:
            assert path is not None
            with self._ns:
                os.chmod(self._b(path), mode)
                node = self._lookup(path)
        if node is not None:
            self._mirror(f"chmod {path}", lambda: self.model.chmod(node, mode))
        return 0

    @_op
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._b(path), uid, gid)
        return 0

    @_op
    def utimens(self, path: str | None, times: _Times | None = None, fh: int | None = None) -> int:
        ts = None
        if times is not None:
            ts = (_Timespec * 2)(_Timespec(*times[0]), _Timespec(*times[1]))
        if fh is not None and path is None:
            if _libc.futimens(fh, ts) != 0:
                _raise_errno()
        else:
            b = self._b(path or "/").encode()
            if _libc.utimensat(AT_FDCWD, b, ts, AT_SYMLINK_NOFOLLOW) != 0:
                _raise_errno(path)
        return 0

    @_op
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._b(path or "/"), length)
        return 0

    @_op
    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.backing)
        out = {
            k: getattr(sv, k)
            for k in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_flag",
                "f_namemax",
            )
        }
        budget = self._faults.budget
        if budget is not None:
            blocks = max(0, budget) // max(1, sv.f_frsize)
            out["f_bfree"] = min(out["f_bfree"], blocks)
            out["f_bavail"] = min(out["f_bavail"], blocks)
        return out

    # -- namespace ---------------------------------------------------------------------------

    @_op
    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._charge_name()
        b = self._b(path)
        with self._ns:
            os.mknod(b, mode, dev)
            self._own(b)
            self._new_inode(path, b)
        return 0

    @_op
    def mkdir(self, path: str, mode: int) -> int:
        self._charge_name()
        b = self._b(path)
        with self._ns:
            os.mkdir(b, mode)
            self._own(b)
            self._new_inode(path, b)
        return 0

    @_op
    def symlink(self, path: str, target: str) -> int:
        self._charge_name()
        b = self._b(path)
        with self._ns:
            os.symlink(target, b)
            self._own(b)
            self._new_inode(path, b)
        return 0

    @_op
    def link(self, path: str, existing: str) -> int:
        self._charge_name()
        with self._ns:
            os.link(self._b(existing), self._b(path), follow_symlinks=False)
            self._mirror(f"link {existing} {path}", lambda: self.model.link(existing, path))
        self._maybe_freeze(path)
        return 0

    @_op
    def unlink(self, path: str) -> int:
        with self._ns:
            os.unlink(self._b(path))
            self._mirror(f"unlink {path}", lambda: self.model.unlink(path))
        return 0

    @_op
    def rmdir(self, path: str) -> int:
        with self._ns:
            os.rmdir(self._b(path))
            self._mirror(f"rmdir {path}", lambda: self.model.rmdir(path))
        return 0

    @_op
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags & RENAME_NOREPLACE:
            self._bump("rename_noreplace")
        if flags & RENAME_EXCHANGE:
            self._bump("rename_exchange")
        with self._ns:
            if flags:
                b_old, b_new = self._b(old).encode(), self._b(new).encode()
                if _libc.renameat2(AT_FDCWD, b_old, AT_FDCWD, b_new, flags) != 0:
                    _raise_errno(new)
            else:
                os.rename(self._b(old), self._b(new))
            self._mirror(f"rename {old} {new}", lambda: self.model.rename(old, new, flags))
        self._maybe_freeze(new)
        return 0

    def _maybe_freeze(self, path: str) -> None:
        """The power cut armed by ``freeze_on``: right after ``path`` got its name, if
        it matches a rule (the name made, its content not synced by this op)."""
        with self._stats_lock:
            rules = list(self._faults.freeze_on)
        if not rules:
            return
        rel = path.lstrip("/")
        for pattern, needle in rules:
            if not fnmatch.fnmatchcase(rel, pattern):
                continue
            if needle is not None:
                try:
                    with open(self._b(path), "rb") as fh:
                        if needle not in fh.read():
                            continue
                except OSError:
                    continue
            with self._stats_lock:
                self._faults.freeze_on = []
                self._counters["frozen_on"] += 1
            self.frozen_at = rel
            self.freeze(inside_operation=True)
            return

    # -- files ---------------------------------------------------------------------------------

    @_op
    def create(self, path: str, mode: int, flags: int) -> int:
        self._charge_name()
        b = self._b(path)
        with self._ns:
            existed = os.path.lexists(b)
            fd = os.open(b, flags | os.O_CREAT, mode)
            try:
                if not existed:
                    self._own(b)
                    self._new_inode(path, b)
                self._files[fd] = self._lookup(path)
            except BaseException:
                os.close(fd)
                raise
        return fd

    @_op
    def open(self, path: str, flags: int) -> int:
        with self._ns:
            fd = os.open(self._b(path), flags & ~(os.O_CREAT | os.O_EXCL))
            self._files[fd] = self._lookup(path)
        return fd

    @_op
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    @_op
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        allowed = self._take(len(data))
        return os.pwrite(fh, data[:allowed] if allowed < len(data) else data, offset)

    @_op
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        if mode == 0:
            self._charge(offset + size - os.fstat(fh).st_size)
        if _libc.fallocate(fh, mode, offset, size) != 0:
            _raise_errno(path)
        return 0

    @_op
    def flush(self, path: str | None, fh: int) -> int:
        return 0

    @_op
    def release(self, path: str | None, fh: int) -> int:
        self._files.pop(fh, None)
        os.close(fh)
        return 0

    @_op
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self._bump("fdatasync" if datasync else "fsync")
        self._check_fsync_fault(path)
        node = self._files.get(fh)
        if node is None:
            self._bump("model_errors")
            log.error("fsync of %s: no model inode for handle %d", path, fh)
            return 0
        try:
            self.model.sync_file(node, f"/proc/self/fd/{fh}")
        except Frozen as e:
            raise _fuse_error(errno.EIO) from e
        return 0

    # -- directories -----------------------------------------------------------------------

    @_op
    def opendir(self, path: str) -> int:
        with self._ns:
            if not os.path.isdir(self._b(path)):
                raise _fuse_error(errno.ENOTDIR)
            node = self._lookup(path)
            handle = self._next_dir_handle
            self._next_dir_handle += 1
            self._dirs[handle] = node
        return handle

    @_op
    def readdir(self, path: str | None, fh: int) -> Iterator[tuple[str, dict[str, int], int]]:
        yield ".", {"st_mode": stat.S_IFDIR}, 0
        yield "..", {"st_mode": stat.S_IFDIR}, 0
        if path is None:
            return
        with os.scandir(self._b(path)) as it:
            for entry in it:
                if entry.is_symlink():
                    mode = stat.S_IFLNK
                elif entry.is_dir(follow_symlinks=False):
                    mode = stat.S_IFDIR
                elif entry.is_file(follow_symlinks=False):
                    mode = stat.S_IFREG
                else:
                    mode = stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
                yield entry.name, {"st_mode": mode, "st_ino": entry.inode()}, 0

    @_op
    def releasedir(self, path: str | None, fh: int) -> int:
        self._dirs.pop(fh, None)
        return 0

    @_op
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self._bump("fsyncdir")
        self._check_fsync_fault(path)
        node = self._dirs.get(fh)
        if node is None:
            self._bump("model_errors")
            log.error("fsyncdir of %s: no model inode for handle %d", path, fh)
            return 0
        try:
            self.model.sync_dir(node)
        except Frozen as e:
            raise _fuse_error(errno.EIO) from e
        return 0


class _CrashFUSE(mfusepy.FUSE):
    """mfusepy's FUSE, passing what its libfuse 3 wrappers drop: rename's flags and
    the file handle of ftruncate, fchmod and futimens; utimens gets raw timespecs so
    ``UTIME_NOW`` and ``UTIME_OMIT`` survive."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        enc, errs = self.encoding, self.errors
        return self.operations.rename(old.decode(enc, errs), new.decode(enc, errs), flags)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        p = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.truncate(p, length, fh)

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        p = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.chmod(p, mode, fh)

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            a, m = buf.contents.actime, buf.contents.modtime
            times = ((a.tv_sec, a.tv_nsec), (m.tv_sec, m.tv_nsec))
        fh = fip.contents.fh if fip else None
        p = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.utimens(p, times, fh)


# -- the control socket ----------------------------------------------------------------


def socket_address(control: str) -> str:
    """``@name`` is the abstract unix socket ``name``; anything else a path."""
    return "\0" + control[1:] if control.startswith("@") else control


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        ops: CrashOps = self.server.ops  # type: ignore[attr-defined]
        for line in self.rfile:
            try:
                reply = ops.control(json.loads(line))
            except Exception as e:
                log.exception("control command failed")
                reply = {"ok": False, "error": repr(e)}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class _ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _quiet_thread(target: Callable[[], None], name: str) -> None:
    """A daemon thread that never takes SIGTERM/SIGINT/SIGHUP: those must reach the
    main thread, blocked in libfuse's loop, whose handler ends the loop."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        target()

    threading.Thread(target=run, name=name, daemon=True).start()


def _watch_parent(parent: int) -> None:
    """Unmount (through libfuse's SIGTERM handler) once ``parent`` is gone: a test run
    killed with SIGKILL must not leave a mount behind."""
    main = threading.main_thread().ident
    assert main is not None
    while os.getppid() == parent:
        time.sleep(0.5)
    log.warning("parent %d is gone: unmounting", parent)
    signal.pthread_kill(main, signal.SIGTERM)


def serve(
    backing: Path,
    mountpoint: Path,
    state: Path,
    control: str,
    *,
    debug: bool = False,
    watch_parent: bool = False,
) -> None:
    """Adopt ``backing`` as durable, mount it at ``mountpoint`` and serve until unmounted
    (foreground). Commands arrive on the unix socket ``control`` (JSON lines). With
    ``watch_parent``, the mount goes away when the process that started this one ends."""
    os.umask(0)  # modes from the kernel already have the caller's umask applied
    state.mkdir(parents=True, exist_ok=True)
    model = DurabilityModel.adopt(backing, state)
    ops = CrashOps(backing, model, state)
    address = socket_address(control)
    server = _ControlServer(address, _ControlHandler)
    server.ops = ops  # type: ignore[attr-defined]
    _quiet_thread(server.serve_forever, "crashfs-control")
    if watch_parent:
        parent = os.getppid()
        _quiet_thread(lambda: _watch_parent(parent), "crashfs-parent")
    log.info("mounting %s at %s (libfuse %s)", backing, mountpoint, fuse_version())
    try:
        _CrashFUSE(
            ops,
            str(mountpoint),
            foreground=True,
            nothreads=False,
            debug=debug,
            allow_other=True,
            default_permissions=True,
            fsname="crashfs",
            subtype="crashfs",
        )
    finally:
        server.server_close()  # its thread dies with the process; shutdown() would poll
        if not address.startswith("\0"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
        log.info("unmounted %s", mountpoint)


def fuse_version() -> str:
    return f"{mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}"
