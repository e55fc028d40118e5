"""What is wrong with the settings, said so that a person can fix it.

``load_settings`` (``tidemark.settings.config``) turns every problem into a ``ConfigError``
whose message comes from here: each names the setting, where its value came from
(the environment variable, or the file) and what to do. An unknown key lists the
valid ones and suggests the nearest (``slto`` -> ``slot``); a ``TIDEMARK_*``
variable that names no section (``TIDEMARK_SORCE__DSN``) or is one letter away from
a setting (``TIDEMARK_SHAPE``) is refused too, so a typo never leaves a setting at
its default without a word. Variables that are not settings (``TIDEMARK_CONFIG``,
``TIDEMARK_URL``, the tests' own) are left alone. The settings model is given by the
caller (``tidemark.settings.config.Settings``): this module reads pydantic models, not
tidemark's own, so the settings import it and not the other way round.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_settings.exceptions import SettingsError

from tidemark.errors import ConfigError

# TIDEMARK_* variables that are not settings (read by the CLI, the tests, ...)
NOT_SETTINGS = frozenset({"config", "url", "exit_reason_file"})


def _model(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds: itself, or the items of a list of them."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The ``[section]`` tables of ``model``: its fields that are models themselves."""
    return {
        name: field.annotation
        for name, field in model.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


def _nearest(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_environment(model: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Refuse TIDEMARK_* variables that look like settings of ``model`` but name none."""
    problems = []
    fields = model.model_fields
    sections = _sections(model)
    for key in sorted(environ):
        if not key.upper().startswith("TIDEMARK_"):
            continue
        name = key[len("TIDEMARK_") :].lower()
        section, nested, _ = name.partition("__")
        if nested and section not in fields:
            close = difflib.get_close_matches(section, list(sections), n=1, cutoff=0.6)
            hint = f"; did you mean TIDEMARK_{close[0].upper()}__{key.split('__', 1)[1]}?"
            problems.append(
                f"  environment variable {key}: there is no settings section {section!r}"
                + (hint if close else f" (sections: {', '.join(sections)})")
            )
        elif not nested and name not in fields and name not in NOT_SETTINGS:
            close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.8)
            if close:
                problems.append(
                    f"  environment variable {key} is not a setting; did you mean "
                    f"TIDEMARK_{close[0].upper()}?"
                )
    if problems:
        raise ConfigError("invalid configuration:\n" + "\n".join(problems))


def _env_name(loc: tuple[Any, ...]) -> str:
    return "TIDEMARK_" + "__".join(str(p).upper() for p in loc if not isinstance(p, int))


def _origin(loc: tuple[Any, ...], file: Path | None, environ: Mapping[str, str]) -> str:
    """Where the value at ``loc`` came from: the most specific variable set, or the file."""
    upper = {k.upper() for k in environ}
    parts = [p for p in loc if not isinstance(p, int)]
    for end in range(len(parts), 0, -1):
        name = _env_name(tuple(parts[:end]))
        if name in upper:
            return f"environment variable {name}"
    if file is not None:
        return f"in {file}"
    return f"in tidemark.toml or {_env_name(loc)}"


def _where(loc: tuple[Any, ...]) -> str:
    if loc and loc[0] == "shapes" and len(loc) > 1 and isinstance(loc[1], int):
        return f"[[shapes]] #{loc[1] + 1}"
    return f"[{loc[0]}]"


def _path(loc: tuple[Any, ...]) -> str:
    """A setting's name (``sink.root``); a shape's as the file numbers it, from 1, as
    every other message does (``[[shapes]] #1 name``, not ``shapes.0.name``)."""
    if loc and loc[0] == "shapes" and len(loc) > 1 and isinstance(loc[1], int):
        rest = " ".join(str(p) for p in loc[2:] if not isinstance(p, int))
        return f"[[shapes]] #{loc[1] + 1}" + (f" {rest}" if rest else "")
    return ".".join(str(p) for p in loc) or "settings"


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    inner = _model(model.model_fields[str(loc[0])].annotation)
    return list(inner.model_fields) if inner is not None else []


def explain_validation(
    model: type[BaseModel], exc: ValidationError, file: Path | None, environ: Mapping[str, str]
) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        origin = _origin(loc, file, environ)
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            name = str(loc[0])
            lines.append(
                f"  unknown section or key {name!r}{_nearest(name, model.model_fields)} "
                f"(valid: {', '.join(model.model_fields)}) ({origin})"
            )
            continue
        if err["type"] == "extra_forbidden":
            name, valid = str(loc[-1]), _valid_keys(model, loc)
            lines.append(
                f"  unknown setting {name!r} in {_where(loc)}{_nearest(name, valid)} "
                f"(valid keys: {', '.join(valid)}) ({origin})"
            )
            continue
        ctx = err.get("ctx") or {}
        message = str(ctx["error"]) if "error" in ctx else err["msg"]
        lines.append(f"  {_path(loc)}: {message} ({origin})")
    return "\n".join(lines)


def explain_json_error(exc: SettingsError, environ: Mapping[str, str]) -> str:
    """pydantic-settings could not decode a variable's JSON: name it and the error."""
    match = re.search(r'field "(\w+)"', str(exc))
    field = match.group(1) if match else ""
    prefix = f"TIDEMARK_{field.upper()}"
    for key, value in sorted(environ.items()):
        upper = key.upper()
        if upper != prefix and not upper.startswith(prefix + "__"):
            continue
        try:
            json.loads(value)
        except ValueError as error:
            example = (
                '[{"name": "orders_eu", "table": "public.orders"}]'
                if field == "shapes"
                else '{"key": "value"}'
            )
            return f"{key} is not valid JSON: {error}; give JSON, e.g. {example}"
    return f"cannot read the settings from the environment: {exc} ({exc.__cause__})"
