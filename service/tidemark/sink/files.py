"""A data file a commit adds, described from its Parquet footer.

Spark writes a batch's files; the sink describes each one (``describe_file``: size,
time, row count, and the statistics of ``_lsn``/``_op`` a reader prunes by and the
current-state refresh finds its tail with) and a table format's commit adds it.
Format-neutral: the statistics JSON is Delta's (``numRecords``, ``minValues``,
``maxValues``, ``nullCount``), which other formats translate.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidemark.sink.schema import LSN, OP


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet file inside a table folder, ready to be added by a commit."""

    path: str  # relative to the table root, '/'-separated
    size: int
    num_rows: int
    modification_time_ms: int
    stats: str  # statistics JSON: numRecords, min/max/null counts of _lsn and _op


def describe_file(table_root: Path, rel_path: str) -> DataFile:
    """A Parquet file at ``rel_path`` under a table's folder, described for a commit
    (size, time, row count and ``_lsn``/``_op`` statistics from its footer)."""
    path = table_root / rel_path
    st = path.stat()
    rows, stats = file_stats(path)
    return DataFile(rel_path, st.st_size, rows, int(st.st_mtime * 1000), stats)


FOOTER_TAIL = 64 * 1024  # the bytes read from a file's end for its footer


class _Tail(io.RawIOBase):
    """The end of a Parquet file of ``size`` bytes, as a file pyarrow reads the footer
    from (a read before the tail raises ``TailTooShort``)."""

    def __init__(self, tail: bytes, size: int) -> None:
        self._tail, self._size, self._pos = tail, size, 0
        self._start = size - len(tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos < self._start:
            raise TailTooShort
        chunk = self._tail[self._pos - self._start : self._pos - self._start + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


class TailTooShort(OSError):
    """A footer longer than the tail read (``tail_stats``)."""


def tail_stats(tail: bytes, size: int) -> tuple[int, str] | None:
    """``file_stats`` from the last bytes of a file of ``size`` bytes (one ranged read on
    an object store, not pyarrow's HEAD and reads); None when the footer is longer."""
    try:
        return _stats(pq.read_metadata(_Tail(tail, size)))
    except Exception:  # (TailTooShort, however pyarrow passes it on: read it whole)
        return None


def file_stats(path: Path | str, filesystem: Any = None) -> tuple[int, str]:
    """Row count and Delta stats (min/max/nulls of ``_lsn``/``_op``) from a footer
    (``filesystem``: pyarrow's, for a file on an object store)."""
    return _stats(pq.read_metadata(path, filesystem=filesystem))


def arrow_stats(rows: pa.Table) -> tuple[int, str]:
    """``file_stats`` of a file holding exactly ``rows``, from the rows themselves: what
    its footer would say (the same JSON), so a round on an object store need not read
    back the footer of a file it wrote (``describe_remote``'s ``known``)."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for column in (LSN, OP):
        if column not in rows.column_names:
            continue
        values = rows.column(column)
        found = pc.min_max(values)
        lo, hi = found["min"].as_py(), found["max"].as_py()
        if lo is not None:
            mins[column], maxs[column], nulls[column] = lo, hi, values.null_count
    stats = {"numRecords": rows.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return rows.num_rows, json.dumps(stats)


def _stats(meta: Any) -> tuple[int, str]:
    names = meta.schema.names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for column in (LSN, OP):
        if column not in names:
            continue
        idx = names.index(column)
        lo = hi = None
        null_count = 0
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(idx).statistics
            if st is None or not st.has_min_max:
                lo = hi = None
                break
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            null_count += st.null_count or 0
        if lo is not None:
            mins[column], maxs[column], nulls[column] = lo, hi, null_count
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return meta.num_rows, json.dumps(stats)
