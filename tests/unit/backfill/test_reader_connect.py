"""How a backfill's parallel reader connects: asyncpg where it implements the DSN's
parameters as libpq does, psycopg otherwise (``reader.asyncpg_target``)."""

from __future__ import annotations

import urllib.parse

import pytest

from tidemark.backfill.reader import asyncpg_target

SESSION = {
    "datestyle": "ISO",
    "intervalstyle": "postgres",
    "timezone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


@pytest.fixture(autouse=True)
def _no_libpq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGOPTIONS", "PGAPPNAME", "PGSERVICE", "PGHOSTADDR"):
        monkeypatch.delenv(name, raising=False)


def query(url: str) -> dict[str, str]:
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme == "postgresql" and parts.netloc == "" and parts.path == ""
    return dict(urllib.parse.parse_qsl(parts.query))


def test_a_url_keeps_every_parameter_and_gets_the_session_settings() -> None:
    target = asyncpg_target("postgresql://u:p%40ss@db.example:6432/app?sslmode=require")
    assert target is not None
    url, settings, timeout = target
    assert query(url) == {
        "user": "u",
        "password": "p@ss",
        "host": "db.example",
        "port": "6432",
        "dbname": "app",
        "sslmode": "require",
    }
    assert settings == SESSION and timeout is None


def test_a_conninfo_s_options_application_name_and_timeout_are_settings_and_timeout() -> None:
    target = asyncpg_target(
        "host=/run/postgresql dbname=app application_name=etl connect_timeout=7"
        " options='-c search_path=lake -csynchronous_commit=off --work-mem=64MB'"
    )
    assert target is not None
    url, settings, timeout = target
    assert query(url) == {"host": "/run/postgresql", "dbname": "app"}
    assert settings == {
        "search_path": "lake",
        "synchronous_commit": "off",
        "work_mem": "64MB",
        **SESSION,
        "application_name": "etl",
    }
    assert timeout == 7.0


def test_our_session_settings_win_over_the_dsn_s_as_with_psycopg() -> None:
    # psycopg's connections append ours after the DSN's options: the later -c wins
    target = asyncpg_target("dbname=app options='-c timezone=Europe/Paris'")
    assert target is not None and target[1]["timezone"] == "UTC"


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db keepalives=1",  # a parameter asyncpg does not implement
        "postgresql://db/app?hostaddr=10.0.0.1",
        "dbname=app gssencmode=disable",
        "dbname=app options='-c'",  # options asyncpg cannot pass as settings
        "dbname=app options=--single",
        "dbname=app options='-d 5'",
    ],
)
def test_a_dsn_asyncpg_cannot_honour_keeps_psycopg(dsn: str) -> None:
    assert asyncpg_target(dsn) is None


def test_a_libpq_environment_variable_asyncpg_does_not_read_keeps_psycopg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert asyncpg_target("dbname=app") is not None
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=0")
    assert asyncpg_target("dbname=app") is None
