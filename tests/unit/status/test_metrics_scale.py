"""The metrics at 1000 shapes: at most 12 series a shape, no ``_created`` series, every
family labelled by shape declared in ``Metrics.PER_SHAPE``, and none of them with
``[metrics] per_shape = false``. (How long a scrape takes is measured by ``python -m
bench metrics``, not here.)"""

from __future__ import annotations

import dataclasses

from bench.metrics_bench import stub_facts
from prometheus_client import generate_latest

from tidemark.observability import Metrics, refresh_metrics

SHAPES = 1000


def _samples(metrics: Metrics) -> list[str]:
    body = generate_latest(metrics.registry).decode()
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def test_a_thousand_shapes_cost_at_most_twelve_series_each_and_no_created_series() -> None:
    metrics = Metrics()
    refresh_metrics(metrics, stub_facts(SHAPES, metrics))
    samples = _samples(metrics)
    by_shape = [s for s in samples if 'shape="' in s]
    backfilling = [s for s in by_shape if s.startswith(Metrics.WHILE_BACKFILLING)]
    steady = len(by_shape) - len(backfilling)
    assert steady / SHAPES <= 12
    assert steady / SHAPES == len(Metrics.PER_SHAPE)  # every family was exercised
    # (each shape backfilling with a backfill on record: two series)
    shapes = stub_facts(SHAPES, metrics)
    running = [
        n for n, state in shapes.states.items() if state == "backfilling" and n in shapes.backfills
    ]
    assert running and len(backfilling) == 2 * len(running)
    assert not [s for s in samples if "_created" in s.split("{")[0].split(" ")[0]]
    # and every family labelled by shape is one of the declared twelve or the two kept
    # while a shape backfills
    labelled = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
        if any("shape" in sample.labels for sample in family.samples)
    }
    assert labelled == set(Metrics.PER_SHAPE) | set(Metrics.WHILE_BACKFILLING)


def test_a_shapes_backfill_series_go_when_its_backfill_ends() -> None:
    metrics = Metrics()
    facts = stub_facts(14, metrics)
    refresh_metrics(metrics, facts)
    backfilling = [
        n for n, state in facts.states.items() if state == "backfilling" and n in facts.backfills
    ]
    assert backfilling and metrics.backfilling == set(backfilling)
    done = dict(
        s.rsplit(" ", 1) for s in _samples(metrics) if s.startswith(Metrics.WHILE_BACKFILLING)
    )
    assert len(done) == 2 * len(backfilling), done
    # when every backfill ended, their series are gone
    ended = dataclasses.replace(facts, states=dict.fromkeys(facts.states, "active"))
    refresh_metrics(metrics, ended)
    assert not [s for s in _samples(metrics) if s.startswith(Metrics.WHILE_BACKFILLING)]
    assert metrics.backfilling == set()


def test_per_shape_off_leaves_the_totals_only() -> None:
    metrics = Metrics(per_shape=False)
    refresh_metrics(metrics, stub_facts(SHAPES, metrics))
    samples = _samples(metrics)
    assert not [s for s in samples if 'shape="' in s]
    names = {s.split("{")[0].split(" ")[0] for s in samples}
    for total in (
        "tidemark_shapes",
        "tidemark_shapes_stalled",
        "tidemark_backfills_running",
        "tidemark_backfills_waiting",
        "tidemark_backfill_rows_done",
        "tidemark_committed_changes_total",
    ):
        assert total in names, total


def test_backfills_build_info_and_the_process_are_exported() -> None:
    metrics = Metrics(version="9.9.9")
    refresh_metrics(metrics, stub_facts(14, metrics))
    values = {s.rsplit(" ", 1)[0]: float(s.rsplit(" ", 1)[1]) for s in _samples(metrics)}
    # 14 shapes: states cycle through 7, two of them backfilling, one with progress
    assert values["tidemark_backfills_running"] == 1
    assert values["tidemark_backfills_waiting"] == 1
    assert values["tidemark_backfill_rows_done"] == 500
    assert values["tidemark_backfill_rows_estimated"] == 1000
    assert values["tidemark_shapes_stalled"] == 1
    held = [k for k in values if k.startswith("tidemark_acknowledgement_held_bytes{")]
    assert len(held) == 1 and values[held[0]] == 4096, held
    assert any(k.startswith("tidemark_build_info{") and 'version="9.9.9"' in k for k in values)
    assert "process_cpu_seconds_total" in values
