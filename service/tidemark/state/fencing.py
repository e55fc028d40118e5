"""The fencing token: a leader deposed while alive writes nothing under the sink root.

The lease (``tidemark.state.lease``) says who should lead; it cannot stop a leader that lost
it without noticing (cut off from Postgres only, a VM frozen longer than the lease
check, a session ended by the server): its threads finish what they were doing and its
event loop resumes. The *epoch* stops it:

- ``<root>/_tidemark/leader.json`` holds a number that every new leader raises by one
  (synced) once it holds the lease, before it reads or writes anything else
  (``advance``);
- then it marks every table under the root with it (``sink.delta.epochs.mark_tables``):
  a Delta commit holding only the application transaction ``tidemark-epoch`` at the
  new number;
- every commit tidemark makes carries that application transaction at its own epoch
  (``Fence.app_transactions``) and is refused before it is written when the table's
  is newer (``Fence.check_table``). The check reads the snapshot the commit is built
  on, the commit can land only as the version after that snapshot (put-if-absent), and
  a commit that raced it with the same application id is a conflict: a pause between
  the check and the write cannot let a deposed leader's commit through;
- every other write under the root (state files, staging and spool clean-ups, vacuum,
  a new table) reads ``leader.json`` first (``Fence.check``). A pause between that read
  and the write is not covered: the bound on those writes is the lease deadline below
  for a leader that runs, and nothing for one frozen exactly there (documented). On an
  object store (an ``s3://`` root) the state files are replaced only if unchanged since
  this process read them (``If-Match``: ``tidemark.state.objectstore``), so there the store
  refuses a deposed leader's state write whatever the pause, and ``leader.json`` is
  read at most every ``EPOCH_POLL_S`` (each read is a request);
- a leader that cannot confirm its lease within ``[lease] deadline_s`` suspends every
  write (``suspend``: a write off the event loop waits for the lease, up to
  ``SUSPENDED_WAIT_S``, then fails and is retried; one on the loop fails at once;
  nothing is acknowledged) until it confirms the lease again with its own epoch still
  the newest (``resume``); when
  another instance holds the lease or the epoch moved on, it is deposed: every write
  is refused from then on and the service exits with status 1 (``lease.deposed``).

The fence is process-wide (one service per process): ``install`` at the start of a
lead, ``current`` everywhere a write is made. Without a lease (``[lease] enabled =
false``) there is no epoch and nothing is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import structlog

from tidemark.errors import SinkError, TidemarkError
from tidemark.state import objectstore
from tidemark.state.objectstore import Location, join

log = structlog.get_logger("tidemark.fencing")

EPOCH_APP: Final = "tidemark-epoch"
LEADER_FILE: Final = "_tidemark/leader.json"
# how long a write off the event loop waits for a suspended lease to be confirmed
SUSPENDED_WAIT_S: Final = 30.0
# meanwhile it reads the epoch file this often: a takeover is found without waiting it out
EPOCH_POLL_S: Final = 1.0
RESTART: Final = (
    " (restarted by its supervisor it stands by; if no other tidemark should run on "
    "this slot and sink root, find the one that took over)"
)


class Deposed(TidemarkError):
    """A newer leader took over: this instance must not write under the sink root."""


class LeaseUnconfirmed(SinkError):
    """The lease could not be confirmed within its deadline: writes wait until it is
    (a failed write is retried like any other sink failure)."""


def leader_path(root: Location, instance: str = "") -> Location:
    """The epoch file of an instance: each instance on a root (``[instance] name``) has
    its own leader, lease and epoch, beside its other state files."""
    if not instance:
        return join(root, LEADER_FILE)
    return join(root, "_tidemark", "instances", instance, "leader.json")


def epoch_app(instance: str = "") -> str:
    """The application id of an instance's epoch mark in its tables."""
    return f"{EPOCH_APP}:{instance}" if instance else EPOCH_APP


def read_epoch(root: Location, instance: str = "") -> int:
    """The newest epoch of ``instance`` under ``root`` (0: no leader yet)."""
    path = leader_path(root, instance)
    try:
        text = objectstore.read_text(path)
        if text is None:
            return 0
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise SinkError(
            f"cannot read the leader epoch at {path}: {exc}; if the file is "
            "damaged, stop every instance, remove it and start them again"
        ) from exc
    return int(data.get("epoch", 0))


