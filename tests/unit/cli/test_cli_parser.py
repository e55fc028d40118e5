"""The command line's surface: a version, --config on every subcommand, help text on
every argument (the CLI reference is generated from it), and -o json where a script
reads the output."""

from __future__ import annotations

import argparse

import pytest

from tidemark import cli


def _commands(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, (*path, name))
    return found


LEAVES = [
    (path, p)
    for path, p in _commands(cli.parser())
    if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
]


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"tidemark {cli.version()}"
    assert cli.version() != "unknown"


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=" ".join)
def test_every_subcommand_takes_config_before_or_after_it(path: tuple[str, ...]) -> None:
    required = {
        ("shapes", "add"): ["n", "--table", "t"],
        ("shapes", "show"): ["n"],
        ("shapes", "remove"): ["n"],
        ("shapes", "resync"): ["n"],
        ("wait",): ["--lsn", "0/1"],
        ("read",): ["s"],
    }.get(path, [])
    after = cli.parser().parse_args([*path, *required, "--config", "after.toml"])
    assert after.config == "after.toml"
    before = cli.parser().parse_args(["--config", "before.toml", *path, *required])
    assert before.config == "before.toml"  # not reset by the subcommand's own option
    neither = cli.parser().parse_args([*path, *required])
    assert neither.config is None


def test_every_argument_has_help_text() -> None:
    missing = [
        f"{' '.join(path) or 'tidemark'} {action.dest}"
        for path, p in _commands(cli.parser())
        for action in p._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert not missing, f"arguments without help: {missing}"


@pytest.mark.parametrize(
    "argv", [["status"], ["shapes", "list"], ["shapes", "show", "n"]], ids=" ".join
)
def test_output_is_text_by_default_and_json_on_request(argv: list[str]) -> None:
    assert cli.parser().parse_args(argv).output == "text"
    assert cli.parser().parse_args([*argv, "-o", "json"]).output == "json"
    with pytest.raises(SystemExit):
        cli.parser().parse_args([*argv, "-o", "yaml"])


def test_shapes_list_pages_as_the_api_does(capsys: pytest.CaptureFixture[str]) -> None:
    from tidemark.api.paging import MAX_LIMIT
    from tidemark.cli.args import MAX_PAGE

    assert MAX_PAGE == MAX_LIMIT  # the CLI refuses what the API would
    args = cli.parser().parse_args(
        ["shapes", "list", "--state", "error", "--state", "active", "--limit", "5"]
    )
    assert (args.state, args.limit, args.cursor) == (["error", "active"], 5, None)
    for bad in ("0", "1001", "x"):
        with pytest.raises(SystemExit) as done:
            cli.parser().parse_args(["shapes", "list", "--limit", bad])
        assert done.value.code == 2 and "--limit" in capsys.readouterr().err


def test_read_takes_dash_o_like_the_other_commands_and_keeps_format() -> None:
    assert cli.parser().parse_args(["read", "s"]).format == "text"
    for flag in ("-o", "--output", "--format"):
        assert cli.parser().parse_args(["read", "s", flag, "json"]).format == "json"
    assert cli.parser().parse_args(["read", "s", "-o", "parquet"]).format == "parquet"
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["read", "s", "-o", "yaml"])


def test_tidemark_help_starts_with_a_summary_and_gives_examples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "tidemark streams a PostgreSQL database's changes" in out
    assert "``" not in out  # not a docstring
    assert "examples:" in out and "tidemark read orders_eu" in out


def test_read_as_text_prints_lsns_as_postgres_does_and_cuts_long_values() -> None:
    import pyarrow as pa

    rows = pa.table({"id": [1, 2], "v": ["short", "x" * 200], "_lsn": [23803720, None]})
    text = cli._rows_text(rows, 2, as_of=23803720)
    assert "0/16B3748" in text and "23803720" not in text
    assert "x" * 200 not in text and ("x" * (cli.CELL_WIDTH - 1) + "…") in text
    assert "NULL" in text
    assert text.rstrip().endswith(
        f"2 row(s) as of 0/16B3748; values over {cli.CELL_WIDTH} characters cut "
        "(-o json, csv or parquet: whole)"
    )
    assert "cut" not in cli._rows_text(rows.slice(0, 1), 1, as_of=None)
    # a value that ends in an ellipsis of its own is not taken for a cut one
    own = pa.table({"v": ["and so on…"]})
    assert "cut" not in cli._rows_text(own, 1, as_of=None)


def test_read_as_json_keeps_every_value_whole_and_lsns_as_the_api_does() -> None:
    import datetime
    import decimal

    import pyarrow as pa

    rows = pa.table(
        {
            "id": [1],
            "amount": pa.array([decimal.Decimal("1234567890123456789.1234")], pa.decimal128(38, 4)),
            "at": [datetime.datetime(2026, 11, 29, 1, 2, 3, tzinfo=datetime.UTC)],
            "blob": [b"\x00\xff"],
            "long": ["y" * 500],
            "_lsn": [23803720],
        }
    )
    args = argparse.Namespace(shape="s", changelog=False)
    doc = cli._rows_json(args, rows, 1, as_of=None)
    assert doc == {
        "shape": "s",
        "changelog": False,
        "as_of": None,
        "total": 1,
        "rows": [
            {
                "id": 1,
                "amount": "1234567890123456789.1234",
                "at": "2026-11-29T01:02:03+00:00",
                "blob": "\\x00ff",
                "long": "y" * 500,
                "_lsn": {"lsn": "0/16B3748", "value": 23803720},
            }
        ],
    }
