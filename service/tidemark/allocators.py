"""Freed memory goes back to the system, so the memory budget bounds the process.

The budget counts the rows tidemark buffers; what the process holds besides them is
allocator slack, and three defaults make that slack large:

- Arrow's C++ default pool (mimalloc or jemalloc) keeps freed pages for reuse, and
  Arrow's own code (Parquet writers, IPC, compute) allocates from it whatever pool
  pyarrow's Python side was told to use. ``ARROW_DEFAULT_MEMORY_POOL=system`` set
  before pyarrow loads moves both onto malloc.
- glibc's malloc raises its mmap threshold after large blocks are freed, so later
  megabyte values come from the heap, which fragments and does not shrink.
- With transparent huge pages set to ``always``, every touched 2 MiB of heap is
  resident whole.

Measured on a 1 GiB streamed transaction of 1 MiB rows under a 128 MiB budget (the
``test_streamed_transactions`` 1 GiB test): the service peaked at 906 MiB with all
three left as they are, 400-430 MiB with malloc tuned and only pyarrow's Python pool
switched, 370-375 MiB with Arrow's C++ pool on malloc as well.

An operator's own ``ARROW_DEFAULT_MEMORY_POOL`` or ``MALLOC_MMAP_THRESHOLD_`` wins.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

import structlog

log = structlog.get_logger("tidemark.memory")

# The cyclic garbage collector's thresholds while a service runs (Python's defaults:
# 700, 10, 10). Buffered rows are millions of long-lived containers, and with the
# defaults the collector went through all of them again whenever they had grown by a
# quarter: over a `python -m bench e2e-small` run (1M rows in 100k transactions) the
# process spent 12.2 s in collections, 8.9 s of it in 18 full ones, and the service
# took 35 s to acknowledge with 27.7 s of CPU. With these thresholds set at the
# service's start: 30.6 s and 22.7-23.7 s of CPU (two runs), 3 full collections.
# Cycles are still collected, later.
GC_THRESHOLDS = (50_000, 20, 100)

_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
_PR_SET_THP_DISABLE = 41  # prctl option (linux/prctl.h)
MMAP_THRESHOLD = 256 * 1024


def prepare_process() -> None:
    """Choose the allocators before pyarrow loads (the service's entry points call this
    first). Safe to call more than once; too late for Arrow's C++ pool if pyarrow is
    already imported, which :func:`return_freed_memory` then covers in part."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    libc = _libc()
    if libc is None:
        return
    if not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    # this process and its children (a local-mode Spark JVM too) fault in small pages
    if libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        log.debug("memory.thp_disable_refused")


def return_freed_memory() -> None:
    """Make pyarrow's Python-side pool malloc and fix glibc's mmap threshold."""
    import pyarrow as pa

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())
    libc = _libc()
    if libc is not None and not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mallopt  # noqa: B018  (glibc only; musl has no mallopt)
        return libc
    except (OSError, AttributeError) as exc:
        log.debug("memory.glibc_unavailable", error=str(exc))
        return None


def tune_collector() -> None:
    """Set ``GC_THRESHOLDS`` (a service at start), unless the thresholds were already
    changed from Python's defaults by whoever runs the process."""
    if gc.get_threshold() == (700, 10, 10):
        gc.set_threshold(*GC_THRESHOLDS)
