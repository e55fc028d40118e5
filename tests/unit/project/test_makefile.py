"""The Makefile's promises: `make demo` installs what tidemark needs and nothing of the
tests' (no Prometheus, FUSE, browser or container engine on a machine that only tries
tidemark out); CI runs `make test` and then `make test-compose`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def prerequisites(target: str) -> set[str]:
    """The targets ``target`` depends on, transitively, as make itself reads them."""
    out = subprocess.run(
        ["make", "-C", str(REPO), "-pnrR", "-f", "Makefile", "--no-print-directory", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    rules: dict[str, set[str]] = {}
    for line in out.splitlines():
        m = re.match(r"^([A-Za-z0-9_.$()/-]+):(?!=)\s*(.*)$", line)
        if m and not line.startswith(("#", "\t")):
            rules.setdefault(m.group(1), set()).update(m.group(2).split())
    seen: set[str] = set()
    todo = [target]
    while todo:
        for dep in rules.get(todo.pop(), set()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_make_demo_installs_no_system_service_of_the_tests() -> None:
    demo = prerequisites("demo")
    assert "java" in demo
    assert not demo & {"setup", "prometheus", "fuse", "browser", "test-compose"}, demo


def test_the_tests_get_everything() -> None:
    assert {"java", "prometheus", "fuse", "browser"} <= prerequisites("test")


def test_ci_runs_the_suite_then_the_compose_stack() -> None:
    commands = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith("make ")
    ]
    assert commands == ["make test", "make test-compose"]
