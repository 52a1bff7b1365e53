"""Keep a stage alive while Redis is away: retry the work, never drop the input."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.exceptions

from contracts.settings import Settings, get_settings
from infra.security import redact

T = TypeVar("T")
log = logging.getLogger("autoscaler")

TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError, OSError)


async def until_done(
    work: Callable[[], Awaitable[T]],
    what: str,
    first_delay: float = 0.2,
    max_delay: float = 2.0,  # a Redis that is back is used again within 2 s
    settings: Settings | None = None,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
    waits_for: str = "knowledge (Redis)",
) -> T:
    """Run `work` until it succeeds, backing off while what it `waits_for` is unreachable (by
    default knowledge, Redis; the runtime also waits for the broker to take what it publishes).

    The stream does not advance meanwhile, so no record is lost; the worker reports itself degraded.
    The logged error is redacted with `settings`' secrets (default: the process's settings, which
    are the agents' own)."""
    delay = first_delay
    degraded = False
    while True:
        try:
            result = await work()
        except transient as exc:
            if not degraded:
                error = redact(f"{type(exc).__name__}: {exc}", settings or get_settings())
                log.warning("degraded: %s waits for %s: %s", what, waits_for, error)
                degraded = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
            continue
        if degraded:
            log.warning("recovered: %s continues", what)
        return result
