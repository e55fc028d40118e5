"""The docs site and the README: the site builds in strict mode (links and anchors
resolve), and every snippet is what it claims to be.

Snippets are fenced blocks with an info string: ``toml`` blocks are loaded by
tidemark's settings loader, ``python`` blocks compile, ``sh`` blocks pass ``bash -n``,
``sql`` blocks parse (as PostgreSQL, DuckDB or Trino SQL: the guides show all three).
``text`` blocks (sample output) are not checked. The SQL of the Postgres guide also
runs on a real server: tests/integration/test_docs_postgres.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlglot

from tidemark.settings.config import load_settings
from tidemark.sink.schema import METADATA_FIELDS

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_LIMIT = 12 * 1024

CHECKED = {"toml", "python", "sh", "sql"}
KNOWN = CHECKED | {"text", "json", "yaml", "ini", "console"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.lang})"


def snippets(path: Path) -> list[Snippet]:
    """Every fenced block of a Markdown file, dedented to its fence."""
    found: list[Snippet] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group("indent"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path}:{start + 1}: a code fence is never closed")
        lang = info.split()[0] if info else ""
        code = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
        found.append(Snippet(path, start + 1, lang, code + "\n"))
        i += 1
    return found


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


ALL = [s for p in markdown_files() for s in snippets(p)]


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """mkdocs with ``strict`` and link validation: a broken link, a missing anchor,
    a page outside the nav or a generated reference that fails is an error."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    built = tmp_path / "site"
    assert (built / "index.html").exists()
    assert (built / "reference" / "cli" / "index.html").exists()


def test_every_code_block_names_its_language() -> None:
    """An unmarked block would escape the checks below."""
    unmarked = [str(s) for s in ALL if s.lang not in KNOWN]
    assert not unmarked, f"code blocks without a known language: {unmarked}"
    assert sum(s.lang in CHECKED for s in ALL) > 20  # the checks below have work to do


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "toml"], ids=str)
def test_toml_snippets_are_settings_tidemark_accepts(
    snippet: Snippet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("TIDEMARK_"):
            monkeypatch.delenv(name)
    file = tmp_path / "tidemark.toml"
    file.write_text(snippet.code)
    settings = load_settings(str(file), require_dsn=False)
    assert settings.sink.root  # loaded through the real models


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "python"], ids=str)
def test_python_snippets_compile(snippet: Snippet) -> None:
    compile(snippet.code, str(snippet), "exec")


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "sh"], ids=str)
def test_shell_snippets_parse(snippet: Snippet) -> None:
    done = subprocess.run(["bash", "-n"], input=snippet.code, capture_output=True, text=True)
    assert done.returncode == 0, f"{snippet}: {done.stderr}"


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "sql"], ids=str)
def test_sql_snippets_parse(snippet: Snippet) -> None:
    problems = []
    for dialect in ("postgres", "duckdb", "trino"):
        try:
            statements = sqlglot.parse(snippet.code, read=dialect)
        except sqlglot.errors.ParseError as exc:
            problems.append(f"{dialect}: {exc}")
            continue
        assert [s for s in statements if s is not None], f"{snippet}: no statement"
        return
    raise AssertionError(f"{snippet} parses in no dialect: {problems}")


def test_the_readme_is_short_and_points_at_docs_that_exist() -> None:
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes"
    for ref in re.findall(r"`(docs/[^`\s]+)`", text):
        assert (ROOT / ref).exists(), f"README names {ref}, which does not exist"


def test_the_table_layout_page_lists_every_metadata_column() -> None:
    page = (DOCS / "reference" / "table-layout.md").read_text()
    for field in METADATA_FIELDS:
        assert f"| `{field.name}` |" in page, f"{field.name} is not in the table layout page"


def test_the_snippet_reader_finds_indented_blocks(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text('1. a step\n\n   ```toml\n   [sink]\n   root = "/x"\n   ```\n')
    (found,) = snippets(page)
    assert found.lang == "toml"
    assert found.code == '[sink]\nroot = "/x"\n'
