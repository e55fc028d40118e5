"""A Delta table's log on disk: its entries, what makes them durable, and what a
power loss can leave of them (``recover_log``), for the changelog and current-state
tables alike. The crash argument is in ``tidemark.sink.delta.table``'s docstring.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq
import structlog
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from tidemark.errors import TableDamaged
from tidemark.sink.files import DataFile
from tidemark.state import objectstore
from tidemark.state.durable import SyncSet, sync_folder
from tidemark.state.objectstore import Location

log = structlog.get_logger("tidemark.sink")


def add_action(data: DataFile, *, data_change: bool = True) -> AddAction:
    """The ``deltalake`` add action of a file (the commits made through the library)."""
    return AddAction(data.path, data.size, {}, data.modification_time_ms, data_change, data.stats)


def add_entry(data: DataFile) -> dict[str, Any]:
    """The Delta log's ``add`` action for a file (the appends written directly)."""
    return {
        "path": data.path,
        "partitionValues": {},
        "size": data.size,
        "modificationTime": data.modification_time_ms,
        "dataChange": True,
        "stats": data.stats,
    }


_ENTRY = re.compile(r"[0-9]{20}\.json")
# what makes a folder a Delta table: a commit or a checkpoint in its log
_VERSION_FILE = re.compile(r"[0-9]{20}\.(json|checkpoint(\.[0-9]+\.[0-9]+)?\.parquet)")
# the log's first names looked at (a version's .json and .crc come first; a log cleaned
# of old entries starts at a checkpoint)
_FIRST_NAMES = 16


def delta_exists(uri: Location, options: dict[str, str] | None) -> bool:
    """Whether ``uri`` holds a Delta table (a commit or a checkpoint in its log). On an
    object store one LIST of the log's first names, through botocore: deltalake's
    ``is_deltatable`` holds Python's GIL while it waits for the store (a request, 20+ ms
    on S3), so every other thread and the event loop would wait with it; on disk,
    deltalake's own check."""
    if not objectstore.is_remote(uri):
        return bool(DeltaTable.is_deltatable(str(uri), storage_options=options))
    names = objectstore.first_names(objectstore.join(uri, "_delta_log"), _FIRST_NAMES)
    return any(_VERSION_FILE.fullmatch(name) for name in names)


def _whole_entry(path: Path) -> bool:
    """Whether a log entry is whole: not empty, and every line a JSON object."""
    try:
        text = path.read_bytes()
    except OSError:
        return False
    if not text.strip():
        return False
    try:
        return all(isinstance(json.loads(line), dict) for line in text.splitlines() if line)
    except ValueError:
        return False


def _torn_tail_removed(shape: str, log_dir: Path) -> list[int]:
    """Remove the entries at the end of the log that are not whole; the versions
    left. A torn entry before a whole one is ``TableDamaged`` (each commit is synced
    before the next one is written, so a power loss cannot leave that)."""
    versions = sorted(int(n[:20]) for n in os.listdir(log_dir) if _ENTRY.fullmatch(n))
    removed = []
    while versions and not _whole_entry(log_dir / f"{versions[-1]:020d}.json"):
        version = versions.pop()
        (log_dir / f"{version:020d}.json").unlink()
        removed.append(version)
    if removed:
        sync_folder(log_dir)
        log.warning("table.torn_entries_removed", shape=shape, versions=removed)
    torn = [v for v in versions[-3:] if not _whole_entry(log_dir / f"{v:020d}.json")]
    if torn:
        raise TableDamaged(
            f"shape '{shape}': log entry {torn[0]} of {log_dir} is not whole but later entries are"
        )
    return versions


def _torn_checkpoints_removed(shape: str, log_dir: Path) -> None:
    """A checkpoint (or the hint naming one) that is not whole is removed: the entries
    it summed up are still in the log (tidemark never cleans up entries newer than
    the newest whole checkpoint)."""
    removed = []
    for checkpoint in sorted(log_dir.glob("*.checkpoint*.parquet"), reverse=True):
        try:
            pq.read_metadata(checkpoint)
            break
        except Exception:
            checkpoint.unlink()
            removed.append(checkpoint.name)
    hint = log_dir / "_last_checkpoint"
    if hint.exists():
        try:
            version = int(json.loads(hint.read_text())["version"])
            whole = any(log_dir.glob(f"{version:020d}.checkpoint*.parquet"))
        except (ValueError, KeyError, TypeError, OSError):
            whole = False
        if not whole:
            hint.unlink()
            removed.append(hint.name)
    if removed:
        sync_folder(log_dir)
        log.warning("table.torn_checkpoints_removed", shape=shape, files=removed)


def _entry_adds(entry: Path) -> list[tuple[str, int]]:
    """The files a log entry adds (relative path, size)."""
    out = []
    for line in entry.read_text().splitlines():
        add = json.loads(line).get("add") if line.strip() else None
        if add is not None:
            out.append((unquote(add["path"]), int(add["size"])))
    return out


def entries_sync(log_dir: Path, first: int, last: int) -> SyncSet:
    """What makes log entries ``first..last`` durable (with a checkpoint among them and
    the hint that names it): the entries and the log folder."""
    synced = SyncSet()
    for version in range(first, last + 1):
        entry = log_dir / f"{version:020d}.json"
        if entry.exists():
            synced.file(entry)
        for checkpoint in log_dir.glob(f"{version:020d}.checkpoint*.parquet"):
            synced.file(checkpoint)
    hint = log_dir / "_last_checkpoint"
    if hint.exists():
        synced.file(hint)
    synced.folder(log_dir)
    return synced


def recover_log(shape: str, path: Path, root: Path) -> int | None:
    """Repair what a power loss can leave of a Delta table's commits that were never
    synced, and make the last run's newest commit durable; returns the newest version
    (None: no table).

    Repaired without asking: log entries at the end of the log that are empty or not
    whole JSON (a commit whose entry was never synced, so nothing was acknowledged or
    deleted because of it: removed; the next commit writes that version again), and a
    checkpoint or ``_last_checkpoint`` hint that is not whole (removed: the entries it
    summed up are still in the log). Synced: the newest entry, the files it adds, the
    folders up to ``root`` (a process that crashed between a commit and its sync left
    them in the page cache only, and the restart would acknowledge them). A torn entry
    before a whole one, or a sync that fails, is ``SinkError``."""
    log_dir = path / "_delta_log"
    if not log_dir.is_dir():
        return None
    for stale in log_dir.glob("_commit_*.json.tmp"):  # entries written, never named
        stale.unlink(missing_ok=True)
    versions = _torn_tail_removed(shape, log_dir)
    _torn_checkpoints_removed(shape, log_dir)
    if not versions:
        return None  # a creation that never became durable: created again
    newest = versions[-1]
    synced = entries_sync(log_dir, newest, newest)
    for rel, size in _entry_adds(log_dir / f"{newest:020d}.json"):
        synced.new_file(path / rel, path, size)
    synced.new_folder(log_dir, root)
    synced.sync()
    return newest
