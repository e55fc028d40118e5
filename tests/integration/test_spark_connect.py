"""tidemark as a Spark Connect client: a real Spark Connect server started from
pyspark's installation on loopback (``connect_server``), ``tidemark run`` with
``[spark] remote = "sc://127.0.0.1:PORT"`` and no JVM of its own. The mixed
workload of test_e2e.py (snapshots and stream batches written through Connect),
folded through Connect with ``tidemark.read``, equals Postgres for every shape.

The end-to-end test runs on both Postgres servers (16 and 15). The service and the
Connect reader are child processes (see remote_service.py and connect_client.py for why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tidemark.demo.postgres import free_port
from tidemark.demo.spark import ConnectServer, StandaloneCluster
from tidemark.lsn import format_lsn
from tidemark.sink.delta.table import table_path
from tidemark.spark import CONNECT_JOB_BYTES

from .conftest import ONE_SERVER, PgDatabase
from .remote_service import (
    ROOT,
    descendants,
    get_json,
    service_env,
    start_service,
    stop_service,
    wait_shapes,
    wait_streaming,
)
from .service_support import current_lsn
from .test_e2e import SCHEMA, SHAPES, TRUTH, mixed_workload

pytestmark = pytest.mark.spark_cluster


def connect_client(*args: str, timeout: float = 300) -> dict[str, Any]:
    """Run connect_client.py in its own process; its JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.connect_client", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def test_mixed_workload_through_spark_connect_equals_postgres(
    pg_db: PgDatabase, connect_server: ConnectServer, tmp_path: Path
) -> None:
    # given tidemark configured with a Spark Connect URL instead of a master
    pg_db.execute(SCHEMA)
    pg_db.execute("insert into accounts values (9000, 'before', 5000, 'gold', 'snap', null)")
    root = tmp_path / "lake"  # the server writes it: it must see the same path
    port = free_port()
    env = service_env(
        dsn=pg_db.dsn,
        root=root,
        port=port,
        name="tm_connect",
        shapes=SHAPES,
        remote=connect_server.url,
    )
    log = tmp_path / "service.log"
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc, log, timeout=180)
        # then it runs no JVM: no java process below it (a classic session starts one)
        assert "java" not in descendants(proc.pid).values(), descendants(proc.pid)
        # when the mixed workload runs and every shape catches up
        await mixed_workload(pg_db)
        target = format_lsn(current_lsn(pg_db.dsn))
        wait_shapes(port, target, [s["name"] for s in SHAPES], timeout=180)
        status, ready = get_json(port, "/readyz")
        assert status == 200, ready
        assert "java" not in descendants(proc.pid).values(), descendants(proc.pid)
    finally:
        stop_service(proc, log)
    # then every shape, folded through Connect, equals Postgres
    out = connect_client("fold", connect_server.url, str(root), pg_db.dsn, json.dumps(TRUTH))
    assert out["connect"] is True
    assert set(out["shapes"]) == set(TRUTH)
    for result in out["shapes"].values():
        assert result["equal"], result["describe"]
    assert out["shapes"]["rich"]["rows"] > 0
    # and each current-state table, refreshed through Connect, read plainly
    assert out["current"] == {shape: True for shape in TRUTH}, out["current"]
    # and again, all shapes refreshed together (one file each, one job per layout)
    assert out["current_together"] == {shape: True for shape in TRUTH}, out["current_together"]


def test_a_batch_bigger_than_one_connect_job_is_written_whole(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    # given a batch of about 70 MB of Arrow: as one job it exhausts a server driver of
    # 1 GiB (measured: 50 MB did), so write_arrow sends it as several
    rows = 800_000
    out = connect_client("write", connect_server.url, str(tmp_path), str(rows))
    assert out["connect"] is True
    assert out["arrow_bytes"] > 3 * CONNECT_JOB_BYTES
    assert out["jobs"] == -(-out["arrow_bytes"] // CONNECT_JOB_BYTES) and out["files"] >= 4
    # then one commit holds every row exactly once
    table = DeltaTable(str(table_path(tmp_path, "big"))).to_pyarrow_table(columns=["id"])
    ids = table.column("id").to_pylist()
    assert len(ids) == rows and set(ids) == set(range(rows))


@ONE_SERVER
async def test_a_connect_server_on_the_standalone_cluster_as_the_compose_profile_runs_it(
    pg_db: PgDatabase, spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # given the compose `spark` profile's arrangement: the Connect server is the driver
    # of an application on the standalone cluster, with one of its cores
    cluster_conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.cores.max": "1",
    }
    pg_db.execute(SCHEMA)
    root = tmp_path / "lake"
    port = free_port()
    with ConnectServer(master=spark_cluster.master_url, conf=cluster_conf) as server:
        env = service_env(
            dsn=pg_db.dsn, root=root, port=port, name="tm_connect_cluster", shapes=SHAPES,
            remote=server.url,
        )  # fmt: skip
        log = tmp_path / "service.log"
        proc = start_service(env, log)
        try:
            wait_streaming(port, proc, log, timeout=180)
            await mixed_workload(pg_db)
            target = format_lsn(current_lsn(pg_db.dsn))
            wait_shapes(port, target, [s["name"] for s in SHAPES], timeout=180)
        finally:
            stop_service(proc, log)
        # then every shape equals Postgres, and the cluster ran the server's application
        out = connect_client("fold", server.url, str(root), pg_db.dsn, json.dumps(TRUTH))
    for result in out["shapes"].values():
        assert result["equal"], result["describe"]
    apps = spark_cluster.status()
    names = [a["name"] for a in apps["activeapps"] + apps["completedapps"]]
    assert "tidemark-connect" in names, names
