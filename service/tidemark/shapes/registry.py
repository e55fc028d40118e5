"""The shape registry: which shapes exist, kept durably in one JSON file.

``ShapeRegistry.open(path)`` loads the file (or starts empty); ``add``, ``remove``,
``get``, ``shapes`` and ``reconcile`` change or read it at run time. Promises:

* **Durable before visible.** Every change is written to a temporary file in the same
  directory, fsynced, renamed over the file with ``os.replace`` and the directory is
  fsynced; only then does the in-memory state change and do listeners run. A crash
  at any point leaves either the old file or the new one, never a mix; leftover
  temporary files are removed on the next ``open``. If writing fails, the registry
  keeps its previous state and the error propagates.
* **Names are unique.** Adding a definition under a taken name is a no-op when the
  definitions are equal (same table, columns, replica, and the same predicate up to
  formatting), and a ``ShapeError`` when they differ, unless ``replace=True``.
* **Origins.** Each shape records where it came from: ``"config"`` (declared in the
  configuration, owned by ``reconcile``) or ``"api"`` (added at run time through the
  API or CLI). Run-time callers may not remove or replace a configured shape: the next
  start-up would bring it back, so the message says to change the configuration.
* **Reconcile at start-up.** ``reconcile(declared)`` makes the configured shapes
  exactly ``declared`` in one durable write: new names are added, names declared
  before but not any more are removed, a declared shape whose definition differs is
  replaced and reported as changed (the service resyncs it), and run-time shapes
  are kept. A declared shape that exists with origin ``"api"`` is adopted by the
  configuration (its definition replaced if it differs).
* **Removal is observable.** ``on_removed(callback)`` registers a callback called
  with the shape's name whenever a definition leaves the registry: removed, or
  replaced by a different one (its old data will never flush). The service wires it
  to ``FlushTracker.handle_shape_removed``. Callbacks run after the change is durable,
  in registration order.

File format (``version`` allows later migrations; a newer version is refused)::

    {"version": 1, "shapes": [{"origin": "config", "definition": {"name": ...,
      "table": ..., "where": ..., "columns": [...], "replica": "default"}}, ...]}

The registry does blocking file IO (one small file, fsync) and is not thread-safe:
one owner calls it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from tidemark.errors import ConfigError, ShapeError, TidemarkError
from tidemark.predicates.compiler import predicate_sql
from tidemark.shapes.model import ShapeDefinition
from tidemark.state import fencing, objectstore
from tidemark.state.durable import remove_stale_temporaries
from tidemark.state.objectstore import Location, is_remote

Origin = Literal["config", "api"]
FORMAT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class RegisteredShape:
    definition: ShapeDefinition
    origin: Origin

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What ``reconcile`` did, by shape name (each sorted)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]  # replaced by a different definition: resync these
    unchanged: tuple[str, ...]  # declared and already registered as declared
    kept: tuple[str, ...] = ()  # run-time shapes, untouched


def same_shape(a: ShapeDefinition, b: ShapeDefinition) -> bool:
    """Equal definitions, the predicate compared as regenerated SQL (formatting and
    the case of keywords do not make a shape different)."""
    if a == b:
        return True
    return _canonical(a) == _canonical(b)


def _canonical(d: ShapeDefinition) -> tuple[Any, ...]:
    where = None if d.predicate is None else predicate_sql(d.predicate)
    return (d.name, d.table, where, d.columns, d.replica)


class ShapeRegistry:
    """The durable set of shape definitions (see the module docstring)."""

    def __init__(self, path: Location, shapes: Iterable[RegisteredShape] = ()) -> None:
        """Use ``open``; this does not read or write the file."""
        self._path = path
        self._shapes: dict[str, RegisteredShape] = {s.name: s for s in shapes}
        self._removed_listeners: list[Callable[[str], object]] = []

    # -- loading -----------------------------------------------------------------

    @classmethod
    def open(cls, path: Location) -> ShapeRegistry:
        """Load this instance's registry stored at ``path`` (a missing file is an empty
        registry), removing temp files its earlier writes left."""
        if not is_remote(path):
            remove_stale_temporaries(Path(path))
        return cls.read(path)

    @classmethod
    def read(cls, path: Location) -> ShapeRegistry:
        """Load the registry at ``path`` and touch nothing: another instance's (a temp
        file beside it may be that instance's write under way)."""
        file = path if is_remote(path) else Path(path)
        try:
            text = objectstore.read_text(file)
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the shape registry {file}: {e}") from e
        if text is None:
            return cls(file)
        return cls(file, _decode(file, text))

    def reload(self) -> None:
        """Read the file again (a standby taking over); listeners stay."""
        self._shapes = ShapeRegistry.open(self._path)._shapes

    # -- reading -----------------------------------------------------------------

    @property
    def path(self) -> Location:
        return self._path

    def get(self, name: str) -> RegisteredShape | None:
        return self._shapes.get(name)

    def shapes(self) -> list[RegisteredShape]:
        """Every registered shape, by name."""
        return [self._shapes[n] for n in sorted(self._shapes)]

    def __contains__(self, name: object) -> bool:
        return name in self._shapes

    def __len__(self) -> int:
        return len(self._shapes)

    # -- listeners ---------------------------------------------------------------

    def on_removed(self, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call ``callback(name)`` whenever a definition leaves the registry; returns a
        function that unregisters it."""
        self._removed_listeners.append(callback)

        def unregister() -> None:
            with contextlib.suppress(ValueError):
                self._removed_listeners.remove(callback)

        return unregister

    # -- changes -----------------------------------------------------------------

    def add(
        self, definition: ShapeDefinition, *, origin: Origin = "api", replace: bool = False
    ) -> bool:
        """Register ``definition``; False when the same shape is already there.

        A different definition under the same name needs ``replace=True`` (then the
        old one counts as removed for listeners). ShapeError otherwise.
        """
        current = self._shapes.get(definition.name)
        if current is not None:
            if same_shape(current.definition, definition):
                return False
            if not replace:
                raise ShapeError(
                    f"shape {definition.name!r} already exists with another definition "
                    f"(table {current.definition.table}, where {current.definition.where!r}, "
                    f"columns {_columns(current.definition)}): remove it first, or replace it "
                    "explicitly (its data will be rebuilt)"
                )
            self._check_owner(current, origin, "replace")
        updated = dict(self._shapes)
        updated[definition.name] = RegisteredShape(definition, origin)
        self._commit(updated, [definition.name] if current is not None else [])
        return True

    def remove(self, name: str, *, origin: Origin = "api") -> RegisteredShape:
        """Unregister shape ``name`` and return it (ShapeError if there is none)."""
        current = self._shapes.get(name)
        if current is None:
            known = ", ".join(sorted(self._shapes)) or "none"
            raise ShapeError(f"there is no shape {name!r} to remove; registered shapes: {known}")
        self._check_owner(current, origin, "remove")
        updated = dict(self._shapes)
        del updated[name]
        self._commit(updated, [name])
        return current

    def reconcile(self, declared: Sequence[ShapeDefinition]) -> ReconcileResult:
        """Make the configured shapes exactly ``declared`` (see the module docstring)."""
        wanted: dict[str, ShapeDefinition] = {}
        for definition in declared:
            if definition.name in wanted:
                raise ConfigError(
                    f"shape {definition.name!r} is declared twice in the configuration: "
                    "shape names must be unique"
                )
            wanted[definition.name] = definition
        updated = dict(self._shapes)
        added, changed, unchanged, removed, kept = [], [], [], [], []
        for name, definition in wanted.items():
            current = updated.get(name)
            updated[name] = RegisteredShape(definition, "config")
            if current is None:
                added.append(name)
            elif same_shape(current.definition, definition):
                unchanged.append(name)
                if current.origin == "config":
                    updated[name] = current  # keep the stored text as it was
            else:
                changed.append(name)
        for name, current in self._shapes.items():
            if name in wanted:
                continue
            if current.origin == "config":
                del updated[name]
                removed.append(name)
            else:
                kept.append(name)
        if updated != self._shapes:
            self._commit(updated, removed + changed)
        return ReconcileResult(
            tuple(sorted(added)),
            tuple(sorted(removed)),
            tuple(sorted(changed)),
            tuple(sorted(unchanged)),
            tuple(sorted(kept)),
        )

    # -- internals ---------------------------------------------------------------

    @staticmethod
    def _check_owner(current: RegisteredShape, origin: Origin, action: str) -> None:
        if current.origin == "config" and origin != "config":
            raise ShapeError(
                f"shape {current.name!r} is declared in the configuration, so it cannot be "
                f"{action}d at run time (it would come back at the next start): change the "
                "configuration instead"
            )

    def _commit(self, updated: dict[str, RegisteredShape], gone: Sequence[str]) -> None:
        """Persist ``updated``, then make it current, then tell the listeners."""
        objectstore.replace(self._path, _encode(updated.values()), check=fencing.check)
        self._shapes = updated
        for name in sorted(gone):
            for listener in list(self._removed_listeners):
                listener(name)


def _columns(definition: ShapeDefinition) -> str:
    return "all" if definition.columns is None else ", ".join(definition.columns)


# --------------------------------------------------------------------------------------
# the file


def _encode(shapes: Iterable[RegisteredShape]) -> bytes:
    document = {
        "version": FORMAT_VERSION,
        "shapes": [
            {"origin": s.origin, "definition": s.definition.model_dump(mode="json")}
            for s in sorted(shapes, key=lambda s: s.name)
        ],
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def _decode(path: Location, text: str) -> list[RegisteredShape]:
    def broken(why: str) -> ConfigError:
        return ConfigError(
            f"the shape registry {path} is not valid ({why}); restore it from a backup, or "
            "move it away to start with no shapes"
        )

    try:
        document = json.loads(text)
    except ValueError as e:
        raise broken(f"not JSON: {e}") from None
    if not isinstance(document, dict) or not isinstance(document.get("shapes"), list):
        raise broken("expected an object with 'version' and 'shapes'")
    version = document.get("version")
    if version != FORMAT_VERSION:
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise ConfigError(
                f"the shape registry {path} has format version {version}, written by a newer "
                f"tidemark (this one reads version {FORMAT_VERSION}): upgrade tidemark"
            )
        raise broken(f"unknown format version {version!r}")
    shapes: dict[str, RegisteredShape] = {}
    for i, entry in enumerate(document["shapes"]):
        if not isinstance(entry, dict) or entry.get("origin") not in ("config", "api"):
            raise broken(f"entry {i} needs an 'origin' of 'config' or 'api'")
        if not isinstance(entry.get("definition"), dict):
            raise broken(f"entry {i} needs a 'definition' object")
        try:
            definition = ShapeDefinition(**entry["definition"])
        except TidemarkError as e:
            raise broken(f"entry {i}: {e}") from None
        if definition.name in shapes:
            raise broken(f"shape {definition.name!r} appears twice")
        shapes[definition.name] = RegisteredShape(definition, entry["origin"])
    return list(shapes.values())
