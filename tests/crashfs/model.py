"""The durability model of crashfs: which parts of a file tree survive a power loss.

A :class:`DurabilityModel` mirrors the namespace of a live file tree (the crashfs
backing directory) with its own inode ids, and records what a strict POSIX file
system would have on its disk if the power failed now. It promises exactly this:

* Everything that existed when the model adopted a directory (mount time) is durable
  as it was then: names, file contents, modes and symlink targets.
* A file's content (its data and size) becomes durable only when ``fsync`` or
  ``fdatasync`` is called on that file, through any of its file descriptors or names
  (:meth:`DurabilityModel.sync_file`). Then its whole current content is copied into
  a snapshot (``<state>/blobs/<id>``), together with its current mode. ``fdatasync``
  counts as ``fsync`` here. ``close``, ``write`` returning, ``flush`` and ``msync``
  alone make nothing durable.
* A directory's list of entries (name -> inode) becomes durable only when that
  directory is fsynced (``fsync`` on a directory fd; in FUSE terms ``fsyncdir``;
  :meth:`DurabilityModel.sync_dir`). Then its whole current list is durable, with
  its current mode. So a create, mkdir, symlink, link, unlink, rmdir or rename is
  durable only once each directory it changed has been fsynced: a rename between
  two directories needs both, and a file in a new directory needs the new directory
  *and* its parent (and so on up to a durable ancestor) to be fsynced.
* ``sync(2)`` and ``syncfs(2)`` make nothing durable: the Linux kernel forwards them
  to FUSE servers only for virtiofs (``fc->sync_fs``), so a crashfs never sees them.
  A program that relies on them alone loses its data here; on ext4 it would not.
* Renaming, chmod and times: a chmod becomes durable with the next fsync of that
  inode (its mode is part of the snapshot); a new inode's creation mode is durable
  with its first durable name. Owners and timestamps are not modelled: after a
  power loss they are those of the process that rebuilds the tree, and "now".

After a power loss (:meth:`DurabilityModel.freeze`, then
:meth:`DurableImage.materialize`), the tree is rebuilt from the root's durable
entries, recursively:

* a file whose name is durable but whose content was never synced comes back empty
  (size 0), like ext4's delayed allocation; otherwise with its last snapshot;
* a directory whose name is durable but which was never fsynced comes back with the
  entries that were durable when it was adopted (none if it was created later);
* an entry whose inode was durable under two names (a rename whose source directory
  was not fsynced, or a hard link) comes back as a hard link when it is a file; a
  directory comes back once only, at the first of its names in a depth-first walk
  that takes names in sorted order (so no cycle can appear), and is missing at the
  others. Real journaling file systems commit a rename atomically, so this model is
  stricter than ext4 or xfs: it allows exactly what POSIX allows.

Identity is the model's own: every create, mkdir, symlink or mknod gets a fresh id,
and hard links share the id of their inode. Backing inode numbers are never used
to identify an inode after adoption, so an inode number that the backing file
system reuses after an unlink can never make a new file inherit an old file's
durable content.

Snapshots stay in the state directory until it is dropped (the controller gives each
mount a fresh one): one per inode ever synced, its latest, unlinked inodes included.

The model is thread-safe. Its namespace methods mirror operations that already
succeeded on the backing tree and raise ``OSError`` (with the errno the kernel would
give) when the mirror cannot apply: a caller that keeps both in step (the crashfs
passthrough does so under one lock) never sees one. After :meth:`freeze` every
mutation raises :class:`Frozen`: the power is off.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NodeId = int
DURABLE_IMAGE = "durable.json"  # where a frozen daemon saves its image, in its state dir

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


class Kind(enum.Enum):
    """What an inode is; ``SPECIAL`` covers FIFOs, sockets and device nodes."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    SPECIAL = "special"


class Frozen(Exception):
    """The model was frozen (power cut): nothing may change any more."""


@dataclass
class _Node:
    kind: Kind
    mode: int  # full st_mode (type and permission bits), live
    durable_mode: int  # st_mode as it is on "disk"
    target: str | None = None  # symlinks
    rdev: int = 0  # specials
    entries: dict[str, NodeId] | None = None  # dirs, live
    durable_entries: dict[str, NodeId] | None = None  # dirs, on "disk"
    content_durable: bool = False  # files: blobs/<id> holds the durable content


