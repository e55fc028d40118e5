"""Bad settings and bad arguments: a clear message on stderr and exit code 2, never a
traceback, never a setting silently ignored.

Each scenario runs the real command line (``cli.main``) in a directory of its own with
every ``TIDEMARK_*`` variable cleared, so only what the scenario writes is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemark import cli
from tidemark.errors import ConfigError
from tidemark.settings.config import Settings, load_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TIDEMARK_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit code and stderr of ``tidemark argv``."""
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def config(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "tidemark.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


# -- the settings file -------------------------------------------------------------------


def test_a_toml_syntax_error_names_the_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, '[source]\ndsn = "postgresql://db/app"\n[sink\nroot = "/lake"\n')
    code, err = run(capsys, "--config", path, "config", "check")
    assert code == 2
    assert path in err and "not valid TOML" in err and "line 3" in err
    assert "Traceback" not in err


def test_a_binary_file_is_refused_as_not_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe" * 20)
    code, err = run(capsys, "--config", path, "status")
    assert code == 2
    assert path in err and "not a UTF-8 text file" in err


def test_a_config_path_that_is_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, "--config", str(tmp_path), "status")
    assert code == 2 and f"cannot read config file {tmp_path}" in err


def test_an_unknown_key_in_a_section_is_refused_with_the_nearest_valid_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, '[source]\ndsn = "postgresql://db/app"\nslto = "x"\nbogus = 1\n')
    code, err = run(capsys, "--config", path, "config", "check")
    assert code == 2
    assert "unknown setting 'slto' in [source]" in err and "did you mean 'slot'" in err
    assert "unknown setting 'bogus' in [source]" in err
    assert "dsn, dsn_file, password_file, slot, publication" in err  # the valid keys


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[http]\nport = 1\nadmin_tokn = "x"\n',
            "'admin_tokn' in [http]; did you mean 'admin_token'",
        ),
        ("[flush]\nmax_row = 5\n", "'max_row' in [flush]; did you mean 'max_rows'"),
        ('[sorce]\ndsn = "x"\n', "unknown section or key 'sorce'; did you mean 'source'"),
        ('[[shapes]]\nname = "a"\ntable = "t"\nwher = "id = 1"\n', "'wher' in [[shapes]] #1"),
        ('[spark]\nmaster = "local[2]"\nconfs = {}\n', "did you mean 'conf'"),
        ("[monitor]\nperiod = 1\n", "valid keys: period_s, stall_grace_s"),
        ('[sink]\nroot = "/x"\nretention = 1\n', "unknown setting 'retention' in [sink]"),
    ],
)
def test_every_section_refuses_unknown_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = config(tmp_path, text)
    code, err = run(capsys, "--config", path, "status")
    assert code == 2 and expected in err, err


def test_a_valid_file_still_loads(tmp_path: Path) -> None:
    path = config(
        tmp_path,
        '[source]\ndsn = "postgresql://db/app"\nslot = "s"\n[http]\nport = 9000\n'
        '[[shapes]]\nname = "a"\ntable = "t"\n',
    )
    settings = load_settings(path)
    assert (settings.source.slot, settings.http.port, settings.shapes[0].name) == ("s", 9000, "a")


# -- the environment -------------------------------------------------------------------------


def test_invalid_json_in_tidemark_shapes_names_the_variable_and_the_json_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_SHAPES", '[{"name": "a", table: "t"}]')
    code, err = run(capsys, "status")
    assert code == 2
    assert "TIDEMARK_SHAPES is not valid JSON" in err and "line 1 column 16" in err
    assert "Traceback" not in err


def test_invalid_json_in_a_nested_variable_names_that_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_SPARK__CONF", "{spark.driver.memory: 2g}")
    code, err = run(capsys, "status")
    assert code == 2 and "TIDEMARK_SPARK__CONF is not valid JSON" in err


def test_unknown_environment_settings_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_SOURCE__BOGUS", "1")
    code, err = run(capsys, "status")
    assert code == 2 and "TIDEMARK_SOURCE__BOGUS" in err and "unknown setting" in err
    monkeypatch.delenv("TIDEMARK_SOURCE__BOGUS")
    monkeypatch.setenv("TIDEMARK_SORCE__DSN", "postgresql://db/app")
    code, err = run(capsys, "status")
    assert code == 2 and "TIDEMARK_SORCE__DSN" in err and "TIDEMARK_SOURCE__DSN" in err
    monkeypatch.delenv("TIDEMARK_SORCE__DSN")
    monkeypatch.setenv("TIDEMARK_SHAPE", "[]")
    code, err = run(capsys, "status")
    assert code == 2 and "did you mean TIDEMARK_SHAPES" in err


