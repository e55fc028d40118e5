"""pyiceberg's file IO with every file it writes synced before it is closed.

A commit through a catalog writes its manifests, manifest list and table metadata
file, then swaps the catalog's pointer to that metadata (a row in the SQL catalog,
which syncs its own commit). pyiceberg syncs none of the files: after a power loss
the pointer could name metadata that never reached the disk. This IO syncs each file
and its folder when the file is closed (``fsync``), so everything a pointer names is
on disk before the pointer moves. With ``[sink] sync = false`` nothing is synced.
Every file is created only after the fence is checked (``tidemark.fencing``).
"""

from __future__ import annotations

import os
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from tidemark import durable, fencing


class _SyncedStream:
    """An output stream that syncs its file, and the file's folder, on close."""

    def __init__(self, inner: Any, path: str) -> None:
        self._inner = inner
        self._path = path
        self._closed = False

    def write(self, data: bytes) -> int:
        return int(self._inner.write(data))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inner.close()
        if durable.syncing():
            _fsync(self._path)
            _fsync(os.path.dirname(self._path) or ".")

    def __enter__(self) -> _SyncedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _SyncedFile(PyArrowFile):
    def create(self, overwrite: bool = False) -> Any:
        # (a leader deposed while alive writes not even the metadata of a commit the
        # catalog would refuse: ``tidemark.fencing``)
        fencing.check()
        stream = super().create(overwrite)
        if not self._path.startswith("/"):  # (an object store: its puts are durable)
            return stream
        return _SyncedStream(stream, self._path)


class SyncedFileIO(PyArrowFileIO):
    """``py-io-impl`` of tidemark's catalogs."""

    def new_output(self, location: str) -> PyArrowFile:
        out = super().new_output(location)
        # the same file, whose streams sync on close
        out.__class__ = _SyncedFile
        return out
