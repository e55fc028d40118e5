"""mkdocs hook: the reference tables, generated from the code at each build.

A page line that is exactly ``<!-- generated: NAME -->`` is replaced by markdown built
from the running code, so the reference cannot drift from it:

``cli``
    every command of ``tidemark.cli.parser()`` (argparse, subcommands walked
    recursively): its usage line and a table of its arguments.
``settings``
    every section of ``tidemark.settings.config.Settings`` (pydantic): key, environment
    variable, type and limits, default, description.
``metrics``
    every metric family of ``tidemark.observability.Metrics`` (a fresh registry; the
    class starts nothing): name as exported, type, labels, help.
``openapi``
    every operation of ``tidemark.api.openapi.openapi_document()`` (the description
    served at ``GET /v1/openapi.json``): method and path, summary, parameters, body,
    whether it needs the admin token, and each status it answers with its schema or
    problem types.
``problems``
    every problem kind of ``tidemark.api.problems.KINDS``: ``type``, status, title and
    when it is answered.

A marker with another name, or a tidemark that cannot be imported, fails the build
with a message saying what to do: a strict build never publishes a page without its
table. ``cli_markdown()``, ``settings_markdown()``, ``metrics_markdown()``,
``openapi_markdown()`` and ``problems_markdown()`` are plain functions for the tests.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pydantic
from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generated: ([a-z_]+) -->[ \t]*$", re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each generated-content marker of a page by its markdown."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        generator = GENERATORS.get(name)
        if generator is None:
            raise PluginError(
                f"{page.file.src_path}: unknown marker '<!-- generated: {name} -->'; "
                f"docs/hooks.py generates {', '.join(sorted(GENERATORS))}"
            )
        return generator()

    return MARKER.sub(generate, markdown)


def _tidemark(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PluginError(
            f"docs/hooks.py cannot import {module} ({exc}): build the docs with the "
            "project's virtualenv (`.venv/bin/python -m mkdocs build`), where tidemark is "
            "installed (`pip install -e .`)"
        ) from exc


# -- markdown helpers ---------------------------------------------------------------


def _prose(text: str) -> str:
    """``text`` (rST ``code`` allowed) as one line of markdown safe in a table cell:
    code spans kept, and outside them the characters markdown or HTML would take."""
    text = " ".join(inspect.cleandoc(text).split()).replace("``", "`")
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        part = parts[i].replace("\\", "\\\\").replace("&", "&amp;")
        part = part.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
        parts[i] = re.sub(r"([*_\[\]])", r"\\\1", part)
    return "`".join(parts)


def _code(value: str) -> str:
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# -- cli ------------------------------------------------------------------------------

_USAGE_WIDTH = 88


def _value_types() -> dict[Callable[[str], Any], str]:
    """What each argument type of the command line accepts (tidemark.cli.args)."""
    args = _tidemark("tidemark.cli.args")
    return {
        args.positive_seconds: "seconds, above 0",
        args.wait_seconds: f"seconds, above 0 and at most {args.MAX_WAIT_S:g}",
        args.duration: "seconds, 0 or more",
        args.count: "a whole number, 0 or more",
        args.page_size: f"a whole number from 1 to {args.MAX_PAGE}",
        args.port: "a TCP port, 0 to 65535",
        args.lsn_text: "an LSN, like `16/B374D848`",
        args.url_arg: "an http(s) URL, like `http://127.0.0.1:8765`",
    }


def _commands(
    parser: argparse.ArgumentParser, help_text: str | None = None
) -> Iterator[tuple[argparse.ArgumentParser, str | None, list[tuple[str, str | None]]]]:
    """(parser, its help, its subcommands with their help), depth first."""
    subcommands: list[tuple[str, str | None]] = []
    children: list[tuple[argparse.ArgumentParser, str | None]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                subcommands.append((name, helps.get(name)))
                children.append((child, helps.get(name)))
    yield parser, help_text, subcommands
    for child, child_help in children:
        yield from _commands(child, child_help)


def _usage(parser: argparse.ArgumentParser) -> str:
    # a fixed width: the page must not depend on the terminal the build ran in
    formatter = argparse.HelpFormatter(prog=parser.prog, width=_USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _slug(prog: str) -> str:
    return prog.lower().replace(" ", "-")


def _argument_row(
    action: argparse.Action, prog: str, value_types: dict[Callable[[str], Any], str]
) -> list[str]:
    name = ", ".join(action.option_strings) or str(action.metavar or action.dest)
    if action.nargs == 0:
        value = "a flag"
    elif action.choices is not None:
        value = "one of " + ", ".join(_code(str(c)) for c in action.choices)
    elif action.type is None or action.type is str:
        value = "text"
    elif action.type in value_types:
        value = value_types[action.type]
    else:
        raise PluginError(
            f"`{prog} {name}` takes a {getattr(action.type, '__name__', action.type)} "
            "value that docs/hooks.py does not describe: add it to _value_types()"
        )
    required = action.required or not action.option_strings
    if required:
        default = "required"
    elif action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
        default = ""
    elif isinstance(action.default, float):
        default = _code(f"{action.default:g}")
    else:
        default = _code(str(action.default))
    description = ""
    if action.help and action.help != argparse.SUPPRESS:
        description = _prose(action.help % {**vars(action), "prog": prog})
    return [_code(name), value, default, description]


def cli_markdown() -> str:
    """Each command of ``tidemark``: usage, subcommands, arguments."""
    root = _tidemark("tidemark.cli").parser()
    value_types = _value_types()
    out: list[str] = []
    for parser, help_text, subcommands in _commands(root):
        out.append(f"### {parser.prog}")
        about = parser.description if parser is root else help_text
        if about:
            out.append(_prose(about[:1].upper() + about[1:]).rstrip(".") + ".")
        out.append(f"```text\n{_usage(parser)}\n```")
        rows = [
            _argument_row(action, parser.prog, value_types)
            for action in parser._actions
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        ]
        if rows:
            out.append(_table(["Argument", "Value", "Default", "Description"], rows))
        if subcommands:
            items = [
                f"- [{name}](#{_slug(f'{parser.prog} {name}')})"
                + (f": {_prose(text)}" if text else "")
                for name, text in subcommands
            ]
            out.append("Commands:\n\n" + "\n".join(items))
    return "\n\n".join(out) + "\n"


# -- settings ---------------------------------------------------------------------------

# Keys whose pydantic field has no description (their meaning was in comments of
# config.py or in the README). A description added to the field in config.py wins:
# its entry here must then go, or the build says so. Keys: "section.key", or "key"
# for the top level.
_MORE = {
    "source.slot": "the logical replication slot tidemark streams from",
    "source.publication": "the publication the slot decodes",
    "source.create_slot": "create the slot if it does not exist (false: a missing slot "
    "stops tidemark, naming the SQL to create it)",
    "source.create_publication": "create the publication for the shapes' tables if it "
    "does not exist, and add new shapes' tables to it (false: the publication is yours; "
    "a shape whose table is not in it is refused)",
    "source.reconnect_max_s": "longest wait between two attempts to reconnect the "
    "replication stream (the wait doubles from attempt to attempt, with jitter)",
    "sink.vacuum_retention_hours": "vacuum keeps the files a table no longer uses for at "
    "least this many hours",
    "current.enabled": "keep ``<root>/current/<shape>``, the folded state of each shape",
    "spark.app_name": "the Spark application name",
    "spark.conf": "Spark properties, name to value (like ``spark.driver.memory``)",
    "flush.max_rows": "a shape flushes when it holds this many rows",
    "flush.max_bytes": "a shape flushes when it holds this many bytes",
    "flush.max_age_s": "a shape flushes when its oldest row is this old",
    "flush.min_age_s": "while flush jobs are quick, the flush age follows their recent "
    "duration, down to this (at or above ``max_age_s``: the age is always ``max_age_s``)",
    "flush.concurrency": "Spark jobs tidemark runs at once",
    "flush.memory_budget_bytes": "the most tidemark buffers across all writers; above it, "
    "the stream waits (backpressure)",
    "flush.stage_bytes": "an open transaction bigger than this is staged out of memory "
    "(must not exceed ``memory_budget_bytes``: checked at start)",
    "http.host": "address the HTTP API listens on (beyond loopback it needs an admin token "
    "or ``allow_unauthenticated``)",
    "http.port": "port the HTTP API listens on",
    "monitor.period_s": "how often the monitor samples ``pg_stat_replication`` and the slot "
    "and checks them",
    "monitor.stall_grace_s": "a shape that owes a flush and has not flushed for this long "
    "is stalled",
    "shutdown_grace_s": "on SIGTERM, how long the last flush and the stream's stop may take",
    "log_format": "json, console, or auto (console on a TTY, else json)",
    "log_level": "the lowest level logged",
    "shapes.name": "the shape's name: its tables are ``<root>/tables/<name>`` and "
    "``<root>/current/<name>``",
    "shapes.table": "the source table, ``schema.table``",
    "shapes.where": "SQL predicate choosing the rows (none: every row)",
    "shapes.columns": "columns to keep (the primary key always is); ``x::text`` or "
    "``amount::numeric(18,4)`` declares a column's lake type",
    "shapes.replica": "with ``full`` the shape is refused unless its table has REPLICA "
    "IDENTITY FULL",
}

_SECRET = re.compile(r"dsn|token$|password|secret|propert")
_CONSTRAINTS = (("gt", "above"), ("ge", "at least"), ("lt", "below"), ("le", "at most"))


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "model_fields")


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal and len(args) == 1:
        return _code(f'"{args[0]}"' if isinstance(args[0], str) else str(args[0]))
    if origin is typing.Literal:
        return "one of " + ", ".join(
            _code(f'"{a}"' if isinstance(a, str) else str(a)) for a in args
        )
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    names = {
        str: "text",
        bool: "boolean",
        int: "integer",
        float: "number",
        pydantic.SecretStr: "text (secret: never printed)",
    }
    if annotation in names:
        return names[annotation]
    raise PluginError(f"docs/hooks.py cannot describe the settings type {annotation!r}")


def _limits(field: Any) -> str:
    bounds: dict[str, Any] = {}
    pattern = None
    for item in field.metadata:
        for attr, _ in _CONSTRAINTS:
            if getattr(item, attr, None) is not None:
                bounds[attr] = getattr(item, attr)
        pattern = getattr(item, "pattern", None) or pattern
    if "ge" in bounds and "le" in bounds and len(bounds) == 2:
        text = f"from {bounds['ge']:g} to {bounds['le']:g}"
    else:
        text = ", ".join(
            f"{word} {bounds[attr]:g}" for attr, word in _CONSTRAINTS if attr in bounds
        )
    if pattern:
        text += (", " if text else "") + f"matching {_code(pattern)}"
    return text


def _human_bytes(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return ""


def _default(key: str, field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if _SECRET.search(key) and value not in ("", None, {}, []):
        return "(secret: not shown)"
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, str):
        return _code(f'"{value}"')
    if isinstance(value, dict | list):
        return _code(repr(value).replace("'", '"'))
    text = _code(repr(value))
    if isinstance(value, int) and key.endswith("_bytes") and _human_bytes(value):
        text += f" ({_human_bytes(value)})"
    return text


def _description(dotted: str, field: Any, reloadable: set[str]) -> str:
    text = field.description or _MORE.get(dotted, "")
    if field.description and dotted in _MORE:
        raise PluginError(
            f"settings key {dotted} now has a description in tidemark/settings/config.py: remove "
            "its entry from _MORE in docs/hooks.py"
        )
    text = _prose(text) if text else ""
    if dotted in reloadable:
        text += ("" if not text or text.endswith(".") else ".") + " Applied on reload (SIGHUP)."
    return text.strip()


def section_table(
    fields: Mapping[str, Any], section: str | None, env: Callable[[str], str], reloadable: set[str]
) -> str:
    """The table of one settings section: ``fields`` (pydantic FieldInfo by key) as
    ``[section]`` holds them (None: the top level); ``env(key)`` names the variable
    that sets a key (empty: none)."""
    rows = []
    for key, field in fields.items():
        dotted = f"{section}.{key}" if section else key
        limits = _limits(field)
        variable = env(key)
        variable = _code(variable) if variable else ""
        if variable and typing.get_origin(field.annotation) in (list, dict):
            variable += " (JSON)"
        rows.append(
            [
                _code(key),
                variable,
                _type_name(field.annotation) + (f", {limits}" if limits else ""),
                _default(dotted, field),
                _description(dotted, field, reloadable),
            ]
        )
    return _table(["Key", "Environment variable", "Type", "Default", "Description"], rows)


def _list_item_model(annotation: Any) -> Any:
    """The model a ``list[Model]`` field holds, else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and _is_model(args[0]):
        return args[0]
    return None


