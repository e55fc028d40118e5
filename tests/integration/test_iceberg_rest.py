"""Iceberg tables registered in a REST catalog (``[iceberg] catalog_uri = "http://..."``),
against Iceberg's own REST catalog server (``rest_catalog.py``: ``RESTCatalogServer`` of
iceberg-open-api 1.10.1's test fixtures, a ``JdbcCatalog`` on SQLite behind it).

The commit protocol through it (exactly once by the offsets in the snapshot summary,
a deposed leader's commit refused by the table's mark and by the catalog's swap, which
a REST catalog does as a commit with requirements); the service end to end on it,
stopped and started again, every shape equal to Postgres as tidemark reads it, as
pyiceberg's own REST client reads it and as Iceberg's Spark reader reads it through
the same catalog; a catalog that cannot be reached, or a URL that is no catalog, is a
clear error at start."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tidemark.demo.verify import compare_shape, normalise
from tidemark.errors import SinkError
from tidemark.settings.config import IcebergSettings
from tidemark.sink.iceberg.catalog import forget_catalogs
from tidemark.sink.root import CATALOG_ENV, PROPERTIES_ENV, claim_root, root_format
from tidemark.sink.schema import table_schema
from tidemark.state import fencing

from .conftest import PgDatabase, one_server
from .outside_readers import folded, plain
from .rest_catalog import AuthGateway, RestCatalog, start_rest_catalog
from .service_support import (
    confirmed_flush,
    current_lsn,
    run_cli,
    running_service,
    settings_for,
    wait_frontiers,
)
from .sink_support import rows_of
from .test_e2e import SCHEMA, SHAPES, TRUTH, arun, mixed_workload
from .test_iceberg import epoch_one  # noqa: F401  (a fixture)
from .test_sink_fencing import BATCH, COLUMNS, SHAPE, _batch_files


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalog]:
    server = start_rest_catalog(tmp_path_factory.mktemp("rest-catalog"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace of the test's own in the module's catalog."""
    yield f"t_{secrets.token_hex(4)}"
    forget_catalogs()


def test_commits_through_a_rest_catalog_are_exactly_once_and_fenced(
    tmp_path: Path,
    rest_catalog: RestCatalog,
    namespace: str,
    epoch_one: fencing.Fence,  # noqa: F811
) -> None:
    root = str(tmp_path)
    settings = IcebergSettings(catalog_uri=rest_catalog.uri, namespace=namespace)
    iceberg = claim_root(tmp_path, "iceberg", settings)
    table = iceberg.changelog(root, SHAPE)
    table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is not None
    # a replay of what is committed (a restart before the acknowledgement) is skipped
    assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is None
    staged = _batch_files(table, BATCH + 1, 2 * BATCH)
    # when a newer leader takes over: the epoch raised, the table marked in the catalog
    assert fencing.advance(root, "test") == 2
    fencing.install(fencing.Fence(root, 2))
    assert iceberg.mark(root, 2, [SHAPE], fencing.EPOCH_APP) == 1
    fencing.install(epoch_one)
    # then the old leader's commit, built on the snapshot before the mark, is refused:
    # the catalog refuses the swap, the table read again carries the newer mark
    with pytest.raises(fencing.Deposed, match="newer leader"):
        table.commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
    # and a reader finds the catalog from the root's record
    forget_catalogs()
    fresh = root_format(tmp_path).changelog(root, SHAPE)
    assert fresh.committed_lsn() == BATCH
    assert sorted(r["_lsn"] for r in rows_of(fresh)) == list(range(1, BATCH + 1))


