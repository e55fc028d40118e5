"""An HTTP proxy for the object-store tests that answers some requests with an S3
error of its own instead of passing them on: ``503 SlowDown`` (the store throttling),
``403 AccessDenied`` (credentials revoked while the service runs). Toxiproxy works on
bytes and cannot make an HTTP reply; this sits between it and the client.

Run as a process of its own (``python http_faults.py --port P --upstream
http://127.0.0.1:Q``) so that its work does not share the test's
interpreter. Every request is passed on byte for byte (the signature covers the
``Host`` header, which is kept), except those a rule picks. Rules are set over the
same port: ``POST /__faults`` with ``{"status": 503, "code": "SlowDown", "rate": 0.3,
"methods": ["PUT"]}`` (``rate`` the share of matching requests refused, counted, not
drawn: at 0.3 every third or fourth, so a short phase of a test cannot pass by luck
with none refused; methods empty: all), ``DELETE /__faults`` clears it; ``GET
/__faults`` gives the count of replies made up so far by status, and of requests
passed on.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections import Counter
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

CONTROL = "/__faults"
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "expect",  # (this proxy answers 100-continue itself, and sends the body whole)
}
MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "AccessDenied": "Access Denied",
    "ServiceUnavailable": "Service is unable to handle request.",
}


class Faults:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.rule: dict[str, Any] | None = None
        self.credit = 0.0  # (the rule's rate, added per matching request; 1 refuses one)
        self.made: Counter[str] = Counter()
        self.passed = 0
        self.session: ClientSession | None = None

    def picks(self, method: str) -> dict[str, Any] | None:
        rule = self.rule
        if rule is None:
            return None
        methods = rule.get("methods") or []
        if methods and method not in methods:
            return None
        self.credit += float(rule.get("rate", 1.0))
        if self.credit < 1.0 - 1e-9:
            return None
        self.credit -= 1.0
        return rule

    async def control(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            self.rule = await request.json()
            self.credit = 0.0
        elif request.method == "DELETE":
            self.rule = None
        return web.json_response({"made": dict(self.made), "passed": self.passed})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == CONTROL:
            return await self.control(request)
        body = await request.read()
        rule = self.picks(request.method)
        if rule is not None:
            return self.made_up(request, rule)
        assert self.session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        async with self.session.request(
            request.method,
            URL(self.upstream + request.raw_path, encoded=True),  # (as signed)
            headers=headers,
            data=body if body else None,
            allow_redirects=False,
        ) as reply:
            payload = await reply.read()
            self.passed += 1
            out = web.Response(status=reply.status, body=payload if payload else None)
            for key, value in reply.headers.items():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    out.headers.add(key, value)
            if request.method == "HEAD" and "Content-Length" in reply.headers:
                # (a HEAD's length is the object's, not the empty body's)
                out.headers["Content-Length"] = reply.headers["Content-Length"]
            return out

    def made_up(self, request: web.Request, rule: dict[str, Any]) -> web.Response:
        status = int(rule.get("status", 503))
        code = str(rule.get("code", "SlowDown"))
        self.made[str(status)] += 1
        request_id = secrets.token_hex(8).upper()
        headers = {"x-amz-request-id": request_id, "Content-Type": "application/xml"}
        if request.method == "HEAD":  # (no body: the status says it)
            return web.Response(status=status, headers=headers)
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
            f"<Code>{code}</Code><Message>{MESSAGES.get(code, code)}</Message>"
            f"<Resource>{request.path}</Resource><RequestId>{request_id}</RequestId></Error>"
        )
        return web.Response(status=status, body=xml.encode(), headers=headers)


async def serve(port: int, upstream: str) -> None:
    faults = Faults(upstream)
    faults.session = ClientSession(
        connector=TCPConnector(limit=256),
        timeout=ClientTimeout(total=120),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Content-Type", "Accept", "Accept-Encoding"),
    )
    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", faults.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
