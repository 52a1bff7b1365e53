"""`RedisKnowledge`: the deployed knowledge base, shared by every worker (see `knowledge.protocols`)."""

from __future__ import annotations

from knowledge.redis_execution import RedisExecution
from knowledge.redis_fleet import RedisFleet
from knowledge.redis_windows import RedisWindows


class RedisKnowledge(RedisWindows, RedisExecution, RedisFleet):
    """Every concern of `knowledge.protocols.Knowledge` on one Redis, under the key prefix `prefix`."""
