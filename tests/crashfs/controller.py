"""Driving crashfs from a test: mount, inject faults, cut the power, remount.

:class:`CrashFS` runs the daemon (``python -m tests.crashfs mount``) as a child process
and promises:

* :meth:`CrashFS.mounted` yields a mounted file system (``fs.root``) and leaves no mount
  behind when the block ends, however it ends: a clean unmount, else a lazy one, else
  the daemon is killed and the mount detached. A test process killed with SIGKILL
  leaves none either: the daemon watches its parent and unmounts (lazily) when it is
  gone.
* :meth:`CrashFS.power_loss` freezes the file system (every operation fails with EIO
  from that instant, nothing more becomes durable), SIGKILLs the given processes
  with their whole trees (process groups they lead included, so a JVM child of a
  Python service dies too) and waits until they are gone, unmounts, replaces the
  backing directory's contents by the durable image, and mounts it again: the new
  mount's durable state is all of that tree.
* :meth:`CrashFS.stats`, :meth:`CrashFS.fail_fsync`, :meth:`CrashFS.set_capacity` and
  :meth:`CrashFS.clear_faults` talk to the running daemon (see ``fuse_fs`` for what
  they mean).

:func:`crashfs_available` says why crashfs cannot mount here (``None`` if it can),
for ``pytest.skip``; :func:`crashfs_fixture` is the fixture ``crashfs`` built on both.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .model import DURABLE_IMAGE, DurableImage

REPO = Path(__file__).resolve().parents[2]
MOUNT_TIMEOUT = 30.0  # adoption copies every file of the backing first
EXIT_TIMEOUT = 10.0


class CrashFSError(RuntimeError):
    """The daemon did not start, answer or stop as it should (its log is quoted)."""


def crashfs_available() -> str | None:
    """Why crashfs cannot be mounted on this machine, or ``None`` if it can."""
    if not sys.platform.startswith("linux"):
        return "crashfs needs Linux"
    if not os.path.exists("/dev/fuse") or not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not accessible"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "fuse" not in filesystems.split():
        return "the kernel has no fuse file system (modprobe fuse)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (apt-get install fuse3, or make fuse)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse 3 not found (apt-get install libfuse3-3, or make fuse)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (pip install -e '.[test]')"
    if os.geteuid() != 0:
        try:
            conf = Path("/etc/fuse.conf").read_text()
        except OSError:
            conf = ""
        if "user_allow_other" not in conf.split():
            return "not root and /etc/fuse.conf lacks user_allow_other (allow_other)"
    return None


@pytest.fixture(name="crashfs")
def crashfs_fixture(tmp_path: Path) -> Iterator[CrashFS]:
    """The fixture ``crashfs``: a crashfs mounted under ``tmp_path``; skips the test
    where FUSE cannot mount. Import it into a test module (``from tests.crashfs import
    crashfs_fixture  # noqa: F401``) and take ``crashfs`` as an argument."""
    require_crashfs()
    with CrashFS.mounted(tmp_path) as fs:
        yield fs


def require_crashfs() -> None:
    """Skip the test, saying why, where crashfs cannot mount; fail it instead where
    ``TIDEMARK_REQUIRE_CRASHFS`` is set (CI: a skipped crash test is not a passed one)."""
    reason = crashfs_available()
    if reason is None:
        return
    if os.environ.get("TIDEMARK_REQUIRE_CRASHFS"):
        pytest.fail(f"crashfs is required here (TIDEMARK_REQUIRE_CRASHFS) but {reason}")
    pytest.skip(reason)


class CrashFS:
    """One crashfs: ``backing`` served at ``root``, state (snapshots) in ``state``.

    Everything lives under ``base/crashfs`` unless ``backing`` is given (its current
    contents are then adopted as durable at mount).
    """

    def __init__(self, base: Path, *, backing: Path | None = None) -> None:
        home = base.resolve() / "crashfs"
        self.backing = backing.resolve() if backing is not None else home / "backing"
        self.root = home / "mnt"
        for d in (self.backing, self.root):
            d.mkdir(parents=True, exist_ok=True)
        self.state = home / "state"
        self.log = home / "crashfs.log"
        self.control = f"@tidemark-crashfs-{os.getpid()}-{secrets.token_hex(6)}"
        self.power_losses = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextlib.contextmanager
    def mounted(cls, base: Path, *, backing: Path | None = None) -> Iterator[CrashFS]:
        """Mounted for the duration of the block; unmounted however the block ends."""
        fs = cls(base, backing=backing)
        try:
            fs.mount()
            yield fs
        finally:
            fs.unmount()

    # -- mounting ---------------------------------------------------------------------

    def mount(self) -> None:
        """Start the daemon on a fresh state and wait until the mount answers."""
        if self._proc is not None:
            raise CrashFSError("already mounted")
        if is_mounted(self.root):  # left by a daemon that died: detach it
            _run(["umount", "-l", str(self.root)])
        shutil.rmtree(self.state, ignore_errors=True)
        self.state.mkdir(parents=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(_python_path())}
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.crashfs",
                    "mount",
                    str(self.backing),
                    str(self.root),
                    "--state",
                    str(self.state),
                    "--control",
                    self.control,
                    "--watch-parent",
                ],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C reaches the test, which unmounts in order
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                self._proc = None
                raise CrashFSError(f"crashfs exited while mounting:\n{self._log_tail()}")
            if is_mounted(self.root):
                with contextlib.suppress(CrashFSError):
                    self._request({"cmd": "ping"})
                    return
            if time.monotonic() > deadline:
                self.unmount()
                raise CrashFSError(f"crashfs did not mount in {MOUNT_TIMEOUT}s")
            time.sleep(0.02)

    def unmount(self) -> None:
        """Unmount and stop the daemon: cleanly if possible, lazily if busy, by force if
        the daemon does not exit. Never raises for a mount that is already gone."""
        proc, self._proc = self._proc, None
        mounted = is_mounted(self.root)
        if mounted and _run(["fusermount3", "-u", "-q", str(self.root)]) != 0:
            # busy: detach it now; the daemon would serve its open files until they
            # are closed, so stop it (they get ENOTCONN, as after any power cut)
            _run(["fusermount3", "-u", "-z", "-q", str(self.root)])
            if proc is not None:
                proc.terminate()
        if proc is not None:
            try:
                proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if is_mounted(self.root):  # the daemon died without unmounting
            _run(["umount", "-l", str(self.root)])

    # -- power ------------------------------------------------------------------------

    def freeze(self) -> None:
        """The power cut: from now on every operation on the mount fails with EIO."""
        self._request({"cmd": "freeze"})

    def power_loss(self, kill: Iterable[int | subprocess.Popen[Any]] = ()) -> None:
        """Cut the power, kill ``kill`` (with their process trees), and come back up on
        what was durable at the cut. The new mount's counters and faults start afresh."""
        self.freeze()
        kill_trees(kill)
        self.unmount()
        image = self.state / DURABLE_IMAGE
        if not image.exists():
            raise CrashFSError(f"no durable image after freeze:\n{self._log_tail()}")
        DurableImage.load(image).materialize(self.backing)
        self.power_losses += 1
        self.mount()

    # -- faults and counters -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: fsync, fdatasync, fsyncdir, injected_fsync_errors, enospc,
        frozen_eio, model_errors; ``ops`` by name; the remaining ``budget``."""
        stats: dict[str, Any] = self._request({"cmd": "stats"})["stats"]
        return stats

    def fail_fsync(self, pattern: str, errno: int = errno.EIO) -> None:
        """fsync/fdatasync/fsyncdir of paths matching ``pattern`` fail with ``errno``."""
        self._request({"cmd": "fail_fsync", "pattern": pattern, "errno": errno})

    def set_capacity(self, nbytes: int | None) -> None:
        """Writes may add ``nbytes`` more bytes, then fail with ENOSPC (None: no limit)."""
        self._request({"cmd": "set_capacity", "bytes": nbytes})

    def freeze_on(self, pattern: str, contains: str | None = None) -> None:
        """Arm a power cut: the file system freezes right after a link or rename gives a
        file a name matching ``pattern`` (from the mount's root) whose content holds
        ``contains`` (any content when None): the instant after a commit's log entry
        appears, before anything syncs it. One cut; ``frozen`` tells when it happened."""
        self._request({"cmd": "freeze_on", "pattern": pattern, "contains": contains})

    def frozen(self) -> bool:
        """Whether the power is cut (by ``freeze`` or an armed ``freeze_on``)."""
        return bool(self._request({"cmd": "stats"})["stats"].get("frozen"))

    def writeback(self) -> None:
        """Make everything written so far durable, as the kernel's periodic writeback
        would: a power loss after this loses only what is written later."""
        self._request({"cmd": "writeback"})

    def clear_faults(self) -> None:
        self._request({"cmd": "clear_faults"})

    # -- internals ----------------------------------------------------------------------

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(30)
                sock.connect("\0" + self.control[1:])
                sock.sendall(json.dumps(request).encode() + b"\n")
                with sock.makefile("rb") as f:
                    line = f.readline()
        except OSError as e:
            raise CrashFSError(f"{request}: {e}; is the daemon alive?\n{self._log_tail()}") from e
        if not line:
            raise CrashFSError(f"no answer to {request}:\n{self._log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise CrashFSError(f"{request} failed: {reply.get('error')}")
        return reply

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# -- helpers ------------------------------------------------------------------------


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at the absolute, symlink-free ``path`` (read from
    /proc/self/mountinfo: no stat, which would fail on a mount whose daemon died)."""
    target = _mountinfo_escape(str(path))
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.split(" ")[4] == target for line in lines)