@dataclass(frozen=True)
class DurableNode:
    """An inode as it is on "disk" at the moment of a power loss."""

    kind: Kind
    mode: int
    target: str | None = None
    rdev: int = 0
    entries: Mapping[str, NodeId] = field(default_factory=dict)
    content_durable: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "mode": self.mode,
            "target": self.target,
            "rdev": self.rdev,
            "entries": dict(self.entries),
            "content_durable": self.content_durable,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DurableNode:
        return cls(
            kind=Kind(raw["kind"]),
            mode=int(raw["mode"]),
            target=raw.get("target"),
            rdev=int(raw.get("rdev", 0)),
            entries={str(k): int(v) for k, v in raw.get("entries", {}).items()},
            content_durable=bool(raw.get("content_durable", False)),
        )


@dataclass(frozen=True)
class DurableImage:
    """What survives a power loss: the durable inodes and where their snapshots are."""

    root: NodeId
    nodes: Mapping[NodeId, DurableNode]
    blobs: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "blobs": str(self.blobs),
            "nodes": {str(i): n.to_json() for i, n in self.nodes.items()},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DurableImage:
        return cls(
            root=int(raw["root"]),
            blobs=Path(raw["blobs"]),
            nodes={int(i): DurableNode.from_json(n) for i, n in raw["nodes"].items()},
        )

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> DurableImage:
        return cls.from_json(json.loads(path.read_text()))

    def materialize(self, dest: Path) -> None:
        """Replace everything inside ``dest`` (which stays) by the durable tree.

        The root's durable entries are rebuilt recursively (see the module docstring
        for files never synced, directories never fsynced and inodes durable under
        two names). Files are copies of their snapshots, so materializing twice gives
        the same tree.
        """
        _clear_directory(dest)
        placed: dict[NodeId, Path] = {}  # files already materialized -> first path
        seen_dirs: set[NodeId] = {self.root}
        dir_modes: list[tuple[Path, int]] = []

        def build(dir_id: NodeId, at: Path) -> None:
            for name, child_id in sorted(self.nodes[dir_id].entries.items()):
                child = self.nodes[child_id]
                path = at / name
                if child.kind is Kind.DIR:
                    if child_id in seen_dirs:
                        continue  # a directory appears once only
                    seen_dirs.add(child_id)
                    path.mkdir()
                    build(child_id, path)
                    dir_modes.append((path, child.mode))
                elif child.kind is Kind.SYMLINK:
                    os.symlink(child.target or "", path)
                elif child_id in placed:
                    os.link(placed[child_id], path)
                elif child.kind is Kind.FILE:
                    if child.content_durable:
                        copy_content(self.blobs / str(child_id), path)
                    else:
                        path.touch()
                    os.chmod(path, stat.S_IMODE(child.mode))
                    placed[child_id] = path
                else:
                    os.mknod(path, child.mode, child.rdev)
                    placed[child_id] = path

        build(self.root, dest)
        # permissions of directories last: a read-only one must still have been filled
        for path, mode in reversed(dir_modes):
            os.chmod(path, stat.S_IMODE(mode))
        os.chmod(dest, stat.S_IMODE(self.nodes[self.root].mode))


