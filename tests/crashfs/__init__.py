"""crashfs: a FUSE file system for tests that forgets what was not synced.

A passthrough of a backing directory that keeps, beside the live tree, the tree a
strict POSIX file system would have on disk: file contents made durable only by
``fsync``/``fdatasync`` of the file, directory entries only by ``fsync`` of the
directory. :meth:`CrashFS.power_loss` cuts the power (every operation fails with EIO),
kills the processes it is given, and remounts on the durable tree alone. Faults at
run time: fsync errors by path pattern, ENOSPC past a byte budget.

``model`` holds the durability rules (pure Python, no FUSE), ``fuse_fs`` the daemon
(mfusepy on libfuse 3), ``controller`` the test-side handle and ``__main__`` the
command line. Importing this package loads neither mfusepy nor libfuse.
"""

from .controller import (
    CrashFS,
    CrashFSError,
    crashfs_available,
    crashfs_fixture,
    is_mounted,
    kill_trees,
    require_crashfs,
)
from .model import DurabilityModel, DurableImage, Frozen, Kind, Symlink, read_tree

__all__ = [
    "CrashFS",
    "CrashFSError",
    "DurabilityModel",
    "DurableImage",
    "Frozen",
    "Kind",
    "Symlink",
    "crashfs_available",
    "crashfs_fixture",
    "is_mounted",
    "kill_trees",
    "read_tree",
    "require_crashfs",
]
