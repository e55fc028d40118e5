"""The Iceberg catalog a sink root's tables are registered in.

By default a SQLite file under the sink root (``_tidemark/iceberg.db``): nothing to
run, and it syncs its own commits. ``[iceberg] catalog_uri`` names another: a
PostgreSQL database (``postgresql://...``, pyiceberg's SQL catalog over psycopg), a
SQLite file elsewhere, or a REST catalog (``http(s)://...``). Either way tidemark
commits through pyiceberg, with the file IO of ``iceberg.io`` (every metadata file
synced before the catalog's pointer moves to it), but for the stream commits of a
local root with a SQL catalog, which Spark's driver makes (``iceberg.jvm``).

Tables: ``<namespace>.<shape>`` (the changelog, at ``<root>/tables/<shape>``) and
``<namespace>_current.<shape>`` (the current state, at ``<root>/current/<shape>``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from tidemark.conninfo import redact_dsn, redact_text
from tidemark.errors import SinkError
from tidemark.state import objectstore
from tidemark.state.durable import SyncSet, make_dirs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from tidemark.settings.config import IcebergSettings

log = structlog.get_logger("tidemark.sink.iceberg")

CATALOG_NAME = "tidemark"
CATALOG_FILE = "_tidemark/iceberg.db"
IO_IMPL = "tidemark.sink.iceberg.io.SyncedFileIO"

_lock = threading.Lock()
_catalogs: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], Catalog] = {}


def catalog_uri(root: str | Path, uri: str = "") -> str:
    """The catalog's URI as given, or the default SQLite file under ``root`` (a local
    root only: ``tidemark.settings.config`` asks for a catalog with an object-store root)."""
    if uri:
        return uri
    if objectstore.is_remote(root):
        raise SinkError(
            f"the sink root {root} is on an object store, which cannot hold the default "
            "SQLite catalog: set [iceberg] catalog_uri"
        )
    return f"sqlite:///{Path(root).resolve() / CATALOG_FILE}"


def _root_key(root: str | Path) -> str:
    return str(root) if objectstore.is_remote(root) else str(Path(root).resolve())


def _sqlalchemy_uri(uri: str) -> str:
    """pyiceberg's SQL catalog speaks SQLAlchemy: PostgreSQL through psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if uri.startswith(prefix):
            return "postgresql+psycopg://" + uri[len(prefix) :]
    return uri


def open_catalog(root: str | Path, settings: IcebergSettings) -> Catalog:
    """The catalog of ``root``'s tables (one per root and URI in a process), its
    namespaces created; ``SinkError`` saying what to do when it cannot be reached."""
    uri = catalog_uri(root, settings.catalog_uri)
    # (the properties too: a reader given other credentials than a service's)
    key = (_root_key(root), uri, settings.namespace, tuple(sorted(settings.properties.items())))
    with _lock:
        found = _catalogs.get(key)
        if found is not None:
            return found
        catalog = _open(root, uri, settings)
        _catalogs[key] = catalog
        return catalog


def _open(root: str | Path, uri: str, settings: IcebergSettings) -> Catalog:
    # (an s3:// warehouse: its files go through the process's own S3 filesystem,
    # ``iceberg.io``, so no credentials are among the catalog's properties)
    warehouse = str(root) if objectstore.is_remote(root) else Path(root).resolve().as_uri()
    properties: dict[str, Any] = {
        "warehouse": warehouse,
        "py-io-impl": IO_IMPL,
        **settings.properties,
    }
    shown = redact_dsn(uri) if "://" in uri and "@" in uri else uri
    rest = uri.startswith(("http://", "https://"))
    try:
        if rest:
            from pyiceberg.catalog.rest import RestCatalog

            catalog: Catalog = RestCatalog(CATALOG_NAME, uri=uri, **properties)
        else:
            from pyiceberg.catalog.sql import SqlCatalog

            database = Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None
            if database is not None:
                make_dirs(database.parent)
            catalog = SqlCatalog(CATALOG_NAME, uri=_sqlalchemy_uri(uri), **properties)
            if database is not None:
                _durable_sqlite(catalog, database)
        for namespace in (settings.namespace, current_namespace(settings.namespace)):
            catalog.create_namespace_if_not_exists(namespace)
    except Exception as exc:
        refused = refusal(exc)
        if refused is not None:
            raise SinkError(
                f"cannot use the Iceberg catalog at {shown}: "
                f"{redact_text(_first_line(exc), uri)}; {refused}"
            ) from exc
        what = (
            "is the REST catalog up at that address, with that path? does it need a "
            "token or credential in [iceberg] properties?"
            if rest
            else "is the server up, the database there, the role allowed to create tables?"
        )
        raise SinkError(
            f"cannot use the Iceberg catalog at {shown}: "
            f"{redact_text(_first_line(exc), uri)}. Check [iceberg] catalog_uri ({what}) "
            f"and that namespace {settings.namespace!r} can be created"
        ) from exc
    log.info("iceberg.catalog", uri=shown, namespace=settings.namespace)
    return catalog


BUSY_TIMEOUT_MS = 30_000


def _durable_sqlite(catalog: Catalog, database: Path) -> None:
    """A SQLite catalog whose commits are on disk when they return: SQLite's default
    (``synchronous = FULL``, rollback journal) syncs the database but not the removal of
    its journal, and a journal back after a power loss rolls the commit back: ``EXTRA``
    syncs that too. The database file, new, is made durable in its folder."""
    from sqlalchemy import event

    engine = catalog.engine  # type: ignore[attr-defined]

    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA synchronous = EXTRA")
        # another process's commit (an instance sharing the root) is waited for, up to
        # BUSY_TIMEOUT_MS (sqlite3's own default: 5 s)
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.close()

    event.listen(engine, "connect", pragmas)
    engine.dispose()  # (the connection that made the tables: without the pragma)
    synced = SyncSet()
    synced.new_file(database, database.parent)
    synced.folder(database.parent)
    synced.sync()


def refusal(exc: BaseException) -> str | None:
    """What to do when ``exc`` is a REST catalog refusing tidemark (its credentials
    unknown, expired or revoked, or not allowed what it asked); None for any other
    error. Nothing is lost meanwhile: a commit refused is retried, and what it would
    have committed is not acknowledged."""
    from pyiceberg.exceptions import (
        AuthorizationExpiredError,
        ForbiddenError,
        OAuthError,
        UnauthorizedError,
    )

    if isinstance(exc, ForbiddenError):
        return (
            "the REST catalog knows tidemark's credentials but does not allow this: grant "
            "its principal the rights to create namespaces and tables, and to load and "
            "commit them, in [iceberg] namespace and its _current twin"
        )
    if isinstance(exc, (OAuthError, UnauthorizedError, AuthorizationExpiredError)):
        return (
            "the REST catalog refused tidemark's credentials: set a valid `credential` "
            '("<client id>:<client secret>") or `token` in [iceberg] properties, then '
            "restart tidemark; until then nothing more is committed or acknowledged, and "
            "no row is lost (a reader such as `tidemark read` takes them from its --config "
            "file or from TIDEMARK_ICEBERG__PROPERTIES, a JSON object)"
        )
    return None


def current_namespace(namespace: str) -> str:
    return f"{namespace}_current"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def forget_catalogs() -> None:
    """Close the open catalogs (their database connections): a test that removes or
    remounts a root."""
    from tidemark.sink.iceberg import jvm

    with _lock:
        for catalog in _catalogs.values():
            engine = getattr(catalog, "engine", None)
            if engine is not None:
                engine.dispose()
        _catalogs.clear()
    jvm.close_all()  # (the Java committers' connections too)
