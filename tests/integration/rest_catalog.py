"""Iceberg's own REST catalog server for the tests: ``RESTCatalogServer`` of
iceberg-open-api's test fixtures (``make readers`` puts it and what it needs in
``.jars/restcatalog``), serving a ``JdbcCatalog`` on a SQLite file over HTTP. The
table metadata files are written by the server (Hadoop's local file system, from the
pyspark of ``.venv``); the data files and manifests by the client, as with any REST
catalog."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tidemark.demo.postgres import free_port

from .object_store_support import Child, java

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".jars" / "restcatalog"
CHECKSUMS = REPO / "jars" / "restcatalog" / "checksums.sha256"
MAIN = "org.apache.iceberg.rest.RESTCatalogServer"


@dataclass
class RestCatalog:
    """A running REST catalog: ``uri`` for ``[iceberg] catalog_uri``."""

    uri: str
    port: int
    workdir: Path
    child: Child

    def stop(self) -> None:
        self.child.stop()


def class_path() -> str:
    """The server's jars (as pinned) and Hadoop's client jars from pyspark."""
    names = [line.split()[-1] for line in CHECKSUMS.read_text().splitlines() if line.strip()]
    missing = [name for name in names if not (JARS / name).is_file()]
    assert not missing, (
        f"the REST catalog server is not installed ({missing[:3]}): run make readers"
    )
    hadoop = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-*.jar"))
    assert hadoop, "pyspark ships no hadoop-client jars"
    return ":".join(str(p) for p in [*(JARS / n for n in names), *hadoop])


def start_rest_catalog(workdir: Path, timeout_s: float = 60) -> RestCatalog:
    """Start the server on a free port, its catalog in ``workdir/catalog.db`` and new
    tables' default warehouse ``workdir/warehouse``; return once it answers."""
    java_bin = java()
    assert java_bin is not None, "the REST catalog server needs java (17+)"
    (workdir / "warehouse").mkdir(parents=True, exist_ok=True)
    port = free_port()
    # the server reads its catalog's properties from CATALOG_* (CATALOG_A_B: a.b)
    env = {
        "CATALOG_URI": f"jdbc:sqlite:{workdir / 'catalog.db'}",
        "CATALOG_WAREHOUSE": (workdir / "warehouse").as_uri(),
        "CATALOG_REST_PORT": str(port),
    }
    # a small heap and the serial collector: two cores, shared with Spark in the tests
    argv = [java_bin, "-Xmx256m", "-XX:+UseSerialGC", "-cp", class_path(), MAIN]
    child = Child("the REST catalog", argv, workdir / "rest-catalog.log", env=env)
    child.wait_for_port(port, timeout_s)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:  # (the port opens a moment before the servlet answers)
        try:
            with urllib.request.urlopen(f"{uri}/v1/config", timeout=5) as answer:
                json.load(answer)
            break
        except OSError:
            if time.monotonic() > deadline:
                child.stop()
                raise
            time.sleep(0.1)
    return RestCatalog(uri, port, workdir, child)
