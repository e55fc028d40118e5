"""The HTTP API (aiohttp): health, readiness, metrics, shapes, progress."""
