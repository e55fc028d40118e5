#!/usr/bin/env python3
"""Container health check (liveness): exit 0 when tidemark's ``/healthz`` answers, else 1.

Alive is all it asks: the process and its event loop answer. A shape in error, a
source that is down for a while, a standby waiting for the leader lease: each leaves
the process alive and doing its job, and replacing the container would not help (the
readiness answer, ``/readyz``, is there for load balancers and for people). What it
prints goes to ``docker inspect``'s ``State.Health.Log``, so it says what it saw:

* alive: the role and phase, and the reasons ``/readyz`` gives when not ready;
* not answering: why tidemark last stopped, when it left a reason in
  ``TIDEMARK_EXIT_REASON_FILE`` (the image sets it; ``tidemark run`` writes it on a
  fatal error, the entrypoint on an unwritable sink), else that nothing answers.

The port and host come from the variables the service reads (``TIDEMARK_HTTP__PORT``,
``TIDEMARK_HTTP__HOST``); a wildcard host is asked on loopback. Standard library
only, so it runs under any Python 3 in the image.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

WILDCARDS = ("", "0.0.0.0", "::")


def base_url(environ: dict[str, str]) -> str:
    host = environ.get("TIDEMARK_HTTP__HOST", "127.0.0.1")
    if host in WILDCARDS:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{environ.get('TIDEMARK_HTTP__PORT', '8765')}"


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, None


def _exit_reason(environ: dict[str, str]) -> str | None:
    path = environ.get("TIDEMARK_EXIT_REASON_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def main() -> int:
    environ = dict(os.environ)
    base = base_url(environ)
    try:
        status, health = _get(base + "/healthz")
    except (OSError, ValueError) as exc:
        reason = _exit_reason(environ)
        if reason:
            print(f"tidemark is not running: it stopped with: {reason}")
        else:
            print(f"tidemark does not answer at {base}/healthz (starting, or hung): {exc}")
        return 1
    if status != 200:
        print(f"tidemark answers /healthz with HTTP {status}")
        return 1
    health = health if isinstance(health, dict) else {}
    said = f"alive: {health.get('role', '?')}, {health.get('phase', '?')}"
    try:
        ready_status, ready = _get(base + "/readyz")
    except (OSError, ValueError):
        print(said)
        return 0
    reasons = ready.get("reasons", []) if isinstance(ready, dict) else []
    if ready_status == 200:
        print(f"{said}, ready")
    else:
        print(f"{said}, not ready: {'; '.join(map(str, reasons)) or f'HTTP {ready_status}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
