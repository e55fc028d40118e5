"""plan_reload: what a re-read config file changes in a running service, and what waits
for a restart."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.errors import ConfigError
from tidemark.reload import plan_reload
from tidemark.settings.config import Settings
from tidemark.shapes.model import ShapeDefinition
from tidemark.shapes.registry import RegisteredShape
from tidemark.writers.scheduler import FlushPolicy

BASE: dict[str, Any] = {
    "source": {"dsn": "postgresql://tm:secret@db/app"},
    "sink": {"root": "/lake"},
    "shapes": [
        {"name": "eu", "table": "public.orders", "where": "region = 'eu'"},
        {"name": "customers", "table": "public.customers"},
    ],
}
POLICY = FlushPolicy(max_rows=200_000, max_age_s=1.0, min_age_s=0.25, concurrency=4)


def settings(**changes: Any) -> Settings:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in changes.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return Settings.model_validate(data)


def registered(s: Settings, **api: dict[str, Any]) -> dict[str, RegisteredShape]:
    """The registry after start-up reconciled ``s`` (plus run-time shapes ``api``)."""
    out = {
        shape.name: RegisteredShape(ShapeDefinition(**shape.model_dump()), "config")
        for shape in s.shapes
    }
    for name, spec in api.items():
        out[name] = RegisteredShape(ShapeDefinition(name=name, **spec), "api")
    return out


def test_the_same_file_again_changes_nothing() -> None:
    old = settings()
    plan = plan_reload(old, settings(), registered(old), POLICY)
    assert not plan.changes_shapes
    assert (plan.flush, plan.changed, plan.needs_restart) == (None, (), ())
    assert plan.settings == old


def test_shapes_are_added_removed_and_replaced_like_at_start_up() -> None:
    old = settings()
    new = settings(
        shapes=[
            {"name": "eu", "table": "public.orders", "where": "region = 'eu' and total > 0"},
            {"name": "us", "table": "public.orders", "where": "region = 'us'"},
        ]
    )
    plan = plan_reload(old, new, registered(old), POLICY)
    assert [d.name for d in plan.add] == ["us"]
    assert plan.remove == ("customers",)
    assert [(d.name, d.where) for d in plan.replace] == [("eu", "region = 'eu' and total > 0")]
    assert plan.adopt == () and plan.needs_restart == ()
    assert plan.settings is not None and [s.name for s in plan.settings.shapes] == ["eu", "us"]


def test_a_predicate_written_differently_is_the_same_shape() -> None:
    old = settings()
    new = settings(
        shapes=[
            {"name": "eu", "table": "public.orders", "where": "REGION   =  'eu'"},
            {"name": "customers", "table": "public.customers"},
        ]
    )
    assert not plan_reload(old, new, registered(old), POLICY).changes_shapes


def test_run_time_shapes_are_kept_or_adopted_when_the_file_declares_them() -> None:
    old = settings()
    reg = registered(
        old,
        api_kept={"table": "public.orders"},
        api_declared={"table": "public.orders", "where": "region = 'us'"},
    )
    new = settings(
        shapes=[
            *BASE["shapes"],
            {"name": "api_declared", "table": "public.orders", "where": "region = 'us'"},
        ]
    )
    plan = plan_reload(old, new, reg, POLICY)
    assert [d.name for d in plan.adopt] == ["api_declared"]
    assert (plan.add, plan.remove, plan.replace) == ((), (), ())


def test_flush_settings_apply_at_once_on_the_running_policy() -> None:
    old = settings()
    new = settings(flush={"max_age_s": 5.0, "max_rows": 1000}, monitor={"stall_grace_s": 60})
    plan = plan_reload(old, new, registered(old), POLICY)
    assert plan.flush == FlushPolicy(max_rows=1000, max_age_s=5.0, min_age_s=0.25, concurrency=4)
    assert plan.changed == ("flush.max_age_s", "flush.max_rows", "monitor.stall_grace_s")
    assert plan.needs_restart == ()
    assert plan.settings is not None
    assert (plan.settings.flush.max_age_s, plan.settings.monitor.stall_grace_s) == (5.0, 60)


def test_settings_read_only_at_start_are_named_and_not_applied() -> None:
    old = settings()
    new = settings(
        source={"dsn": "postgresql://tm:other@db2/app", "slot": "tm2"},
        sink={"root": "/elsewhere"},
        spark={"conf": {"spark.driver.memory": "4g"}},
        http={"port": 9999},
        flush={"concurrency": 2, "max_age_s": 2.0},
        monitor={"period_s": 1.0},
        log_level="debug",
    )
    plan = plan_reload(old, new, registered(old), POLICY)
    assert plan.needs_restart == (
        "flush.concurrency",
        "http.port",
        "log_level",
        "monitor.period_s",
        "sink.root",
        "source.dsn",
        "source.slot",
        "spark.conf",
    )
    # only the reloadable part is applied: concurrency and the rest stay as they run
    assert plan.flush == FlushPolicy(max_rows=200_000, max_age_s=2.0, min_age_s=0.25, concurrency=4)
    assert plan.settings is not None
    assert plan.settings.source == old.source and plan.settings.http == old.http
    assert plan.settings.flush.concurrency == old.flush.concurrency


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([{"name": "bad", "table": "public.t", "where": "a >"}], "shape 'bad'"),
        (
            [{"name": "x", "table": "public.t"}, {"name": "x", "table": "public.u"}],
            "declared twice",
        ),
    ],
)
def test_a_file_with_a_broken_shape_is_refused_whole(
    shapes: list[dict[str, Any]], message: str
) -> None:
    old = settings()
    with pytest.raises(ConfigError, match=message):
        plan_reload(old, settings(shapes=shapes), registered(old), POLICY)
