"""Exactly-once under crashes: a writer process is SIGKILLed during a Spark job,
between the job and the Delta commit, and right after a commit, and for flush
rounds (one Spark job for several shapes) between the round's job and its commits
and with the round half committed; after each restart every shape holds each
(_lsn, _op) exactly once, its committed offset matches its contents, and nothing at
or below the committed offset is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tidemark.demo.postgres import death_signal_prefix
from tidemark.sink import table_format

from .crash_writer import SHAPES, TXNS, expected_rows, lsn_of
from .sink_support import rows_of

ROOT = Path(__file__).resolve().parents[2]


def run_child(root: Path, kill_at: str | None, nth: int, fmt: str = "delta") -> list[str]:
    """Run the writer; SIGKILL it at the nth line starting with kill_at."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'service'}"}
    # dies with this process, and its Spark JVM with it (which ends when its stdin
    # closes): a killed test run leaves no writer behind to eat a core
    proc = subprocess.Popen(
        [
            *death_signal_prefix(signal.SIGKILL),
            sys.executable,
            "-m",
            "tests.integration.crash_writer",
            str(root),
            fmt,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line.strip())
        if kill_at and line.startswith(kill_at):
            nth -= 1
            if nth == 0:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait(timeout=120)
    return seen


def check_exactly_once(root: Path, fmt: str = "delta") -> dict[str, int | None]:
    committed: dict[str, int | None] = {}
    for shape in SHAPES:
        table = table_format(fmt).changelog(root, shape)
        lsn = table.committed_lsn()
        committed[shape] = lsn
        rows = rows_of(table) if table.exists() else []
        counts = Counter((r["_lsn"], r["_op"]) for r in rows)
        assert all(c == 1 for c in counts.values()), f"{shape}: duplicated rows"
        present = sorted((r["_lsn"], r["id"]) for r in rows)
        want = sorted(
            (lsn_of(k), i)
            for k in range(TXNS)
            if lsn is not None and lsn_of(k) <= lsn
            for i in expected_rows(k).get(shape, [])
        )
        assert present == want, f"{shape}: rows do not match committed offset {lsn}"
    return committed


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_killed_writer_restarts_without_loss_or_duplicates(tmp_path: Path, fmt: str) -> None:
    kills = (("WRITING", 3), ("BETWEEN", 4), ("COMMITTED", 5), ("BETWEEN", 2))
    check_kills(tmp_path, kills, fmt)


def test_a_writer_killed_between_a_rounds_job_and_its_commits_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    # killed after a round's Spark job wrote every member's files, before any commit;
    # then twice with a round half committed (some members committed, others not)
    kills = (("ROUND", 1), ("PARTIAL", 1), ("ROUND", 2), ("PARTIAL", 2))
    seen_rounds = check_kills(tmp_path, kills)
    assert seen_rounds, "no flush round ran"


def check_kills(
    tmp_path: Path, kills: tuple[tuple[str, int], ...], fmt: str = "delta"
) -> list[str]:
    history = []
    rounds = []
    for kill_at, nth in kills:
        seen = run_child(tmp_path, kill_at, nth, fmt)
        assert any(line.startswith(kill_at) for line in seen), seen[-5:]
        rounds += [line for line in seen if line.startswith("ROUND")]
        history.append(check_exactly_once(tmp_path, fmt))
    seen = run_child(tmp_path, None, 0, fmt)
    assert seen[-1] == "DONE"
    final = check_exactly_once(tmp_path, fmt)
    last = {
        s: max((lsn_of(k) for k in range(TXNS) if s in expected_rows(k)), default=None)
        for s in SHAPES
    }
    assert final == last
    # committed offsets only ever moved forward across the crashes
    for shape in SHAPES:
        offsets = [h[shape] or 0 for h in history] + [final[shape] or 0]
        assert offsets == sorted(offsets)
    return rounds
