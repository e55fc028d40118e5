"""tidemark: PostgreSQL logical replication into exactly-once lake tables, one per shape."""

__version__ = "0.1.0"
