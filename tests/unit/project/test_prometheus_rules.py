"""The alert rules, proven with promtool (Debian's ``prometheus`` package).

``promtool check rules`` and ``promtool check config`` accept our files, and
``promtool test rules`` runs deploy/prometheus/tests/: for every alert a series history
that fires it, with the labels and annotations a page shows, and a near miss that must
not. To show those cases can fail, every alert is mutated twice: into a rule that never
fires (a firing case must catch it) and into one that fires whenever its series exist
(``bool`` comparisons: a near miss must catch it).

Without promtool these tests are skipped, saying so; ``make setup`` as root installs it
(CI runs as root, so CI always runs them). tests/integration/test_prometheus.py runs a
real Prometheus against a running tidemark.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.promql import (
    ALERTS,
    DEPLOY,
    PROMTOOL_MISSING,
    RULE_TESTS,
    alert_rules,
    promtool,
    with_bool,
)

needs_promtool = pytest.mark.skipif(promtool() is None, reason=PROMTOOL_MISSING)


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    assert tool is not None
    # promtool writes failures to stderr, the rest to stdout: one stream keeps the order
    return subprocess.run(
        [tool, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def rule_test_files() -> list[Path]:
    return sorted(RULE_TESTS.glob("*.yml"))


def rule_tests() -> list[dict[str, Any]]:
    """Every alert_rule_test case of every file (alertname, exp_alerts)."""
    cases = []
    for path in rule_test_files():
        spec = yaml.safe_load(path.read_text())
        assert spec["rule_files"] == ["../alerts.yml"], path.name
        for test in spec["tests"]:
            cases += test.get("alert_rule_test", [])
    return cases


def test_every_alert_has_a_history_that_fires_it_and_a_near_miss() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    firing = {c["alertname"] for c in rule_tests() if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in rule_tests() if not c.get("exp_alerts")}
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a near miss"
    assert (firing | quiet) - names == set(), "cases for alerts that do not exist"
    # a firing case states what the page says: every label and annotation of the rule
    rules = {rule["alert"]: rule for rule in alert_rules()}
    for case in rule_tests():
        for alert in case.get("exp_alerts") or []:
            rule = rules[case["alertname"]]
            assert set(rule["labels"]) <= set(alert["exp_labels"]), case["alertname"]
            assert set(alert["exp_annotations"]) == set(rule["annotations"]), case["alertname"]


@needs_promtool
def test_promtool_accepts_the_rules_and_the_prometheus_config(tmp_path: Path) -> None:
    checked = run_promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout
    # the config names the rules where the compose file mounts them: check it with
    # that path pointing at our file (check config then checks the rules it loads too)
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = [str(ALERTS)]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    checked = run_promtool("check", "config", str(copy))
    assert checked.returncode == 0, checked.stdout
    assert "SUCCESS" in checked.stdout


@needs_promtool
def test_promtool_rule_tests_pass() -> None:
    files = rule_test_files()
    assert len(files) >= 3
    result = run_promtool("test", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("SUCCESS") == len(files)


def mutated_rules(alert: str, how: str) -> str:
    data = yaml.safe_load(ALERTS.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                expr = rule["expr"]
                rule["expr"] = "vector(1) < 0" if how == "never" else with_bool(expr)
                assert rule["expr"] != expr, f"{alert}: the {how} mutant equals the rule"
    return yaml.safe_dump(data)


def files_testing(alert: str) -> list[Path]:
    return [
        path
        for path in rule_test_files()
        if any(
            case["alertname"] == alert
            for test in yaml.safe_load(path.read_text())["tests"]
            for case in test.get("alert_rule_test", [])
        )
    ]


@needs_promtool
def test_the_rule_tests_catch_every_alert_mutated_to_never_or_always_fire(
    tmp_path: Path,
) -> None:
    # one folder per mutant (its alerts.yml beside copies of the files testing that
    # alert), all run by one promtool call: each file loads its own ../alerts.yml
    mutants: dict[str, str] = {}  # test file -> "alert how"
    for rule in alert_rules():
        for how in ("never", "always"):
            folder = tmp_path / f"{rule['alert']}-{how}"
            (folder / "tests").mkdir(parents=True)
            (folder / "alerts.yml").write_text(mutated_rules(rule["alert"], how))
            for path in files_testing(rule["alert"]):
                copy = folder / "tests" / path.name
                shutil.copy(path, copy)
                mutants[str(copy.relative_to(tmp_path))] = f"{rule['alert']} {how}"
    result = run_promtool("test", "rules", *mutants, cwd=tmp_path)
    assert result.returncode != 0
    # promtool reports per file: "Unit Testing:  <file>" then SUCCESS or FAILED
    outcome: dict[str, str] = {}
    current = None
    for line in result.stdout.splitlines():
        if line.startswith("Unit Testing:"):
            current = line.split(":", 1)[1].strip()
        elif current is not None and line.strip() in ("SUCCESS", "FAILED:"):
            outcome[current] = line.strip()
    assert set(outcome) == set(mutants), result.stdout[-2000:]
    caught = {mutants[f] for f, said in outcome.items() if said != "SUCCESS"}
    missed = sorted(set(mutants.values()) - caught)
    assert missed == [], f"mutants no rule test caught: {missed}"
    assert len(caught) == 2 * len(alert_rules())


def test_with_bool_turns_comparisons_into_bool_ones_outside_matchers() -> None:
    assert with_bool('up{job="tidemark"} == 0') == 'up{job="tidemark"} == bool 0'
    assert (
        with_bool('x{state!="a",s=~"b|c"} > 0 and y >= 1 * 2')
        == 'x{state!="a",s=~"b|c"} > bool 0 and y >= bool 1 * 2'
    )
    assert with_bool("a < bool 1") == "a < bool 1"
    assert with_bool('sum by (kind) (t{k="<"})') == 'sum by (kind) (t{k="<"})'
