"""What a reader gives that a root does not record (``sink.root.root_format``): an
Iceberg catalog's properties, from the caller or ``TIDEMARK_ICEBERG__PROPERTIES``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidemark.errors import SinkError
from tidemark.sink.root import FORMAT_FILE, PROPERTIES_ENV, root_format


def iceberg_root(tmp_path: Path) -> Path:
    (tmp_path / FORMAT_FILE).parent.mkdir(parents=True)
    record = {"format": "iceberg", "catalog_uri": "http://catalog.invalid/", "namespace": "ns"}
    (tmp_path / FORMAT_FILE).write_text(json.dumps(record))
    return tmp_path


def test_the_callers_properties_win_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = iceberg_root(tmp_path)
    monkeypatch.setenv(PROPERTIES_ENV, json.dumps({"credential": "env:secret"}))
    given = root_format(root, properties={"token": "t0"})
    assert given.settings.properties == {"token": "t0"}  # type: ignore[attr-defined]
    from_env = root_format(root)
    assert from_env.settings.properties == {"credential": "env:secret"}  # type: ignore[attr-defined]
    assert from_env.settings.namespace == "ns"  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", ["credential=a:b", '["credential"]'])
def test_properties_in_the_environment_that_are_no_json_object_say_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(PROPERTIES_ENV, text)
    with pytest.raises(SinkError, match=PROPERTIES_ENV) as raised:
        root_format(iceberg_root(tmp_path))
    assert '{"credential": "<client id>:<client secret>"}' in str(raised.value)
