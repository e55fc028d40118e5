#!/usr/bin/env python3
"""Container health check: exit 0 when tidemark's ``/readyz`` answers 200, else 1.

Ready means streaming, no invariant violated, no shape stalled or failed (see
``tidemark.api.server``). A standby (another instance holds the leader lease)
answers 503 with ``"role": "standby"`` and is healthy: it is doing its job. The port and host come from the same variables the service
reads (``TIDEMARK_HTTP__PORT``, ``TIDEMARK_HTTP__HOST``); a wildcard host is asked on
loopback. Standard library only, so it runs under any Python 3 in the image.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

WILDCARDS = ("", "0.0.0.0", "::")


def readyz_url(environ: dict[str, str]) -> str:
    host = environ.get("TIDEMARK_HTTP__HOST", "127.0.0.1")
    if host in WILDCARDS:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{environ.get('TIDEMARK_HTTP__PORT', '8765')}/readyz"


def main() -> int:
    url = readyz_url(dict(os.environ))
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except urllib.error.HTTPError as exc:
        # 503 carries the reasons: shown by `docker inspect` under State.Health
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = None
        reasons = body.get("reasons", []) if isinstance(body, dict) else []
        if isinstance(body, dict) and body.get("role") == "standby":
            print(f"standby: {'; '.join(reasons)}")
            return 0
        print(f"not ready (HTTP {exc.code}): {'; '.join(reasons) or exc.reason}")
        return 1
    except OSError as exc:
        print(f"tidemark does not answer at {url}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