class DurabilityModel:
    """The live namespace of a tree, by the model's own inode ids, and its durable image.

    Paths are relative to the tree's root: ``"/a/b"``, ``"a/b"`` and ``"/"`` (the
    root) all work. Snapshots of synced contents go to ``<state>/blobs``.
    """

    def __init__(self, state: Path) -> None:
        self.state = state
        self.blobs = state / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._frozen = False
        self._next_id = 1
        self._copies = 0  # unique names for in-flight snapshot copies
        self._nodes: dict[NodeId, _Node] = {}
        self.root = self._new(Kind.DIR, stat.S_IFDIR | 0o755)
        root = self._nodes[self.root]
        root.durable_entries = {}

    # -- adoption ---------------------------------------------------------------------

    @classmethod
    def adopt(cls, backing: Path, state: Path) -> DurabilityModel:
        """A model of the tree now under ``backing``, all of it durable (its files are
        copied into snapshots now, so mount time grows with the data)."""
        model = cls(state)
        by_inode: dict[tuple[int, int], NodeId] = {}
        root_st = os.lstat(backing)
        root = model._nodes[model.root]
        root.mode = root.durable_mode = root_st.st_mode
        by_inode[(root_st.st_dev, root_st.st_ino)] = model.root

        def walk(dir_id: NodeId, at: Path) -> None:
            entries: dict[str, NodeId] = {}
            with os.scandir(at) as it:
                listing = sorted(it, key=lambda e: e.name)
            for entry in listing:
                st = entry.stat(follow_symlinks=False)
                key = (st.st_dev, st.st_ino)
                if key in by_inode and not stat.S_ISDIR(st.st_mode):
                    entries[entry.name] = by_inode[key]  # a hard link
                    continue
                kind = kind_of(st.st_mode)
                node_id = model._new(
                    kind,
                    st.st_mode,
                    target=os.readlink(entry.path) if kind is Kind.SYMLINK else None,
                    rdev=st.st_rdev if kind is Kind.SPECIAL else 0,
                )
                by_inode[key] = node_id
                entries[entry.name] = node_id
                node = model._nodes[node_id]
                if kind is Kind.DIR:
                    walk(node_id, Path(entry.path))
                elif kind is Kind.FILE:
                    copy_content(Path(entry.path), model.blobs / str(node_id))
                    node.content_durable = True
            node = model._nodes[dir_id]
            node.entries = entries
            node.durable_entries = dict(entries)

        walk(model.root, backing)
        return model

    # -- namespace mirror -------------------------------------------------------------

    def lookup(self, path: str) -> NodeId:
        """The inode at ``path`` (``FileNotFoundError``/``NotADirectoryError`` if none)."""
        with self._lock:
            return self._resolve(_parts(path))

    def kind(self, node: NodeId) -> Kind:
        with self._lock:
            return self._nodes[node].kind

    def create(
        self, path: str, kind: Kind, mode: int, *, target: str | None = None, rdev: int = 0
    ) -> NodeId:
        """A new inode at ``path`` (a file, directory, symlink or special file).

        ``mode`` may hold only permission bits; the type bits follow ``kind``.
        """
        if kind is Kind.SYMLINK and target is None:
            raise ValueError("a symlink needs a target")
        with self._lock:
            self._check_live()
            parent, name = self._parent_of(path)
            if name in parent:
                raise _error(errno.EEXIST, path)
            mode = _with_type(kind, mode)
            node_id = self._new(kind, mode, target=target, rdev=rdev)
            parent[name] = node_id
            return node_id

    def link(self, existing: str, new: str) -> NodeId:
        """A hard link ``new`` to the inode at ``existing`` (not a directory)."""
        with self._lock:
            self._check_live()
            node_id = self._resolve(_parts(existing))
            if self._nodes[node_id].kind is Kind.DIR:
                raise _error(errno.EPERM, existing)
            parent, name = self._parent_of(new)
            if name in parent:
                raise _error(errno.EEXIST, new)
            parent[name] = node_id
            return node_id

    def unlink(self, path: str) -> None:
        with self._lock:
            self._check_live()
            parent, name = self._parent_of(path)
            node_id = _entry(parent, name, path)
            if self._nodes[node_id].kind is Kind.DIR:
                raise _error(errno.EISDIR, path)
            del parent[name]

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._check_live()
            parent, name = self._parent_of(path)
            node_id = _entry(parent, name, path)
            node = self._nodes[node_id]
            if node.kind is not Kind.DIR:
                raise _error(errno.ENOTDIR, path)
            if node.entries:
                raise _error(errno.ENOTEMPTY, path)
            del parent[name]

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        """``renameat2(old, new, flags)``: flags 0, ``RENAME_NOREPLACE`` or
        ``RENAME_EXCHANGE``."""
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
            RENAME_NOREPLACE | RENAME_EXCHANGE
        ):
            raise _error(errno.EINVAL, old)
        with self._lock:
            self._check_live()
            src_parent, src_name = self._parent_of(old)
            dst_parent, dst_name = self._parent_of(new)
            src_id = _entry(src_parent, src_name, old)
            dst_id = dst_parent.get(dst_name)
            if self._nodes[src_id].kind is Kind.DIR and self._is_within(_parts(new)[:-1], src_id):
                raise _error(errno.EINVAL, new)  # into itself
            if flags & RENAME_EXCHANGE:
                if dst_id is None:
                    raise _error(errno.ENOENT, new)
                if self._nodes[dst_id].kind is Kind.DIR and self._is_within(
                    _parts(old)[:-1], dst_id
                ):
                    raise _error(errno.EINVAL, old)
                src_parent[src_name], dst_parent[dst_name] = dst_id, src_id
                return
            if dst_id is not None:
                if flags & RENAME_NOREPLACE:
                    raise _error(errno.EEXIST, new)
                if dst_id == src_id:
                    return  # two names of one inode: POSIX says do nothing
                src_dir = self._nodes[src_id].kind is Kind.DIR
                dst = self._nodes[dst_id]
                if src_dir and dst.kind is not Kind.DIR:
                    raise _error(errno.ENOTDIR, new)
                if not src_dir and dst.kind is Kind.DIR:
                    raise _error(errno.EISDIR, new)
                if dst.entries:
                    raise _error(errno.ENOTEMPTY, new)
            del src_parent[src_name]
            dst_parent[dst_name] = src_id

    def chmod(self, node: NodeId, mode: int) -> None:
        with self._lock:
            self._check_live()
            n = self._nodes[node]
            n.mode = stat.S_IFMT(n.mode) | stat.S_IMODE(mode)

    def live_entries(self, path: str) -> dict[str, NodeId]:
        """The entries of the directory at ``path`` now (for checks and tests)."""
        with self._lock:
            node = self._nodes[self._resolve(_parts(path))]
            if node.entries is None:
                raise _error(errno.ENOTDIR, path)
            return dict(node.entries)

    # -- durability -------------------------------------------------------------------

    def sync_file(self, node: NodeId, source: Path | str) -> None:
        """``fsync``/``fdatasync`` of the file inode ``node``, whose current content is
        readable at ``source`` (a path, or ``/proc/self/fd/N`` of an open descriptor).

        The content is copied outside the lock; the snapshot replaces the previous one
        only if the model is not frozen by then (raises :class:`Frozen` otherwise).
        """
        with self._lock:
            self._check_live()
            if self._nodes[node].kind is not Kind.FILE:
                raise _error(errno.EINVAL, str(source))
            self._copies += 1
            tmp = self.blobs / f"{node}.{self._copies}.tmp"
        try:
            copy_content(Path(source), tmp)
            with self._lock:
                self._check_live()
                os.replace(tmp, self.blobs / str(node))
                n = self._nodes[node]
                n.content_durable = True
                n.durable_mode = n.mode
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def sync_dir(self, node: NodeId) -> None:
        """``fsync`` of the directory inode ``node``: its entries and mode are durable."""
        with self._lock:
            self._check_live()
            n = self._nodes[node]
            if n.entries is None:
                raise _error(errno.ENOTDIR, str(node))
            n.durable_entries = dict(n.entries)
            n.durable_mode = n.mode

    def writeback(self, backing: Path) -> int:
        """Everything written so far made durable, as the kernel's periodic writeback
        would (ext4 commits its journal every 5 s, dirty data within ~30 s): every
        directory's entries and every file's content (read from ``backing``, the live
        tree), so that only what is written after this call can be lost. Not a sync
        call a program makes: tests use it to model a power loss that takes only the
        last seconds' unsynced writes. Returns the number of files snapshotted."""
        files: list[tuple[NodeId, Path]] = []
        with self._lock:
            self._check_live()
            seen: set[NodeId] = set()
            stack: list[tuple[NodeId, Path]] = [(self.root, backing)]
            while stack:
                node_id, at = stack.pop()
                node = self._nodes[node_id]
                node.durable_entries = dict(node.entries or {})
                node.durable_mode = node.mode
                for name, child_id in (node.entries or {}).items():
                    child = self._nodes[child_id]
                    if child.kind is Kind.DIR:
                        stack.append((child_id, at / name))
                    elif child.kind is Kind.FILE and child_id not in seen:
                        seen.add(child_id)
                        files.append((child_id, at / name))
        for node_id, path in files:
            with contextlib.suppress(FileNotFoundError):  # (removed meanwhile)
                self.sync_file(node_id, path)
        return len(files)

    def freeze(self) -> DurableImage:
        """Cut the power: from now on nothing changes; the durable image as of now."""
        with self._lock:
            self._frozen = True
            return self._image()

    def image(self) -> DurableImage:
        """The durable image as of now, without freezing (for checks and tests)."""
        with self._lock:
            return self._image()

    @property
    def frozen(self) -> bool:
        return self._frozen

    # -- internals (callers hold the lock) --------------------------------------------

    def _image(self) -> DurableImage:
        nodes = {
            i: DurableNode(
                kind=n.kind,
                mode=n.durable_mode,
                target=n.target,
                rdev=n.rdev,
                entries=dict(n.durable_entries or {}),
                content_durable=n.content_durable,
            )
            for i, n in self._nodes.items()
        }
        return DurableImage(root=self.root, nodes=nodes, blobs=self.blobs)

    def _check_live(self) -> None:
        if self._frozen:
            raise Frozen("the power is off")

    def _new(self, kind: Kind, mode: int, *, target: str | None = None, rdev: int = 0) -> NodeId:
        node_id = self._next_id
        self._next_id += 1
        self._nodes[node_id] = _Node(
            kind=kind,
            mode=mode,
            durable_mode=mode,
            target=target,
            rdev=rdev,
            entries={} if kind is Kind.DIR else None,
            durable_entries={} if kind is Kind.DIR else None,
        )
        return node_id

    def _resolve(self, parts: tuple[str, ...]) -> NodeId:
        node_id = self.root
        for i, name in enumerate(parts):
            entries = self._nodes[node_id].entries
            if entries is None:
                raise _error(errno.ENOTDIR, "/" + "/".join(parts[:i]))
            if name not in entries:
                raise _error(errno.ENOENT, "/" + "/".join(parts[: i + 1]))
            node_id = entries[name]
        return node_id

    def _parent_of(self, path: str) -> tuple[dict[str, NodeId], str]:
        parts = _parts(path)
        if not parts:
            raise _error(errno.EBUSY, "/")  # the root has no parent entry
        entries = self._nodes[self._resolve(parts[:-1])].entries
        if entries is None:
            raise _error(errno.ENOTDIR, path)
        return entries, parts[-1]

    def _is_within(self, parts: tuple[str, ...], ancestor: NodeId) -> bool:
        """Whether the directory at ``parts`` is ``ancestor`` or below it."""
        node_id = self.root
        if node_id == ancestor:
            return True
        for name in parts:
            entries = self._nodes[node_id].entries
            if entries is None or name not in entries:
                return False
            node_id = entries[name]
            if node_id == ancestor:
                return True
        return False


