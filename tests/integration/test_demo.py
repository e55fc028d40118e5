"""``tidemark demo`` (what ``make demo`` runs), for a few seconds, in this process: an
embedded PostgreSQL of its own, the demo's shapes, its workload, and the comparison
with Postgres at the end. Then the same with every shape removed over the API while it
runs: the demo has nothing to wait for and nothing to compare, and says so (it waited
120 s, then failed on the empty comparison).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tidemark.demo import run as demo
from tidemark.demo.postgres import free_port

from .remote_service import get_json


def remove_every_shape(port: int, done: threading.Event) -> None:
    """Once the demo streams, DELETE each of its shapes over the API."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if get_json(port, "/healthz", timeout=2)[1]["phase"] == "streaming":
                break
        except OSError:
            pass
        time.sleep(0.3)
    for shape in demo.SHAPES:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/shapes/{shape['name']}", method="DELETE"
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status in (200, 202, 204), r.status
    done.set()


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """The demo configures logging for its console (warnings only): the suite's later
    tests capture info events, so the configuration is put back."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize("remove", [False, True], ids=["as-is", "shapes-removed"])
def test_the_demo_streams_and_compares_and_ends_when_its_shapes_are_removed(
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    remove: bool,
) -> None:
    port = free_port()
    removed = threading.Event()
    if remove:
        threading.Thread(target=remove_every_shape, args=(port, removed), daemon=True).start()
    started = time.monotonic()
    code = demo.run_demo(duration_s=8, data_dir=str(tmp_path / "demo"), port=port)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    if remove:
        assert removed.is_set()
        assert "no demo shape is left to compare" in out
        assert took < 90, took  # (it waited 120 s for shapes that were gone)
    else:
        assert "every shape equals Postgres." in out
        for shape in demo.SHAPES:
            assert f"{shape['name']}" in out and "DIFFERENT" not in out
        # the stop folded every current table: a plain reader of current/<shape> (no
        # tidemark code) gets what tidemark read gets, which the demo compared with
        # Postgres above
        import polars as pl
        from deltalake import DeltaTable

        from tidemark import read

        root = tmp_path / "demo"
        for shape in demo.SHAPES:
            name = shape["name"]
            expected = Counter(
                tuple(r.values()) for r in read.arrow_current(root, name).drop(["_lsn"]).to_pylist()
            )
            plain = DeltaTable(str(root / "current" / name)).to_pyarrow_table().drop(["_lsn"])
            assert Counter(tuple(r.values()) for r in plain.to_pylist()) == expected, name
            frame = pl.read_delta(str(root / "current" / name)).drop("_lsn")
            assert Counter(frame.iter_rows()) == expected, name
            # and `tidemark tables` says so: no changelog row past the folded LSN
            described = read.describe_tables(root, name)
            assert described["current"]["rows_waiting"] == 0, described
            folded, frontier = described["current"]["folded"], described["frontier"]
            assert described["current"]["lag_bytes"] == frontier["value"] - folded["value"]
