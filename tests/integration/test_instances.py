"""Several instances side by side on one sink root: each its own slot, publication,
shapes and state (``[instance] name``), none able to take a shape another owns.

Two ``tidemark run`` processes split the shapes of test_e2e.py, write under one root
from one source, are both SIGKILLed in the middle of the mixed workload and started
again: every shape, folded, equals Postgres, and one consistent read across both
instances' shapes works. Then the refusal: a shape name another instance has is
refused at start (naming the instance) and over the API (409).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from tidemark import read
from tidemark.app import Service
from tidemark.demo.postgres import free_port
from tidemark.demo.verify import compare_shape
from tidemark.errors import ConfigError
from tidemark.lsn import format_lsn
from tidemark.sink.frontiers import load_frontiers

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import (
    service_env,
    start_service,
    stop_service,
    wait_shapes,
    wait_streaming,
)
from .service_support import current_lsn, running_service, settings_for
from .test_api_cli import call
from .test_e2e import SCHEMA, SHAPES, TRUTH, mixed_workload

HALVES = {"a": SHAPES[:3], "b": SHAPES[3:]}


async def test_two_instances_share_a_root_with_disjoint_shapes_and_survive_crashes(
    pg_db: PgDatabase,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # given two instances, each with its own slot and half of the shapes, on one root
    pg_db.execute(SCHEMA)
    root = tmp_path / "lake"
    ports = {name: free_port() for name in HALVES}
    envs = {}
    for name, shapes in HALVES.items():
        env = service_env(
            dsn=pg_db.dsn, root=root, port=ports[name], name=f"tm_inst_{name}", shapes=shapes
        )
        env["TIDEMARK_INSTANCE__NAME"] = name
        envs[name] = env
    logs = {name: tmp_path / f"{name}.log" for name in HALVES}
    procs = {name: start_service(envs[name], logs[name]) for name in HALVES}
    try:
        for name in HALVES:
            wait_streaming(ports[name], procs[name], logs[name], timeout=240)
        # when both are SIGKILLed in the middle of the workload, and started again
        workload = asyncio.create_task(mixed_workload(pg_db))
        await asyncio.sleep(1.0)
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        procs = {name: start_service(envs[name], logs[name]) for name in HALVES}
        await workload
        target_lsn = current_lsn(pg_db.dsn)
        target = format_lsn(target_lsn)
        for name, shapes in HALVES.items():
            wait_streaming(ports[name], procs[name], logs[name], timeout=240)
            wait_shapes(ports[name], target, [s["name"] for s in shapes], timeout=180)
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                stop_service(proc, logs[name])
    # then each instance kept its own state, and every shape equals Postgres
    state = root / "_tidemark" / "instances"
    for name, shapes in HALVES.items():
        assert (state / name / "claims.json").exists()
        frontiers = load_frontiers(root, name)
        assert frontiers is not None and set(frontiers.shapes) == {s["name"] for s in shapes}
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
    # and one read as of one LSN spans both instances' shapes
    # (a shape whose claim the SIGKILL lost was rebuilt from a snapshot after the
    # target: read as of the lowest frontier, past the target and every snapshot)
    merged = load_frontiers(root)
    assert merged is not None and set(merged.shapes) == set(TRUTH)
    as_of = min(f.frontier_lsn for f in merged.shapes.values())
    assert as_of >= target_lsn
    assert all(
        f.snapshot_lsn is None or f.snapshot_lsn - 1 <= as_of for f in merged.shapes.values()
    )
    views = read.snapshot(spark, root, list(TRUTH), as_of)
    assert set(views) == set(TRUTH)


@ONE_SERVER
async def test_a_shape_another_instance_owns_is_refused_at_start_and_over_the_api(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
) -> None:
    pg_db.execute("create table t (id int primary key, v text)")
    root = str(tmp_path)
    shape = {"name": "t_all", "table": "t"}

    def instance(name: str, shapes: list[dict[str, Any]]) -> Any:
        slot = f"tm_{name}"
        return settings_for(
            pg_db.dsn,
            root,
            shapes,
            source={"slot": slot, "publication": slot},
            instance={"name": name},
        )

    # given instance 'a' that has shape t_all
    async with running_service(instance("a", [shape]), spark):
        pass
    # then instance 'b' declaring it too does not start, and says whose it is
    with pytest.raises(ConfigError, match="belong to instance 'a'"):
        async with asyncio.timeout(60):
            await Service(instance("b", [shape]), spark=spark).run()
    # and 'b' cannot add it over the API either, while its own shapes work
    other = {"name": "t_other", "table": "t", "where": "id > 10"}
    async with running_service(instance("b", [other]), spark) as service:
        status, body = await call(service, "POST", "/v1/shapes", shape)
        assert status == 409 and "instance 'a'" in body["error"], body
        assert "t_all" not in service.shapes