def test_variables_that_are_not_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TIDEMARK_CONFIG", "TIDEMARK_URL", "TIDEMARK_TEST_PG"):
        monkeypatch.setenv(name, "x" if name != "TIDEMARK_CONFIG" else "absent.toml")
    assert load_settings(require_dsn=False).source.slot == "tidemark"


def test_an_invalid_value_names_the_setting_and_where_it_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_HTTP__PORT", "eighty")
    code, err = run(capsys, "status")
    assert code == 2 and "http.port" in err and "environment variable TIDEMARK_HTTP__PORT" in err
    monkeypatch.delenv("TIDEMARK_HTTP__PORT")
    path = config(tmp_path, "[flush]\nmax_rows = -1\n")
    code, err = run(capsys, "--config", path, "status")
    assert code == 2 and "flush.max_rows" in err and path in err


def test_an_iceberg_section_refuses_a_namespace_and_a_format_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, '[sink]\nformat = "iceberg"\n[iceberg]\nnamespace = "my-lake"\n')
    code, err = run(capsys, "--config", path, "status")
    assert code == 2 and "iceberg.namespace" in err and "letters, digits and underscores" in err
    path = config(tmp_path, '[sink]\nformat = "hudi"\n')
    code, err = run(capsys, "--config", path, "status")
    assert code == 2 and "sink.format" in err and "'delta'" in err and "'iceberg'" in err


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["wait", "--lsn", "garbage"], "invalid LSN 'garbage'"),
        (["wait", "--lsn", "0/10", "--timeout", "nan"], "--timeout"),
        (["wait", "--lsn", "0/10", "--timeout", "-1"], "--timeout"),
        (["wait", "--lsn", "0/10", "--timeout", "inf"], "--timeout"),
        (["wait", "--lsn", "0/10", "--timeout", "301"], "wait again"),
        (["shapes", "add", "a", "--table", "t", "--timeout", "nan"], "--timeout"),
        (["read", "a", "--as-of", "yesterday"], "invalid LSN 'yesterday'"),
        (["read", "a", "--limit", "-5"], "--limit"),
        (["demo", "--port", "70000"], "--port"),
        (["demo", "--duration", "nan"], "--duration"),
        (["status", "--url", "localhost:8765"], "--url"),
        (["status", "--url", "ftp://host/"], "--url"),
    ],
)
def test_bad_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    code, err = run(capsys, *argv)
    assert code == 2 and expected in err, err
    assert "Traceback" not in err


def test_the_installed_command_prints_no_traceback_for_a_broken_file(tmp_path: Path) -> None:
    path = config(tmp_path, "[source\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    result = subprocess.run(
        [sys.executable, "-m", "tidemark", "--config", path, "config", "check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("tidemark: ") and "Traceback" not in result.stderr


# -- the API's exposure ----------------------------------------------------------------------


def settings(**http: object) -> Settings:
    return Settings.model_validate({"http": http})


def test_a_non_loopback_bind_without_a_token_is_refused_naming_both_fixes() -> None:
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "tidemark.example.com"):
        with pytest.raises(ConfigError) as refused:
            load_settings(require_dsn=False, http={"host": host})
        message = str(refused.value)
        assert "admin_token" in message and "allow_unauthenticated = true" in message
        assert "TIDEMARK_HTTP__ADMIN_TOKEN" in message


def test_loopback_a_token_or_an_explicit_opt_out_may_start() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert settings(host=host).http.host == host
    token = settings(host="0.0.0.0", admin_token="s3cret").http.admin_token
    assert token.get_secret_value() == "s3cret" and "s3cret" not in repr(token)
    assert settings(host="0.0.0.0", allow_unauthenticated=True).http.allow_unauthenticated


def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    loaded = settings(host="0.0.0.0", admin_token_file=str(token))
    assert loaded.http.admin_token.get_secret_value() == "from-a-file"
    with pytest.raises(ConfigError, match="admin_token_file"):
        load_settings(require_dsn=False, http={"admin_token_file": str(tmp_path / "absent")})
    token.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_settings(require_dsn=False, http={"admin_token_file": str(token)})


def test_the_refusal_reaches_the_command_line_as_a_config_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_SOURCE__DSN", "postgresql://db/app")
    monkeypatch.setenv("TIDEMARK_HTTP__HOST", "0.0.0.0")
    code, err = run(capsys, "run")
    assert code == 2 and "allow_unauthenticated" in err


def test_an_unreachable_source_is_explained_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a DSN nothing listens on (Spark is not needed to find that out)
    import tidemark.spark

    monkeypatch.setattr(tidemark.spark, "build_session", lambda *args, **kwargs: object())
    monkeypatch.setenv("TIDEMARK_SOURCE__DSN", "postgresql://u:p@127.0.0.1:1/db")
    monkeypatch.setenv("TIDEMARK_SINK__ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("TIDEMARK_LOG_FORMAT", "json")
    code, err = run(capsys, "run")
    # then the log has its event, and the last words on stderr say what to do
    assert code == 1
    message = err[err.index("tidemark: ") :]
    assert message.startswith("tidemark: cannot connect to the source database")
    assert "TIDEMARK_SOURCE__DSN" in message and "Traceback" not in message


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("garbage string", 'missing "=" after "garbage"'),
        ("postgresql://user:pw@db host/app", "unexpected spaces"),
        ("postgresql://user:s3cret@db:notaport/app", "port"),
    ],
)
def test_a_malformed_dsn_is_a_config_error_that_hides_the_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, dsn: str, expected: str
) -> None:
    monkeypatch.setenv("TIDEMARK_SOURCE__DSN", dsn)
    code, err = run(capsys, "config", "check")
    assert code == 2 and "source.dsn" in err and expected in err, err
    assert "s3cret" not in err and "pw@" not in err


