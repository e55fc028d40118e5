"""The shape registry: runtime changes, reconcile at start-up, durability, listeners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.errors import ConfigError, ShapeError
from tidemark.flush.tracker import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset
from tidemark.shapes.model import ShapeDefinition
from tidemark.shapes.registry import FORMAT_VERSION, ReconcileResult, ShapeRegistry


def shape(name: str, where: str | None = None, table: str = "orders") -> ShapeDefinition:
    return ShapeDefinition(name=name, table=table, where=where)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "shapes.json"


def names(registry: ShapeRegistry) -> dict[str, str]:
    return {s.name: s.origin for s in registry.shapes()}


def where_of(registry: ShapeRegistry, name: str) -> str | None:
    found = registry.get(name)
    assert found is not None, name
    return found.definition.where


# --------------------------------------------------------------------------------------
# add / remove / get / list


def test_an_added_shape_survives_a_restart(path: Path) -> None:
    # given an empty registry (no file yet)
    registry = ShapeRegistry.open(path)
    assert len(registry) == 0 and not path.exists()
    # when a shape is added
    assert registry.add(shape("eu", "region = 'eu'")) is True
    # then a new registry opened on the same file has it, with its origin
    again = ShapeRegistry.open(path)
    found = again.get("eu")
    assert found is not None and found.definition == shape("eu", "region = 'eu'")
    assert found.origin == "api"
    assert json.loads(path.read_text())["version"] == FORMAT_VERSION


def test_reading_another_instances_registry_leaves_its_write_under_way(
    tmp_path: Path,
) -> None:
    # instance b checks the shape names instance a owns while a writes its registry
    # (CI: a's rename failed, its temp file removed by b's read)
    mine = tmp_path / "instances" / "a" / "shapes.json"
    registry = ShapeRegistry.open(mine)
    registry.add(shape("eu", "region = 'eu'"))
    under_way = mine.parent / ".shapes.json.x1y2z3.tmp"
    under_way.write_text("{}")
    assert names(ShapeRegistry.read(mine)) == {"eu": "api"}
    assert under_way.exists()
    # a's own start removes what its earlier run left
    ShapeRegistry.open(mine)
    assert not under_way.exists()


def test_adding_the_same_shape_again_is_a_no_op(path: Path) -> None:
    # given a registered shape
    registry = ShapeRegistry.open(path)
    registry.add(shape("eu", "region = 'eu'"))
    before = path.stat().st_mtime_ns
    # when the same definition is added again, formatted differently
    again = registry.add(shape("eu", "REGION='eu'"))
    # then nothing changes, not even the file
    assert again is False
    assert path.stat().st_mtime_ns == before


def test_a_different_definition_under_a_taken_name_is_refused(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.add(shape("eu", "region = 'eu'"))
    with pytest.raises(ShapeError, match=r"already exists with another definition.*replace it"):
        registry.add(shape("eu", "region = 'us'"))
    assert where_of(registry, "eu") == "region = 'eu'"


def test_replacing_explicitly_swaps_the_definition_and_reports_the_old_one_gone(
    path: Path,
) -> None:
    # given a registered shape and a removal listener
    registry = ShapeRegistry.open(path)
    registry.add(shape("eu", "region = 'eu'"))
    gone: list[str] = []
    registry.on_removed(gone.append)
    # when it is replaced explicitly
    assert registry.add(shape("eu", "region = 'us'"), replace=True) is True
    # then the new definition is durable and the old one was announced as removed
    assert where_of(ShapeRegistry.open(path), "eu") == "region = 'us'"
    assert gone == ["eu"]


def test_remove_returns_the_shape_and_forgets_it_durably(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.add(shape("eu"))
    registry.add(shape("us"))
    removed = registry.remove("eu")
    assert removed.name == "eu"
    assert names(ShapeRegistry.open(path)) == {"us": "api"}


def test_removing_an_unknown_shape_lists_the_known_ones(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.add(shape("us"))
    with pytest.raises(ShapeError, match="no shape 'eu' to remove; registered shapes: us"):
        registry.remove("eu")


def test_shapes_are_listed_by_name(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    for name in ("zeta", "alpha", "mid"):
        registry.add(shape(name))
    assert [s.name for s in registry.shapes()] == ["alpha", "mid", "zeta"]
    assert "mid" in registry and "other" not in registry


def test_configured_shapes_cannot_be_changed_at_run_time(path: Path) -> None:
    # given a shape declared by the configuration
    registry = ShapeRegistry.open(path)
    registry.reconcile([shape("eu", "region = 'eu'")])
    # when the API tries to remove or replace it; then it is refused with the reason
    with pytest.raises(
        ShapeError, match=r"declared in the configuration.*change the configuration"
    ):
        registry.remove("eu")
    with pytest.raises(ShapeError, match="declared in the configuration"):
        registry.add(shape("eu", "region = 'us'"), replace=True)
    assert names(registry) == {"eu": "config"}


# --------------------------------------------------------------------------------------
# reconcile


def test_reconcile_adds_removes_changes_and_keeps(path: Path) -> None:
    # given configured shapes a, b, c and a run-time shape r
    registry = ShapeRegistry.open(path)
    registry.reconcile([shape("a"), shape("b", "id = 1"), shape("c")])
    registry.add(shape("r"))
    gone: list[str] = []
    registry.on_removed(gone.append)
    # when the configuration now declares a (same), b (changed) and d (new)
    result = registry.reconcile([shape("a"), shape("b", "id = 2"), shape("d")])
    # then each is reported in its category, r is kept, c is removed
    assert result == ReconcileResult(
        added=("d",), removed=("c",), changed=("b",), unchanged=("a",), kept=("r",)
    )
    assert names(registry) == {"a": "config", "b": "config", "d": "config", "r": "api"}
    # and the removal and the replacement were announced, after being made durable
    assert gone == ["b", "c"]
    assert names(ShapeRegistry.open(path)) == names(registry)


def test_reconcile_adopts_a_runtime_shape_the_configuration_now_declares(path: Path) -> None:
    # given a shape added through the API
    registry = ShapeRegistry.open(path)
    registry.add(shape("eu", "region = 'eu'"))
    # when the configuration declares the same shape
    result = registry.reconcile([shape("eu", "region  =  'eu'")])
    # then it is unchanged, and now owned by the configuration
    assert result.unchanged == ("eu",) and not result.changed
    assert names(ShapeRegistry.open(path)) == {"eu": "config"}


def test_reconcile_with_nothing_to_do_does_not_write(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.reconcile([shape("a")])
    before = path.stat().st_mtime_ns
    assert registry.reconcile([shape("a")]).unchanged == ("a",)
    assert path.stat().st_mtime_ns == before


def test_reconcile_refuses_a_name_declared_twice(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    with pytest.raises(ConfigError, match="'a' is declared twice"):
        registry.reconcile([shape("a"), shape("a", "id = 1")])
    assert len(registry) == 0 and not path.exists()


# --------------------------------------------------------------------------------------
# the FlushTracker sees removals


def test_removing_a_shape_releases_the_flush_boundary_it_held(path: Path) -> None:
    # given a tracker wired to a registry, and two shapes that received a transaction
    registry = ShapeRegistry.open(path)
    registry.add(shape("fast"))
    registry.add(shape("stuck"))
    durable: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: durable.append(lsn), clock=lambda: 0.0)
    registry.on_removed(tracker.handle_shape_removed)
    commit = LogOffset(1000, 3)
    tracker.handle_txn_fragment(CommitFragment(commit), ["fast", "stuck"])
    # when only "fast" flushes, the transaction is not durable yet
    tracker.handle_flush_notification("fast", commit)
    assert tracker.last_flushed_of("stuck") is not None and all(lsn < 1000 for lsn in durable)
    # when "stuck" is removed from the registry
    registry.remove("stuck")
    # then the tracker forgot it and the transaction became durable
    assert tracker.last_flushed_of("stuck") is None
    assert durable[-1] == 1000


def test_an_unregistered_listener_is_not_called(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.add(shape("a"))
    calls: list[str] = []
    unregister = registry.on_removed(calls.append)
    unregister()
    registry.remove("a")
    assert calls == []


# --------------------------------------------------------------------------------------
# the file: format, versions, corruption


def test_the_file_is_versioned_json_with_origins(path: Path) -> None:
    registry = ShapeRegistry.open(path)
    registry.reconcile([shape("a", "id > 1")])
    registry.add(ShapeDefinition(name="b", table='"Sales"."Items"', columns=("id", '"Qty"')))
    document = json.loads(path.read_text())
    assert document == {
        "version": 1,
        "shapes": [
            {
                "origin": "config",
                "definition": {
                    "name": "a",
                    "table": "public.orders",
                    "where": "id > 1",
                    "columns": None,
                    "replica": "default",
                },
            },
            {
                "origin": "api",
                "definition": {
                    "name": "b",
                    "table": '"Sales"."Items"',
                    "where": None,
                    "columns": ["id", '"Qty"'],
                    "replica": "default",
                },
            },
        ],
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"version": 1}', "expected an object with 'version' and 'shapes'"),
        ('{"version": 0, "shapes": []}', "unknown format version 0"),
        ('{"version": 1, "shapes": [{"origin": "x", "definition": {}}]}', "'origin' of"),
        (
            '{"version": 1, "shapes": [{"origin": "api", "definition": {"name": "Bad"}}]}',
            "entry 0: shape 'Bad' is invalid",
        ),
    ],
)
def test_a_broken_file_is_refused_with_what_to_do(path: Path, content: str, message: str) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ConfigError, match="restore it from a backup") as caught:
        ShapeRegistry.open(path)
    assert message in str(caught.value)


def test_a_file_from_a_newer_tidemark_asks_for_an_upgrade(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 99, "shapes": []}')
    with pytest.raises(ConfigError, match="format version 99, written by a newer tidemark"):
        ShapeRegistry.open(path)


# --------------------------------------------------------------------------------------
# crash safety


def test_a_failed_write_leaves_the_old_file_and_the_old_state(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a registry with one shape and a listener
    registry = ShapeRegistry.open(path)
    registry.add(shape("a"))
    before = path.read_bytes()
    calls: list[str] = []
    registry.on_removed(calls.append)

    # when the rename fails (disk full, crash ...) while removing the shape
    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        registry.remove("a")
    # then the file, the in-memory state and the listeners are as before the attempt,
    # and no temporary file is left behind
    assert path.read_bytes() == before
    assert "a" in registry and calls == []
    assert sorted(p.name for p in path.parent.iterdir()) == ["shapes.json"]


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    from tidemark.shapes.model import ShapeDefinition
    from tidemark.shapes.registry import ShapeRegistry

    registry = ShapeRegistry.open(sys.argv[1])
    # the process dies between writing the new file and renaming it
    os.replace = lambda src, dst: os._exit(17)
    registry.add(ShapeDefinition(name="b", table="orders"))
    """
)