def _check_more(settings: type[Any]) -> None:
    for dotted in _MORE:
        section, _, key = dotted.rpartition(".")
        model = settings
        if section:
            annotation = settings.model_fields[section].annotation
            model = _list_item_model(annotation) or annotation
        if key not in model.model_fields:
            raise PluginError(
                f"docs/hooks.py describes settings key {dotted}, which tidemark/settings/config.py "
                "no longer has: remove or rename its entry in _MORE"
            )


def settings_markdown() -> str:
    """Every settings section, its keys, and the variables that set them."""
    config = _tidemark("tidemark.settings.config")
    reloadable = set(_tidemark("tidemark.reload").RELOADABLE)
    settings = config.Settings
    prefix = settings.model_config.get("env_prefix", "")
    nested = settings.model_config.get("env_nested_delimiter")
    _check_more(settings)
    sections: list[str] = []
    lists: list[str] = []
    top_level: dict[str, Any] = {}
    for name, field in settings.model_fields.items():
        annotation = field.annotation
        item = _list_item_model(annotation)
        if _is_model(annotation):

            def env(key: str, section: str = name) -> str:
                return f"{prefix}{section}{nested}{key}".upper() if nested else ""

            sections.append(f"### [{name}]")
            if annotation.__doc__:
                sections.append(_prose(annotation.__doc__))
            sections.append(section_table(annotation.model_fields, name, env, reloadable))
        elif item is not None:
            reload = " A change is applied on reload (SIGHUP)." if name in reloadable else ""
            lists += [
                f"### [[{name}]]",
                f"Each `[[{name}]]` table declares one {name.removesuffix('s')}. The environment "
                f"variable "
                f"`{f'{prefix}{name}'.upper()}` sets them all, as a JSON list of objects "
                f"with these keys.{reload}",
                section_table(item.model_fields, name, lambda _key: "", reloadable),
            ]
        else:
            top_level[name] = field
    out = sections
    if top_level:
        out += [
            "### Top level",
            "These keys come before the first `[section]` of the file.",
            section_table(top_level, None, lambda key: f"{prefix}{key}".upper(), reloadable),
        ]
    return "\n\n".join(out + lists) + "\n"


