"""The settings and links of the pages about a user's own Postgres
(docs/get-started/your-postgres.md, docs/guides/preparing-postgres.md).

Every ```toml block is a tidemark.toml the settings loader accepts as it is, with
shapes that validate; every link to another page is relative and names a page in
mkdocs.yml's nav. The guide's ```sql blocks run against a real server in
tests/integration/test_docs_postgres.py.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tidemark.settings.config import load_settings
from tidemark.shapes.model import ShapeDefinition

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
PAGES = ["get-started/your-postgres.md", "guides/preparing-postgres.md"]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def toml_blocks() -> list[Any]:
    params = []
    for page in PAGES:
        found = [b for lang, b in FENCE.findall((DOCS / page).read_text()) if lang == "toml"]
        params += [pytest.param(b, id=f"{page}:toml{n}") for n, b in enumerate(found, 1)]
    return params


def nav_pages(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from nav_pages(value)


def test_each_page_has_a_settings_file() -> None:
    assert len(toml_blocks()) >= len(PAGES)


@pytest.mark.parametrize("block", toml_blocks())
def test_a_toml_block_is_accepted_by_the_settings_loader(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the block as a tidemark.toml, and no TIDEMARK_ variable to override it
    for name in [n for n in os.environ if n.startswith("TIDEMARK_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "tidemark.toml"
    config.write_text(block)
    written = tomllib.loads(block)
    # when the loader reads it
    settings = load_settings(str(config), require_dsn="dsn" in written.get("source", {}))
    # then it holds what the block says, and each shape is a valid definition
    assert settings.source.dsn == written.get("source", {}).get("dsn", "")
    assert [s.name for s in settings.shapes] == [s["name"] for s in written.get("shapes", [])]
    for shape in settings.shapes:
        ShapeDefinition(**shape.model_dump())


@pytest.mark.parametrize("page", PAGES)
def test_links_to_other_pages_are_relative_and_in_the_nav(page: str) -> None:
    # given the pages of the site's navigation
    nav = set(nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    assert page in nav
    # when the page links to another page of the site
    links = [t for t in LINK.findall((DOCS / page).read_text()) if not t.startswith("#")]
    local = [t.split("#")[0] for t in links if "://" not in t]
    assert local, f"{page} links to no other page"
    # then the link is relative and leads to a page in the nav
    for target in local:
        assert not target.startswith("/"), f"{page}: {target} is absolute"
        resolved = os.path.normpath((Path(page).parent / target).as_posix())
        assert resolved in nav, f"{page}: {target} ({resolved}) is not a page in the nav"
