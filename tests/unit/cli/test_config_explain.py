"""``tidemark config check`` prints the effective settings as TOML: it reads back as the
same settings, each value says where it came from, and no secret is printed."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from tidemark.settings.config import explain, load_settings

FILE = """
[source]
dsn = "postgresql://tm:file-secret@db.example.com/shop"
slot = "from_file"

[sink]
root = "/data/lake"
format = "iceberg"

[iceberg]
catalog_uri = "postgresql://cat:catalog-secret@catalog/lake"
properties = { "rest.token" = "prop-secret", warehouse = "/data/wh" }

[spark]
conf = { "spark.driver.memory" = "1g", "spark.ssl.keyPassword" = "spark-secret" }

[http]
admin_token = "token-secret"

[[shapes]]
name = "orders_eu"
table = "public.orders"
where = "region = 'eu' and note = \\"quoted\\""
"""


@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("TIDEMARK_"):
            monkeypatch.delenv(name)
    path = tmp_path / "tidemark.toml"
    path.write_text(FILE)
    return path


def test_the_explanation_is_toml_with_origins_and_no_secrets(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_FLUSH__MAX_AGE_S", "0.5")
    settings = load_settings(str(settings_file))
    text = explain(settings, settings_file)

    for secret in ("file-secret", "catalog-secret", "prop-secret", "spark-secret", "token-secret"):
        assert secret not in text, secret
    back = tomllib.loads(text)
    assert back["source"]["dsn"] == "postgresql://tm:***@db.example.com/shop"
    assert back["iceberg"]["properties"] == {"rest.token": "***", "warehouse": "/data/wh"}
    assert back["spark"]["conf"]["spark.driver.memory"] == "1g"
    assert back["http"]["admin_token"] == "***"
    assert back["shapes"][0]["where"] == "region = 'eu' and note = \"quoted\""
    # the rest reads back as the same settings
    assert back["flush"] == settings.model_dump()["flush"]
    assert back["sink"]["root"] == "/data/lake" and back["sink"]["format"] == "iceberg"

    lines = {line.split(" = ")[0]: line for line in text.splitlines() if " = " in line}
    assert lines["slot"].endswith(f"# file: {settings_file}")
    assert lines["max_age_s"].endswith("# environment: TIDEMARK_FLUSH__MAX_AGE_S")
    assert lines["stall_grace_s"].endswith("# default")


def test_a_setting_left_unset_is_a_comment(settings_file: Path) -> None:
    settings = load_settings(str(settings_file))
    text = explain(settings, settings_file)
    unset = [line for line in text.splitlines() if " is not set" in line]
    assert all(line.startswith("# ") for line in unset)
    tomllib.loads(text)  # still TOML
