"""asyncio waits that respect cancellation.

On Python 3.11, ``asyncio.wait_for(x, t)`` can swallow a cancellation that arrives
as ``x`` completes, so a loop built on it may never stop. ``asyncio.timeout`` does
not have that flaw; these helpers use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True if it is set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def within(awaitable: Awaitable[T], timeout: float | None) -> T | None:
    """``await awaitable`` with a time limit; None if the time ran out."""
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError:
        return None
