"""The flush loop's passes: each looks at every shape, so at many shapes pokes that
come close together share a pass (``TICK_PER_SHAPE_S`` apart), and at few shapes each
poke still gets its own."""

from __future__ import annotations

import asyncio

from tidemark.writers.scheduler import TICK_PER_SHAPE_S, FlushScheduler


async def _passes(shapes: int, pokes: int, every_s: float) -> tuple[int, float]:
    """The loop's passes while ``pokes`` pokes come ``every_s`` apart, and how long
    that took (a busy machine stretches the sleeps)."""
    scheduler = FlushScheduler(spark=None)
    scheduler.writers = {f"s{k}": object() for k in range(shapes)}  # type: ignore[misc]
    passes = 0

    def counted() -> None:
        nonlocal passes
        passes += 1

    scheduler._start_due_jobs = counted  # type: ignore[method-assign]
    scheduler._next_deadline = lambda: 1.0  # type: ignore[method-assign]
    loop = asyncio.create_task(scheduler.run())
    started = asyncio.get_running_loop().time()
    try:
        for _ in range(pokes):
            await asyncio.sleep(every_s)
            scheduler.poke()
        await asyncio.sleep(every_s)
        took = asyncio.get_running_loop().time() - started
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return passes, took


async def test_pokes_close_together_share_a_pass_at_many_shapes() -> None:
    # 1000 shapes: passes at least 20 ms apart; 100 pokes 2 ms apart take >= 200 ms
    gap = TICK_PER_SHAPE_S * 1000
    passes, took = await _passes(1000, 100, 0.002)
    assert 2 <= passes <= took / gap + 1, (passes, took)
    assert passes < 100 / 2, passes  # (each poke its own pass: 101)


async def test_at_few_shapes_every_poke_gets_a_pass() -> None:
    # 10 shapes: 0.2 ms between passes, far below the 5 ms between pokes
    passes, _ = await _passes(10, 20, 0.005)
    assert passes >= 20, passes
