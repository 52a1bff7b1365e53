"""The knowledge base: `Knowledge` is what the stages ask of it (`knowledge.protocols`);
`RedisKnowledge` is the deployed implementation, `MemoryKnowledge` the in-process one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from contracts.settings import Settings
from knowledge.memory import MemoryKnowledge
from knowledge.protocols import Knowledge
from knowledge.redis_store import RedisKnowledge

T = TypeVar("T")


def with_knowledge(settings: Settings, work: Callable[[RedisKnowledge], Awaitable[T]]) -> T:
    """Run `work` against the deployed knowledge base from synchronous code (the command line)."""

    async def run() -> T:
        knowledge = RedisKnowledge(settings)
        try:
            return await work(knowledge)
        finally:
            await knowledge.close()

    return asyncio.run(run())


__all__ = ["Knowledge", "MemoryKnowledge", "RedisKnowledge", "with_knowledge"]
