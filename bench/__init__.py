"""``make bench``: tidemark's performance, measured against pg_recvlogical in the same run.

``TIDEMARK_BENCH_SYNC=0`` runs the services of the e2e and shapes sections with
``[sink] sync = false`` (the A/B of what syncing before acknowledging costs), and
``TIDEMARK_BENCH_SYNC_METHOD`` sets their ``[sink] sync_method``. The e2e and shapes
sections run once per table format of ``TIDEMARK_BENCH_FORMATS`` (default
``delta,iceberg``: Iceberg next to Delta in one run).
"""

from __future__ import annotations

import os


def sink_sync() -> bool:
    """Whether the benchmarked services sync before acknowledging (default: yes)."""
    return os.environ.get("TIDEMARK_BENCH_SYNC", "1") not in ("0", "false", "no")


def sink_sync_method() -> str:
    """``[sink] sync_method`` of the benchmarked services (``TIDEMARK_BENCH_SYNC_METHOD``)."""
    return os.environ.get("TIDEMARK_BENCH_SYNC_METHOD", "files")


FORMAT_ENV = "TIDEMARK_BENCH_FORMAT"


def sink_formats() -> list[str]:
    """The table formats the e2e and shapes sections run with, in turn."""
    return [f for f in os.environ.get("TIDEMARK_BENCH_FORMATS", "delta,iceberg").split(",") if f]


def sink_format() -> str:
    """The ``[sink] format`` of the benchmarked services in the run under way."""
    return os.environ.get(FORMAT_ENV, "delta")
