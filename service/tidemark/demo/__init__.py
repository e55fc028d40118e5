"""``tidemark demo`` and the throwaway servers it, the tests and the benchmarks start:
an embedded PostgreSQL run as an unprivileged user (``postgres``), a local Spark
standalone cluster or Connect server (``spark``), and the demo itself (``run``).
None of it is imported by the service."""
