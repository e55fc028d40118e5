"""PromQL helpers for the tests of deploy/prometheus and deploy/grafana.

``with_bool(expr)`` turns every comparison of an expression into a ``bool`` one, so
it returns its series whatever their values (``x > 5`` filters, ``x > bool 5`` gives
0 or 1). An alert fires on any series its expression returns, so the bool form of an
alert "always fires" where its series exist: the rule tests use it as a mutant that
the near misses must catch, and the real-Prometheus test uses it to check that every
selector of an alert matches a series tidemark exports.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests"
DASHBOARD = DEPLOY / "grafana" / "tidemark.json"

_COMPARISON = re.compile(r"==|!=|>=|<=|>|<")

PROMTOOL_MISSING = (
    "promtool is not installed: `make setup` as root installs it (Debian's prometheus "
    "package), or run `apt-get install prometheus`"
)


def promtool() -> str | None:
    return shutil.which("promtool")


def alert_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text())
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def with_bool(expr: str) -> str:
    """``expr`` with ``bool`` after each comparison outside label matchers and strings."""
    out: list[str] = []
    depth = 0  # inside {...} (label matchers) comparisons are matchers, not operators
    quote: str | None = None
    i = 0
    while i < len(expr):
        ch = expr[i]
        if quote is not None:
            out.append(ch)
            if ch == "\\" and i + 1 < len(expr):
                out.append(expr[i + 1])
                i += 1
            elif ch == quote:
                quote = None
            i += 1
            continue
        if ch in "\"'`":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0 and (m := _COMPARISON.match(expr, i)):
            out.append(m.group(0) + " bool")
            i = m.end()
            if expr.startswith(" bool", i):  # already a bool comparison
                i += len(" bool")
            continue
        out.append(ch)
        i += 1
    return "".join(out)