# -- metrics ----------------------------------------------------------------------------


def metrics_markdown() -> str:
    """Every metric family tidemark exports: name, type, labels, help."""
    observability = _tidemark("tidemark.observability")
    metrics = observability.Metrics()  # its own registry: nothing is served or started
    wrappers = {
        getattr(m, "_name", None): m for m in vars(metrics).values() if hasattr(m, "_labelnames")
    }
    rows = []
    for family in metrics.registry.collect():
        wrapper = wrappers.get(family.name)
        if wrapper is not None:
            labels = list(wrapper._labelnames)
        else:  # a collector that is no metric object: its samples name the labels
            labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        exported = family.name + ("_total" if family.type == "counter" else "")
        description = _prose(family.documentation)
        if family.type == "histogram" and wrapper is not None:
            bounds = [f"{b:g}" for b in wrapper._upper_bounds if b != float("inf")]
            description += f" Buckets (`le`): {', '.join(bounds)}."
        rows.append(
            [
                _code(exported),
                family.type,
                ", ".join(_code(label) for label in labels),
                description,
            ]
        )
    return _table(["Metric", "Type", "Labels", "Description"], rows) + "\n"


# -- the HTTP API ------------------------------------------------------------------------

_HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def _answer(status: str, response: dict[str, Any]) -> str:
    """``200 `ShapeList``` or ``400 `invalid-body`, `invalid-shape```: a status and what
    it carries (a schema's name, or its problem types)."""
    for media_type, content in response.get("content", {}).items():
        schema = content["schema"]
        kinds = schema.get("properties", {}).get("type", {}).get("enum")
        if kinds:
            return f"{status} " + ", ".join(_code(k.rsplit("/", 1)[-1]) for k in kinds)
        if "$ref" in schema:
            return f"{status} {_code(schema['$ref'].rsplit('/', 1)[-1])}"
        return f"{status} {media_type}"
    return status


