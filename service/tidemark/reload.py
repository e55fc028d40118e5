"""Configuration reload (SIGHUP, ``systemctl reload``): what a new config file changes.

``plan_reload(old, new, registered, policy)`` compares the settings the service runs
with (``old``) and the file read again (``new``) and returns a ``ReloadPlan``:

* **Shapes**, against the shape registry (the truth of what exists), the way start-up
  reconciles them: a declared shape not registered is *added*; a configured shape no
  longer declared is *removed* (its table stays on disk); a declared shape registered
  with another definition is *replaced* (removed, added again, rebuilt from a
  snapshot); a run-time (API) shape that the file now declares with the same
  definition is *adopted* by the configuration, untouched. Run-time shapes the file
  does not name are kept.
* **Flush settings** (``max_rows``, ``max_bytes``, ``max_age_s``, ``min_age_s``,
  ``memory_budget_bytes``, ``stage_bytes``) and ``monitor.stall_grace_s`` take effect
  at once: a new ``FlushPolicy`` built on the running one. So does the admin token
  (``http.admin_token``, also as ``admin_token_file`` holds it: read again).
* **Everything else** (source, including a password its ``password_file`` now holds;
  sink, spark, the rest of http, ``flush.concurrency``,
  ``monitor.period_s``, logging, ``shutdown_grace_s``) is read only at start: those
  keys are listed in ``needs_restart`` and nothing of them is applied.

A new file whose shapes do not parse (or repeat a name) is a ``ConfigError``: the
caller keeps the old settings. Pure: no IO; ``Service.reload`` applies the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tidemark.errors import ConfigError, ShapeError
from tidemark.settings.config import Settings
from tidemark.shapes.model import ShapeDefinition
from tidemark.shapes.registry import RegisteredShape, same_shape
from tidemark.writers.scheduler import FlushPolicy

# settings key -> FlushPolicy field, for what a reload applies at once
FLUSH_FIELDS = {
    "max_rows": "max_rows",
    "max_bytes": "max_bytes",
    "max_age_s": "max_age_s",
    "min_age_s": "min_age_s",
    "memory_budget_bytes": "memory_budget",
    "stage_bytes": "stage_bytes",
}
RELOADABLE = {
    "shapes",
    "monitor.stall_grace_s",
    "http.admin_token",
    *(f"flush.{k}" for k in FLUSH_FIELDS),
}


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    add: tuple[ShapeDefinition, ...] = ()
    remove: tuple[str, ...] = ()
    replace: tuple[ShapeDefinition, ...] = ()
    adopt: tuple[ShapeDefinition, ...] = ()
    flush: FlushPolicy | None = None  # None: unchanged
    changed: tuple[str, ...] = ()  # reloadable keys whose value changed (not shapes)
    needs_restart: tuple[str, ...] = ()  # dotted keys, e.g. "source.dsn"
    settings: Settings | None = None  # what the service runs with once applied

    @property
    def changes_shapes(self) -> bool:
        return bool(self.add or self.remove or self.replace or self.adopt)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        # nested settings sections are flattened; free-form maps (spark.conf) are one key
        if isinstance(value, dict) and name in (
            "source",
            "sink",
            "spark",
            "flush",
            "http",
            "monitor",
            "lease",
            "instance",
        ):
            out |= _flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


def _declared(settings: Settings) -> dict[str, ShapeDefinition]:
    declared: dict[str, ShapeDefinition] = {}
    for shape in settings.shapes:
        try:
            definition = ShapeDefinition(**shape.model_dump())
        except (ShapeError, ValidationError) as exc:
            raise ConfigError(f"shape {shape.name!r} in the new configuration: {exc}") from None
        if definition.name in declared:
            raise ConfigError(
                f"shape {definition.name!r} is declared twice in the new configuration: "
                "shape names must be unique"
            )
        declared[definition.name] = definition
    return declared


def plan_reload(
    old: Settings,
    new: Settings,
    registered: Mapping[str, RegisteredShape],
    policy: FlushPolicy,
) -> ReloadPlan:
    """What reloading ``new`` over a service running ``old`` does (module docstring)."""
    declared = _declared(new)
    add, replace, adopt = [], [], []
    for name, definition in declared.items():
        current = registered.get(name)
        if current is None:
            add.append(definition)
        elif not same_shape(current.definition, definition):
            replace.append(definition)
        elif current.origin != "config":
            adopt.append(definition)
    remove = [
        name for name, r in registered.items() if r.origin == "config" and name not in declared
    ]

    before, after = _flatten(old.model_dump()), _flatten(new.model_dump())
    differs = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    needs_restart = tuple(k for k in differs if k not in RELOADABLE)
    changed = tuple(k for k in differs if k in RELOADABLE and k != "shapes")

    flush = dataclasses.replace(
        policy, **{field: getattr(new.flush, key) for key, field in FLUSH_FIELDS.items()}
    )
    # what the service runs with: the new reloadable values, the old everything else
    settings = old.model_copy(
        update={
            "shapes": new.shapes,
            "flush": old.flush.model_copy(
                update={key: getattr(new.flush, key) for key in FLUSH_FIELDS}
            ),
            "monitor": old.monitor.model_copy(update={"stall_grace_s": new.monitor.stall_grace_s}),
            # a token rotated in admin_token_file (or the file) takes effect at once
            "http": old.http.model_copy(update={"admin_token": new.http.admin_token}),
        }
    )
    return ReloadPlan(
        add=tuple(add),
        remove=tuple(sorted(remove)),
        replace=tuple(replace),
        adopt=tuple(adopt),
        flush=None if flush == policy else flush,
        changed=changed,
        needs_restart=needs_restart,
        settings=settings,
    )
