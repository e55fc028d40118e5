"""``docker compose up``, run for real: the repository's docker-compose.yml under podman.

``make test-compose`` builds the images first (deploy/podman/setup.sh: tidemark's from
deploy/Dockerfile on a local Debian base, local stand-ins for the public postgres,
prometheus and postgres-exporter images) and runs this module with podman-compose and
deploy/podman/compose.podman.yml on top of the compose file (local images, other host
ports, DNS retries). The tests run in order on one stack:

* it comes up healthy; ``tidemark config check`` passes inside the container;
* every shape's table, folded, equals its query on the stack's Postgres, and no change
  is in a changelog twice;
* Prometheus scrapes tidemark and the postgres exporter and loads every alert rule;
* ``compose kill tidemark`` and ``compose up``: nothing lost, nothing duplicated;
* profile ``ha``: the standby's container streams within 15 s of the leader's being
  killed, nothing lost;
* ``compose down`` keeps the volumes (the data is there after ``up``), ``down -v``
  removes them;

then bad input, each on a stack of its own: a Postgres without ``wal_level=logical``, a
wrong password, a sink volume tidemark cannot write. The container exits with the
message the CLI gives and no traceback, and the health check says why.

Grafana is not run (no image here, none in Debian): it has a profile of its own.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
import yaml

from tidemark.read import arrow_changelog, arrow_current
from tidemark.sink.schema import LSN, METADATA_NAMES, OP

from .support import (
    API_PORT,
    IMAGE,
    PROJECT,
    PROMETHEUS_PORT,
    REPO,
    STANDBY_PORT,
    Stack,
    eventually,
    http_json,
    run,
)

# -- the data --------------------------------------------------------------------------------


def compose_shapes() -> list[dict[str, Any]]:
    spec = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return list(json.loads(spec["services"]["tidemark"]["environment"]["TIDEMARK_SHAPES"]))


def normal(value: Any) -> Any:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    return value


def sink_root(stack: Stack) -> Path:
    out = run(["podman", "volume", "inspect", "--format", "{{.Mountpoint}}", f"{PROJECT}_sink"])
    return Path(out.strip())


def source_lsn(stack: Stack) -> str:
    with stack.postgres() as conn:
        row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wait_for_lsn(port: int, lsn: str, shapes: Sequence[str]) -> None:
    for shape in shapes:
        url = f"http://127.0.0.1:{port}/v1/progress/wait?lsn={lsn}&shape={shape}&timeout=120"
        status, body = http_json(url, timeout=130)
        assert status == 200, f"{shape} did not reach {lsn}: {status} {body}"


def wait_for_rows(stack: Stack, shapes: Sequence[dict[str, Any]], timeout: float = 90) -> None:
    """Until the workload wrote rows into every shape: it starts without waiting for
    Postgres's health (podman-compose ignores ``condition: service_healthy``) and polls
    for the schema every 2 s, so a test right after ``up`` can find nothing yet."""
    deadline = time.monotonic() + timeout
    with stack.postgres() as conn:
        for shape in shapes:
            query = "select exists (select from {}{})".format(
                shape["table"], f" where {shape['where']}" if shape.get("where") else ""
            )
            while not conn.execute(query).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, f"{shape['name']}: no rows in {timeout} s"
                time.sleep(0.5)


def assert_lake_equals_postgres(stack: Stack, port: int) -> dict[str, int]:
    """Quiesce the workload, wait until every shape reached the source's LSN, then compare
    each folded shape table with its query on Postgres, and every changelog for a change
    recorded twice. Returns the rows per shape."""
    shapes = compose_shapes()
    wait_for_rows(stack, shapes)
    run(["podman", "stop", "-t", "10", stack.container("workload")])
    try:
        wait_for_lsn(port, source_lsn(stack), [s["name"] for s in shapes])
        root = sink_root(stack)
        counts = {}
        with stack.postgres() as conn:
            for shape in shapes:
                lake = arrow_current(root, shape["name"])
                columns = [c for c in lake.column_names if c not in METADATA_NAMES]
                query = "select {} from {}{}".format(
                    ", ".join(f'"{c}"' for c in columns),
                    shape["table"],
                    f" where {shape['where']}" if shape.get("where") else "",
                )
                expected = Counter(
                    tuple(normal(v) for v in row) for row in conn.execute(query).fetchall()
                )
                got = Counter(
                    tuple(normal(r[c]) for c in columns) for r in lake.select(columns).to_pylist()
                )
                assert expected, f"{shape['name']}: the workload wrote nothing yet"
                missing, extra = expected - got, got - expected
                assert not missing and not extra, (
                    f"{shape['name']}: {sum(missing.values())} rows missing from the lake, "
                    f"{sum(extra.values())} there but not in Postgres; e.g. "
                    f"{list(missing)[:2]} / {list(extra)[:2]}"
                )
                changes = arrow_changelog(root, shape["name"]).select([LSN, OP])
                twice = changes.group_by([LSN, OP]).aggregate([([LSN], "count")])
                recorded_twice = pc.sum(pc.greater(twice[f"{LSN}_count"], 1)).as_py() or 0
                assert recorded_twice == 0, f"{shape['name']}: changes recorded twice"
                counts[shape["name"]] = sum(expected.values())
        print(f"\nlake equals postgres: {counts}")
        return counts
    finally:
        run(["podman", "start", stack.container("workload")])


# -- the stack -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    stack = Stack(PROJECT)
    run(["podman", "image", "exists", IMAGE], check=True)
    stack.down(volumes=True, profiles=["ha"])  # what an interrupted run left
    stack.compose("up", "-d", "postgres")
    stack.wait_healthy("postgres", 120)
    started = time.monotonic()
    # everything but the `ha`, `spark` and `grafana` profiles
    stack.compose("up", "-d")
    took = stack.wait_healthy("tidemark", 240)
    print(f"\ntidemark healthy {took:.1f} s after `up` ({time.monotonic() - started:.1f} s)")
    try:
        yield stack
    finally:
        if os.environ.get("TIDEMARK_COMPOSE_KEEP") != "1":
            stack.down(volumes=True, profiles=["ha"])


def test_the_stack_comes_up_and_tidemark_checks_its_configuration(stack: Stack) -> None:
    size = int(run(["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE]).strip())
    print(f"\nimage {IMAGE}: {size / 1e9:.2f} GB ({size} bytes)")
    for service in ("postgres", "tidemark", "postgres-exporter", "prometheus"):
        healthy, said = stack.healthcheck(service)
        assert healthy, f"{service}: {said}"
    assert stack.running("workload")
    # the image runs as the non-root user, its compiled per-change path built
    assert run(["podman", "exec", stack.container("tidemark"), "id", "-u"]).strip() == "185"
    check = run(["podman", "exec", stack.container("tidemark"), "tidemark", "config", "check"])
    assert re.search(r"\n(\d+) checks passed, 0 failed", check), check
    assert "compiled" in check and "pure Python" not in check, check
    # liveness, and what readiness says beside it
    healthy, said = stack.healthcheck("tidemark")
    assert healthy and said.startswith("alive: leader"), said


def test_every_shape_equals_postgres(stack: Stack) -> None:
    counts = assert_lake_equals_postgres(stack, API_PORT)
    assert set(counts) == {s["name"] for s in compose_shapes()}


def test_prometheus_scrapes_tidemark_and_loads_the_alert_rules(stack: Stack) -> None:
    base = f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1"

    def targets_up() -> dict[str, str] | None:
        _, body = http_json(f"{base}/targets")
        health = {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
        return health if health.get("tidemark") == health.get("postgres") == "up" else None

    # the scrape interval is 15 s
    eventually("Prometheus scrapes tidemark and the exporter", targets_up, timeout=90)
    _, body = http_json(f"{base}/query?query=tidemark_build_info")
    assert body["data"]["result"], "no tidemark_build_info series in Prometheus"
    _, body = http_json(f"{base}/query?query=pg_replication_slot_tidemark_lag_bytes")
    alerts = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    declared = {r["alert"] for g in alerts["groups"] for r in g["rules"] if "alert" in r}
    _, body = http_json(f"{base}/rules")
    loaded = {r["name"]: r for g in body["data"]["groups"] for r in g["rules"]}
    assert declared <= set(loaded), f"rules not loaded: {declared - set(loaded)}"
    broken = {n: r.get("lastError") for n, r in loaded.items() if r.get("health") == "err"}
    assert not broken, broken


def test_a_killed_tidemark_comes_back_losing_and_duplicating_nothing(stack: Stack) -> None:
    stack.compose("kill", "tidemark")
    assert not stack.running("tidemark")
    time.sleep(3)  # the workload writes meanwhile
    stack.compose("up", "-d", "tidemark")
    stack.wait_healthy("tidemark", 240)
    assert_lake_equals_postgres(stack, API_PORT)


def test_the_ha_standby_streams_within_15_s_of_the_leaders_death(stack: Stack) -> None:
    stack.compose("up", "-d", "tidemark-standby", profiles=["ha"])
    stack.wait_healthy("tidemark-standby", 240)
    role = f"http://127.0.0.1:{STANDBY_PORT}/healthz"
    assert http_json(role)[1]["role"] == "standby"
    stack.compose("kill", "tidemark", profiles=["ha"])
    killed = time.monotonic()

    def streaming() -> bool:
        _, health = http_json(role, timeout=2)
        return health["role"] == "leader" and health["phase"] == "streaming"

    eventually("the standby streams", streaming, timeout=60, every=0.25)
    took = time.monotonic() - killed
    print(f"\nstandby streaming {took:.1f} s after the leader's container was killed")
    assert took <= 15, f"the standby took {took:.1f} s to stream"
    assert_lake_equals_postgres(stack, STANDBY_PORT)
    # the old leader's container comes back as the standby
    stack.compose("up", "-d", "tidemark", profiles=["ha"])
    stack.wait_healthy("tidemark", 240)
    assert http_json(f"http://127.0.0.1:{API_PORT}/healthz")[1]["role"] == "standby"
    stack.compose("stop", "tidemark-standby", profiles=["ha"], timeout=120)
    # and leads again once the other is stopped
    eventually(
        "the first tidemark leads again",
        lambda: (
            http_json(f"http://127.0.0.1:{API_PORT}/healthz", timeout=2)[1]["phase"] == "streaming"
        ),
        timeout=60,
    )
    run(["podman", "rm", "-f", stack.container("tidemark-standby")])


def test_down_keeps_the_volumes_and_down_v_removes_them(stack: Stack) -> None:
    before = assert_lake_equals_postgres(stack, API_PORT)
    took = stack.down()
    print(f"\ncompose down took {took:.1f} s")
    # tidemark and Postgres stop together: neither waits for the other (the grace
    # periods are 45 s and 10 s)
    assert took < 30, f"compose down took {took:.1f} s"
    assert {f"{PROJECT}_pgdata", f"{PROJECT}_sink", f"{PROJECT}_prometheus-data"} <= (
        stack.volumes()
    )
    stack.compose("up", "-d")
    stack.wait_healthy("postgres", 120)
    stack.wait_healthy("tidemark", 240)
    after = assert_lake_equals_postgres(stack, API_PORT)
    assert all(after[s] >= before[s] for s in before if s != "order_status"), (before, after)
    stack.down(volumes=True)
    assert not stack.volumes(), stack.volumes()
