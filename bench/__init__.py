"""``make bench``: tidemark's performance, measured against pg_recvlogical in the same run.

``TIDEMARK_BENCH_SYNC=0`` runs the services of the e2e and shapes sections with
``[sink] sync = false`` (the A/B of what syncing before acknowledging costs), and
``TIDEMARK_BENCH_SYNC_METHOD`` sets their ``[sink] sync_method``.
"""

from __future__ import annotations

import os


def sink_sync() -> bool:
    """Whether the benchmarked services sync before acknowledging (default: yes)."""
    return os.environ.get("TIDEMARK_BENCH_SYNC", "1") not in ("0", "false", "no")


def sink_sync_method() -> str:
    """``[sink] sync_method`` of the benchmarked services (``TIDEMARK_BENCH_SYNC_METHOD``)."""
    return os.environ.get("TIDEMARK_BENCH_SYNC_METHOD", "files")
