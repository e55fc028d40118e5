"""``tidemark run`` refuses what ``config check`` finds without the source before it
starts Spark or connects anywhere: exit 2 within seconds, the setting named and the fix
said, no traceback and no Spark log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tidemark.cli.preflight import shape_problems, sink_root_problem
from tidemark.settings.config import Settings


def run(config: Path) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tidemark", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_bad_shape_name_and_an_unusable_root_fail_before_spark(tmp_path: Path) -> None:
    config = tmp_path / "tidemark.toml"
    config.write_text(
        '[source]\ndsn = "postgresql://nobody@127.0.0.1:1/nowhere"\n'
        '[sink]\nroot = "/proc/lake"\n'
        '[[shapes]]\nname = "Bad-Name"\ntable = "public.orders"\n'
    )
    code, output, seconds = run(config)
    assert code == 2, output
    assert "[[shapes]] #1 ('Bad-Name')" in output and "not a valid shape name" in output
    assert "[sink] root = '/proc/lake' cannot be used" in output and "TIDEMARK_SINK__ROOT" in output
    assert "Traceback" not in output and "Spark" not in output and "log4j" not in output
    assert seconds < 20  # (Spark alone takes ~10 s to start)


def test_a_root_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    file = tmp_path / "lake"
    file.write_text("not a folder")
    problem = sink_root_problem(str(file))
    assert problem is not None and "is a file, not a folder" in problem
    assert "[sink] root" in problem
    assert sink_root_problem(str(tmp_path / "new" / "lake")) is None  # made if missing


def test_a_where_that_does_not_parse_and_a_name_declared_twice_are_static() -> None:
    settings = Settings.model_validate(
        {
            "source": {"dsn": "postgresql://x@h/db"},
            "shapes": [
                {"name": "a", "table": "t", "where": "x = = 1"},
                {"name": "b", "table": "t"},
                {"name": "b", "table": "u"},
            ],
        }
    )
    problems = shape_problems(settings)
    assert len(problems) == 2, problems
    assert problems[0].startswith("[[shapes]] #1 ('a'): ")
    assert "[[shapes]] #3 ('b'): the name is declared twice" in problems[1]


def test_config_check_says_which_checks_an_unreachable_source_left_out(tmp_path: Path) -> None:
    config = tmp_path / "tidemark.toml"
    config.write_text(
        '[source]\ndsn = "postgresql://nobody@127.0.0.1:1/nowhere"\n'
        f'[sink]\nroot = "{tmp_path / "lake"}"\n'
        '[[shapes]]\nname = "orders"\ntable = "public.orders"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "tidemark", "config", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("FAIL source connection") for line in lines)
    assert "TIDEMARK_SOURCE__DSN" in done.stdout
    for name in ("server", "replication role", "slot", "publication", "shape orders"):
        assert any(line.startswith(f"skip {name}") for line in lines), (name, lines)
    assert lines[-1].endswith("1 failed, 5 not checked"), lines[-1]