def kill_trees(roots: Iterable[int | subprocess.Popen[Any]], timeout: float = 10.0) -> None:
    """SIGKILL each process with all its descendants and, for a process group leader,
    its group; wait until every one of them is gone (or a zombie)."""
    roots = list(roots)
    popens = [r for r in roots if isinstance(r, subprocess.Popen)]
    pids = {r.pid if isinstance(r, subprocess.Popen) else r for r in roots}
    if not pids:
        return
    table = _process_table()
    victims = set(pids)
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                victims |= {p for p, (_, pgid) in table.items() if pgid == pid}
    grew = True
    while grew:
        more = {p for p, (ppid, _) in table.items() if ppid in victims} - victims
        grew = bool(more)
        victims |= more
    me = os.getpid()
    while me in table:  # never this process or its ancestors (a group may hold them)
        victims.discard(me)
        me = table[me][0] if me != table[me][0] else 0
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in victims):
        if time.monotonic() > deadline:
            alive = sorted(p for p in victims if _alive(p))
            raise CrashFSError(f"processes still alive after SIGKILL: {alive}")
        time.sleep(0.02)


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) of every process."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] not in "ZX"


def _mountinfo_escape(path: str) -> str:
    return (path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")).replace(
        "\n", "\\012"
    )


def _python_path() -> list[str]:
    extra = os.environ.get("PYTHONPATH", "")
    return [str(REPO), *(p for p in extra.split(os.pathsep) if p)]


def _run(cmd: list[str]) -> int:
    return subprocess.run(cmd, capture_output=True, check=False).returncode
