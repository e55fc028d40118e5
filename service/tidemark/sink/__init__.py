"""The lake side: each shape's changelog and current-state tables, behind a port.

``port`` says what the rest of tidemark asks of a table (``ChangelogTable``) and of a
table format (``TableFormat``); ``delta/`` is the Delta Lake implementation,
``iceberg/`` the Apache Iceberg one. The
format-neutral parts: ``schema`` (columns and metadata columns), ``files`` (a data
file a commit adds), ``fold`` (a changelog's state as of an LSN, in Spark),
``frontiers`` (how far each shape is complete, for readers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemark.errors import ConfigError
from tidemark.sink.port import ChangelogTable, TableFormat

if TYPE_CHECKING:
    from tidemark.settings.config import IcebergSettings

FORMATS = ("delta", "iceberg")


def table_format(name: str = "delta", iceberg: IcebergSettings | None = None) -> TableFormat:
    """The table format called ``name`` (``iceberg``: the catalog's settings)."""
    if name == "delta":
        from tidemark.sink.delta.format import DELTA

        return DELTA
    if name == "iceberg":
        from tidemark.sink.iceberg.format import IcebergFormat

        return IcebergFormat(iceberg)
    raise ConfigError(f"unknown table format {name!r}: choose one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "ChangelogTable", "TableFormat", "table_format"]
