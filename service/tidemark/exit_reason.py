"""Why ``tidemark run`` last stopped on an error, in a file a container's health check reads.

When ``TIDEMARK_EXIT_REASON_FILE`` names a file (the image sets it), the CLI writes the
message it printed there before exiting non-zero, and the service removes it once its API
listens again. While a container restarts after such an exit, or stays down, its health
check (deploy/healthcheck.py) shows that message instead of only "does not answer".
Never fatal itself: a file that cannot be written is reported and ignored.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ENV = "TIDEMARK_EXIT_REASON_FILE"


def _path() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def record(message: str) -> None:
    path = _path()
    if path is None:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        path.write_text(f"{stamp} {message}\n", encoding="utf-8")
    except OSError as exc:
        print(f"tidemark: cannot write {ENV} {path}: {exc}", file=sys.stderr)


def clear() -> None:
    path = _path()
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        print(f"tidemark: cannot remove {ENV} {path}: {exc}", file=sys.stderr)
