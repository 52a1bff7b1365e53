"""The per-window commit of analyze and plan against a real Redis: exactly one commit per window,
and the committed message is there to publish again after a crash."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from contracts.settings import Settings
from knowledge.store import Knowledge

pytestmark = pytest.mark.integration


def test_a_window_commits_once_and_its_message_can_be_published_again(settings: Settings) -> None:
    async def go() -> None:
        knowledge = Knowledge(settings)
        job = f"commit-{uuid.uuid4().hex[:6]}"
        try:
            message = json.dumps({"window_end": 1010.0, "decision_id": "a"})
            assert not await knowledge.window_done(job, "plan", 1010.0)
            assert await knowledge.commit_window(job, "plan", 1010.0, message, state={"quota_bound": True})
            # A crash here, before publishing: the redelivered window finds its decision, same id.
            assert await knowledge.window_done(job, "plan", 1010.0)
            assert await knowledge.committed_message(job, "plan", 1010.0) == message
            again = json.dumps({"window_end": 1010.0, "decision_id": "b"})
            assert not await knowledge.commit_window(job, "plan", 1010.0, again)
            assert (await knowledge.state(job))["quota_bound"] is True
            assert [d["decision_id"] for d in await knowledge.decisions(job)] == ["a"]

            # Two workers racing on the same window (a rebalance): exactly one commit wins.
            rivals = [json.dumps({"window_end": 1020.0, "decision_id": f"r{i}"}) for i in range(8)]
            won = await asyncio.gather(*(knowledge.commit_window(job, "plan", 1020.0, m) for m in rivals))
            assert sum(won) == 1
            winner = rivals[won.index(True)]
            assert await knowledge.committed_message(job, "plan", 1020.0) == winner
            assert await knowledge.committed_message(job, "analyze", 1020.0) is None
        finally:
            await knowledge.unregister_job(job)
            await knowledge.close()

    asyncio.run(go())