def test_a_rest_catalog_that_cannot_be_used_is_a_clear_error(
    tmp_path: Path, rest_catalog: RestCatalog, namespace: str
) -> None:
    for uri in ("http://127.0.0.1:1/catalog", f"{rest_catalog.uri}/no/catalog/here"):
        settings = IcebergSettings(catalog_uri=uri, namespace=namespace)
        with pytest.raises(SinkError) as failure:
            claim_root(tmp_path / secrets.token_hex(2), "iceberg", settings)
        message = str(failure.value)
        assert f"cannot use the Iceberg catalog at {uri}" in message, message
        assert "[iceberg] catalog_uri (is the REST catalog up" in message, message
        assert "Traceback" not in message


def test_a_rest_catalog_that_refuses_the_credentials_is_a_clear_error_and_loses_nothing(
    tmp_path: Path,
    rest_catalog: RestCatalog,
    namespace: str,
    epoch_one: fencing.Fence,  # noqa: F811
) -> None:
    """Behind an OAuth2 gateway (``AuthGateway``): a wrong or missing credential at start,
    a principal that may not create the namespace, and credentials revoked while the
    service commits, each a ``SinkError`` that names
    the shape (mid-run) and says what to set where, never the secret; the refused
    commit leaves the table as it was, and once the credential is right again the same
    batch lands exactly once."""
    secret = "tidemark:" + secrets.token_hex(8)
    gateway = AuthGateway(rest_catalog.uri, secret)
    try:
        for properties in ({"credential": "tidemark:not-the-secret"}, {}, {"token": "stale"}):
            settings = IcebergSettings(
                catalog_uri=gateway.uri, namespace=namespace, properties=properties
            )
            with pytest.raises(SinkError) as failure:
                claim_root(tmp_path / secrets.token_hex(2), "iceberg", settings)
            message = str(failure.value)
            assert f"cannot use the Iceberg catalog at {gateway.uri}" in message, message
            assert "refused tidemark's credentials" in message, message
            assert "`credential`" in message and "[iceberg] properties" in message, message
            assert "not-the-secret" not in message and "Traceback" not in message, message
            forget_catalogs()
        # the right credential, but a principal that may not create namespaces
        gateway.forbidden.add(("POST", "/v1/namespaces"))
        settings = IcebergSettings(
            catalog_uri=gateway.uri, namespace=namespace, properties={"credential": secret}
        )
        with pytest.raises(SinkError) as failure:
            claim_root(tmp_path / secrets.token_hex(2), "iceberg", settings)
        message = str(failure.value)
        assert "ForbiddenError" in message and "grant its principal the rights" in message
        assert "[iceberg] namespace" in message and secret not in message, message
        gateway.forbidden.clear()
        forget_catalogs()
        root = str(tmp_path)
        good = {"credential": secret}
        settings = IcebergSettings(catalog_uri=gateway.uri, namespace=namespace, properties=good)
        table = claim_root(tmp_path, "iceberg", settings).changelog(root, SHAPE)
        table.create(table_schema(COLUMNS), ["id"], {"name": SHAPE})
        assert table.commit(_batch_files(table, 1, BATCH), BATCH, first_lsn=1) is not None
        refused_before = gateway.refused
        gateway.revoke()  # (its secret rotated: the one tidemark has is no good now)
        staged = _batch_files(table, BATCH + 1, 2 * BATCH)
        with pytest.raises(SinkError) as failure:
            table.commit(staged, 2 * BATCH, first_lsn=BATCH + 1)
        message = str(failure.value)
        assert gateway.refused > refused_before
        assert f"shape '{SHAPE}'" in message, message
        assert "refused tidemark's credentials" in message, message
        assert "then restart tidemark" in message and secret not in message, message
        # the credential set right (the rotated one) and started again: the table holds
        # the first batch only; the refused batch, committed again, lands once
        forget_catalogs()
        rotated = {"credential": gateway.credential}
        settings = IcebergSettings(catalog_uri=gateway.uri, namespace=namespace, properties=rotated)
        again = claim_root(tmp_path, "iceberg", settings).changelog(root, SHAPE)
        assert again.committed_lsn() == BATCH
        assert again.commit(staged, 2 * BATCH, first_lsn=BATCH + 1) is not None
        assert again.commit(staged, 2 * BATCH, first_lsn=BATCH + 1) is None
        lsns = sorted(r["_lsn"] for r in rows_of(again))
        assert lsns == list(range(1, 2 * BATCH + 1))
    finally:
        gateway.stop()