def advance(root: Location, holder: str, instance: str = "") -> int:
    """Raise the epoch by one (synced) and return it; called holding the lease, so no
    two processes of one instance advance at once."""
    epoch = read_epoch(root, instance) + 1
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = {"epoch": epoch, "holder": holder, "since": since}
    objectstore.replace(leader_path(root, instance), json.dumps(record, indent=1))
    return epoch


class Fence:
    """What this process may write: ``epoch`` None means unfenced (no lease)."""

    def __init__(
        self, root: Location | None = None, epoch: int | None = None, instance: str = ""
    ) -> None:
        self.root: Location | None = None
        if root is not None:
            self.root = root if objectstore.is_remote(root) else Path(root)
        self.epoch = epoch
        self.instance = instance
        self.app_id = epoch_app(instance)
        self.deposed: str | None = None
        self.suspended: str | None = None
        self._epoch_read_at = -EPOCH_POLL_S  # (monotonic: the last read on an object store)
        self._listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._settled = threading.Event()  # not suspended (set) or deposed: no wait
        self._settled.set()
        self._no_waiting = False  # the service stops: a suspended write fails at once

    @property
    def active(self) -> bool:
        return self.epoch is not None

    def on_deposed(self, listener: Callable[[str], None]) -> None:
        """``listener(reason)`` is called once, from whichever thread found it out."""
        self._listeners.append(listener)

    def check(self) -> None:
        """Before a write under the root: ``Deposed`` when a newer leader took over,
        ``LeaseUnconfirmed`` while the lease is not confirmed."""
        if self.epoch is None:
            return
        if self.deposed is not None:
            raise Deposed(self.deposed)
        if self.suspended is not None:
            try:
                self._await_resume()
            except LeaseUnconfirmed:
                # (not only unconfirmed if a newer leader took over meanwhile: a writer
                # finds it here even when the task confirming the lease cannot run)
                self._check_epoch()
                raise
        self._check_epoch()

    def _check_epoch(self) -> None:
        assert self.root is not None and self.epoch is not None
        if not isinstance(self.root, Path):
            # an object store: a read is a request (20 ms or more), and a round makes a
            # few checks per shape; there the state files are fenced by the store itself
            # (If-Match) and the commits by the tables' marks, so the file is read at
            # most every EPOCH_POLL_S
            now = time.monotonic()
            if now - self._epoch_read_at < EPOCH_POLL_S:
                return
            self._epoch_read_at = now
        newest = read_epoch(self.root, self.instance)
        if newest > self.epoch:
            self.depose(
                f"a newer leader (epoch {newest}) took over the sink root {self.root}; "
                f"this instance (epoch {self.epoch}) stops writing{RESTART}"
            )

    def taken_over(self) -> bool:
        """Whether a newer leader took over (then deposed, as ``check`` would be), read
        without waiting on a suspended lease: an unconfirmed lease is not a takeover."""
        if self.epoch is None:
            return False
        if self.deposed is None:
            with contextlib.suppress(Deposed):
                self._check_epoch()
        return self.deposed is not None

    def check_table(self, table_epoch: int | None, where: str) -> None:
        """Before a commit built on a snapshot whose epoch mark is ``table_epoch``."""
        self.check()
        if self.epoch is not None and table_epoch is not None and table_epoch > self.epoch:
            self.depose(
                f"{where} was marked by a newer leader (epoch {table_epoch}); this "
                f"instance (epoch {self.epoch}) stops writing{RESTART}"
            )

    def table_epoch(self, dt: Any) -> int | None:
        """The epoch mark of a Delta table snapshot for this instance (None: none)."""
        return table_epoch(dt, self.app_id)

    def check_snapshot(self, dt: Any, where: str) -> None:
        """``check_table`` with the mark of the snapshot ``dt``."""
        if self.epoch is not None:
            self.check_table(self.table_epoch(dt), where)

    def app_transactions(self) -> list[Any]:
        """The application transaction every commit carries (none when unfenced)."""
        if self.epoch is None:
            return []
        from deltalake import Transaction

        return [Transaction(self.app_id, self.epoch)]

    def commit_info(self) -> dict[str, str]:
        """What every commit records of its writer (``tidemark.epoch``)."""
        return {} if self.epoch is None else {"tidemark.epoch": str(self.epoch)}

    def creation(self) -> Any:
        """The commit properties of a new table's first commit: born marked."""
        if self.epoch is None:
            return None
        from deltalake import CommitProperties

        return CommitProperties(
            custom_metadata=self.commit_info(), app_transactions=self.app_transactions()
        )

    def depose(self, reason: str) -> None:
        with self._lock:
            first = self.deposed is None
            if first:
                self.deposed = reason
        self._settled.set()  # (writers waiting on a suspension learn it now)
        if first:
            log.error("lease.deposed", epoch=self.epoch, reason=reason)
            for listener in self._listeners:
                with contextlib.suppress(Exception):
                    listener(reason)
        raise Deposed(reason)

    def _await_resume(self) -> None:
        """A write made while the lease is unconfirmed: off the event loop it waits (a
        pause, usually of a second or two: the lease is taken back) up to
        ``SUSPENDED_WAIT_S``, reading the epoch file every ``EPOCH_POLL_S`` (a
        takeover deposes it within that, whatever the lease task found out); on the
        event loop, whose task confirms the lease, it
        fails at once. Either way ``LeaseUnconfirmed`` if not resumed, ``Deposed`` if
        a newer leader came meanwhile."""
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        if not on_loop and not self._no_waiting:
            deadline = time.monotonic() + SUSPENDED_WAIT_S
            while not self._settled.wait(min(EPOCH_POLL_S, deadline - time.monotonic())):
                self._check_epoch()  # (Deposed: a newer leader took over meanwhile)
                if time.monotonic() >= deadline:
                    break
        if self.deposed is not None:
            raise Deposed(self.deposed)
        if self.suspended is not None:
            raise LeaseUnconfirmed(self.suspended)

    def suspend(self, reason: str) -> None:
        if self.suspended is None:
            log.warning("lease.writes_suspended", epoch=self.epoch, reason=reason)
        self.suspended = reason
        self._settled.clear()

    def stop_waiting(self) -> None:
        """The service stops: writes waiting for the lease (and any later one) fail now
        with ``LeaseUnconfirmed`` instead of waiting up to ``SUSPENDED_WAIT_S`` (which
        would hold the process after its last task ended)."""
        self._no_waiting = True
        self._settled.set()

    def resume(self) -> None:
        """The lease is confirmed again: writes go on if no newer leader came meanwhile."""
        if self.suspended is not None:
            self.suspended = None
            with contextlib.suppress(Deposed):
                self.check()
            if self.deposed is None:
                log.info("lease.writes_resumed", epoch=self.epoch)
        self._settled.set()


_current = Fence()


def current() -> Fence:
    return _current


def install(fence: Fence) -> Fence:
    global _current
    _current = fence
    return fence


def check() -> None:
    """``current().check()``: before a write under the sink root."""
    _current.check()


def table_epoch(dt: Any, app_id: str = EPOCH_APP) -> int | None:
    """The epoch mark of a Delta table snapshot (None: never marked)."""
    version = dt.transaction_version(app_id)
    return None if version is None else int(version)


def may_write() -> bool:
    """For a clean-up that may be left undone (a removal under the root): False when a
    newer leader took over (the epoch file read) or the lease is unconfirmed; never
    waits for the lease."""
    fence = _current
    return not fence.taken_over() and fence.suspended is None


def remove_own(path: Path) -> None:
    """Remove a file this process wrote and will not name (a commit's log entry never
    published), unless ``may_write`` says no: the next start removes what is left."""
    if path.exists() and may_write():
        path.unlink(missing_ok=True)


def clear(path: str | Path) -> bool:
    """Remove a staging or spool folder under the sink root, unless this process may
    not write there any more (deposed, or its lease unconfirmed: the folder may be a
    newer leader's now; what is left is cleared at the next start). True if removed."""
    import shutil

    if not may_write():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
