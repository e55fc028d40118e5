"""The rows of a SQL catalog (``iceberg_tables``) that tidemark reads itself, beside
pyiceberg: a table's pointer, read in one short query where pyiceberg's ``load_table``
also reads and parses the metadata file it names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def pointer(catalog: Catalog, ident: tuple[str, str]) -> str | None:
    """The metadata file a SQL catalog's row for ``ident`` names now (one short query);
    None for another catalog, or when there is no such table."""
    engine = getattr(catalog, "engine", None)
    if engine is None:
        return None
    from sqlalchemy import text

    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :c "
                "AND table_namespace = :ns AND table_name = :t"
            ),
            {"c": catalog.name, "ns": ident[0], "t": ident[1]},
        ).scalar()
    return None if found is None else str(found)
