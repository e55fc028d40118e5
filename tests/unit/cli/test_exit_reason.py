"""``tidemark run`` leaves why it stopped where a container's health check reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark import cli, exit_reason


def test_a_run_refused_for_bad_input_leaves_the_message_it_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = tmp_path / "exit-reason"
    monkeypatch.setenv(exit_reason.ENV, str(reason))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIDEMARK_SOURCE__DSN", "postgresql://u@127.0.0.1:1/db")
    monkeypatch.setenv("TIDEMARK_SHAPES", "not json")
    assert cli.main(["run"]) == 2
    printed = capsys.readouterr().err.strip().removeprefix("tidemark: ")
    stamp, _, left = reason.read_text().strip().partition(" ")
    assert stamp.endswith("Z") and left == printed and "TIDEMARK_SHAPES" in left
    # the service removes it once its API listens again
    exit_reason.clear()
    assert not reason.exists()


def test_other_commands_and_an_unset_variable_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = tmp_path / "exit-reason"
    monkeypatch.setenv(exit_reason.ENV, str(reason))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIDEMARK_SOURCE__DSN", raising=False)
    assert cli.main(["config", "check"]) == 2  # no DSN: refused, but not a run
    assert not reason.exists()
    monkeypatch.delenv(exit_reason.ENV)
    monkeypatch.setenv("TIDEMARK_SHAPES", "not json")
    assert cli.main(["run"]) == 2
    assert not reason.exists()
    capsys.readouterr()


def test_an_unwritable_reason_file_is_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(exit_reason.ENV, str(tmp_path / "missing-folder" / "exit-reason"))
    exit_reason.record("boom")
    assert "cannot write TIDEMARK_EXIT_REASON_FILE" in capsys.readouterr().err
