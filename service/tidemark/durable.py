"""Small files that must survive a crash whole: replace, never rewrite in place.

``write_atomically`` writes a temp file in the same folder, fsyncs it, renames it
over the target and fsyncs the folder: a reader (or a restart) sees the old file
or the new one, never a torn mix, and the new one survives power loss once the
call returns. ``remove_stale_temporaries`` clears temp files of writes that
crashed before their rename. ``publish_new`` moves a written file to a name that
must not exist yet (put-if-absent: a Delta log entry).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import tempfile
from pathlib import Path
from typing import Final

TEMP_SUFFIX: Final = ".tmp"


def write_atomically(path: Path, data: str | bytes) -> None:
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # the rename is durable only once the directory entry is
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
