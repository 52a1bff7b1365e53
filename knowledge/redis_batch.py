"""Script calls made in one turn of the event loop, sent to Redis in one pipeline.

A stage handles a batch's windows concurrently (`contracts.stage.per_key`): every window reaches its
reads, and later its commit, in the same turn of the loop. Each of those is one Lua script (atomic on
its own), and sent one by one, each pays a round trip's client work (the connection, the timeouts,
the task switch): at 3,000 jobs that was most of a stage's time in Redis. Queued together they go in
one pipeline (not a transaction: each script is atomic already), and the client's work per call falls
several times (docs/reliability.md, "Load"). On a Redis Cluster the same pipeline goes to every node
holding one of its calls' keys at once (redis-py's cluster pipeline splits it by hash slot): one round
trip per node, concurrently. A call's keys are one job's or the shared ones, one slot either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


class BatchedScripts:
    """`call(script, keys, args)` returns the script's reply, as `script(keys=..., args=...)` would;
    calls made before the loop's next turn share one pipeline. A pipeline that fails (Redis away)
    fails every call in it; a script that fails fails its own call only. A call that finds its
    script missing (Redis restarted) is made again on its own, which loads the script. A caller
    cancelled after its call was queued does not take it back: the script may still run, as a
    single call cancelled after it was sent may (a window's commit is safe to make twice)."""

    def __init__(self, client: aioredis.Redis | RedisCluster):
        self.client = client
        self._encode = client.get_encoder().encode
        self._pending: list[tuple[AsyncScript, Sequence[Any], Sequence[Any], asyncio.Future[Any]]] = []
        self._flushing: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references
        self.pipelines = 0  # pipelines sent so far
        self.calls = 0  # calls sent in them

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        # Encoded here, so an argument Redis cannot take (None, a bool) fails this call, not its pipeline.
        keys, args = [self._encode(k) for k in keys], [self._encode(a) for a in args]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._pending:
            # Runs after the tasks already woken in this turn, so their calls join this pipeline.
            task = asyncio.ensure_future(self._flush())
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        self._pending.append((script, keys, args, future))
        return await future

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self.pipelines += 1
        self.calls += len(pending)
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for script, keys, args, _ in pending:
                    # As a command, not `evalsha`: the cluster pipeline routes it by its keys' slot but
                    # refuses the method.
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                redone = await asyncio.gather(*(self._alone(*pending[i][:3]) for i in missing))
                for i, reply in zip(missing, redone, strict=True):
                    replies[i] = reply
        except Exception as exc:  # every caller gets it, as a call of its own would
            for *_, future in pending:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # the flush itself cancelled (the worker stops): no caller waits forever
            for *_, future in pending:
                future.cancel()
            raise
        for (*_, future), reply in zip(pending, replies, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    @staticmethod
    async def _alone(script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)  # loads the script where it is missing
        except Exception as exc:  # the call's own failure, returned as a pipeline returns one
            return exc