def openapi_markdown() -> str:
    """Every operation of the OpenAPI description: what it takes and answers."""
    document = _tidemark("tidemark.api.openapi").openapi_document()
    rows = []
    for path, item in document["paths"].items():
        shared = item.get("parameters", [])
        for method in _HTTP_METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            parameters = [
                _code(p["name"] + ("" if p.get("required") else "?"))
                for p in [*shared, *operation.get("parameters", [])]
                if p["in"] == "query"
            ]
            body = operation.get("requestBody", {}).get("content", {})
            takes = ", ".join(parameters)
            for content in body.values():
                schema_name = content["schema"]["$ref"].rsplit("/", 1)[-1]
                takes += ("; " if takes else "") + f"body {_code(schema_name)}"
            rows.append(
                [
                    _code(f"{method.upper()} {path}"),
                    _prose(operation["summary"]),
                    takes,
                    "bearer" if operation.get("security") else "",
                    "; ".join(_answer(s, r) for s, r in operation["responses"].items()),
                ]
            )
    return _table(["Operation", "What", "Takes", "Token", "Answers"], rows) + "\n"


def problems_markdown() -> str:
    """Every kind of problem (error) the HTTP API answers with."""
    kinds = _tidemark("tidemark.api.problems").KINDS
    rows = [[_code(k.slug), str(k.status), _prose(k.title), _prose(k.when)] for k in kinds]
    return _table(["`type` (after /problems/)", "Status", "Title", "When"], rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "settings": settings_markdown,
    "metrics": metrics_markdown,
    "openapi": openapi_markdown,
    "problems": problems_markdown,
}
