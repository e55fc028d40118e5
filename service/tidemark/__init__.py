"""tidemark: PostgreSQL logical replication into exactly-once lake tables, one per shape."""

__version__ = "0.1.0"


def version() -> str:
    """The installed package's version ("unknown" when run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("tidemark")
    except PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"
