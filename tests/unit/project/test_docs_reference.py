"""The generated reference pages and the alert runbooks match the code.

``docs/hooks.py`` builds the command line, settings and metrics tables from the code
at each docs build; these tests hold it to naming everything the code has. Every
alert in deploy/prometheus/alerts.yml links its runbook: a section of
docs/guides/monitoring.md whose heading is the alert's name.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from urllib.parse import urlsplit

import pytest
from pydantic import BaseModel, Field
from tests.promql import alert_rules

from tidemark.cli import parser
from tidemark.observability import Metrics
from tidemark.settings.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "docs" / "guides" / "monitoring.md"


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def heading_anchors(markdown: str) -> set[str]:
    """The ids Python-Markdown's toc gives ``#`` headings (lower case, words joined by
    '-'), outside code fences."""
    anchors = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            text = re.sub(r"[^\w\s-]", "", m.group(1)).strip().lower()
            anchors.add(re.sub(r"[-\s]+", "-", text))
    return anchors


def subcommands(p: argparse.ArgumentParser, prefix: str = "tidemark") -> list[str]:
    """Every command path of the parser, e.g. 'tidemark shapes add'."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.append(f"{prefix} {name}")
                found += subcommands(child, f"{prefix} {name}")
    return found


# -- runbooks --------------------------------------------------------------------------


def test_every_alert_links_a_runbook_section_of_the_monitoring_guide() -> None:
    anchors = heading_anchors(MONITORING.read_text())
    rules = alert_rules()
    assert len(rules) > 10
    for rule in rules:
        url = urlsplit(rule["annotations"].get("runbook_url", ""))
        assert url.path.endswith("/guides/monitoring/"), rule["alert"]
        assert url.fragment == rule["alert"].lower(), rule["alert"]
        assert url.fragment in anchors, f"no '## {rule['alert']}' in {MONITORING.name}"


def test_the_anchor_reader_sees_headings_not_code() -> None:
    page = "# Title\n\n## TidemarkDown\n\n```sh\n# not a heading\n```\n\n## What it means\n"
    assert heading_anchors(page) == {"title", "tidemarkdown", "what-it-means"}


# -- command line --------------------------------------------------------------------


def test_the_cli_reference_has_a_section_for_every_command() -> None:
    page = hooks.cli_markdown()
    commands = subcommands(parser())
    assert {"tidemark run", "tidemark shapes add", "tidemark config check"} <= set(commands)
    for command in ["tidemark", *commands]:
        assert f"\n### {command}\n" in f"\n{page}", command
        assert f"usage: {command} " in page, command


def test_the_cli_reference_lists_every_argument_even_without_help() -> None:
    page = hooks.cli_markdown()
    for command in subcommands(parser()):
        section = page.split(f"### {command}\n", 1)[1].split("\n### ", 1)[0]
        child = parser()
        for word in command.split()[1:]:
            action = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction))
            child = action.choices[word]
        for action in child._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            name = ", ".join(action.option_strings) or action.dest
            assert f"| `{name}` |" in section, f"{command}: {name}"


def test_an_argument_type_the_hook_cannot_describe_fails_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def odd(text: str) -> int:
        return int(text)

    def with_odd_type() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="tidemark")
        p.add_argument("--odd", type=odd)
        return p

    monkeypatch.setattr("tidemark.cli.parser", with_odd_type)
    with pytest.raises(hooks.PluginError, match="--odd"):
        hooks.cli_markdown()


# -- settings ------------------------------------------------------------------------