@one_server()
async def test_credentials_revoked_while_the_service_runs_hold_the_acknowledgement_and_lose_nothing(
    pg_db: PgDatabase,
    spark: Any,
    tmp_path: Path,
    rest_catalog: RestCatalog,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The service behind the OAuth2 gateway: its secret rotated while rows arrive, the
    shapes those rows touch show the refusal and what to do, nothing past them is
    acknowledged; the secret given back, they commit, and every shape equals Postgres."""
    root = tmp_path / "lake"
    await arun(pg_db, SCHEMA)
    secret = "tidemark:" + secrets.token_hex(8)
    gateway = AuthGateway(rest_catalog.uri, secret)
    try:
        iceberg = {
            "catalog_uri": gateway.uri,
            "namespace": namespace,
            "properties": {"credential": secret},
        }
        settings = settings_for(
            pg_db.dsn, str(root), SHAPES, sink={"format": "iceberg"}, iceberg=iceberg
        )
        async with running_service(settings, spark) as service:
            await mixed_workload(pg_db)
            await wait_frontiers(service, current_lsn(pg_db.dsn))
            gateway.revoke()
            await arun(pg_db, "update accounts set balance = balance + 7 where id % 4 = 0")
            written = current_lsn(pg_db.dsn)
            async with asyncio.timeout(90):
                while True:
                    shown = {n: service.shape_state(n) for n in service.shapes}
                    failing = {n: e for n, (state, e) in shown.items() if state == "error" and e}
                    if failing:
                        break
                    await asyncio.sleep(0.1)
            assert all("refused tidemark's credentials" in e for e in failing.values()), failing
            assert all(f"shape '{n}'" in e for n, e in failing.items()), failing
            assert all(secret not in e for e in failing.values()), failing
            await asyncio.sleep(2)  # (retries come and are refused)
            assert confirmed_flush(pg_db.dsn) < written
            gateway.credential = secret  # (given back: the next retry is let through)
            await arun(
                pg_db, "insert into notes select g, 150, 'late' from generate_series(90, 99) g"
            )
            await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert gateway.refused > 0
        forget_catalogs()
        # readers through the same gateway, with the credential given as a reader gives
        # it: the library from TIDEMARK_ICEBERG__PROPERTIES, `tidemark read` from its
        # settings file; a wrong one is the same clear refusal, for a reader
        monkeypatch.setenv(CATALOG_ENV, gateway.uri)
        monkeypatch.setenv(PROPERTIES_ENV, json.dumps({"credential": secret}))
        for shape, query in TRUTH.items():
            result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
            assert result.equal, result.describe()
        monkeypatch.delenv(CATALOG_ENV)
        monkeypatch.delenv(PROPERTIES_ENV)
        config = tmp_path / "read.toml"
        for credential in (secret, "tidemark:wrong"):
            config.write_text(
                f'[sink]\nroot = "{root}"\n[current]\nenabled = false\n'
                f'[iceberg]\ncatalog_uri = "{gateway.uri}"\nnamespace = "{namespace}"\n'
                f'[iceberg.properties]\ncredential = "{credential}"\n'
            )
            done = run_cli("read", "gold", "--config", str(config), "-o", "json")
            if credential != secret:
                assert done.returncode != 0, done.stdout[-2000:]
                assert "refused tidemark's credentials" in done.stderr, done.stderr[-2000:]
                assert "TIDEMARK_ICEBERG__PROPERTIES" in done.stderr, done.stderr[-2000:]
                assert "Traceback" not in done.stderr and credential not in done.stderr
                continue
            assert done.returncode == 0, done.stderr[-2000:]
            rows = json.loads(done.stdout)["rows"]
            with psycopg.connect(pg_db.dsn) as conn:
                query = "select id, owner, tier from accounts where tier = 'gold'"
                truth = Counter(tuple(map(normalise, r)) for r in conn.execute(query))
            got = Counter(tuple(normalise(r[c]) for c in ("id", "owner", "tier")) for r in rows)
            assert got == truth and got, got
    finally:
        gateway.stop()


@one_server()
async def test_the_service_on_a_rest_catalog_equals_postgres_for_every_reader(
    pg_db: PgDatabase, spark: Any, tmp_path: Path, rest_catalog: RestCatalog, namespace: str
) -> None:
    root = tmp_path / "lake"
    await arun(pg_db, SCHEMA)
    iceberg = {"catalog_uri": rest_catalog.uri, "namespace": namespace}
    sink = {"format": "iceberg"}
    settings = settings_for(pg_db.dsn, str(root), SHAPES, sink=sink, iceberg=iceberg)
    async with running_service(settings, spark) as service:
        await mixed_workload(pg_db)
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    # stopped and started again on the same catalog: more changes, none twice; the
    # current tables folded at the clean stop
    fold = {"fold_on_stop": True}
    again = settings_for(pg_db.dsn, str(root), SHAPES, sink=sink, iceberg=iceberg, current=fold)
    async with running_service(again, spark) as service:
        await arun(pg_db, "update accounts set balance = balance + 7 where id % 4 = 0")
        await arun(pg_db, "insert into notes select g, 150, 'late' from generate_series(90, 99) g")
        await wait_frontiers(service, current_lsn(pg_db.dsn))
    forget_catalogs()
    for shape, query in TRUTH.items():
        result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
        assert result.equal, result.describe()
    check_outside_readers(pg_db, root, rest_catalog, namespace)


def check_outside_readers(
    db: PgDatabase, root: Path, rest_catalog: RestCatalog, namespace: str
) -> None:
    """pyiceberg's REST client and Iceberg's Spark reader (through the same catalog)
    read every changelog, folded, and every current table equal to Postgres, with no
    change row twice."""
    import pyarrow.parquet as pq
    from pyiceberg.catalog.rest import RestCatalog as PyIcebergRest

    from .reference_support import equals_postgres, postgres_rows, reference_read, same_rows

    outside = PyIcebergRest("outside", uri=rest_catalog.uri)
    changelogs = {}
    with psycopg.connect(db.dsn) as conn:
        for shape, query in TRUTH.items():
            expected = frozenset(tuple(map(normalise, r)) for r in conn.execute(query))
            table = outside.load_table((namespace, shape))
            assert table.location() == (root / "tables" / shape).as_uri(), table.location()
            changes = table.scan().to_arrow()
            changelogs[shape] = changes
            lsns, ops = changes["_lsn"].to_pylist(), changes["_op"].to_pylist()
            pairs = Counter(zip(lsns, ops, strict=True))
            assert max(pairs.values()) == 1, f"{shape}: a change row twice"
            assert folded(changes.to_pylist(), ["id"]) == expected, shape
            state = outside.load_table((f"{namespace}_current", shape)).scan().to_arrow()
            assert plain(state.to_pylist()) == expected, f"current {shape}"
    reads = [
        {"id": f"{kind}-{shape}", "iceberg": f"{ns}.{shape}"}
        for shape in TRUTH
        for kind, ns in (("tables", namespace), ("current", f"{namespace}_current"))
    ]
    work = root.parent / "reference"
    reference_read(work, reads, {"type": "rest", "uri": rest_catalog.uri})
    for shape, query in TRUTH.items():
        same_rows(pq.read_table(work / f"tables-{shape}.parquet"), changelogs[shape], shape)
        current = pq.read_table(work / f"current-{shape}.parquet")
        equals_postgres(current, postgres_rows(db.dsn, query), f"current {shape}")
