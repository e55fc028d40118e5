"""Where each instance on a sink root keeps its state, and the one view of every
instance's frontiers that readers use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.settings.config import Settings
from tidemark.sink.frontiers import Frontiers, ShapeFrontier, load_frontiers, store_frontiers
from tidemark.state.instance_state import instance_states, state_dir, warm_dir


def test_the_unnamed_instance_keeps_the_round_one_folder(tmp_path: Path) -> None:
    assert state_dir(tmp_path) == tmp_path / "_tidemark"
    assert state_dir(tmp_path, "eu") == tmp_path / "_tidemark" / "instances" / "eu"


def test_readers_see_every_instances_shapes_and_the_lowest_durable_lsn(tmp_path: Path) -> None:
    store_frontiers(tmp_path, Frontiers(500, {"a1": ShapeFrontier(500, 400)}), "a")
    store_frontiers(tmp_path, Frontiers(300, {"b1": ShapeFrontier(300, None)}), "b")
    assert set(instance_states(tmp_path)) == {"", "a", "b"}
    merged = load_frontiers(tmp_path)
    assert merged is not None and merged.durable_lsn == 300
    assert merged.shapes["a1"].frontier_lsn == 500 and merged.shapes["b1"].frontier_lsn == 300
    only_a = load_frontiers(tmp_path, "a")
    assert only_a is not None and set(only_a.shapes) == {"a1"}
    assert load_frontiers(tmp_path, "c") is None


@pytest.mark.parametrize("name", ["a/b", "..", "x y", "z" * 64])
def test_an_instance_name_that_is_not_a_folder_name_is_refused(name: str) -> None:
    with pytest.raises((ConfigError, ValueError)):
        Settings.model_validate({"instance": {"name": name}})


def test_a_warm_up_leftover_is_the_roots_not_state_of_the_unnamed_instance(
    tmp_path: Path,
) -> None:
    """What a killed service's warm-up left under ``_tidemark/warm`` (a root on a bucket)
    is the root's, like its format record: a named instance's ``teardown --purge`` does
    not take it for state the unnamed instance keeps there, and so does not keep the
    root's records for it."""
    from tidemark.cli.teardown import _holds_state

    records = state_dir(tmp_path)
    (records / "instances" / "eu").mkdir(parents=True)
    (records / "format.json").write_text("{}")
    leftover = Path(warm_dir(tmp_path)) / "4f1c" / "t0" / "r0"
    leftover.mkdir(parents=True)
    (leftover / "part-0.parquet").write_bytes(b"PAR1")
    assert Path(warm_dir(tmp_path)).parent == records
    assert not _holds_state(records)
    # the unnamed instance's own state is
    (records / "frontiers.json").write_text("{}")
    assert _holds_state(records)
