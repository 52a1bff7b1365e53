"""Script calls made in one turn of the event loop share a pipeline (`knowledge.redis_batch`), against a
real redis-server: the same replies as calls of their own, failures kept to their call, scripts loaded
again where Redis lost them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError, ResponseError

from contracts.settings import Settings
from knowledge.redis_batch import BatchedScripts

pytestmark = pytest.mark.integration

ECHO = "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}"
FAILS_ON_BAD = "if ARGV[1] == 'bad' then return redis.error_reply('bad input') end return ARGV[1]"


async def check_batching(client: Any) -> None:
    """The checks, on a client that decodes replies."""
    echo, fails = client.register_script(ECHO), client.register_script(FAILS_ON_BAD)
    batch = BatchedScripts(client)
    keys = [f"test-batch:{i}" for i in range(40)]
    try:
        for key in keys:
            await client.delete(key)
        alone = [await echo(keys=[key], args=[i]) for i, key in enumerate(keys)]
        together = await asyncio.gather(*(batch.call(echo, [key], [i]) for i, key in enumerate(keys)))
        assert [r[:2] for r in together] == [r[:2] for r in alone]
        assert [r[2] for r in together] == [r[2] + 1 for r in alone]
        assert (batch.pipelines, batch.calls) == (1, 40)

        # One failing script fails its own call; the others in its pipeline are answered.
        outcomes = await asyncio.gather(*(batch.call(fails, [keys[0]], [v]) for v in ("a", "bad", "c")),
                                        return_exceptions=True)
        assert outcomes[0] == "a" and outcomes[2] == "c" and isinstance(outcomes[1], ResponseError)
        assert batch.pipelines == 2
        # So does an argument Redis cannot take.
        outcomes = await asyncio.gather(batch.call(fails, [keys[0]], [None]), batch.call(fails, [keys[0]], ["d"]),
                                        return_exceptions=True)
        assert isinstance(outcomes[0], DataError) and outcomes[1] == "d"
        assert batch.pipelines == 3

        # Redis lost its scripts (a restart): each call is made again on its own, which loads them.
        await client.script_flush()
        assert await asyncio.gather(*(batch.call(echo, [key], ["y"]) for key in keys[:5])) \
            == [[key, "y", 3] for key in keys[:5]]
        assert await batch.call(fails, [keys[1]], ["x"]) == "x"

        # Calls in later turns go in later pipelines.
        before = batch.pipelines
        assert [await batch.call(fails, [keys[2]], [str(i)]) for i in range(3)] == ["0", "1", "2"]
        assert batch.pipelines == before + 3
    finally:
        for key in keys:
            await client.delete(key)


def run_batching(connect: Callable[..., Any], url: str) -> None:
    """The checks on a client `connect(url, decode_responses=True)` makes (one Redis or a cluster's), closed after."""
    async def go() -> None:
        client = connect(url, decode_responses=True)
        try:
            await check_batching(client)
        finally:
            await client.aclose()

    asyncio.run(go())


def test_calls_of_one_turn_share_a_pipeline_and_keep_their_own_replies(settings: Settings) -> None:
    run_batching(aioredis.from_url, settings.redis_url)


def test_a_redis_away_fails_every_call_of_the_pipeline() -> None:
    async def go() -> None:
        client = aioredis.from_url("redis://127.0.0.1:1", decode_responses=True)  # nothing listens there
        script = client.register_script(FAILS_ON_BAD)
        batch = BatchedScripts(client)
        outcomes = await asyncio.gather(*(batch.call(script, [], [str(i)]) for i in range(5)),
                                        return_exceptions=True)
        assert all(isinstance(o, aioredis.ConnectionError) for o in outcomes)
        assert batch.pipelines == 1
        await client.aclose()

    asyncio.run(go())
