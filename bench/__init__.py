"""``make bench``: tidemark's performance, measured against pg_recvlogical in the same run.

``TIDEMARK_BENCH_SYNC=0`` runs the services of the e2e and shapes sections with
``[sink] sync = false`` (the A/B of what syncing before acknowledging costs), and
``TIDEMARK_BENCH_SYNC_METHOD`` sets their ``[sink] sync_method``. The e2e and shapes
sections run once per table format of ``TIDEMARK_BENCH_FORMATS`` (default
``delta,iceberg``: Iceberg next to Delta in one run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jvm_pid(spark: Any) -> int:
    """The process of a local Spark session's JVM (its driver)."""
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())
