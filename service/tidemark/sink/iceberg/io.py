"""pyiceberg's file IO, each file written whole at its close: fenced there, then synced.

A commit through a catalog writes its manifests, manifest list and table metadata
file, then swaps the catalog's pointer to that metadata (a row in the SQL catalog,
which syncs its own commit). pyiceberg opens each file when it starts encoding it and
syncs none of them. This IO keeps what pyiceberg writes in memory until the stream is
closed; then it checks the fence (``tidemark.state.fencing``), writes the file, and syncs it
and its folder (``fsync``), so that:

- everything a pointer names is on disk before the pointer moves (after a power loss
  the pointer could otherwise name metadata that never reached the disk); with
  ``[sink] sync = false`` nothing is synced;
- a leader deposed while it was encoding a file (frozen mid-commit, continued after a
  new leader took over) leaves no file at all, not even a part of one: its close finds
  the newer epoch and raises ``Deposed``. What is not covered is a pause between that
  check and the write right after it (a few system calls);
- a deposed leader does not remove files either: pyiceberg deletes the manifests of a
  commit the catalog refused (the new leader's epoch mark moved the table on), and
  those stay, named by no snapshot, as a refused Delta commit leaves its data files.

On an object store (an ``s3://`` root) the file is one PUT with ``If-None-Match: *``
(``objectstore.put_if_absent``), durable when it returns; the catalog's swap is the
commit.

The files are manifests, manifest lists and metadata files (kilobytes to megabytes):
tidemark's data files are written by Spark, not through this IO.
"""

from __future__ import annotations

import io
import os
from typing import Any

from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from tidemark.state import durable, fencing, objectstore


class _WholeAtClose:
    """An output stream that holds what is written until its close, then writes the
    file if this process may still write under the root."""

    def __init__(self, file: _SyncedFile, overwrite: bool) -> None:
        self._file = file
        self._overwrite = overwrite
        self._buffer = io.BytesIO()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> int:
        return self._buffer.write(data)

    def tell(self) -> int:
        return self._buffer.tell()

    def flush(self) -> None:
        """(Nothing reaches the file before the close.)"""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        data = self._buffer.getvalue()
        self._buffer = io.BytesIO()
        fencing.check()
        location = self._file.location
        if location.startswith(S3_SCHEMES):
            _put_object(location, data, self._overwrite)
            return
        with PyArrowFile.create(self._file, self._overwrite) as stream:
            stream.write(data)
        path = self._file._path
        if durable.syncing() and path.startswith("/"):  # (an object store's puts are durable)
            _fsync(path)
            _fsync(os.path.dirname(path) or ".")

    def __enter__(self) -> _WholeAtClose:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def _put_object(location: str, data: bytes, overwrite: bool) -> None:
    """A metadata file on the object store: one PUT, durable when it returns, and
    never over another file unless pyiceberg asks to overwrite (``If-None-Match``)."""
    uri = "s3://" + location.split("://", 1)[1]
    if overwrite:
        objectstore.replace(uri, data)
    elif not objectstore.put_if_absent(uri, data):
        raise FileExistsError(f"Cannot create file, already exists: {location}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _SyncedFile(PyArrowFile):
    def create(self, overwrite: bool = False) -> Any:
        # (a deposed leader does not even start encoding: ``tidemark.state.fencing``)
        fencing.check()
        if not overwrite and self.exists():
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        return _WholeAtClose(self, overwrite)


class SyncedFileIO(PyArrowFileIO):
    """``py-io-impl`` of tidemark's catalogs. On an object store it reads through the
    process's S3 filesystem (``objectstore.arrow_filesystem``: ``[s3]``'s endpoint and
    the AWS credential chain), and writes each file with one conditional PUT."""

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> Any:
        if scheme in {"s3", "s3a", "s3n"}:
            return objectstore.arrow_filesystem()
        return super()._initialize_fs(scheme, netloc)

    def new_output(self, location: str) -> PyArrowFile:
        out = super().new_output(location)
        # the same file, whose streams are written whole at their close
        out.__class__ = _SyncedFile
        return out

    def delete(self, location: str | InputFile | OutputFile) -> None:
        if fencing.may_write():
            super().delete(location)
