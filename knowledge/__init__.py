"""The knowledge base: `Knowledge` is what the stages ask of it (`knowledge.protocols`);
`RedisKnowledge` is the deployed implementation, `MemoryKnowledge` the in-process one."""

from knowledge.memory import MemoryKnowledge
from knowledge.protocols import Knowledge
from knowledge.redis_store import RedisKnowledge

__all__ = ["Knowledge", "MemoryKnowledge", "RedisKnowledge"]
