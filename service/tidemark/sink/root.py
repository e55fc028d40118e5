"""Which table format a sink root holds, recorded under it (``_tidemark/format.json``),
so that readers (``tidemark.read``, ``tidemark read``) find its tables without the
service's settings, and a service started with another format is refused: a root
keeps the format it was started with."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.conninfo import redact_dsn
from tidemark.errors import ConfigError, SinkError
from tidemark.sink import TableFormat, table_format
from tidemark.state import objectstore
from tidemark.state.objectstore import Location, is_remote, join

if TYPE_CHECKING:
    from tidemark.settings.config import IcebergSettings

FORMAT_FILE = "_tidemark/format.json"
CATALOG_ENV = "TIDEMARK_ICEBERG__CATALOG_URI"
PROPERTIES_ENV = "TIDEMARK_ICEBERG__PROPERTIES"  # (JSON, as the settings read it)


def _record(root: Location) -> dict[str, Any]:
    path = join(root, FORMAT_FILE)
    try:
        text = objectstore.read_text(path)
        return {} if text is None else dict(json.loads(text))
    except (OSError, ValueError) as exc:
        raise SinkError(f"cannot read {path}: {exc}") from exc


def _holds_delta(root: Location) -> bool:
    if is_remote(root):
        return False  # (an object-store root always has its record: round 4 on)
    tables = Path(root) / "tables"
    return tables.is_dir() and any((p / "_delta_log").is_dir() for p in tables.iterdir())


def claim_root(root: Location, name: str, iceberg: IcebergSettings | None) -> TableFormat:
    """At start: the format ``name`` for ``root``, its catalog reached (Iceberg), and
    recorded under the root; ``ConfigError`` when the root holds another format."""
    held = _record(root).get("format") or ("delta" if _holds_delta(root) else None)
    if held is not None and held != name:
        raise ConfigError(
            f"the sink root {root} holds {held} tables, and tidemark was started with "
            f'[sink] format = "{name}": a root keeps the format it was started with. Set '
            f'the format back to "{held}", or point [sink] root at a new folder (the '
            "shapes are then built again from snapshots)"
        )
    fmt = table_format(name, iceberg)
    record: dict[str, Any] = {"format": name}
    if name == "iceberg" and iceberg is not None:
        fmt.catalog(root)  # type: ignore[attr-defined]  # (reached, or a clear error)
        record |= {
            "catalog_uri": redact_dsn(iceberg.catalog_uri) if iceberg.catalog_uri else "",
            "namespace": iceberg.namespace,
        }
    if _record(root) != record:
        objectstore.replace(join(root, FORMAT_FILE), json.dumps(record, indent=1))
    return fmt


def root_format(
    root: Location, catalog_uri: str | None = None, properties: Mapping[str, str] | None = None
) -> TableFormat:
    """The format of the tables under ``root``, for a reader: as the service recorded
    it (a root without a record: Delta). What is not recorded with it, a reader gives:
    an Iceberg catalog's password (``catalog_uri``, or ``TIDEMARK_ICEBERG__CATALOG_URI``)
    and the catalog's properties, a REST catalog's ``credential`` or ``token`` among
    them (``properties``, or ``TIDEMARK_ICEBERG__PROPERTIES`` holding a JSON object)."""
    record = _record(root)
    name = record.get("format") or "delta"
    if name != "iceberg":
        return table_format(name)
    from tidemark.settings.config import IcebergSettings

    uri = catalog_uri or os.environ.get(CATALOG_ENV) or record.get("catalog_uri") or ""
    if "***" in uri:
        raise SinkError(
            f"the Iceberg catalog of {root} is {uri}: give its password, with "
            f"catalog_uri=... or the environment variable {CATALOG_ENV}"
        )
    if properties is None:
        properties = _properties_from_env()
    settings = IcebergSettings(
        catalog_uri=uri,
        namespace=record.get("namespace") or "tidemark",
        properties=dict(properties),
    )
    return table_format("iceberg", settings)


def _properties_from_env() -> dict[str, str]:
    text = os.environ.get(PROPERTIES_ENV)
    if not text:
        return {}
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise SinkError(
            f"{PROPERTIES_ENV} is not JSON ({exc}): set it to an object of the catalog's "
            """properties, e.g. {"credential": "<client id>:<client secret>"}"""
        ) from exc
    if not isinstance(found, dict):
        raise SinkError(
            f"{PROPERTIES_ENV} holds {type(found).__name__}, not an object of the "
            """catalog's properties: e.g. {"credential": "<client id>:<client secret>"}"""
        )
    return {str(k): str(v) for k, v in found.items()}
