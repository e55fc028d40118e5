"""tidemark on a real Spark standalone cluster: a master and a worker started from
pyspark's installation on loopback (``spark_cluster``), ``tidemark run`` as the
driver with ``[spark] master = "spark://127.0.0.1:PORT"``. Executors write the
Parquet files (their logs say so), the driver commits to Delta, and the mixed
workload of test_e2e.py, folded, equals Postgres for every shape.

Runs on both Postgres servers (16 and 15), like the Spark Connect test. The service
is a child process (see
remote_service.py for why); the fold is read with the suite's local session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidemark.demo.postgres import free_port
from tidemark.demo.spark import StandaloneCluster
from tidemark.demo.verify import compare_shape
from tidemark.lsn import format_lsn

from .conftest import PgDatabase
from .remote_service import (
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

# what a driver on a cluster needs besides the master URL: an address executors can
# reach it on (here loopback), and executors that fit the worker
CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "512m",
    "spark.cores.max": "2",
}


async def test_mixed_workload_on_a_standalone_cluster_equals_postgres(
    pg_db: PgDatabase,
    spark_cluster: StandaloneCluster,
    spark,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # given tidemark as the driver of an application on the cluster
    pg_db.execute(SCHEMA)
    pg_db.execute("insert into accounts values (9000, 'before', 5000, 'gold', 'snap', null)")
    root = tmp_path / "lake"  # on a real cluster: storage the driver and executors share
    port = free_port()
    env = service_env(
        dsn=pg_db.dsn,
        root=root,
        port=port,
        name="tm_cluster",
        shapes=SHAPES,
        master=spark_cluster.master_url,
        app_name="tidemark-cluster-e2e",
        conf=json.dumps(CLUSTER_CONF),
    )
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    log = tmp_path / "service.log"
    proc = start_service(env, log)
    try:
        wait_streaming(port, proc, log, timeout=240)
        # when the mixed workload runs and every shape catches up
        await mixed_workload(pg_db)
        target = format_lsn(current_lsn(pg_db.dsn))
        wait_shapes(port, target, [s["name"] for s in SHAPES], timeout=180)
        status, ready = get_json(port, "/readyz")
        assert status == 200, ready
    finally:
        stop_service(proc, log)
    # then every shape, folded, equals Postgres
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
    # and the work ran on the cluster: the master knows the application, and its
    # executors (not the driver) wrote the shape tables' Parquet files: into a table's
    # folder (a shape flushed alone, a backfill) or a flush round's staging folder,
    # from which tidemark moves each shape's files into its table
    apps = spark_cluster.status()
    names = [a["name"] for a in apps["activeapps"] + apps["completedapps"]]
    assert "tidemark-cluster-e2e" in names, names
    saved = [
        line
        for stderr in spark_cluster.executor_logs()
        for line in stderr.read_text(errors="replace").splitlines()
        if "Saved output of task" in line
    ]
    written = [line for line in saved if f"file:{root}/tables/" in line]
    rounds = [line for line in saved if f"file:{root}/_rounds/" in line]
    tables = {line.split(f"file:{root}/tables/")[1].split("/")[0] for line in written}
    shapes = {s["name"] for s in SHAPES}
    assert tables <= shapes, tables
    assert tables == shapes or rounds, (tables, len(rounds))
