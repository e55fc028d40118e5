"""Small files that must survive a crash whole: replace, never rewrite in place.

``write_atomically`` writes a temp file in the same folder, fsyncs it, renames it
over the target and fsyncs the folder: a reader (or a restart) sees the old file
or the new one, never a torn mix, and the new one survives power loss once the
call returns. ``remove_stale_temporaries`` clears temp files of writes that
crashed before their rename.
"""

from __future__ import annotations

import contextlib
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


def remove_stale_temporaries(path: Path) -> None:
    """Temp files left by writes of ``path`` that crashed before their rename."""
    if not path.parent.is_dir():
        return
    for stale in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            stale.unlink()
