"""Loading the config file: a file that is not valid TOML is a clear error, not a
traceback (at start, and on reload, where the service then keeps its settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark import cli
from tidemark.errors import ConfigError
from tidemark.settings.config import load_settings


def test_a_file_that_is_not_toml_is_a_config_error_naming_the_file_and_the_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDEMARK_CONFIG", raising=False)
    config = tmp_path / "tidemark.toml"
    config.write_text('[source]\ndsn = "postgresql://db/app"\n[flush\nmax_age_s = 1\n')
    with pytest.raises(ConfigError, match=r"tidemark.toml is not valid TOML: .*line 3"):
        load_settings(str(config))


def test_tidemark_run_explains_a_broken_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tidemark.toml"
    config.write_text("[flush\n")
    assert cli.main(["--config", str(config), "run"]) == 2  # a configuration error
    err = capsys.readouterr().err
    assert err.startswith("tidemark: config file ") and "not valid TOML" in err
    assert "Traceback" not in err
