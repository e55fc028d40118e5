"""The status page at ``GET /``: what an operator looks at first, in a browser.

One package file, ``status.html``, holds the whole page: its CSS in one inline
``<style>``, its JavaScript in one inline ``<script>``, no external assets and no build
step. The script polls ``GET /v1/progress``, ``GET /v1/shapes`` and ``GET /readyz``
every 2 s and renders them (role, phase, readiness and its reasons, the stream's LSNs,
Postgres's view of the slot, and a table of shapes that stays usable at a thousand).
It writes text only through ``textContent``, so a shape name or an error message is
never markup.

The page is served with a Content-Security-Policy that allows exactly that: its own
inline style and script, named by their SHA-256 (computed here from the file, so an edit
of the page cannot leave the header behind), and fetches to the same origin. Nothing
else loads or runs: no other script, style, image, font, frame, form target or origin.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from aiohttp import web


@dataclass(frozen=True, slots=True)
class StatusPage:
    html: str
    policy: str  # the Content-Security-Policy header's value


def _only(tag: str, html: str) -> str:
    """The text inside the page's single ``<tag>`` element (what CSP hashes)."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    if len(found) != 1:
        raise ValueError(f"status.html must have exactly one <{tag}> element, found {len(found)}")
    return str(found[0])


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def policy_for(html: str) -> str:
    """The CSP that lets ``html`` run its one inline style and script and nothing else."""
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src {_sha256(_only('script', html))}",
            f"style-src {_sha256(_only('style', html))}",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


@functools.cache
def load() -> StatusPage:
    html = resources.files("tidemark.api").joinpath("status.html").read_text("utf-8")
    return StatusPage(html=html, policy=policy_for(html))


async def status_page(request: web.Request) -> web.Response:
    page = load()
    return web.Response(
        text=page.html,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": page.policy,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