@pytest.mark.parametrize("master", ["nonsense", "local[two]", "spark://", "local[2"])
def test_an_unknown_spark_master_is_a_config_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, master: str
) -> None:
    monkeypatch.setenv("TIDEMARK_SPARK__MASTER", master)
    code, err = run(capsys, "status", "--url", "http://127.0.0.1:9")
    assert code == 2 and "spark.master" in err and "local[2]" in err, err


@pytest.mark.parametrize(
    "master", ["local", "local[2]", "local[*]", "local[4,2]", "spark://m:7077", "yarn", "k8s://h"]
)
def test_spark_masters_spark_accepts_are_accepted(master: str) -> None:
    assert Settings.model_validate({"spark": {"master": master}}).spark.master == master


def test_reading_a_shape_that_has_no_table_says_so_before_starting_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidemark.spark

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(tidemark.spark, "build_session", no_spark)
    code, err = run(capsys, "read", "nope", "--root", str(tmp_path))
    assert code == 1 and "shape 'nope' has no table" in err


def test_spark_that_cannot_start_is_explained_not_a_traceback(tmp_path: Path) -> None:
    # given a Spark setting the JVM refuses (it exits at once); in a process of its own,
    # since a Spark session another test left in this one would be reused as it is
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env.update(
        TIDEMARK_SOURCE__DSN="postgresql://u:p@127.0.0.1:1/db",
        TIDEMARK_SINK__ROOT=str(tmp_path / "lake"),
        TIDEMARK_SPARK__CONF='{"spark.driver.memory": "lots"}',
        TIDEMARK_LOG_FORMAT="json",
        PYSPARK_PYTHON=sys.executable,
    )
    done = subprocess.run(
        [sys.executable, "-m", "tidemark", "run"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    err = done.stderr
    message = err[err.index("tidemark: ") :]
    assert done.returncode == 1 and message.startswith("tidemark: Spark failed"), err[-2000:]
    assert "TIDEMARK_SPARK__CONF" in message and "Traceback" not in message


def test_a_shape_is_numbered_from_one_as_the_file_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, '[[shapes]]\nname = "a"\ntable = "t"\n[[shapes]]\ntable = "t"\n')
    code, err = run(capsys, "--config", path, "status")
    assert code == 2 and "[[shapes]] #2 name: Field required" in err, err
    assert "shapes.1" not in err


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"sink": {"root": "gs://lake/x"}}, "s3://bucket/prefix"),
        ({"sink": {"root": "s3://Not_A_Bucket/x"}}, "is not a bucket name"),
        (
            {"sink": {"root": "s3://lake/x", "format": "iceberg"}},
            "[iceberg] catalog_uri",
        ),
    ],
)
def test_an_object_store_root_says_what_it_needs(changes: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(require_dsn=False, **changes)
    assert expected in str(caught.value)


def test_a_delta_root_on_s3_keeps_current_tables_on() -> None:
    loaded = load_settings(require_dsn=False, sink={"root": "s3://lake/x"})
    assert loaded.current.enabled


def test_an_iceberg_root_on_s3_with_its_own_catalog_is_accepted() -> None:
    loaded = load_settings(
        require_dsn=False,
        sink={"root": "s3://lake/x", "format": "iceberg"},
        iceberg={"catalog_uri": "postgresql://tm@db/catalog"},
    )
    assert loaded.sink.root == "s3://lake/x" and loaded.sink.format == "iceberg"
    assert loaded.current.enabled
