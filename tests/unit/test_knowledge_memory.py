"""The in-memory knowledge base behaves as the Redis one (tests/knowledge_contract.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from contracts.settings import Settings
from knowledge import MemoryKnowledge
from tests.knowledge_contract import CHECKS, Check


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_memory_knowledge(check: Check) -> None:
    asyncio.run(check(MemoryKnowledge(Settings(history_length=20)), f"job-{uuid.uuid4().hex[:6]}"))


def test_markers_expire_on_the_clock() -> None:
    now = [1000.0]
    knowledge = MemoryKnowledge(Settings(), clock=lambda: now[0])

    async def go() -> None:
        await knowledge.mark_decision_done("j", "d")
        assert await knowledge.decision_done("j", "d")
        now[0] += 24 * 3600 + 1
        assert not await knowledge.decision_done("j", "d")

    asyncio.run(go())