# -- helpers ------------------------------------------------------------------------


_reflinks = True


def copy_content(source: Path, dest: Path) -> None:
    """Copy a file's bytes (a reflink where the file system can, else an in-kernel
    copy), replacing ``dest``; not its metadata."""
    global _reflinks
    with open(source, "rb") as src, open(dest, "wb") as dst:
        if _reflinks:
            try:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
                return
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                    _reflinks = False  # not on this file system: stop asking
        size = os.fstat(src.fileno()).st_size
        copied = 0
        try:
            while copied < size:
                n = os.copy_file_range(src.fileno(), dst.fileno(), size - copied)
                if n == 0:
                    break
                copied += n
        except OSError:
            src.seek(copied)
            dst.seek(copied)
            dst.truncate()
            shutil.copyfileobj(src, dst, 1 << 20)
            return
        if copied < size or src.read(1):  # grew meanwhile: take the rest as it is now
            src.seek(copied)
            dst.seek(copied)
            shutil.copyfileobj(src, dst, 1 << 20)


def _clear_directory(dest: Path) -> None:
    for entry in list(os.scandir(dest)):
        if entry.is_dir(follow_symlinks=False):
            _make_writable(Path(entry.path))
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _make_writable(top: Path) -> None:
    for dirpath, dirnames, _ in os.walk(top):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)


