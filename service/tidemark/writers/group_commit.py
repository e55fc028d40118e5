"""Group commit: the commits of a flush round's members, made durable together.

A round's members had their files written by one Spark job; then, per member, the
log entry its commit will name is written ahead (``prepared_sync``), and three steps
follow, each one for all members at once:

1. every member's files and entry are synced in one group (``sync_group``);
2. each member commits in its own table, the commits in parallel on the commit
   threads (``commit_files``: a replay is skipped, an overlap refused);
3. every committed member's log folder is synced in one group.

A member is reported committed, and so may be acknowledged, only after step 3. A
power loss before it leaves a member's commit absent or whole, never acknowledged;
a member failing any step fails alone (retried as its own flush) and leaves no entry
it prepared behind.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

from tidemark.errors import SinkError
from tidemark.sink.files import DataFile
from tidemark.sink.port import ChangelogTable
from tidemark.state import fencing
from tidemark.state.durable import SyncSet
from tidemark.writers.buffer import Batch
from tidemark.writers.job import CommitResult, commit_files, prepared_sync, sync_group

Member = tuple[ChangelogTable, Batch, list[DataFile]]


def _prepare(
    members: Sequence[tuple[ChangelogTable, Batch, list[DataFile]]],
) -> tuple[list[tuple[SyncSet, Path | None]], dict[int, SinkError]]:
    """A round's first sync step: each member's log entry written (``prepared_sync``),
    then its files and entry synced with every other member's in one group."""
    prepared: list[tuple[SyncSet, Path | None]] = []
    try:
        for table, batch, files in members:
            prepared.append(prepared_sync(table, batch, files))
    except BaseException:  # (e.g. deposed): no entry of this round is left behind
        # (unless deposed: then the next start removes them)
        for _, entry in prepared:
            if entry is not None:
                fencing.remove_own(entry)
        raise
    parts = [(t, b, p[0]) for (t, b, _), p in zip(members, prepared, strict=True)]
    return prepared, sync_group(parts)


async def group_commit(
    members: Sequence[Member], executor: Executor, write_s: float
) -> tuple[dict[int, CommitResult], dict[int, BaseException]]:
    """Commit every member (``write_s``: how long the round's Spark job took); the
    members committed and durable, and those that failed, by index."""
    prepared, failed = await asyncio.to_thread(_prepare, members)
    errors: dict[int, BaseException] = dict(failed)
    loop = asyncio.get_running_loop()
    commits: dict[int, asyncio.Future[CommitResult]] = {}
    for i, (table, batch, files) in enumerate(members):
        entry = prepared[i][1]
        if i in failed:
            if entry is not None:
                fencing.remove_own(entry)
            continue
        commits[i] = loop.run_in_executor(
            executor,
            functools.partial(
                commit_files, table, batch, files, write_s, grouped=True, prepared=entry
            ),
        )
    outcomes = await asyncio.gather(*commits.values(), return_exceptions=True)
    committed: dict[int, CommitResult] = {}
    for i, outcome in zip(commits, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            errors[i] = outcome
        else:
            committed[i] = outcome
    order = list(committed)
    logs = [(members[i][0], members[i][1], members[i][0].log_sync()) for i in order]
    for k, error in (await asyncio.to_thread(sync_group, logs)).items():
        errors[order[k]] = error
        del committed[order[k]]
    return committed, errors
