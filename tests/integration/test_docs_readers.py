"""The reading guide's offline DuckDB snippet, run as printed (issue 54): DuckDB's own
download of its extensions fails without internet, so the guide loads the ones that
came from PyPI; the snippet must work as a user copies it, and its install line must
name the versions this project tests with."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "reading.md"
MARK = "<!-- tested as printed: tests/integration/test_docs_readers.py -->"


def printed_snippet() -> str:
    """The Python block right after the guide's mark."""
    text = GUIDE.read_text()
    assert MARK in text, f"{GUIDE} lost its tested snippet's mark"
    block = re.search(r"```python\n(.*?)```", text.split(MARK, 1)[1], re.S)
    assert block is not None
    return block.group(1)


def test_the_offline_duckdb_snippet_reads_a_delta_table_as_printed(tmp_path: Path) -> None:
    table = tmp_path / "lake" / "current" / "orders_eu"
    write_deltalake(str(table), pa.table({"id": [1, 2, 3], "status": ["a", "b", "c"]}))
    code = printed_snippet().replace("/data/lake", str(tmp_path / "lake"))
    assert str(table) in code, "the snippet no longer reads /data/lake/current/orders_eu"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(3,)"


def test_the_offline_install_line_names_the_tested_versions() -> None:
    pinned = (ROOT / "pyproject.toml").read_text()
    guide = GUIDE.read_text()
    line = next(row for row in guide.splitlines() if row.startswith("| DuckDB without internet"))
    for package in re.findall(r'"?(duckdb(?:-ext-\w+)?==[0-9.*]+)"?', line):
        assert f'"{package}"' in pinned, f"{package} is not what pyproject.toml pins"
    assert "duckdb-ext-delta" in line and "duckdb-ext-iceberg" in line
