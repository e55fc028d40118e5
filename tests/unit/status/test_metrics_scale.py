"""The metrics at 1000 shapes: at most 12 series a shape, no ``_created`` series, every
family labelled by shape declared in ``Metrics.PER_SHAPE``, and none of them with
``[metrics] per_shape = false``. (How long a scrape takes is measured by ``python -m
bench metrics``, not here.)"""

from __future__ import annotations

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
    assert len(by_shape) / SHAPES <= 12
    assert len(by_shape) / SHAPES == len(Metrics.PER_SHAPE)  # every family was exercised
    assert not [s for s in samples if "_created" in s.split("{")[0].split(" ")[0]]
    # and every family labelled by shape is one of the declared twelve
    labelled = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
        if any("shape" in sample.labels for sample in family.samples)
    }
    assert labelled == set(Metrics.PER_SHAPE)


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
