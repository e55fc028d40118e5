"""Secrets kept outside the DSN and the settings file: ``[source] dsn_file`` and
``password_file``, ``[http] admin_token_file``; read when the settings load (at start
and on each reload), never printed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from tidemark.errors import ConfigError
from tidemark.reload import plan_reload
from tidemark.settings.config import explain, load_settings
from tidemark.writers.scheduler import FlushPolicy


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TIDEMARK_"):
            monkeypatch.delenv(name)


def _file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_the_password_file_joins_the_dsn_and_is_never_printed(tmp_path: Path) -> None:
    password = _file(tmp_path / "password", "s3cret-from-file\n")
    config = tmp_path / "tidemark.toml"
    config.write_text(
        f'[source]\ndsn = "host=db.example.com dbname=shop user=tm"\npassword_file = "{password}"\n'
    )
    settings = load_settings(str(config))
    assert conninfo_to_dict(settings.source.dsn)["password"] == "s3cret-from-file"
    assert conninfo_to_dict(settings.source.dsn)["host"] == "db.example.com"
    assert "s3cret-from-file" not in explain(settings, config)


def test_the_dsn_can_come_from_a_file_and_the_password_file_wins(tmp_path: Path) -> None:
    dsn = _file(tmp_path / "dsn", "postgresql://tm:old@db/shop\n")
    password = _file(tmp_path / "password", "new")
    settings = load_settings(require_dsn=True, source={"dsn_file": dsn, "password_file": password})
    parts = conninfo_to_dict(settings.source.dsn)
    assert (parts["user"], parts["password"], parts["dbname"]) == ("tm", "new", "shop")


@pytest.mark.parametrize("key", ["dsn_file", "password_file"])
def test_a_missing_or_empty_secret_file_is_a_clear_settings_error(key: str, tmp_path: Path) -> None:
    source = {key: str(tmp_path / "absent")}  # (dsn_file is read when dsn is empty)
    if key == "password_file":
        source["dsn"] = "postgresql://tm@db/shop"
    with pytest.raises(ConfigError, match=f"cannot read {key}"):
        load_settings(require_dsn=False, source=source)
    source[key] = _file(tmp_path / "empty", "\n")
    with pytest.raises(ConfigError, match=f"{key} .* is empty"):
        load_settings(require_dsn=False, source=source)


def test_a_reload_reads_the_token_file_again_and_applies_it(tmp_path: Path) -> None:
    token = _file(tmp_path / "token", "first")
    config = tmp_path / "tidemark.toml"
    config.write_text(f'[sink]\nroot = "/lake"\n\n[http]\nadmin_token_file = "{token}"\n')
    old = load_settings(str(config), require_dsn=False)
    _file(tmp_path / "token", "second")
    new = load_settings(str(config), require_dsn=False)
    plan = plan_reload(old, new, {}, FlushPolicy())
    assert plan.settings is not None
    assert plan.settings.http.admin_token.get_secret_value() == "second"
    assert "http.admin_token" in plan.changed and "http.admin_token" not in plan.needs_restart


def test_a_rotated_source_password_needs_a_restart(tmp_path: Path) -> None:
    password = _file(tmp_path / "password", "first")
    source = {"dsn": "postgresql://tm@db/shop", "password_file": password}
    old = load_settings(require_dsn=False, source=source)
    _file(tmp_path / "password", "second")
    new = load_settings(require_dsn=False, source=source)
    plan = plan_reload(old, new, {}, FlushPolicy())
    assert "source.dsn" in plan.needs_restart