def test_a_crash_between_write_and_rename_keeps_the_old_file(path: Path) -> None:
    # given a registry with one shape on disk
    ShapeRegistry.open(path).add(shape("a"))
    before = path.read_bytes()
    # when another process dies after writing the new content, before renaming it
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(path)], capture_output=True, timeout=60
    )
    assert done.returncode == 17, done.stderr.decode()
    # then the registry file is the old one, whole; the orphaned temporary holds the
    # complete new content, and the next open removes it
    assert path.read_bytes() == before
    (orphan,) = [p for p in path.parent.iterdir() if p.name != "shapes.json"]
    assert json.loads(orphan.read_text())["shapes"][1]["definition"]["name"] == "b"
    reopened = ShapeRegistry.open(path)
    assert names(reopened) == {"a": "api"}
    assert [p.name for p in path.parent.iterdir()] == ["shapes.json"]


# --------------------------------------------------------------------------------------
# invariant: what is on disk is what is in memory


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "replace", "remove", "reconcile"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([None, "id = 1", "id > 2"]),
        st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=3),
    ),
    max_size=12,
)


@settings(max_examples=60)
@given(ops=operations)
def test_the_file_always_reopens_to_the_state_in_memory(ops: list[Any]) -> None:
    # given any sequence of runtime changes and reconciles (errors included)
    with tempfile.TemporaryDirectory() as directory:
        file = Path(directory) / "shapes.json"
        registry = ShapeRegistry.open(file)
        removed: list[str] = []
        registry.on_removed(removed.append)
        for op, name, where, declared in ops:
            before = {s.name: s for s in registry.shapes()}
            try:
                if op == "add":
                    registry.add(shape(name, where))
                elif op == "replace":
                    registry.add(shape(name, where), replace=True)
                elif op == "remove":
                    registry.remove(name)
                else:
                    registry.reconcile([shape(n, where) for n in sorted(declared)])
            except ShapeError:
                # then a refused change changes nothing
                assert {s.name: s for s in registry.shapes()} == before
            # then after every step, the file holds exactly the registry's state
            assert ShapeRegistry.open(file).shapes() == registry.shapes()
            # and every shape that left was announced
            gone = set(before) - {s.name for s in registry.shapes()}
            assert gone <= set(removed)
