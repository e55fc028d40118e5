"""The Apache Iceberg table format behind the sink's port (``format``: the entry)."""