def test_the_settings_reference_names_every_key_of_every_section() -> None:
    page = hooks.settings_markdown()
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        item = hooks._list_item_model(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            section = page.split(f"### [{name}]\n", 1)[1].split("\n### ", 1)[0]
            for key in annotation.model_fields:
                variable = f"TIDEMARK_{name.upper()}__{key.upper()}"
                assert f"| `{key}` | `{variable}`" in section, f"[{name}] {key}"
        elif item is not None:
            section = page.split(f"### [[{name}]]\n", 1)[1]
            for key in item.model_fields:
                assert f"| `{key}` |" in section, f"[[{name}]] {key}"
        else:
            assert f"| `{name}` | `TIDEMARK_{name.upper()}`" in page, name


@pytest.mark.parametrize(
    ("variable", "value", "read"),
    [
        ("TIDEMARK_SOURCE__SLOT", "other_slot", lambda s: s.source.slot),
        ("TIDEMARK_FLUSH__MAX_AGE_S", "2.5", lambda s: s.flush.max_age_s),
        ("TIDEMARK_LOG_LEVEL", "debug", lambda s: s.log_level),
    ],
)
def test_a_variable_the_settings_reference_names_sets_its_key(
    variable: str,
    value: str,
    read: Callable[[Settings], object],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    assert f"`{variable}`" in hooks.settings_markdown()
    for name in [n for n in os.environ if n.startswith("TIDEMARK_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray ./tidemark.toml
    monkeypatch.setenv(variable, value)
    settings = load_settings(require_dsn=False)
    assert str(read(settings)) == value


def test_a_secret_default_is_never_shown() -> None:
    class Section(BaseModel):
        dsn: str = "postgresql://u:hunter2@db/app"
        admin_token: str = Field(default="hunter2", description="the token")
        slot: str = "hunter2"

    table = hooks.section_table(Section.model_fields, "x", lambda key: "", set())
    assert table.count("hunter2") == 1  # the slot's, not a secret
    assert table.count("(secret: not shown)") == 2


def test_every_extra_settings_description_names_a_key_without_its_own() -> None:
    # a description added in config.py must replace the hook's (the build says so)
    hooks._check_more(Settings)
    for dotted in hooks._MORE:
        section, _, key = dotted.rpartition(".")
        model: type[BaseModel] = Settings
        if section:
            annotation = Settings.model_fields[section].annotation
            model = hooks._list_item_model(annotation) or annotation
        assert model.model_fields[key].description is None, dotted


# -- metrics ---------------------------------------------------------------------------


def test_the_metrics_reference_names_every_metric_family() -> None:
    page = hooks.metrics_markdown()
    families = list(Metrics().registry.collect())
    assert len(families) > 40
    for family in families:
        exported = family.name + ("_total" if family.type == "counter" else "")
        row = next((r for r in page.splitlines() if r.startswith(f"| `{exported}` |")), None)
        assert row is not None, exported
        assert f"| {family.type} |" in row, exported


def test_the_metrics_reference_gives_each_metric_its_labels() -> None:
    page = hooks.metrics_markdown()
    row = next(r for r in page.splitlines() if r.startswith("| `tidemark_table_files_max` |"))
    assert "| `table` |" in row
    row = next(r for r in page.splitlines() if r.startswith("| `tidemark_build_info` |"))
    assert "`version`, `python`, `pyspark`" in row


# -- the hook ----------------------------------------------------------------------------


def test_the_hook_replaces_markers_and_refuses_unknown_ones() -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_path="reference/x.md"))
    done = hooks.on_page_markdown("# X\n\n<!-- generated: metrics -->\n", page, None, None)
    assert "<!-- generated" not in done and "| `tidemark_up` |" in done
    with pytest.raises(hooks.PluginError, match=re.escape("reference/x.md")):
        hooks.on_page_markdown("<!-- generated: nothing -->\n", page, None, None)


def test_a_tidemark_that_cannot_be_imported_fails_the_build() -> None:
    with pytest.raises(hooks.PluginError, match=re.escape("cannot import tidemark.no_such_module")):
        hooks._tidemark("tidemark.no_such_module")


def test_each_reference_page_has_its_marker() -> None:
    for page, name in (
        ("reference/cli.md", "cli"),
        ("reference/configuration.md", "settings"),
        ("reference/metrics.md", "metrics"),
    ):
        text = (ROOT / "docs" / page).read_text()
        assert f"\n<!-- generated: {name} -->\n" in text, page