def _parts(path: str) -> tuple[str, ...]:
    parts = tuple(p for p in path.split("/") if p and p != ".")
    if ".." in parts:
        raise ValueError(f"no '..' in model paths: {path!r}")
    return parts


def _entry(entries: dict[str, NodeId], name: str, path: str) -> NodeId:
    if name not in entries:
        raise _error(errno.ENOENT, path)
    return entries[name]


def _error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


def kind_of(mode: int) -> Kind:
    """The model's kind of an inode of this ``st_mode``."""
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    return Kind.SPECIAL


def _with_type(kind: Kind, mode: int) -> int:
    if stat.S_IFMT(mode):
        return mode
    types = {Kind.FILE: stat.S_IFREG, Kind.DIR: stat.S_IFDIR, Kind.SYMLINK: stat.S_IFLNK}
    if kind not in types:
        raise ValueError("a special file's mode must carry its type bits")
    return types[kind] | stat.S_IMODE(mode)


# -- reading trees back (tests, debugging) -------------------------------------------


@dataclass(frozen=True)
class Symlink:
    """A symlink in a :func:`read_tree` result."""

    target: str


Tree = dict[str, "bytes | Symlink | Tree"]


def read_tree(root: Path) -> Tree:
    """A directory as nested dicts: file -> its bytes, symlink -> :class:`Symlink`,
    directory -> its own dict (special files are left out)."""
    out: Tree = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_symlink():
            out[entry.name] = Symlink(os.readlink(entry.path))
        elif entry.is_dir():
            out[entry.name] = read_tree(Path(entry.path))
        elif entry.is_file():
            out[entry.name] = Path(entry.path).read_bytes()
    return out


def walk_paths(tree: Tree, prefix: str = "") -> Iterator[str]:
    """Every path in a :func:`read_tree` result, parents before children."""
    for name, value in tree.items():
        path = f"{prefix}/{name}"
        yield path
        if isinstance(value, dict):
            yield from walk_paths(value, path)
